//! A Tinker model's training calls in `seq_id` order (docs/tinker.md): each call is answered at
//! once with a future and runs when every earlier call has its answer, through the pure ledger
//! `tandem_core::seq_order` held in the model's entry (`state::ModelEntry`). Whatever answer a
//! call gets consumes its `seq_id`: a refusal, a failure, a gap given up.

use super::routes::{bad, new_future, submitted, Result};
use super::state::{ModelEntry, Outcome, TinkerState, Waited};
use crate::error::PreviewError;
use axum::Json;
use serde_json::Value;
use std::sync::Arc;
use tandem_core::seq_order::Arrival;

/// Accepts call `seq_id` of a model and runs `work` once every earlier call has run: the
/// immediate answer, a future. A retried `seq_id` gets the first call's future.
pub(super) fn ordered(
    t: &Arc<TinkerState>,
    model: Arc<ModelEntry>,
    model_id: &str,
    seq_id: i64,
    work: impl FnOnce() -> Outcome + Send + 'static,
) -> Result<Json<Value>> {
    let work = async move {
        tokio::task::spawn_blocking(work)
            .await
            .unwrap_or_else(|e| Outcome::Failed { error: format!("the call failed: {e}"), category: "server" })
    };
    ordered_async(t, model, model_id, seq_id, work)
}

/// [`ordered`] for work that awaits (the store, the blob store).
///
/// Whatever answer a call gets consumes its `seq_id` (`tandem_core::seq_order`): a call refused
/// for its input is [`refused_in_order`], a call that waited its time at a gap fails, and either
/// way the calls after it run.
pub(super) fn ordered_async(
    t: &Arc<TinkerState>,
    model: Arc<ModelEntry>,
    model_id: &str,
    seq_id: i64,
    work: impl std::future::Future<Output = Outcome> + Send + 'static,
) -> Result<Json<Value>> {
    let (request_id, promise) = {
        let mut order = model.order();
        match order.peek(seq_id) {
            Arrival::Retry(id) => return Ok(submitted(&id, model_id)),
            Arrival::OutOfRange => {
                return Err(PreviewError(bad(format!(
                    "seq_id {seq_id} of model {model_id} was already run or is out of range"
                ))))
            }
            Arrival::GivenUp => {
                // Answered at once: a later call gave up waiting for it, and the order has moved on.
                let (id, promise) = new_future(t, &model.entity)?;
                promise.set(Outcome::Failed {
                    error: format!(
                        "seq_id {seq_id} of model {model_id} came after a later call had waited {} s for it; it was not run",
                        t.waits.seq_gap.as_secs_f64()
                    ),
                    category: "user",
                });
                return Ok(submitted(&id, model_id));
            }
            Arrival::New => {}
        }
        let (id, promise) = new_future(t, &model.entity)?;
        order.arrive(seq_id, &id);
        (id, promise)
    };
    model.bump();
    let seq = seq_id as u64;
    let limit = t.waits.seq_gap;
    tokio::spawn(async move {
        match model.wait_turn(seq, limit).await {
            Waited::Run => {}
            Waited::GaveUp(at) => {
                promise.set(Outcome::Failed {
                    error: format!(
                        "seq_id {seq} waited {} s for seq_id {at} of its model, which never came; the calls after it run",
                        limit.as_secs_f64()
                    ),
                    category: "user",
                });
                return;
            }
            Waited::Answered => return,
            Waited::Released => {
                promise.set(Outcome::Failed {
                    error: "the model was released (its session ended) before this call's turn".into(),
                    category: "user",
                });
                return;
            }
        }
        // The order moves on whatever happens to the work, a panic included.
        let _finish = Finish(model, seq);
        promise.set(work.await);
    });
    Ok(submitted(&request_id, model_id))
}

/// Finishes a call's turn when dropped.
struct Finish(Arc<ModelEntry>, u64);

impl Drop for Finish {
    fn drop(&mut self) {
        self.0.finish(self.1);
    }
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

/// Answers call `seq_id` with the caller's mistake at once (a future that fails) and takes it
/// into its model's order as answered: a refused call still consumes its `seq_id`, so the calls
/// after it run (issue 50), and it waits for nothing, since nothing of it runs.
pub(super) fn refused_in_order(
    t: &Arc<TinkerState>,
    model: Arc<ModelEntry>,
    model_id: &str,
    seq_id: i64,
    error: String,
) -> Result<Json<Value>> {
    let request_id = {
        let mut order = model.order();
        let arrival = order.peek(seq_id);
        match &arrival {
            Arrival::Retry(id) => return Ok(submitted(id, model_id)),
            Arrival::OutOfRange => {
                return Err(PreviewError(bad(format!(
                    "seq_id {seq_id} of model {model_id} was already run or is out of range"
                ))))
            }
            Arrival::GivenUp | Arrival::New => {}
        }
        let (id, promise) = new_future(t, &model.entity)?;
        promise.set(Outcome::Failed { error, category: "user" });
        if arrival == Arrival::New {
            order.arrive(seq_id, &id);
            order.finish(seq_id as u64);
        }
        id
    };
    model.bump();
    Ok(submitted(&request_id, model_id))
}
