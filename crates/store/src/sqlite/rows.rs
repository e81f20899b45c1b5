//! Decoding SQLite rows into domain records.

use crate::{ApiKeyRecord, Result, StoreError};
use serde_json::Value;
use sqlx::sqlite::SqliteRow;
use sqlx::Row;
use std::collections::BTreeMap;
use tandem_core::records::{Checkpoint, Dataset, EventKind, Job, JobEvent, JobKind, JobStatus, LogEntry, ModelRecord};
use uuid::Uuid;

pub(crate) use crate::codec::{metrics_text, page};

crate::codec::record_decoders!(SqliteRow, |row: &SqliteRow| -> Result<bool> {
    Ok(row.try_get::<i64, _>("cancel_requested")? != 0)
});
