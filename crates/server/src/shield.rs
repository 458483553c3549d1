//! Defences against hostile clients and web pages, in front of every route:
//!
//! - `Host` check (403): on a loopback server only loopback names and addresses (and
//!   `--allowed-hosts`) are accepted, so a web page that rebinds its own DNS name to 127.0.0.1
//!   cannot read or drive the server.
//! - JSON content type (415) on `POST` API routes: a `text/plain` or form body is what a page
//!   may send cross-origin without a CORS preflight; requiring `application/json` makes the
//!   browser ask first, and the CORS policy then says no.
//! - Bodies: a declared `Content-Length` over the limit is refused (413) before any byte is
//!   read, and a body not complete within the body timeout gets 408; both close the connection
//!   (the rest of the body is not worth reading).

use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use std::net::IpAddr;

/// The host part of a `Host` header value (no port, no IPv6 brackets), lower-cased.
fn host_name(v: &str) -> String {
    let v = v.trim();
    let h = if let Some(rest) = v.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else if v.matches(':').count() == 1 {
        v.split(':').next().unwrap_or("")
    } else {
        v
    };
    h.trim_end_matches('.').to_ascii_lowercase()
}

/// Is `host` (a `Host` header value) a loopback name or address, or one of `allowed`?
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let h = host_name(host);
    h == "localhost"
        || h.ends_with(".localhost")
        || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        || allowed.iter().any(|a| a == "*" || host_name(a) == h)
}

/// Is this a JSON media type (`application/json`, `application/x-ndjson`, `application/*+json`,
/// with any parameters)?
pub fn is_json(content_type: &str) -> bool {
    let mt = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    mt == "application/json" || (mt.starts_with("application/") && mt.ends_with("+json"))
}

fn closing(mut r: Response) -> Response {
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Oversized bodies up to this multiple of the limit (and at most [`DRAIN_CAP`] bytes) are read
/// and dropped after the 413, so that the client can read the answer.
const DRAIN_FACTOR: u64 = 4;
const DRAIN_CAP: u64 = 64 << 20;

fn too_large(limit: usize) -> Response {
    let e = ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        "invalid_request_error",
        format!("the request body is larger than the limit of {limit} bytes"),
    );
    closing(e.into_response())
}

/// The checks above, in that order.
pub async fn check(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let cfg = &state.config;
    if cfg.check_host {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| req.uri().host().map(str::to_string));
        if let Some(h) = host.filter(|h| !host_allowed(h, &cfg.allowed_hosts)) {
            let e = ApiError::new(
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                "invalid_request_error",
                format!("Host {h:?} is not allowed on this loopback server (use localhost or 127.0.0.1, or start it with --allowed-hosts)"),
            );
            return e.into_response();
        }
    }
    let path = req.uri().path();
    if req.method() == Method::POST && (path.starts_with("/v1/") || path.starts_with("/api/") || crate::utility::is_utility_path(path)) {
        let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !is_json(ct) {
            let e = ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "invalid_request_error",
                format!("expected Content-Type: application/json, got {:?}", if ct.is_empty() { "none" } else { ct }),
            );
            return e.into_response();
        }
    }
    if req.method() == Method::GET || req.method() == Method::HEAD || req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    let limit = cfg.max_body_bytes;
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limit as u64) {
        // A client that sends its whole body before reading the answer (most HTTP libraries)
        // sees a reset instead of the 413 if the connection closes under it: read and drop a
        // moderately oversized body in the background, within the body timeout. Declared
        // sizes far past the limit are refused without reading a byte.
        if n <= (limit as u64).saturating_mul(DRAIN_FACTOR).min(DRAIN_CAP) {
            let body = req.into_body();
            let deadline = cfg.body_timeout;
            tokio::spawn(async move {
                let mut data = body.into_data_stream();
                let _ = tokio::time::timeout(deadline, async { while let Some(Ok(_)) = data.next().await {} }).await;
            });
        }
        return too_large(limit);
    }
    let (parts, body) = req.into_parts();
    let read = async move {
        let mut data = body.into_data_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = data.next().await {
            let chunk = chunk.map_err(|e| ApiError::invalid(format!("reading the body: {e}")).into_response())?;
            if buf.len() + chunk.len() > limit {
                return Err(too_large(limit));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    };
    let bytes = match tokio::time::timeout(cfg.body_timeout, read).await {
        Err(_) => {
            let e = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "invalid_request_error",
                format!("the request body did not arrive within {} s", cfg.body_timeout.as_secs_f64()),
            );
            return closing(e.into_response());
        }
        Ok(Err(r)) => return r,
        Ok(Ok(b)) => b,
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        for h in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "app.localhost:1",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]:8080",
            "[::1]",
            "127.1.2.3",
        ] {
            assert!(host_allowed(h, &[]), "{h}");
        }
        for h in ["evil.test", "evil.test:8080", "localhost.evil.test", "10.0.0.1:80", "[::2]:8080", ""] {
            assert!(!host_allowed(h, &[]), "{h}");
        }
        assert!(host_allowed("box.lan:8080", &["box.lan".into()]));
    }

    #[test]
    fn json_types() {
        for t in ["application/json", "application/json; charset=utf-8", "Application/JSON", "application/vnd.x+json"] {
            assert!(is_json(t), "{t}");
        }
        for t in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "text/json"] {
            assert!(!is_json(t), "{t}");
        }
    }
}
