//! The Tinker catalog's rows: what a run keeps beyond its session (saved states, sampler weights
//! saved by name, external weights), with their time to live and whether they are published.
//! Its files live in the checkpoint store under [`blob_path`]; sampler weights are a checkpoint
//! of the run's tandem record and keep no files of their own.
//!
//! Both backends run the same statements ([`catalog_backend!`]): the SQL is written once with
//! `$N` parameters, which SQLite reads as `?N`.

use serde_json::Value;
use tandem_core::tinker::{CheckpointKey, CheckpointKind};

/// The catalog's part of the store (a run is one owner's; reads by owner treat another's entries
/// as missing).
#[async_trait::async_trait]
pub trait TinkerCatalog: Send + Sync {
    /// Records an entry, or replaces the owner's entry of the same key (returned, so the caller
    /// removes what it held). A new key past `cap` is `AtLimit`; a run another owner has entries
    /// of is `Conflict`. The check and the write are one atomic step.
    async fn tinker_put(&self, entry: &TinkerEntry, cap: Option<TinkerCap>) -> crate::Result<Option<TinkerEntry>>;
    async fn tinker_get(
        &self,
        owner: &str,
        key: &tandem_core::tinker::CheckpointKey,
    ) -> crate::Result<Option<TinkerEntry>>;
    /// The entry if it is public, whoever owns it.
    async fn tinker_published(&self, key: &tandem_core::tinker::CheckpointKey) -> crate::Result<Option<TinkerEntry>>;
    /// The owner's entries (of one run, or all), by run, kind and name.
    async fn tinker_list(&self, owner: &str, model_id: Option<&str>) -> crate::Result<Vec<TinkerEntry>>;
    /// Removes an entry; the removed one (`None`: there was none).
    async fn tinker_delete(
        &self,
        owner: &str,
        key: &tandem_core::tinker::CheckpointKey,
    ) -> crate::Result<Option<TinkerEntry>>;
    /// Changes an entry; the entry as it was before (`None`: there is none, nothing changed).
    async fn tinker_change(
        &self,
        owner: &str,
        key: &tandem_core::tinker::CheckpointKey,
        change: TinkerChange,
    ) -> crate::Result<Option<TinkerEntry>>;
    /// Up to `limit` entries whose expiry is at or before `now`, soonest first.
    async fn tinker_expired(&self, now: i64, limit: i64) -> crate::Result<Vec<TinkerEntry>>;
    /// The cluster's secret `name`: the stored one, or `fresh`, stored, when there is none yet, so
    /// every node on one store gets the same (the first writer wins a race).
    async fn tinker_secret(&self, name: &str, fresh: &str) -> crate::Result<String>;
    /// Records a session's host (and its models), or rewrites the row of the same id.
    async fn tinker_session_put(&self, session: &TinkerSession) -> crate::Result<()>;
    /// The session `id`'s row (whoever's: the caller compares the entity).
    async fn tinker_session(&self, id: &str) -> crate::Result<Option<TinkerSession>>;
    /// Moves session `id` from node `from` to node `to`; false when its host was no longer `from`
    /// (another node moved it first) or there is no such session.
    async fn tinker_session_move(&self, id: &str, from: &str, to: &str) -> crate::Result<bool>;
    /// Forgets session `id` if node `node` still hosts it (a node that lost it never removes the
    /// row of the node that took it over).
    async fn tinker_session_drop(&self, id: &str, node: &str) -> crate::Result<()>;
    /// How many sessions each node hosts (nodes hosting none are absent).
    async fn tinker_session_counts(&self) -> crate::Result<Vec<(String, i64)>>;
    /// Forgets the sessions last written before `before` (Unix ms) whose node has left the
    /// registry (a stopped node's sessions that no client came back for): how many.
    async fn tinker_session_sweep(&self, before: i64) -> crate::Result<u64>;
}

/// A Tinker session of a cluster: the node hosting it, and what rebuilds its models elsewhere.
#[derive(Debug, Clone, PartialEq)]
pub struct TinkerSession {
    pub id: String,
    pub entity: String,
    /// The hosting node's registry id.
    pub node: String,
    /// Its models as the host described them (a JSON array).
    pub models: Value,
}

/// One catalog row.
#[derive(Debug, Clone, PartialEq)]
pub struct TinkerEntry {
    /// The entity whose run it is.
    pub owner: String,
    pub key: CheckpointKey,
    pub size_bytes: i64,
    /// Unix milliseconds.
    pub created_at: i64,
    /// When the sweep deletes it (Unix milliseconds); `None`: never.
    pub expires_at: Option<i64>,
    /// Other entities may read it by its path.
    pub public: bool,
    /// Its files' directory in the checkpoint store ([`blob_path`]).
    pub blob: Option<String>,
    /// What its kind describes: a state's base model, rank and modules; a sampler's checkpoint.
    pub meta: Value,
}

/// A new entry's limit: at most `max` entries of its kind per owner (or, `per_model`, per run
/// of the owner). Saving over a name does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TinkerCap {
    pub max: i64,
    pub per_model: bool,
}

/// A change to an existing entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TinkerChange {
    Expiry(Option<i64>),
    Public(bool),
}

/// Where an entry's files go: a fresh directory for every save (`tinker/<id>`), so a published
/// name never comes to mean other bytes, and a second node never reads half of a rewrite.
pub fn blob_path(id: uuid::Uuid) -> String {
    format!("tinker/{id}")
}

#[cfg(test)]
pub(crate) const COLUMNS: &str = "owner, model_id, kind, name, size_bytes, created_at, expires_at, public, blob, meta";

pub(crate) const SELECT_ONE: &str = "SELECT owner, model_id, kind, name, size_bytes, created_at, expires_at, public,
    blob, meta FROM tinker_checkpoints WHERE owner = $1 AND model_id = $2 AND kind = $3 AND name = $4";
pub(crate) const SELECT_KEY: &str = "SELECT owner, model_id, kind, name, size_bytes, created_at, expires_at, public,
    blob, meta FROM tinker_checkpoints WHERE model_id = $1 AND kind = $2 AND name = $3";
pub(crate) const OTHER_OWNER: &str = "SELECT owner FROM tinker_checkpoints WHERE model_id = $1 AND owner <> $2 LIMIT 1";
pub(crate) const COUNT_OWNER: &str = "SELECT COUNT(*) FROM tinker_checkpoints WHERE owner = $1 AND kind = $2";
pub(crate) const COUNT_MODEL: &str =
    "SELECT COUNT(*) FROM tinker_checkpoints WHERE owner = $1 AND kind = $2 AND model_id = $3";
pub(crate) const UPSERT: &str = "INSERT INTO tinker_checkpoints (owner, model_id, kind, name, size_bytes, created_at,
    expires_at, public, blob, meta) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT (model_id, kind, name) DO UPDATE SET owner = excluded.owner, size_bytes = excluded.size_bytes,
    created_at = excluded.created_at, expires_at = excluded.expires_at, public = excluded.public,
    blob = excluded.blob, meta = excluded.meta";
pub(crate) const DELETE: &str =
    "DELETE FROM tinker_checkpoints WHERE owner = $1 AND model_id = $2 AND kind = $3 AND name = $4";
pub(crate) const SET_EXPIRY: &str =
    "UPDATE tinker_checkpoints SET expires_at = $5 WHERE owner = $1 AND model_id = $2 AND kind = $3 AND name = $4";
pub(crate) const SET_PUBLIC: &str =
    "UPDATE tinker_checkpoints SET public = $5 WHERE owner = $1 AND model_id = $2 AND kind = $3 AND name = $4";
pub(crate) const LIST: &str = "SELECT owner, model_id, kind, name, size_bytes, created_at, expires_at, public, blob,
    meta FROM tinker_checkpoints WHERE owner = $1 AND ($2 = '' OR model_id = $2) ORDER BY model_id, kind, name";
pub(crate) const EXPIRED: &str = "SELECT owner, model_id, kind, name, size_bytes, created_at, expires_at, public, blob,
    meta FROM tinker_checkpoints WHERE expires_at IS NOT NULL AND expires_at <= $1 ORDER BY expires_at LIMIT $2";
pub(crate) const SECRET_INSERT: &str =
    "INSERT INTO tinker_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";
pub(crate) const SECRET_GET: &str = "SELECT value FROM tinker_secrets WHERE name = $1";
pub(crate) const SESSION_PUT: &str = "INSERT INTO tinker_sessions (id, entity, node, models, updated_at)
    VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO UPDATE SET entity = excluded.entity, node = excluded.node,
    models = excluded.models, updated_at = excluded.updated_at";
pub(crate) const SESSION_GET: &str = "SELECT id, entity, node, models FROM tinker_sessions WHERE id = $1";
pub(crate) const SESSION_MOVE: &str =
    "UPDATE tinker_sessions SET node = $3, updated_at = $4 WHERE id = $1 AND node = $2";
pub(crate) const SESSION_DROP: &str = "DELETE FROM tinker_sessions WHERE id = $1 AND node = $2";
pub(crate) const SESSION_SWEEP: &str =
    "DELETE FROM tinker_sessions WHERE updated_at < $1 AND node NOT IN (SELECT id FROM nodes)";
pub(crate) const SESSION_COUNTS: &str = "SELECT node, COUNT(*) FROM tinker_sessions GROUP BY node";
pub(crate) const LIVE_BLOBS: &str = "SELECT blob FROM tinker_checkpoints WHERE blob IS NOT NULL";

/// What an entry counts against its owner's storage: the files of its own (sampler weights are a
/// checkpoint, counted as one).
pub(crate) fn counted_bytes(e: &TinkerEntry) -> i64 {
    if e.blob.is_some() {
        e.size_bytes.max(0)
    } else {
        0
    }
}

/// A kind as stored, or a row that names none (written by something else: an error, not a
/// guess).
pub(crate) fn kind(s: &str) -> crate::Result<CheckpointKind> {
    CheckpointKind::parse(s).ok_or_else(|| crate::StoreError::Database(format!("unknown tinker checkpoint kind {s:?}")))
}

/// [`TinkerCatalog`] for one backend's store `$store`: `$pool`, `$db` and `$row` its sqlx types,
/// `$sql` how it spells the shared statements, `$begin` how it opens a write transaction, `$lock`
/// an `async fn(&mut Conn, &str)` that serialises writers of one owner's rows until the
/// transaction ends (a no-op under SQLite's one writer).
macro_rules! catalog_backend {
    ($store:ty, $pool:ty, $db:ty, $row:ty, $sql:path, $begin:path, $lock:path) => {
        use sqlx::Row;
        use tandem_core::tinker::CheckpointKey;
        use $crate::tinker::{self as t, TinkerCap, TinkerCatalog, TinkerChange, TinkerEntry};
        use $crate::{Result, StoreError};

        fn entry(row: &$row) -> Result<TinkerEntry> {
            let meta: String = row.try_get("meta")?;
            Ok(TinkerEntry {
                owner: row.try_get("owner")?,
                key: CheckpointKey {
                    model_id: row.try_get("model_id")?,
                    kind: t::kind(&row.try_get::<String, _>("kind")?)?,
                    name: row.try_get("name")?,
                },
                size_bytes: row.try_get("size_bytes")?,
                created_at: row.try_get("created_at")?,
                expires_at: row.try_get("expires_at")?,
                public: row.try_get("public")?,
                blob: row.try_get("blob")?,
                meta: $crate::codec::parse_json(&meta, "meta")?,
            })
        }

        async fn one(
            conn: &mut <$db as sqlx::Database>::Connection,
            owner: &str,
            key: &CheckpointKey,
        ) -> Result<Option<TinkerEntry>> {
            let row = sqlx::query(&$sql(t::SELECT_ONE))
                .bind(owner)
                .bind(&key.model_id)
                .bind(key.kind.as_str())
                .bind(&key.name)
                .fetch_optional(&mut *conn)
                .await?;
            row.as_ref().map(entry).transpose()
        }

        pub(crate) async fn put(
            tx: &mut sqlx::Transaction<'_, $db>,
            e: &TinkerEntry,
            cap: Option<TinkerCap>,
            quota: Option<i64>,
        ) -> Result<Option<TinkerEntry>> {
            $lock(&mut **tx, &e.owner).await?;
            let other: Option<String> = sqlx::query_scalar(&$sql(t::OTHER_OWNER))
                .bind(&e.key.model_id)
                .bind(&e.owner)
                .fetch_optional(&mut **tx)
                .await?;
            if other.is_some() {
                return Err(StoreError::Conflict(format!("run {} is another entity's", e.key.model_id)));
            }
            let before = one(&mut **tx, &e.owner, &e.key).await?;
            if let (None, Some(cap)) = (&before, cap) {
                let count: i64 = match cap.per_model {
                    true => {
                        sqlx::query_scalar(&$sql(t::COUNT_MODEL))
                            .bind(&e.owner)
                            .bind(e.key.kind.as_str())
                            .bind(&e.key.model_id)
                            .fetch_one(&mut **tx)
                            .await?
                    }
                    false => {
                        sqlx::query_scalar(&$sql(t::COUNT_OWNER))
                            .bind(&e.owner)
                            .bind(e.key.kind.as_str())
                            .fetch_one(&mut **tx)
                            .await?
                    }
                };
                if count >= cap.max {
                    return Err(StoreError::AtLimit(count));
                }
            }
            sqlx::query(&$sql(t::UPSERT))
                .bind(&e.owner)
                .bind(&e.key.model_id)
                .bind(e.key.kind.as_str())
                .bind(&e.key.name)
                .bind(e.size_bytes)
                .bind(e.created_at)
                .bind(e.expires_at)
                .bind(e.public)
                .bind(&e.blob)
                .bind(e.meta.to_string())
                .execute(&mut **tx)
                .await?;
            // Saving over a name frees what the old entry's files took.
            super::storage::release(&mut **tx, &e.owner, before.as_ref().map_or(0, t::counted_bytes)).await?;
            super::storage::charge(&mut **tx, &e.owner, t::counted_bytes(e), quota).await?;
            Ok(before)
        }

        pub(crate) async fn get(pool: &$pool, owner: &str, key: &CheckpointKey) -> Result<Option<TinkerEntry>> {
            let mut conn = pool.acquire().await?;
            one(&mut *conn, owner, key).await
        }

        pub(crate) async fn published(pool: &$pool, key: &CheckpointKey) -> Result<Option<TinkerEntry>> {
            let row = sqlx::query(&$sql(t::SELECT_KEY))
                .bind(&key.model_id)
                .bind(key.kind.as_str())
                .bind(&key.name)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(entry).transpose()?.filter(|e| e.public))
        }

        pub(crate) async fn list(pool: &$pool, owner: &str, model_id: Option<&str>) -> Result<Vec<TinkerEntry>> {
            let rows = sqlx::query(&$sql(t::LIST)).bind(owner).bind(model_id.unwrap_or("")).fetch_all(pool).await?;
            rows.iter().map(entry).collect()
        }

        pub(crate) async fn delete(
            tx: &mut sqlx::Transaction<'_, $db>,
            owner: &str,
            key: &CheckpointKey,
        ) -> Result<Option<TinkerEntry>> {
            $lock(&mut **tx, owner).await?;
            let before = one(&mut **tx, owner, key).await?;
            if before.is_some() {
                sqlx::query(&$sql(t::DELETE))
                    .bind(owner)
                    .bind(&key.model_id)
                    .bind(key.kind.as_str())
                    .bind(&key.name)
                    .execute(&mut **tx)
                    .await?;
                super::storage::release(&mut **tx, owner, before.as_ref().map_or(0, t::counted_bytes)).await?;
            }
            Ok(before)
        }

        pub(crate) async fn change(
            tx: &mut sqlx::Transaction<'_, $db>,
            owner: &str,
            key: &CheckpointKey,
            change: TinkerChange,
        ) -> Result<Option<TinkerEntry>> {
            $lock(&mut **tx, owner).await?;
            let before = one(&mut **tx, owner, key).await?;
            if before.is_some() {
                let q = match change {
                    TinkerChange::Expiry(_) => t::SET_EXPIRY,
                    TinkerChange::Public(_) => t::SET_PUBLIC,
                };
                let q = $sql(q);
                let q = sqlx::query(&q).bind(owner).bind(&key.model_id).bind(key.kind.as_str()).bind(&key.name);
                let q = match change {
                    TinkerChange::Expiry(at) => q.bind(at),
                    TinkerChange::Public(p) => q.bind(p),
                };
                q.execute(&mut **tx).await?;
            }
            Ok(before)
        }

        pub(crate) async fn expired(pool: &$pool, now: i64, limit: i64) -> Result<Vec<TinkerEntry>> {
            let rows = sqlx::query(&$sql(t::EXPIRED)).bind(now).bind(limit).fetch_all(pool).await?;
            rows.iter().map(entry).collect()
        }

        pub(crate) async fn live_blobs(pool: &$pool) -> Result<Vec<String>> {
            Ok(sqlx::query_scalar(&$sql(t::LIVE_BLOBS)).fetch_all(pool).await?)
        }

        #[async_trait::async_trait]
        impl TinkerCatalog for $store {
            async fn tinker_put(&self, e: &TinkerEntry, cap: Option<TinkerCap>) -> Result<Option<TinkerEntry>> {
                let mut tx = $begin(&self.pool()).await?;
                let before = put(&mut tx, e, cap, self.storage_quota).await?;
                tx.commit().await?;
                Ok(before)
            }

            async fn tinker_get(&self, owner: &str, key: &CheckpointKey) -> Result<Option<TinkerEntry>> {
                get(&self.pool(), owner, key).await
            }

            async fn tinker_published(&self, key: &CheckpointKey) -> Result<Option<TinkerEntry>> {
                published(&self.pool(), key).await
            }

            async fn tinker_list(&self, owner: &str, model_id: Option<&str>) -> Result<Vec<TinkerEntry>> {
                list(&self.pool(), owner, model_id).await
            }

            async fn tinker_delete(&self, owner: &str, key: &CheckpointKey) -> Result<Option<TinkerEntry>> {
                let mut tx = $begin(&self.pool()).await?;
                let before = delete(&mut tx, owner, key).await?;
                tx.commit().await?;
                Ok(before)
            }

            async fn tinker_change(
                &self,
                owner: &str,
                key: &CheckpointKey,
                c: TinkerChange,
            ) -> Result<Option<TinkerEntry>> {
                let mut tx = $begin(&self.pool()).await?;
                let before = change(&mut tx, owner, key, c).await?;
                tx.commit().await?;
                Ok(before)
            }

            async fn tinker_expired(&self, now: i64, limit: i64) -> Result<Vec<TinkerEntry>> {
                expired(&self.pool(), now, limit).await
            }

            async fn tinker_secret(&self, name: &str, fresh: &str) -> Result<String> {
                sqlx::query(&$sql(t::SECRET_INSERT)).bind(name).bind(fresh).execute(&self.pool()).await?;
                Ok(sqlx::query_scalar(&$sql(t::SECRET_GET)).bind(name).fetch_one(&self.pool()).await?)
            }

            async fn tinker_session_put(&self, s: &t::TinkerSession) -> Result<()> {
                sqlx::query(&$sql(t::SESSION_PUT))
                    .bind(&s.id)
                    .bind(&s.entity)
                    .bind(&s.node)
                    .bind(s.models.to_string())
                    .bind($crate::now_ms())
                    .execute(&self.pool())
                    .await?;
                Ok(())
            }

            async fn tinker_session(&self, id: &str) -> Result<Option<t::TinkerSession>> {
                let row = sqlx::query(&$sql(t::SESSION_GET)).bind(id).fetch_optional(&self.pool()).await?;
                let Some(row) = row else { return Ok(None) };
                let models: String = row.try_get("models")?;
                Ok(Some(t::TinkerSession {
                    id: row.try_get("id")?,
                    entity: row.try_get("entity")?,
                    node: row.try_get("node")?,
                    models: $crate::codec::parse_json(&models, "models")?,
                }))
            }

            async fn tinker_session_move(&self, id: &str, from: &str, to: &str) -> Result<bool> {
                let sql = $sql(t::SESSION_MOVE);
                let q = sqlx::query(&sql).bind(id).bind(from).bind(to).bind($crate::now_ms());
                Ok(q.execute(&self.pool()).await?.rows_affected() == 1)
            }

            async fn tinker_session_drop(&self, id: &str, node: &str) -> Result<()> {
                sqlx::query(&$sql(t::SESSION_DROP)).bind(id).bind(node).execute(&self.pool()).await?;
                Ok(())
            }

            async fn tinker_session_counts(&self) -> Result<Vec<(String, i64)>> {
                Ok(sqlx::query_as(&$sql(t::SESSION_COUNTS)).fetch_all(&self.pool()).await?)
            }

            async fn tinker_session_sweep(&self, before: i64) -> Result<u64> {
                let done = sqlx::query(&$sql(t::SESSION_SWEEP)).bind(before).execute(&self.pool()).await?;
                Ok(done.rows_affected())
            }
        }
    };
}
pub(crate) use catalog_backend;

#[cfg(test)]
mod tests {
    #[test]
    fn every_statement_names_the_columns_a_row_is_read_with() {
        for q in [super::SELECT_ONE, super::SELECT_KEY, super::LIST, super::EXPIRED] {
            let q: String = q.split_whitespace().collect::<Vec<_>>().join(" ");
            let cols: String = super::COLUMNS.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(q.contains(&cols), "{q}");
        }
    }
}
