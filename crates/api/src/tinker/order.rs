//! Training calls into their model's `seq_id` order (`tandem_tinker::registry`): the service
//! accepts, refuses or runs each; these wrappers answer its future as the SDK reads it.

use super::answer::{bad, submitted, tinker_error, Result};
use super::TinkerState;
use crate::error::PreviewError;
use axum::Json;
use serde_json::Value;
use std::sync::Arc;
use tandem_tinker::registry::{ModelEntry, Outcome};

/// Accepts call `seq_id` of a model to run `work` on a blocking thread in its turn
/// ([`tandem_tinker::Registry::accept_blocking`]): the immediate answer, a future.
pub(super) fn ordered(
    t: &TinkerState,
    model: Arc<ModelEntry>,
    model_id: &str,
    seq_id: i64,
    work: impl FnOnce() -> Outcome + Send + 'static,
) -> Result<Json<Value>> {
    let accepted = t.accept_blocking(model, seq_id, work).map_err(tinker_error)?;
    Ok(submitted(&accepted.request_id, model_id))
}

/// [`ordered`] for work that awaits (the store, the blob store).
pub(super) fn ordered_async(
    t: &TinkerState,
    model: Arc<ModelEntry>,
    model_id: &str,
    seq_id: i64,
    work: impl std::future::Future<Output = Outcome> + Send + 'static,
) -> Result<Json<Value>> {
    let accepted = t.accept(model, seq_id, work).map_err(tinker_error)?;
    Ok(submitted(&accepted.request_id, model_id))
}

/// Answers call `seq_id` with the caller's mistake, in order: it consumes its `seq_id`
/// ([`tandem_tinker::Registry::refuse`]).
pub(super) fn refused_in_order(
    t: &TinkerState,
    model: Arc<ModelEntry>,
    model_id: &str,
    seq_id: i64,
    error: String,
) -> Result<Json<Value>> {
    let accepted = t.refuse(model, seq_id, error).map_err(tinker_error)?;
    Ok(submitted(&accepted.request_id, model_id))
}

/// A training call's JSON body: its model and `seq_id` read first, then the rest, so that a body
/// whose rest does not decode is refused in order ([`refused_in_order`]) and not before its
/// `seq_id` is known (the SDK has spent it).
pub(super) struct Sequenced<T> {
    pub model_id: String,
    pub seq_id: i64,
    pub body: std::result::Result<T, String>,
}

impl<T: serde::de::DeserializeOwned> Sequenced<T> {
    pub(super) fn read(raw: Value) -> Result<Self> {
        let model_id = raw.get("model_id").and_then(Value::as_str).map(str::to_string);
        let seq_id = raw.get("seq_id").and_then(Value::as_i64);
        let (Some(model_id), Some(seq_id)) = (model_id, seq_id) else {
            return Err(PreviewError(bad("a training call needs model_id (a string) and seq_id (an integer)")));
        };
        let body = serde_json::from_value(raw).map_err(|e| format!("the body does not decode: {e}"));
        Ok(Sequenced { model_id, seq_id, body })
    }
}
