//! The SQLite backend: one file in the data directory, WAL mode, `synchronous=FULL` (an
//! acknowledged write survives power loss), foreign keys on, migrations embedded in the binary.
//!
//! Multi-statement writes open `BEGIN IMMEDIATE` so that they take the write lock up front and
//! wait on the busy timeout, instead of failing on a lock upgrade when another process (the
//! `tandem keys` command) writes at the same time.

mod datasets;
mod jobs;
mod logs;
mod nodes;
mod responses;
mod rows;
mod storage;
mod tinker;

use crate::errors::SQLITE_ACQUIRE_TIMEOUT;
use crate::{
    now_ms, ApiKeyRecord, DeletedCheckpoints, DeletedModel, NewLog, NewModel, PoolSettings, Result, StoreError,
};
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, Row, SqlitePool};
use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;
use tandem_core::history::GradientStepRow;
use tandem_core::records::{Checkpoint, JobKind, JobStatus, LogEntry, ModelRecord, Order, Page, PageRequest};
use uuid::Uuid;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Connections by default: WAL lets readers run beside the one writer; more than a few only
/// queue on SQLite's write lock and hold file descriptors.
pub const POOL_SIZE: u32 = 4;

/// How every connection to the database file is opened.
fn connect_options(path: &Path) -> Result<SqliteConnectOptions> {
    Ok(SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(10)))
}

fn pool_options(settings: PoolSettings) -> SqlitePoolOptions {
    SqlitePoolOptions::new()
        .max_connections(settings.size.unwrap_or(POOL_SIZE).max(1))
        .acquire_timeout(settings.acquire_timeout.unwrap_or(SQLITE_ACQUIRE_TIMEOUT))
        // On a full disk SQLite rolls a failed statement or COMMIT back by itself; sqlx still
        // counts the transaction as open, its ROLLBACK then fails, and the connection would
        // refuse every later BEGIN ("non-zero transaction depth"). Found by R17: every pooled
        // connection ended up so, and writes never recovered when space returned. The ping runs
        // every command queued before it (a dropped transaction's rollback), so a connection
        // still inside a transaction after it is broken: it is closed and the pool opens another.
        .after_release(|conn, _| {
            Box::pin(async move {
                conn.ping().await?;
                Ok(!conn.is_in_transaction())
            })
        })
}

/// The default store: SQLite through sqlx.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// `--storage-quota-mib` in bytes: the quota of entities without one of their own.
    storage_quota: Option<i64>,
}

impl SqliteStore {
    /// The pool, for `copy` (which works below the `Store` methods).
    pub(crate) fn pool(&self) -> SqlitePool {
        self.pool.clone()
    }

    /// Holds entities without a quota of their own to `bytes` of stored data (`None`: no quota).
    pub fn with_storage_quota(mut self, bytes: Option<i64>) -> Self {
        self.storage_quota = bytes;
        self
    }

    /// Opens (creating if needed) the database file and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<Self> {
        Self::open_with_pool(path, PoolSettings::default()).await
    }

    /// [`SqliteStore::open`] with the pool's size (`--db-pool-size`) and acquire timeout
    /// (`--db-acquire-timeout`) where `pool` sets them.
    pub async fn open_with_pool(path: &Path, pool: PoolSettings) -> Result<Self> {
        let pool = pool_options(pool).connect_with(connect_options(path)?).await?;
        MIGRATOR.run(&pool).await.map_err(|e| StoreError::Database(e.to_string()))?;
        Ok(SqliteStore { pool, storage_quota: None })
    }

    /// An in-memory database, for tests. One connection, since each would be its own database.
    pub async fn in_memory() -> Result<Self> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")?.foreign_keys(true);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await?;
        MIGRATOR.run(&pool).await.map_err(|e| StoreError::Database(e.to_string()))?;
        Ok(SqliteStore { pool, storage_quota: None })
    }

    async fn write_tx(&self) -> Result<sqlx::Transaction<'_, sqlx::Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Closes every connection; later calls fail (health checks and shutdown tests use it).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// `PRAGMA integrity_check`, for crash tests.
    pub async fn integrity_check(&self) -> Result<String> {
        let row = sqlx::query("PRAGMA integrity_check").fetch_one(&self.pool).await?;
        Ok(row.try_get::<String, _>(0)?)
    }
}

/// Resolves a cursor id to its `seq` within one list, or `InvalidCursor`.
async fn cursor_seq(pool: &SqlitePool, table: &str, scope_col: &str, scope: &str, after: Uuid) -> Result<i64> {
    let sql = format!("SELECT seq FROM {table} WHERE id = ? AND {scope_col} = ?");
    let row = sqlx::query(&sql).bind(after.to_string()).bind(scope).fetch_optional(pool).await?;
    row.map(|r| r.get::<i64, _>(0)).ok_or(StoreError::InvalidCursor)
}

/// One page of an entity's rows of `table` (optionally of one project), in `seq` order after the
/// page's cursor: the listing of models and of datasets.
async fn entity_page<T>(
    pool: &SqlitePool,
    table: &str,
    columns: &str,
    (entity, project, search): (&str, Option<&str>, Option<&str>),
    page: PageRequest,
    decode: fn(&sqlx::sqlite::SqliteRow) -> Result<T>,
) -> Result<Page<T>> {
    let (cmp, order) = seq_clause(page.order);
    let after = match page.after {
        Some(a) => Some(cursor_seq(pool, table, "entity", entity, a).await?),
        None => None,
    };
    let sql = format!(
        "SELECT {columns} FROM {table} WHERE entity = ? AND (? IS NULL OR project = ?)
           AND (? IS NULL OR instr(lower(project || '/' || name), lower(?)) > 0) AND (? IS NULL OR {cmp})
         ORDER BY {order} LIMIT ?"
    );
    // `instr`, not LIKE: a search text is matched literally (no wildcards to escape).
    let rows = sqlx::query(&sql)
        .bind(entity)
        .bind(project)
        .bind(project)
        .bind(search)
        .bind(search)
        .bind(after)
        .bind(after)
        .bind(page.limit as i64 + 1)
        .fetch_all(pool)
        .await?;
    let items = rows.iter().map(decode).collect::<Result<Vec<_>>>()?;
    Ok(rows::page(items, page.limit))
}

fn seq_clause(order: Order) -> (&'static str, &'static str) {
    match order {
        Order::Asc => ("seq > ?", "seq ASC"),
        Order::Desc => ("seq < ?", "seq DESC"),
    }
}

#[async_trait::async_trait]
impl crate::Store for SqliteStore {
    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").fetch_one(&self.pool).await?;
        Ok(())
    }

    fn single_process(&self) -> bool {
        true
    }

    async fn notices(&self) -> Result<Option<tokio::sync::mpsc::Receiver<crate::Notice>>> {
        Ok(None)
    }

    async fn insert_key(&self, key: &ApiKeyRecord) -> Result<()> {
        sqlx::query("INSERT INTO api_keys (id, entity, key_hash, prefix, created_at) VALUES (?, ?, ?, ?, ?)")
            .bind(key.id.to_string())
            .bind(&key.entity)
            .bind(key.key_hash.as_slice())
            .bind(&key.prefix)
            .bind(key.created_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn find_active_key(&self, key_hash: &[u8; 32]) -> Result<Option<ApiKeyRecord>> {
        let row = sqlx::query("SELECT * FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL")
            .bind(key_hash.as_slice())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(rows::key).transpose()
    }

    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>> {
        let rows = sqlx::query("SELECT * FROM api_keys ORDER BY created_at, id").fetch_all(&self.pool).await?;
        rows.iter().map(rows::key).collect()
    }

    async fn revoke_key(&self, id_or_prefix: &str) -> Result<ApiKeyRecord> {
        let mut tx = self.write_tx().await?;
        let found = sqlx::query("SELECT * FROM api_keys WHERE id = ? OR prefix = ?")
            .bind(id_or_prefix)
            .bind(id_or_prefix)
            .fetch_all(&mut *tx)
            .await?;
        let key = match found.as_slice() {
            [] => return Err(StoreError::NotFound),
            [one] => rows::key(one)?,
            _ => return Err(StoreError::Conflict(format!("several keys match {id_or_prefix}; use the id"))),
        };
        sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?")
            .bind(now_ms())
            .bind(key.id.to_string())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(ApiKeyRecord { revoked_at: Some(key.revoked_at.unwrap_or_else(now_ms)), ..key })
    }

    async fn create_model(&self, new: &NewModel, return_existing: bool) -> Result<(ModelRecord, bool)> {
        let id = tandem_core::new_id();
        let run_id = format!("{:08x}", rand_u32(id));
        let mut tx = self.write_tx().await?;
        let inserted = sqlx::query(
            "INSERT INTO models (id, entity, project, name, base_model, run_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING *",
        )
        .bind(id.to_string())
        .bind(&new.entity)
        .bind(&new.project)
        .bind(&new.name)
        .bind(&new.base_model)
        .bind(run_id)
        .bind(now_ms())
        .fetch_one(&mut *tx)
        .await;
        match inserted.map_err(StoreError::from) {
            Ok(row) => {
                let model = rows::model(&row)?;
                storage::charge(&mut tx, &new.entity, crate::MODEL_ROW_BYTES, self.storage_quota).await?;
                tx.commit().await?;
                Ok((model, true))
            }
            Err(StoreError::Conflict(_)) if return_existing => {
                // Read in the write transaction: a pool of one connection (in memory) has no other.
                let row = sqlx::query("SELECT * FROM models WHERE entity = ? AND project = ? AND name = ?")
                    .bind(&new.entity)
                    .bind(&new.project)
                    .bind(&new.name)
                    .fetch_one(&mut *tx)
                    .await?;
                Ok((rows::model(&row)?, false))
            }
            Err(StoreError::Conflict(_)) => {
                Err(StoreError::Conflict(format!("model {}/{}/{} already exists", new.entity, new.project, new.name)))
            }
            Err(e) => Err(e),
        }
    }

    async fn model_by_id(&self, id: Uuid) -> Result<ModelRecord> {
        let row = sqlx::query("SELECT * FROM models WHERE id = ?").bind(id.to_string()).fetch_one(&self.pool).await?;
        rows::model(&row)
    }

    async fn get_model(&self, entity: &str, id: Uuid) -> Result<ModelRecord> {
        let row = sqlx::query("SELECT * FROM models WHERE id = ? AND entity = ?")
            .bind(id.to_string())
            .bind(entity)
            .fetch_one(&self.pool)
            .await?;
        rows::model(&row)
    }

    async fn find_model(&self, entity: &str, project: &str, name: &str) -> Result<ModelRecord> {
        let row = sqlx::query("SELECT * FROM models WHERE entity = ? AND project = ? AND name = ?")
            .bind(entity)
            .bind(project)
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        rows::model(&row)
    }

    async fn list_models(
        &self,
        entity: &str,
        project: Option<&str>,
        search: Option<&str>,
        page: PageRequest,
    ) -> Result<Page<ModelRecord>> {
        entity_page(&self.pool, "models", "*", (entity, project, search), page, rows::model).await
    }

    async fn model_summary(&self, model_id: Uuid) -> Result<crate::ModelSummary> {
        // Each sub-query reads one model's rows through an index on model_id: live checkpoints
        // through the partial (model_id, step) one, jobs and logs through (model_id, seq). A job's
        // reward counts once it runs or succeeded, as on the history's curve.
        let row = sqlx::query(
            "SELECT
               (SELECT MAX(step) FROM checkpoints WHERE model_id = ? AND deleted_at IS NULL) AS latest_step,
               (SELECT MAX(created_at) FROM checkpoints WHERE model_id = ? AND deleted_at IS NULL) AS checkpoint_at,
               (SELECT created_at FROM training_jobs WHERE model_id = ? ORDER BY seq DESC LIMIT 1) AS job_at,
               (SELECT created_at || ' ' || rollout_metrics FROM training_jobs
                 WHERE model_id = ? AND rollout_metrics IS NOT NULL AND status IN ('running', 'succeeded')
                 ORDER BY seq DESC LIMIT 1) AS job_metrics,
               (SELECT created_at || ' ' || metrics FROM trajectory_logs
                 WHERE model_id = ? ORDER BY seq DESC LIMIT 1) AS log_metrics",
        )
        .bind(model_id.to_string())
        .bind(model_id.to_string())
        .bind(model_id.to_string())
        .bind(model_id.to_string())
        .bind(model_id.to_string())
        .fetch_one(&self.pool)
        .await?;
        // "<unix ms> <metrics JSON>"
        let timed = |col: &str| -> Result<Option<(i64, BTreeMap<String, f64>)>> {
            let Some(text) = row.try_get::<Option<String>, _>(col)? else { return Ok(None) };
            let bad = || StoreError::Database(format!("unreadable {col}"));
            let (at, json) = text.split_once(' ').ok_or_else(bad)?;
            Ok(Some((at.parse().map_err(|_| bad())?, serde_json::from_str(json).map_err(|_| bad())?)))
        };
        let job_metrics = timed("job_metrics")?;
        let log_metrics = timed("log_metrics")?;
        let times = [
            row.try_get::<Option<i64>, _>("checkpoint_at")?,
            row.try_get::<Option<i64>, _>("job_at")?,
            log_metrics.as_ref().map(|(at, _)| *at),
        ];
        Ok(crate::ModelSummary {
            latest_step: row.try_get::<Option<i64>, _>("latest_step")?.unwrap_or(0),
            last_activity: times.into_iter().flatten().max(),
            job_metrics,
            log_metrics,
        })
    }

    async fn delete_model(&self, entity: &str, id: Uuid) -> Result<DeletedModel> {
        let mut tx = self.write_tx().await?;
        sqlx::query("SELECT id FROM models WHERE id = ? AND entity = ?")
            .bind(id.to_string())
            .bind(entity)
            .fetch_one(&mut *tx)
            .await?;
        let live = sqlx::query("SELECT * FROM checkpoints WHERE model_id = ? AND deleted_at IS NULL ORDER BY step")
            .bind(id.to_string())
            .fetch_all(&mut *tx)
            .await?;
        let deleted_checkpoints = live.iter().map(rows::checkpoint).collect::<Result<Vec<_>>>()?;
        let freed = storage::model_bytes(&mut tx, id).await?;
        sqlx::query("DELETE FROM models WHERE id = ?").bind(id.to_string()).execute(&mut *tx).await?;
        storage::release(&mut tx, entity, freed).await?;
        tx.commit().await?;
        Ok(DeletedModel { model_id: id, deleted_checkpoints })
    }

    async fn list_checkpoints(&self, model_id: Uuid, page: PageRequest) -> Result<Page<Checkpoint>> {
        // Ordered by step; a cursor may name a deleted checkpoint (its tombstone keeps its step).
        let cursor = match page.after {
            Some(a) => {
                let row = sqlx::query("SELECT step, seq FROM checkpoints WHERE id = ? AND model_id = ?")
                    .bind(a.to_string())
                    .bind(model_id.to_string())
                    .fetch_optional(&self.pool)
                    .await?
                    .ok_or(StoreError::InvalidCursor)?;
                Some((row.get::<i64, _>(0), row.get::<i64, _>(1)))
            }
            None => None,
        };
        let (cmp, order) = match page.order {
            Order::Asc => ("(step > ? OR (step = ? AND seq > ?))", "step ASC, seq ASC"),
            Order::Desc => ("(step < ? OR (step = ? AND seq < ?))", "step DESC, seq DESC"),
        };
        let (step, seq) = cursor.unzip();
        let sql = format!(
            "SELECT * FROM checkpoints WHERE model_id = ? AND deleted_at IS NULL AND (? IS NULL OR {cmp}) ORDER BY {order} LIMIT ?"
        );
        let rows = sqlx::query(&sql)
            .bind(model_id.to_string())
            .bind(step)
            .bind(step)
            .bind(step)
            .bind(seq)
            .bind(page.limit as i64 + 1)
            .fetch_all(&self.pool)
            .await?;
        let items = rows.iter().map(rows::checkpoint).collect::<Result<Vec<_>>>()?;
        Ok(rows::page(items, page.limit))
    }

    async fn get_checkpoint(&self, model_id: Uuid, step: i64) -> Result<Checkpoint> {
        let row = sqlx::query("SELECT * FROM checkpoints WHERE model_id = ? AND step = ? AND deleted_at IS NULL")
            .bind(model_id.to_string())
            .bind(step)
            .fetch_one(&self.pool)
            .await?;
        rows::checkpoint(&row)
    }

    async fn latest_step(&self, model_id: Uuid) -> Result<i64> {
        latest_step(&self.pool, model_id).await
    }

    async fn delete_checkpoints(&self, model_id: Uuid, steps: &[i64]) -> Result<DeletedCheckpoints> {
        let mut unique: Vec<i64> = steps.to_vec();
        unique.sort_unstable();
        unique.dedup();
        let mut tx = self.write_tx().await?;
        let mut out = DeletedCheckpoints { deleted: Vec::new(), not_found_steps: Vec::new() };
        let mut freed = 0;
        for step in unique {
            let row = sqlx::query(
                "UPDATE checkpoints SET deleted_at = ? WHERE model_id = ? AND step = ? AND deleted_at IS NULL RETURNING *",
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
            let entity = storage::model_entity(&mut tx, model_id).await?;
            storage::release(&mut tx, &entity, freed).await?;
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn import_checkpoint(&self, model_id: Uuid, id: Uuid, path: &str, size_bytes: i64) -> Result<Checkpoint> {
        let mut tx = self.write_tx().await?;
        // A queued job's rollouts were sampled from the current latest step, and it trains from
        // whatever is latest when it starts: an import in between would become its base.
        let pending =
            sqlx::query("SELECT 1 FROM training_jobs WHERE model_id = ? AND status IN ('queued', 'running') LIMIT 1")
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
             VALUES (?, ?, ?, ?, '{}', ?, ?) RETURNING *",
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
        storage::charge_model(&mut tx, model_id, size_bytes, self.storage_quota).await?;
        tx.commit().await?;
        Ok(checkpoint)
    }

    async fn live_checkpoint_paths(&self) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT path FROM checkpoints WHERE deleted_at IS NULL").fetch_all(&self.pool).await?;
        let mut live: Vec<String> = rows.iter().map(|r| r.get::<String, _>(0)).collect();
        live.extend(tinker::live_blobs(&self.pool).await?);
        Ok(live)
    }

    async fn append_log(&self, new: &NewLog) -> Result<LogEntry> {
        let encoded = logs::Encoded::of(new)?;
        let mut conn = self.pool.acquire().await?;
        let entity = storage::precheck_model(&mut conn, new.model_id, encoded.size(), self.storage_quota).await?;
        drop(conn);
        let mut tx = self.write_tx().await?;
        let entry = logs::append(&mut tx, new, &entity, encoded, self.storage_quota).await?;
        tx.commit().await?;
        Ok(entry)
    }

    async fn list_logs(&self, model_id: Uuid, split: Option<&str>, page: PageRequest) -> Result<Page<LogEntry>> {
        logs::list(&self.pool, model_id, split, page).await
    }

    async fn get_log(&self, model_id: Uuid, log_id: Uuid) -> Result<(LogEntry, Value)> {
        let row = sqlx::query("SELECT * FROM trajectory_logs WHERE id = ? AND model_id = ?")
            .bind(log_id.to_string())
            .bind(model_id.to_string())
            .fetch_one(&self.pool)
            .await?;
        Ok((rows::log_entry(&row)?, rows::json(&row, "trajectory_groups")?))
    }

    async fn create_dataset(&self, new: &crate::NewDataset) -> Result<tandem_core::records::Dataset> {
        datasets::create(&self.pool, new, self.storage_quota).await
    }

    async fn get_dataset(&self, entity: &str, id: Uuid) -> Result<tandem_core::records::Dataset> {
        datasets::get(&self.pool, entity, id).await
    }

    async fn find_dataset(
        &self,
        entity: &str,
        project: &str,
        name: &str,
        version: Option<i64>,
    ) -> Result<tandem_core::records::Dataset> {
        datasets::find(&self.pool, entity, project, name, version).await
    }

    async fn list_datasets(
        &self,
        entity: &str,
        project: Option<&str>,
        page: PageRequest,
    ) -> Result<Page<tandem_core::records::Dataset>> {
        datasets::list(&self.pool, entity, project, page).await
    }

    async fn dataset_data(&self, entity: &str, id: Uuid) -> Result<crate::DatasetData> {
        datasets::data(&self.pool, entity, id).await
    }

    async fn live_dataset_blob_keys(&self) -> Result<Vec<String>> {
        datasets::live_blob_keys(&self.pool).await
    }

    async fn delete_dataset(&self, entity: &str, id: Uuid) -> Result<()> {
        datasets::delete(&self.pool, entity, id).await
    }

    async fn node_heartbeat(&self, beat: &crate::NodeBeat) -> Result<bool> {
        nodes::heartbeat(&self.pool, beat).await
    }

    async fn list_nodes(&self) -> Result<Vec<crate::NodeRecord>> {
        nodes::list(&self.pool, None).await
    }

    async fn set_node_draining(&self, which: &str, draining: bool) -> Result<Vec<crate::NodeRecord>> {
        nodes::set_draining(&self.pool, which, draining).await
    }

    async fn remove_node(&self, id: &str) -> Result<()> {
        nodes::remove(&self.pool, id).await
    }

    async fn storage_usage(&self, entity: &str) -> Result<crate::StorageUsage> {
        self.storage_usage_impl(entity).await
    }

    async fn list_storage(&self) -> Result<Vec<crate::StorageUsage>> {
        self.list_storage_impl().await
    }

    async fn set_storage_quota(&self, entity: &str, quota: crate::EntityQuota) -> Result<()> {
        self.set_storage_quota_impl(entity, quota).await
    }

    fn default_storage_quota(&self) -> Option<i64> {
        self.storage_quota
    }

    async fn put_response(&self, response: &crate::StoredResponse) -> Result<()> {
        responses::put(&self.pool, response, crate::MAX_STORED_RESPONSES, self.storage_quota).await
    }

    async fn get_response(&self, entity: &str, id: &str) -> Result<crate::StoredResponse> {
        responses::get(&self.pool, entity, id).await
    }

    async fn delete_response(&self, entity: &str, id: &str) -> Result<()> {
        responses::delete(&self.pool, entity, id).await
    }

    async fn create_job_capped(
        &self,
        new: &crate::NewJob,
        max_pending: Option<i64>,
    ) -> Result<tandem_core::records::Job> {
        let mut tx = self.write_tx().await?;
        let job = jobs::create_job(&mut tx, new, max_pending, self.storage_quota).await?;
        tx.commit().await?;
        Ok(job)
    }

    async fn pending_jobs(&self, entity: &str) -> Result<i64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM training_jobs j JOIN models m ON m.id = j.model_id
             WHERE m.entity = ? AND j.status IN ('queued', 'running')",
        )
        .bind(entity)
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }

    async fn active_job_counts(&self) -> Result<Vec<(JobKind, JobStatus, i64)>> {
        jobs::active_job_counts(&self.pool).await
    }

    async fn list_jobs(&self, model_id: Uuid, page: PageRequest) -> Result<Page<tandem_core::records::Job>> {
        jobs::list_jobs(&self.pool, model_id, page).await
    }

    async fn gradient_step_history(&self, model_id: Uuid) -> Result<Vec<GradientStepRow>> {
        jobs::gradient_step_history(&self.pool, model_id).await
    }

    async fn get_job(&self, entity: &str, id: Uuid) -> Result<tandem_core::records::Job> {
        jobs::get_job(&self.pool, entity, id).await
    }

    async fn get_job_rollout(&self, entity: &str, id: Uuid) -> Result<crate::JobRollout> {
        jobs::get_job_rollout(&self.pool, entity, id).await
    }

    async fn cancel_job(&self, entity: &str, id: Uuid) -> Result<tandem_core::records::Job> {
        let mut tx = self.write_tx().await?;
        let job = jobs::cancel_job(&mut tx, entity, id).await?;
        tx.commit().await?;
        Ok(job)
    }

    async fn list_events(
        &self,
        entity: &str,
        job_id: Uuid,
        page: PageRequest,
    ) -> Result<Page<tandem_core::records::JobEvent>> {
        jobs::get_job(&self.pool, entity, job_id).await?;
        let after = match page.after {
            Some(a) => Some(cursor_seq(&self.pool, "job_events", "job_id", &job_id.to_string(), a).await?),
            None => None,
        };
        jobs::list_events(&self.pool, job_id, after, page.limit).await
    }

    async fn claim_next_job_skipping(
        &self,
        lease: &crate::Lease,
        skip_entities: &[String],
    ) -> Result<Option<crate::ClaimedJob>> {
        jobs::claim_next_job(&self.pool, lease, skip_entities).await
    }

    async fn renew_lease(&self, job_id: Uuid, lease: &crate::Lease) -> Result<crate::LeaseState> {
        jobs::renew_lease(&self.pool, job_id, lease).await
    }

    async fn append_event(
        &self,
        job_id: Uuid,
        owner: &str,
        kind: tandem_core::records::EventKind,
        data: &Value,
    ) -> Result<tandem_core::records::JobEvent> {
        let mut tx = self.write_tx().await?;
        let event = jobs::append_event(&mut tx, job_id, owner, kind, data).await?;
        tx.commit().await?;
        Ok(event)
    }

    async fn is_cancel_requested(&self, job_id: Uuid) -> Result<bool> {
        let row = sqlx::query("SELECT cancel_requested FROM training_jobs WHERE id = ?")
            .bind(job_id.to_string())
            .fetch_one(&self.pool)
            .await?;
        Ok(row.get::<i64, _>(0) != 0)
    }

    async fn finish_job(
        &self,
        job_id: Uuid,
        owner: &str,
        outcome: &crate::JobOutcome,
    ) -> Result<tandem_core::records::Job> {
        let mut tx = self.write_tx().await?;
        let job = jobs::finish_job(&mut tx, job_id, owner, outcome, self.storage_quota).await?;
        tx.commit().await?;
        Ok(job)
    }

    async fn recover_interrupted_jobs(&self, max_attempts: i64, scope: crate::Reclaim) -> Result<crate::Recovery> {
        let mut tx = self.write_tx().await?;
        let recovery = jobs::recover(&mut tx, max_attempts, scope).await?;
        tx.commit().await?;
        Ok(recovery)
    }
}

async fn latest_step<'e, E: sqlx::SqliteExecutor<'e>>(ex: E, model_id: Uuid) -> Result<i64> {
    let row = sqlx::query("SELECT COALESCE(MAX(step), 0) FROM checkpoints WHERE model_id = ? AND deleted_at IS NULL")
        .bind(model_id.to_string())
        .fetch_one(ex)
        .await?;
    Ok(row.get::<i64, _>(0))
}

/// Eight hex digits for a run id, taken from the random bits of a fresh UUIDv7.
fn rand_u32(id: Uuid) -> u32 {
    let b = id.as_bytes();
    u32::from_be_bytes([b[12], b[13], b[14], b[15]])
}

#[cfg(test)]
mod tests;
