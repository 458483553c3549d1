//! `quarrel quantize`: convert a GGUF model to another file type (library:
//! `quarrel_models::quantize`).

use crate::resolve::resolve_model;
use anyhow::{bail, Context, Result};
use quarrel_gguf::{Gguf, QuantType};
use quarrel_models::quantize::{check_distinct, is_weight_type, write_quantized, QuantizeError, QuantizeOptions, QuantizePlan};
use quarrel_models::Ftype;
use std::path::PathBuf;

/// Convert a GGUF model to another quantization, as llama-quantize does.
///
/// Each tensor gets the type llama-quantize's mix picks for TYPE (K mixes give some tensors
/// more bits; rows a type's blocks do not divide fall back to another type); 1-D tensors and
/// norms keep their type. Metadata are copied, with `general.file_type` set to TYPE.
///
/// Types (case-insensitive): q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q2_k_s, q3_k_s, q3_k_m
/// (q3_k), q3_k_l, q4_k_s, q4_k_m (q4_k), q5_k_s, q5_k_m (q5_k), q6_k, iq4_nl, f16, bf16, f32.
#[derive(clap::Args)]
pub struct Args {
    /// The model to convert: a .gguf path (the first file of a split model) or a model name.
    pub input: String,
    /// Output .gguf path.
    #[arg(required_unless_present = "dry_run")]
    pub output: Option<PathBuf>,
    /// Target file type.
    #[arg(value_parser = parse_ftype)]
    pub r#type: Option<Ftype>,
    /// Convert tensors that are already quantized. Quality suffers compared to quantizing
    /// from a 16- or 32-bit model.
    #[arg(long)]
    pub allow_requantize: bool,
    /// Keep output.weight as it is.
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// Type of output.weight (a ggml type name: q8_0, q6_k, f16, ...).
    #[arg(long, value_name = "TYPE", value_parser = parse_weight_type)]
    pub output_tensor_type: Option<QuantType>,
    /// Type of token_embd.weight.
    #[arg(long, value_name = "TYPE", value_parser = parse_weight_type)]
    pub token_embedding_type: Option<QuantType>,
    /// Print each tensor's planned type and size, and the totals; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long = "threads", default_value_t = 0, env = "QUARREL_THREADS")]
    pub threads: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

const REQUANTIZE_HINT: &str = "the input is already quantized; --allow-requantize converts it anyway, at a cost in quality";

fn parse_ftype(s: &str) -> Result<Ftype, String> {
    Ftype::from_name(s).ok_or_else(|| {
        let names: Vec<String> = Ftype::names().iter().map(|n| n.to_ascii_uppercase()).collect();
        format!("unknown type {s:?}; valid types: {}", names.join(", "))
    })
}

fn parse_weight_type(s: &str) -> Result<QuantType, String> {
    match QuantType::from_name(s) {
        Some(t) if is_weight_type(t) => Ok(t),
        _ => {
            let names: Vec<&str> = QuantType::ALL.iter().filter(|t| is_weight_type(**t)).map(|t| t.name()).collect();
            Err(format!("unknown tensor type {s:?}; valid types: {}", names.join(", ")))
        }
    }
}

fn mib(n: u64) -> f64 {
    n as f64 / (1u64 << 20) as f64
}

/// The two positionals after IN: `OUT TYPE`, or `TYPE` alone with --dry-run.
fn target(a: &Args) -> Result<(Option<PathBuf>, Ftype)> {
    match (&a.output, a.r#type) {
        (Some(out), Some(t)) => Ok((Some(out.clone()), t)),
        (Some(only), None) if a.dry_run => Ok((None, parse_ftype(&only.to_string_lossy()).map_err(anyhow::Error::msg)?)),
        _ => bail!("usage: quarrel quantize IN.gguf OUT.gguf TYPE (or --dry-run IN.gguf TYPE)"),
    }
}

pub fn main(a: Args) -> Result<()> {
    let (output, ftype) = target(&a)?;
    let input = resolve_model(Some(&a.input), false)?;
    if let Some(out) = &output {
        check_distinct(&input, out)?;
    }
    let g = Gguf::open(&input).with_context(|| format!("reading {}", input.display()))?;
    let opts = QuantizeOptions {
        allow_requantize: a.allow_requantize,
        leave_output_tensor: a.leave_output_tensor,
        output_tensor_type: a.output_tensor_type,
        token_embedding_type: a.token_embedding_type,
    };
    let hint = |e: QuantizeError| match e {
        QuantizeError::Requantize { .. } => anyhow::anyhow!("{e}: {REQUANTIZE_HINT}"),
        QuantizeError::NeedsImatrix { .. } => anyhow::anyhow!("{e}: choose q2_k or q3_k_s instead"),
        e => anyhow::Error::new(e).context(format!("planning {}", input.display())),
    };
    let Some(out) = output.filter(|_| !a.dry_run) else {
        // a dry run shows the whole plan, then what writing it would refuse
        let plan = QuantizePlan::unchecked(&g, ftype, &opts).map_err(hint)?;
        print_fallbacks(&plan);
        print_plan(&plan);
        if let Some(e) = plan.refusal(&opts) {
            eprintln!("note: {:#}", hint(e));
        }
        return Ok(());
    };
    let plan = QuantizePlan::new(&g, ftype, &opts).map_err(hint)?;
    print_fallbacks(&plan);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(a.threads).build().context("starting worker threads")?;

    let bar = if a.quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(plan.out_bytes) };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta}) {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let n = plan.tensors.len();
    let mut shown = usize::MAX;
    let summary = pool
        .install(|| {
            write_quantized(&g, &plan, &out, &mut |p| {
                if p.index != shown {
                    shown = p.index;
                    let t = p.tensor;
                    bar.set_prefix(format!("[{:>4}/{n}]", p.index + 1));
                    bar.set_message(format!("{} {} -> {}", t.info.name, t.info.ty, t.to));
                }
                bar.set_position(p.done);
            })
        })
        .with_context(|| format!("writing {}", out.display()))?;
    bar.finish_and_clear();
    let s = &summary;
    let types: Vec<String> = plan.type_counts().iter().map(|(t, n)| format!("{n} {t}")).collect();
    println!(
        "{} ({ftype}): {} tensors ({}; {} converted, {} copied), {:.1} MiB -> {:.1} MiB, {:.1} s",
        out.display(),
        n,
        types.join(", "),
        s.n_converted,
        s.n_copied,
        mib(s.in_size),
        mib(s.out_size),
        s.seconds
    );
    Ok(())
}

/// One line per kind of fallback (a model has many tensors of one width).
fn print_fallbacks(plan: &QuantizePlan) {
    let mut kinds: Vec<((u64, QuantType, QuantType), usize)> = Vec::new();
    for t in &plan.tensors {
        let Some(from) = t.fallback_from else { continue };
        let key = (t.info.dims[0], from, t.to);
        match kinds.iter_mut().find(|(k, _)| *k == key) {
            Some(k) => k.1 += 1,
            None => kinds.push((key, 1)),
        }
    }
    for ((n, from, to), count) in kinds {
        eprintln!("{count} tensor(s) with rows of {n}, not a multiple of {from}'s block of {}: {to} instead", from.block_size());
    }
}

fn print_plan(plan: &QuantizePlan) {
    println!("{:<40} {:<22} {:>8} -> {:<8} {:>10} -> {:>10}", "tensor", "shape", "type", "type", "MiB", "MiB");
    for t in &plan.tensors {
        let shape = format!("{:?}", t.info.dims);
        let action = if t.converts() { t.to.name() } else { "(copy)" };
        println!(
            "{:<40} {:<22} {:>8} -> {:<8} {:>10.3} -> {:>10.3}",
            t.info.name,
            shape,
            t.info.ty.name(),
            action,
            mib(t.info.n_bytes),
            mib(t.out_bytes)
        );
    }
    let n_params: u64 = plan.tensors.iter().map(|t| t.info.n_elements()).sum::<u64>().max(1);
    let types: Vec<String> = plan.type_counts().iter().map(|(t, n)| format!("{n} {t}")).collect();
    println!(
        "\n{} tensors ({}): {:.2} MiB ({:.2} bits/weight) -> {:.2} MiB ({:.2} bits/weight) as {}",
        plan.tensors.len(),
        types.join(", "),
        mib(plan.in_bytes),
        plan.in_bytes as f64 * 8.0 / n_params as f64,
        mib(plan.out_bytes),
        plan.out_bytes as f64 * 8.0 / n_params as f64,
        plan.ftype
    );
}
