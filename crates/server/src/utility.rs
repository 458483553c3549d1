//! llama-server's utility routes: `POST /tokenize` (text -> ids, optionally with each
//! token's piece), `POST /detokenize` (ids -> text), `POST /apply-template` (chat messages
//! -> the prompt the model's template renders, generation prompt included). Each takes an
//! optional `model` (default: the default model).

use crate::error::{ApiError, ApiJson};
use crate::openai::{to_chat, ChatMessageIn};
use crate::state::AppState;
use crate::tools::{plan, ToolRequest};
use axum::extract::State;
use axum::Json;
use quarrel_tokenizer::ChatOptions;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

/// Whether `path` is one of these routes: they are API routes (keys, rate limits, JSON
/// content type) though outside `/v1/` and `/api/`.
pub fn is_utility_path(path: &str) -> bool {
    matches!(path, "/tokenize" | "/detokenize" | "/apply-template")
}

/// `POST /tokenize` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub content: String,
    /// Add BOS / EOS as the model's metadata says (default false, as llama-server).
    #[serde(default)]
    pub add_special: bool,
    /// Parse control-token texts such as `<|im_start|>` into those tokens (default true).
    pub parse_special: Option<bool>,
    /// Answer `{"id", "piece"}` objects instead of bare ids.
    #[serde(default)]
    pub with_pieces: bool,
}

/// `POST /detokenize` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// `POST /apply-template` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct ApplyTemplateRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    /// Rendered as a chat completion with these tools would render them.
    #[schema(value_type = Vec<Object>)]
    pub tools: Option<Vec<Value>>,
    #[schema(value_type = Object)]
    pub tool_choice: Option<Value>,
    #[schema(value_type = Object)]
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

#[utoipa::path(post, path = "/tokenize", request_body = TokenizeRequest, tag = "llama-server",
    responses((status = 200, description = "{\"tokens\": [...]}"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn tokenize(State(state): State<AppState>, ApiJson(req): ApiJson<TokenizeRequest>) -> Result<Json<Value>, ApiError> {
    if req.content.len() > state.config.max_prompt_bytes {
        return Err(ApiError::invalid(format!("content is {} bytes; the limit is {}", req.content.len(), state.config.max_prompt_bytes)));
    }
    let m = state.registry.get(req.model.as_deref()).await?;
    let tok = m.handle.tokenizer().clone();
    let ids = tokio::task::spawn_blocking(move || {
        let ids = tok.encode(&req.content, req.add_special, req.parse_special.unwrap_or(true));
        if !req.with_pieces {
            return json!(ids);
        }
        let pieces: Vec<Value> = ids
            .iter()
            .map(|&id| {
                let bytes = tok.token_to_piece(id, true);
                match String::from_utf8(bytes) {
                    Ok(s) => json!({"id": id, "piece": s}),
                    // a piece that is part of a character: its bytes, as llama-server sends them
                    Err(e) => json!({"id": id, "piece": e.into_bytes()}),
                }
            })
            .collect();
        json!(pieces)
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))?;
    Ok(Json(json!({"tokens": ids})))
}

#[utoipa::path(post, path = "/detokenize", request_body = DetokenizeRequest, tag = "llama-server",
    responses((status = 200, description = "{\"content\": \"...\"}"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn detokenize(State(state): State<AppState>, ApiJson(req): ApiJson<DetokenizeRequest>) -> Result<Json<Value>, ApiError> {
    let m = state.registry.get(req.model.as_deref()).await?;
    let tok = m.handle.tokenizer();
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= tok.n_vocab()) {
        return Err(ApiError::invalid(format!("token id {bad} is outside the vocabulary of {}", tok.n_vocab())));
    }
    Ok(Json(json!({"content": tok.decode(&req.tokens)})))
}

#[utoipa::path(post, path = "/apply-template", request_body = ApplyTemplateRequest, tag = "llama-server",
    responses((status = 200, description = "{\"prompt\": \"...\"}"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn apply_template(State(state): State<AppState>, ApiJson(req): ApiJson<ApplyTemplateRequest>) -> Result<Json<Value>, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty"));
    }
    let mut msgs = to_chat(req.messages)?;
    let tools = ToolRequest::read(req.tools, req.tool_choice.as_ref(), None)?;
    let mut options = ChatOptions { tools: None, kwargs: req.chat_template_kwargs.unwrap_or_default() };
    let m = state.registry.get(req.model.as_deref()).await?;
    let tok = m.handle.tokenizer();
    plan(tok, tools.as_ref(), &mut msgs, &mut options, &mut None)?;
    let (prompt, _) = tok.render_chat(&msgs, true, &options).map_err(|e| ApiError::invalid(format!("chat template: {e}")))?;
    Ok(Json(json!({"prompt": prompt})))
}
