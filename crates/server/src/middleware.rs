//! Request middleware: API keys and rate limits (per key, or per client IP where the server
//! has no keys; and per client IP) in front of the
//! APIs, and the metrics layer (requests by route/model/status, errors, in-flight requests
//! and durations measured to the end of the response body, streams included).

use crate::auth::presented_key;
use crate::conn::ClientAddr;
use crate::error::{ApiError, ErrorKind};
use crate::metrics::ModelLabel;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use std::time::Instant;

/// Paths anyone may read (probes, scrapes, docs). `/ws` checks its key itself so that a
/// browser, which cannot read a refused handshake, gets an `UNAUTHORIZED` message.
pub fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/health" | "/readyz" | "/version" | "/api/version" | "/metrics" | "/openapi.json" | "/ws")
        || !(path.starts_with("/v1/") || path.starts_with("/api/") || crate::utility::is_utility_path(path))
}

pub fn client_ip(req: &Request) -> String {
    req.extensions().get::<ConnectInfo<ClientAddr>>().map(|c| c.0 .0.ip().to_string()).unwrap_or_else(|| "unknown".into())
}

/// Keys and rate limits.
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() == Method::OPTIONS || is_public(req.uri().path()) {
        return next.run(req).await;
    }
    let ip = client_ip(&req);
    if let Err(wait) = AppState::check_rate(&state.ip_limiter, &ip) {
        return ApiError::rate_limited(wait).into_response();
    }
    if let Some(keys) = &state.keys {
        let key = presented_key(req.headers());
        match keys.verify(key.as_deref()) {
            Ok(id) => {
                if let Err(wait) = AppState::check_rate(&state.key_limiter, &id) {
                    return ApiError::rate_limited(wait).into_response();
                }
            }
            Err(r) => return ApiError::unauthorized(r.message()).into_response(),
        }
    } else if let Err(wait) = AppState::check_rate(&state.key_limiter, &ip) {
        // no keys to count by: the per-key limit counts per client IP instead
        return ApiError::rate_limited(wait).into_response();
    }
    next.run(req).await
}

/// Decrements the in-flight gauge and records the duration when the body is done.
struct Inflight {
    state: AppState,
    route: String,
    t0: Instant,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.state.metrics.http_active.dec();
        self.state.metrics.request_seconds.with_label_values(&[&self.route]).observe(self.t0.elapsed().as_secs_f64());
    }
}

/// Metrics for every request.
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_else(|| "unmatched".into());
    state.metrics.http_active.inc();
    let g = Inflight { state: state.clone(), route: route.clone(), t0: Instant::now() };
    let resp = next.run(req).await;
    let model = resp.extensions().get::<ModelLabel>().map(|m| m.0.clone()).unwrap_or_default();
    let status = resp.status();
    state.metrics.requests.with_label_values(&[&route, &model, status.as_str()]).inc();
    if let Some(k) = resp.extensions().get::<ErrorKind>() {
        state.metrics.errors.with_label_values(&[k.0]).inc();
    }
    if route == "/ws" {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let body = Body::from_stream(body.into_data_stream().map(move |chunk| {
        let _keep = &g;
        chunk
    }));
    Response::from_parts(parts, body)
}
