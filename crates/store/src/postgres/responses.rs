//! Stored Responses in PostgreSQL. An entity keeps at most a bounded number: inserting past the
//! bound drops that entity's oldest, in the same transaction, under the entity's lock so that
//! concurrent inserts count each other.

use super::{has_nul, lock_key, rows};
use crate::{now_ms, Result, StoreError, StoredResponse};
use sqlx::{PgPool, Row};

pub(crate) async fn put(pool: &PgPool, r: &StoredResponse, keep: usize) -> Result<()> {
    let mut tx = pool.begin().await?;
    lock_key(&mut tx, "responses", &r.entity).await?;
    sqlx::query(
        "INSERT INTO stored_responses (id, entity, body, conversation, created_at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&r.id)
    .bind(&r.entity)
    .bind(r.body.to_string())
    .bind(r.conversation.to_string())
    .bind(now_ms())
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "DELETE FROM stored_responses WHERE entity = $1 AND seq <= (
             SELECT seq FROM stored_responses WHERE entity = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)",
    )
    .bind(&r.entity)
    .bind(keep as i64)
    .execute(&mut *tx)
    .await?;
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
    let done = sqlx::query("DELETE FROM stored_responses WHERE id = $1 AND entity = $2")
        .bind(id)
        .bind(entity)
        .execute(pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound);
    }
    Ok(())
}
