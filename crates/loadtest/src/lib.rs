//! # quarrel-loadtest: concurrent streaming clients against a running Quarrel server
//!
//! The client behind `quarrel loadtest`: N concurrent clients, each running streaming requests
//! back to back against a server (OpenAI SSE, ollama NDJSON or the WebSocket protocol) for a
//! duration or a request count; reports requests/s, generated tokens/s, time to first token,
//! inter-token latency and end-to-end latency percentiles, errors and retries — as a table and
//! as JSON. A sweep runs the test at several client counts in turn and plots the curve as SVG.
//! It talks HTTP and WebSocket only: no Quarrel library is linked, so it measures other
//! servers (llama-server, vLLM, ollama) the same way.
//!
//! ```text
//!  LoadConfig ─► run: N tokio tasks ─► (sse | ndjson | ws) request ─► stream ─► Sample
//!                                                                        │
//!     Report { requests/s, tokens/s, TTFT, inter-token and e2e percentiles } ◄──┘
//!  sweep: run at each client count ─► Sweep { points: [Report] } ─► table, JSON, SVG plot
//! ```
//!
//! | module      | holds |
//! |-------------|-------|
//! | this file   | `LoadConfig`, `Protocol`, `run` (the clients and their deadline) |
//! | `client`    | one client: the requests, their streams, token timing, the retry on a closed kept-alive connection |
//! | `report`    | `Sample` (one request), `Report` (the aggregate: `table()` for people, `Serialize` for JSON) |
//! | `sweep`     | `sweep`: one run per client count; `Sweep`, its table and JSON |
//! | `plot`      | the SVG plot of a sweep |
//!
//! A request counts as complete only when its stream ended properly (`finish_reason` and
//! `[DONE]`, `"done": true`, or `"complete": true`); requests started before the deadline
//! run to their end.

mod client;
pub mod plot;
mod report;
mod sweep;

pub use report::{Percentiles, Report};
pub use sweep::{sweep, Sweep};

use serde::Serialize;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// `POST /v1/chat/completions` with `stream: true`.
    Sse,
    /// `POST /api/chat` (NDJSON).
    Ndjson,
    /// `GET /ws`, one connection per client.
    Ws,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Protocol, String> {
        match s {
            "sse" | "openai" => Ok(Protocol::Sse),
            "ndjson" | "ollama" => Ok(Protocol::Ndjson),
            "ws" | "websocket" => Ok(Protocol::Ws),
            _ => Err(format!("unknown protocol {s:?} (sse, ndjson or ws)")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Server base URL, e.g. `http://127.0.0.1:8080`.
    pub url: String,
    pub protocol: Protocol,
    pub clients: usize,
    /// Stop starting requests after this long.
    pub duration: Option<Duration>,
    /// Stop after this many requests in all.
    pub requests: Option<usize>,
    pub model: Option<String>,
    pub prompt: String,
    pub max_tokens: usize,
    pub temperature: f64,
    pub api_key: Option<String>,
    /// Give up on an HTTP request (an error) when its response has not ended after this long.
    pub timeout: Option<Duration>,
}

impl Default for LoadConfig {
    /// The CLI's defaults, with neither a duration nor a request count.
    fn default() -> LoadConfig {
        LoadConfig {
            url: "http://127.0.0.1:8080".into(),
            protocol: Protocol::Sse,
            clients: 8,
            duration: None,
            requests: None,
            model: None,
            prompt: "Write a short story about a robot learning to paint.".into(),
            max_tokens: 64,
            temperature: 0.8,
            api_key: None,
            timeout: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("http client: {0}")]
    Client(String),
    #[error("plot: {0}")]
    Plot(String),
}

/// Run the load test.
pub async fn run(cfg: LoadConfig) -> Result<Report, LoadError> {
    if cfg.clients == 0 {
        return Err(LoadError::Config("clients must be positive".into()));
    }
    if cfg.duration.is_none() && cfg.requests.is_none() {
        return Err(LoadError::Config("give a duration or a request count".into()));
    }
    let http = client::Http::new(&cfg)?;
    let cfg = Arc::new(cfg);
    let started = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let deadline = cfg.duration.map(|d| t0 + d);
    let mut tasks = vec![];
    for c in 0..cfg.clients {
        let (cfg, http, started) = (cfg.clone(), http.clone(), started.clone());
        tasks.push(tokio::spawn(async move { client::client(c, &cfg, &http, &started, deadline).await }));
    }
    let mut samples = vec![];
    for t in tasks {
        match t.await {
            Ok(s) => samples.extend(s),
            Err(e) => samples.push(report::Sample { error: Some(format!("client task: {e}")), ..Default::default() }),
        }
    }
    Ok(Report::from_samples(&cfg, &samples, t0.elapsed().as_secs_f64()))
}
