//! `tandem store copy` below the command line: a SQLite store with every kind of record is copied
//! into PostgreSQL (a fresh schema; skipped loudly without a server, as the behaviour suite is)
//! and from there into a new SQLite file, and each copy answers the `Store` methods as the
//! original does: the same ids, pages in the same order, the same bytes. A non-empty target is
//! refused, and rows made after a copy sort after the copied ones.

use serde_json::json;
use std::collections::BTreeMap;
use tandem_core::records::{JobKind, PageRequest};
use tandem_store::copy::{copy_files, copy_records, Endpoint};
use tandem_store::{
    ApiKeyRecord, BlobStore, CheckpointDir, Checkpoints, DatasetData, JobOutcome, NewCheckpoint, NewDataset, NewJob,
    NewLog, NewModel, SqliteStore, Store, StoreError, StoredResponse,
};
use uuid::Uuid;

mod common;

async fn fill(store: &dyn Store) -> (Uuid, Uuid) {
    for (i, entity) in ["alice", "bob"].iter().enumerate() {
        store
            .insert_key(&ApiKeyRecord {
                id: Uuid::now_v7(),
                entity: entity.to_string(),
                key_hash: [i as u8 + 1; 32],
                prefix: format!("tdm_{i}"),
                created_at: 1,
                revoked_at: None,
            })
            .await
            .unwrap();
    }
    let new = |entity: &str, name: &str| NewModel {
        entity: entity.into(),
        project: "p".into(),
        name: name.into(),
        base_model: "base".into(),
    };
    let (model, _) = store.create_model(&new("alice", "m1"), false).await.unwrap();
    for name in ["m2", "m3"] {
        store.create_model(&new("alice", name), false).await.unwrap();
    }
    store.create_model(&new("bob", "m1"), false).await.unwrap();
    // A job that succeeded with a checkpoint and its events.
    let job = store
        .create_job(&NewJob {
            model_id: model.id,
            kind: JobKind::Rl,
            config: json!({"lr": 1e-5}),
            inputs: json!([]),
            rollout: None,
        })
        .await
        .unwrap();
    store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
    let cp = NewCheckpoint {
        id: Uuid::now_v7(),
        model_id: model.id,
        step: 1,
        path: format!("{}/{}", model.id, Uuid::now_v7()),
        metrics: BTreeMap::from([("train/loss".to_string(), 0.25)]),
        size_bytes: 1000,
    };
    let outcome = JobOutcome::Succeeded { checkpoint: cp.clone(), event_data: json!({"step": 1}) };
    store.finish_job(job.id, tandem_store::TEST_OWNER, &outcome).await.unwrap();
    // Logs whose JSON text must arrive byte for byte (key order, escapes, non-ASCII).
    for i in 0..5 {
        let groups = json!([{"trajectories": [{"reward": i, "z": "\u{1F600} \\u0000 é", "a": [1, 2.5, null]}]}]);
        store
            .append_log(&NewLog {
                model_id: model.id,
                split: if i % 2 == 0 { "train" } else { "val" }.into(),
                metrics: BTreeMap::from([("reward".to_string(), i as f64)]),
                num_groups: 1,
                num_trajectories: 1,
                trajectory_groups: groups,
            })
            .await
            .unwrap();
    }
    store
        .create_dataset(&NewDataset {
            entity: "alice".into(),
            project: "p".into(),
            name: "d".into(),
            num_rows: 2,
            data: DatasetData::Inline(b"{\"messages\": []}\n{\"messages\": []}\n\xff".to_vec()),
        })
        .await
        .unwrap();
    store
        .put_response(&StoredResponse {
            id: "resp_1".into(),
            entity: "alice".into(),
            body: json!({"id": "resp_1", "output": []}),
            conversation: json!([{"role": "user", "content": "hi"}]),
        })
        .await
        .unwrap();
    (model.id, job.id)
}

/// What the `Store` methods answer about everything `fill` wrote.
async fn answers(store: &dyn Store, model_id: Uuid, job_id: Uuid) -> serde_json::Value {
    let page = PageRequest::first(100);
    let models: Vec<_> = store.list_models("alice", None, None, page).await.unwrap().items;
    let logs = store.list_logs(model_id, None, page).await.unwrap().items;
    let mut groups = Vec::new();
    for log in &logs {
        groups.push(store.get_log(model_id, log.id).await.unwrap().1);
    }
    let checkpoints = store.list_checkpoints(model_id, page).await.unwrap().items;
    let events = store.list_events("alice", job_id, page).await.unwrap().items;
    let datasets = store.list_datasets("alice", None, page).await.unwrap().items;
    let key = store.find_active_key(&[2; 32]).await.unwrap().map(|k| (k.id, k.entity));
    let response = store.get_response("alice", "resp_1").await.unwrap().body;
    json!({
        "models": models.iter().map(|m| (m.id, m.name.clone(), m.created_at)).collect::<Vec<_>>(),
        "logs": logs.iter().map(|l| (l.id, l.split.clone(), l.step)).collect::<Vec<_>>(),
        "groups": groups,
        "checkpoints": checkpoints.iter().map(|c| (c.id, c.step, c.path.clone())).collect::<Vec<_>>(),
        "events": events.iter().map(|e| (e.id, format!("{:?}", e.kind), e.data.clone())).collect::<Vec<_>>(),
        "datasets": datasets.iter().map(|d| (d.id, d.name.clone(), d.size_bytes)).collect::<Vec<_>>(),
        "key": key,
        "response": response,
        "job": store.get_job("alice", job_id).await.unwrap().status.as_str(),
    })
}

#[tokio::test]
async fn sqlite_to_postgres_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let source = SqliteStore::open(&dir.path().join("source.db")).await.unwrap();
    let (model_id, job_id) = fill(&source).await;
    let want = answers(&source, model_id, job_id).await;

    let Some((pg, _scratch)) = common::postgres().await else { return };
    let first = copy_records(&Endpoint::Sqlite(&source), &Endpoint::Postgres(&pg)).await.unwrap();
    let rows = |name: &str| first.iter().find(|t| t.table == name).unwrap().rows;
    assert_eq!((rows("api_keys"), rows("models"), rows("trajectory_logs"), rows("datasets")), (2, 4, 5, 1));
    assert!(rows("job_events") >= 1 && rows("checkpoints") == 1 && rows("stored_responses") == 1, "{first:?}");
    assert_eq!(answers(&pg, model_id, job_id).await, want, "PostgreSQL answers as the SQLite source did");

    // A second copy into it is refused, and leaves it as it was.
    let again = copy_records(&Endpoint::Sqlite(&source), &Endpoint::Postgres(&pg)).await;
    assert!(matches!(&again, Err(StoreError::Conflict(m)) if m.contains("not empty")), "{again:?}");

    // Back into a new SQLite file: the same rows, digests and answers.
    let back = SqliteStore::open(&dir.path().join("back.db")).await.unwrap();
    let second = copy_records(&Endpoint::Postgres(&pg), &Endpoint::Sqlite(&back)).await.unwrap();
    assert_eq!(second, first, "the same rows and digests both ways");
    assert_eq!(answers(&back, model_id, job_id).await, want);

    // New rows sort after the copied ones on both (identity and rowid go on from the maximum).
    for store in [&pg as &dyn Store, &back as &dyn Store] {
        let new =
            NewModel { entity: "alice".into(), project: "p".into(), name: "after".into(), base_model: "base".into() };
        let (made, _) = store.create_model(&new, false).await.unwrap();
        let listed = store.list_models("alice", None, None, PageRequest::first(100)).await.unwrap().items;
        assert_eq!(listed.len(), 4);
        assert!(
            listed.first().unwrap().id == made.id || listed.last().unwrap().id == made.id,
            "new model not at an end"
        );
        let position = listed.iter().position(|m| m.id == made.id).unwrap();
        let original = listed.iter().position(|m| m.id == model_id).unwrap();
        // Newest first or oldest first, the new model and the first copied one are at opposite ends.
        assert_eq!(position.abs_diff(original), 3);
    }
}

#[tokio::test]
async fn checkpoint_files_go_into_the_blob_store_and_missing_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let local = CheckpointDir::open(dir.path().join("checkpoints")).unwrap();
    let relative = format!("{}/{}", Uuid::now_v7(), Uuid::now_v7());
    local.write_atomic(&relative, &[("adapter_model.safetensors", b"weights".as_slice())]).unwrap();
    let blobs = BlobStore::open(&format!("file://{}", dir.path().join("blobs").display())).unwrap();
    let checkpoints = Checkpoints::with_remote(local.clone(), blobs.clone());
    let live = vec![relative.clone(), "gone/entirely".to_string()];
    let report = copy_files(&live, &checkpoints).await.unwrap();
    assert_eq!((report.uploaded, report.in_blob_store), (1, 0));
    assert_eq!(report.missing, vec!["gone/entirely".to_string()]);
    // Another node (an empty cache) now finds the files in the blob store.
    let elsewhere = Checkpoints::with_remote(CheckpointDir::open(dir.path().join("other")).unwrap(), blobs);
    let fetched = elsewhere.local_dir(&relative).await.unwrap().expect("in the blob store");
    assert_eq!(std::fs::read(fetched.join("adapter_model.safetensors")).unwrap(), b"weights");
    // Run again from that node (nothing local): counted as already there.
    let report = copy_files(
        &[relative],
        &Checkpoints::with_remote(
            CheckpointDir::open(dir.path().join("third")).unwrap(),
            elsewhere.remote().unwrap().clone(),
        ),
    )
    .await
    .unwrap();
    assert_eq!((report.uploaded, report.in_blob_store, report.missing.len()), (0, 1, 0));
}
