//! `quarrel bench`: prompt-processing and generation speed, with llama-bench's protocol,
//! flags and output fields (library: `Engine::bench_pp` / `bench_tg` / `bench_pg`).

use crate::resolve::resolve_model;
use anyhow::{bail, Context, Result};
use quarrel_core::{Backend, KvType};
use quarrel_cpu::CpuBackend;
use quarrel_bench::{mean_stddev, Bench, ProfiledBackend};
use quarrel_engine::{Engine, EngineOptions};
use quarrel_gguf::Gguf;
use serde_json::{json, Value};
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
    /// KV cache element type: f16 (as llama-bench's default) or f32.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: String,
    /// Compute device: auto (CUDA GPU when present, else CPU), cpu, or cuda[:N].
    #[arg(long = "device", default_value = "auto")]
    pub device: String,
    /// GPU memory for expert weights (as `quarrel run --expert-budget`).
    #[arg(long = "expert-budget", value_parser = crate::common::parse_bytes)]
    pub expert_budget: Option<usize>,
    /// GPU arithmetic, as `quarrel run --numerics`: auto (default), fast, invariant or exact.
    #[arg(long = "numerics", value_enum, default_value_t = crate::common::Numerics::Auto)]
    pub numerics: crate::common::Numerics,
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Md,
    Json,
}

/// One test of one model and thread count.
struct Row {
    model_filename: String,
    model_type: String,
    model_size: u64,
    model_n_params: u64,
    backend: String,
    n_threads: usize,
    n_batch: usize,
    kv_type: String,
    n_prompt: usize,
    n_gen: usize,
    load_ms: f64,
    test_time: String,
    samples_ns: Vec<u64>,
}

impl Row {
    fn samples_ts(&self) -> Vec<f64> {
        let n = (self.n_prompt + self.n_gen) as f64;
        self.samples_ns.iter().map(|&ns| 1e9 * n / ns.max(1) as f64).collect()
    }

    fn test_name(&self) -> String {
        test_name(self.n_prompt, self.n_gen)
    }
}

fn test_name(pp: usize, tg: usize) -> String {
    match (pp, tg) {
        (p, 0) => format!("pp{p}"),
        (0, g) => format!("tg{g}"),
        (p, g) => format!("pp{p}+tg{g}"),
    }
}

/// llama-bench's list syntax: `first[-last[(+|*)step]]`, comma-separated.
pub fn parse_list(flag: &str, s: &str) -> Result<Vec<usize>> {
    let s = s.trim();
    if s.is_empty() {
        bail!("{flag}: empty list (give numbers such as `{flag} 1,2` or a range `{flag} 1-4`)");
    }
    let mut out = vec![];
    for item in s.split(',') {
        let item = item.trim();
        let bad = || anyhow::anyhow!("{flag}: invalid value {item:?} in {s:?} (expected N, A-B, A-B+STEP or A-B*FACTOR)");
        let num = |x: &str| x.trim().parse::<usize>().map_err(|_| bad());
        let (first, rest) = match item.split_once('-') {
            None => (num(item)?, None),
            Some((a, b)) => (num(a)?, Some(b)),
        };
        let Some(rest) = rest else {
            out.push(first);
            continue;
        };
        let (last, op, step) = if let Some((l, st)) = rest.split_once('+') {
            (num(l)?, '+', num(st)?)
        } else if let Some((l, st)) = rest.split_once('*') {
            (num(l)?, '*', num(st)?)
        } else {
            (num(rest)?, '+', 1)
        };
        if (op == '+' && step == 0) || (op == '*' && (step < 2 || first == 0)) {
            bail!("{flag}: range {item:?} does not advance");
        }
        let mut i = first;
        while i <= last {
            out.push(i);
            i = if op == '+' { i + step } else { i * step };
        }
    }
    Ok(out)
}

fn parse_all(flag: &str, vals: &[String], default: Vec<usize>) -> Result<Vec<usize>> {
    if vals.is_empty() {
        return Ok(default);
    }
    let mut out = vec![];
    for v in vals {
        out.extend(parse_list(flag, v)?);
    }
    Ok(out)
}

/// llama.cpp's model description: `{arch} {size} {file type}` (`llama 135M Q4_1`).
fn model_type(g: &Gguf, arch: &str, n_params: u64) -> String {
    let size = match g.get_str("general.size_label").ok().flatten() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ if n_params >= 1_000_000_000 => format!("{:.1}B", n_params as f64 / 1e9),
        _ => format!("{:.0}M", n_params as f64 / 1e6),
    };
    let ftype = g.get_u64("general.file_type").ok().flatten();
    let ft = match ftype.and_then(|f| quarrel_models::Ftype::ALL.iter().find(|x| x.llama_ftype() as u64 == f)) {
        Some(f) => {
            let n = f.name().to_ascii_uppercase();
            match n.rsplit_once('_') {
                Some((b, "S")) if b.ends_with('K') => format!("{b} - Small"),
                Some((b, "M")) if b.ends_with('K') => format!("{b} - Medium"),
                Some((b, "L")) if b.ends_with('K') => format!("{b} - Large"),
                _ => n,
            }
        }
        None => match ftype {
            Some(f) => format!("ftype {f}"),
            None => "?".into(),
        },
    };
    format!("{arch} {size} {ft}")
}

fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_default()
}

/// Now as RFC 3339 UTC (`2025-01-31T12:34:56Z`), as llama-bench's test_time.
fn utc_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
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
    let kv_type = KvType::parse(&a.kv_type).with_context(|| format!("unknown --kv-type {:?} (f16, f32, q8_0 or q4_0)", a.kv_type))?;
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
    let n_ctx = tests.iter().map(|(p, g)| p + g).max().unwrap_or(1).max(1);
    let opts = EngineOptions { n_ctx, n_batch: a.batch, kv_type, ..Default::default() };

    // ---- run
    let n_runs = paths.len() * threads.len() * tests.len();
    let mut run_i = 0;
    let mut rows: Vec<Row> = vec![];
    let mut profiles: Vec<String> = vec![];
    for path in &paths {
        for &t in &threads {
            let t0 = Instant::now();
            let device = crate::common::DeviceSel::parse(&a.device)?;
            if a.profile && device != crate::common::DeviceSel::Cpu {
                bail!("--profile times ops on the CPU backend only (use --device cpu)");
            }
            crate::common::with_engine!(crate::common::load_engine(device, t, path, opts.clone(), a.expert_budget, a.numerics)?, engine => {
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
                        kv_type: a.kv_type.to_ascii_lowercase(),
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
        }
    }

    // ---- report
    match a.output {
        Format::Md => {
            print!("{}", markdown(&rows));
            for p in &profiles {
                println!("\n{p}");
            }
        }
        Format::Json => {
            print!("{}", json_list(&rows));
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
    lines.push(["(engine/model code between ops)".into(), String::new(), format!("{:.3}", per(outside)), format!("{:.1}", 100.0 * per(outside) / total_ms.max(1e-12))]);
    lines.push(["all matmuls".into(), String::new(), format!("{:.3}", per(mm)), format!("{:.1}", 100.0 * per(mm) / total_ms.max(1e-12))]);
    let heads = match run {
        Run::Tg(_) => ["op", "calls/step", "ms/step", "%"],
        Run::Pp(_) => ["op", "calls/prompt", "ms/prompt", "%"],
    };
    s.push_str(&table(&heads, &[false, true, true, true], &lines));
    Ok(s)
}

/// A markdown table with columns padded to their widest cell; `right[i]` right-aligns column i.
fn table<const N: usize>(head: &[&str; N], right: &[bool; N], rows: &[[String; N]]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let cell = |i: usize, c: &str| if right[i] { format!(" {c:>w$} |", w = w[i]) } else { format!(" {c:<w$} |", w = w[i]) };
    let mut s = String::from("|");
    for (i, h) in head.iter().enumerate() {
        s += &cell(i, h);
    }
    s += "\n|";
    for i in 0..N {
        s += &format!(" {}{} |", "-".repeat(w[i].saturating_sub(1)), if right[i] { ':' } else { '-' });
    }
    s += "\n";
    for r in rows {
        s += "|";
        for (i, c) in r.iter().enumerate() {
            s += &cell(i, c);
        }
        s += "\n";
    }
    s
}

fn markdown(rows: &[Row]) -> String {
    let lines: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            let (avg, sd) = mean_stddev(&r.samples_ts());
            let size = if r.model_size < 1 << 30 {
                format!("{:.2} MiB", r.model_size as f64 / (1u64 << 20) as f64)
            } else {
                format!("{:.2} GiB", r.model_size as f64 / (1u64 << 30) as f64)
            };
            let params = if r.model_n_params < 1_000_000_000 {
                format!("{:.2} M", r.model_n_params as f64 / 1e6)
            } else {
                format!("{:.2} B", r.model_n_params as f64 / 1e9)
            };
            // the backend's short name ("cpu"); its full description is in the footer
            let backend = r.backend.split(" (").next().unwrap_or_default().to_string();
            [r.model_type.clone(), size, params, backend, r.n_threads.to_string(), r.test_name(), format!("{avg:.2} ± {sd:.2}")]
        })
        .collect();
    let mut s = table(
        &["model", "size", "params", "backend", "threads", "test", "t/s"],
        &[false, true, true, false, true, true, true],
        &lines,
    );
    // load times, one per model and thread count, outside the t/s table
    s.push('\n');
    let mut seen = vec![];
    for r in rows {
        let key = (r.model_filename.clone(), r.n_threads);
        if !seen.contains(&key) {
            s += &format!("load: {} ({} threads): {:.1} ms on {}\n", r.model_filename, r.n_threads, r.load_ms, r.backend);
            seen.push(key);
        }
    }
    s += &format!("build: {} (quarrel {})\n", build_commit(), env!("CARGO_PKG_VERSION"));
    s
}

fn build_commit() -> &'static str {
    option_env!("QUARREL_BUILD_COMMIT").unwrap_or("unknown")
}

/// llama-bench's `-o json`: a list of objects with its field names, in its order.
fn json_list(rows: &[Row]) -> String {
    let cpu = cpu_info();
    let objs: Vec<String> = rows
        .iter()
        .map(|r| {
            let ts = r.samples_ts();
            let (avg_ts, sd_ts) = mean_stddev(&ts);
            let ns: Vec<f64> = r.samples_ns.iter().map(|&x| x as f64).collect();
            let (avg_ns, sd_ns) = mean_stddev(&ns);
            let fields: Vec<(&str, Value)> = vec![
                ("build_commit", json!(build_commit())),
                ("build_number", json!(0)),
                ("quarrel_version", json!(env!("CARGO_PKG_VERSION"))),
                ("cpu_info", json!(cpu)),
                ("gpu_info", json!("")),
                ("backends", json!("CPU")),
                ("backend", json!(r.backend)),
                ("model_filename", json!(r.model_filename)),
                ("model_type", json!(r.model_type)),
                ("model_size", json!(r.model_size)),
                ("model_n_params", json!(r.model_n_params)),
                ("n_batch", json!(r.n_batch)),
                ("n_ubatch", json!(r.n_batch)),
                ("n_threads", json!(r.n_threads)),
                ("type_k", json!(r.kv_type)),
                ("type_v", json!(r.kv_type)),
                ("n_gpu_layers", json!(0)),
                ("n_prompt", json!(r.n_prompt)),
                ("n_gen", json!(r.n_gen)),
                ("n_depth", json!(0)),
                ("test_time", json!(r.test_time)),
                ("load_ms", json!(r.load_ms)),
                ("avg_ns", json!(avg_ns.round() as u64)),
                ("stddev_ns", json!(sd_ns.round() as u64)),
                ("avg_ts", json!(avg_ts)),
                ("stddev_ts", json!(sd_ts)),
                ("samples_ns", json!(r.samples_ns)),
                ("samples_ts", json!(ts)),
            ];
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("    {}: {}", json!(k), v)).collect();
            format!("  {{\n{}\n  }}", body.join(",\n"))
        })
        .collect();
    format!("[\n{}\n]\n", objs.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse_list("-t", "1,2").unwrap(), vec![1, 2]);
        assert_eq!(parse_list("-t", "1-4").unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(parse_list("-p", "64-512*2").unwrap(), vec![64, 128, 256, 512]);
        assert_eq!(parse_list("-p", "0-10+5,7").unwrap(), vec![0, 5, 10, 7]);
        assert!(parse_list("-t", "").is_err());
        assert!(parse_list("-t", "1,,2").is_err());
        assert!(parse_list("-t", "x").is_err());
        assert!(parse_list("-t", "1-4+0").is_err());
        assert!(parse_list("-t", "0-4*2").is_err());
    }

    #[test]
    fn dates() {
        let s = utc_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z'));
    }

    #[test]
    fn markdown_table_aligns() {
        let t = table(&["a", "bb"], &[false, true], &[["xyz".into(), "1 ± 2".into()]]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "| a   |    bb |");
        assert_eq!(lines[1], "| --- | ----: |");
        assert_eq!(lines[2], "| xyz | 1 ± 2 |");
    }
}
