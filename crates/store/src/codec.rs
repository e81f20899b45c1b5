//! Backend-neutral pieces of turning stored text into records and back: both backends keep ids and
//! JSON as text, so they parse and write them the same way (and a row written by one reads the
//! same through the other).

use crate::{Result, StoreError};
use serde_json::Value;
use std::collections::BTreeMap;
use tandem_core::records::Page;
use uuid::Uuid;

pub(crate) fn parse_uuid(s: &str, col: &str) -> Result<Uuid> {
    Uuid::parse_str(s).map_err(|e| StoreError::Database(format!("bad uuid in {col}: {e}")))
}

pub(crate) fn parse_json(s: &str, col: &str) -> Result<Value> {
    serde_json::from_str(s).map_err(|e| StoreError::Database(format!("bad json in {col}: {e}")))
}

/// A metrics object's finite numbers. Anything else (a `null` that an older version wrote for a
/// non-finite value) is skipped, so one bad value can never make a model's checkpoints or logs
/// unreadable.
pub(crate) fn parse_metrics(s: &str, col: &str) -> Result<BTreeMap<String, f64>> {
    let map: serde_json::Map<String, Value> =
        serde_json::from_str(s).map_err(|e| StoreError::Database(format!("bad metrics in {col}: {e}")))?;
    Ok(map.into_iter().filter_map(|(k, v)| v.as_f64().filter(|x| x.is_finite()).map(|x| (k, x))).collect())
}

/// Only finite numbers are stored: JSON has no NaN or infinity (serde_json would write `null`).
pub(crate) fn metrics_text(m: &BTreeMap<String, f64>) -> String {
    let finite: BTreeMap<&String, &f64> = m.iter().filter(|(_, v)| v.is_finite()).collect();
    serde_json::to_string(&finite).unwrap_or_else(|_| "{}".to_string())
}

/// Splits `limit + 1` fetched rows into a page and whether more follow.
pub(crate) fn page<T>(mut items: Vec<T>, limit: u32) -> Page<T> {
    let has_more = items.len() > limit as usize;
    items.truncate(limit as usize);
    Page { items, has_more }
}

/// The record decoders, written once and expanded in each backend's `rows` module for its row
/// type: both keep the same columns (ids and JSON as text, times and counts as integers) except
/// `cancel_requested`, which `$flag` reads (SQLite: an integer, PostgreSQL: a boolean). The
/// expanding module imports the record types, `sqlx::Row` and `Result`/`StoreError`.
macro_rules! record_decoders {
    ($row:ty, $flag:expr) => {
        pub(crate) fn uuid(row: &$row, col: &str) -> Result<Uuid> {
            $crate::codec::parse_uuid(&row.try_get::<String, _>(col)?, col)
        }

        pub(crate) fn json(row: &$row, col: &str) -> Result<Value> {
            $crate::codec::parse_json(&row.try_get::<String, _>(col)?, col)
        }

        /// A metrics column: its finite numbers (migration 0003 removes the `null`s that an older version
        /// wrote for non-finite values on start-up; reads skip any left).
        pub(crate) fn metrics(row: &$row, col: &str) -> Result<BTreeMap<String, f64>> {
            $crate::codec::parse_metrics(&row.try_get::<String, _>(col)?, col)
        }

        pub(crate) fn key(row: &$row) -> Result<ApiKeyRecord> {
            let hash: Vec<u8> = row.try_get("key_hash")?;
            let key_hash: [u8; 32] =
                hash.try_into().map_err(|_| StoreError::Database("key hash is not 32 bytes".into()))?;
            Ok(ApiKeyRecord {
                id: uuid(row, "id")?,
                entity: row.try_get("entity")?,
                key_hash,
                prefix: row.try_get("prefix")?,
                created_at: row.try_get("created_at")?,
                revoked_at: row.try_get("revoked_at")?,
            })
        }

        pub(crate) fn model(row: &$row) -> Result<ModelRecord> {
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

        pub(crate) fn checkpoint(row: &$row) -> Result<Checkpoint> {
            Ok(Checkpoint {
                id: uuid(row, "id")?,
                model_id: uuid(row, "model_id")?,
                step: row.try_get("step")?,
                metrics: metrics(row, "metrics")?,
                path: row.try_get("path")?,
                created_at: row.try_get("created_at")?,
            })
        }

        pub(crate) fn log_entry(row: &$row) -> Result<LogEntry> {
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

        pub(crate) fn job(row: &$row) -> Result<Job> {
            let status: String = row.try_get("status")?;
            let kind: String = row.try_get("kind")?;
            Ok(Job {
                id: uuid(row, "id")?,
                model_id: uuid(row, "model_id")?,
                kind: JobKind::parse(&kind).ok_or_else(|| StoreError::Database(format!("bad job kind {kind}")))?,
                status: JobStatus::parse(&status)
                    .ok_or_else(|| StoreError::Database(format!("bad job status {status}")))?,
                step: row.try_get("step")?,
                error_message: row.try_get("error_message")?,
                cancel_requested: $flag(row)?,
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

        pub(crate) fn dataset(row: &$row) -> Result<Dataset> {
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

        pub(crate) fn event(row: &$row) -> Result<JobEvent> {
            Ok(JobEvent {
                id: uuid(row, "id")?,
                job_id: uuid(row, "job_id")?,
                kind: {
                    let kind: String = row.try_get("type")?;
                    EventKind::parse(&kind)
                        .ok_or_else(|| StoreError::Database(format!("unknown job event type {kind:?}")))?
                },
                data: json(row, "data")?,
                created_at: row.try_get("created_at")?,
            })
        }
    };
}
pub(crate) use record_decoders;

/// Why recovery gave a job up: it was claimed `attempts` times and never finished.
pub(crate) fn gave_up_message(attempts: i64) -> String {
    format!("training job was interrupted {attempts} times (its trainer stopped before finishing); giving up")
}

/// The `reason` of a `training_restarted` event.
pub(crate) fn restart_reason(scope: crate::Reclaim) -> &'static str {
    match scope {
        crate::Reclaim::All => "server restarted while the job was running",
        crate::Reclaim::Expired => "the trainer running the job stopped renewing its lease",
    }
}

/// The registry's columns, in [`NodeRow`]'s order.
pub(crate) const NODE_COLUMNS: &str = "id, name, role, version, started_at, heartbeat_at, busy, draining, address";

/// (id, name, role, version, started_at, heartbeat_at, busy, draining, address)
pub(crate) type NodeRow = (String, String, String, String, i64, i64, bool, bool, String);

/// Registry rows as records. A row is alive when it beat within [`crate::NODE_ALIVE_MS`] of `now`
/// and no node of the same name started after its last beat: a restarted node (same name, or the
/// default host:port, which only one live process can hold) replaces the one it restarts at once,
/// rather than listing a killed process as alive for three more beats. Two live processes that
/// share a name by mistake both keep beating after each other's start, so both stay alive.
pub(crate) fn node_records(rows: Vec<NodeRow>, now: i64) -> Vec<crate::NodeRecord> {
    let starts: Vec<(String, i64)> = rows.iter().map(|r| (r.1.clone(), r.4)).collect();
    rows.into_iter()
        .map(|(id, name, role, version, started_at, heartbeat_at, busy, draining, address)| {
            let replaced = starts.iter().any(|(n, s)| *n == name && *s > started_at && *s > heartbeat_at);
            let alive = heartbeat_at >= now - crate::NODE_ALIVE_MS && !replaced;
            crate::NodeRecord { id, name, role, version, started_at, heartbeat_at, busy, draining, alive, address }
        })
        .collect()
}

/// The bytes a dataset's row holds: the file, or nothing when the blob store has it.
pub(crate) fn inline_bytes(data: &crate::DatasetData) -> &[u8] {
    match data {
        crate::DatasetData::Inline(b) => b,
        crate::DatasetData::Blob { .. } => &[],
    }
}

pub(crate) fn blob_key(data: &crate::DatasetData) -> Option<&str> {
    match data {
        crate::DatasetData::Inline(_) => None,
        crate::DatasetData::Blob { key, .. } => Some(key),
    }
}

/// A dataset row's `data`, `blob_key` and `size_bytes` as where its bytes are.
pub(crate) fn dataset_data(data: Vec<u8>, blob_key: Option<String>, size: i64) -> crate::DatasetData {
    match blob_key {
        Some(key) => crate::DatasetData::Blob { key, size },
        None => crate::DatasetData::Inline(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, name: &str, started_at: i64, heartbeat_at: i64) -> NodeRow {
        (id.into(), name.into(), "trainer".into(), "0".into(), started_at, heartbeat_at, false, false, String::new())
    }

    fn alive(rows: Vec<NodeRow>, now: i64) -> Vec<(String, bool)> {
        node_records(rows, now).into_iter().map(|n| (n.id, n.alive)).collect()
    }

    #[test]
    fn a_restarted_node_replaces_the_one_it_restarts() {
        // Killed at 10 s (last beat), restarted under its name at 12 s, listed at 14 s: the old
        // row's beat is recent, but a node of its name started after it.
        let rows = vec![row("old", "t2", 0, 10_000), row("new", "t2", 12_000, 13_000), row("t1", "t1", 0, 13_500)];
        assert_eq!(alive(rows, 14_000), [("old".into(), false), ("new".into(), true), ("t1".into(), true)]);
    }

    #[test]
    fn two_live_nodes_sharing_a_name_both_stay_alive() {
        // Both beat after the other started: neither replaced the other.
        let rows = vec![row("a", "x", 0, 13_000), row("b", "x", 12_000, 13_500)];
        assert_eq!(alive(rows, 14_000), [("a".into(), true), ("b".into(), true)]);
    }

    #[test]
    fn silence_for_three_beats_is_gone() {
        let now = 100_000;
        let rows = vec![row("a", "a", 0, now - crate::NODE_ALIVE_MS), row("b", "b", 0, now - crate::NODE_ALIVE_MS - 1)];
        assert_eq!(alive(rows, now), [("a".into(), true), ("b".into(), false)]);
    }
}
