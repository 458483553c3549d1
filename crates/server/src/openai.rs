//! OpenAI-compatible API: `POST /v1/chat/completions`, `POST /v1/completions` (SSE `data:`
//! chunks ending in `[DONE]` when `stream` is set), `POST /v1/embeddings` (float or base64,
//! the model's pooling, L2-normalized) and `GET /v1/models`.

use crate::error::{ApiError, ApiJson};
use crate::gen::{finish_str, start, unix_now, Collected, Knobs, Tracked};
use crate::metrics::ModelLabel;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use quarrel_engine::{Prompt, StreamEvent, TokenLogprob};
use quarrel_tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use utoipa::ToSchema;

/// A string or a list of strings (`stop`).
#[derive(Deserialize, ToSchema, Debug, Clone)]
#[serde(untagged)]
pub enum StringOrList {
    One(String),
    Many(Vec<String>),
}

impl StringOrList {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StringOrList::One(s) => vec![s],
            StringOrList::Many(v) => v,
        }
    }
}

/// Message content: text, or a list of parts of which only `text` parts are supported.
#[derive(Deserialize, ToSchema, Debug, Clone)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    #[schema(value_type = Vec<Object>)]
    Parts(Vec<Value>),
}

#[derive(Deserialize, ToSchema, Debug, Clone)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

pub fn to_chat(msgs: Vec<ChatMessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    msgs.into_iter()
        .map(|m| {
            let text = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => {
                    let mut s = String::new();
                    for p in parts {
                        match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                            (Some("text"), Some(t)) => s.push_str(t),
                            (t, _) => return Err(ApiError::invalid(format!("unsupported content part type {t:?}: only text is supported"))),
                        }
                    }
                    s
                }
            };
            if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool" | "developer") {
                return Err(ApiError::invalid(format!("unknown message role {:?}", m.role)));
            }
            let role = if m.role == "developer" { "system".to_string() } else { m.role };
            Ok(ChatMessage::new(role, text))
        })
        .collect()
}

#[derive(Deserialize, ToSchema, Debug, Default, Clone)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/chat/completions` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Extension: top-k (0 = off).
    pub top_k: Option<i64>,
    /// Extension: min-p.
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StringOrList>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub n: Option<u32>,
}

/// `POST /v1/completions` prompt: text, or token ids.
#[derive(Deserialize, ToSchema, Debug)]
#[serde(untagged)]
pub enum PromptIn {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl PromptIn {
    fn into_prompt(self) -> Result<Prompt, ApiError> {
        match self {
            PromptIn::Text(s) => Ok(Prompt::Text(s)),
            PromptIn::Tokens(t) => Ok(Prompt::Tokens(t)),
            PromptIn::Texts(mut v) if v.len() == 1 => Ok(Prompt::Text(v.remove(0))),
            PromptIn::TokenLists(mut v) if v.len() == 1 => Ok(Prompt::Tokens(v.remove(0))),
            _ => Err(ApiError::invalid("exactly one prompt per request is supported")),
        }
    }
}

/// `POST /v1/completions` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptIn,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StringOrList>,
    /// Number of most likely alternatives to report per token (0..=20).
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub echo: bool,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub n: Option<u32>,
}

fn check_n(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::invalid(format!("n = {n} is not supported: ask for one choice per request"))),
    }
}

fn labeled(mut r: Response, model: &str) -> Response {
    r.extensions_mut().insert(ModelLabel(model.to_string()));
    r
}

fn sse_json(v: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(v.to_string()))
}

fn usage_json(c: &quarrel_engine::Usage) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
    })
}

fn chat_logprob(lp: &TokenLogprob) -> Value {
    json!({
        "token": lp.text,
        "logprob": lp.logprob,
        "bytes": lp.text.as_bytes(),
        "top_logprobs": lp.top.iter().map(|(_, t, l)| json!({"token": t, "logprob": l, "bytes": t.as_bytes()})).collect::<Vec<_>>(),
    })
}

fn completion_logprobs(lps: &[TokenLogprob], offset0: usize) -> Value {
    let mut offs = vec![];
    let mut o = offset0;
    for lp in lps {
        offs.push(o);
        o += lp.text.len();
    }
    json!({
        "tokens": lps.iter().map(|l| &l.text).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|l| l.top.iter().map(|(_, t, p)| (t.clone(), json!(p))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": offs,
    })
}

fn request_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

#[utoipa::path(post, path = "/v1/chat/completions", request_body = ChatRequest, tag = "openai",
    responses((status = 200, description = "chat.completion, or SSE chat.completion.chunk events"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn chat_completions(State(state): State<AppState>, ApiJson(req): ApiJson<ChatRequest>) -> Result<Response, ApiError> {
    check_n(req.n)?;
    let knobs = Knobs {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        seed: req.seed,
        stop: req.stop.map(StringOrList::into_vec).unwrap_or_default(),
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        logprobs: req.logprobs.then_some(req.top_logprobs.unwrap_or(0)),
        default_temperature: 1.0,
        ..Default::default()
    };
    let msgs = to_chat(req.messages)?;
    let started = start(&state, req.model.as_deref(), Prompt::Chat(msgs), &knobs).await?;
    let model = started.model.entry.name.clone();
    let id = request_id("chatcmpl");
    let created = unix_now();
    if !req.stream {
        let c = started.stream.collect().await?;
        let logprobs = req.logprobs.then(|| json!({"content": c.logprobs.iter().map(chat_logprob).collect::<Vec<_>>()}));
        let body = json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text}, "logprobs": logprobs,
                         "finish_reason": c.finish.map(finish_str)}],
            "usage": usage_json(&c.usage),
            "system_fingerprint": "quarrel",
        });
        return Ok(labeled(Json(body).into_response(), &model));
    }
    let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
    let want_lp = req.logprobs;
    let mut s: Tracked = started.stream;
    let m2 = model.clone();
    let events = async_stream::stream! {
        let chunk = |delta: Value, lp: Value, finish: Value| json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": m2,
            "system_fingerprint": "quarrel",
            "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}],
        });
        yield sse_json(&chunk(json!({"role": "assistant", "content": ""}), Value::Null, Value::Null));
        while let Some(ev) = s.next().await {
            match ev {
                StreamEvent::Token { text, logprob, .. } => {
                    let lp = match (&logprob, want_lp) {
                        (Some(l), true) => json!({"content": [chat_logprob(l)]}),
                        _ => Value::Null,
                    };
                    if !text.is_empty() || !lp.is_null() {
                        yield sse_json(&chunk(json!({"content": text}), lp, Value::Null));
                    }
                }
                StreamEvent::Done { finish_reason, usage, .. } => {
                    yield sse_json(&chunk(json!({}), Value::Null, json!(finish_str(finish_reason))));
                    if include_usage {
                        yield sse_json(&json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": m2,
                            "choices": [], "usage": usage_json(&usage)}));
                    }
                }
                StreamEvent::Error(e) => {
                    yield sse_json(&serde_json::to_value(ApiError::from(e).body()).unwrap_or_default());
                }
            }
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    Ok(labeled(Sse::new(events).keep_alive(KeepAlive::default()).into_response(), &model))
}

#[utoipa::path(post, path = "/v1/completions", request_body = CompletionRequest, tag = "openai",
    responses((status = 200, description = "text_completion, or SSE events"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn completions(State(state): State<AppState>, ApiJson(req): ApiJson<CompletionRequest>) -> Result<Response, ApiError> {
    check_n(req.n)?;
    let knobs = Knobs {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        max_tokens: Some(req.max_tokens.unwrap_or(16)),
        seed: req.seed,
        stop: req.stop.map(StringOrList::into_vec).unwrap_or_default(),
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        logprobs: req.logprobs,
        default_temperature: 1.0,
        ..Default::default()
    };
    let prompt = req.prompt.into_prompt()?;
    let echo_text = match (&prompt, req.echo) {
        (Prompt::Text(t), true) => t.clone(),
        (_, true) => return Err(ApiError::invalid("echo is supported for text prompts only")),
        _ => String::new(),
    };
    let started = start(&state, req.model.as_deref(), prompt, &knobs).await?;
    let model = started.model.entry.name.clone();
    let id = request_id("cmpl");
    let created = unix_now();
    if !req.stream {
        let c: Collected = started.stream.collect().await?;
        let lp = req.logprobs.map(|_| completion_logprobs(&c.logprobs, echo_text.len()));
        let body = json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": format!("{echo_text}{}", c.text), "logprobs": lp, "finish_reason": c.finish.map(finish_str)}],
            "usage": usage_json(&c.usage),
            "system_fingerprint": "quarrel",
        });
        return Ok(labeled(Json(body).into_response(), &model));
    }
    let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
    let want_lp = req.logprobs.is_some();
    let mut s = started.stream;
    let m2 = model.clone();
    let events = async_stream::stream! {
        let chunk = |text: &str, lp: Value, finish: Value| json!({
            "id": id, "object": "text_completion", "created": created, "model": m2,
            "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}],
        });
        if !echo_text.is_empty() {
            yield sse_json(&chunk(&echo_text, Value::Null, Value::Null));
        }
        while let Some(ev) = s.next().await {
            match ev {
                StreamEvent::Token { text, logprob, .. } => {
                    let lp = match (&logprob, want_lp) {
                        (Some(l), true) => completion_logprobs(std::slice::from_ref(l), 0),
                        _ => Value::Null,
                    };
                    if !text.is_empty() || !lp.is_null() {
                        yield sse_json(&chunk(&text, lp, Value::Null));
                    }
                }
                StreamEvent::Done { finish_reason, usage, .. } => {
                    let mut last = chunk("", Value::Null, json!(finish_str(finish_reason)));
                    if include_usage {
                        last["usage"] = usage_json(&usage);
                    }
                    yield sse_json(&last);
                }
                StreamEvent::Error(e) => {
                    yield sse_json(&serde_json::to_value(ApiError::from(e).body()).unwrap_or_default());
                }
            }
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    Ok(labeled(Sse::new(events).keep_alive(KeepAlive::default()).into_response(), &model))
}

/// `POST /v1/embeddings` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: PromptListIn,
    /// "float" (default) or "base64" (little-endian f32).
    pub encoding_format: Option<String>,
    pub dimensions: Option<usize>,
}

/// Embedding inputs: text(s) or token id list(s).
#[derive(Deserialize, ToSchema, Debug)]
#[serde(untagged)]
pub enum PromptListIn {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl PromptListIn {
    pub fn into_prompts(self) -> Vec<Prompt> {
        match self {
            PromptListIn::Text(s) => vec![Prompt::Text(s)],
            PromptListIn::Texts(v) => v.into_iter().map(Prompt::Text).collect(),
            PromptListIn::Tokens(t) => vec![Prompt::Tokens(t)],
            PromptListIn::TokenLists(v) => v.into_iter().map(Prompt::Tokens).collect(),
        }
    }
}

/// Embeddings of `inputs` with the model's pooling, L2-normalized; also the token count.
pub async fn embed(state: &AppState, model: Option<&str>, inputs: Vec<Prompt>) -> Result<(String, Vec<Vec<f32>>, usize), ApiError> {
    if inputs.is_empty() {
        return Err(ApiError::invalid("input must not be empty"));
    }
    if inputs.len() > 2048 {
        return Err(ApiError::invalid("at most 2048 inputs per request"));
    }
    for p in &inputs {
        crate::gen::check_prompt(state, p)?;
    }
    let m = state.registry.get(model).await?;
    let mut n_tokens = 0;
    for p in &inputs {
        n_tokens += m.handle.tokenize_prompt(p)?.len();
    }
    let pooling = m.info().pooling;
    let v = m.handle.embed(inputs, pooling, true).await?;
    state.metrics.tokens_in.with_label_values(&[&m.entry.name]).inc_by(n_tokens as u64);
    Ok((m.entry.name.clone(), v, n_tokens))
}

#[utoipa::path(post, path = "/v1/embeddings", request_body = EmbeddingRequest, tag = "openai",
    responses((status = 200, description = "list of embeddings"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn embeddings(State(state): State<AppState>, ApiJson(req): ApiJson<EmbeddingRequest>) -> Result<Response, ApiError> {
    let b64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => return Err(ApiError::invalid(format!("encoding_format must be float or base64, got {f:?}"))),
    };
    let (model, vecs, n_tokens) = embed(&state, req.model.as_deref(), req.input.into_prompts()).await?;
    if let Some(d) = req.dimensions {
        if vecs.first().is_some_and(|v| d != v.len()) {
            return Err(ApiError::invalid(format!("this model's embeddings have {} dimensions, not {d}", vecs[0].len())));
        }
    }
    let data: Vec<Value> = vecs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let emb = if b64 {
                use base64::Engine as _;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": emb})
        })
        .collect();
    let body = json!({"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}});
    Ok(labeled(Json(body).into_response(), &model))
}

fn model_obj(name: &str, created: u64) -> Value {
    json!({"id": name, "object": "model", "created": created, "owned_by": "quarrel"})
}

#[utoipa::path(get, path = "/v1/models", tag = "openai", responses((status = 200, description = "models that can be used")))]
pub async fn list_models(State(state): State<AppState>) -> Json<Value> {
    let mut names: Vec<String> = state.registry.loaded().iter().map(|m| m.entry.name.clone()).collect();
    for e in state.registry.catalog() {
        if !names.contains(&e.name) {
            names.push(e.name);
        }
    }
    let created = unix_now();
    Json(json!({"object": "list", "data": names.iter().map(|n| model_obj(n, created)).collect::<Vec<_>>()}))
}

#[utoipa::path(get, path = "/v1/models/{model}", tag = "openai", params(("model" = String, Path)),
    responses((status = 200, description = "one model"), (status = 404, body = crate::error::ErrorBody)))]
pub async fn get_model(State(state): State<AppState>, Path(model): Path<String>) -> Result<Json<Value>, ApiError> {
    let e = state.registry.find_entry(&model).ok_or_else(|| ApiError::model_not_found(&model))?;
    Ok(Json(model_obj(&e.name, unix_now())))
}
