//! The training worker: claims queued jobs (one per entity at a time), runs each [`Trainer`] on
//! a blocking thread, time-slicing them at gradient-step boundaries ([`turns`]), streams their
//! events into the store, writes each checkpoint durably and ends the job.
//!
//! The worker owns the job state machine's driving side (`queued → running → succeeded | failed |
//! cancelled`); the store owns its transitions. It never touches HTTP or tensors: the trainer is
//! a trait object, so the api crate can be tested with the worker and no model at all.

mod lease;
mod sink;
pub mod turns;
mod worker;

pub use lease::renew_interval;
pub use worker::{Worker, WorkerConfig};

use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tandem_core::records::ModelRecord;
use tandem_core::sequences::RlInputs;
use tandem_core::sft::SftConfig;
use tandem_core::train_config::TrainConfig;
use uuid::Uuid;

/// Everything a trainer needs to run one job.
#[derive(Debug, Clone)]
pub struct TrainJob {
    pub job_id: Uuid,
    pub model: ModelRecord,
    /// The step training continues from (0 = the base model) and its adapter directory.
    pub base_step: i64,
    pub base_checkpoint: Option<PathBuf>,
    pub task: TrainTask,
}

/// What a job trains on, and how.
#[derive(Debug, Clone)]
pub enum TrainTask {
    Rl {
        config: TrainConfig,
        /// The trajectories: tokenized when the job was created, or raw from an older job.
        inputs: RlInputs,
        /// The KL penalty's reference policy, resolved by the worker when the config has one.
        kl_reference: Option<ReferencePolicy>,
    },
    Sft {
        config: SftConfig,
        /// The conversations, `{"messages", "tools"?}` each.
        rows: Vec<Value>,
    },
}

/// A policy log-probabilities are compared against: the base model, or one of the model's
/// checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReferencePolicy {
    Base,
    Checkpoint { step: i64, dir: PathBuf },
}

/// What a successful run produces: the adapter files and summary metrics for the checkpoint.
#[derive(Debug, Clone, Default)]
pub struct TrainOutput {
    pub files: Vec<(String, Vec<u8>)>,
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// This build has no trainer; the job fails with this message.
    #[error("{0}")]
    Unavailable(String),
    /// The job asked for something it cannot train on (bad trajectories, say).
    #[error("{0}")]
    Invalid(String),
    #[error("training job cancelled")]
    Cancelled,
    /// The server is shutting down, or this trainer lost the job's lease: the run writes
    /// nothing more, and the job is left for recovery (here at the next start, or another
    /// trainer's).
    #[error("server shutting down")]
    Interrupted,
    #[error("training failed: {0}")]
    Failed(String),
}

/// Where a trainer reports progress. Calls block briefly on the store.
pub trait TrainSink {
    /// Must be called once, before any gradient step: `num_sequences` gradient steps will follow.
    fn started(&mut self, num_sequences: u64, extra: Map<String, Value>);
    /// One optimizer step; every value a number (ART converts each with `float()`).
    fn gradient_step(&mut self, metrics: BTreeMap<String, f64>);
    /// A step boundary: called before each gradient step (and between the parts of long
    /// preparations). The worker may run another entity's job here before it returns. Says
    /// whether the trainer should stop: the job was cancelled or the server stops.
    fn should_stop(&mut self) -> Option<TrainError>;
    /// A step boundary of a run whose state can be parked: as [`TrainSink::should_stop`], and
    /// when a run of another entity needs this run's memory the worker calls `held.park` before
    /// this run waits for its turn and `held.unpark` when the turn comes back.
    fn boundary(&mut self, held: &mut dyn Park) -> Option<TrainError> {
        let _ = held;
        self.should_stop()
    }
}

/// A run's training state (adapter, optimizer) that can leave memory while the run waits.
pub trait Park {
    /// Writes the state to `path` and frees its memory; on an error the state stays in memory.
    fn park(&mut self, path: &std::path::Path) -> Result<(), String>;
    /// Reads the parked state back and removes its file (nothing to do when it is not parked).
    fn unpark(&mut self) -> Result<(), String>;
}

/// Trains one job. Runs on a blocking thread, never on the async executor.
pub trait Trainer: Send + Sync + 'static {
    fn train(&self, job: &TrainJob, sink: &mut dyn TrainSink) -> Result<TrainOutput, TrainError>;
}

/// The trainer of a build without one: every job fails honestly, saying so.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoTrainer;

impl Trainer for NoTrainer {
    fn train(&self, _job: &TrainJob, _sink: &mut dyn TrainSink) -> Result<TrainOutput, TrainError> {
        Err(TrainError::Unavailable("no trainer is available in this build".into()))
    }
}
