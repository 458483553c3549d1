//! `quarrel bench`: prompt-processing and generation speed, with llama-bench's protocol,
//! flags and output fields (quarrel-bench: `Bench::bench_pp` / `bench_tg` / `bench_pg`, `llama_bench`).

use crate::args::{DeviceArgs, KvTypeArg};
use crate::cmd::bench_spec::{SpecBench, PROMPTS};
use crate::resolve::resolve_model;
use crate::speculate::SpecArgs;
use anyhow::{bail, Context, Result};
use quarrel_bench::llama_bench::{json_list, markdown, model_type, parse_all, parse_list, table, test_name, utc_now, Row};
use quarrel_bench::{Bench, ProfiledBackend};
use quarrel_core::Backend;
use quarrel_cpu::CpuBackend;
use quarrel_engine::{Engine, EngineOptions};
use quarrel_gguf::Gguf;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Measure prompt processing (pp) and generation (tg) speed, like llama-bench.
///
/// Every combination of model (-m), thread count (-t) and test is run: one test `ppN` per
/// prompt length in -p, one `tgN` per generation length in -n, one `ppN+tgM` per --pg pair.
/// Each is run once as a warm-up, then -r times, each repetition from an empty KV cache:
///
///   ppN   one prompt of N random token ids, in forward passes of -b tokens
///
///   tgN   N single-token decode steps from an empty context (BOS, then random ids)
///
/// t/s is tokens / seconds of each repetition, reported as mean ± sample standard deviation
/// over the repetitions, exactly as llama-bench computes it, so the numbers compare directly
/// (scripts/bench-vs-llamacpp.sh runs both). Model load time is measured on its own and
/// never enters t/s.
///
/// Lists accept commas, repeated flags and llama-bench's ranges: `-t 1,2,4`, `-t 1 -t 2`,
/// `-p 64-512*2` (64,128,256,512), `-t 1-8+1`. A length of 0 disables that kind of test
/// (`-n 0`: prompt tests only).
///
/// Output (stdout): a markdown table (-o md) or a JSON list with llama-bench's field names
/// (-o json: model_filename, model_type, model_size, model_n_params, n_threads, n_prompt,
/// n_gen, avg_ns, stddev_ns, avg_ts, stddev_ts, samples_ns, samples_ts, ..., plus backend and
/// load_ms). Progress goes to stderr.
///
/// Examples:
///
///   quarrel bench -m model.gguf                   pp512 and tg128, all cores, 5 repetitions
///
///   quarrel bench -m a.gguf,b.gguf -t 1,2 -p 64 -n 32 -r 3 -o json
///
///   quarrel bench -m model.gguf -p 0 -n 64 --profile    decode speed and where it goes
///
/// With --draft-model (or --spec ngram) a second table follows: greedy generation of each
/// length in -n after real prompts (two built-in ones, or --spec-prompt), every repetition
/// once without and once with the drafter, with the speed-up, the share of drafted tokens
/// accepted and whether both texts are the same (llama-bench's random tokens would defeat
/// any drafter):
///
///   quarrel bench -m model-f16.gguf --draft-model model-q4_1.gguf -p 0 -n 128 -r 3
#[derive(clap::Args)]
pub struct Args {
    /// Models: .gguf paths or names (as `quarrel run -m`); repeatable or comma-separated.
    /// Default: SmolLM2-135M-Instruct Q4_1, fetched on first use.
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Vec<String>,
    /// Thread counts to test, each from 1 up [default: all available cores].
    #[arg(short = 't', long = "threads", value_name = "LIST")]
    pub threads: Vec<String>,
    /// Prompt lengths: one ppN test each (0 = no prompt test) [default: 512].
    #[arg(short = 'p', long = "n-prompt", value_name = "LIST")]
    pub n_prompt: Vec<String>,
    /// Generation lengths: one tgN test each (0 = no generation test) [default: 128].
    #[arg(short = 'n', long = "n-gen", value_name = "LIST")]
    pub n_gen: Vec<String>,
    /// Prompt then generation in one timed run, as PP,TG (`--pg 512,128`); repeatable.
    #[arg(long = "pg", value_name = "PP,TG")]
    pub pg: Vec<String>,
    /// Tokens per forward pass while processing a prompt (llama.cpp's micro-batch, -ub).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: usize,
    /// Repetitions of each test (after one warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Output format on stdout: md (table) or json (llama-bench's fields).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Md)]
    pub output: Format,
    #[command(flatten)]
    pub kv: KvTypeArg,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Skip the warm-up run before each test.
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// After the measurements, time one extra generation run of each model and thread count
    /// op by op (matmuls by weight type and shape) and print where a decode step goes (and,
    /// with prompt tests, one run of the longest prompt: where prompt processing goes). The
    /// profiled runs are never part of the t/s results. Printed to stdout after the table with
    /// -o md, to stderr with -o json.
    #[arg(long)]
    pub profile: bool,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// A prompt for the speculative decoding rows (repeatable; default: a story and a code
    /// edit). `@FILE` reads it from a file.
    #[arg(long = "spec-prompt", value_name = "TEXT|@FILE")]
    pub spec_prompt: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Md,
    Json,
}

fn progress(msg: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(msg);
    let _ = e.flush();
}

pub fn main(a: Args) -> Result<()> {
    // ---- validate everything before loading anything
    let threads = parse_all("-t", &a.threads, vec![quarrel_cpu::default_threads()])?;
    if threads.contains(&0) {
        bail!("-t: thread counts must be at least 1 (got {:?})", threads);
    }
    let n_prompt = parse_all("-p", &a.n_prompt, vec![512])?;
    let n_gen = parse_all("-n", &a.n_gen, vec![128])?;
    let mut tests: Vec<(usize, usize)> = vec![];
    tests.extend(n_prompt.iter().filter(|&&p| p > 0).map(|&p| (p, 0)));
    tests.extend(n_gen.iter().filter(|&&g| g > 0).map(|&g| (0, g)));
    for pg in &a.pg {
        let v = parse_list("--pg", pg)?;
        match v.as_slice() {
            [p, g] if p + g > 0 => tests.push((*p, *g)),
            _ => bail!("--pg: expected two lengths PP,TG such as `--pg 512,128`, got {pg:?}"),
        }
    }
    if tests.is_empty() {
        bail!("nothing to benchmark: every -p and -n length is 0 and no --pg was given");
    }
    if a.reps == 0 {
        bail!("-r: at least one repetition is needed");
    }
    if a.batch == 0 {
        bail!("-b: the batch size must be at least 1");
    }
    let kv_type = crate::common::parse_kv_type(&a.kv.kv_type)?;
    let mut model_names: Vec<Option<String>> = vec![];
    for m in &a.model {
        if std::path::Path::new(m).is_file() {
            model_names.push(Some(m.clone()));
            continue;
        }
        for part in m.split(',') {
            if part.trim().is_empty() {
                bail!("-m: empty model name in {m:?}");
            }
            model_names.push(Some(part.trim().to_string()));
        }
    }
    if model_names.is_empty() {
        model_names.push(None);
    }
    let mut paths: Vec<PathBuf> = vec![];
    for m in &model_names {
        paths.push(resolve_model(m.as_deref(), true)?);
    }
    let mut spec_prompts = vec![];
    for (i, p) in a.spec_prompt.iter().enumerate() {
        let text = match p.strip_prefix('@') {
            Some(f) => std::fs::read_to_string(f).with_context(|| format!("--spec-prompt: reading {f}"))?,
            None => p.clone(),
        };
        spec_prompts.push((format!("prompt {}", i + 1), text));
    }
    if spec_prompts.is_empty() {
        spec_prompts = PROMPTS.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect();
    }
    let spec_bench = SpecBench {
        spec: &a.spec,
        prompts: spec_prompts,
        n_gen: n_gen.iter().copied().filter(|&g| g > 0).collect(),
        reps: a.reps,
        warmup: !a.no_warmup,
        batch: a.batch,
        kv: a.kv.clone(),
        device: a.device.clone(),
    };
    if a.spec.enabled() && spec_bench.n_gen.is_empty() {
        bail!("--draft-model / --spec: the speculative rows need a generation length (-n)");
    }
    let n_ctx = tests.iter().map(|(p, g)| p + g).max().unwrap_or(1).max(1);
    let opts = EngineOptions { n_ctx, n_batch: a.batch, kv_type, ..Default::default() };

    // ---- run
    let n_runs = paths.len() * threads.len() * tests.len();
    let mut run_i = 0;
    let mut rows: Vec<Row> = vec![];
    let mut profiles: Vec<String> = vec![];
    let mut spec_rows = vec![];
    for path in &paths {
        for &t in &threads {
            let t0 = Instant::now();
            let device = crate::common::DeviceSel::parse(&a.device.device)?;
            if a.profile && device != crate::common::DeviceSel::Cpu {
                bail!("--profile times ops on the CPU backend only (use --device cpu)");
            }
            crate::common::with_engine!(crate::common::load_engine(device, t, path, opts.clone(), a.device.expert_budget, a.device.numerics.choice(), None)?, engine => {
                let load_ms = t0.elapsed().as_secs_f64() * 1e3;
                let info = engine.model.info().clone();
                let model_size: u64 = engine.gguf.tensors().iter().map(|x| x.n_bytes).sum();
                let mtype = model_type(&engine.gguf, &info.arch, info.n_params);
                let backend = engine.backend.name();
                progress(format_args!("bench: loaded {} ({mtype}) on {backend} in {load_ms:.0} ms\n", path.display()));
                for &(p, g) in &tests {
                    run_i += 1;
                    let name = test_name(p, g);
                    progress(format_args!("bench: {run_i}/{n_runs} {name}, {t} threads:"));
                    if !a.no_warmup {
                        progress(format_args!(" warm-up"));
                        if p > 0 {
                            engine.bench_pp(p).with_context(|| format!("{name} warm-up"))?;
                        }
                        if g > 0 {
                            engine.bench_tg(1).with_context(|| format!("{name} warm-up"))?;
                        }
                    }
                    let test_time = utc_now();
                    let mut samples_ns = vec![];
                    for _ in 0..a.reps {
                        let dt = engine.bench_pg(p, g).with_context(|| format!("running {name}"))?;
                        let ns = dt.as_nanos().max(1) as u64;
                        samples_ns.push(ns);
                        progress(format_args!(" {:.2}", (p + g) as f64 * 1e9 / ns as f64));
                    }
                    progress(format_args!(" t/s\n"));
                    rows.push(Row {
                        model_filename: path.display().to_string(),
                        model_type: mtype.clone(),
                        model_size,
                        model_n_params: info.n_params,
                        backend: backend.clone(),
                        n_threads: t,
                        n_batch: a.batch,
                        kv_type: a.kv.kv_type.to_ascii_lowercase(),
                        n_prompt: p,
                        n_gen: g,
                        load_ms,
                        test_time,
                        samples_ns,
                    });
                }
                if a.profile {
                    let gguf = engine.gguf.clone();
                    drop(engine);
                    let n = tests.iter().map(|&(_, g)| g).max().filter(|&g| g > 0).unwrap_or(32).min(n_ctx);
                    progress(format_args!("bench: profiling tg{n}, {t} threads\n"));
                    profiles.push(profile(gguf.clone(), t, opts.clone(), Run::Tg(n), &mtype)?);
                    // the longest prompt test too, where there is one
                    if let Some(p) = tests.iter().map(|&(p, _)| p).max().filter(|&p| p > 0) {
                        progress(format_args!("bench: profiling pp{p}, {t} threads\n"));
                        profiles.push(profile(gguf, t, opts.clone(), Run::Pp(p), &mtype)?);
                    }
                }
            });
            // a second load of the model, with its drafter, once the first is freed
            if a.spec.enabled() {
                spec_rows.extend(spec_bench.run(path, t)?);
            }
        }
    }

    // ---- report
    match a.output {
        Format::Md => {
            print!("{}", markdown(&rows));
            if !spec_rows.is_empty() {
                print!("\nspeculative decoding (greedy, after a prompt):\n\n{}", crate::cmd::bench_spec::markdown(&spec_rows));
            }
            for p in &profiles {
                println!("\n{p}");
            }
        }
        Format::Json => {
            print!("{}", json_list(&rows));
            if !spec_rows.is_empty() {
                eprint!("\nspeculative decoding (greedy, after a prompt):\n\n{}", crate::cmd::bench_spec::markdown(&spec_rows));
            }
            for p in &profiles {
                eprintln!("\n{p}");
            }
        }
    }
    Ok(())
}

/// What [`profile`] times: `n` decode steps, or one prompt of `n` tokens.
#[derive(Clone, Copy)]
enum Run {
    Tg(usize),
    Pp(usize),
}

/// One more tgN (or ppN) run on a profiling backend; a markdown table of time per decode
/// step (per prompt) by op.
fn profile(gguf: std::sync::Arc<Gguf>, threads: usize, opts: EngineOptions, run: Run, mtype: &str) -> Result<String> {
    let be = ProfiledBackend::new(CpuBackend::new(threads)?);
    let mut engine = Engine::from_gguf(be, gguf, opts)?;
    let (n, per_n, total) = match run {
        Run::Tg(n) => {
            engine.bench_tg(1)?; // warm-up
            engine.backend.reset();
            (n, n, engine.bench_tg(n)?)
        }
        Run::Pp(n) => {
            engine.bench_pp(n)?; // warm-up
            engine.backend.reset();
            (n, 1, engine.bench_pp(n)?)
        }
    };
    let stats = engine.backend.stats();
    let per = |d: Duration| d.as_secs_f64() * 1e3 / per_n as f64;
    let total_ms = per(total);
    let mut s = match run {
        Run::Tg(_) => format!(
            "profile: tg{n}, {mtype}, {threads} threads: {total_ms:.3} ms per decode step ({:.2} t/s)\n\n",
            1e3 / total_ms.max(1e-9)
        ),
        Run::Pp(_) => format!(
            "profile: pp{n}, {mtype}, {threads} threads: {total_ms:.3} ms per prompt ({:.2} t/s)\n\n",
            1e3 * n as f64 / total_ms.max(1e-9)
        ),
    };
    let mut lines: Vec<[String; 4]> = vec![];
    let (mut in_ops, mut mm) = (Duration::ZERO, Duration::ZERO);
    for (k, st) in &stats {
        in_ops += st.time;
        if matches!(k, quarrel_bench::OpKind::Matmul(..) | quarrel_bench::OpKind::MatmulMany(..)) {
            mm += st.time;
        }
        lines.push([
            k.to_string(),
            format!("{:.1}", st.calls as f64 / per_n as f64),
            format!("{:.3}", per(st.time)),
            format!("{:.1}", 100.0 * per(st.time) / total_ms.max(1e-12)),
        ]);
    }
    let outside = total.saturating_sub(in_ops);
    lines.push([
        "(engine/model code between ops)".into(),
        String::new(),
        format!("{:.3}", per(outside)),
        format!("{:.1}", 100.0 * per(outside) / total_ms.max(1e-12)),
    ]);
    lines.push(["all matmuls".into(), String::new(), format!("{:.3}", per(mm)), format!("{:.1}", 100.0 * per(mm) / total_ms.max(1e-12))]);
    let heads = match run {
        Run::Tg(_) => ["op", "calls/step", "ms/step", "%"],
        Run::Pp(_) => ["op", "calls/prompt", "ms/prompt", "%"],
    };
    s.push_str(&table(&heads, &[false, true, true, true], &lines));
    Ok(s)
}
