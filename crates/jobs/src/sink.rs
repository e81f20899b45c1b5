//! The sink a job's trainer writes through, and its step boundaries: the turn between
//! entities' jobs (`turns.rs`), parking, shutdown, a lost lease and cancellation.

use crate::lease::LeaseFlags;
use crate::turns::Turn;
use crate::{Park, TrainError, TrainSink};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_core::health::Heartbeat;
use tandem_core::records::EventKind;
use tandem_core::telemetry::TrainingMetrics;
use tandem_store::{now_ms, Store, StoreError};
use tokio::runtime::Handle;
use uuid::Uuid;

/// The sink a trainer writes through: each call is a short blocking store write.
pub(crate) struct StoreSink {
    pub(crate) heartbeat: Arc<Heartbeat>,
    pub(crate) metrics: Arc<TrainingMetrics>,
    /// The job's kind, as the metrics label it.
    pub(crate) kind: &'static str,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) handle: Handle,
    pub(crate) job_id: Uuid,
    /// This trainer, as the job's lease names it.
    pub(crate) owner: String,
    pub(crate) lease: Arc<LeaseFlags>,
    pub(crate) started: bool,
    pub(crate) stopping: Arc<AtomicBool>,
    pub(crate) last_cancel_check: Option<Instant>,
    /// The trainer's turn, held while this job computes (taken on its blocking thread).
    pub(crate) turn: Option<Turn>,
    /// Where this job's state goes while it is parked.
    pub(crate) park_path: std::path::PathBuf,
    /// Events the store could not take yet (it was unavailable), in order: written before the
    /// next event and, at the latest, before the job's outcome, so a database outage in the
    /// middle of a job costs none of its events and does not hold the trainer's turn.
    pub(crate) unwritten: Vec<(EventKind, Value)>,
}

impl StoreSink {
    /// A lost lease stops the run like a shutdown: nothing more is written for it.
    pub(crate) fn interrupted(&self) -> Option<TrainError> {
        (self.stopping.load(Ordering::SeqCst) || self.lease.lost()).then_some(TrainError::Interrupted)
    }

    fn append(&mut self, kind: EventKind, data: Value) {
        self.heartbeat.beat(now_ms(), true);
        self.unwritten.push((kind, data));
        let (store, handle) = (self.store.clone(), self.handle.clone());
        match handle.block_on(write_events(&*store, self.job_id, &self.owner, &mut self.unwritten)) {
            Ok(()) => {}
            // The trainer stops at its next `should_stop`.
            Err(StoreError::LeaseLost) => self.lease.mark_lost(),
            // Kept: the next event or the job's end writes it.
            Err(e @ StoreError::Unavailable(_)) => {
                tracing::warn!(job_id = %self.job_id, error = %e, waiting = self.unwritten.len(), "training events wait for the store")
            }
            Err(e) => {
                tracing::error!(job_id = %self.job_id, error = %e, "could not append training event");
                self.unwritten.clear();
            }
        }
    }
}

/// Writes `events` in order, removing each one the store took; stops at the first error.
async fn write_events(
    store: &dyn Store,
    job_id: Uuid,
    owner: &str,
    events: &mut Vec<(EventKind, Value)>,
) -> Result<(), StoreError> {
    let mut written = 0;
    let result = async {
        for (kind, data) in events.iter() {
            store.append_event(job_id, owner, *kind, data).await?;
            written += 1;
        }
        Ok(())
    }
    .await;
    events.drain(..written);
    result
}

impl TrainSink for StoreSink {
    fn started(&mut self, num_sequences: u64, mut extra: Map<String, Value>) {
        if self.started {
            return;
        }
        extra.insert("num_sequences".into(), json!(num_sequences));
        self.append(EventKind::TrainingStarted, Value::Object(extra));
        self.started = true;
    }

    fn gradient_step(&mut self, metrics: BTreeMap<String, f64>) {
        let tokens = metrics.get("num_trainable_tokens").copied().filter(|t| t.is_finite() && *t >= 0.0);
        self.metrics.gradient_step(self.kind, tokens.map_or(0, |t| t as u64));
        // JSON has no NaN: a non-finite value is dropped rather than sent as null, which ART's
        // client would reject.
        let data: Map<String, Value> =
            metrics.into_iter().filter(|(_, v)| v.is_finite()).map(|(k, v)| (k, json!(v))).collect();
        self.append(EventKind::GradientStep, Value::Object(data));
    }

    fn should_stop(&mut self) -> Option<TrainError> {
        // A step boundary: another entity's job may take its turn first.
        if let Some(turn) = self.turn.as_mut() {
            turn.boundary();
        }
        self.checks()
    }

    fn boundary(&mut self, held: &mut dyn Park) -> Option<TrainError> {
        let must_park = self.turn.as_mut().is_some_and(|turn| turn.boundary_or_park(true));
        if !must_park {
            return self.checks();
        }
        // Another entity's job needs this one's place in memory.
        let freed = self.park(held);
        if let Some(turn) = self.turn.as_mut() {
            turn.park(freed);
        }
        // Stopping or cancelled while parked: the state is not read back for nothing.
        if let Some(stop) = self.checks() {
            return Some(stop);
        }
        held.unpark().err().map(|e| TrainError::Failed(format!("reading back the parked training state: {e}")))
    }
}

impl StoreSink {
    /// Writes the job's state out; whether it left memory (a failed write keeps it there).
    fn park(&self, held: &mut dyn Park) -> bool {
        let t = Instant::now();
        match held.park(&self.park_path) {
            Ok(()) => {
                let bytes = std::fs::metadata(&self.park_path).map(|m| m.len()).unwrap_or(0);
                let secs = t.elapsed().as_secs_f64();
                tracing::info!(job_id = %self.job_id, bytes, secs, "training job parked for another entity's");
                self.metrics.parked();
                true
            }
            Err(e) => {
                tracing::warn!(job_id = %self.job_id, error = %e, "could not park a training job; it stays in memory");
                false
            }
        }
    }

    /// The checks of a step boundary: shutdown, a lost lease, cancellation.
    fn checks(&mut self) -> Option<TrainError> {
        self.heartbeat.beat(now_ms(), true);
        if let Some(stop) = self.interrupted() {
            return Some(stop);
        }
        // Cancellation is a store read: at most a few per second.
        let due = self.last_cancel_check.is_none_or(|t| t.elapsed() >= Duration::from_millis(250));
        if due {
            self.last_cancel_check = Some(Instant::now());
            if let Ok(true) = self.handle.block_on(self.store.is_cancel_requested(self.job_id)) {
                return Some(TrainError::Cancelled);
            }
        }
        None
    }
}
