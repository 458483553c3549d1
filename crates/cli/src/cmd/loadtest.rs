//! `quarrel loadtest`: wiring for quarrel-loadtest.

use anyhow::{bail, Context, Result};
use quarrel_loadtest::{plot, run, sweep, LoadConfig, Protocol, Report, Sweep};
use std::time::Duration;

/// Load-test a running `quarrel serve`: N concurrent streaming clients.
///
/// Each client sends streaming chat requests back to back (OpenAI SSE, ollama NDJSON or the
/// WebSocket protocol) for --duration seconds or until --requests are done; requests started
/// before the deadline run to their end. Prints a table (and JSON with --json): requests/s,
/// generated tokens/s, time to first token, inter-token latency (the gaps between streamed
/// tokens), end-to-end percentiles, errors and retries.
///
/// A request whose kept-alive connection the server closed before any of its response arrived
/// is sent once more on a new connection and counted under retries, not errors, as browsers and
/// HTTP libraries do; HTTP error statuses, streams cut short and timeouts are errors.
///
/// --sweep runs the test at each client count in turn, one table row per count; --json then
/// writes every point's report and --plot an SVG of tokens/s and latency against clients.
/// Examples:
///   quarrel loadtest --clients 128 --duration 60
///   quarrel loadtest --sweep 16,64,128,256 -d 60 --json sweep.json --plot sweep.svg
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// sse (OpenAI /v1/chat/completions), ndjson (ollama /api/chat) or ws (/ws).
    #[arg(long, default_value = "sse")]
    pub protocol: Protocol,
    #[arg(short = 'c', long, default_value_t = 8)]
    pub clients: usize,
    /// Run at each of these client counts in turn (comma-separated, e.g. 16,64,128,256), each
    /// with the same --duration / --requests; replaces --clients.
    #[arg(long, value_delimiter = ',', value_name = "CLIENTS", conflicts_with = "clients")]
    pub sweep: Vec<usize>,
    /// Seconds to wait between the points of a sweep, so the server is idle when the next starts.
    #[arg(long = "sweep-pause", value_name = "SECONDS", default_value_t = 2.0)]
    pub sweep_pause: f64,
    /// With --sweep: write an SVG plot here (tokens/s; TTFT and inter-token p50/p95/p99 against clients).
    #[arg(long, value_name = "FILE.svg", requires = "sweep")]
    pub plot: Option<String>,
    /// Seconds to keep starting requests.
    #[arg(short = 'd', long)]
    pub duration: Option<f64>,
    /// Total requests (with or instead of --duration).
    #[arg(short = 'n', long)]
    pub requests: Option<usize>,
    /// Model name (default: the server's default model).
    #[arg(short = 'm', long)]
    pub model: Option<String>,
    #[arg(long, default_value = "Write a short story about a robot learning to paint.")]
    pub prompt: String,
    #[arg(long = "max-tokens", default_value_t = 64)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Seconds an HTTP request may take, to the end of its stream, before it counts as an error
    /// (default: no limit).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// API key (default: $QUARREL_API_KEY).
    #[arg(long = "api-key", env = "QUARREL_API_KEY")]
    pub api_key: Option<String>,
    /// Also write the report as JSON to this file (`-` for stdout); with --sweep, an object
    /// whose `points` holds one report per client count.
    #[arg(long)]
    pub json: Option<String>,
    /// Exit with an error when any request failed or did not complete.
    #[arg(long)]
    pub strict: bool,
}

fn seconds(flag: &str, s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).with_context(|| format!("{flag} must be a positive number of seconds"))
}

fn write_json(path: &str, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    if path == "-" {
        println!("{text}");
    } else {
        std::fs::write(path, text).with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}

/// Whether a report fails --strict.
fn failed(r: &Report) -> bool {
    r.errors > 0 || r.incomplete > 0 || r.complete == 0
}

pub fn main(a: Args) -> Result<()> {
    if a.duration.is_none() && a.requests.is_none() {
        bail!("give --duration SECONDS and/or --requests N");
    }
    if a.sweep.contains(&0) {
        bail!("--sweep: client counts must be positive");
    }
    let pause = Duration::try_from_secs_f64(a.sweep_pause).ok().context("--sweep-pause must be a number of seconds, 0 or more")?;
    let cfg = LoadConfig {
        url: a.url,
        protocol: a.protocol,
        clients: a.clients,
        duration: a.duration.map(|d| seconds("--duration", d)).transpose()?,
        requests: a.requests,
        model: a.model,
        prompt: a.prompt,
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        api_key: a.api_key,
        timeout: a.timeout.map(|t| seconds("--timeout", t)).transpose()?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    if a.sweep.is_empty() {
        let report = rt.block_on(run(cfg))?;
        println!("{}", report.table());
        if let Some(j) = &a.json {
            write_json(j, &report)?;
        }
        if a.strict && failed(&report) {
            bail!("{} errors, {} incomplete of {} requests", report.errors, report.incomplete, report.requests);
        }
        return Ok(());
    }

    println!("{}", Sweep::header(&cfg.url, cfg.protocol));
    // a row as each point ends: a sweep of long points takes a while
    let result = rt.block_on(sweep(cfg, &a.sweep, pause, |r| println!("{}", Sweep::row(r))))?;
    for r in &result.points {
        for (k, n) in &r.errors_by_kind {
            println!("{} clients: error {k}: {n}", r.clients);
        }
    }
    if let Some(j) = &a.json {
        write_json(j, &result)?;
    }
    if let Some(p) = &a.plot {
        plot::write_svg(&result, std::path::Path::new(p))?;
    }
    if a.strict {
        let bad: Vec<String> = result.points.iter().filter(|r| failed(r)).map(|r| r.clients.to_string()).collect();
        if !bad.is_empty() {
            bail!("requests failed or did not complete at {} clients", bad.join(", "));
        }
    }
    Ok(())
}
