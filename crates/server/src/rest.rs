//! Quarrel's own REST API and the probes: `GET /api/models`, `GET /api/models/{name}`,
//! `POST|DELETE /api/models/{name}/load`, `POST /api/stream` (SSE), `GET /api/health`,
//! `GET /api/metrics`, `/healthz`, `/readyz`, `/version`, `/metrics` (Prometheus).

use crate::error::{ApiError, ApiJson};
use crate::gen::{finish_str, start, Knobs};
use crate::metrics::ModelLabel;
use crate::openai::{to_chat, ChatMessageIn, StringOrList};
use crate::registry::{kv_bytes, Loaded, ModelEntry};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use quarrel_engine::{Prompt, StreamEvent};
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use utoipa::ToSchema;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

fn entry_json(e: &ModelEntry, m: Option<&Loaded>) -> Value {
    let mut v = json!({
        "name": e.name, "aliases": e.public_aliases(), "size_bytes": e.size_bytes, "loaded": m.is_some(),
    });
    if let Some(m) = m {
        let i = m.info();
        let kv = kv_bytes(i, &m.handle);
        v["details"] = json!({
            "arch": i.arch, "parameters": i.n_params, "quantization": i.file_type,
            "context_length": i.n_ctx, "context_length_train": i.n_ctx_train,
            "n_vocab": i.n_vocab, "n_embd": i.n_embd, "n_layer": i.n_layer, "n_head": i.n_head, "n_kv_head": i.n_kv_head,
            "pooling": i.pooling, "kv_type": i.kv_type, "backend": i.backend, "chat_template": i.chat_template,
        });
        v["memory"] = json!({"weights_bytes": e.size_bytes.max(i.size_bytes), "kv_cache_bytes": kv, "total_bytes": m.memory_bytes()});
        v["engine"] = serde_json::to_value(m.handle.metrics()).unwrap_or_default();
    }
    v
}

#[utoipa::path(get, path = "/api/models", tag = "quarrel", responses((status = 200, description = "every model that can be loaded, and which are")))]
pub async fn models(State(state): State<AppState>) -> Json<Value> {
    let loaded = state.registry.loaded();
    let mut out = vec![];
    let mut seen = vec![];
    for m in &loaded {
        out.push(entry_json(&m.entry, Some(m)));
        seen.push(m.entry.name.clone());
    }
    for e in state.registry.catalog().iter().filter(|e| !seen.contains(&e.name)) {
        out.push(entry_json(e, None));
    }
    Json(json!({"models": out, "default": state.registry.default_name(), "memory_budget_bytes": state.registry.budget}))
}

#[utoipa::path(get, path = "/api/models/{name}", tag = "quarrel", params(("name" = String, Path)),
    responses((status = 200, description = "parameters, quantization, memory"), (status = 404, body = crate::error::ErrorBody)))]
pub async fn model(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    if let Some(m) = state.registry.find_loaded(&name) {
        return Ok(Json(entry_json(&m.entry, Some(&m))));
    }
    let e = state.registry.find_entry(&name).ok_or_else(|| ApiError::model_not_found(&name))?;
    Ok(Json(entry_json(&e, None)))
}

#[utoipa::path(post, path = "/api/models/{name}/load", tag = "quarrel", params(("name" = String, Path)),
    responses((status = 200, description = "loaded"), (status = 404, body = crate::error::ErrorBody)))]
pub async fn load(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let m = state.registry.load(&name).await?;
    Ok(Json(entry_json(&m.entry, Some(&m))))
}

#[utoipa::path(delete, path = "/api/models/{name}/load", tag = "quarrel", params(("name" = String, Path)),
    responses((status = 200, description = "unloaded"), (status = 404, body = crate::error::ErrorBody)))]
pub async fn unload(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    state.registry.unload(&name)?;
    Ok(Json(json!({"unloaded": name})))
}

/// `POST /api/stream` body: Quarrel's flat request.
#[derive(Deserialize, ToSchema, Debug)]
pub struct StreamRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessageIn>>,
    pub temperature: Option<f64>,
    pub topk: Option<i64>,
    pub topp: Option<f64>,
    pub min_p: Option<f64>,
    pub max_tokens: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<StringOrList>,
    pub repeat_penalty: Option<f64>,
    /// `false`: no speculative decoding for this request.
    pub speculative: Option<bool>,
}

impl StreamRequest {
    pub fn prompt_and_knobs(self) -> Result<(Option<String>, Prompt, Knobs), ApiError> {
        let prompt = match (self.prompt, self.messages) {
            (Some(p), None) => Prompt::Text(p),
            (None, Some(m)) => Prompt::chat(to_chat(m)?),
            (Some(_), Some(_)) => return Err(ApiError::invalid("give either prompt or messages, not both")),
            (None, None) => return Err(ApiError::invalid("prompt or messages is required")),
        };
        let knobs = Knobs {
            temperature: self.temperature,
            top_k: self.topk,
            top_p: self.topp,
            min_p: self.min_p,
            max_tokens: self.max_tokens,
            seed: self.seed,
            stop: self.stop.map(StringOrList::into_vec).unwrap_or_default(),
            repeat_penalty: self.repeat_penalty,
            speculative: self.speculative,
            default_temperature: 0.8,
            ..Default::default()
        };
        Ok((self.model, prompt, knobs))
    }
}

#[utoipa::path(post, path = "/api/stream", request_body = StreamRequest, tag = "quarrel",
    responses((status = 200, description = "SSE: `token` events then one `done` event"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn stream(State(state): State<AppState>, ApiJson(req): ApiJson<StreamRequest>) -> Result<Response, ApiError> {
    let (model, prompt, knobs) = req.prompt_and_knobs()?;
    let started = start(&state, model.as_deref(), prompt, &knobs).await?;
    let name = started.model.entry.name.clone();
    let mut s = started.stream;
    let events = async_stream::stream! {
        let t0 = std::time::Instant::now();
        let mut n = 0usize;
        while let Some(ev) = s.next().await {
            let v = match ev {
                StreamEvent::Token { id, text, .. } => {
                    n += usize::from(id.is_some());
                    Event::default().event("token").data(json!({"token": text, "token_id": id}).to_string())
                }
                StreamEvent::Done { finish_reason, usage, timings } => Event::default().event("done").data(json!({
                    "complete": true, "finish_reason": finish_str(finish_reason), "usage": usage,
                    "tokens_per_sec": timings.gen_tokens_per_sec(n), "ttft_ms": timings.ttft.as_secs_f64() * 1e3,
                    "total_ms": t0.elapsed().as_secs_f64() * 1e3,
                }).to_string()),
                StreamEvent::Error(e) => Event::default().event("error").data(serde_json::to_string(&ApiError::from(e).body()).unwrap_or_default()),
            };
            yield Ok::<_, Infallible>(v);
        }
    };
    let mut r = Sse::new(events).keep_alive(KeepAlive::default()).into_response();
    r.extensions_mut().insert(ModelLabel(name));
    Ok(r)
}

#[utoipa::path(get, path = "/api/health", tag = "quarrel", responses((status = 200, description = "status, uptime, loaded models")))]
pub async fn health(State(state): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = state
        .registry
        .loaded()
        .iter()
        .map(|m| {
            let e = m.handle.metrics();
            json!({"name": m.entry.name, "running": e.running, "queued": e.queue_depth, "embeddings": e.embeddings, "kv_blocks_used": e.kv_blocks_used, "kv_blocks_total": e.kv_blocks_total})
        })
        .collect();
    Json(json!({
        "status": if models.is_empty() { "no_model" } else { "ok" },
        "version": VERSION,
        "uptime_s": state.started.elapsed().as_secs(),
        "models": models,
    }))
}

#[utoipa::path(get, path = "/api/metrics", tag = "quarrel", responses((status = 200, description = "engine metrics per loaded model (JSON)")))]
pub async fn metrics_json(State(state): State<AppState>) -> Json<Value> {
    let models: serde_json::Map<String, Value> = state
        .registry
        .loaded()
        .iter()
        .map(|m| (m.entry.name.clone(), serde_json::to_value(m.handle.metrics()).unwrap_or_default()))
        .collect();
    Json(json!({
        "models": models,
        "http_requests_active": state.metrics.http_active.get(),
        "ws_connections_active": state.metrics.ws_active.get(),
    }))
}

/// Prometheus text exposition.
pub async fn prometheus(State(state): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render(&state.registry)).into_response()
}

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready: a model is loaded and its engine is stepping (idle, or its step counter moved
/// within the last 30 s while it had work).
pub async fn readyz(State(state): State<AppState>) -> Response {
    let loaded = state.registry.loaded();
    if loaded.is_empty() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "not_ready", "reason": "no model loaded"}))).into_response();
    }
    for m in &loaded {
        if !state.stepping(m) {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "not_ready", "reason": format!("the engine of {} is not stepping", m.entry.name)})),
            )
                .into_response();
        }
    }
    Json(json!({"status": "ready", "models": loaded.iter().map(|m| &m.entry.name).collect::<Vec<_>>()})).into_response()
}

pub async fn version() -> Json<Value> {
    Json(json!({"version": VERSION, "name": "quarrel"}))
}

pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route for {}", uri.path()))
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "invalid_request_error", "method not allowed for this route")
}
