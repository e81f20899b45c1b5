//! Stored Responses in SQLite. An entity keeps at most a bounded number: inserting past the bound
//! drops that entity's oldest, in the same transaction.

use crate::{now_ms, Result, StoredResponse};
use sqlx::{Row, SqlitePool};

pub(crate) async fn put(pool: &SqlitePool, r: &StoredResponse, keep: usize, quota: Option<i64>) -> Result<()> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let (body, conversation) = (r.body.to_string(), r.conversation.to_string());
    let size = (body.len() + conversation.len()) as i64;
    sqlx::query(
        "INSERT INTO stored_responses (id, entity, body, conversation, created_at, size_bytes) VALUES (?, ?, ?, ?, ?, ?)",
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
        "DELETE FROM stored_responses WHERE entity = ? AND seq <= (
             SELECT seq FROM stored_responses WHERE entity = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)
         RETURNING size_bytes",
    )
    .bind(&r.entity)
    .bind(&r.entity)
    .bind(keep as i64)
    .fetch_all(&mut *tx)
    .await?;
    super::storage::release(&mut tx, &r.entity, dropped.iter().sum()).await?;
    super::storage::charge(&mut tx, &r.entity, size, quota).await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn get(pool: &SqlitePool, entity: &str, id: &str) -> Result<StoredResponse> {
    let row = sqlx::query("SELECT id, entity, body, conversation FROM stored_responses WHERE id = ? AND entity = ?")
        .bind(id)
        .bind(entity)
        .fetch_one(pool)
        .await?;
    Ok(StoredResponse {
        id: row.try_get("id")?,
        entity: row.try_get("entity")?,
        body: super::rows::json(&row, "body")?,
        conversation: super::rows::json(&row, "conversation")?,
    })
}

pub(crate) async fn delete(pool: &SqlitePool, entity: &str, id: &str) -> Result<()> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let size: Option<i64> =
        sqlx::query_scalar("DELETE FROM stored_responses WHERE id = ? AND entity = ? RETURNING size_bytes")
            .bind(id)
            .bind(entity)
            .fetch_optional(&mut *tx)
            .await?;
    let size = size.ok_or(crate::StoreError::NotFound)?;
    super::storage::release(&mut tx, entity, size).await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SqliteStore, Store, StoreError};

    #[tokio::test]
    async fn an_entity_keeps_its_newest_responses_only() {
        let store = SqliteStore::in_memory().await.unwrap();
        let r = |id: &str, entity: &str| StoredResponse {
            id: id.into(),
            entity: entity.into(),
            body: serde_json::json!({}),
            conversation: serde_json::json!([]),
        };
        put(&store.pool, &r("other", "b"), 2, None).await.unwrap();
        for id in ["r1", "r2", "r3"] {
            put(&store.pool, &r(id, "a"), 2, None).await.unwrap();
        }
        assert!(matches!(store.get_response("a", "r1").await, Err(StoreError::NotFound)), "the oldest went");
        for id in ["r2", "r3"] {
            store.get_response("a", id).await.unwrap();
        }
        store.get_response("b", "other").await.expect("another entity's are not counted");
    }
}
