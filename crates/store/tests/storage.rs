//! Per-entity storage on every backend (SQLite in memory and on disk, PostgreSQL when it
//! answers): every kind of stored data is counted when written and freed when deleted, a quota
//! refuses the write that would pass it and leaves nothing of it behind, other entities are
//! untouched, an operator's per-entity quota overrides the default, and concurrent writers of
//! one entity cannot pass its quota together.

use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use tandem_core::records::{JobKind, JobStatus, PageRequest};
use tandem_core::tinker::{CheckpointKey, CheckpointKind};
use tandem_store::{
    DatasetData, EntityQuota, JobOutcome, NewCheckpoint, NewDataset, NewJob, NewLog, NewModel, Store, StoreError,
    StoredResponse, TinkerEntry, MODEL_ROW_BYTES,
};
use uuid::Uuid;

mod common;
use common::backends_with_quota;

async fn used(store: &dyn Store, entity: &str) -> i64 {
    store.storage_usage(entity).await.unwrap().used_bytes
}

async fn model(store: &dyn Store, entity: &str, name: &str) -> Uuid {
    let new = NewModel { entity: entity.into(), project: "p".into(), name: name.into(), base_model: "b".into() };
    store.create_model(&new, false).await.unwrap().0.id
}

fn dataset(entity: &str, bytes: usize) -> NewDataset {
    NewDataset {
        entity: entity.into(),
        project: "p".into(),
        name: "d".into(),
        num_rows: 1,
        data: DatasetData::Inline(vec![b'x'; bytes]),
    }
}

fn log(model_id: Uuid, text: &str) -> NewLog {
    NewLog {
        model_id,
        split: "val".into(),
        metrics: BTreeMap::new(),
        num_groups: 1,
        num_trajectories: 1,
        trajectory_groups: json!([{ "t": text }]),
    }
}

fn job(model_id: Uuid, text: &str) -> NewJob {
    NewJob { model_id, kind: JobKind::Rl, config: json!({}), inputs: json!([text]), rollout: None }
}

fn checkpoint(model_id: Uuid, step: i64, size_bytes: i64) -> NewCheckpoint {
    NewCheckpoint {
        id: Uuid::now_v7(),
        model_id,
        step,
        path: format!("{model_id}/{step}"),
        metrics: BTreeMap::new(),
        size_bytes,
    }
}

fn state(owner: &str, name: &str, size_bytes: i64) -> TinkerEntry {
    TinkerEntry {
        owner: owner.into(),
        key: CheckpointKey::new(&format!("{owner}-s:train:0"), CheckpointKind::Weights, name),
        size_bytes,
        created_at: 1,
        expires_at: None,
        public: false,
        blob: Some(format!("tinker/{owner}-{name}")),
        meta: json!({}),
    }
}

fn over(r: Result<impl std::fmt::Debug, StoreError>) -> tandem_store::OverQuota {
    match r {
        Err(StoreError::OverQuota(o)) => o,
        other => panic!("expected OverQuota, got {other:?}"),
    }
}

#[tokio::test]
async fn every_kind_of_data_is_counted_and_freed() {
    for (name, store, _scratch) in backends_with_quota(None).await {
        let store: &dyn Store = &*store;
        let m = model(store, "alice", "m").await;
        assert_eq!(used(store, "alice").await, MODEL_ROW_BYTES, "{name}: a model counts its record");
        // A log counts its groups' and metrics' JSON text.
        store.append_log(&log(m, &"g".repeat(500))).await.unwrap();
        let after_log = used(store, "alice").await;
        assert!((500..600).contains(&(after_log - MODEL_ROW_BYTES)), "{name}: {after_log}");
        store.create_dataset(&dataset("alice", 1000)).await.unwrap();
        assert_eq!(used(store, "alice").await, after_log + 1000, "{name}");
        // A job's inputs, then its checkpoint's files.
        let j = store.create_job(&job(m, &"i".repeat(300))).await.unwrap();
        let after_job = used(store, "alice").await;
        assert!((after_log + 1300..after_log + 1400).contains(&after_job), "{name}: {after_job}");
        store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
        let outcome = JobOutcome::Succeeded { checkpoint: checkpoint(m, 1, 4000), event_data: json!({"step": 1}) };
        store.finish_job(j.id, tandem_store::TEST_OWNER, &outcome).await.unwrap();
        assert_eq!(used(store, "alice").await, after_job + 4000, "{name}");
        store.import_checkpoint(m, Uuid::now_v7(), "m/imported", 700).await.unwrap();
        assert_eq!(used(store, "alice").await, after_job + 4700, "{name}");
        // A Tinker state counts its files; saving over its name counts the new files only; a
        // sampler entry (no files of its own: its checkpoint counted) nothing.
        store.tinker_put(&state("alice", "s", 900), None).await.unwrap();
        store.tinker_put(&state("alice", "s", 600), None).await.unwrap();
        let sampler = TinkerEntry {
            key: CheckpointKey::new("alice-s:train:0", CheckpointKind::SamplerWeights, "x"),
            blob: None,
            ..state("alice", "x", 5000)
        };
        store.tinker_put(&sampler, None).await.unwrap();
        assert_eq!(used(store, "alice").await, after_job + 5300, "{name}");
        // A stored Response counts its body and conversation.
        let r = StoredResponse {
            id: "resp_1".into(),
            entity: "alice".into(),
            body: json!({ "o": "r".repeat(200) }),
            conversation: json!([]),
        };
        store.put_response(&r).await.unwrap();
        let with_response = used(store, "alice").await;
        assert!((after_job + 5500..after_job + 5530).contains(&with_response), "{name}: {with_response}");
        assert_eq!(used(store, "bob").await, 0, "{name}: nothing of alice's is bob's");

        // Deleting frees exactly what was counted.
        store.delete_response("alice", "resp_1").await.unwrap();
        assert_eq!(used(store, "alice").await, after_job + 5300, "{name}");
        store.tinker_delete("alice", &state("alice", "s", 0).key).await.unwrap();
        assert_eq!(used(store, "alice").await, after_job + 4700, "{name}");
        store.delete_checkpoints(m, &[1]).await.unwrap();
        assert_eq!(used(store, "alice").await, after_job + 700, "{name}");
        let d = store.list_datasets("alice", None, PageRequest::first(10)).await.unwrap().items[0].id;
        store.delete_dataset("alice", d).await.unwrap();
        assert_eq!(used(store, "alice").await, after_job - 1000 + 700, "{name}");
        // The model takes its record, logs, jobs and live checkpoints along (the deleted one is
        // not freed twice).
        store.delete_model("alice", m).await.unwrap();
        assert_eq!(used(store, "alice").await, 0, "{name}");
        let listed = store.list_storage().await.unwrap();
        assert_eq!(listed.iter().map(|u| (u.entity.as_str(), u.used_bytes)).collect::<Vec<_>>(), [("alice", 0)]);
    }
}

#[tokio::test]
async fn a_quota_refuses_the_write_that_would_pass_it_and_keeps_nothing_of_it() {
    for (name, store, _scratch) in backends_with_quota(Some(10_000)).await {
        let store: &dyn Store = &*store;
        assert_eq!(store.default_storage_quota(), Some(10_000));
        store.create_dataset(&dataset("alice", 6_000)).await.unwrap();
        let o = over(store.create_dataset(&dataset("alice", 5_000)).await);
        assert_eq!((o.used_bytes, o.quota_bytes, o.needed_bytes), (6_000, 10_000, 5_000), "{name}");
        let listed = store.list_datasets("alice", None, PageRequest::first(10)).await.unwrap();
        assert_eq!(listed.items.len(), 1, "{name}: the refused dataset is not stored");
        assert_eq!(used(store, "alice").await, 6_000, "{name}");
        // Another entity is unaffected.
        store.create_dataset(&dataset("bob", 9_000)).await.unwrap();

        // Logs, jobs and checkpoints are refused alike.
        let m = model(store, "alice", "m").await;
        over(store.append_log(&log(m, &"g".repeat(4_000))).await);
        assert!(store.list_logs(m, None, PageRequest::first(10)).await.unwrap().items.is_empty(), "{name}");
        over(store.create_job(&job(m, &"i".repeat(4_000))).await);
        assert_eq!(store.pending_jobs("alice").await.unwrap(), 0, "{name}: the refused job is not queued");
        let j = store.create_job(&job(m, "small")).await.unwrap();
        store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
        let big = JobOutcome::Succeeded { checkpoint: checkpoint(m, 1, 5_000), event_data: json!({"step": 1}) };
        over(store.finish_job(j.id, tandem_store::TEST_OWNER, &big).await);
        assert_eq!(store.get_job("alice", j.id).await.unwrap().status, JobStatus::Running, "{name}: rolled back");
        assert_eq!(store.latest_step(m).await.unwrap(), 0, "{name}: no checkpoint recorded");
        let failed = JobOutcome::Failed { error_message: "storage quota exceeded".into() };
        store.finish_job(j.id, tandem_store::TEST_OWNER, &failed).await.unwrap();
        over(store.import_checkpoint(m, Uuid::now_v7(), "m/x", 5_000).await);
        over(store.tinker_put(&state("alice", "s", 5_000), None).await);
        assert_eq!(store.tinker_list("alice", None).await.unwrap(), vec![], "{name}");
        let r = StoredResponse {
            id: "resp_1".into(),
            entity: "alice".into(),
            body: json!("r".repeat(5_000)),
            conversation: json!([]),
        };
        over(store.put_response(&r).await);
        assert!(matches!(store.get_response("alice", "resp_1").await, Err(StoreError::NotFound)), "{name}");

        // The operator's per-entity quota overrides the default, both ways.
        store.set_storage_quota("alice", EntityQuota::Bytes(20_000)).await.unwrap();
        store.create_dataset(&dataset("alice", 5_000)).await.unwrap();
        store.set_storage_quota("alice", EntityQuota::Unlimited).await.unwrap();
        store.create_dataset(&dataset("alice", 50_000)).await.unwrap();
        store.set_storage_quota("bob", EntityQuota::Bytes(0)).await.unwrap();
        over(store.create_dataset(&dataset("bob", 1)).await);
        let bobs = NewModel { entity: "bob".into(), project: "p".into(), name: "m".into(), base_model: "b".into() };
        over(store.create_model(&bobs, false).await);
        assert!(store.list_models("bob", None, None, PageRequest::first(10)).await.unwrap().items.is_empty(), "{name}");
        store.set_storage_quota("alice", EntityQuota::Default).await.unwrap();
        let alice = store.storage_usage("alice").await.unwrap();
        assert_eq!(alice.quota, EntityQuota::Default, "{name}");
        assert!(alice.used_bytes > 10_000, "{name}");
        // Above a lowered quota nothing more fits, but deleting works and makes room.
        over(store.create_dataset(&dataset("alice", 1)).await);
        let ids: Vec<Uuid> = store
            .list_datasets("alice", None, PageRequest::first(10))
            .await
            .unwrap()
            .items
            .iter()
            .map(|d| d.id)
            .collect();
        for id in ids {
            store.delete_dataset("alice", id).await.unwrap();
        }
        store.create_dataset(&dataset("alice", 1)).await.unwrap();
        let all = store.list_storage().await.unwrap();
        let bob = all.iter().find(|u| u.entity == "bob").unwrap();
        assert_eq!((bob.used_bytes, bob.quota), (9_000, EntityQuota::Bytes(0)), "{name}");
    }
}

#[tokio::test]
async fn concurrent_writers_of_one_entity_cannot_pass_its_quota_together() {
    for (name, store, _scratch) in backends_with_quota(Some(10_000)).await {
        let tasks: Vec<_> = (0..24)
            .map(|_| {
                let store: Arc<dyn Store> = store.clone();
                tokio::spawn(async move { store.create_dataset(&dataset("alice", 1_000)).await })
            })
            .collect();
        let mut stored = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => stored += 1,
                Err(StoreError::OverQuota(_)) => {}
                Err(e) => panic!("{name}: {e}"),
            }
        }
        assert_eq!(stored, 10, "{name}");
        assert_eq!(used(&*store, "alice").await, 10_000, "{name}");
    }
}
