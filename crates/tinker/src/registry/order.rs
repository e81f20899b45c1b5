//! A model's training calls in `seq_id` order (docs/tinker.md): each call is answered at once
//! with a future and runs when every earlier call has its answer, through the pure ledger
//! `tandem_core::seq_order` held in the model's entry. Whatever answer a call gets consumes its
//! `seq_id`: a refusal, a failure, a gap given up.

use super::{ModelEntry, Outcome, Registry};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_core::seq_order::{Arrival, SeqOrder, Turn};
use tandem_core::tinker::TinkerError;

/// How a call's wait for its turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Every earlier call has its answer: run it.
    Run,
    /// It waited its time at a gap: `seq_id` `.0` (the first missing) never came. It is
    /// answered (failed) already in the order; its promise is the caller's to fail.
    GaveUp(u64),
    /// It was answered while it waited (it cannot be, but it must not run twice).
    Answered,
    /// Its model was released (its session ended) while it waited.
    Released,
}

/// A call taken into its model's order: the future that answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub request_id: String,
}

impl ModelEntry {
    /// The order, locked (a poisoned lock still holds a consistent ledger: every change is one
    /// call).
    pub(crate) fn order(&self) -> std::sync::MutexGuard<'_, SeqOrder> {
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the calls waiting for their turn.
    pub(crate) fn bump(&self) {
        self.moved.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Call `seq` has its answer: the order moves on.
    pub(crate) fn finish(&self, seq: u64) {
        self.order().finish(seq);
        self.bump();
    }

    /// Its session ended: waiting calls fail at once and drop their data.
    pub(crate) fn release(&self) {
        self.released.store(true, std::sync::atomic::Ordering::Release);
        self.bump();
    }

    /// Waits until every call before `seq` has its answer. Only a gap (a `seq_id` before it not
    /// received) is timed: after `limit` of one the missing calls are given up and this one
    /// fails; calls behind received work wait as long as that work runs (bounded by its size).
    pub async fn wait_turn(&self, seq: u64, limit: Duration) -> Waited {
        let mut moved = self.moved.subscribe();
        let mut gap_since: Option<Instant> = None;
        loop {
            // Marked seen before the look, so that a change after it is not missed.
            moved.borrow_and_update();
            if self.released.load(std::sync::atomic::Ordering::Acquire) {
                return Waited::Released;
            }
            let turn = self.order().turn(seq);
            match turn {
                Turn::Now => return Waited::Run,
                Turn::Answered => return Waited::Answered,
                Turn::Behind => {
                    gap_since = None;
                    // The sender lives in `self`: this only ends with a change.
                    let _ = moved.changed().await;
                }
                Turn::Gap(_) => {
                    let since = *gap_since.get_or_insert_with(Instant::now);
                    let left = limit.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        let given = self.order().give_up(seq);
                        if let Some(first) = given {
                            self.bump();
                            return Waited::GaveUp(first);
                        }
                        continue;
                    }
                    tokio::select! {
                        _ = moved.changed() => {}
                        _ = tokio::time::sleep(left) => {}
                    }
                }
            }
        }
    }
}

fn out_of_range(model: &ModelEntry, seq_id: i64) -> TinkerError {
    TinkerError::User(format!("seq_id {seq_id} of model {} was already run or is out of range", model.id))
}

/// Finishes a call's turn when dropped.
struct Finish(Arc<ModelEntry>, u64);

impl Drop for Finish {
    fn drop(&mut self) {
        self.0.finish(self.1);
    }
}

impl<S> Registry<S> {
    /// [`Self::accept`] for work that runs on a blocking thread (the trainer).
    pub fn accept_blocking(
        &self,
        model: Arc<ModelEntry>,
        seq_id: i64,
        work: impl FnOnce() -> Outcome + Send + 'static,
    ) -> Result<Accepted, TinkerError> {
        let work = async move {
            tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| Outcome::server(format!("the call failed: {e}")))
        };
        self.accept(model, seq_id, work)
    }

    /// Accepts call `seq_id` of a model and runs `work` once every earlier call has its answer:
    /// the immediate answer, a future. A retried `seq_id` gets the first call's future.
    ///
    /// Whatever answer a call gets consumes its `seq_id` (`tandem_core::seq_order`): a call
    /// refused for its input is [`Self::refuse`]d, a call that waited its time at a gap fails,
    /// and either way the calls after it run.
    pub fn accept(
        &self,
        model: Arc<ModelEntry>,
        seq_id: i64,
        work: impl Future<Output = Outcome> + Send + 'static,
    ) -> Result<Accepted, TinkerError> {
        let (request_id, promise) = {
            let mut order = model.order();
            match order.peek(seq_id) {
                Arrival::Retry(request_id) => return Ok(Accepted { request_id }),
                Arrival::OutOfRange => return Err(out_of_range(&model, seq_id)),
                Arrival::GivenUp => {
                    // Answered at once: a later call gave up waiting for it, and the order has
                    // moved on.
                    let (request_id, promise) = self.future(&model.entity, model.id.session())?;
                    promise.set(Outcome::user(format!(
                        "seq_id {seq_id} of model {} came after a later call had waited {} s for it; it was not run",
                        model.id,
                        self.waits.seq_gap.as_secs_f64()
                    )));
                    return Ok(Accepted { request_id });
                }
                Arrival::New => {}
            }
            let (id, promise) = self.future(&model.entity, model.id.session())?;
            order.arrive(seq_id, &id);
            (id, promise)
        };
        model.bump();
        let seq = seq_id as u64;
        let limit = self.waits.seq_gap;
        tokio::spawn(async move {
            match model.wait_turn(seq, limit).await {
                Waited::Run => {}
                Waited::GaveUp(at) => {
                    promise.set(Outcome::user(format!(
                        "seq_id {seq} waited {} s for seq_id {at} of its model, which never came; the calls after it run",
                        limit.as_secs_f64()
                    )));
                    return;
                }
                Waited::Answered => return,
                Waited::Released => {
                    promise.set(Outcome::user("the model was released (its session ended) before this call's turn"));
                    return;
                }
            }
            // The order moves on whatever happens to the work, a panic included.
            let _finish = Finish(model, seq);
            promise.set(work.await);
        });
        Ok(Accepted { request_id })
    }

    /// Answers call `seq_id` with the caller's mistake at once (a future that fails) and takes
    /// it into its model's order as answered: a refused call still consumes its `seq_id`, so
    /// the calls after it run (issue 50), and it waits for nothing, since nothing of it runs.
    pub fn refuse(&self, model: Arc<ModelEntry>, seq_id: i64, error: String) -> Result<Accepted, TinkerError> {
        let request_id = {
            let mut order = model.order();
            let arrival = order.peek(seq_id);
            match &arrival {
                Arrival::Retry(request_id) => return Ok(Accepted { request_id: request_id.clone() }),
                Arrival::OutOfRange => return Err(out_of_range(&model, seq_id)),
                Arrival::GivenUp | Arrival::New => {}
            }
            let (id, promise) = self.future(&model.entity, model.id.session())?;
            promise.set(Outcome::user(error));
            if arrival == Arrival::New {
                order.arrive(seq_id, &id);
                order.finish(seq_id as u64);
            }
            id
        };
        model.bump();
        Ok(Accepted { request_id })
    }
}
