//! The WebSocket protocol at `GET /ws`.
//!
//! Every message, both ways, is one JSON text frame:
//! `{"type": "inference" | "status" | "metrics" | "cancel" | "error" | "ping" | "pong", "id": ID, "payload": {...}}`.
//! `id` is chosen by the client (string or number, echoed back exactly as sent) and tells
//! several requests on one connection apart; a message without one gets `"1"`, `"2"`, ...
//!
//! Client -> server
//! - `{"type":"inference","id":"r1","payload":{"prompt":"Hi"}}` or with `"messages":[{"role":"user","content":"Hi"}]`
//!   (chat template applied), plus optional `"model"` (default: the server's default model),
//!   `"temperature"` (0..2, default 0.8), `"topk"`, `"topp"`, `"max_tokens"`, `"seed"`, `"stop"`,
//!   `"stream"` (default true).
//! - `{"type":"cancel","id":"r1"}`: stop that generation (it ends with `finish_reason: "cancelled"`).
//! - `{"type":"status"}`: server status. `{"type":"metrics"}`: engine metrics. `{"type":"ping"}`: `pong`.
//!
//! Server -> client
//! - per token (with `stream`): `{"type":"inference","id":"r1","payload":{"token":"Hel","token_id":9906,
//!   "complete":false,"tokens_per_sec":41.7}}` (`token` may be `""` while a multi-byte
//!   character or a possible stop string is held back; `token_id` is `null` for a final flush)
//! - at the end (always): `{"type":"inference","id":"r1","payload":{"token":"","token_id":null,"complete":true,
//!   "text":"<whole answer>","finish_reason":"stop"|"length"|"cancelled","model":"...",
//!   "usage":{"prompt_tokens":..,"completion_tokens":..,"cached_tokens":..},"tokens_per_sec":..,"ttft_ms":..}}`
//! - `{"type":"error","id":"r1"|null,"payload":{"code":"INVALID_REQUEST"|"MODEL_NOT_FOUND"|"INFERENCE_ERROR"|"OVERLOADED"|"UNAUTHORIZED","message":"..."}}`
//!   (`id` null when the message could not be parsed; the connection stays open except after
//!   `UNAUTHORIZED`, which is followed by a close frame with code 1008)
//!
//! Keys and rate limits apply to every message, not only to the upgrade: each text or binary
//! message counts against the key's (or, without keys, the client IP's) rate limit and gets
//! `OVERLOADED` when over it; a key revoked while its socket is open gets `UNAUTHORIZED` and
//! close code 1008 at its next message or ping. Frames that break RFC 6455 close the connection
//! with the code that says why: 1009 for a message over `--max-body-bytes`, 1007 for a text frame
//! that is not UTF-8, 1002 for other protocol errors.
//! - `{"type":"status","payload":{"version":..,"models":[..],"default_model":..,"active":[ids]}}`,
//!   `{"type":"metrics","payload":{"<model>":{engine metrics}}}`, `{"type":"pong"}`.
//!
//! Keys (when required): `Authorization: Bearer`, `x-api-key`, or `?api_key=` (browsers
//! cannot set headers on a WebSocket). The server pings every 20 s and drops a peer silent for
//! three intervals; closing the socket cancels every generation it started.

use crate::auth::presented_key;
use crate::error::ApiError;
use crate::gen::{finish_str, start};
use crate::middleware::client_ip;
use crate::openai::{ChatMessageIn, StringOrList};
use crate::rest::{StreamRequest, VERSION};
use crate::state::AppState;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Request, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use quarrel_engine::StreamEvent;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Instant;
use tokio::sync::mpsc;

/// Most generations running at once on one connection.
const MAX_PER_CONNECTION: usize = 32;

#[derive(Deserialize)]
struct Incoming {
    #[serde(rename = "type")]
    kind: String,
    id: Option<Value>,
    #[serde(default)]
    payload: Value,
}

/// An inference payload.
#[derive(Deserialize, Debug)]
struct InferencePayload {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessageIn>>,
    temperature: Option<f64>,
    topk: Option<i64>,
    topp: Option<f64>,
    max_tokens: Option<i64>,
    seed: Option<i64>,
    stop: Option<StringOrList>,
    stream: Option<bool>,
    speculative: Option<bool>,
}

fn err_msg(id: Option<&Value>, e: &ApiError) -> Value {
    json!({"type": "error", "id": id, "payload": {"code": e.ws_code(), "message": e.message}})
}

pub async fn upgrade(State(state): State<AppState>, ws: WebSocketUpgrade, req: Request) -> Response {
    let caller = Caller {
        key: presented_key(req.headers())
            .or_else(|| req.uri().query().and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("api_key=").map(str::to_string)))),
        ip: client_ip(&req),
    };
    let refusal = admit(&state, &caller).err();
    ws.max_message_size(state.config.max_body_bytes).on_upgrade(move |socket| async move {
        match refusal {
            Some(e) => refuse(socket, e).await,
            None => {
                state.metrics.ws_active.inc();
                connection(socket, state.clone(), caller).await;
                state.metrics.ws_active.dec();
            }
        }
    })
}

/// Whom a connection's messages are counted for: the key it presented (checked again for
/// every message, so a revoked key stops working on a socket already open) and its client IP.
struct Caller {
    key: Option<String>,
    ip: String,
}

/// The HTTP routes' key and rate-limit rules, applied to the upgrade and to every message:
/// the per-IP limit, then the key and its limit (without keys, the per-key limit per IP).
fn admit(state: &AppState, c: &Caller) -> Result<(), ApiError> {
    AppState::check_rate(&state.ip_limiter, &c.ip).map_err(ApiError::rate_limited)?;
    match &state.keys {
        Some(keys) => {
            let id = keys.verify(c.key.as_deref()).map_err(|r| ApiError::unauthorized(r.message()))?;
            AppState::check_rate(&state.key_limiter, &id).map_err(ApiError::rate_limited)
        }
        None => AppState::check_rate(&state.key_limiter, &c.ip).map_err(ApiError::rate_limited),
    }
}

/// Is the connection's key still valid (no rate counted)? For the ping timer, so that an idle
/// socket of a revoked key is closed too.
fn key_still_valid(state: &AppState, c: &Caller) -> Result<(), ApiError> {
    match &state.keys {
        Some(keys) => keys.verify(c.key.as_deref()).map(|_| ()).map_err(|r| ApiError::unauthorized(r.message())),
        None => Ok(()),
    }
}

async fn refuse(mut socket: WebSocket, e: ApiError) {
    let _ = socket.send(Message::Text(err_msg(None, &e).to_string().into())).await;
    let code = if e.ws_code() == "UNAUTHORIZED" { 1008 } else { 1013 };
    let _ = socket.send(Message::Close(Some(CloseFrame { code, reason: e.ws_code().into() }))).await;
}

/// RFC 6455 close code and reason for a read error that is the peer's fault (None: the
/// connection is gone).
fn violation(e: &axum::Error) -> Option<(u16, &'static str)> {
    use std::error::Error as _;
    match e.source().and_then(|s| s.downcast_ref::<tungstenite::Error>())? {
        tungstenite::Error::Capacity(_) => Some((1009, "message too big")),
        tungstenite::Error::Protocol(_) => Some((1002, "protocol error")),
        tungstenite::Error::Utf8(_) => Some((1007, "invalid UTF-8 in a text frame")),
        _ => None,
    }
}

struct Running {
    task: tokio::task::JoinHandle<()>,
    cancel: Box<dyn Fn() + Send>,
}

async fn connection(socket: WebSocket, state: AppState, caller: Caller) {
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Message>();
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
    });
    let send = |v: Value| {
        let _ = out_tx.send(Message::Text(v.to_string().into()));
    };
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut next_id = 0u64;
    let mut ping = tokio::time::interval(state.config.ws_ping);
    ping.tick().await;
    let mut last_seen = Instant::now();
    loop {
        tokio::select! {
            msg = stream.next() => {
                let msg = match msg {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => {
                        // a frame that breaks the protocol or the size limit: the peer learns why
                        if let Some((code, reason)) = violation(&e) {
                            let _ = out_tx.send(Message::Close(Some(CloseFrame { code, reason: reason.into() })));
                        }
                        break;
                    }
                    None => break,
                };
                last_seen = Instant::now();
                if matches!(msg, Message::Text(_) | Message::Binary(_)) {
                    if let Err(e) = admit(&state, &caller) {
                        send(err_msg(None, &e));
                        if e.status == axum::http::StatusCode::UNAUTHORIZED {
                            let _ = out_tx.send(Message::Close(Some(CloseFrame { code: 1008, reason: e.ws_code().into() })));
                            break;
                        }
                        continue;
                    }
                }
                let text = match msg {
                    Message::Text(t) => t,
                    Message::Binary(_) => {
                        send(err_msg(None, &ApiError::invalid("binary frames are not part of the protocol; send JSON text")));
                        continue;
                    }
                    Message::Close(_) => break,
                    _ => continue,
                };
                let inc: Incoming = match serde_json::from_str(text.as_str()) {
                    Ok(m) => m,
                    Err(e) => {
                        send(err_msg(None, &ApiError::invalid(format!("not a protocol message: {e}"))));
                        continue;
                    }
                };
                let id = inc.id.clone().unwrap_or_else(|| {
                    next_id += 1;
                    json!(next_id.to_string())
                });
                let key = match &id { Value::String(s) => s.clone(), v => v.to_string() };
                match inc.kind.as_str() {
                    "inference" => {
                        if running.contains_key(&key) {
                            send(err_msg(Some(&id), &ApiError::invalid(format!("a request with id {key} is already running"))));
                        } else if running.len() >= MAX_PER_CONNECTION {
                            send(err_msg(Some(&id), &ApiError::overloaded(format!("at most {MAX_PER_CONNECTION} requests per connection"))));
                        } else {
                            match inference(&state, id.clone(), inc.payload, out_tx.clone(), done_tx.clone(), key.clone()).await {
                                Ok(r) => { running.insert(key, r); }
                                Err(e) => send(err_msg(Some(&id), &e)),
                            }
                        }
                    }
                    "cancel" => {
                        let target = inc.payload.get("id").map(|v| match v { Value::String(s) => s.clone(), v => v.to_string() }).unwrap_or(key);
                        match running.get(&target) {
                            Some(r) => (r.cancel)(),
                            None => send(err_msg(Some(&id), &ApiError::invalid(format!("no running request with id {target}")))),
                        }
                    }
                    "status" => send(json!({"type": "status", "id": id, "payload": {
                        "version": VERSION,
                        "models": state.registry.loaded().iter().map(|m| &m.entry.name).collect::<Vec<_>>(),
                        "default_model": state.registry.default_name(),
                        "active": running.keys().collect::<Vec<_>>(),
                    }})),
                    "metrics" => {
                        let m: serde_json::Map<String, Value> = state.registry.loaded().iter()
                            .map(|m| (m.entry.name.clone(), serde_json::to_value(m.handle.metrics()).unwrap_or_default())).collect();
                        send(json!({"type": "metrics", "id": id, "payload": m}));
                    }
                    "ping" => send(json!({"type": "pong", "id": id})),
                    "pong" => {}
                    other => send(err_msg(Some(&id), &ApiError::invalid(format!("unknown message type {other:?}")))),
                }
            }
            Some(done) = done_rx.recv() => { running.remove(&done); }
            _ = ping.tick() => {
                if let Err(e) = key_still_valid(&state, &caller) {
                    send(err_msg(None, &e));
                    let _ = out_tx.send(Message::Close(Some(CloseFrame { code: 1008, reason: e.ws_code().into() })));
                    break;
                }
                if last_seen.elapsed() > state.config.ws_ping * 3 {
                    tracing::info!("websocket peer silent for three ping intervals: closing");
                    break;
                }
                let _ = out_tx.send(Message::Ping(Vec::new().into()));
            }
        }
    }
    // the socket is gone: cancel everything it started (dropping the streams frees the KV)
    for (_, r) in running.drain() {
        r.task.abort();
    }
    drop(out_tx);
    let _ = writer.await;
}

async fn inference(
    state: &AppState,
    id: Value,
    payload: Value,
    out: mpsc::UnboundedSender<Message>,
    done: mpsc::UnboundedSender<String>,
    key: String,
) -> Result<Running, ApiError> {
    let p: InferencePayload = serde_json::from_value(payload).map_err(|e| ApiError::invalid(format!("invalid inference payload: {e}")))?;
    let stream_tokens = p.stream.unwrap_or(true);
    let req = StreamRequest {
        model: p.model,
        prompt: p.prompt,
        messages: p.messages,
        temperature: p.temperature,
        topk: p.topk,
        topp: p.topp,
        min_p: None,
        max_tokens: p.max_tokens,
        seed: p.seed,
        stop: p.stop,
        repeat_penalty: None,
        speculative: p.speculative,
    };
    let (model, prompt, knobs) = req.prompt_and_knobs()?;
    let started = start(state, model.as_deref(), prompt, &knobs).await?;
    let handle = started.model.handle.clone();
    let engine_id = started.stream.id();
    let model_name = started.model.entry.name.clone();
    let mut s = started.stream;
    let task = tokio::spawn(async move {
        let send = |v: Value| out.send(Message::Text(v.to_string().into())).is_ok();
        let t0 = Instant::now();
        let mut first: Option<Instant> = None;
        let (mut n, mut text) = (0usize, String::new());
        while let Some(ev) = s.next().await {
            match ev {
                StreamEvent::Token { id: tid, text: piece, .. } => {
                    if tid.is_some() {
                        n += 1;
                        first.get_or_insert_with(Instant::now);
                    }
                    text.push_str(&piece);
                    let tps = first.map_or(0.0, |f| {
                        let s = f.elapsed().as_secs_f64();
                        if n > 1 && s > 0.0 {
                            (n - 1) as f64 / s
                        } else {
                            0.0
                        }
                    });
                    if stream_tokens
                        && !send(json!({"type": "inference", "id": id, "payload": {
                        "token": piece, "token_id": tid, "complete": false, "tokens_per_sec": tps}}))
                    {
                        break;
                    }
                }
                StreamEvent::Done { finish_reason, usage, timings } => {
                    send(json!({"type": "inference", "id": id, "payload": {
                        "token": "", "token_id": null, "complete": true, "text": text, "model": model_name,
                        "finish_reason": finish_str(finish_reason), "usage": usage,
                        "tokens_per_sec": timings.gen_tokens_per_sec(n), "ttft_ms": timings.ttft.as_secs_f64() * 1e3,
                        "total_ms": t0.elapsed().as_secs_f64() * 1e3}}));
                }
                StreamEvent::Error(e) => {
                    send(err_msg(Some(&id), &ApiError::from(e)));
                }
            }
        }
        let _ = done.send(key);
    });
    Ok(Running { task, cancel: Box::new(move || handle.abort(engine_id)) })
}
