//! The one place where failures become HTTP responses.
//!
//! Handlers build an [`ApiError`] (a kind, a human message, and for validation the field errors);
//! the area decides only the body's shape: the preview area answers in FastAPI's shape
//! (`{"detail": ...}`, 422 for validation), the OpenAI-compatible area in vLLM's
//! (`{"error": {...}}`, 400 for validation). Status codes come from [`ApiError::status`] alone.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tandem_core::validate::{FieldError, Loc};
use tandem_store::StoreError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Validation,
    Unauthorized,
    Forbidden,
    NotFound,
    Conflict,
    PayloadTooLarge,
    TooManyRequests,
    Unavailable,
    /// The disk is full (507): nothing was written; the same call succeeds once space returns.
    InsufficientStorage,
    Internal,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault (OpenAI shape's `param`).
    pub param: Option<String>,
    pub fields: Vec<FieldError>,
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError { kind, message: message.into(), param: None, fields: Vec::new(), retry_after_secs: None }
    }

    pub fn validation(fields: Vec<FieldError>) -> Self {
        let message = fields.first().map(|f| f.msg.clone()).unwrap_or_default();
        ApiError { fields, ..ApiError::new(ErrorKind::Validation, message) }
    }

    /// A single field error at `loc`.
    pub fn field(loc: Vec<Loc>, kind: &str, msg: impl Into<String>, input: Value) -> Self {
        ApiError::validation(vec![FieldError::new(loc, kind, msg, input)])
    }

    /// A 400-class problem with one named field, for the OpenAI-compatible area.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..ApiError::new(ErrorKind::Validation, message) }
    }

    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// Unknown ids and other entities' ids produce exactly this, byte for byte.
    pub fn not_found(what: &str) -> Self {
        ApiError::new(ErrorKind::NotFound, format!("{what} not found"))
    }

    pub fn status(&self) -> StatusCode {
        match self.kind {
            ErrorKind::Validation => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Headers every area sends for this kind.
    fn decorate(&self, response: &mut Response) {
        let headers = response.headers_mut();
        match self.kind {
            ErrorKind::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            // The OpenAI SDK (and so ART's client) retries 409s unless told not to.
            ErrorKind::Conflict => {
                headers.insert("x-should-retry", HeaderValue::from_static("false"));
            }
            _ => {}
        }
        if let Some(secs) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
    }

    /// The preview area's body: FastAPI's `{"detail": ...}`.
    pub fn into_preview_response(self) -> Response {
        let body = match self.kind {
            ErrorKind::Validation => json!({ "detail": self.fields }),
            _ => json!({ "detail": self.message }),
        };
        let mut response = (self.status(), axum::Json(body)).into_response();
        self.decorate(&mut response);
        response
    }
}

impl ApiError {
    /// The OpenAI/vLLM body: `{"error": {message, type, param, code}}`; validation is a 400.
    pub fn into_openai_response(self) -> Response {
        let status = match self.kind {
            ErrorKind::Validation => StatusCode::BAD_REQUEST,
            _ => self.status(),
        };
        let kind = match self.kind {
            ErrorKind::Validation => "BadRequestError",
            ErrorKind::Unauthorized => "AuthenticationError",
            ErrorKind::Forbidden => "PermissionDeniedError",
            ErrorKind::NotFound => "NotFoundError",
            ErrorKind::Conflict => "ConflictError",
            ErrorKind::PayloadTooLarge => "RequestTooLargeError",
            ErrorKind::TooManyRequests => "RateLimitError",
            ErrorKind::Unavailable => "ServiceUnavailableError",
            ErrorKind::InsufficientStorage => "InsufficientStorageError",
            ErrorKind::Internal => "InternalServerError",
        };
        let mut message = self.message.clone();
        if self.kind == ErrorKind::Validation && !self.fields.is_empty() {
            let parts: Vec<String> = self
                .fields
                .iter()
                .take(10)
                .map(|f| {
                    let loc: Vec<String> = f
                        .loc
                        .iter()
                        .map(|l| match l {
                            Loc::Key(k) => k.clone(),
                            Loc::Index(i) => i.to_string(),
                        })
                        .collect();
                    format!("{}: {}", loc.join("."), f.msg)
                })
                .collect();
            message = format!(
                "{} validation error{}: {}",
                self.fields.len(),
                if self.fields.len() == 1 { "" } else { "s" },
                parts.join("; ")
            );
        }
        let param = self.param.clone().or_else(|| {
            self.fields.first().map(|f| {
                f.loc
                    .iter()
                    .skip(1)
                    .map(|l| match l {
                        Loc::Key(k) => k.clone(),
                        Loc::Index(i) => i.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(".")
            })
        });
        let body = json!({ "error": { "message": message, "type": kind, "param": param, "code": status.as_u16() } });
        let mut response = (status, axum::Json(body)).into_response();
        self.decorate(&mut response);
        response
    }
}

impl ApiError {
    /// Anthropic's body: `{"type": "error", "error": {"type", "message"}}`; validation is a 400.
    /// A validation error names its field in the message (Anthropic's shape has no `param`).
    pub fn into_anthropic_response(self) -> Response {
        let status = match self.kind {
            ErrorKind::Validation => StatusCode::BAD_REQUEST,
            _ => self.status(),
        };
        let kind = match self.kind {
            ErrorKind::Validation | ErrorKind::Conflict => "invalid_request_error",
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::Forbidden => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::PayloadTooLarge => "request_too_large",
            ErrorKind::TooManyRequests => "rate_limit_error",
            ErrorKind::Unavailable => "overloaded_error",
            ErrorKind::InsufficientStorage | ErrorKind::Internal => "api_error",
        };
        let message = match (&self.param, self.fields.first()) {
            (Some(p), _) if !self.message.contains(p.as_str()) => format!("{p}: {}", self.message),
            (None, Some(f)) => {
                let loc: Vec<String> = f
                    .loc
                    .iter()
                    .skip(1)
                    .map(|l| match l {
                        Loc::Key(k) => k.clone(),
                        Loc::Index(i) => i.to_string(),
                    })
                    .collect();
                format!("{}: {}", loc.join("."), f.msg)
            }
            _ => self.message.clone(),
        };
        let body = json!({ "type": "error", "error": { "type": kind, "message": message } });
        let mut response = (status, axum::Json(body)).into_response();
        self.decorate(&mut response);
        response
    }
}

/// An [`ApiError`] rendered in Anthropic's shape (`/v1/messages`).
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl<E: Into<ApiError>> From<E> for AnthropicError {
    fn from(e: E) -> Self {
        AnthropicError(e.into())
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.into_anthropic_response()
    }
}

/// An [`ApiError`] rendered in the OpenAI-compatible area's shape.
#[derive(Debug)]
pub struct OpenAiError(pub ApiError);

impl<E: Into<ApiError>> From<E> for OpenAiError {
    fn from(e: E) -> Self {
        OpenAiError(e.into())
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        self.0.into_openai_response()
    }
}

/// `Retry-After` of a store that did not answer: about the pool's acquire timeout, so a client
/// that waits it finds the outage over or gets its next 503 as quickly.
pub const STORE_RETRY_AFTER_SECS: u64 = 2;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::new(ErrorKind::NotFound, "Not Found"),
            StoreError::Conflict(msg) => ApiError::new(ErrorKind::Conflict, msg),
            StoreError::InvalidCursor => ApiError::field(
                vec![Loc::from("query"), Loc::from("after")],
                "value_error",
                "Value error, no item of this list has that id",
                Value::Null,
            ),
            // What failed is logged; the client learns which store, not where it is.
            StoreError::Unavailable(ref why) => {
                tracing::warn!(error = %why, "store unavailable");
                let what = e.failed_store().unwrap_or("the store");
                ApiError::new(ErrorKind::Unavailable, format!("{what} is unavailable; retry shortly"))
                    .with_retry_after(STORE_RETRY_AFTER_SECS)
            }
            StoreError::Full(why) => {
                tracing::error!(error = %why, "out of disk space");
                ApiError::new(ErrorKind::InsufficientStorage, "the server is out of disk space; nothing was written")
                    .with_retry_after(STORE_RETRY_AFTER_SECS)
            }
            // An entity's own numbers only: nothing of other entities or of the disk.
            StoreError::OverQuota(over) => ApiError::new(ErrorKind::Forbidden, over.to_string()),
            other => {
                tracing::error!(error = %other, "store error");
                ApiError::new(ErrorKind::Internal, "internal server error")
            }
        }
    }
}

/// An [`ApiError`] rendered in the preview area's shape.
#[derive(Debug)]
pub struct PreviewError(pub ApiError);

impl<E: Into<ApiError>> From<E> for PreviewError {
    fn from(e: E) -> Self {
        PreviewError(e.into())
    }
}

impl IntoResponse for PreviewError {
    fn into_response(self) -> Response {
        self.0.into_preview_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_headers() {
        let r = ApiError::new(ErrorKind::Unauthorized, "x").into_preview_response();
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        let r = ApiError::new(ErrorKind::Conflict, "dup").into_preview_response();
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()["x-should-retry"], "false");
        let mut e = ApiError::new(ErrorKind::Unavailable, "full");
        e.retry_after_secs = Some(2);
        assert_eq!(e.into_preview_response().headers()["retry-after"], "2");
        assert_eq!(ApiError::from(StoreError::InvalidCursor).status(), 422);
        assert_eq!(ApiError::from(StoreError::Database("x".into())).status(), 500);
        let down = ApiError::from(StoreError::Unavailable("no database connection".into()));
        assert_eq!(down.status(), 503);
        assert_eq!(down.message, "the database is unavailable; retry shortly");
        let r = down.into_openai_response();
        assert_eq!((r.status().as_u16(), &r.headers()["retry-after"]), (503, &HeaderValue::from_static("2")));
        let blobs = ApiError::from(StoreError::Unavailable("blob store: connection refused".into()));
        assert_eq!(blobs.message, "the blob store is unavailable; retry shortly");
        let over = tandem_store::OverQuota { used_bytes: 3 << 20, quota_bytes: 4 << 20, needed_bytes: 2 << 20 };
        let over = ApiError::from(StoreError::OverQuota(over));
        assert_eq!(over.status(), 403, "not retried by the OpenAI SDK, unlike 429 and 5xx");
        assert!(
            over.message.contains("stores 3.0 MiB of its 4.0 MiB quota and this needs 2.0 MiB"),
            "{}",
            over.message
        );
        assert_eq!(over.retry_after_secs, None);
        let full = ApiError::from(StoreError::Full("No space left on device (os error 28)".into()));
        let r = full.into_anthropic_response();
        assert_eq!(r.status(), 507);
    }
}
