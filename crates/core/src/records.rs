//! The preview area's domain records, shared by the store (which persists them) and the api
//! (which serialises them). Times are Unix milliseconds; the api formats them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use uuid::Uuid;

/// A trainable model record: (entity, project, name) is unique.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRecord {
    pub id: Uuid,
    pub entity: String,
    pub project: String,
    pub name: String,
    pub base_model: String,
    pub run_id: String,
    pub created_at: i64,
}

/// One trained LoRA adapter of a model. Step 0 is the base model and never a record.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub id: Uuid,
    pub model_id: Uuid,
    pub step: i64,
    /// Metrics logged at this step plus the training summary; all numbers.
    pub metrics: BTreeMap<String, f64>,
    /// Directory of the adapter files, relative to the checkpoint root.
    pub path: String,
    pub created_at: i64,
}

/// One stored trajectory log (without its groups, which are fetched on demand).
#[derive(Debug, Clone, PartialEq)]
pub struct LogEntry {
    pub id: Uuid,
    pub model_id: Uuid,
    pub split: String,
    pub step: i64,
    pub metrics: BTreeMap<String, f64>,
    pub num_groups: i64,
    pub num_trajectories: i64,
    pub created_at: i64,
}

/// Where a training job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobStatus::Queued,
            "running" => JobStatus::Running,
            "succeeded" => JobStatus::Succeeded,
            "failed" => JobStatus::Failed,
            "cancelled" => JobStatus::Cancelled,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled)
    }
}

/// What a training job trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// Trajectory groups with rewards (`POST /training-jobs`).
    Rl,
    /// Conversations of a dataset (`POST /sft-training-jobs`).
    Sft,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Rl => "rl",
            JobKind::Sft => "sft",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "rl" => Some(JobKind::Rl),
            "sft" => Some(JobKind::Sft),
            _ => None,
        }
    }
}

/// An uploaded dataset (its rows are fetched on demand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    pub id: Uuid,
    pub entity: String,
    pub project: String,
    pub name: String,
    pub version: i64,
    pub num_rows: i64,
    pub size_bytes: i64,
    pub created_at: i64,
}

/// A training job as the api shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: Uuid,
    pub model_id: Uuid,
    pub kind: JobKind,
    pub status: JobStatus,
    /// The checkpoint step this job produced, once it succeeded.
    pub step: Option<i64>,
    pub error_message: Option<String>,
    pub cancel_requested: bool,
    pub attempts: i64,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// An RL job's rollout metrics (`train/reward`, ...), computed from its groups when it was
    /// created; empty for SFT jobs and older jobs.
    pub rollout_metrics: BTreeMap<String, f64>,
}

/// The types of job event the worker writes (their `type` on the wire). ART is strict about the
/// first and the two terminal ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    TrainingStarted,
    GradientStep,
    TrainingEnded,
    TrainingFailed,
    /// The server restarted while the job ran; it runs again from its start.
    TrainingRestarted,
}

impl EventKind {
    pub const ALL: [EventKind; 5] = [
        EventKind::TrainingStarted,
        EventKind::GradientStep,
        EventKind::TrainingEnded,
        EventKind::TrainingFailed,
        EventKind::TrainingRestarted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::TrainingStarted => "training_started",
            EventKind::GradientStep => "gradient_step",
            EventKind::TrainingEnded => "training_ended",
            EventKind::TrainingFailed => "training_failed",
            EventKind::TrainingRestarted => "training_restarted",
        }
    }

    /// The kind a stored `type` names.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One event of a job, in append order.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEvent {
    pub id: Uuid,
    pub job_id: Uuid,
    pub kind: EventKind,
    pub data: Value,
    pub created_at: i64,
}

/// Sort order of a cursor page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    #[default]
    Asc,
    Desc,
}

/// A cursor page request: items strictly after the item `after`, at most `limit` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    pub after: Option<Uuid>,
    pub limit: u32,
    pub order: Order,
}

impl PageRequest {
    pub fn first(limit: u32) -> Self {
        PageRequest { after: None, limit, order: Order::Asc }
    }
}

/// One page of items and whether more follow.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}
