//! The node registry in SQLite (one process: its own row, so that both backends answer alike).

use crate::codec::{node_records, NodeRow, NODE_COLUMNS};
use crate::{now_ms, NodeBeat, NodeRecord, Result, StoreError, NODE_LISTED_MS};
use sqlx::SqlitePool;

pub(crate) async fn heartbeat(pool: &SqlitePool, beat: &NodeBeat) -> Result<bool> {
    let now = now_ms();
    let draining: bool = sqlx::query_scalar(
        "INSERT INTO nodes (id, name, role, version, started_at, heartbeat_at, busy, address)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, busy = excluded.busy, address = excluded.address
         RETURNING draining",
    )
    .bind(&beat.id)
    .bind(&beat.name)
    .bind(&beat.role)
    .bind(&beat.version)
    .bind(now)
    .bind(beat.busy)
    .bind(&beat.address)
    .fetch_one(pool)
    .await?;
    sqlx::query("DELETE FROM nodes WHERE heartbeat_at < ?").bind(now - 86_400_000).execute(pool).await?;
    Ok(draining)
}

pub(crate) async fn list(pool: &SqlitePool, which: Option<&str>) -> Result<Vec<NodeRecord>> {
    let now = now_ms();
    let sql = format!(
        "SELECT {NODE_COLUMNS} FROM nodes WHERE heartbeat_at >= ?1 AND (?2 IS NULL OR id = ?2 OR name = ?2)
         ORDER BY name, started_at"
    );
    let rows: Vec<NodeRow> = sqlx::query_as(&sql).bind(now - NODE_LISTED_MS).bind(which).fetch_all(pool).await?;
    Ok(node_records(rows, now))
}

pub(crate) async fn set_draining(pool: &SqlitePool, which: &str, draining: bool) -> Result<Vec<NodeRecord>> {
    let changed = sqlx::query("UPDATE nodes SET draining = ?1 WHERE (id = ?2 OR name = ?2) AND heartbeat_at >= ?3")
        .bind(draining)
        .bind(which)
        .bind(now_ms() - NODE_LISTED_MS)
        .execute(pool)
        .await?;
    if changed.rows_affected() == 0 {
        return Err(StoreError::NotFound);
    }
    list(pool, Some(which)).await
}

pub(crate) async fn remove(pool: &SqlitePool, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM nodes WHERE id = ?").bind(id).execute(pool).await?;
    Ok(())
}
