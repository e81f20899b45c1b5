//! Decoding PostgreSQL rows into domain records. The columns hold what SQLite's do (ids and JSON
//! as text), except `cancel_requested`, a real boolean here.

use crate::{ApiKeyRecord, Result, StoreError};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::Row;
use std::collections::BTreeMap;
use tandem_core::records::{Checkpoint, Dataset, EventKind, Job, JobEvent, JobKind, JobStatus, LogEntry, ModelRecord};
use uuid::Uuid;

pub(crate) use crate::codec::{metrics_text, page};

/// Serialises a value for a JSON text column.
pub(crate) fn text(v: &Value) -> Result<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Database(e.to_string()))
}

crate::codec::record_decoders!(PgRow, |row: &PgRow| -> Result<bool> { Ok(row.try_get("cancel_requested")?) });
