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

/// Migration 0013 counts what older versions stored as the live accounting counts it: with every
/// row's size and every entity's count wiped, its UPDATEs and INSERT rebuild the same numbers
/// (checkpoints aside, whose file sizes an older database never held).
#[tokio::test]
async fn the_storage_migration_counts_old_rows_as_writes_count_them() {
    use serde_json::json;
    let store = SqliteStore::in_memory().await.unwrap();
    for entity in ["a", "b"] {
        let new =
            crate::NewModel { entity: entity.into(), project: "p".into(), name: "m".into(), base_model: "b".into() };
        let (m, _) = store.create_model(&new, false).await.unwrap();
        let log = crate::NewLog {
            model_id: m.id,
            split: "train".into(),
            metrics: BTreeMap::from([("reward".to_string(), 0.25)]),
            num_groups: 1,
            num_trajectories: 1,
            trajectory_groups: json!([{ "t": format!("{entity} é \u{0} ünïcödé") }]),
        };
        store.append_log(&log).await.unwrap();
        let rollout = crate::Rollout { metrics: BTreeMap::new(), groups: json!([{ "g": "rollout" }]) };
        let job = crate::NewJob {
            model_id: m.id,
            kind: tandem_core::records::JobKind::Rl,
            config: json!({ "lr": 1e-5 }),
            inputs: json!(["ïnputs"]),
            rollout: Some(rollout),
        };
        store.create_job(&job).await.unwrap();
        let data = crate::DatasetData::Inline(b"{\"messages\": []}\n".to_vec());
        let d = crate::NewDataset { entity: entity.into(), project: "p".into(), name: "d".into(), num_rows: 1, data };
        store.create_dataset(&d).await.unwrap();
        let r = crate::StoredResponse {
            id: format!("resp_{entity}"),
            entity: entity.into(),
            body: json!({ "output": "ö" }),
            conversation: json!([{ "role": "user", "content": "hi" }]),
        };
        store.put_response(&r).await.unwrap();
        let state = crate::TinkerEntry {
            owner: entity.into(),
            key: tandem_core::tinker::CheckpointKey::new(
                &format!("{entity}:train:0"),
                tandem_core::tinker::CheckpointKind::Weights,
                "s",
            ),
            size_bytes: 777,
            created_at: 1,
            expires_at: None,
            public: false,
            blob: Some(format!("tinker/{entity}")),
            meta: json!({}),
        };
        crate::TinkerCatalog::tinker_put(&store, &state, None).await.unwrap();
    }
    let live = store.list_storage().await.unwrap();
    assert_eq!(live.len(), 2);
    assert!(live.iter().all(|u| u.used_bytes > 1024 + 777), "{live:?}");
    for table in ["trajectory_logs", "training_jobs", "stored_responses"] {
        sqlx::query(&format!("UPDATE {table} SET size_bytes = 0")).execute(&store.pool).await.unwrap();
    }
    sqlx::query("DELETE FROM entity_storage").execute(&store.pool).await.unwrap();
    let migration = include_str!("../../migrations/sqlite/0013_entity_storage.sql");
    let recount: Vec<String> = migration
        .split(';')
        .map(|s| s.trim_start_matches(|c: char| c.is_whitespace()))
        .map(|s| s.lines().filter(|l| !l.trim_start().starts_with("--")).collect::<Vec<_>>().join("\n"))
        .filter(|s| s.starts_with("UPDATE") || s.starts_with("INSERT"))
        .collect();
    assert_eq!(recount.len(), 4, "three UPDATEs and the INSERT");
    for statement in &recount {
        sqlx::query(statement).execute(&store.pool).await.unwrap();
    }
    assert_eq!(store.list_storage().await.unwrap(), live);
}
