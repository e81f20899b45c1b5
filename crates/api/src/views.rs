//! JSON views of domain records: the wire shapes of the preview area.

use serde_json::{json, Value};
use tandem_core::records::{Checkpoint, Dataset, Job, JobEvent, LogEntry, ModelRecord, Page};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Unix milliseconds as an RFC 3339 UTC timestamp.
pub fn timestamp(ms: i64) -> Value {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .map_or(Value::Null, Value::String)
}

pub fn model(m: &ModelRecord) -> Value {
    json!({
        "id": m.id, "object": "model", "entity": m.entity, "project": m.project, "name": m.name,
        "base_model": m.base_model, "run_id": m.run_id, "created_at": timestamp(m.created_at),
    })
}

pub fn checkpoint(c: &Checkpoint) -> Value {
    json!({
        "id": c.id, "object": "checkpoint", "model_id": c.model_id, "step": c.step,
        "metrics": c.metrics, "created_at": timestamp(c.created_at),
    })
}

pub fn log_entry(l: &LogEntry) -> Value {
    json!({
        "id": l.id, "object": "trajectory_log", "model_id": l.model_id, "split": l.split,
        "step": l.step, "metrics": l.metrics, "num_groups": l.num_groups,
        "num_trajectories": l.num_trajectories, "created_at": timestamp(l.created_at),
    })
}

pub fn job(j: &Job) -> Value {
    json!({
        "id": j.id, "object": "training_job", "kind": j.kind.as_str(), "model_id": j.model_id,
        "status": j.status.as_str(),
        "step": j.step, "error_message": j.error_message,
        "created_at": timestamp(j.created_at),
        "started_at": j.started_at.map_or(Value::Null, timestamp),
        "finished_at": j.finished_at.map_or(Value::Null, timestamp),
    })
}

/// A dataset, with the `wandb-artifact:///` URL that names it as an SFT job's
/// `training_data_url`.
pub fn dataset(d: &Dataset) -> Value {
    json!({
        "id": d.id, "object": "dataset", "entity": d.entity, "project": d.project, "name": d.name,
        "version": d.version,
        "url": format!("wandb-artifact:///{}/{}/{}:v{}", d.entity, d.project, d.name, d.version),
        "num_rows": d.num_rows, "size_bytes": d.size_bytes, "created_at": timestamp(d.created_at),
    })
}

pub fn event(e: &JobEvent) -> Value {
    json!({
        "id": e.id, "object": "training_job.event", "type": e.kind, "data": e.data,
        "created_at": timestamp(e.created_at),
    })
}

/// A cursor page in the OpenAI list shape: `first_id`/`last_id` are null on an empty page.
pub fn list<T>(page: &Page<T>, id: impl Fn(&T) -> uuid::Uuid, view: impl Fn(&T) -> Value) -> Value {
    json!({
        "object": "list",
        "data": page.items.iter().map(view).collect::<Vec<_>>(),
        "first_id": page.items.first().map(&id),
        "last_id": page.items.last().map(&id),
        "has_more": page.has_more,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(timestamp(0), json!("1970-01-01T00:00:00Z"));
        assert_eq!(timestamp(1_700_000_000_123), json!("2023-11-14T22:13:20.123Z"));
    }
}
