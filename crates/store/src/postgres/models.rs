//! API keys and models in PostgreSQL.

use super::{has_nul, lock_key, rows};
use crate::{now_ms, ApiKeyRecord, DeletedModel, ModelSummary, NewModel, Result, StoreError};
use sqlx::{PgPool, Row};
use std::collections::BTreeMap;
use tandem_core::records::ModelRecord;
use uuid::Uuid;

pub(crate) async fn insert_key(pool: &PgPool, key: &ApiKeyRecord) -> Result<()> {
    sqlx::query("INSERT INTO api_keys (id, entity, key_hash, prefix, created_at) VALUES ($1, $2, $3, $4, $5)")
        .bind(key.id.to_string())
        .bind(&key.entity)
        .bind(key.key_hash.as_slice())
        .bind(&key.prefix)
        .bind(key.created_at)
        .execute(pool)
        .await?;
    Ok(())
}

pub(crate) async fn find_active_key(pool: &PgPool, key_hash: &[u8; 32]) -> Result<Option<ApiKeyRecord>> {
    let row = sqlx::query("SELECT * FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL")
        .bind(key_hash.as_slice())
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(rows::key).transpose()
}

pub(crate) async fn list_keys(pool: &PgPool) -> Result<Vec<ApiKeyRecord>> {
    // Byte order of ids, as SQLite sorts text, whatever the database's collation.
    let rows = sqlx::query("SELECT * FROM api_keys ORDER BY created_at, id COLLATE \"C\"").fetch_all(pool).await?;
    rows.iter().map(rows::key).collect()
}

pub(crate) async fn revoke_key(pool: &PgPool, id_or_prefix: &str) -> Result<ApiKeyRecord> {
    if has_nul(&[Some(id_or_prefix)]) {
        return Err(StoreError::NotFound);
    }
    let mut tx = pool.begin().await?;
    let found = sqlx::query("SELECT * FROM api_keys WHERE id = $1 OR prefix = $1 FOR UPDATE")
        .bind(id_or_prefix)
        .fetch_all(&mut *tx)
        .await?;
    let key = match found.as_slice() {
        [] => return Err(StoreError::NotFound),
        [one] => rows::key(one)?,
        _ => return Err(StoreError::Conflict(format!("several keys match {id_or_prefix}; use the id"))),
    };
    sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2")
        .bind(now_ms())
        .bind(key.id.to_string())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(ApiKeyRecord { revoked_at: Some(key.revoked_at.unwrap_or_else(now_ms)), ..key })
}

pub(crate) async fn create_model(
    pool: &PgPool,
    new: &NewModel,
    return_existing: bool,
    quota: Option<i64>,
) -> Result<(ModelRecord, bool)> {
    let id = tandem_core::new_id();
    let b = id.as_bytes();
    // Eight hex digits for a run id, taken from the random bits of a fresh UUIDv7.
    let run_id = format!("{:08x}", u32::from_be_bytes([b[12], b[13], b[14], b[15]]));
    let mut tx = pool.begin().await?;
    // The entity's models list pages by `seq`: see the module comment of `postgres`.
    lock_key(&mut tx, "models", &new.entity).await?;
    // ON CONFLICT rather than catching the unique violation, which would abort the transaction.
    let inserted = sqlx::query(
        "INSERT INTO models (id, entity, project, name, base_model, run_id, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (entity, project, name) DO NOTHING RETURNING *",
    )
    .bind(id.to_string())
    .bind(&new.entity)
    .bind(&new.project)
    .bind(&new.name)
    .bind(&new.base_model)
    .bind(run_id)
    .bind(now_ms())
    .fetch_optional(&mut *tx)
    .await?;
    let out = match inserted {
        Some(row) => {
            super::storage::charge(&mut tx, &new.entity, crate::MODEL_ROW_BYTES, quota).await?;
            (rows::model(&row)?, true)
        }
        None if return_existing => {
            let row = sqlx::query("SELECT * FROM models WHERE entity = $1 AND project = $2 AND name = $3")
                .bind(&new.entity)
                .bind(&new.project)
                .bind(&new.name)
                .fetch_one(&mut *tx)
                .await?;
            (rows::model(&row)?, false)
        }
        None => {
            return Err(StoreError::Conflict(format!(
                "model {}/{}/{} already exists",
                new.entity, new.project, new.name
            )))
        }
    };
    tx.commit().await?;
    Ok(out)
}

pub(crate) async fn delete_model(pool: &PgPool, entity: &str, id: Uuid) -> Result<DeletedModel> {
    let mut tx = pool.begin().await?;
    // Locked first: a job's transitions lock the model before the job, so this cannot deadlock
    // with them, and no checkpoint can be added between the read and the delete.
    sqlx::query("SELECT id FROM models WHERE id = $1 AND entity = $2 FOR UPDATE")
        .bind(id.to_string())
        .bind(entity)
        .fetch_one(&mut *tx)
        .await?;
    let live = sqlx::query("SELECT * FROM checkpoints WHERE model_id = $1 AND deleted_at IS NULL ORDER BY step")
        .bind(id.to_string())
        .fetch_all(&mut *tx)
        .await?;
    let deleted_checkpoints = live.iter().map(rows::checkpoint).collect::<Result<Vec<_>>>()?;
    let freed = super::storage::model_bytes(&mut tx, id).await?;
    sqlx::query("DELETE FROM models WHERE id = $1").bind(id.to_string()).execute(&mut *tx).await?;
    super::storage::release(&mut tx, entity, freed).await?;
    tx.commit().await?;
    Ok(DeletedModel { model_id: id, deleted_checkpoints })
}

pub(crate) async fn model_summary(pool: &PgPool, model_id: Uuid) -> Result<ModelSummary> {
    // Each sub-query reads one model's rows through an index on model_id: live checkpoints
    // through the partial (model_id, step) one, jobs and logs through (model_id, seq). A job's
    // reward counts once it runs or succeeded, as on the history's curve.
    let row = sqlx::query(
        "SELECT
           (SELECT MAX(step) FROM checkpoints WHERE model_id = $1 AND deleted_at IS NULL) AS latest_step,
           (SELECT MAX(created_at) FROM checkpoints WHERE model_id = $1 AND deleted_at IS NULL) AS checkpoint_at,
           (SELECT created_at FROM training_jobs WHERE model_id = $1 ORDER BY seq DESC LIMIT 1) AS job_at,
           jm.created_at AS job_metrics_at, jm.rollout_metrics AS job_metrics,
           lm.created_at AS log_metrics_at, lm.metrics AS log_metrics
         FROM (SELECT 1) AS one
         LEFT JOIN LATERAL (
             SELECT created_at, rollout_metrics FROM training_jobs
             WHERE model_id = $1 AND rollout_metrics IS NOT NULL AND status IN ('running', 'succeeded')
             ORDER BY seq DESC LIMIT 1) AS jm ON TRUE
         LEFT JOIN LATERAL (
             SELECT created_at, metrics FROM trajectory_logs WHERE model_id = $1 ORDER BY seq DESC LIMIT 1) AS lm ON TRUE",
    )
    .bind(model_id.to_string())
    .fetch_one(pool)
    .await?;
    let timed = |col: &str| -> Result<Option<(i64, BTreeMap<String, f64>)>> {
        let Some(text) = row.try_get::<Option<String>, _>(col)? else { return Ok(None) };
        let at: i64 = row.try_get(format!("{col}_at").as_str())?;
        Ok(Some((at, crate::codec::parse_metrics(&text, col)?)))
    };
    let job_metrics = timed("job_metrics")?;
    let log_metrics = timed("log_metrics")?;
    let times = [
        row.try_get::<Option<i64>, _>("checkpoint_at")?,
        row.try_get::<Option<i64>, _>("job_at")?,
        log_metrics.as_ref().map(|(at, _)| *at),
    ];
    Ok(ModelSummary {
        latest_step: row.try_get::<Option<i64>, _>("latest_step")?.unwrap_or(0),
        last_activity: times.into_iter().flatten().max(),
        job_metrics,
        log_metrics,
    })
}
