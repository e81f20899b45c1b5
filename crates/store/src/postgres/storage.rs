//! Per-entity storage in PostgreSQL: the shared statements (`crate::storage`) as written. The
//! charge's upsert locks the entity's row until the commit, which orders concurrent charges of
//! one entity; it is the last statement of every transaction that makes one.

use crate::Result;

fn sql(q: &str) -> String {
    q.to_string()
}

crate::storage::storage_backend!(sqlx::PgConnection, sqlx::postgres::PgRow, sql);
