//! The router: every route of every API in one place, and the layers around them
//! (request ids, tracing, CORS, body limit, metrics, keys and rate limits).
//!
//! Layer order, outermost first: request id (honour `x-request-id` or generate one) ->
//! trace span carrying it -> echo it back -> CORS -> metrics -> keys / rate limits -> Host,
//! content type and body checks (`shield`) -> body limit -> handler.

use crate::state::AppState;
use crate::{embeddings, middleware, ollama, openai, openapi, rerank, rest, shield, utility, ws};
use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderName, HeaderValue, Method, Request};
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::Router;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Every API route (no layers).
pub fn api_routes() -> Router<AppState> {
    Router::new()
        // OpenAI
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/rerank", post(rerank::rerank))
        .route("/v1/reranking", post(rerank::rerank))
        .route("/rerank", post(rerank::rerank))
        .route("/reranking", post(rerank::rerank))
        .route("/v1/models", get(openai::list_models))
        .route("/v1/models/{model}", get(openai::get_model))
        // ollama
        .route("/api/generate", post(ollama::generate))
        .route("/api/chat", post(ollama::chat))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings_legacy))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(rest::version))
        // Quarrel
        .route("/api/models", get(rest::models))
        .route("/api/models/{name}", get(rest::model))
        .route("/api/models/{name}/load", post(rest::load).delete(rest::unload))
        .route("/api/stream", post(rest::stream))
        .route("/api/health", get(rest::health))
        .route("/api/metrics", get(rest::metrics_json))
        .route("/ws", get(ws::upgrade))
        // llama-server's utility routes
        .route("/tokenize", post(utility::tokenize))
        .route("/detokenize", post(utility::detokenize))
        .route("/apply-template", post(utility::apply_template))
        // probes and docs
        .route("/healthz", get(rest::healthz))
        .route("/health", get(rest::healthz))
        .route("/readyz", get(rest::readyz))
        .route("/version", get(rest::version))
        .route("/metrics", get(rest::prometheus))
        .route("/openapi.json", get(openapi::document))
        // the web chat page and its assets (exact paths)
        .merge(crate::ui::router())
}

fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE, HeaderName::from_static("x-api-key"), X_REQUEST_ID])
            .expose_headers([X_REQUEST_ID, header::RETRY_AFTER])
            .max_age(std::time::Duration::from_secs(3600)),
    )
}

/// The whole application.
pub fn router(state: AppState) -> Router {
    let cfg = &state.config;
    let trace = TraceLayer::new_for_http()
        .make_span_with(|req: &Request<_>| {
            let id = req.headers().get(X_REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("");
            // the path only: query strings may carry keys
            tracing::info_span!("request", request_id = %id, method = %req.method(), path = %req.uri().path())
        })
        .on_response(DefaultOnResponse::new().level(Level::INFO));
    let mut app = api_routes()
        .fallback(rest::not_found)
        .method_not_allowed_fallback(rest::method_not_allowed)
        .layer(DefaultBodyLimit::max(cfg.max_body_bytes))
        .layer(from_fn_with_state(state.clone(), shield::check))
        .layer(from_fn_with_state(state.clone(), middleware::guard))
        .layer(from_fn_with_state(state.clone(), middleware::track));
    if let Some(c) = cors(&cfg.cors_origins) {
        app = app.layer(c);
    }
    app.layer(PropagateRequestIdLayer::new(X_REQUEST_ID))
        .layer(trace)
        .layer(SetRequestIdLayer::new(X_REQUEST_ID, MakeRequestUuid))
        .with_state(state)
}
