//! `quarrel loadtest`: wiring for quarrel-loadtest.

use anyhow::{bail, Context, Result};
use quarrel_loadtest::{run, LoadConfig, Protocol};
use std::time::Duration;

/// Load-test a running `quarrel serve`: N concurrent streaming clients.
///
/// Each client sends streaming chat requests back to back (OpenAI SSE, ollama NDJSON or the
/// WebSocket protocol) for --duration seconds or until --requests are done; requests started
/// before the deadline run to their end. Prints a table (and JSON with --json).
/// Example: quarrel loadtest --clients 128 --duration 60
#[derive(clap::Args)]
pub struct Args {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// sse (OpenAI /v1/chat/completions), ndjson (ollama /api/chat) or ws (/ws).
    #[arg(long, default_value = "sse")]
    pub protocol: Protocol,
    #[arg(short = 'c', long, default_value_t = 8)]
    pub clients: usize,
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
    /// API key (default: $QUARREL_API_KEY).
    #[arg(long = "api-key", env = "QUARREL_API_KEY")]
    pub api_key: Option<String>,
    /// Also write the report as JSON to this file (`-` for stdout).
    #[arg(long)]
    pub json: Option<String>,
    /// Exit with an error when any request failed or did not complete.
    #[arg(long)]
    pub strict: bool,
}

pub fn main(a: Args) -> Result<()> {
    if a.duration.is_none() && a.requests.is_none() {
        bail!("give --duration SECONDS and/or --requests N");
    }
    if a.duration.is_some_and(|d| !(d > 0.0 && d.is_finite())) {
        bail!("--duration must be a positive number of seconds");
    }
    let cfg = LoadConfig {
        url: a.url,
        protocol: a.protocol,
        clients: a.clients,
        duration: a.duration.map(Duration::from_secs_f64),
        requests: a.requests,
        model: a.model,
        prompt: a.prompt,
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        api_key: a.api_key,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    let report = rt.block_on(run(cfg))?;
    println!("{}", report.table());
    if let Some(j) = &a.json {
        let text = serde_json::to_string_pretty(&report)?;
        if j == "-" {
            println!("{text}");
        } else {
            std::fs::write(j, text).with_context(|| format!("writing {j}"))?;
        }
    }
    if a.strict && (report.errors > 0 || report.incomplete > 0 || report.complete == 0) {
        bail!("{} errors, {} incomplete of {} requests", report.errors, report.incomplete, report.requests);
    }
    Ok(())
}
