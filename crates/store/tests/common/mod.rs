//! The PostgreSQL side of the store tests: a fresh schema per test when a server answers.
// Each test crate uses part of this.
#![allow(dead_code)]

use std::sync::Arc;
use tandem_store::{PostgresStore, SqliteStore, Store};
use uuid::Uuid;

/// What a backend leaves behind, removed when the test's loop iteration ends.
pub enum Scratch {
    Dir(tempfile::TempDir),
    Schema { url: String, schema: String },
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Scratch::Schema { url, schema } = self else { return };
        let (url, schema) = (url.clone(), schema.clone());
        // `Drop` cannot await, and the test's runtime may be a current-thread one that this very
        // call blocks: drop the schema from a runtime of its own, on a thread of its own.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            rt.block_on(PostgresStore::drop_schema(&url, &schema)).map_err(|e| format!("{schema}: {e}"))
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("left the test schema behind: {e}"),
            Err(_) => eprintln!("left a test schema behind: dropping it panicked"),
        }
    }
}

pub fn postgres_url() -> String {
    std::env::var("TANDEM_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A store in a fresh schema of the test database, or None (said loudly) when no server answers.
pub async fn postgres() -> Option<(PostgresStore, Scratch)> {
    use sqlx::Connection;
    let url = postgres_url();
    let probe = tokio::time::timeout(std::time::Duration::from_secs(5), sqlx::PgConnection::connect(&url)).await;
    let reason = match probe {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            None
        }
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("no answer within 5 s".to_string()),
    };
    if let Some(reason) = reason {
        if std::env::var("TANDEM_REQUIRE_POSTGRES").as_deref() == Ok("1") {
            panic!("TANDEM_REQUIRE_POSTGRES=1 but PostgreSQL at {url} does not answer: {reason}");
        }
        eprintln!("SKIPPED PostgreSQL: {url}: {reason}");
        return None;
    }
    // The server answers: from here on, any failure is the backend's.
    let schema = format!("tandem_test_{}", Uuid::new_v4().simple());
    let store = PostgresStore::connect_in_schema(&url, &schema).await.unwrap();
    Some((store, Scratch::Schema { url, schema }))
}

/// Every backend the behaviour suites run on: SQLite in memory and on disk, and PostgreSQL when a
/// server answers; each with what it leaves behind.
pub async fn backends() -> Vec<(String, Arc<dyn Store>, Option<Scratch>)> {
    backends_with_quota(None).await
}

/// [`backends`] whose entities are held to `quota` bytes of stored data by default.
pub async fn backends_with_quota(quota: Option<i64>) -> Vec<(String, Arc<dyn Store>, Option<Scratch>)> {
    let dir = tempfile::tempdir().unwrap();
    let file = SqliteStore::open(&dir.path().join("t.db")).await.unwrap().with_storage_quota(quota);
    let memory = SqliteStore::in_memory().await.unwrap().with_storage_quota(quota);
    let mut all: Vec<(String, Arc<dyn Store>, Option<Scratch>)> = vec![
        ("sqlite-memory".into(), Arc::new(memory), None),
        ("sqlite-file".into(), Arc::new(file), Some(Scratch::Dir(dir))),
    ];
    if let Some((store, scratch)) = postgres().await {
        all.push(("postgres".into(), Arc::new(store.with_storage_quota(quota)), Some(scratch)));
    }
    all
}
