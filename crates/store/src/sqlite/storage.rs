//! Per-entity storage in SQLite: the shared statements (`crate::storage`) with `?N` parameters.
//! `BEGIN IMMEDIATE` makes every write transaction the only writer, so a charge needs no lock.

use crate::storage::{EntityQuota, StorageUsage};
use crate::Result;

fn sql(q: &str) -> String {
    q.replace('$', "?")
}

crate::storage::storage_backend!(sqlx::SqliteConnection, sqlx::sqlite::SqliteRow, sql);

impl super::SqliteStore {
    pub(crate) async fn storage_usage_impl(&self, entity: &str) -> Result<StorageUsage> {
        usage(&mut *self.pool.acquire().await?, entity).await
    }

    pub(crate) async fn list_storage_impl(&self) -> Result<Vec<StorageUsage>> {
        list_usage(&mut *self.pool.acquire().await?).await
    }

    pub(crate) async fn set_storage_quota_impl(&self, entity: &str, quota: EntityQuota) -> Result<()> {
        let mut tx = self.write_tx().await?;
        set_quota(&mut tx, entity, quota).await?;
        tx.commit().await?;
        Ok(())
    }
}
