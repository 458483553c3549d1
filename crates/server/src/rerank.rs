//! Reranking: `POST /v1/rerank` (also `/rerank`, `/v1/reranking`, `/reranking`), the request
//! and response shape of llama-server, Jina and Cohere: a query, documents, and the documents'
//! relevance scores from a cross-encoder (a model with a classification head, llama.cpp's
//! rank pooling), best first, cut to `top_n`. A body with `texts` instead of `documents` is
//! answered in Hugging Face TEI's shape (a bare list of `{index, score, text?}`).
//!
//! ```text
//!  query, documents ─► [CLS] query [SEP] document (per document) ─► engine, rank pooling
//!                   ─► one score each ─► sorted, top_n
//! ```

use crate::error::{ApiError, ApiJson};
use crate::openai::labeled;
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use quarrel_engine::Pooling;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

/// A document: its text, or an object with a `text` field (Cohere's structured documents).
#[derive(Deserialize, ToSchema, Debug, Clone)]
#[serde(untagged)]
pub enum DocumentIn {
    Text(String),
    Object { text: String },
}

impl DocumentIn {
    fn text(&self) -> &str {
        match self {
            DocumentIn::Text(t) | DocumentIn::Object { text: t } => t,
        }
    }
}

/// `POST /v1/rerank` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct RerankRequest {
    pub model: Option<String>,
    pub query: String,
    /// The documents to score (Jina, Cohere, llama-server).
    pub documents: Option<Vec<DocumentIn>>,
    /// The documents, TEI's name for them: the answer then takes TEI's shape.
    pub texts: Option<Vec<String>>,
    /// Best documents to return (default: all).
    pub top_n: Option<usize>,
    /// Include each document's text in its result (Jina, Cohere: `return_documents`; TEI:
    /// `return_text`).
    #[serde(default)]
    pub return_documents: bool,
    #[serde(default)]
    pub return_text: bool,
}

/// At most this many documents per request (the embeddings routes' input limit).
const MAX_DOCUMENTS: usize = 2048;

#[utoipa::path(post, path = "/v1/rerank", request_body = RerankRequest, tag = "openai",
    responses((status = 200, description = "documents with their relevance scores, best first"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn rerank(State(state): State<AppState>, ApiJson(req): ApiJson<RerankRequest>) -> Result<Response, ApiError> {
    let tei = req.texts.is_some() && req.documents.is_none();
    let docs: Vec<String> = match (req.documents, req.texts) {
        (Some(d), _) => d.iter().map(|d| d.text().to_string()).collect(),
        (None, Some(t)) => t,
        (None, None) => return Err(ApiError::invalid("documents must be given")),
    };
    if docs.is_empty() {
        return Err(ApiError::invalid("documents must not be empty"));
    }
    if docs.len() > MAX_DOCUMENTS {
        return Err(ApiError::invalid(format!("at most {MAX_DOCUMENTS} documents per request")));
    }
    if req.query.is_empty() {
        return Err(ApiError::invalid("query must not be empty"));
    }
    let t0 = std::time::Instant::now();
    let m = state.registry.get(req.model.as_deref()).await?;
    if m.info().n_classes == 0 {
        return Err(ApiError::invalid(format!(
            "model {} is not a reranking model (it has no classification head); load a cross-encoder such as a bge-reranker",
            m.entry.name
        )));
    }
    let (handle, query, texts) = (m.handle.clone(), req.query, docs.clone());
    let ids = tokio::task::spawn_blocking(move || handle.rerank_inputs(&query, &texts))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))??;
    let n_tokens = ids.iter().map(Vec::len).sum::<usize>();
    let scores = m.handle.embed_tokens(ids, Pooling::Rank, false, Some(state.config.request_timeout)).await?;
    let name = m.entry.name.as_str();
    state.metrics.tokens_in.with_label_values(&[name]).inc_by(n_tokens as u64);
    state.metrics.embed_texts.with_label_values(&[name, "rerank"]).inc_by(docs.len() as u64);
    state.metrics.embed_seconds.with_label_values(&[name, "rerank"]).observe(t0.elapsed().as_secs_f64());
    let mut ranked: Vec<(usize, f32)> = scores.rows().map(|r| r.first().copied().unwrap_or(f32::NAN)).enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(req.top_n.unwrap_or(usize::MAX));
    let with_text = req.return_documents || req.return_text;
    if tei {
        let list: Vec<Value> = ranked
            .iter()
            .map(|&(i, s)| if with_text { json!({"index": i, "score": s, "text": docs[i]}) } else { json!({"index": i, "score": s}) })
            .collect();
        return Ok(labeled(Json(json!(list)).into_response(), &m.entry.name));
    }
    let results: Vec<Value> = ranked
        .iter()
        .map(|&(i, s)| {
            if with_text {
                json!({"index": i, "relevance_score": s, "document": {"text": docs[i]}})
            } else {
                json!({"index": i, "relevance_score": s})
            }
        })
        .collect();
    let body = json!({"model": m.entry.name, "object": "list", "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results});
    Ok(labeled(Json(body).into_response(), &m.entry.name))
}
