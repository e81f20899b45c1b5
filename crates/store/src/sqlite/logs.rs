//! Trajectory logs in SQLite: a log lands at the model's latest step and its metrics merge into
//! that checkpoint's, in one write.

use super::{cursor_seq, latest_step, rows, seq_clause};
use crate::{now_ms, NewLog, Result, StoreError};
use sqlx::{Sqlite, SqlitePool, Transaction};
use tandem_core::records::{LogEntry, Page, PageRequest};
use uuid::Uuid;

/// A log's columns as stored, and what they count against the entity.
pub(crate) struct Encoded {
    groups: String,
    metrics: String,
}

impl Encoded {
    pub(crate) fn of(new: &NewLog) -> Result<Self> {
        let groups = serde_json::to_string(&new.trajectory_groups).map_err(|e| StoreError::Database(e.to_string()))?;
        Ok(Encoded { groups, metrics: rows::metrics_text(&new.metrics) })
    }

    pub(crate) fn size(&self) -> i64 {
        (self.groups.len() + self.metrics.len()) as i64
    }
}

pub(crate) async fn append(
    tx: &mut Transaction<'_, Sqlite>,
    new: &NewLog,
    entity: &str,
    encoded: Encoded,
    quota: Option<i64>,
) -> Result<LogEntry> {
    let size = encoded.size();
    let Encoded { groups, metrics } = encoded;
    let step = latest_step(&mut **tx, new.model_id).await?;
    let row = sqlx::query(
        "INSERT INTO trajectory_logs (id, model_id, split, step, metrics, num_groups, num_trajectories, trajectory_groups, created_at, size_bytes)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING *",
    )
    .bind(tandem_core::new_id().to_string())
    .bind(new.model_id.to_string())
    .bind(&new.split)
    .bind(step)
    .bind(metrics)
    .bind(new.num_groups)
    .bind(new.num_trajectories)
    .bind(groups)
    .bind(now_ms())
    .bind(size)
    .fetch_one(&mut **tx)
    .await?;
    if step > 0 {
        // Later logs at the same step overwrite equal keys, as a history row would.
        let cp = sqlx::query("SELECT metrics FROM checkpoints WHERE model_id = ? AND step = ? AND deleted_at IS NULL")
            .bind(new.model_id.to_string())
            .bind(step)
            .fetch_one(&mut **tx)
            .await?;
        let mut metrics = rows::metrics(&cp, "metrics")?;
        metrics.extend(new.metrics.iter().map(|(k, v)| (k.clone(), *v)));
        sqlx::query("UPDATE checkpoints SET metrics = ? WHERE model_id = ? AND step = ? AND deleted_at IS NULL")
            .bind(rows::metrics_text(&metrics))
            .bind(new.model_id.to_string())
            .bind(step)
            .execute(&mut **tx)
            .await?;
    }
    let entry = rows::log_entry(&row)?;
    super::storage::charge(tx, entity, size, quota).await?;
    Ok(entry)
}

pub(crate) async fn list(
    pool: &SqlitePool,
    model_id: Uuid,
    split: Option<&str>,
    page: PageRequest,
) -> Result<Page<LogEntry>> {
    let (cmp, order) = seq_clause(page.order);
    let after = match page.after {
        Some(a) => Some(cursor_seq(pool, "trajectory_logs", "model_id", &model_id.to_string(), a).await?),
        None => None,
    };
    let sql = format!(
        "SELECT id, model_id, split, step, metrics, num_groups, num_trajectories, created_at FROM trajectory_logs
         WHERE model_id = ? AND (? IS NULL OR split = ?) AND (? IS NULL OR {cmp}) ORDER BY {order} LIMIT ?"
    );
    let rows = sqlx::query(&sql)
        .bind(model_id.to_string())
        .bind(split)
        .bind(split)
        .bind(after)
        .bind(after)
        .bind(page.limit as i64 + 1)
        .fetch_all(pool)
        .await?;
    let items = rows.iter().map(rows::log_entry).collect::<Result<Vec<_>>>()?;
    Ok(rows::page(items, page.limit))
}
