//! Stored Responses in PostgreSQL. An entity keeps at most a bounded number: inserting past the
//! bound drops that entity's oldest, in the same transaction, under the entity's lock so that
//! concurrent inserts count each other.

use super::{has_nul, lock_key, rows};
use crate::{now_ms, Result, StoreError, StoredResponse};
use sqlx::{PgPool, Row};

pub(crate) async fn put(pool: &PgPool, r: &StoredResponse, keep: usize, quota: Option<i64>) -> Result<()> {
    let (body, conversation) = (r.body.to_string(), r.conversation.to_string());
    let size = (body.len() + conversation.len()) as i64;
    let mut tx = pool.begin().await?;
    lock_key(&mut tx, "responses", &r.entity).await?;
    sqlx::query(
        "INSERT INTO stored_responses (id, entity, body, conversation, created_at, size_bytes)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&r.id)
    .bind(&r.entity)
    .bind(body)
    .bind(conversation)
    .bind(now_ms())
    .bind(size)
    .execute(&mut *tx)
    .await?;
    let dropped: Vec<i64> = sqlx::query_scalar(
        "DELETE FROM stored_responses WHERE entity = $1 AND seq <= (
             SELECT seq FROM stored_responses WHERE entity = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)
         RETURNING size_bytes",
    )
    .bind(&r.entity)
    .bind(keep as i64)
    .fetch_all(&mut *tx)
    .await?;
    super::storage::release(&mut tx, &r.entity, dropped.iter().sum()).await?;
    super::storage::charge(&mut tx, &r.entity, size, quota).await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn get(pool: &PgPool, entity: &str, id: &str) -> Result<StoredResponse> {
    if has_nul(&[Some(entity), Some(id)]) {
        return Err(StoreError::NotFound);
    }
    let row = sqlx::query("SELECT id, entity, body, conversation FROM stored_responses WHERE id = $1 AND entity = $2")
        .bind(id)
        .bind(entity)
        .fetch_one(pool)
        .await?;
    Ok(StoredResponse {
        id: row.try_get("id")?,
        entity: row.try_get("entity")?,
        body: rows::json(&row, "body")?,
        conversation: rows::json(&row, "conversation")?,
    })
}

pub(crate) async fn delete(pool: &PgPool, entity: &str, id: &str) -> Result<()> {
    if has_nul(&[Some(entity), Some(id)]) {
        return Err(StoreError::NotFound);
    }
    let mut tx = pool.begin().await?;
    let size: Option<i64> =
        sqlx::query_scalar("DELETE FROM stored_responses WHERE id = $1 AND entity = $2 RETURNING size_bytes")
            .bind(id)
            .bind(entity)
            .fetch_optional(&mut *tx)
            .await?;
    let size = size.ok_or(StoreError::NotFound)?;
    super::storage::release(&mut tx, entity, size).await?;
    tx.commit().await?;
    Ok(())
}
