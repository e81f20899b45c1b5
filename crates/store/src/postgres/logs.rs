//! Checkpoints and trajectory logs in PostgreSQL: the writes that read the model's latest step
//! hold the model's row lock, so the step they read is still the latest when they commit.

use super::{has_nul, lock_model, rows, seq_clause};
use crate::{now_ms, DeletedCheckpoints, NewLog, Result, StoreError};
use sqlx::{PgPool, Row};
use tandem_core::records::{Checkpoint, LogEntry, Order, Page, PageRequest};
use uuid::Uuid;

pub(crate) async fn latest_step<'e, E: sqlx::PgExecutor<'e>>(ex: E, model_id: Uuid) -> Result<i64> {
    let row = sqlx::query("SELECT COALESCE(MAX(step), 0) FROM checkpoints WHERE model_id = $1 AND deleted_at IS NULL")
        .bind(model_id.to_string())
        .fetch_one(ex)
        .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

pub(crate) async fn list_checkpoints(pool: &PgPool, model_id: Uuid, page: PageRequest) -> Result<Page<Checkpoint>> {
    // Ordered by step; a cursor may name a deleted checkpoint (its tombstone keeps its step).
    let cursor = match page.after {
        Some(a) => {
            let row = sqlx::query("SELECT step, seq FROM checkpoints WHERE id = $1 AND model_id = $2")
                .bind(a.to_string())
                .bind(model_id.to_string())
                .fetch_optional(pool)
                .await?
                .ok_or(StoreError::InvalidCursor)?;
            Some((row.try_get::<i64, _>(0)?, row.try_get::<i64, _>(1)?))
        }
        None => None,
    };
    let (cmp, order) = match page.order {
        Order::Asc => ("(step > $2 OR (step = $2 AND seq > $3))", "step ASC, seq ASC"),
        Order::Desc => ("(step < $2 OR (step = $2 AND seq < $3))", "step DESC, seq DESC"),
    };
    let (step, seq) = cursor.unzip();
    let sql = format!(
        "SELECT * FROM checkpoints WHERE model_id = $1 AND deleted_at IS NULL AND ($2::bigint IS NULL OR {cmp})
         ORDER BY {order} LIMIT $4"
    );
    let rows = sqlx::query(&sql)
        .bind(model_id.to_string())
        .bind(step)
        .bind(seq)
        .bind(page.limit as i64 + 1)
        .fetch_all(pool)
        .await?;
    let items = rows.iter().map(rows::checkpoint).collect::<Result<Vec<_>>>()?;
    Ok(rows::page(items, page.limit))
}

pub(crate) async fn delete_checkpoints(pool: &PgPool, model_id: Uuid, steps: &[i64]) -> Result<DeletedCheckpoints> {
    let mut unique: Vec<i64> = steps.to_vec();
    unique.sort_unstable();
    unique.dedup();
    let mut tx = pool.begin().await?;
    // Not an error when the model is gone: every step is then not found, as in SQLite.
    lock_model(&mut tx, model_id).await?;
    let mut out = DeletedCheckpoints { deleted: Vec::new(), not_found_steps: Vec::new() };
    let mut freed = 0;
    for step in unique {
        let row = sqlx::query(
            "UPDATE checkpoints SET deleted_at = $1 WHERE model_id = $2 AND step = $3 AND deleted_at IS NULL
             RETURNING *",
        )
        .bind(now_ms())
        .bind(model_id.to_string())
        .bind(step)
        .fetch_optional(&mut *tx)
        .await?;
        match row {
            Some(r) => {
                freed += r.try_get::<i64, _>("size_bytes")?;
                out.deleted.push(rows::checkpoint(&r)?);
            }
            None => out.not_found_steps.push(step),
        }
    }
    if freed > 0 {
        let entity = super::storage::model_entity(&mut tx, model_id).await?;
        super::storage::release(&mut tx, &entity, freed).await?;
    }
    tx.commit().await?;
    Ok(out)
}

pub(crate) async fn import_checkpoint(
    pool: &PgPool,
    model_id: Uuid,
    id: Uuid,
    path: &str,
    size_bytes: i64,
    quota: Option<i64>,
) -> Result<Checkpoint> {
    let mut tx = pool.begin().await?;
    // Under the model's lock no job of it can be created, and no other import take the same step,
    // between the check and the insert.
    if !lock_model(&mut tx, model_id).await? {
        return Err(StoreError::NotFound);
    }
    // A queued job's rollouts were sampled from the current latest step, and it trains from
    // whatever is latest when it starts: an import in between would become its base.
    let pending =
        sqlx::query("SELECT 1 FROM training_jobs WHERE model_id = $1 AND status IN ('queued', 'running') LIMIT 1")
            .bind(model_id.to_string())
            .fetch_optional(&mut *tx)
            .await?;
    if pending.is_some() {
        return Err(StoreError::Conflict(
            "a training job of this model is queued or running; import when it has ended".into(),
        ));
    }
    let step = latest_step(&mut *tx, model_id).await? + 1;
    let row = sqlx::query(
        "INSERT INTO checkpoints (id, model_id, step, path, metrics, created_at, size_bytes)
         VALUES ($1, $2, $3, $4, '{}', $5, $6) RETURNING *",
    )
    .bind(id.to_string())
    .bind(model_id.to_string())
    .bind(step)
    .bind(path)
    .bind(now_ms())
    .bind(size_bytes)
    .fetch_one(&mut *tx)
    .await?;
    let checkpoint = rows::checkpoint(&row)?;
    super::notify::notify(&mut tx, super::notify::CHECKPOINTS, path).await?;
    super::storage::charge_model(&mut tx, model_id, size_bytes, quota).await?;
    tx.commit().await?;
    Ok(checkpoint)
}

pub(crate) async fn append_log(pool: &PgPool, new: &NewLog, quota: Option<i64>) -> Result<LogEntry> {
    let groups = rows::text(&new.trajectory_groups)?;
    let metrics = rows::metrics_text(&new.metrics);
    let size = (groups.len() + metrics.len()) as i64;
    // A refused log is refused before its rows are written (see `storage::precheck`).
    let entity = super::storage::precheck_model(&mut *pool.acquire().await?, new.model_id, size, quota).await?;
    let mut tx = pool.begin().await?;
    // The model's lock keeps its logs' `seq` in commit order and makes the merge into the
    // checkpoint's metrics below a read-modify-write no other log interleaves with.
    if !lock_model(&mut tx, new.model_id).await? {
        return Err(StoreError::NotFound);
    }
    let step = latest_step(&mut *tx, new.model_id).await?;
    let row = sqlx::query(
        "INSERT INTO trajectory_logs (id, model_id, split, step, metrics, num_groups, num_trajectories,
                                      trajectory_groups, created_at, size_bytes)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING *",
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
    .fetch_one(&mut *tx)
    .await?;
    if step > 0 {
        // Later logs at the same step overwrite equal keys, as a history row would.
        let cp = sqlx::query(
            "SELECT metrics FROM checkpoints WHERE model_id = $1 AND step = $2 AND deleted_at IS NULL FOR UPDATE",
        )
        .bind(new.model_id.to_string())
        .bind(step)
        .fetch_one(&mut *tx)
        .await?;
        let mut metrics = rows::metrics(&cp, "metrics")?;
        metrics.extend(new.metrics.iter().map(|(k, v)| (k.clone(), *v)));
        sqlx::query("UPDATE checkpoints SET metrics = $1 WHERE model_id = $2 AND step = $3 AND deleted_at IS NULL")
            .bind(rows::metrics_text(&metrics))
            .bind(new.model_id.to_string())
            .bind(step)
            .execute(&mut *tx)
            .await?;
    }
    super::storage::charge(&mut tx, &entity, size, quota).await?;
    tx.commit().await?;
    rows::log_entry(&row)
}

pub(crate) async fn list_logs(
    pool: &PgPool,
    model_id: Uuid,
    split: Option<&str>,
    page: PageRequest,
) -> Result<Page<LogEntry>> {
    let (cmp, order) = seq_clause(page.order, 3);
    let after = match page.after {
        Some(a) => Some(super::cursor_seq(pool, "trajectory_logs", "model_id", &model_id.to_string(), a).await?),
        None => None,
    };
    if has_nul(&[split]) {
        return Ok(Page { items: Vec::new(), has_more: false });
    }
    let sql = format!(
        "SELECT id, model_id, split, step, metrics, num_groups, num_trajectories, created_at FROM trajectory_logs
         WHERE model_id = $1 AND ($2::text IS NULL OR split = $2) AND ($3::bigint IS NULL OR {cmp})
         ORDER BY {order} LIMIT $4"
    );
    let rows = sqlx::query(&sql)
        .bind(model_id.to_string())
        .bind(split)
        .bind(after)
        .bind(page.limit as i64 + 1)
        .fetch_all(pool)
        .await?;
    let items = rows.iter().map(rows::log_entry).collect::<Result<Vec<_>>>()?;
    Ok(rows::page(items, page.limit))
}
