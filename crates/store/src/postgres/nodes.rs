//! The node registry in PostgreSQL: beats and liveness by the database's clock, so nodes' clocks
//! need not agree.

use super::DB_NOW_MS;
use crate::codec::{node_records, NodeRow, NODE_COLUMNS};
use crate::{NodeBeat, NodeRecord, Result, StoreError, NODE_LISTED_MS};
use sqlx::PgPool;

pub(crate) async fn heartbeat(pool: &PgPool, beat: &NodeBeat) -> Result<bool> {
    let sql = format!(
        "INSERT INTO nodes (id, name, role, version, started_at, heartbeat_at, busy, address)
         VALUES ($1, $2, $3, $4, {DB_NOW_MS}, {DB_NOW_MS}, $5, $6)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, busy = excluded.busy, address = excluded.address
         RETURNING draining"
    );
    let draining: bool = sqlx::query_scalar(&sql)
        .bind(&beat.id)
        .bind(&beat.name)
        .bind(&beat.role)
        .bind(&beat.version)
        .bind(beat.busy)
        .bind(&beat.address)
        .fetch_one(pool)
        .await?;
    sqlx::query(&format!("DELETE FROM nodes WHERE heartbeat_at < {DB_NOW_MS} - 86400000")).execute(pool).await?;
    Ok(draining)
}

pub(crate) async fn list(pool: &PgPool, which: Option<&str>) -> Result<Vec<NodeRecord>> {
    let now: i64 = sqlx::query_scalar(&format!("SELECT {DB_NOW_MS}")).fetch_one(pool).await?;
    let sql = format!(
        "SELECT {NODE_COLUMNS} FROM nodes WHERE heartbeat_at >= $1 AND ($2::text IS NULL OR id = $2 OR name = $2)
         ORDER BY name, started_at"
    );
    let rows: Vec<NodeRow> = sqlx::query_as(&sql).bind(now - NODE_LISTED_MS).bind(which).fetch_all(pool).await?;
    Ok(node_records(rows, now))
}

pub(crate) async fn set_draining(pool: &PgPool, which: &str, draining: bool) -> Result<Vec<NodeRecord>> {
    let sql =
        format!("UPDATE nodes SET draining = $1 WHERE (id = $2 OR name = $2) AND heartbeat_at >= {DB_NOW_MS} - $3");
    let changed = sqlx::query(&sql).bind(draining).bind(which).bind(NODE_LISTED_MS).execute(pool).await?;
    if changed.rows_affected() == 0 {
        return Err(StoreError::NotFound);
    }
    list(pool, Some(which)).await
}

pub(crate) async fn remove(pool: &PgPool, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM nodes WHERE id = $1").bind(id).execute(pool).await?;
    Ok(())
}
