//! One error shape for every API: `{"error": {"code", "message", "type"}}` with the right HTTP
//! status (and `Retry-After` where waiting helps), plus the JSON body extractor that turns
//! malformed, mistyped, invalid-UTF-8 or oversized bodies into such errors.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use quarrel_engine::ServiceError;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// An API error: status, machine-readable code, human message, OpenAI-style type.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub kind: &'static str,
    /// Seconds, sent as `Retry-After`.
    pub retry_after: Option<u64>,
}

/// The error body, as serialized.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), kind, retry_after: None }
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", "invalid_request_error", message)
    }

    pub fn model_not_found(name: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "model_not_found", "invalid_request_error", format!("model {name:?} not found"))
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "invalid_request_error", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "authentication_error", message)
    }

    pub fn rate_limited(retry_after: u64) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            "rate_limit_error",
            format!("rate limit exceeded: retry in {retry_after} s"),
        );
        e.retry_after = Some(retry_after);
        e
    }

    pub fn overloaded(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", "server_error", message);
        e.retry_after = Some(1);
        e
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "inference_error", "server_error", message)
    }

    /// The WebSocket protocol's code for this error.
    pub fn ws_code(&self) -> &'static str {
        match (self.status, self.code) {
            (_, "model_not_found") => "MODEL_NOT_FOUND",
            (StatusCode::UNAUTHORIZED, _) => "UNAUTHORIZED",
            (StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS, _) => "OVERLOADED",
            (s, _) if s.is_client_error() => "INVALID_REQUEST",
            _ => "INFERENCE_ERROR",
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody { error: ErrorDetail { code: self.code.into(), message: self.message.clone(), kind: self.kind.into() } }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        let msg = e.to_string();
        match e {
            ServiceError::Overloaded { .. } => ApiError::overloaded(msg),
            ServiceError::InvalidRequest(_) => ApiError::invalid(msg),
            ServiceError::PromptTooLong { .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, "context_length_exceeded", "invalid_request_error", msg)
            }
            ServiceError::Timeout => ApiError::new(StatusCode::GATEWAY_TIMEOUT, "timeout", "server_error", msg),
            ServiceError::Inference(_) => ApiError::internal(msg),
            ServiceError::ShutDown => ApiError::overloaded(msg),
        }
    }
}

/// Marks a response as an error of this kind, for the metrics middleware.
#[derive(Clone, Copy, Debug)]
pub struct ErrorKind(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r.extensions_mut().insert(ErrorKind(self.code));
        r
    }
}

/// A JSON body: any content type, UTF-8 checked, size-limited by `DefaultBodyLimit`; every
/// failure becomes an [`ApiError`] (400 malformed / mistyped, 413 too large).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", "invalid_request_error", e.body_text())
            } else {
                ApiError::invalid(format!("reading the body: {}", e.body_text()))
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parse a JSON document with messages a client can act on.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::invalid("the request body is empty; expected a JSON object"));
    }
    if std::str::from_utf8(bytes).is_err() {
        return Err(ApiError::invalid("the request body is not valid UTF-8"));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => ApiError::invalid(format!("invalid field: {e}")),
            _ => ApiError::invalid(format!("malformed JSON: {e}")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct T {
        #[allow(dead_code)]
        a: u32,
    }

    #[test]
    fn json_errors_are_classified() {
        assert!(parse_json::<T>(b"{\"a\": 1}").is_ok());
        assert!(parse_json::<T>(b"{\"a\": ").unwrap_err().message.starts_with("malformed JSON"));
        assert!(parse_json::<T>(b"{\"a\": \"x\"}").unwrap_err().message.starts_with("invalid field"));
        assert!(parse_json::<T>(b"{\"a\": \"\xff\"}").unwrap_err().message.contains("UTF-8"));
        assert!(parse_json::<T>(b"  ").unwrap_err().message.contains("empty"));
    }

    #[test]
    fn service_errors_map_to_statuses() {
        let e: ApiError = ServiceError::Overloaded { queued: 3 }.into();
        assert_eq!((e.status, e.retry_after, e.ws_code()), (StatusCode::SERVICE_UNAVAILABLE, Some(1), "OVERLOADED"));
        let e: ApiError = ServiceError::PromptTooLong { prompt: 9, ctx: 8 }.into();
        assert_eq!((e.status, e.code, e.ws_code()), (StatusCode::BAD_REQUEST, "context_length_exceeded", "INVALID_REQUEST"));
        assert_eq!(ApiError::model_not_found("x").ws_code(), "MODEL_NOT_FOUND");
    }
}
