//! Embeddings: `POST /v1/embeddings` (float or base64) and the shared path the ollama
//! embedding routes use: the model's pooling (mean / last / cls, from its metadata),
//! L2-normalized, computed by the engine's embedding API.

use crate::error::{ApiError, ApiJson};
use crate::openai::labeled;
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use quarrel_engine::{Pooling, Prompt};
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

/// `POST /v1/embeddings` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: PromptListIn,
    /// "float" (default) or "base64" (little-endian f32).
    pub encoding_format: Option<String>,
    /// Matryoshka truncation: the first this many values of each vector, normalized again.
    pub dimensions: Option<usize>,
}

/// Prompt inputs: text(s) or token id list(s) (`/v1/embeddings` takes a list,
/// `/v1/completions` exactly one).
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

    /// The one prompt of a request that takes exactly one.
    pub fn into_prompt(self) -> Result<Prompt, ApiError> {
        let mut prompts = self.into_prompts();
        match prompts.len() {
            1 => Ok(prompts.remove(0)),
            _ => Err(ApiError::invalid("exactly one prompt per request is supported")),
        }
    }
}

/// Embeddings of `inputs` with the model's pooling, L2-normalized (`dimensions`: truncated to
/// that many and normalized again); also the token count.
pub async fn embed(
    state: &AppState,
    model: Option<&str>,
    inputs: Vec<Prompt>,
    dimensions: Option<usize>,
) -> Result<(String, Vec<Vec<f32>>, usize), ApiError> {
    if inputs.is_empty() {
        return Err(ApiError::invalid("input must not be empty"));
    }
    if inputs.len() > 2048 {
        return Err(ApiError::invalid("at most 2048 inputs per request"));
    }
    for p in &inputs {
        crate::gen::check_prompt(state, p)?;
    }
    let t0 = std::time::Instant::now();
    let n_inputs = inputs.len();
    let m = state.registry.get(model).await?;
    // tokenizing large inputs is CPU work: off the async threads
    let handle = m.handle.clone();
    let ids = tokio::task::spawn_blocking(move || handle.tokenize_inputs(&inputs))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))??;
    let n_tokens = ids.iter().map(Vec::len).sum::<usize>();
    let pooling = m.info().pooling;
    if pooling == Pooling::Rank {
        return Err(ApiError::invalid(format!("model {} is a reranking model: use /v1/rerank", m.entry.name)));
    }
    let mut e = m.handle.embed_tokens(ids, pooling, true, Some(state.config.request_timeout)).await?;
    if let Some(d) = dimensions {
        e = e.truncated(d, true)?;
    }
    let v = e.to_vecs();
    let name = m.entry.name.as_str();
    state.metrics.tokens_in.with_label_values(&[name]).inc_by(n_tokens as u64);
    state.metrics.embed_texts.with_label_values(&[name, "embeddings"]).inc_by(n_inputs as u64);
    state.metrics.embed_seconds.with_label_values(&[name, "embeddings"]).observe(t0.elapsed().as_secs_f64());
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
    let (model, vecs, n_tokens) = embed(&state, req.model.as_deref(), req.input.into_prompts(), req.dimensions).await?;
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
