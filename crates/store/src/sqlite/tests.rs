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
