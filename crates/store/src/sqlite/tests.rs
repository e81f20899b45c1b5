//! SQLite-only checks of what older versions left in the database.

use super::*;
use crate::Store;
use std::collections::BTreeMap;

/// Rows that an older version wrote with a `null` for a non-finite metric stay readable (the
/// nulls are skipped), and migration 0003 removes those nulls from the stored JSON.
#[tokio::test]
async fn non_finite_metrics_never_make_rows_unreadable() {
    let store = SqliteStore::in_memory().await.unwrap();
    let (m, _) = store
        .create_model(
            &crate::NewModel { entity: "a".into(), project: "p".into(), name: "m".into(), base_model: "b".into() },
            false,
        )
        .await
        .unwrap();
    let broken = r#"{"reward": null, "loss": 0.5, "note": "x"}"#;
    sqlx::query("INSERT INTO checkpoints (id, model_id, step, path, metrics, created_at) VALUES (?, ?, 1, 'p', ?, 0)")
        .bind(Uuid::now_v7().to_string())
        .bind(m.id.to_string())
        .bind(broken)
        .execute(&store.pool)
        .await
        .unwrap();
    let cp = store.get_checkpoint(m.id, 1).await.unwrap();
    assert_eq!(cp.metrics, BTreeMap::from([("loss".to_string(), 0.5)]));

    sqlx::raw_sql(include_str!("../../migrations/sqlite/0003_finite_metrics.sql")).execute(&store.pool).await.unwrap();
    let stored: String = sqlx::query_scalar("SELECT metrics FROM checkpoints").fetch_one(&store.pool).await.unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&stored).unwrap(), serde_json::json!({"loss": 0.5}));

    // Written through the store, a non-finite value is never stored at all.
    let log = crate::NewLog {
        model_id: m.id,
        split: "train".into(),
        metrics: BTreeMap::from([("a".to_string(), f64::INFINITY), ("b".to_string(), 1.0)]),
        num_groups: 0,
        num_trajectories: 0,
        trajectory_groups: serde_json::json!([]),
    };
    store.append_log(&log).await.unwrap();
    let stored: String =
        sqlx::query_scalar("SELECT metrics FROM trajectory_logs").fetch_one(&store.pool).await.unwrap();
    assert_eq!(stored, r#"{"b":1.0}"#);
    let cp = store.get_checkpoint(m.id, 1).await.unwrap();
    assert_eq!(cp.metrics.get("a"), None, "the log's metrics reach the checkpoint finite too");
}

/// A database that fills up (capped with `max_page_count`, as a full disk refuses pages) fails
/// writes as `Full`, and leaves no pooled connection unusable: the one connection of this pool
/// takes transactions again at once (sqlx left it "inside" a transaction SQLite had rolled back).
#[tokio::test]
async fn a_full_database_fails_writes_as_full_and_poisons_no_connection() {
    let dir = tempfile::tempdir().unwrap();
    let options = connect_options(&dir.path().join("t.db")).unwrap().pragma("max_page_count", "48");
    let pool = pool_options(PoolSettings { size: Some(1), ..Default::default() }).connect_with(options).await.unwrap();
    sqlx::query("CREATE TABLE t (x TEXT)").execute(&pool).await.unwrap();
    let mut failure = None;
    for _ in 0..500 {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let wrote = sqlx::query("INSERT INTO t VALUES (?)").bind("x".repeat(3000)).execute(&mut *tx).await;
        if let Err(e) = wrote.map(drop).and(Ok(())) {
            failure = Some(e);
            break;
        }
        if let Err(e) = tx.commit().await {
            failure = Some(e);
            break;
        }
    }
    let e = StoreError::from(failure.expect("the capped database fills up"));
    assert!(matches!(e, StoreError::Full(_)), "{e:?}");
    for _ in 0..3 {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("the connection takes a new transaction");
        sqlx::query("SELECT count(*) FROM t").execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
    }
    let ok: String = sqlx::query_scalar("PRAGMA integrity_check").fetch_one(&pool).await.unwrap();
    assert_eq!(ok, "ok");
}
