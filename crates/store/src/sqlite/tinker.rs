//! The Tinker catalog in SQLite: the shared statements (`crate::tinker`), with `?N` parameters;
//! `BEGIN IMMEDIATE` makes each write transaction the only writer, so no lock is needed.

fn sql(q: &str) -> String {
    q.replace('$', "?")
}

async fn begin(pool: &sqlx::SqlitePool) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
    Ok(pool.begin_with("BEGIN IMMEDIATE").await?)
}

async fn no_lock(_: &mut sqlx::SqliteConnection, _: &str) -> Result<()> {
    Ok(())
}

crate::tinker::catalog_backend!(
    super::SqliteStore,
    sqlx::SqlitePool,
    sqlx::Sqlite,
    sqlx::sqlite::SqliteRow,
    sql,
    begin,
    no_lock
);
