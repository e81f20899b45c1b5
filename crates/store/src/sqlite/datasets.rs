//! Uploaded datasets in SQLite: each upload is the next version of its name, assigned inside
//! the insert so that two concurrent uploads cannot take the same one.

use super::{entity_page, rows};
use crate::codec::{blob_key, dataset_data, inline_bytes};
use crate::{now_ms, DatasetData, NewDataset, Result, StoreError};
use sqlx::{Row, SqlitePool};
use tandem_core::records::{Dataset, Page, PageRequest};
use uuid::Uuid;

const COLUMNS: &str = "seq, id, entity, project, name, version, num_rows, size_bytes, created_at";

pub(crate) async fn create(pool: &SqlitePool, new: &NewDataset, quota: Option<i64>) -> Result<Dataset> {
    super::storage::precheck(&mut *pool.acquire().await?, &new.entity, new.data.size(), quota).await?;
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let sql = format!(
        "INSERT INTO datasets (id, entity, project, name, version, num_rows, size_bytes, data, blob_key, created_at)
         VALUES (?, ?, ?, ?,
                 (SELECT COALESCE(MAX(version) + 1, 0) FROM datasets WHERE entity = ? AND project = ? AND name = ?),
                 ?, ?, ?, ?, ?)
         RETURNING {COLUMNS}"
    );
    let row = sqlx::query(&sql)
        .bind(tandem_core::new_id().to_string())
        .bind(&new.entity)
        .bind(&new.project)
        .bind(&new.name)
        .bind(&new.entity)
        .bind(&new.project)
        .bind(&new.name)
        .bind(new.num_rows)
        .bind(new.data.size())
        .bind(inline_bytes(&new.data))
        .bind(blob_key(&new.data))
        .bind(now_ms())
        .fetch_one(&mut *tx)
        .await?;
    let dataset = rows::dataset(&row)?;
    super::storage::charge(&mut tx, &new.entity, new.data.size(), quota).await?;
    tx.commit().await?;
    Ok(dataset)
}

pub(crate) async fn get(pool: &SqlitePool, entity: &str, id: Uuid) -> Result<Dataset> {
    let sql = format!("SELECT {COLUMNS} FROM datasets WHERE id = ? AND entity = ?");
    let row = sqlx::query(&sql).bind(id.to_string()).bind(entity).fetch_one(pool).await?;
    rows::dataset(&row)
}

pub(crate) async fn find(
    pool: &SqlitePool,
    entity: &str,
    project: &str,
    name: &str,
    version: Option<i64>,
) -> Result<Dataset> {
    let sql = format!(
        "SELECT {COLUMNS} FROM datasets WHERE entity = ? AND project = ? AND name = ? AND (? IS NULL OR version = ?)
         ORDER BY version DESC LIMIT 1"
    );
    let row =
        sqlx::query(&sql).bind(entity).bind(project).bind(name).bind(version).bind(version).fetch_one(pool).await?;
    rows::dataset(&row)
}

pub(crate) async fn list(
    pool: &SqlitePool,
    entity: &str,
    project: Option<&str>,
    page: PageRequest,
) -> Result<Page<Dataset>> {
    entity_page(pool, "datasets", COLUMNS, (entity, project, None), page, rows::dataset).await
}

pub(crate) async fn data(pool: &SqlitePool, entity: &str, id: Uuid) -> Result<DatasetData> {
    let row = sqlx::query("SELECT data, blob_key, size_bytes FROM datasets WHERE id = ? AND entity = ?")
        .bind(id.to_string())
        .bind(entity)
        .fetch_one(pool)
        .await?;
    Ok(dataset_data(row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}

pub(crate) async fn live_blob_keys(pool: &SqlitePool) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT DISTINCT blob_key FROM datasets WHERE blob_key IS NOT NULL").fetch_all(pool).await?)
}

pub(crate) async fn delete(pool: &SqlitePool, entity: &str, id: Uuid) -> Result<()> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let size: Option<i64> = sqlx::query_scalar("DELETE FROM datasets WHERE id = ? AND entity = ? RETURNING size_bytes")
        .bind(id.to_string())
        .bind(entity)
        .fetch_optional(&mut *tx)
        .await?;
    let size = size.ok_or(StoreError::NotFound)?;
    super::storage::release(&mut tx, entity, size).await?;
    tx.commit().await?;
    Ok(())
}
