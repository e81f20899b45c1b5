//! How the Tinker routes answer: FastAPI's error shapes as the SDK reads them (one map of
//! `TinkerError` kinds to statuses and future categories), the typed JSON body, and a training
//! call's immediate answer (its future).

use crate::error::{ApiError, ErrorKind, PreviewError};
use axum::Json;
use serde_json::{json, Value};
use tandem_core::tinker::{RunId, TinkerError};

/// Errors in FastAPI's `{"detail": ...}` shape, as the SDK reads them.
pub(super) type Result<T> = std::result::Result<T, PreviewError>;

/// A 422 in FastAPI's shape, `{"detail": [{"loc": ["body"], "msg": ..., ...}]}` (a
/// validation error with no field would render an empty `detail`).
pub(super) fn bad(message: impl Into<String>) -> ApiError {
    let msg = format!("Value error, {}", message.into());
    ApiError::field(vec![tandem_core::validate::Loc::from("body")], "value_error", msg, Value::Null)
}

/// A Tinker route's JSON body decoded into `T`: a body that is not JSON (a validation error at
/// its offset) or does not decode (FastAPI's 422 naming the problem) is refused in the SDK's
/// error shape, never axum's plain-text rejection.
pub struct TinkerJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for TinkerJson<T> {
    type Rejection = PreviewError;

    async fn from_request(req: axum::extract::Request, _state: &S) -> Result<Self> {
        let value = crate::body::read_json(req).await?;
        let body = serde_json::from_value(value).map_err(|e| bad(format!("the body does not decode: {e}")))?;
        Ok(TinkerJson(body))
    }
}

pub(super) fn submitted(request_id: &str, model_id: &str) -> Json<Value> {
    Json(json!({ "request_id": request_id, "model_id": model_id }))
}

/// `asample`'s immediate answer: the future and one sequence id per sample.
pub(super) fn submitted_samples(request_id: &str, ids: &[String]) -> Json<Value> {
    Json(json!({ "request_id": request_id, "sample_sequence_ids": ids }))
}

/// A Tinker error as the API's, the one status map: the caller's mistake a 422 (FastAPI's
/// validation shape), what is not the caller's or not there a 404, a share already held a 429
/// and a store that did not answer a 503 (both with `Retry-After`, which the SDK honours), the
/// rest a 500.
pub(super) fn tinker_error(e: TinkerError) -> ApiError {
    match e {
        TinkerError::User(m) => bad(m),
        TinkerError::NotFound(m) => ApiError::new(ErrorKind::NotFound, m),
        TinkerError::Busy(m) => ApiError::new(ErrorKind::TooManyRequests, m).with_retry_after(1),
        TinkerError::Unavailable(m) => ApiError::new(ErrorKind::Unavailable, m).with_retry_after(2),
        TinkerError::Server(m) => ApiError::new(ErrorKind::Internal, m),
    }
}

/// `{session}:train:{seq}` of a `create_model` or `load_weights` body.
pub(super) fn run_id(session_id: &str, seq: i64) -> Result<RunId> {
    u64::try_from(seq).ok().and_then(|seq| RunId::new(session_id, seq)).ok_or_else(|| {
        PreviewError(bad(format!(
            "model_seq_id {seq} of session {session_id:?}: expected a session and a number from 0"
        )))
    })
}
