//! # quarrel-loadtest: concurrent streaming clients against a running Quarrel server
//!
//! The client behind `quarrel loadtest`: N concurrent clients, each running streaming requests
//! back to back against a server (OpenAI SSE, ollama NDJSON or the WebSocket protocol) for a
//! duration or a request count; reports requests/s, generated tokens/s, time to first token
//! and end-to-end latency percentiles, and errors — as a table and as JSON. It talks HTTP and
//! WebSocket only: no Quarrel library is linked.
//!
//! ```text
//!  LoadConfig ─► run: N tokio tasks ─► (sse | ndjson | ws) request ─► stream ─► Sample
//!                                                                        │
//!               Report { requests/s, tokens/s, TTFT and latency percentiles } ◄──┘
//! ```
//!
//! | item        | responsibility |
//! |-------------|----------------|
//! | `LoadConfig`, `Protocol` | what to send, where, how many clients, for how long |
//! | `run`       | the clients and their deadline; collects one `Sample` per request |
//! | `Report`    | aggregates (`table()` for people, `Serialize` for JSON) |
//!
//! A request counts as complete only when its stream ended properly (`finish_reason` and
//! `[DONE]`, `"done": true`, or `"complete": true`); requests started before the deadline
//! run to their end.

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
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
}

/// One request's outcome.
#[derive(Clone, Debug, Default)]
struct Sample {
    complete: bool,
    error: Option<String>,
    ttft: Option<Duration>,
    e2e: Duration,
    tokens: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
}

fn percentiles(mut v: Vec<f64>) -> Percentiles {
    if v.is_empty() {
        return Percentiles::default();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Percentiles {
        p50_ms: at(0.50),
        p95_ms: at(0.95),
        p99_ms: at(0.99),
        mean_ms: v.iter().sum::<f64>() / v.len() as f64,
        max_ms: v[v.len() - 1],
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub url: String,
    pub protocol: Protocol,
    pub clients: usize,
    pub wall_s: f64,
    pub requests: usize,
    pub complete: usize,
    pub errors: usize,
    pub incomplete: usize,
    pub errors_by_kind: BTreeMap<String, usize>,
    pub requests_per_s: f64,
    pub generated_tokens: usize,
    pub generated_tokens_per_s: f64,
    pub ttft: Percentiles,
    pub e2e: Percentiles,
}

impl Report {
    pub fn table(&self) -> String {
        let mut s = format!("load test of {} ({:?}), {} clients\n\n", self.url, self.protocol, self.clients);
        s += "| wall s | requests | complete | errors | incomplete | requests/s | generated tokens | tokens/s |\n";
        s += "|---|---|---|---|---|---|---|---|\n";
        s += &format!(
            "| {:.1} | {} | {} | {} | {} | {:.2} | {} | {:.1} |\n",
            self.wall_s,
            self.requests,
            self.complete,
            self.errors,
            self.incomplete,
            self.requests_per_s,
            self.generated_tokens,
            self.generated_tokens_per_s
        );
        s += "\n| latency (ms) | p50 | p95 | p99 | mean | max |\n|---|---|---|---|---|---|\n";
        for (name, p) in [("time to first token", &self.ttft), ("end to end", &self.e2e)] {
            s += &format!("| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n", p.p50_ms, p.p95_ms, p.p99_ms, p.mean_ms, p.max_ms);
        }
        for (k, n) in &self.errors_by_kind {
            s += &format!("\nerror {k}: {n}");
        }
        s
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("http client: {0}")]
    Client(String),
}

/// Run the load test.
pub async fn run(cfg: LoadConfig) -> Result<Report, LoadError> {
    if cfg.clients == 0 {
        return Err(LoadError::Config("clients must be positive".into()));
    }
    if cfg.duration.is_none() && cfg.requests.is_none() {
        return Err(LoadError::Config("give a duration or a request count".into()));
    }
    let http = reqwest::Client::builder().pool_max_idle_per_host(cfg.clients).build().map_err(|e| LoadError::Client(e.to_string()))?;
    let cfg = Arc::new(cfg);
    let started = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let deadline = cfg.duration.map(|d| t0 + d);
    let mut tasks = vec![];
    for c in 0..cfg.clients {
        let (cfg, http, started) = (cfg.clone(), http.clone(), started.clone());
        tasks.push(tokio::spawn(async move { client(c, &cfg, &http, &started, deadline).await }));
    }
    let mut samples = vec![];
    for t in tasks {
        match t.await {
            Ok(s) => samples.extend(s),
            Err(e) => samples.push(Sample { error: Some(format!("client task: {e}")), ..Default::default() }),
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let mut errors_by_kind = BTreeMap::new();
    for s in &samples {
        if let Some(e) = &s.error {
            *errors_by_kind.entry(e.clone()).or_insert(0) += 1;
        }
    }
    let errors = samples.iter().filter(|s| s.error.is_some()).count();
    let complete = samples.iter().filter(|s| s.complete).count();
    let generated: usize = samples.iter().map(|s| s.tokens).sum();
    Ok(Report {
        url: cfg.url.clone(),
        protocol: cfg.protocol,
        clients: cfg.clients,
        wall_s: wall,
        requests: samples.len(),
        complete,
        errors,
        incomplete: samples.len() - complete - errors,
        errors_by_kind,
        requests_per_s: complete as f64 / wall,
        generated_tokens: generated,
        generated_tokens_per_s: generated as f64 / wall,
        ttft: percentiles(samples.iter().filter_map(|s| s.ttft).map(|d| d.as_secs_f64() * 1e3).collect()),
        e2e: percentiles(samples.iter().filter(|s| s.complete).map(|s| s.e2e.as_secs_f64() * 1e3).collect()),
    })
}

fn body(cfg: &LoadConfig, client: usize, n: usize) -> Value {
    let prompt = format!("{} (client {client}, request {n})", cfg.prompt);
    let mut v = match cfg.protocol {
        Protocol::Sse => json!({"messages": [{"role": "user", "content": prompt}], "stream": true, "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature, "stream_options": {"include_usage": true}}),
        Protocol::Ndjson => json!({"messages": [{"role": "user", "content": prompt}], "stream": true,
            "options": {"num_predict": cfg.max_tokens, "temperature": cfg.temperature}}),
        Protocol::Ws => json!({"messages": [{"role": "user", "content": prompt}], "stream": true, "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature}),
    };
    let model = cfg.model.clone().unwrap_or_default();
    if !model.is_empty() || cfg.protocol == Protocol::Ndjson {
        v["model"] = json!(model);
    }
    v
}

async fn client(c: usize, cfg: &LoadConfig, http: &reqwest::Client, started: &AtomicUsize, deadline: Option<Instant>) -> Vec<Sample> {
    let mut out = vec![];
    let mut ws = None;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let n = started.fetch_add(1, Ordering::Relaxed);
        if cfg.requests.is_some_and(|r| n >= r) {
            break;
        }
        let s = match cfg.protocol {
            Protocol::Sse | Protocol::Ndjson => http_request(cfg, http, body(cfg, c, n)).await,
            Protocol::Ws => ws_request(cfg, &mut ws, body(cfg, c, n), n).await,
        };
        out.push(s);
    }
    out
}

async fn http_request(cfg: &LoadConfig, http: &reqwest::Client, body: Value) -> Sample {
    let t0 = Instant::now();
    let path = if cfg.protocol == Protocol::Sse { "/v1/chat/completions" } else { "/api/chat" };
    let mut req = http.post(format!("{}{path}", cfg.url.trim_end_matches('/'))).json(&body);
    if let Some(k) = &cfg.api_key {
        req = req.bearer_auth(k);
    }
    let mut s = Sample::default();
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            s.error = Some(format!("connect: {}", e.without_url()));
            return s;
        }
    };
    if !resp.status().is_success() {
        s.error = Some(format!("HTTP {}", resp.status().as_u16()));
        return s;
    }
    let mut bytes = resp.bytes_stream();
    let mut buf: Vec<u8> = vec![];
    let (mut finished, mut done) = (false, false);
    let sep: &[u8] = if cfg.protocol == Protocol::Sse { b"\n\n" } else { b"\n" };
    while let Some(chunk) = bytes.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                s.error = Some(format!("stream: {}", e.without_url()));
                break;
            }
        };
        buf.extend_from_slice(&chunk);
        while let Some(i) = buf.windows(sep.len()).position(|w| w == sep) {
            let item: Vec<u8> = buf.drain(..i + sep.len()).collect();
            let text = String::from_utf8_lossy(&item[..i]).to_string();
            for line in text.lines() {
                let data = if cfg.protocol == Protocol::Sse {
                    match line.strip_prefix("data:") {
                        Some(d) => d.trim(),
                        None => continue,
                    }
                } else {
                    line.trim()
                };
                if data.is_empty() {
                    continue;
                }
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let Ok(v) = serde_json::from_str::<Value>(data) else {
                    s.error = Some("unparsable event".into());
                    continue;
                };
                if v.get("error").is_some() {
                    s.error = Some(format!("stream error {}", v["error"]["code"].as_str().or(v["error"].as_str()).unwrap_or("?")));
                    continue;
                }
                let piece = if cfg.protocol == Protocol::Sse {
                    v["choices"][0]["delta"]["content"].as_str().unwrap_or("").to_string()
                } else {
                    v["message"]["content"].as_str().unwrap_or("").to_string()
                };
                if !piece.is_empty() && s.ttft.is_none() {
                    s.ttft = Some(t0.elapsed());
                }
                if cfg.protocol == Protocol::Sse {
                    if v["choices"][0]["finish_reason"].is_string() {
                        finished = true;
                    }
                    if let Some(u) = v["usage"]["completion_tokens"].as_u64() {
                        s.tokens = u as usize;
                    }
                } else if v["done"] == json!(true) {
                    finished = true;
                    done = true;
                    s.tokens = v["eval_count"].as_u64().unwrap_or(0) as usize;
                }
            }
        }
    }
    s.e2e = t0.elapsed();
    s.complete = s.error.is_none() && finished && done;
    s
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_connect(cfg: &LoadConfig) -> Result<Ws, String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("{}/ws", cfg.url.trim_end_matches('/').replacen("http", "ws", 1));
    let mut req = url.into_client_request().map_err(|e| e.to_string())?;
    if let Some(k) = &cfg.api_key {
        let v = format!("Bearer {k}").parse().map_err(|_| "bad api key".to_string())?;
        req.headers_mut().insert("authorization", v);
    }
    tokio_tungstenite::connect_async(req).await.map(|(s, _)| s).map_err(|e| format!("ws connect: {e}"))
}

async fn ws_request(cfg: &LoadConfig, ws: &mut Option<Ws>, payload: Value, n: usize) -> Sample {
    use tokio_tungstenite::tungstenite::Message;
    let t0 = Instant::now();
    let mut s = Sample::default();
    if ws.is_none() {
        match ws_connect(cfg).await {
            Ok(c) => *ws = Some(c),
            Err(e) => {
                s.error = Some(e);
                return s;
            }
        }
    }
    let Some(sock) = ws.as_mut() else { return s };
    let id = format!("r{n}");
    let msg = json!({"type": "inference", "id": id, "payload": payload});
    if let Err(e) = sock.send(Message::Text(msg.to_string().into())).await {
        s.error = Some(format!("ws send: {e}"));
        *ws = None;
        return s;
    }
    while let Some(m) = sock.next().await {
        let text = match m {
            Ok(Message::Text(t)) => t,
            Ok(Message::Close(_)) | Err(_) => {
                s.error = Some("ws closed".into());
                *ws = None;
                break;
            }
            Ok(_) => continue,
        };
        let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else { continue };
        if v["id"] != json!(id) {
            continue;
        }
        match v["type"].as_str() {
            Some("error") => {
                s.error = Some(format!("ws error {}", v["payload"]["code"].as_str().unwrap_or("?")));
                break;
            }
            Some("inference") => {
                let p = &v["payload"];
                if p["token_id"].is_u64() {
                    s.tokens += 1;
                    s.ttft.get_or_insert_with(|| t0.elapsed());
                }
                if p["complete"] == json!(true) {
                    s.complete = true;
                    break;
                }
            }
            _ => {}
        }
    }
    s.e2e = t0.elapsed();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let p = percentiles((1..=100).map(f64::from).collect());
        assert_eq!((p.p50_ms, p.p95_ms, p.p99_ms, p.max_ms), (50.0, 95.0, 99.0, 100.0));
        assert_eq!(percentiles(vec![7.0]).p99_ms, 7.0);
        assert_eq!(percentiles(vec![]).p50_ms, 0.0);
    }
}
