//! `quarrel batched-bench`: throughput of N parallel sequences, with llama-batched-bench's
//! protocol, flags and output fields (quarrel-bench: `BatchedBench::bench_batched`).

use crate::args::ModelArgs;
use anyhow::{bail, Result};
use quarrel_bench::llama_bench::parse_list;
use quarrel_bench::{BatchedBench, BatchedRun};
use quarrel_core::Backend;
use quarrel_engine::{Engine, EngineOptions};
use std::io::Write;

/// Measure prompt and generation throughput with several parallel sequences, like
/// llama-batched-bench.
///
/// For every combination of prompt length (-npp), generation length (-ntg) and parallel
/// sequence count (-npl): `pl` prompts of `pp` random tokens are processed together (forward
/// passes of -b tokens), then `tg` decode steps of one token for each sequence. T_PP / S_PP
/// are the prompt time and tokens/s (pl*pp / T_PP), T_TG / S_TG the generation time and
/// tokens/s (pl*tg / T_TG), T / S both together. A warm-up pass runs first.
///
/// Output: a markdown table (default) or, with --output-format jsonl, one JSON object per line
/// with llama-batched-bench's fields (pp, tg, pl, n_kv, t_pp, speed_pp, t_tg, speed_tg, t,
/// speed, ...).
///
/// Example: quarrel batched-bench -m model.gguf -npp 128 -ntg 128 -npl 1,2,4,8,16
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths (comma-separated, llama-bench ranges allowed).
    #[arg(long = "npp", alias = "n-pp", default_value = "128")]
    pub npp: String,
    /// Generation lengths.
    #[arg(long = "ntg", alias = "n-tg", default_value = "128")]
    pub ntg: String,
    /// Parallel sequence counts.
    #[arg(long = "npl", alias = "n-pl", default_value = "1,2,4,8,16")]
    pub npl: String,
    /// md (table) or jsonl (one JSON object per line).
    #[arg(long = "output-format", default_value = "md")]
    pub output_format: String,
}

pub fn main(a: Args) -> Result<()> {
    // clap declares -npp etc. as long flags; llama's single-dash spelling is rewritten in main
    let (npp, ntg, npl) = (parse_list("-npp", &a.npp)?, parse_list("-ntg", &a.ntg)?, parse_list("-npl", &a.npl)?);
    if !matches!(a.output_format.as_str(), "md" | "jsonl") {
        bail!("--output-format must be md or jsonl, not {:?}", a.output_format);
    }
    let max_pl = npl.iter().copied().max().unwrap_or(1).max(1);
    let max_len = npp.iter().max().unwrap_or(&0) + ntg.iter().max().unwrap_or(&0);
    let mut margs = a.model.clone();
    margs.engine.ctx.n_ctx = max_len.max(16);
    let engine = margs.engine_with(|o: &mut EngineOptions| o.n_seq = max_pl)?;
    crate::common::with_engine!(engine, engine => { run(engine, &a, &npp, &ntg, &npl) })
}

fn run<B: Backend>(mut e: Engine<B>, a: &Args, npp: &[usize], ntg: &[usize], npl: &[usize]) -> Result<()> {
    let jsonl = a.output_format == "jsonl";
    let threads = a.model.engine.ctx.threads;
    e.bench_batched(16, 0, 1)?; // warm-up
    let mut out = std::io::stdout().lock();
    if !jsonl {
        writeln!(out, "\nmodel: {}, backend: {}, n_batch = {}\n", e.summary().name, e.backend.name(), e.opts.n_batch)?;
        writeln!(
            out,
            "|{:>6} | {:>6} | {:>4} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} |",
            "PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s"
        )?;
        writeln!(out, "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|")?;
    }
    for &pp in npp {
        for &tg in ntg {
            for &pl in npl {
                let r: BatchedRun = e.bench_batched(pp, tg, pl)?;
                if jsonl {
                    let mut v = serde_json::to_value(&r)?;
                    v["n_kv_max"] = (e.opts.n_ctx * e.opts.n_seq).into();
                    v["n_batch"] = e.opts.n_batch.into();
                    v["n_ubatch"] = e.opts.n_batch.into();
                    v["flash_attn"] = 1.into();
                    v["is_pp_shared"] = 0.into();
                    v["n_gpu_layers"] = 0.into();
                    v["n_threads"] = threads.into();
                    v["n_threads_batch"] = threads.into();
                    v["backend"] = e.backend.name().into();
                    writeln!(out, "{v}")?;
                } else {
                    writeln!(
                        out,
                        "|{:>6} | {:>6} | {:>4} | {:>6} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} |",
                        r.pp, r.tg, r.pl, r.n_kv, r.t_pp, r.speed_pp, r.t_tg, r.speed_tg, r.t, r.speed
                    )?;
                }
                out.flush()?;
            }
        }
    }
    Ok(())
}
