//! The PostgreSQL backend, for several servers (and later trainer nodes) sharing one database.
//! It keeps SQLite's schema and semantics: ids and JSON as text, `seq` columns for cursors,
//! entity scoping in every query, migrations embedded in the binary.
//!
//! SQLite has one writer at a time (`BEGIN IMMEDIATE`); PostgreSQL runs writers concurrently, so
//! what that single writer gave for free is made explicit here:
//!
//! - **Cursor pages never skip a row.** A reader pages by `seq`, so rows of one list must become
//!   visible in `seq` order: a row committed after a higher-`seq` row of the same list would be
//!   behind a cursor that has moved on. Writers of one list therefore hold a lock from before the
//!   `seq` is drawn until commit: a job's events its job row, a model's jobs, logs and imported
//!   checkpoints its model row, an entity's models, datasets and stored Responses an advisory lock
//!   on (list, entity).
//! - **Read-then-write steps are atomic**: the next checkpoint step, the next dataset version, a
//!   log's metrics merged into its checkpoint and a job's state transitions read under those
//!   locks (or the row's own), never from a stale snapshot.
//! - **Claiming is safe between processes**: candidates are taken `FOR NO KEY UPDATE SKIP LOCKED`,
//!   and "one running job per model" is checked again under a per-model lock (see
//!   `jobs::claim_next_job`).
//!
//! Lock order, so that none of these can deadlock: a model's row before its jobs' rows; advisory
//! locks are only ever taken first, or by a claim that holds nothing else anyone waits for.
//! Row locks on models are `FOR NO KEY UPDATE`, which the foreign-key checks of inserts into
//! child tables (`FOR KEY SHARE`) never wait for.

mod datasets;
mod jobs;
mod logs;
mod models;
mod nodes;
mod notify;
mod pool;
mod responses;
mod rows;
mod storage;
mod tinker;

use crate::errors::POSTGRES_STATEMENT_TIMEOUT;
use crate::{ApiKeyRecord, DeletedCheckpoints, DeletedModel, NewLog, NewModel, PoolSettings, Result, StoreError};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgRow};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool, Row};
use std::str::FromStr;
use std::time::Duration;
use tandem_core::history::GradientStepRow;
use tandem_core::records::{
    Checkpoint, Dataset, EventKind, Job, JobEvent, JobKind, JobStatus, LogEntry, ModelRecord, Order, Page, PageRequest,
};
use uuid::Uuid;

/// Now, in Unix milliseconds by the database's clock: lease expiries and node liveness are
/// reckoned by it, so the nodes' clocks need not agree.
pub(crate) const DB_NOW_MS: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint";

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Connections per server by default: requests mostly wait on the model, not the database, and
/// several servers share one database's connection limit.
pub const MAX_CONNECTIONS: u32 = 8;
/// How long a server waits for its first connection at start-up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The store on PostgreSQL through sqlx.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    /// Swapped for a fresh pool when a dropped network has kept every connection (`watch`).
    pool: std::sync::Arc<std::sync::RwLock<PgPool>>,
    settings: PoolSettings,
    /// `--storage-quota-mib` in bytes: the quota of entities without one of their own.
    storage_quota: Option<i64>,
}

impl PostgresStore {
    /// The pool, for `copy` (which works below the `Store` methods).
    pub(crate) fn pool(&self) -> PgPool {
        self.pool.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Holds entities without a quota of their own to `bytes` of stored data (`None`: no quota).
    pub fn with_storage_quota(mut self, bytes: Option<i64>) -> Self {
        self.storage_quota = bytes;
        self
    }

    /// Connects to `url` (`postgres://user@host:5432/db`) and brings the schema up to date, in the
    /// connection's default schema (normally `public`).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with_pool(url, PoolSettings::default()).await
    }

    /// [`PostgresStore::connect`] with the pool's size (`--db-pool-size`) and acquire timeout
    /// (`--db-acquire-timeout`) where `pool` sets them.
    pub async fn connect_with_pool(url: &str, pool: PoolSettings) -> Result<Self> {
        Self::open(PgConnectOptions::from_str(url)?, pool).await
    }

    /// Like [`Self::connect`], with every table in `schema` (created if missing): several stores
    /// in one database, as tests use. `schema` is an unquoted lowercase identifier
    /// (`[a-z_][a-z0-9_]*`), since it is spliced into SQL and the `search_path` option.
    pub async fn connect_in_schema(url: &str, schema: &str) -> Result<Self> {
        check_schema_name(schema)?;
        let options = PgConnectOptions::from_str(url)?;
        let mut conn = timeout(options.connect()).await?;
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")).execute(&mut conn).await?;
        conn.close().await?;
        Self::open(options.options([("search_path", schema)]), PoolSettings::default()).await
    }

    /// Drops `schema` with everything in it (a test's, once its stores are done). Connects on its
    /// own, so that it can run from a `Drop` on another runtime; ends the sessions still holding
    /// locks in the schema first: a discarded store's idle connection may not have sent the
    /// rollback sqlx queues for a dropped transaction yet (its runtime, blocked on this drop, no
    /// longer drives it).
    pub async fn drop_schema(url: &str, schema: &str) -> Result<()> {
        check_schema_name(schema)?;
        let mut conn = timeout(PgConnectOptions::from_str(url)?.connect()).await?;
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM (
                 SELECT DISTINCT l.pid FROM pg_locks l
                 JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND l.pid <> pg_backend_pid()) AS holders",
        )
        .bind(schema)
        .execute(&mut conn)
        .await?;
        // Gives up, rather than hangs, should a session still hold on.
        sqlx::query("SET lock_timeout = '10s'").execute(&mut conn).await?;
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).execute(&mut conn).await?;
        conn.close().await?;
        Ok(())
    }

    async fn open(options: PgConnectOptions, settings: PoolSettings) -> Result<Self> {
        // Migrations run on a connection of their own without the statement timeout: building
        // an index on a large table may rightly take longer than any request's statement.
        let migrating = options.clone();
        let statement_ms = settings.statement_timeout.unwrap_or(POSTGRES_STATEMENT_TIMEOUT).as_millis();
        let options = if statement_ms > 0 { options.options([("statement_timeout", statement_ms)]) } else { options };
        // The first connection may take CONNECT_TIMEOUT (a server starting up alongside); later
        // calls wait at most the acquire timeout, which is all a request waits while the
        // server is down (the pool retries connecting until then).
        let size = settings.size.unwrap_or(MAX_CONNECTIONS);
        let released = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(crate::now_ms()));
        let pool = pool::options(size, settings, released.clone()).connect_lazy_with(options.clone());
        let started = std::time::Instant::now();
        loop {
            match pool.acquire().await {
                Ok(_) => break,
                Err(sqlx::Error::PoolTimedOut) if started.elapsed() < CONNECT_TIMEOUT => continue,
                Err(sqlx::Error::PoolTimedOut) => {
                    return Err(StoreError::Unavailable(format!(
                        "no answer from PostgreSQL within {CONNECT_TIMEOUT:?}"
                    )))
                }
                Err(e) => return Err(e.into()),
            }
        }
        // Concurrent start-ups wait on sqlx's advisory lock, so one server migrates.
        let mut conn = timeout(migrating.connect()).await?;
        MIGRATOR.run(&mut conn).await.map_err(|e| StoreError::Database(e.to_string()))?;
        conn.close().await?;
        let pool = std::sync::Arc::new(std::sync::RwLock::new(pool));
        if let Some(deadline) = settings.call_deadline() {
            // Longer than any call may hold a connection and its release ping take.
            let limit = deadline + pool::RELEASE_PING_TIMEOUT + std::time::Duration::from_secs(5);
            let swap = pool::Swap { pool: std::sync::Arc::downgrade(&pool), options, settings, size, released };
            tokio::spawn(swap.watch(limit));
        }
        Ok(PostgresStore { pool, settings, storage_quota: None })
    }

    /// Closes every connection; later calls fail (health checks and shutdown tests use it).
    pub async fn close(&self) {
        self.pool().close().await;
    }
}

async fn timeout<T>(connecting: impl std::future::Future<Output = sqlx::Result<T>>) -> Result<T> {
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(done) => Ok(done?),
        Err(_) => Err(StoreError::Database(format!("no answer from PostgreSQL within {CONNECT_TIMEOUT:?}"))),
    }
}

fn check_schema_name(schema: &str) -> Result<()> {
    let mut chars = schema.chars();
    let ok = schema.len() <= 63
        && chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Database(format!("bad schema name {schema:?}: use [a-z_][a-z0-9_]*")))
    }
}

/// PostgreSQL text cannot hold U+0000 (a bound one is an error; SQLite stores it), so a lookup
/// key containing one names nothing stored.
fn has_nul(parts: &[Option<&str>]) -> bool {
    parts.iter().flatten().any(|s| s.contains('\0'))
}

/// The class of tandem's advisory locks: the first key of the two-key form, whose key space is
/// apart from the one-key form sqlx's migration lock uses.
const LOCK_CLASS: i32 = 0x7464_6d00;

/// Takes the transaction-scoped advisory lock of `(list, key)`, e.g. ("models", entity). Keys are
/// hashed to 32 bits with FNV-1a (stable across builds, unlike std's hasher: every server must
/// compute the same lock); a collision only serialises two unrelated writers.
async fn lock_key(conn: &mut PgConnection, list: &str, key: &str) -> Result<()> {
    let mut hash: u32 = 0x811c_9dc5;
    // 0xff never occurs in UTF-8, so it separates the two unambiguously.
    for b in list.bytes().chain([0xff]).chain(key.bytes()) {
        hash = (hash ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)").bind(LOCK_CLASS).bind(hash as i32).execute(conn).await?;
    Ok(())
}

/// Locks a model's row until the transaction ends (see the module comment); false if there is no
/// such model.
async fn lock_model(conn: &mut PgConnection, model_id: Uuid) -> Result<bool> {
    let row = sqlx::query("SELECT 1 FROM models WHERE id = $1 FOR NO KEY UPDATE")
        .bind(model_id.to_string())
        .fetch_optional(conn)
        .await?;
    Ok(row.is_some())
}

/// Resolves a cursor id to its `seq` within one list, or `InvalidCursor`.
async fn cursor_seq(pool: &PgPool, table: &str, scope_col: &str, scope: &str, after: Uuid) -> Result<i64> {
    let sql = format!("SELECT seq FROM {table} WHERE id = $1 AND {scope_col} = $2");
    let row = sqlx::query(&sql).bind(after.to_string()).bind(scope).fetch_optional(pool).await?;
    row.map(|r| r.get::<i64, _>(0)).ok_or(StoreError::InvalidCursor)
}

/// The `seq` comparison after a cursor bound as parameter `$n`, and the order.
fn seq_clause(order: Order, n: usize) -> (String, &'static str) {
    match order {
        Order::Asc => (format!("seq > ${n}"), "seq ASC"),
        Order::Desc => (format!("seq < ${n}"), "seq DESC"),
    }
}

/// `text` lowercased in ASCII only, as SQLite's `lower()` does (PostgreSQL's folds by locale):
/// a search matches exactly what it matches there.
fn ascii_lower(text: &str) -> String {
    format!("translate({text}, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')")
}

/// One page of an entity's rows of `table` (optionally of one project, optionally whose
/// `project/name` contains `search`), in `seq` order after the page's cursor: the listing of
/// models and of datasets.
async fn entity_page<T>(
    pool: &PgPool,
    table: &str,
    columns: &str,
    (entity, project, search): (&str, Option<&str>, Option<&str>),
    page: PageRequest,
    decode: fn(&PgRow) -> Result<T>,
) -> Result<Page<T>> {
    let (cmp, order) = seq_clause(page.order, 4);
    let after = match page.after {
        Some(a) => Some(cursor_seq(pool, table, "entity", entity, a).await?),
        None => None,
    };
    if has_nul(&[project, search]) {
        return Ok(Page { items: Vec::new(), has_more: false });
    }
    // `strpos`, not LIKE: a search text is matched literally (no wildcards to escape).
    let sql = format!(
        "SELECT {columns} FROM {table} WHERE entity = $1 AND ($2::text IS NULL OR project = $2)
           AND ($3::text IS NULL OR strpos({}, {}) > 0)
           AND ($4::bigint IS NULL OR {cmp})
         ORDER BY {order} LIMIT $5",
        ascii_lower("project || '/' || name"),
        ascii_lower("$3"),
    );
    let rows = sqlx::query(&sql)
        .bind(entity)
        .bind(project)
        .bind(search)
        .bind(after)
        .bind(page.limit as i64 + 1)
        .fetch_all(pool)
        .await?;
    let items = rows.iter().map(decode).collect::<Result<Vec<_>>>()?;
    Ok(rows::page(items, page.limit))
}

#[async_trait::async_trait]
impl crate::Store for PostgresStore {
    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").fetch_one(&self.pool()).await?;
        Ok(())
    }

    fn single_process(&self) -> bool {
        false
    }

    async fn notices(&self) -> Result<Option<tokio::sync::mpsc::Receiver<crate::Notice>>> {
        // The listener's connection is held for as long as it listens, and on a network that
        // drops packets silently it waits for good: from a pool of its own, never a slot of the
        // requests' pool.
        let options = (*self.pool().connect_options()).clone();
        let unwatched = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
        let pool = pool::options(1, self.settings, unwatched).connect_lazy_with(options);
        notify::subscribe(&pool).await.map(Some)
    }

    async fn insert_key(&self, key: &ApiKeyRecord) -> Result<()> {
        models::insert_key(&self.pool(), key).await
    }

    async fn find_active_key(&self, key_hash: &[u8; 32]) -> Result<Option<ApiKeyRecord>> {
        models::find_active_key(&self.pool(), key_hash).await
    }

    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>> {
        models::list_keys(&self.pool()).await
    }

    async fn revoke_key(&self, id_or_prefix: &str) -> Result<ApiKeyRecord> {
        models::revoke_key(&self.pool(), id_or_prefix).await
    }

    async fn create_model(&self, new: &NewModel, return_existing: bool) -> Result<(ModelRecord, bool)> {
        models::create_model(&self.pool(), new, return_existing, self.storage_quota).await
    }

    async fn get_model(&self, entity: &str, id: Uuid) -> Result<ModelRecord> {
        let row = sqlx::query("SELECT * FROM models WHERE id = $1 AND entity = $2")
            .bind(id.to_string())
            .bind(entity)
            .fetch_one(&self.pool())
            .await?;
        rows::model(&row)
    }

    async fn model_by_id(&self, id: Uuid) -> Result<ModelRecord> {
        let row =
            sqlx::query("SELECT * FROM models WHERE id = $1").bind(id.to_string()).fetch_one(&self.pool()).await?;
        rows::model(&row)
    }

    async fn find_model(&self, entity: &str, project: &str, name: &str) -> Result<ModelRecord> {
        if has_nul(&[Some(entity), Some(project), Some(name)]) {
            return Err(StoreError::NotFound);
        }
        let row = sqlx::query("SELECT * FROM models WHERE entity = $1 AND project = $2 AND name = $3")
            .bind(entity)
            .bind(project)
            .bind(name)
            .fetch_one(&self.pool())
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
        entity_page(&self.pool(), "models", "*", (entity, project, search), page, rows::model).await
    }

    async fn delete_model(&self, entity: &str, id: Uuid) -> Result<DeletedModel> {
        models::delete_model(&self.pool(), entity, id).await
    }

    async fn model_summary(&self, model_id: Uuid) -> Result<crate::ModelSummary> {
        models::model_summary(&self.pool(), model_id).await
    }

    async fn list_checkpoints(&self, model_id: Uuid, page: PageRequest) -> Result<Page<Checkpoint>> {
        logs::list_checkpoints(&self.pool(), model_id, page).await
    }

    async fn get_checkpoint(&self, model_id: Uuid, step: i64) -> Result<Checkpoint> {
        let row = sqlx::query("SELECT * FROM checkpoints WHERE model_id = $1 AND step = $2 AND deleted_at IS NULL")
            .bind(model_id.to_string())
            .bind(step)
            .fetch_one(&self.pool())
            .await?;
        rows::checkpoint(&row)
    }

    async fn latest_step(&self, model_id: Uuid) -> Result<i64> {
        logs::latest_step(&self.pool(), model_id).await
    }

    async fn delete_checkpoints(&self, model_id: Uuid, steps: &[i64]) -> Result<DeletedCheckpoints> {
        logs::delete_checkpoints(&self.pool(), model_id, steps).await
    }

    async fn import_checkpoint(&self, model_id: Uuid, id: Uuid, path: &str, size_bytes: i64) -> Result<Checkpoint> {
        logs::import_checkpoint(&self.pool(), model_id, id, path, size_bytes, self.storage_quota).await
    }

    async fn live_checkpoint_paths(&self) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT path FROM checkpoints WHERE deleted_at IS NULL").fetch_all(&self.pool()).await?;
        let mut live: Vec<String> = rows.iter().map(|r| r.get::<String, _>(0)).collect();
        live.extend(tinker::live_blobs(&self.pool()).await?);
        Ok(live)
    }

    async fn append_log(&self, new: &NewLog) -> Result<LogEntry> {
        logs::append_log(&self.pool(), new, self.storage_quota).await
    }

    async fn list_logs(&self, model_id: Uuid, split: Option<&str>, page: PageRequest) -> Result<Page<LogEntry>> {
        logs::list_logs(&self.pool(), model_id, split, page).await
    }

    async fn get_log(&self, model_id: Uuid, log_id: Uuid) -> Result<(LogEntry, Value)> {
        let row = sqlx::query("SELECT * FROM trajectory_logs WHERE id = $1 AND model_id = $2")
            .bind(log_id.to_string())
            .bind(model_id.to_string())
            .fetch_one(&self.pool())
            .await?;
        Ok((rows::log_entry(&row)?, rows::json(&row, "trajectory_groups")?))
    }

    async fn create_dataset(&self, new: &crate::NewDataset) -> Result<Dataset> {
        datasets::create(&self.pool(), new, self.storage_quota).await
    }

    async fn get_dataset(&self, entity: &str, id: Uuid) -> Result<Dataset> {
        datasets::get(&self.pool(), entity, id).await
    }

    async fn find_dataset(&self, entity: &str, project: &str, name: &str, version: Option<i64>) -> Result<Dataset> {
        datasets::find(&self.pool(), entity, project, name, version).await
    }

    async fn list_datasets(&self, entity: &str, project: Option<&str>, page: PageRequest) -> Result<Page<Dataset>> {
        datasets::list(&self.pool(), entity, project, page).await
    }

    async fn dataset_data(&self, entity: &str, id: Uuid) -> Result<crate::DatasetData> {
        datasets::data(&self.pool(), entity, id).await
    }

    async fn live_dataset_blob_keys(&self) -> Result<Vec<String>> {
        datasets::live_blob_keys(&self.pool()).await
    }

    async fn delete_dataset(&self, entity: &str, id: Uuid) -> Result<()> {
        datasets::delete(&self.pool(), entity, id).await
    }

    async fn create_job_capped(&self, new: &crate::NewJob, max_pending: Option<i64>) -> Result<Job> {
        jobs::create_job(&self.pool(), new, max_pending, self.storage_quota).await
    }

    async fn pending_jobs(&self, entity: &str) -> Result<i64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM training_jobs j JOIN models m ON m.id = j.model_id
             WHERE m.entity = $1 AND j.status IN ('queued', 'running')",
        )
        .bind(entity)
        .fetch_one(&self.pool())
        .await?;
        Ok(n)
    }

    async fn active_job_counts(&self) -> Result<Vec<(JobKind, JobStatus, i64)>> {
        jobs::active_job_counts(&self.pool()).await
    }

    async fn gradient_step_history(&self, model_id: Uuid) -> Result<Vec<GradientStepRow>> {
        jobs::gradient_step_history(&self.pool(), model_id).await
    }

    async fn list_jobs(&self, model_id: Uuid, page: PageRequest) -> Result<Page<Job>> {
        jobs::list_jobs(&self.pool(), model_id, page).await
    }

    async fn get_job(&self, entity: &str, id: Uuid) -> Result<Job> {
        jobs::get_job(&self.pool(), entity, id).await
    }

    async fn get_job_rollout(&self, entity: &str, id: Uuid) -> Result<crate::JobRollout> {
        jobs::get_job_rollout(&self.pool(), entity, id).await
    }

    async fn cancel_job(&self, entity: &str, id: Uuid) -> Result<Job> {
        jobs::cancel_job(&self.pool(), entity, id).await
    }

    async fn list_events(&self, entity: &str, job_id: Uuid, page: PageRequest) -> Result<Page<JobEvent>> {
        jobs::get_job(&self.pool(), entity, job_id).await?;
        let after = match page.after {
            Some(a) => Some(cursor_seq(&self.pool(), "job_events", "job_id", &job_id.to_string(), a).await?),
            None => None,
        };
        jobs::list_events(&self.pool(), job_id, after, page.limit).await
    }

    async fn claim_next_job_skipping(
        &self,
        lease: &crate::Lease,
        skip_entities: &[String],
    ) -> Result<Option<crate::ClaimedJob>> {
        jobs::claim_next_job(&self.pool(), lease, skip_entities).await
    }

    async fn renew_lease(&self, job_id: Uuid, lease: &crate::Lease) -> Result<crate::LeaseState> {
        jobs::renew_lease(&self.pool(), job_id, lease).await
    }

    async fn append_event(&self, job_id: Uuid, owner: &str, kind: EventKind, data: &Value) -> Result<JobEvent> {
        jobs::append_event(&self.pool(), job_id, owner, kind, data).await
    }

    async fn is_cancel_requested(&self, job_id: Uuid) -> Result<bool> {
        let row = sqlx::query("SELECT cancel_requested FROM training_jobs WHERE id = $1")
            .bind(job_id.to_string())
            .fetch_one(&self.pool())
            .await?;
        Ok(row.try_get::<bool, _>(0)?)
    }

    async fn finish_job(&self, job_id: Uuid, owner: &str, outcome: &crate::JobOutcome) -> Result<Job> {
        jobs::finish_job(&self.pool(), job_id, owner, outcome, self.storage_quota).await
    }

    async fn recover_interrupted_jobs(&self, max_attempts: i64, scope: crate::Reclaim) -> Result<crate::Recovery> {
        jobs::recover(&self.pool(), max_attempts, scope).await
    }

    async fn node_heartbeat(&self, beat: &crate::NodeBeat) -> Result<bool> {
        nodes::heartbeat(&self.pool(), beat).await
    }

    async fn list_nodes(&self) -> Result<Vec<crate::NodeRecord>> {
        nodes::list(&self.pool(), None).await
    }

    async fn set_node_draining(&self, which: &str, draining: bool) -> Result<Vec<crate::NodeRecord>> {
        nodes::set_draining(&self.pool(), which, draining).await
    }

    async fn remove_node(&self, id: &str) -> Result<()> {
        nodes::remove(&self.pool(), id).await
    }

    async fn storage_usage(&self, entity: &str) -> Result<crate::StorageUsage> {
        storage::usage(&mut *self.pool().acquire().await?, entity).await
    }

    async fn list_storage(&self) -> Result<Vec<crate::StorageUsage>> {
        storage::list_usage(&mut *self.pool().acquire().await?).await
    }

    async fn set_storage_quota(&self, entity: &str, quota: crate::EntityQuota) -> Result<()> {
        storage::set_quota(&mut *self.pool().acquire().await?, entity, quota).await
    }

    fn default_storage_quota(&self) -> Option<i64> {
        self.storage_quota
    }

    async fn put_response(&self, response: &crate::StoredResponse) -> Result<()> {
        responses::put(&self.pool(), response, crate::MAX_STORED_RESPONSES, self.storage_quota).await
    }

    async fn get_response(&self, entity: &str, id: &str) -> Result<crate::StoredResponse> {
        responses::get(&self.pool(), entity, id).await
    }

    async fn delete_response(&self, entity: &str, id: &str) -> Result<()> {
        responses::delete(&self.pool(), entity, id).await
    }
}
