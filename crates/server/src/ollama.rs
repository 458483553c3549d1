//! ollama-compatible API: `POST /api/generate`, `POST /api/chat` (NDJSON streaming by
//! default, one JSON object with `"stream": false`), `POST /api/embed` (and the older
//! `/api/embeddings`), `GET /api/tags`, `POST /api/show`, `GET /api/ps`.
//! `/api/generate` also takes Quarrel's flat `temperature`, `topk`, `topp`, `max_tokens`.

use crate::error::{ApiError, ApiJson};
use crate::gen::{start, Knobs, Tracked};
use crate::metrics::ModelLabel;
use crate::openai::{to_chat, ChatMessageIn, StringOrList};
use crate::registry::Loaded;
use crate::state::AppState;
use crate::structured::ollama_format;
use crate::tools::{ChatPlan, ParsedCall, Piece, ToolRequest};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use quarrel_engine::{FinishReason, Prompt, StreamEvent};
use quarrel_tokenizer::{ChatMessage, ChatOptions};
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::time::{Duration, Instant, SystemTime};
use utoipa::ToSchema;

/// ollama's `options` (unknown keys are ignored, as ollama does).
#[derive(Deserialize, ToSchema, Debug, Default, Clone)]
pub struct Options {
    pub temperature: Option<f64>,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    /// -1: until the context is full.
    pub num_predict: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<StringOrList>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub num_ctx: Option<i64>,
    /// Quarrel's extension: `false` turns speculative decoding off for this request.
    pub speculative: Option<bool>,
}

impl Options {
    fn knobs(self) -> Result<Knobs, ApiError> {
        let max_tokens = match self.num_predict {
            None | Some(-1) | Some(-2) => None,
            Some(n) if n < 0 => return Err(ApiError::invalid(format!("num_predict must be >= -2, got {n}"))),
            Some(n) => Some(n),
        };
        Ok(Knobs {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            max_tokens,
            seed: self.seed,
            stop: self.stop.map(StringOrList::into_vec).unwrap_or_default(),
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logprobs: None,
            default_temperature: 0.8,
            speculative: self.speculative,
            ..Default::default()
        })
    }
}

fn default_true() -> bool {
    true
}

/// `POST /api/generate` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct GenerateRequest {
    pub model: String,
    /// Absent: just load the model (ollama behaviour).
    pub prompt: Option<String>,
    pub system: Option<String>,
    /// Send the prompt as is, without the chat template.
    #[serde(default)]
    pub raw: bool,
    #[serde(default = "default_true")]
    pub stream: bool,
    #[serde(default)]
    pub options: Options,
    pub format: Option<Value>,
    pub images: Option<Vec<String>>,
    pub keep_alive: Option<Value>,
    // Quarrel's flat fields
    pub temperature: Option<f64>,
    pub topk: Option<i64>,
    pub topp: Option<f64>,
    pub max_tokens: Option<i64>,
}

/// `POST /api/chat` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct ChatRequest {
    pub model: String,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessageIn>>,
    #[serde(default = "default_true")]
    pub stream: bool,
    #[serde(default)]
    pub options: Options,
    pub format: Option<Value>,
    /// Functions the model may call (OpenAI's `tools` shape).
    #[schema(value_type = Vec<Object>)]
    pub tools: Option<Vec<Value>>,
    /// `false` turns a reasoning model's thinking off (where its template supports it);
    /// the reasoning comes back as `message.thinking`.
    pub think: Option<bool>,
    pub keep_alive: Option<Value>,
}

/// RFC 3339 UTC time with nanoseconds, as ollama writes `created_at`.
pub fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

fn ndjson(lines: impl futures_util::Stream<Item = Value> + Send + 'static, model: &str) -> Response {
    use futures_util::StreamExt;
    let body = Body::from_stream(lines.map(|v| Ok::<_, Infallible>(Bytes::from(format!("{v}\n")))));
    let mut r = ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    r.extensions_mut().insert(ModelLabel(model.to_string()));
    r
}

fn labeled(v: Value, model: &str) -> Response {
    let mut r = Json(v).into_response();
    r.extensions_mut().insert(ModelLabel(model.to_string()));
    r
}

fn done_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Cancelled => "cancelled",
    }
}

/// ollama's `tool_calls` entries (arguments as an object).
fn ollama_calls(calls: &[ParsedCall]) -> Vec<Value> {
    calls.iter().map(|c| json!({"function": {"name": c.name, "arguments": c.arguments}})).collect()
}

/// A chat line's message from split output.
fn chat_message(content: &str, thinking: &str, calls: &[ParsedCall]) -> Value {
    let mut m = json!({"role": "assistant", "content": content});
    if !thinking.is_empty() {
        m["thinking"] = json!(thinking);
    }
    if !calls.is_empty() {
        m["tool_calls"] = json!(ollama_calls(calls));
    }
    m
}

/// Drive a generation to NDJSON lines (or one object); `chat` picks the message shape and
/// `plan` how the output splits into content, thinking and tool calls.
async fn respond(mut s: Tracked, model: String, stream: bool, chat: bool, plan: ChatPlan, t0: Instant) -> Result<Response, ApiError> {
    let line = move |model: &str, message: Value| {
        let mut v = json!({"model": model, "created_at": rfc3339(SystemTime::now()), "done": false});
        if chat {
            v["message"] = message;
        } else {
            v["response"] = message["content"].clone();
        }
        v
    };
    let last = move |mut v: Value, ev: (FinishReason, quarrel_engine::Usage, quarrel_engine::RequestTimings)| {
        let (f, u, t) = ev;
        v["done"] = json!(true);
        v["done_reason"] = json!(done_reason(f));
        v["total_duration"] = json!(ns(t0.elapsed()));
        v["load_duration"] = json!(0);
        v["prompt_eval_count"] = json!(u.prompt_tokens);
        v["prompt_eval_duration"] = json!(ns(t.prompt));
        v["eval_count"] = json!(u.completion_tokens);
        v["eval_duration"] = json!(ns(t.gen));
        v
    };
    if !stream {
        let c = s.collect().await?;
        let f = c.finish.unwrap_or(FinishReason::Stop);
        let r = plan.reply(&c.text);
        let v = line(&model, chat_message(&r.content, &r.reasoning, &r.calls));
        return Ok(labeled(last(v, (f, c.usage, c.timings)), &model));
    }
    let m2 = model.clone();
    let mut splitter = plan.splitter();
    let lines = async_stream::stream! {
        while let Some(ev) = s.next().await {
            match ev {
                StreamEvent::Token { text, .. } => {
                    for p in splitter.push(&text) {
                        match p {
                            Piece::Content(t) => yield line(&m2, chat_message(&t, "", &[])),
                            Piece::Reasoning(t) => yield line(&m2, chat_message("", &t, &[])),
                        }
                    }
                }
                StreamEvent::Done { finish_reason, usage, timings } => {
                    let out = std::mem::replace(&mut splitter, plan.splitter()).finish();
                    for p in out.tail {
                        match p {
                            Piece::Content(t) => yield line(&m2, chat_message(&t, "", &[])),
                            Piece::Reasoning(t) => yield line(&m2, chat_message("", &t, &[])),
                        }
                    }
                    if !out.calls.is_empty() {
                        yield line(&m2, chat_message("", "", &out.calls));
                    }
                    yield last(line(&m2, chat_message("", "", &[])), (finish_reason, usage, timings));
                }
                StreamEvent::Error(e) => yield serde_json::to_value(ApiError::from(e).body()).unwrap_or_default(),
            }
        }
    };
    Ok(ndjson(lines, &model))
}

#[utoipa::path(post, path = "/api/generate", request_body = GenerateRequest, tag = "ollama",
    responses((status = 200, description = "NDJSON lines, or one JSON object with stream=false"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn generate(State(state): State<AppState>, ApiJson(req): ApiJson<GenerateRequest>) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    if req.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::invalid("images are not supported by this server"));
    }
    let constraint = ollama_format(req.format.as_ref())?;
    let Some(prompt) = req.prompt else {
        // ollama: a request without a prompt loads the model
        let m = state.registry.get(Some(&req.model)).await?;
        let v =
            json!({"model": m.entry.name, "created_at": rfc3339(SystemTime::now()), "response": "", "done": true, "done_reason": "load"});
        return Ok(labeled(v, &m.entry.name));
    };
    let mut knobs = req.options.knobs()?;
    knobs.temperature = req.temperature.or(knobs.temperature);
    knobs.top_k = req.topk.or(knobs.top_k);
    knobs.top_p = req.topp.or(knobs.top_p);
    knobs.max_tokens = req.max_tokens.or(knobs.max_tokens);
    knobs.constraint = constraint;
    let prompt = if req.raw {
        Prompt::Text(prompt)
    } else {
        let mut m = vec![];
        if let Some(s) = req.system.filter(|s| !s.is_empty()) {
            m.push(ChatMessage::new("system", s));
        }
        if prompt.trim().is_empty() {
            return Err(ApiError::invalid("the prompt is empty"));
        }
        m.push(ChatMessage::new("user", prompt));
        Prompt::chat(m)
    };
    let started = start(&state, Some(&req.model), prompt, &knobs).await?;
    let model = started.model.entry.name.clone();
    respond(started.stream, model, req.stream, false, started.plan, t0).await
}

#[utoipa::path(post, path = "/api/chat", request_body = ChatRequest, tag = "ollama",
    responses((status = 200, description = "NDJSON lines, or one JSON object with stream=false"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn chat(State(state): State<AppState>, ApiJson(req): ApiJson<ChatRequest>) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let constraint = ollama_format(req.format.as_ref())?;
    let msgs = req.messages.unwrap_or_default();
    if msgs.is_empty() {
        // ollama: a chat without messages loads the model
        let m = state.registry.get(Some(&req.model)).await?;
        let v = json!({"model": m.entry.name, "created_at": rfc3339(SystemTime::now()), "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "load"});
        return Ok(labeled(v, &m.entry.name));
    }
    let mut knobs = req.options.knobs()?;
    knobs.constraint = constraint;
    knobs.tools = ToolRequest::read(req.tools, None, None)?;
    let mut options = ChatOptions::default();
    if let Some(think) = req.think {
        options.kwargs.insert("enable_thinking".into(), json!(think));
    }
    let started = start(&state, Some(&req.model), Prompt::Chat { messages: to_chat(msgs)?, options }, &knobs).await?;
    let model = started.model.entry.name.clone();
    respond(started.stream, model, req.stream, true, started.plan, t0).await
}

/// `POST /api/embed` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct EmbedRequest {
    pub model: String,
    pub input: StringOrList,
    pub truncate: Option<bool>,
    /// Matryoshka truncation: the first this many values of each vector, normalized again.
    pub dimensions: Option<usize>,
    pub options: Option<Value>,
    pub keep_alive: Option<Value>,
}

#[utoipa::path(post, path = "/api/embed", request_body = EmbedRequest, tag = "ollama",
    responses((status = 200, description = "embeddings (the model's pooling, L2-normalized)"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn embed(State(state): State<AppState>, ApiJson(req): ApiJson<EmbedRequest>) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let inputs = req.input.into_vec().into_iter().map(Prompt::Text).collect();
    let (model, vecs, n) = crate::embeddings::embed(&state, Some(&req.model), inputs, req.dimensions).await?;
    let v = json!({"model": model, "embeddings": vecs, "total_duration": ns(t0.elapsed()), "load_duration": 0, "prompt_eval_count": n});
    Ok(labeled(v, &model))
}

/// `POST /api/embeddings` (older ollama) body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub prompt: String,
}

pub async fn embeddings_legacy(State(state): State<AppState>, ApiJson(req): ApiJson<EmbeddingsRequest>) -> Result<Response, ApiError> {
    let (model, mut vecs, _) = crate::embeddings::embed(&state, Some(&req.model), vec![Prompt::Text(req.prompt)], None).await?;
    Ok(labeled(json!({"embedding": vecs.pop().unwrap_or_default()}), &model))
}

fn details(m: Option<&Loaded>) -> Value {
    match m {
        Some(m) => {
            let i = m.info();
            json!({"parent_model": "", "format": "gguf", "family": i.arch, "families": [i.arch],
                   "parameter_size": format!("{:.0}M", i.n_params as f64 / 1e6), "quantization_level": i.file_type})
        }
        None => json!({"parent_model": "", "format": "gguf"}),
    }
}

fn modified(path: &std::path::Path) -> String {
    rfc3339(std::fs::metadata(path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH))
}

#[utoipa::path(get, path = "/api/tags", tag = "ollama", responses((status = 200, description = "models that can be used")))]
pub async fn tags(State(state): State<AppState>) -> Json<Value> {
    let loaded = state.registry.loaded();
    let models: Vec<Value> = state
        .registry
        .catalog()
        .iter()
        .map(|e| {
            let m = loaded.iter().find(|m| m.entry.name == e.name);
            let name = format!("{}:latest", e.name);
            json!({"name": name, "model": name, "modified_at": modified(&e.path), "size": e.size_bytes, "details": details(m.map(|m| &**m))})
        })
        .collect();
    Json(json!({"models": models}))
}

/// `POST /api/show` body (`model`, or the older `name`).
#[derive(Deserialize, ToSchema, Debug)]
pub struct ShowRequest {
    pub model: Option<String>,
    pub name: Option<String>,
    #[serde(default)]
    pub verbose: bool,
}

#[utoipa::path(post, path = "/api/show", request_body = ShowRequest, tag = "ollama",
    responses((status = 200, description = "model details"), (status = 404, body = crate::error::ErrorBody)))]
pub async fn show(State(state): State<AppState>, ApiJson(req): ApiJson<ShowRequest>) -> Result<Response, ApiError> {
    let name = req.model.or(req.name).ok_or_else(|| ApiError::invalid("model is required"))?;
    let m = state.registry.get(Some(&name)).await?;
    let i = m.info();
    let info = json!({
        "general.architecture": i.arch, "general.name": i.name, "general.parameter_count": i.n_params, "general.file_type": i.file_type,
        format!("{}.context_length", i.arch): i.n_ctx_train, format!("{}.embedding_length", i.arch): i.n_embd,
        format!("{}.block_count", i.arch): i.n_layer, format!("{}.attention.head_count", i.arch): i.n_head,
        format!("{}.attention.head_count_kv", i.arch): i.n_kv_head, "tokenizer.ggml.vocab_size": i.n_vocab,
    });
    let v = json!({
        "modelfile": format!("FROM {}\n", m.entry.name),
        "parameters": format!("num_ctx {}", i.n_ctx),
        "template": i.chat_template.clone().unwrap_or_default(),
        "details": details(Some(&m)),
        "model_info": info,
        "modified_at": modified(&m.entry.path),
        "capabilities": ["completion", "embedding"],
    });
    Ok(labeled(v, &m.entry.name))
}

#[utoipa::path(get, path = "/api/ps", tag = "ollama", responses((status = 200, description = "loaded models")))]
pub async fn ps(State(state): State<AppState>) -> Json<Value> {
    let far = SystemTime::now() + Duration::from_secs(365 * 86400);
    let models: Vec<Value> = state
        .registry
        .loaded()
        .iter()
        .map(|m| {
            let name = format!("{}:latest", m.entry.name);
            json!({"name": name, "model": name, "size": m.memory_bytes(), "size_vram": 0, "details": details(Some(m)),
                   "expires_at": rfc3339(far), "context_length": m.info().n_ctx})
        })
        .collect();
    Json(json!({"models": models}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.000000005Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(&rfc3339(leap)[..10], "2000-02-29");
    }
}
