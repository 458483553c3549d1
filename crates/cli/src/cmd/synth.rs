//! `quarrel synth`: write a random-weights GGUF model with a real model's shapes
//! (library: `quarrel_synth`).

use anyhow::{bail, Context, Result};
use quarrel_synth::archs::{write_arch_synth_with, ArchPreset, ArchSynthSpec, ARCH_PRESETS};
use quarrel_synth::{presets, write_synth_with, Ftype, Preset, SynthSpec, WriteOptions};
use std::path::PathBuf;

/// Write a random-weights model with a real model's shapes, metadata and quantization mix.
///
/// The file loads in Quarrel and in llama.cpp; it is meant for benchmarks and tests (its
/// output is noise). The same options and seed give a byte-identical file.
///
/// Presets: tiny, smollm2-135m, smollm2-360m, tinyllama-1.1b, llama-3.2-1b, llama-3.2-3b,
/// llama-2-7b, mistral-7b, llama-3-8b, llama-3.1-8b; other architectures: tiny-mixtral,
/// tiny-granite, tiny-granitemoe, tiny-granitehybrid, tiny-mamba2, tiny-nemotron-h,
/// tiny-nemotron-h-moe, tiny-gemma3, tiny-llama3, tiny-qwen2, tiny-qwen2-yarn, tiny-phi3, tiny-nemotron,
/// tiny-qwen3, tiny-qwen3moe, gemma-3-270m, gemma-3-1b, qwen2.5-0.5b, qwen2.5-7b, phi-3-mini,
/// phi-4-mini, nemotron-mini-4b,
/// qwen3-0.6b, qwen3-8b, qwen3-32b, qwen3-30b-a3b,
/// mixtral-8x7b, granite-4.0-micro, granite-4.0-h-micro, granite-4.0-h-tiny,
/// nemotron-3-nano-30b-a3b (`--list` shows their shapes).
///
/// Quantizations (llama-quantize's mixes): f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0,
/// q2_k, q2_k_s, q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl.
#[derive(clap::Args)]
pub struct Args {
    /// Output .gguf path.
    #[arg(required_unless_present = "list")]
    pub out: Option<PathBuf>,
    /// Model architecture; only checked against the preset's (the preset decides).
    #[arg(long)]
    pub arch: Option<String>,
    /// Shapes to use (see --list).
    #[arg(long, short = 'p', default_value = "tiny")]
    pub preset: String,
    /// File type / quantization mix, as llama-quantize names it (case-insensitive).
    #[arg(long, short = 'q', default_value = "q4_k_m")]
    pub quant: String,
    /// Random seed; every tensor row's values derive from it.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Copy the tokenizer (all `tokenizer.*` keys) from this GGUF model; its token count
    /// replaces the preset's vocabulary size.
    #[arg(long, value_name = "MODEL.gguf")]
    pub vocab_from: Option<PathBuf>,
    /// Override the number of blocks (quick tests with big shapes).
    #[arg(long, value_name = "N")]
    pub layers: Option<usize>,
    /// List presets and quantizations, then exit.
    #[arg(long)]
    pub list: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Benchmark files in seconds: each tensor's first 256 rows are drawn and quantized, the
    /// other rows copy one of them (chosen by the row's seed). Same shapes, types and value
    /// statistics; rows are not independent. Not for fixtures.
    #[arg(long)]
    pub fast: bool,
    /// Worker threads for generating and quantizing weights (default: all cores).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
}

fn list() {
    println!(
        "{:<16} {:>6} {:>6} {:>5} {:>4} {:>6} {:>7} {:>7} {:>10} {:>5}  model",
        "preset", "n_embd", "layers", "heads", "kv", "n_ff", "vocab", "ctx", "rope base", "tied"
    );
    for p in presets() {
        println!(
            "{:<16} {:>6} {:>6} {:>5} {:>4} {:>6} {:>7} {:>7} {:>10} {:>5}  {}",
            p.name, p.n_embd, p.n_layer, p.n_head, p.n_head_kv, p.n_ff, p.n_vocab, p.n_ctx, p.rope_freq_base, p.tied_embeddings, p.model
        );
    }
    println!(
        "\n{:<24} {:<15} {:>6} {:>6} {:>5} {:>4} {:>7} {:>7} {:>6}  layers",
        "preset", "arch", "n_embd", "layers", "heads", "kv", "experts", "used", "d_inner"
    );
    for p in ARCH_PRESETS {
        println!(
            "{:<24} {:<15} {:>6} {:>6} {:>5} {:>4} {:>7} {:>7} {:>6}  {}",
            p.name,
            p.arch,
            p.n_embd,
            p.n_layer(),
            p.n_head,
            p.n_head_kv,
            p.n_expert,
            p.n_used,
            p.ssm.map_or(0, |s| s.d_inner),
            p.pattern
        );
    }
    println!("\nquantizations (general.file_type):");
    for f in Ftype::ALL {
        println!("  {:<8} {:>2}  default tensor type {}", f.name(), f.llama_ftype(), f.default_type());
    }
}

pub fn main(a: Args) -> Result<()> {
    if a.list {
        list();
        return Ok(());
    }
    let Some(out) = a.out.clone() else { bail!("an output path is required") };
    if a.threads > 0 {
        // the synthesizer runs on rayon's global pool
        rayon::ThreadPoolBuilder::new().num_threads(a.threads).build_global().ok();
    }
    let Some(ftype) = Ftype::from_name(&a.quant) else {
        bail!("unknown quantization {:?} (known: {})", a.quant, Ftype::names().join(", "));
    };
    if let Some(ap) = ArchPreset::by_name(&a.preset) {
        return main_arch(ap, ftype, &a, &out);
    }
    let Some(preset) = Preset::by_name(&a.preset) else {
        let mut names: Vec<&str> = presets().iter().map(|p| p.name).collect();
        names.extend(ARCH_PRESETS.iter().map(|p| p.name));
        bail!("unknown preset {:?} (known: {})", a.preset, names.join(", "));
    };
    if let Some(arch) = a.arch.as_deref().filter(|&x| x != preset.arch) {
        bail!("preset {} is a {} model, not {arch}", preset.name, preset.arch);
    }
    let spec = SynthSpec { preset: *preset, ftype, seed: a.seed, n_layer_override: a.layers, vocab_from: a.vocab_from };

    let bar = if a.quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(0) };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{} {}", preset.name, ftype));
    let summary = write_synth_with(&spec, WriteOptions { row_pool: if a.fast { 256 } else { 0 } }, &out, &mut |done, total| {
        if bar.length() != Some(total) {
            bar.set_length(total);
        }
        bar.set_position(done);
    })
    .with_context(|| format!("writing {}", out.display()))?;
    bar.finish_and_clear();

    let s = &summary;
    let types: Vec<String> = s.type_counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    println!(
        "{}: {} ({} {}, {} layers, vocab {}), {:.2}M parameters, {} tensors ({}), {:.1} MiB, {:.2} bits/weight, {:.1} s",
        out.display(),
        s.preset.model,
        s.preset.name,
        s.ftype,
        s.preset.n_layer,
        s.preset.n_vocab,
        s.n_params as f64 / 1e6,
        s.n_tensors,
        types.join(", "),
        s.file_size as f64 / (1u64 << 20) as f64,
        s.file_size as f64 * 8.0 / s.n_params.max(1) as f64,
        s.seconds
    );
    Ok(())
}

fn opts(a: &Args) -> WriteOptions {
    WriteOptions { row_pool: if a.fast { 256 } else { 0 } }
}

fn main_arch(p: &ArchPreset, ftype: Ftype, a: &Args, out: &std::path::Path) -> Result<()> {
    if let Some(arch) = a.arch.as_deref().filter(|&x| x != p.arch) {
        bail!("preset {} is a {} model, not {arch}", p.name, p.arch);
    }
    if a.layers.is_some() {
        bail!("--layers is not supported for preset {} (its layer pattern is fixed: {})", p.name, p.pattern);
    }
    let spec = ArchSynthSpec { preset: *p, ftype, seed: a.seed, vocab_from: a.vocab_from.clone() };
    let bar = if a.quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(0) };
    let s = write_arch_synth_with(&spec, opts(a), out, &mut |done, total| {
        if bar.length() != Some(total) {
            bar.set_length(total);
        }
        bar.set_position(done);
    })
    .with_context(|| format!("writing {}", out.display()))?;
    bar.finish_and_clear();
    let types: Vec<String> = s.type_counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    println!(
        "{}: {} ({} {}, {} {}, layers {}), {:.2}M parameters, {} tensors ({}), {:.1} MiB, {:.1} s",
        out.display(),
        s.preset.model,
        s.preset.name,
        ftype,
        s.preset.arch,
        s.preset.n_layer(),
        s.preset.pattern,
        s.n_params as f64 / 1e6,
        s.n_tensors,
        types.join(", "),
        s.file_size as f64 / (1u64 << 20) as f64,
        s.seconds
    );
    Ok(())
}
