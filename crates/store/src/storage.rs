//! Per-entity storage: the bytes each entity's stored data takes (trajectory logs, job inputs,
//! datasets, checkpoint files, Tinker states, stored Responses) and the quota they are held to.
//!
//! The count is a row per entity (`entity_storage`), changed by the transaction that adds or
//! removes the data, so it is exact on both backends and a refused write leaves nothing behind.
//! A charge is the last statement of its transaction: the upsert locks the entity's row until the
//! commit (PostgreSQL), which serialises that entity's charges without ever waiting while holding
//! it. Both backends run the same statements ([`storage_backend!`]).

/// What one entity stores and its own quota (`None`: the node's default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageUsage {
    pub entity: String,
    pub used_bytes: i64,
    pub quota: EntityQuota,
}

/// An entity's own quota, as an operator set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityQuota {
    /// The node's `--storage-quota-mib` (no quota when that is unset).
    Default,
    /// No quota, whatever the default.
    Unlimited,
    /// This many bytes.
    Bytes(i64),
}

impl EntityQuota {
    /// As stored: NULL for the default, a negative number for none.
    pub(crate) fn to_column(self) -> Option<i64> {
        match self {
            EntityQuota::Default => None,
            EntityQuota::Unlimited => Some(-1),
            EntityQuota::Bytes(b) => Some(b.max(0)),
        }
    }

    pub(crate) fn from_column(v: Option<i64>) -> Self {
        match v {
            None => EntityQuota::Default,
            Some(b) if b < 0 => EntityQuota::Unlimited,
            Some(b) => EntityQuota::Bytes(b),
        }
    }

    /// The limit in bytes under `default` (the node's), `None` for no limit.
    pub fn limit(self, default: Option<i64>) -> Option<i64> {
        match self {
            EntityQuota::Default => default,
            EntityQuota::Unlimited => None,
            EntityQuota::Bytes(b) => Some(b),
        }
    }
}

/// A write refused because the entity's data would outgrow its quota; nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverQuota {
    /// What the entity stored before this write.
    pub used_bytes: i64,
    pub quota_bytes: i64,
    /// What this write would have added.
    pub needed_bytes: i64,
}

impl std::fmt::Display for OverQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "storage quota exceeded: this entity stores {} of its {} quota",
            mib(self.used_bytes),
            mib(self.quota_bytes)
        )?;
        match self.needed_bytes {
            0 => write!(f, " and has no room left")?,
            n => write!(f, " and this needs {} more", mib(n))?,
        }
        write!(f, "; delete checkpoints, models, datasets or Tinker checkpoints to make room")
    }
}

/// `usage` seen under the node's `default`: `Some` when the entity has no room left at all (a
/// trainer fails a job then, before spending time on a checkpoint it could not keep).
pub fn no_room(usage: &StorageUsage, default: Option<i64>) -> Option<OverQuota> {
    let limit = usage.quota.limit(default)?;
    (!admits(usage.used_bytes, Some(limit), 1)).then_some(OverQuota {
        used_bytes: usage.used_bytes,
        quota_bytes: limit,
        needed_bytes: 0,
    })
}

fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Whether an entity that stores `used` bytes may add `add` under `limit` (`None`: no limit).
/// Removing data (`add <= 0`) is always admitted, also above the limit (a lowered quota).
pub fn admits(used: i64, limit: Option<i64>, add: i64) -> bool {
    match limit {
        _ if add <= 0 => true,
        None => true,
        Some(limit) => used.saturating_add(add) <= limit,
    }
}

/// What a model's record counts: a bound on its row and index entries (its names are bounded), so
/// that creating models by the million is held to the quota like any other data.
pub const MODEL_ROW_BYTES: i64 = 1024;

/// What a job's stored inputs take: its config, the inputs the trainer reads and the rollouts as
/// submitted (the migration's backfill adds the same three columns).
pub(crate) fn job_bytes(config: &str, inputs: &str, rollout_groups: Option<&str>) -> i64 {
    (config.len() + inputs.len() + rollout_groups.map_or(0, str::len)) as i64
}

/// Adds `$2` bytes to entity `$1` (creating its row): the new total and the entity's quota.
pub(crate) const CHARGE: &str = "INSERT INTO entity_storage (entity, used_bytes) VALUES ($1, $2)
    ON CONFLICT (entity) DO UPDATE SET used_bytes = entity_storage.used_bytes + excluded.used_bytes
    RETURNING used_bytes, quota_bytes";
/// Takes `$2` bytes off entity `$1` (never below zero).
pub(crate) const RELEASE: &str = "UPDATE entity_storage
    SET used_bytes = CASE WHEN used_bytes > $2 THEN used_bytes - $2 ELSE 0 END WHERE entity = $1";
pub(crate) const USAGE: &str = "SELECT entity, used_bytes, quota_bytes FROM entity_storage WHERE entity = $1";
pub(crate) const LIST: &str = "SELECT entity, used_bytes, quota_bytes FROM entity_storage ORDER BY entity";
/// What the entity of model `$1` stores and its own quota (no row: nothing yet).
pub(crate) const MODEL_USAGE: &str = "SELECT m.entity, COALESCE(e.used_bytes, 0), e.quota_bytes
    FROM models m LEFT JOIN entity_storage e ON e.entity = m.entity WHERE m.id = $1";
pub(crate) const MODEL_ENTITY: &str = "SELECT entity FROM models WHERE id = $1";
/// What deleting model `$1` frees: its record, its live checkpoints (tombstones were freed when
/// deleted), its trajectory logs and its jobs' inputs.
/// (PostgreSQL's SUM of BIGINT is NUMERIC, hence the cast.)
pub(crate) const MODEL_BYTES: &str = "SELECT CAST(1024
    + (SELECT COALESCE(SUM(size_bytes), 0) FROM checkpoints WHERE model_id = $1 AND deleted_at IS NULL)
    + (SELECT COALESCE(SUM(size_bytes), 0) FROM trajectory_logs WHERE model_id = $1)
    + (SELECT COALESCE(SUM(size_bytes), 0) FROM training_jobs WHERE model_id = $1) AS BIGINT)";
pub(crate) const SET_QUOTA: &str = "INSERT INTO entity_storage (entity, used_bytes, quota_bytes) VALUES ($1, 0, $2)
    ON CONFLICT (entity) DO UPDATE SET quota_bytes = excluded.quota_bytes";

/// The charge's verdict on what [`CHARGE`] returned: `Err` (the caller's transaction must roll
/// back, which `?` does by dropping it) when the entity was not admitted.
pub(crate) fn verdict(new_total: i64, quota: Option<i64>, added: i64, default: Option<i64>) -> crate::Result<()> {
    let used = new_total - added;
    let limit = EntityQuota::from_column(quota).limit(default);
    match limit {
        Some(quota_bytes) if !admits(used, limit, added) => {
            Err(crate::StoreError::OverQuota(OverQuota { used_bytes: used, quota_bytes, needed_bytes: added }))
        }
        _ => Ok(()),
    }
}

/// Charging, releasing and reading per-entity storage for one backend: `$conn` its connection
/// type, `$row` its row type, `$sql` how it spells the shared statements.
macro_rules! storage_backend {
    ($conn:ty, $row:ty, $sql:path) => {
        /// Adds `bytes` to `entity`'s storage, or `OverQuota` past its limit under `default`.
        /// The last statement of the caller's transaction (see `crate::storage`).
        pub(crate) async fn charge(conn: &mut $conn, entity: &str, bytes: i64, default: Option<i64>) -> Result<()> {
            if bytes <= 0 {
                return Ok(());
            }
            let row =
                sqlx::query(&$sql($crate::storage::CHARGE)).bind(entity).bind(bytes).fetch_one(&mut *conn).await?;
            let total: i64 = sqlx::Row::try_get(&row, 0)?;
            let quota: Option<i64> = sqlx::Row::try_get(&row, 1)?;
            $crate::storage::verdict(total, quota, bytes, default)
        }

        /// Takes `bytes` off `entity`'s storage.
        pub(crate) async fn release(conn: &mut $conn, entity: &str, bytes: i64) -> Result<()> {
            if bytes > 0 {
                sqlx::query(&$sql($crate::storage::RELEASE)).bind(entity).bind(bytes).execute(&mut *conn).await?;
            }
            Ok(())
        }

        /// Charges `bytes` to the entity of model `model_id` (see [`charge`]).
        pub(crate) async fn charge_model(
            conn: &mut $conn,
            model_id: uuid::Uuid,
            bytes: i64,
            default: Option<i64>,
        ) -> Result<()> {
            let entity = model_entity(&mut *conn, model_id).await?;
            charge(conn, &entity, bytes, default).await
        }

        pub(crate) async fn model_entity(conn: &mut $conn, model_id: uuid::Uuid) -> Result<String> {
            let row = sqlx::query(&$sql($crate::storage::MODEL_ENTITY))
                .bind(model_id.to_string())
                .fetch_one(&mut *conn)
                .await?;
            Ok(sqlx::Row::try_get(&row, 0)?)
        }

        /// What deleting model `model_id` frees (read before the delete).
        pub(crate) async fn model_bytes(conn: &mut $conn, model_id: uuid::Uuid) -> Result<i64> {
            let row = sqlx::query(&$sql($crate::storage::MODEL_BYTES))
                .bind(model_id.to_string())
                .fetch_one(&mut *conn)
                .await?;
            Ok(sqlx::Row::try_get(&row, 0)?)
        }

        /// A read before the write transaction: `OverQuota` when `bytes` cannot fit in what
        /// `entity` has left now, so a refused write is refused without taking the write lock or
        /// writing its rows first (one entity's refused floods then cost the others a read). The
        /// charge inside the transaction stays the exact check.
        pub(crate) async fn precheck(conn: &mut $conn, entity: &str, bytes: i64, default: Option<i64>) -> Result<()> {
            if bytes <= 0 {
                return Ok(());
            }
            let u = usage(conn, entity).await?;
            $crate::storage::verdict(u.used_bytes + bytes, u.quota.to_column(), bytes, default)
        }

        /// [`precheck`] for the entity of model `model_id`, whose name it returns for the write's
        /// charge (`NotFound`: no such model).
        pub(crate) async fn precheck_model(
            conn: &mut $conn,
            model_id: uuid::Uuid,
            bytes: i64,
            default: Option<i64>,
        ) -> Result<String> {
            let row = sqlx::query(&$sql($crate::storage::MODEL_USAGE))
                .bind(model_id.to_string())
                .fetch_optional(&mut *conn)
                .await?
                .ok_or($crate::StoreError::NotFound)?;
            let used: i64 = sqlx::Row::try_get(&row, 1)?;
            let quota: Option<i64> = sqlx::Row::try_get(&row, 2)?;
            if bytes > 0 {
                $crate::storage::verdict(used + bytes, quota, bytes, default)?;
            }
            Ok(sqlx::Row::try_get(&row, 0)?)
        }

        fn usage_row(row: &$row) -> Result<$crate::storage::StorageUsage> {
            Ok($crate::storage::StorageUsage {
                entity: sqlx::Row::try_get(row, 0)?,
                used_bytes: sqlx::Row::try_get(row, 1)?,
                quota: $crate::storage::EntityQuota::from_column(sqlx::Row::try_get(row, 2)?),
            })
        }

        pub(crate) async fn usage(conn: &mut $conn, entity: &str) -> Result<$crate::storage::StorageUsage> {
            let row = sqlx::query(&$sql($crate::storage::USAGE)).bind(entity).fetch_optional(&mut *conn).await?;
            match row {
                Some(row) => usage_row(&row),
                None => Ok($crate::storage::StorageUsage {
                    entity: entity.to_string(),
                    used_bytes: 0,
                    quota: $crate::storage::EntityQuota::Default,
                }),
            }
        }

        pub(crate) async fn list_usage(conn: &mut $conn) -> Result<Vec<$crate::storage::StorageUsage>> {
            let rows = sqlx::query(&$sql($crate::storage::LIST)).fetch_all(&mut *conn).await?;
            rows.iter().map(usage_row).collect()
        }

        pub(crate) async fn set_quota(
            conn: &mut $conn,
            entity: &str,
            quota: $crate::storage::EntityQuota,
        ) -> Result<()> {
            sqlx::query(&$sql($crate::storage::SET_QUOTA))
                .bind(entity)
                .bind(quota.to_column())
                .execute(&mut *conn)
                .await?;
            Ok(())
        }
    };
}
pub(crate) use storage_backend;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_limit_and_any_removal() {
        assert!(admits(0, Some(10), 10));
        assert!(!admits(0, Some(10), 11));
        assert!(!admits(7, Some(10), 4));
        assert!(admits(7, Some(10), 3));
        assert!(admits(50, Some(10), 0), "an entity above a lowered quota may still delete");
        assert!(admits(50, Some(10), -5));
        assert!(admits(i64::MAX - 1, None, 1 << 40), "no limit");
        assert!(!admits(i64::MAX - 1, Some(i64::MAX - 1), 10), "no overflow");
    }

    #[test]
    fn deleting_a_model_frees_its_record_as_charged() {
        assert!(MODEL_BYTES.contains(&format!("CAST({MODEL_ROW_BYTES}\n")), "{MODEL_BYTES}");
    }

    #[test]
    fn an_entity_quota_overrides_the_default() {
        assert_eq!(EntityQuota::Default.limit(Some(5)), Some(5));
        assert_eq!(EntityQuota::Default.limit(None), None);
        assert_eq!(EntityQuota::Unlimited.limit(Some(5)), None);
        assert_eq!(EntityQuota::Bytes(9).limit(Some(5)), Some(9));
        for q in [EntityQuota::Default, EntityQuota::Unlimited, EntityQuota::Bytes(0), EntityQuota::Bytes(7)] {
            assert_eq!(EntityQuota::from_column(q.to_column()), q);
        }
    }

    #[test]
    fn the_verdict_reports_what_was_stored_before() {
        assert!(verdict(10, None, 4, Some(10)).is_ok());
        match verdict(11, None, 4, Some(10)) {
            Err(crate::StoreError::OverQuota(o)) => {
                assert_eq!(o, OverQuota { used_bytes: 7, quota_bytes: 10, needed_bytes: 4 });
                let text = o.to_string();
                assert!(text.starts_with("storage quota exceeded: this entity stores 0.0 MiB"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        assert!(verdict(11, Some(-1), 4, Some(10)).is_ok(), "the entity's own: none");
        let usage = |used| StorageUsage { entity: "e".into(), used_bytes: used, quota: EntityQuota::Default };
        assert_eq!(no_room(&usage(9), Some(10)), None);
        let full = no_room(&usage(10), Some(10)).unwrap();
        assert!(full.to_string().contains("quota and has no room left; delete"), "{full}");
        assert_eq!(no_room(&usage(1 << 40), None), None);
        assert!(verdict(11, Some(20), 4, Some(10)).is_ok(), "the entity's own: more");
    }
}
