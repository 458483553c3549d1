//! One load-test client: requests back to back over HTTP (SSE or NDJSON streams) or one
//! WebSocket, each measured into a [`Sample`] (time to first token, the gaps between token
//! events, end to end, tokens).
//!
//! Like a browser or an HTTP library's idempotent-retry rule, a request whose kept-alive
//! connection closed or reset under it before any of its response arrived is sent once more, on
//! a new connection: the server closed an idle connection just as the request went out, which
//! says nothing about serving it. Whatever happens after the response began (an HTTP status
//! error, a stream cut short, an error event) and a timeout are errors.

use crate::report::Sample;
use crate::{LoadConfig, LoadError, Protocol};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::error::Error as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The HTTP clients of one run, shared by its client tasks.
#[derive(Clone)]
pub(crate) struct Http {
    /// Keeps one connection per client alive between requests.
    pooled: reqwest::Client,
    /// Keeps no connection, so every request on it opens a new one: the second attempt of a
    /// request whose kept-alive connection closed. (reqwest's own retry policy resends through
    /// the pool, where the request can land on another connection the server has closed too.)
    fresh: reqwest::Client,
}

impl Http {
    pub(crate) fn new(cfg: &LoadConfig) -> Result<Http, LoadError> {
        let build = |idle: usize| {
            let mut b = reqwest::Client::builder().pool_max_idle_per_host(idle).tcp_nodelay(true);
            if let Some(t) = cfg.timeout {
                b = b.timeout(t);
            }
            b.build().map_err(|e| LoadError::Client(e.to_string()))
        };
        // one idle slot per client: with fewer, the connections beyond them would be closed after
        // each response and opened again for the next request, a cost no real client pays
        Ok(Http { pooled: build(cfg.clients)?, fresh: build(0)? })
    }
}

/// The request body of request `n`, sent by client `client`; the prompt names both, so no two
/// requests share a whole prompt.
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

/// Client `c`: requests back to back until the deadline or until the run's request count is
/// taken (`started` counts the requests of all clients).
pub(crate) async fn client(c: usize, cfg: &LoadConfig, http: &Http, started: &AtomicUsize, deadline: Option<Instant>) -> Vec<Sample> {
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
            Protocol::Sse | Protocol::Ndjson => http_request(cfg, http, &body(cfg, c, n)).await,
            Protocol::Ws => ws_request(cfg, &mut ws, body(cfg, c, n), n).await,
        };
        out.push(s);
    }
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Token timing of one request: the first token event sets the time to first token, each later
/// one adds the gap since the one before.
struct TokenClock {
    t0: Instant,
    last: Option<Instant>,
    events: usize,
}

impl TokenClock {
    fn new(t0: Instant) -> TokenClock {
        TokenClock { t0, last: None, events: 0 }
    }

    fn token(&mut self, now: Instant, s: &mut Sample) {
        match self.last {
            None => s.ttft = Some(now - self.t0),
            Some(prev) => s.gaps_ms.push(ms(now - prev)),
        }
        self.last = Some(now);
        self.events += 1;
    }
}

/// `e` and the errors under it.
fn causes<'a>(e: &'a (dyn std::error::Error + 'static)) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |&e| e.source())
}

/// Whether a request failed because its connection closed or was reset under it before the
/// response's head arrived: hyper's "connection closed before message completed" or a reset,
/// abort or broken pipe. A connection that could not be opened, or a timeout, is not that.
pub(crate) fn closed_before_response(e: &reqwest::Error) -> bool {
    if e.is_timeout() || e.is_connect() || !e.is_request() {
        return false;
    }
    causes(e).any(|c| {
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            return h.is_incomplete_message() || h.is_canceled();
        }
        c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            use std::io::ErrorKind::*;
            matches!(io.kind(), ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof)
        })
    })
}

/// An error's kind for the report: `timeout`, or the stage and the innermost cause (the URL left
/// out, so that the same failure on different requests counts as one kind).
fn describe(stage: &str, e: reqwest::Error) -> String {
    if e.is_timeout() {
        return "timeout".into();
    }
    let stage = if e.is_connect() { "connect" } else { stage };
    match e.source().and_then(|s| causes(s).last()) {
        Some(root) => format!("{stage}: {root}"),
        None => format!("{stage}: {}", e.without_url()),
    }
}

async fn send(cfg: &LoadConfig, http: &reqwest::Client, body: &Value) -> Result<reqwest::Response, reqwest::Error> {
    let path = if cfg.protocol == Protocol::Sse { "/v1/chat/completions" } else { "/api/chat" };
    let mut req = http.post(format!("{}{path}", cfg.url.trim_end_matches('/'))).json(body);
    if let Some(k) = &cfg.api_key {
        req = req.bearer_auth(k);
    }
    req.send().await
}

async fn http_request(cfg: &LoadConfig, http: &Http, body: &Value) -> Sample {
    let t0 = Instant::now();
    let mut s = Sample::default();
    // A kept connection found closed before the request was written is replaced inside
    // hyper-util's client (its retry of canceled requests, on in reqwest) and never shows here. reqwest does not
    // say whether a failed attempt's connection was a kept one, so any failure before the
    // response is sent again; as the second attempt goes out on a new connection and its
    // failure is an error, a server that drops requests still shows errors.
    let sent = match send(cfg, &http.pooled, body).await {
        Err(e) if closed_before_response(&e) => {
            s.retries = 1;
            send(cfg, &http.fresh, body).await
        }
        r => r,
    };
    let resp = match sent {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            s.error = Some(format!("HTTP {}", r.status().as_u16()));
            s.e2e = t0.elapsed();
            return s;
        }
        Err(e) => {
            s.error = Some(describe("send", e));
            s.e2e = t0.elapsed();
            return s;
        }
    };
    let mut bytes = resp.bytes_stream();
    let mut buf: Vec<u8> = vec![];
    let (mut finished, mut done) = (false, false);
    let mut clock = TokenClock::new(t0);
    let mut usage_tokens = None;
    let sep: &[u8] = if cfg.protocol == Protocol::Sse { b"\n\n" } else { b"\n" };
    while let Some(chunk) = bytes.next().await {
        // the events of one read arrived together: they share its time
        let now = Instant::now();
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                s.error = Some(describe("stream", e));
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
                    v["choices"][0]["delta"]["content"].as_str().unwrap_or("")
                } else {
                    v["message"]["content"].as_str().unwrap_or("")
                };
                if !piece.is_empty() {
                    clock.token(now, &mut s);
                }
                if cfg.protocol == Protocol::Sse {
                    if v["choices"][0]["finish_reason"].is_string() {
                        finished = true;
                    }
                    if let Some(u) = v["usage"]["completion_tokens"].as_u64() {
                        usage_tokens = Some(u as usize);
                    }
                } else if v["done"] == json!(true) {
                    finished = true;
                    done = true;
                    usage_tokens = v["eval_count"].as_u64().map(|n| n as usize);
                }
            }
        }
    }
    // the server's count when it reports one; else one token per content event, as servers
    // without usage reports stream one token per event
    s.tokens = usage_tokens.unwrap_or(clock.events);
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

/// One request over the client's WebSocket (opened on first use, kept for the next requests).
/// A kept connection that fails before any frame of this request's answer came is opened again
/// and the request sent once more, as over HTTP.
async fn ws_request(cfg: &LoadConfig, ws: &mut Option<Ws>, payload: Value, n: usize) -> Sample {
    use tokio_tungstenite::tungstenite::Message;
    let t0 = Instant::now();
    let mut s = Sample::default();
    let mut clock = TokenClock::new(t0);
    let id = format!("r{n}");
    let msg = json!({"type": "inference", "id": id, "payload": payload}).to_string();
    for attempt in 0..2 {
        let reused = ws.is_some();
        if ws.is_none() {
            match ws_connect(cfg).await {
                Ok(c) => *ws = Some(c),
                Err(e) => {
                    s.error = Some(e);
                    break;
                }
            }
        }
        let Some(sock) = ws.as_mut() else { break };
        let retry = reused && attempt == 0;
        if let Err(e) = sock.send(Message::Text(msg.clone().into())).await {
            *ws = None;
            if retry {
                s.retries = 1;
                continue;
            }
            s.error = Some(format!("ws send: {e}"));
            break;
        }
        let mut answered = false;
        let mut closed = false;
        while let Some(m) = sock.next().await {
            let now = Instant::now();
            let text = match m {
                Ok(Message::Text(t)) => t,
                Ok(Message::Close(_)) | Err(_) => {
                    closed = true;
                    break;
                }
                Ok(_) => continue,
            };
            let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else { continue };
            if v["id"] != json!(id) {
                continue;
            }
            answered = true;
            match v["type"].as_str() {
                Some("error") => {
                    s.error = Some(format!("ws error {}", v["payload"]["code"].as_str().unwrap_or("?")));
                    break;
                }
                Some("inference") => {
                    let p = &v["payload"];
                    if p["token_id"].is_u64() {
                        s.tokens += 1;
                        clock.token(now, &mut s);
                    }
                    if p["complete"] == json!(true) {
                        s.complete = true;
                        break;
                    }
                }
                _ => {}
            }
        }
        if !closed && !s.complete && s.error.is_none() {
            // the stream ended without a close frame: the connection is gone all the same
            closed = true;
        }
        if closed {
            *ws = None;
            if retry && !answered {
                s.retries = 1;
                continue;
            }
            s.error = Some("ws closed".into());
        }
        break;
    }
    s.e2e = t0.elapsed();
    s
}
