//! Decoding SQLite rows into domain records.

use crate::{ApiKeyRecord, Result, StoreError};
use serde_json::Value;
use sqlx::sqlite::SqliteRow;
use sqlx::Row;
use std::collections::BTreeMap;
use tandem_core::records::{Checkpoint, Dataset, EventKind, Job, JobEvent, JobKind, JobStatus, LogEntry, ModelRecord};
use uuid::Uuid;

pub(crate) use crate::codec::{metrics_text, page};

pub(crate) fn uuid(row: &SqliteRow, col: &str) -> Result<Uuid> {
    crate::codec::parse_uuid(&row.try_get::<String, _>(col)?, col)
}

pub(crate) fn json(row: &SqliteRow, col: &str) -> Result<Value> {
    crate::codec::parse_json(&row.try_get::<String, _>(col)?, col)
}

/// A metrics column: its finite numbers (migration 0003 removes the `null`s that an older version
/// wrote for non-finite values on start-up; reads skip any left).
pub(crate) fn metrics(row: &SqliteRow, col: &str) -> Result<BTreeMap<String, f64>> {
    crate::codec::parse_metrics(&row.try_get::<String, _>(col)?, col)
}

pub(crate) fn key(row: &SqliteRow) -> Result<ApiKeyRecord> {
    let hash: Vec<u8> = row.try_get("key_hash")?;
    let key_hash: [u8; 32] = hash.try_into().map_err(|_| StoreError::Database("key hash is not 32 bytes".into()))?;
    Ok(ApiKeyRecord {
        id: uuid(row, "id")?,
        entity: row.try_get("entity")?,
        key_hash,
        prefix: row.try_get("prefix")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

pub(crate) fn model(row: &SqliteRow) -> Result<ModelRecord> {
    Ok(ModelRecord {
        id: uuid(row, "id")?,
        entity: row.try_get("entity")?,
        project: row.try_get("project")?,
        name: row.try_get("name")?,
        base_model: row.try_get("base_model")?,
        run_id: row.try_get("run_id")?,
        created_at: row.try_get("created_at")?,
    })
}

pub(crate) fn checkpoint(row: &SqliteRow) -> Result<Checkpoint> {
    Ok(Checkpoint {
        id: uuid(row, "id")?,
        model_id: uuid(row, "model_id")?,
        step: row.try_get("step")?,
        metrics: metrics(row, "metrics")?,
        path: row.try_get("path")?,
        created_at: row.try_get("created_at")?,
    })
}

pub(crate) fn log_entry(row: &SqliteRow) -> Result<LogEntry> {
    Ok(LogEntry {
        id: uuid(row, "id")?,
        model_id: uuid(row, "model_id")?,
        split: row.try_get("split")?,
        step: row.try_get("step")?,
        metrics: metrics(row, "metrics")?,
        num_groups: row.try_get("num_groups")?,
        num_trajectories: row.try_get("num_trajectories")?,
        created_at: row.try_get("created_at")?,
    })
}

pub(crate) fn job(row: &SqliteRow) -> Result<Job> {
    let status: String = row.try_get("status")?;
    let cancel: i64 = row.try_get("cancel_requested")?;
    let kind: String = row.try_get("kind")?;
    Ok(Job {
        id: uuid(row, "id")?,
        model_id: uuid(row, "model_id")?,
        kind: JobKind::parse(&kind).ok_or_else(|| StoreError::Database(format!("bad job kind {kind}")))?,
        status: JobStatus::parse(&status).ok_or_else(|| StoreError::Database(format!("bad job status {status}")))?,
        step: row.try_get("step")?,
        error_message: row.try_get("error_message")?,
        cancel_requested: cancel != 0,
        attempts: row.try_get("attempts")?,
        created_at: row.try_get("created_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        rollout_metrics: match row.try_get::<Option<String>, _>("rollout_metrics")? {
            Some(text) => serde_json::from_str(&text).map_err(|e| StoreError::Database(e.to_string()))?,
            None => Default::default(),
        },
    })
}

pub(crate) fn dataset(row: &SqliteRow) -> Result<Dataset> {
    Ok(Dataset {
        id: uuid(row, "id")?,
        entity: row.try_get("entity")?,
        project: row.try_get("project")?,
        name: row.try_get("name")?,
        version: row.try_get("version")?,
        num_rows: row.try_get("num_rows")?,
        size_bytes: row.try_get("size_bytes")?,
        created_at: row.try_get("created_at")?,
    })
}

pub(crate) fn event(row: &SqliteRow) -> Result<JobEvent> {
    Ok(JobEvent {
        id: uuid(row, "id")?,
        job_id: uuid(row, "job_id")?,
        kind: {
            let kind: String = row.try_get("type")?;
            EventKind::parse(&kind).ok_or_else(|| StoreError::Database(format!("unknown job event type {kind:?}")))?
        },
        data: json(row, "data")?,
        created_at: row.try_get("created_at")?,
    })
}
