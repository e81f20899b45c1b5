//! The wire shapes of the preview area, as typed views of domain records. They serialise to the
//! JSON ART reads and describe themselves to the OpenAPI document (`crate::openapi`), so the
//! document cannot drift from what the routes send.

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use tandem_core::records::{Checkpoint, Dataset, Job, JobEvent, LogEntry, ModelRecord, Page};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

/// Unix milliseconds as an RFC 3339 UTC timestamp (`None` only outside the representable range).
pub fn timestamp(ms: i64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).ok().and_then(|t| t.format(&Rfc3339).ok())
}

/// A trainable model record.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelView {
    pub id: Uuid,
    /// Always `model`.
    pub object: &'static str,
    pub entity: String,
    pub project: String,
    pub name: String,
    pub base_model: String,
    pub run_id: String,
    /// RFC 3339, UTC.
    pub created_at: Option<String>,
    /// Progress, in a listing asked with `summary=true` (the dashboard's models list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<ModelSummaryView>,
}

/// A model's progress at a glance.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelSummaryView {
    /// The newest live checkpoint's step (0 before any).
    pub latest_step: i64,
    /// The newest checkpoint, log or job (RFC 3339), absent before any.
    pub last_activity: Option<String>,
    /// The newest reward seen: of the newest log (its `{split}/reward`) or of the newest RL job
    /// that runs or succeeded (its `train/reward`), whichever is newer.
    pub last_reward: Option<f64>,
    /// Its key (`val/reward`, `train/reward`, ...).
    pub last_reward_key: Option<String>,
}

pub fn model_summary(s: &tandem_store::ModelSummary) -> ModelSummaryView {
    let reward = |(at, metrics): &(i64, BTreeMap<String, f64>)| {
        // A log holds one split: the key ending in `/reward` that is not nested (`val/reward`).
        metrics
            .iter()
            .find(|(k, _)| k.ends_with("/reward") && k.matches('/').count() == 1)
            .map(|(k, v)| (*at, k.clone(), *v))
    };
    let newest = [s.job_metrics.as_ref().and_then(reward), s.log_metrics.as_ref().and_then(reward)]
        .into_iter()
        .flatten()
        .max_by_key(|(at, _, _)| *at);
    ModelSummaryView {
        latest_step: s.latest_step,
        last_activity: s.last_activity.and_then(timestamp),
        last_reward: newest.as_ref().map(|(_, _, v)| *v),
        last_reward_key: newest.map(|(_, k, _)| k),
    }
}

pub fn model(m: &ModelRecord) -> ModelView {
    ModelView {
        id: m.id,
        object: "model",
        entity: m.entity.clone(),
        project: m.project.clone(),
        name: m.name.clone(),
        base_model: m.base_model.clone(),
        run_id: m.run_id.clone(),
        created_at: timestamp(m.created_at),
        summary: None,
    }
}

/// A trained LoRA checkpoint of a model (step 0, the base model, is never one).
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckpointView {
    pub id: Uuid,
    /// Always `checkpoint`.
    pub object: &'static str,
    pub model_id: Uuid,
    pub step: i64,
    /// Metrics logged at this step and the training summary.
    pub metrics: BTreeMap<String, f64>,
    pub created_at: Option<String>,
}

pub fn checkpoint(c: &Checkpoint) -> CheckpointView {
    CheckpointView {
        id: c.id,
        object: "checkpoint",
        model_id: c.model_id,
        step: c.step,
        metrics: c.metrics.clone(),
        created_at: timestamp(c.created_at),
    }
}

/// A stored trajectory log; `trajectory_groups` only when one log is read.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogView {
    pub id: Uuid,
    /// Always `trajectory_log`.
    pub object: &'static str,
    pub model_id: Uuid,
    pub split: String,
    pub step: i64,
    /// Means of every numeric metric (and `reward`) over the log's trajectories.
    pub metrics: BTreeMap<String, f64>,
    pub num_groups: i64,
    pub num_trajectories: i64,
    pub created_at: Option<String>,
    /// The groups as they were logged.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub trajectory_groups: Option<Value>,
}

pub fn log_entry(l: &LogEntry) -> LogView {
    LogView {
        id: l.id,
        object: "trajectory_log",
        model_id: l.model_id,
        split: l.split.clone(),
        step: l.step,
        metrics: l.metrics.clone(),
        num_groups: l.num_groups,
        num_trajectories: l.num_trajectories,
        created_at: timestamp(l.created_at),
        trajectory_groups: None,
    }
}

/// A training job (RL or SFT).
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    pub id: Uuid,
    /// Always `training_job`.
    pub object: &'static str,
    /// `rl` or `sft`.
    pub kind: &'static str,
    pub model_id: Uuid,
    /// `queued`, `running`, `succeeded`, `failed` or `cancelled`.
    pub status: &'static str,
    /// The checkpoint step the job produced, once it succeeded.
    pub step: Option<i64>,
    pub error_message: Option<String>,
    pub created_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// An RL job's rollout metrics, computed from its groups as a `train` log's are
    /// (`train/reward`, `train/reward_std_dev`, ...); left out when there are none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub rollout_metrics: BTreeMap<String, f64>,
}

pub fn job(j: &Job) -> JobView {
    JobView {
        id: j.id,
        object: "training_job",
        kind: j.kind.as_str(),
        model_id: j.model_id,
        status: j.status.as_str(),
        step: j.step,
        error_message: j.error_message.clone(),
        created_at: timestamp(j.created_at),
        started_at: j.started_at.and_then(timestamp),
        finished_at: j.finished_at.and_then(timestamp),
        rollout_metrics: j.rollout_metrics.clone(),
    }
}

/// An uploaded SFT dataset version, with the `wandb-artifact:///` URL that names it as an SFT
/// job's `training_data_url`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DatasetView {
    pub id: Uuid,
    /// Always `dataset`.
    pub object: &'static str,
    pub entity: String,
    pub project: String,
    pub name: String,
    pub version: i64,
    pub url: String,
    pub num_rows: i64,
    pub size_bytes: i64,
    pub created_at: Option<String>,
}

pub fn dataset(d: &Dataset) -> DatasetView {
    DatasetView {
        id: d.id,
        object: "dataset",
        entity: d.entity.clone(),
        project: d.project.clone(),
        name: d.name.clone(),
        version: d.version,
        url: format!("wandb-artifact:///{}/{}/{}:v{}", d.entity, d.project, d.name, d.version),
        num_rows: d.num_rows,
        size_bytes: d.size_bytes,
        created_at: timestamp(d.created_at),
    }
}

/// One event of a training job, in append order.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventView {
    pub id: Uuid,
    /// Always `training_job.event`.
    pub object: &'static str,
    /// `training_started`, `gradient_step`, `training_ended`, `training_failed` or
    /// `training_restarted`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[schema(value_type = Object)]
    pub data: Value,
    pub created_at: Option<String>,
}

pub fn event(e: &JobEvent) -> EventView {
    EventView {
        id: e.id,
        object: "training_job.event",
        kind: e.kind.as_str(),
        data: e.data.clone(),
        created_at: timestamp(e.created_at),
    }
}

/// A cursor page in the OpenAI list shape: `first_id`/`last_id` are null on an empty page.
#[derive(Debug, Serialize, ToSchema)]
pub struct ListView<T> {
    /// Always `list`.
    pub object: &'static str,
    pub data: Vec<T>,
    pub first_id: Option<Uuid>,
    pub last_id: Option<Uuid>,
    pub has_more: bool,
}

pub fn list<T, V>(page: &Page<T>, id: impl Fn(&T) -> Uuid, view: impl Fn(&T) -> V) -> ListView<V> {
    ListView {
        object: "list",
        data: page.items.iter().map(view).collect(),
        first_id: page.items.first().map(&id),
        last_id: page.items.last().map(&id),
        has_more: page.has_more,
    }
}

/// What `DELETE /models/{id}/checkpoints` removed.
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckpointsDeleted {
    pub deleted_count: usize,
    /// Requested steps that had no checkpoint.
    pub not_found_steps: Vec<i64>,
}

/// What `DELETE /models/{id}` removed (the model, its logs, jobs and checkpoints).
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelDeleted {
    pub model_id: Uuid,
    pub deleted_checkpoints: usize,
    pub deleted_run: bool,
}

/// `DELETE /datasets/{id}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DatasetDeleted {
    pub id: Uuid,
    pub deleted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(timestamp(0).as_deref(), Some("1970-01-01T00:00:00Z"));
        assert_eq!(timestamp(1_700_000_000_123).as_deref(), Some("2023-11-14T22:13:20.123Z"));
    }
}
