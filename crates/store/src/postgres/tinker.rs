//! The Tinker catalog in PostgreSQL: the shared statements (`crate::tinker`); an owner's writers
//! take its advisory lock, so a capped save's count and insert are one step across nodes.

fn sql(q: &str) -> String {
    q.to_string()
}

async fn begin(pool: &sqlx::PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    Ok(pool.begin().await?)
}

async fn lock_owner(conn: &mut sqlx::PgConnection, owner: &str) -> Result<()> {
    super::lock_key(conn, "tinker", owner).await
}

crate::tinker::catalog_backend!(
    super::PostgresStore,
    sqlx::PgPool,
    sqlx::Postgres,
    sqlx::postgres::PgRow,
    sql,
    begin,
    lock_owner
);
