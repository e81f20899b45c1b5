//! The behaviour every `Store` backend must have. It runs against SQLite (in memory and on disk)
//! always, and against PostgreSQL when `TANDEM_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`) answers: each test in a fresh schema, dropped when
//! it ends. Without a server the PostgreSQL runs are skipped with a loud `SKIPPED PostgreSQL` on
//! stderr, unless `TANDEM_REQUIRE_POSTGRES=1` makes that a failure (CI sets it).

use serde_json::json;
use std::collections::BTreeMap;
use tandem_core::records::{EventKind, JobKind, JobStatus, ModelRecord, Order, Page, PageRequest};
use tandem_store::{
    ApiKeyRecord, DatasetData, JobOutcome, NewCheckpoint, NewDataset, NewJob, NewLog, NewModel, Rollout, Store,
    StoreError, StoredResponse,
};
use uuid::Uuid;

mod common;
use common::backends;

fn new_model(entity: &str, name: &str) -> NewModel {
    NewModel { entity: entity.into(), project: "p".into(), name: name.into(), base_model: "base".into() }
}

async fn succeed(store: &dyn Store, model_id: Uuid, step: i64) -> Uuid {
    let job = store
        .create_job(&NewJob { model_id, kind: JobKind::Rl, config: json!({}), inputs: json!([]), rollout: None })
        .await
        .unwrap();
    let claimed = store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
    assert_eq!(claimed.job.id, job.id);
    let cp = NewCheckpoint {
        id: Uuid::now_v7(),
        model_id,
        step,
        path: format!("{model_id}/{step}"),
        metrics: BTreeMap::from([("train/loss".to_string(), 0.5)]),
        size_bytes: 1000,
    };
    let outcome = JobOutcome::Succeeded { checkpoint: cp.clone(), event_data: json!({ "step": step }) };
    let done = store.finish_job(job.id, tandem_store::TEST_OWNER, &outcome).await.unwrap();
    assert_eq!((done.status, done.step), (JobStatus::Succeeded, Some(step)));
    cp.id
}

#[tokio::test]
async fn keys() {
    for (name, store, _dir) in backends().await {
        let rec = |id: Uuid, prefix: &str, hash: u8| ApiKeyRecord {
            id,
            entity: "e".into(),
            key_hash: [hash; 32],
            prefix: prefix.into(),
            created_at: 1,
            revoked_at: None,
        };
        let a = rec(Uuid::now_v7(), "tdm_aaaa", 1);
        store.insert_key(&a).await.unwrap();
        store.insert_key(&rec(Uuid::now_v7(), "tdm_bbbb", 2)).await.unwrap();
        store.insert_key(&rec(Uuid::now_v7(), "tdm_bbbb", 3)).await.unwrap();
        assert_eq!(store.find_active_key(&[1; 32]).await.unwrap().unwrap().id, a.id, "{name}");
        assert!(store.find_active_key(&[9; 32]).await.unwrap().is_none());
        assert!(matches!(store.revoke_key("tdm_bbbb").await, Err(StoreError::Conflict(_))), "{name}");
        assert!(matches!(store.revoke_key("nope").await, Err(StoreError::NotFound)));
        store.revoke_key("tdm_aaaa").await.unwrap();
        assert!(store.find_active_key(&[1; 32]).await.unwrap().is_none(), "{name}: revoked key still valid");
        assert_eq!(store.list_keys().await.unwrap().len(), 3);
    }
}

#[tokio::test]
async fn models_are_unique_and_scoped() {
    for (name, store, _dir) in backends().await {
        let (m, created) = store.create_model(&new_model("a", "m1"), false).await.unwrap();
        assert!(created);
        assert!(matches!(store.create_model(&new_model("a", "m1"), false).await, Err(StoreError::Conflict(_))));
        let (again, created) = store.create_model(&new_model("a", "m1"), true).await.unwrap();
        assert_eq!((again.id, created), (m.id, false), "{name}");
        let (other, _) = store.create_model(&new_model("b", "m1"), false).await.unwrap();
        assert_ne!(other.id, m.id);
        assert!(matches!(store.get_model("b", m.id).await, Err(StoreError::NotFound)), "{name}: cross-entity read");
        for i in 2..=5 {
            store.create_model(&new_model("a", &format!("m{i}")), false).await.unwrap();
        }
        let p1 = store.list_models("a", None, None, PageRequest::first(2)).await.unwrap();
        assert_eq!((p1.items.len(), p1.has_more), (2, true));
        let p2 = store
            .list_models("a", Some("p"), None, PageRequest { after: Some(p1.items[1].id), ..PageRequest::first(10) })
            .await
            .unwrap();
        assert_eq!((p2.items.len(), p2.has_more), (3, false));
        assert_eq!(store.list_models("a", Some("q"), None, PageRequest::first(10)).await.unwrap().items.len(), 0);
        // Search: literal text (`%` and `_` are not wildcards), case-insensitive, own entity only.
        let names = |p: Page<ModelRecord>| p.items.into_iter().map(|m| m.name).collect::<Vec<_>>();
        let found = store.list_models("a", None, Some("M3"), PageRequest::first(10)).await.unwrap();
        assert_eq!(names(found), ["m3"]);
        let found = store.list_models("a", None, Some("P/m"), PageRequest::first(2)).await.unwrap();
        assert!(found.has_more, "search pages like a listing");
        assert_eq!(store.list_models("a", None, Some("%"), PageRequest::first(10)).await.unwrap().items.len(), 0);
        assert_eq!(store.list_models("b", None, Some("m3"), PageRequest::first(10)).await.unwrap().items.len(), 0);
        let bad = PageRequest { after: Some(other.id), ..PageRequest::first(2) };
        assert!(matches!(store.list_models("a", None, None, bad).await, Err(StoreError::InvalidCursor)));
        assert!(matches!(store.delete_model("b", m.id).await, Err(StoreError::NotFound)));
        store.delete_model("a", m.id).await.unwrap();
        assert!(matches!(store.get_model("a", m.id).await, Err(StoreError::NotFound)));
    }
}

#[tokio::test]
async fn checkpoints_logs_and_deletion() {
    for (name, store, _dir) in backends().await {
        let (m, _) = store.create_model(&new_model("a", "m"), false).await.unwrap();
        assert_eq!(store.latest_step(m.id).await.unwrap(), 0);
        // A log before any checkpoint sits at step 0.
        let log0 = NewLog {
            model_id: m.id,
            split: "val".into(),
            metrics: BTreeMap::from([("val/reward".to_string(), 0.25)]),
            num_groups: 1,
            num_trajectories: 2,
            trajectory_groups: json!([{"trajectories": [{"reward": 0.25, "messages_and_choices": []}]}]),
        };
        assert_eq!(store.append_log(&log0).await.unwrap().step, 0);
        let c1 = succeed(store.as_ref(), m.id, 1).await;
        succeed(store.as_ref(), m.id, 2).await;
        succeed(store.as_ref(), m.id, 3).await;
        assert_eq!(store.latest_step(m.id).await.unwrap(), 3);

        // A log attaches its metrics to the latest checkpoint, next to the training summary.
        let entry = store.append_log(&NewLog { split: "val".into(), ..log0.clone() }).await.unwrap();
        assert_eq!(entry.step, 3, "{name}");
        let cp3 = store.get_checkpoint(m.id, 3).await.unwrap();
        assert_eq!(cp3.metrics["val/reward"], 0.25);
        assert_eq!(cp3.metrics["train/loss"], 0.5);
        let (got, groups) = store.get_log(m.id, entry.id).await.unwrap();
        assert_eq!((got.id, groups), (entry.id, log0.trajectory_groups.clone()));
        let logs = store.list_logs(m.id, Some("val"), PageRequest::first(1)).await.unwrap();
        assert_eq!((logs.items.len(), logs.has_more), (1, true));
        assert_eq!(store.list_logs(m.id, Some("train"), PageRequest::first(5)).await.unwrap().items.len(), 0);

        // Latest first, as ART asks for it.
        let desc = PageRequest { after: None, limit: 1, order: Order::Desc };
        let latest = store.list_checkpoints(m.id, desc).await.unwrap();
        assert_eq!((latest.items[0].step, latest.has_more), (3, true));

        let out = store.delete_checkpoints(m.id, &[1, 3, 7, 3]).await.unwrap();
        assert_eq!(out.deleted.iter().map(|c| c.step).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(out.not_found_steps, vec![7]);
        assert_eq!(store.latest_step(m.id).await.unwrap(), 2, "{name}: latest after deleting the top");
        assert!(matches!(store.get_checkpoint(m.id, 3).await, Err(StoreError::NotFound)));
        // A cursor naming a deleted checkpoint still pages on from its step.
        let after_deleted = PageRequest { after: Some(c1), limit: 10, order: Order::Asc };
        let rest = store.list_checkpoints(m.id, after_deleted).await.unwrap();
        assert_eq!(rest.items.iter().map(|c| c.step).collect::<Vec<_>>(), vec![2]);
        // The next job after deleting the top step reuses it: latest + 1.
        succeed(store.as_ref(), m.id, 3).await;
        assert_eq!(store.live_checkpoint_paths().await.unwrap().len(), 2);

        let deleted = store.delete_model("a", m.id).await.unwrap();
        assert_eq!(deleted.deleted_checkpoints.len(), 2);
        assert!(store.live_checkpoint_paths().await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn job_state_machine() {
    for (name, store, _dir) in backends().await {
        let (m, _) = store.create_model(&new_model("a", "m"), false).await.unwrap();
        let (m2, _) = store.create_model(&new_model("a", "m2"), false).await.unwrap();
        let new = |model_id| NewJob {
            model_id,
            kind: JobKind::Rl,
            config: json!({"lr": 1}),
            inputs: json!([1]),
            rollout: None,
        };
        let j1 = store.create_job(&new(m.id)).await.unwrap();
        let j2 = store.create_job(&new(m.id)).await.unwrap();
        let j3 = store.create_job(&new(m2.id)).await.unwrap();
        assert_eq!(j1.status, JobStatus::Queued);
        assert!(matches!(store.get_job("b", j1.id).await, Err(StoreError::NotFound)), "{name}");

        // An RL job keeps its rollouts for reading: metrics in every job read, groups on request.
        let rollout = Rollout { metrics: BTreeMap::from([("train/reward".into(), 0.5)]), groups: json!([{"g": 1}]) };
        let jr = store.create_job(&NewJob { rollout: Some(rollout.clone()), ..new(m2.id) }).await.unwrap();
        assert_eq!(jr.rollout_metrics, rollout.metrics, "{name}");
        let listed = store.list_jobs(m2.id, PageRequest::first(10)).await.unwrap();
        assert_eq!(listed.items.last().map(|j| j.rollout_metrics.clone()), Some(rollout.metrics.clone()));
        let read = store.get_job_rollout("a", jr.id).await.unwrap();
        assert_eq!((read.groups, read.inputs, read.job.id), (Some(rollout.groups), json!([1]), jr.id));
        assert!(store.get_job_rollout("a", j1.id).await.unwrap().groups.is_none());
        assert!(matches!(store.get_job_rollout("b", jr.id).await, Err(StoreError::NotFound)), "{name}: other entity");
        store.cancel_job("a", jr.id).await.unwrap();

        // One job per model at a time, oldest first; another model's job may run meanwhile.
        let c1 = store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
        assert_eq!((c1.job.id, c1.job.attempts, c1.config.clone()), (j1.id, 1, json!({"lr": 1})));
        let c3 = store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
        assert_eq!(c3.job.id, j3.id, "{name}: j2 must wait for j1");
        assert!(store.claim_next_job(&tandem_store::test_lease()).await.unwrap().is_none());

        store
            .append_event(j1.id, tandem_store::TEST_OWNER, EventKind::TrainingStarted, &json!({"num_sequences": 1}))
            .await
            .unwrap();
        // Cancelling a running job only flags it; the worker ends it.
        let flagged = store.cancel_job("a", j1.id).await.unwrap();
        assert_eq!((flagged.status, flagged.cancel_requested), (JobStatus::Running, true));
        assert!(store.is_cancel_requested(j1.id).await.unwrap());
        let done = store
            .finish_job(j1.id, tandem_store::TEST_OWNER, &JobOutcome::Cancelled { error_message: "cancelled".into() })
            .await
            .unwrap();
        assert_eq!(done.status, JobStatus::Cancelled);
        assert!(matches!(
            store.finish_job(j1.id, tandem_store::TEST_OWNER, &JobOutcome::Failed { error_message: "x".into() }).await,
            Err(StoreError::LeaseLost)
        ));
        let events = store.list_events("a", j1.id, PageRequest::first(10)).await.unwrap();
        let kinds: Vec<&str> = events.items.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, vec!["training_started", "training_failed"]);

        // Cancelling a queued job ends it at once, with its terminal event.
        let j4 = store.create_job(&new(m2.id)).await.unwrap();
        let c = store.cancel_job("a", j4.id).await.unwrap();
        assert_eq!(c.status, JobStatus::Cancelled);
        let ev = store.list_events("a", j4.id, PageRequest::first(10)).await.unwrap();
        let kinds: Vec<&str> = ev.items.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            vec!["training_started", "training_failed"],
            "every job's events begin with training_started"
        );
        assert!(matches!(store.list_events("b", j4.id, PageRequest::first(10)).await, Err(StoreError::NotFound)));

        // Restart recovery: j3 (running) is re-queued, then failed after too many attempts.
        let r = store.recover_interrupted_jobs(2, tandem_store::Reclaim::All).await.unwrap();
        assert_eq!(r.requeued, vec![j3.id], "{name}");
        assert_eq!(store.get_job("a", j3.id).await.unwrap().status, JobStatus::Queued);
        let again = store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
        assert!(again.job.id == j2.id || again.job.id == j3.id);
        let again2 = store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
        let r = store.recover_interrupted_jobs(2, tandem_store::Reclaim::All).await.unwrap();
        let j3_now = store.get_job("a", j3.id).await.unwrap();
        assert_eq!(j3_now.attempts, 2);
        assert!(r.failed.contains(&j3.id), "{name}: {r:?}");
        assert_eq!(j3_now.status, JobStatus::Failed);
        let ids = [again.job.id, again2.job.id];
        assert!(ids.contains(&j2.id) && ids.contains(&j3.id));
        let ev = store.list_events("a", j3.id, PageRequest::first(10)).await.unwrap();
        let kinds: Vec<&str> = ev.items.iter().map(|e| e.kind.as_str()).collect();
        // j3 was killed before its first event both times: no `training_restarted` (nothing was
        // reported), and its events still begin with `training_started` (R6 of the reliability suite).
        assert_eq!(kinds, vec!["training_started", "training_failed"]);
    }
}

#[tokio::test]
async fn event_pages_under_concurrent_appends() {
    for (name, store, _dir) in backends().await {
        let (m, _) = store.create_model(&new_model("a", "m"), false).await.unwrap();
        let job = store
            .create_job(&NewJob {
                model_id: m.id,
                kind: JobKind::Rl,
                config: json!({}),
                inputs: json!([]),
                rollout: None,
            })
            .await
            .unwrap();
        store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
        const N: usize = 200;
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..N {
                    store
                        .append_event(job.id, tandem_store::TEST_OWNER, EventKind::GradientStep, &json!({ "i": i }))
                        .await
                        .unwrap();
                    if i % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        };
        // Page through while the writer appends, as ART's poller does, until all are seen.
        let mut seen = Vec::new();
        let mut after = None;
        for limit in [1u32, 3, 20, 100].iter().cycle() {
            let page =
                store.list_events("a", job.id, PageRequest { after, limit: *limit, order: Order::Asc }).await.unwrap();
            if let Some(last) = page.items.last() {
                after = Some(last.id);
            }
            seen.extend(page.items.iter().map(|e| e.data["i"].as_u64().unwrap() as usize));
            if seen.len() >= N {
                break;
            }
            tokio::task::yield_now().await;
        }
        writer.await.unwrap();
        assert_eq!(seen, (0..N).collect::<Vec<_>>(), "{name}: every event exactly once, in order");
    }
}

#[tokio::test]
async fn datasets_are_versioned_and_entity_scoped() {
    for (name, store, _dir) in backends().await {
        let new = |entity: &str, data: &[u8]| NewDataset {
            entity: entity.into(),
            project: "p".into(),
            name: "d".into(),
            num_rows: 1,
            data: DatasetData::Inline(data.to_vec()),
        };
        let v0 = store.create_dataset(&new("a", b"{}\n")).await.unwrap();
        let v1 = store.create_dataset(&new("a", b"{}\n{}\n")).await.unwrap();
        let other = store.create_dataset(&new("b", b"x")).await.unwrap();
        assert_eq!((v0.version, v1.version, other.version), (0, 1, 0), "{name}: versions count per entity and name");
        assert_eq!(v1.size_bytes, 6);
        assert_eq!(store.find_dataset("a", "p", "d", None).await.unwrap().id, v1.id, "{name}: latest");
        assert_eq!(store.find_dataset("a", "p", "d", Some(0)).await.unwrap().id, v0.id);
        assert!(matches!(store.find_dataset("a", "p", "d", Some(2)).await, Err(StoreError::NotFound)));
        assert_eq!(store.dataset_data("a", v1.id).await.unwrap(), DatasetData::Inline(b"{}\n{}\n".to_vec()));
        // Another entity's dataset does not exist for you.
        assert!(matches!(store.get_dataset("b", v0.id).await, Err(StoreError::NotFound)));
        assert!(matches!(store.dataset_data("b", v0.id).await, Err(StoreError::NotFound)));
        assert!(matches!(store.delete_dataset("b", v0.id).await, Err(StoreError::NotFound)));
        let page = store.list_datasets("a", Some("p"), PageRequest::first(1)).await.unwrap();
        assert_eq!((page.items.len(), page.has_more), (1, true));
        store.delete_dataset("a", v0.id).await.unwrap();
        assert!(matches!(store.get_dataset("a", v0.id).await, Err(StoreError::NotFound)));
        // The next upload continues after the highest version left.
        assert_eq!(store.create_dataset(&new("a", b"{}")).await.unwrap().version, 2);
        // A dataset whose bytes are in the blob store: its row names the key and keeps the size.
        let blob = DatasetData::Blob { key: "ab12".into(), size: 4096 };
        let stored = store.create_dataset(&NewDataset { data: blob.clone(), ..new("a", b"") }).await.unwrap();
        assert_eq!((stored.version, stored.size_bytes), (3, 4096), "{name}");
        assert_eq!(store.dataset_data("a", stored.id).await.unwrap(), blob);
        assert!(matches!(store.dataset_data("b", stored.id).await, Err(StoreError::NotFound)));
        assert_eq!(store.live_dataset_blob_keys().await.unwrap(), ["ab12"]);
        store.delete_dataset("a", stored.id).await.unwrap();
        assert!(store.live_dataset_blob_keys().await.unwrap().is_empty(), "{name}");
    }
}

#[tokio::test]
async fn stored_responses_are_entity_scoped() {
    for (name, store, _dir) in backends().await {
        let r = StoredResponse {
            id: "resp_1".into(),
            entity: "a".into(),
            body: serde_json::json!({"id": "resp_1", "object": "response"}),
            conversation: serde_json::json!([{"role": "user", "content": "hi"}]),
        };
        store.put_response(&r).await.unwrap();
        assert_eq!(store.get_response("a", "resp_1").await.unwrap(), r, "{name}");
        // Another entity's response does not exist for you, and an id is stored once.
        assert!(matches!(store.get_response("b", "resp_1").await, Err(StoreError::NotFound)), "{name}");
        assert!(matches!(store.delete_response("b", "resp_1").await, Err(StoreError::NotFound)), "{name}");
        assert!(matches!(store.put_response(&r).await, Err(StoreError::Conflict(_))), "{name}");
        store.delete_response("a", "resp_1").await.unwrap();
        assert!(matches!(store.get_response("a", "resp_1").await, Err(StoreError::NotFound)), "{name}");
        assert!(matches!(store.delete_response("a", "resp_1").await, Err(StoreError::NotFound)), "{name}");
    }
}

/// Jobs are claimed round robin between entities (an entity that queued many does not hold back
/// one that queued later), and `pending_jobs` counts an entity's queued and running jobs.
#[tokio::test]
async fn training_queue_is_round_robin_between_entities() {
    for (name, store, _dir) in backends().await {
        let mut a_jobs = Vec::new();
        for m in ["a1", "a2", "a3"] {
            let (model, _) = store.create_model(&new_model("a", m), false).await.unwrap();
            let new =
                NewJob { model_id: model.id, kind: JobKind::Rl, config: json!({}), inputs: json!([]), rollout: None };
            a_jobs.push(store.create_job(&new).await.unwrap().id);
        }
        let (b, _) = store.create_model(&new_model("b", "b1"), false).await.unwrap();
        let new = NewJob { model_id: b.id, kind: JobKind::Rl, config: json!({}), inputs: json!([]), rollout: None };
        let b_job = store.create_job(&new).await.unwrap().id;
        assert_eq!((store.pending_jobs("a").await.unwrap(), store.pending_jobs("b").await.unwrap()), (3, 1));
        let mut order = Vec::new();
        while let Some(claimed) = store.claim_next_job(&tandem_store::test_lease()).await.unwrap() {
            order.push(claimed.job.id);
        }
        assert_eq!(order, vec![a_jobs[0], b_job, a_jobs[1], a_jobs[2]], "{name}");
        assert_eq!(store.pending_jobs("a").await.unwrap(), 3, "running jobs are pending too");
        assert_eq!(store.pending_jobs("c").await.unwrap(), 0);
    }
}

/// A trainer that time-slices between entities claims past the entities it already runs.
#[tokio::test]
async fn claims_pass_over_the_entities_a_trainer_skips() {
    for (name, store, _dir) in backends().await {
        let mut jobs = Vec::new();
        for (entity, m) in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("c's", "c1")] {
            let (model, _) = store.create_model(&new_model(entity, m), false).await.unwrap();
            let new =
                NewJob { model_id: model.id, kind: JobKind::Rl, config: json!({}), inputs: json!([]), rollout: None };
            jobs.push(store.create_job(&new).await.unwrap().id);
        }
        let lease = tandem_store::test_lease();
        let skip = |e: &[&str]| e.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let first = store.claim_next_job_skipping(&lease, &skip(&["b"])).await.unwrap().unwrap();
        assert_eq!(first.job.id, jobs[0], "{name}");
        // a runs here: b is next, then (b skipped too) c's, whose name has a quote.
        let second = store.claim_next_job_skipping(&lease, &skip(&["a"])).await.unwrap().unwrap();
        assert_eq!(second.job.id, jobs[2], "{name}");
        let third = store.claim_next_job_skipping(&lease, &skip(&["a", "b"])).await.unwrap().unwrap();
        assert_eq!(third.job.id, jobs[3], "{name}");
        assert!(store.claim_next_job_skipping(&lease, &skip(&["a", "b", "c's"])).await.unwrap().is_none(), "{name}");
        assert_eq!(store.claim_next_job(&lease).await.unwrap().unwrap().job.id, jobs[1], "{name}");
    }
}

/// The pending-job cap holds under concurrency: 24 creations at once over two of an entity's
/// models, capped at 5, queue exactly 5 (the count and the insert are one atomic step); another
/// entity is not counted.
#[tokio::test]
async fn capped_job_creation_holds_under_concurrency() {
    for (name, store, _dir) in backends().await {
        let (m1, _) = store.create_model(&new_model("a", "m1"), false).await.unwrap();
        let (m2, _) = store.create_model(&new_model("a", "m2"), false).await.unwrap();
        let (other, _) = store.create_model(&new_model("b", "m"), false).await.unwrap();
        let job =
            |model_id| NewJob { model_id, kind: JobKind::Rl, config: json!({}), inputs: json!([]), rollout: None };
        store.create_job(&job(other.id)).await.unwrap();
        let tries = (0..24).map(|i| {
            let (store, new) = (store.clone(), job(if i % 2 == 0 { m1.id } else { m2.id }));
            tokio::spawn(async move { store.create_job_capped(&new, Some(5)).await })
        });
        let (mut queued, mut refused) = (0, 0);
        for t in tries {
            match t.await.unwrap() {
                Ok(_) => queued += 1,
                Err(StoreError::AtLimit(n)) => {
                    assert_eq!(n, 5, "{name}");
                    refused += 1
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
        assert_eq!((queued, refused), (5, 19), "{name}");
        assert_eq!(store.pending_jobs("a").await.unwrap(), 5, "{name}");
        assert!(store.create_job_capped(&job(other.id), Some(2)).await.is_ok(), "{name}: b has one of two");
        assert!(matches!(store.create_job_capped(&job(m1.id), Some(5)).await, Err(StoreError::AtLimit(5))), "{name}");
    }
}

#[tokio::test]
async fn job_counts_and_gradient_step_history() {
    for (name, store, _dir) in backends().await {
        let (m, _) = store.create_model(&new_model("a", "m"), false).await.unwrap();
        let (other, _) = store.create_model(&new_model("b", "m"), false).await.unwrap();
        let new = |model_id, kind| NewJob { model_id, kind, config: json!({}), inputs: json!([]), rollout: None };
        let j1 = store.create_job(&new(m.id, JobKind::Rl)).await.unwrap();
        store.create_job(&new(m.id, JobKind::Sft)).await.unwrap();
        store.create_job(&new(other.id, JobKind::Rl)).await.unwrap();
        let listed = store.list_jobs(m.id, PageRequest::first(10)).await.unwrap();
        assert_eq!(listed.items.len(), 2, "{name}: m's jobs only");
        assert_eq!(listed.items[0].id, j1.id);
        let mut counts = store.active_job_counts().await.unwrap();
        counts.sort_by_key(|(k, s, _)| (k.as_str(), s.as_str()));
        assert_eq!(counts, vec![(JobKind::Rl, JobStatus::Queued, 2), (JobKind::Sft, JobStatus::Queued, 1)], "{name}");

        // j1 runs (m's oldest), writes two steps and succeeds at step 1; the other model's job
        // writes one step that m's history must not show.
        assert_eq!(store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap().job.id, j1.id);
        let j3 = store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap().job;
        assert_eq!(j3.model_id, other.id, "{name}");
        store.append_event(j1.id, tandem_store::TEST_OWNER, EventKind::TrainingStarted, &json!({})).await.unwrap();
        store
            .append_event(j1.id, tandem_store::TEST_OWNER, EventKind::GradientStep, &json!({"loss": 1.0}))
            .await
            .unwrap();
        store
            .append_event(j3.id, tandem_store::TEST_OWNER, EventKind::GradientStep, &json!({"loss": 9.0}))
            .await
            .unwrap();
        store
            .append_event(j1.id, tandem_store::TEST_OWNER, EventKind::GradientStep, &json!({"loss": 3.0}))
            .await
            .unwrap();
        let running = store.gradient_step_history(m.id).await.unwrap();
        assert_eq!(running.len(), 2, "{name}");
        assert!(running.iter().all(|r| r.job_status == JobStatus::Running && r.job_step.is_none()));
        assert_eq!(running[1].data, json!({"loss": 3.0}));
        let counts = store.active_job_counts().await.unwrap();
        assert!(counts.contains(&(JobKind::Rl, JobStatus::Running, 2)), "{name}: {counts:?}");

        let cp = NewCheckpoint {
            id: Uuid::now_v7(),
            model_id: m.id,
            step: 1,
            path: "x".into(),
            metrics: BTreeMap::new(),
            size_bytes: 0,
        };
        let outcome = JobOutcome::Succeeded { checkpoint: cp, event_data: json!({ "step": 1 }) };
        store.finish_job(j1.id, tandem_store::TEST_OWNER, &outcome).await.unwrap();
        let done = store.gradient_step_history(m.id).await.unwrap();
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(|r| r.job_status == JobStatus::Succeeded && r.job_step == Some(1)), "{name}");
        let mut series = tandem_core::history::Series::default();
        tandem_core::history::add_training(&mut series, &done, 1);
        assert_eq!(series.by_key[&("training", "training/loss".to_string())][0].value, 2.0);

        // A job interrupted and re-run: only the last attempt's steps count.
        let j2 = store.create_job(&new(m.id, JobKind::Rl)).await.unwrap();
        let _sft = store.claim_next_job(&tandem_store::test_lease()).await.unwrap();
        let sft_done = JobOutcome::Failed { error_message: "x".into() };
        store.finish_job(_sft.unwrap().job.id, tandem_store::TEST_OWNER, &sft_done).await.unwrap();
        assert_eq!(store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap().job.id, j2.id, "{name}");
        store
            .append_event(j2.id, tandem_store::TEST_OWNER, EventKind::GradientStep, &json!({"loss": 100.0}))
            .await
            .unwrap();
        store.recover_interrupted_jobs(3, tandem_store::Reclaim::All).await.unwrap();
        // The other model's job was re-queued too; either may be claimed first.
        let mut claimed = vec![store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap().job.id];
        if claimed[0] != j2.id {
            claimed.push(store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap().job.id);
        }
        assert_eq!(claimed.last(), Some(&j2.id), "{name}");
        store
            .append_event(j2.id, tandem_store::TEST_OWNER, EventKind::GradientStep, &json!({"loss": 5.0}))
            .await
            .unwrap();
        let rows = store.gradient_step_history(m.id).await.unwrap();
        let j2_losses: Vec<&serde_json::Value> =
            rows.iter().filter(|r| r.job_status == JobStatus::Running).map(|r| &r.data["loss"]).collect();
        assert_eq!(j2_losses, [&json!(5.0)], "{name}: the interrupted attempt's step is not shown");
    }
}

#[tokio::test]
async fn an_imported_adapter_becomes_the_next_checkpoint() {
    for (name, store, _dir) in backends().await {
        let (m, _) = store.create_model(&new_model("a", "m"), false).await.unwrap();
        let first = store.import_checkpoint(m.id, Uuid::now_v7(), "m/one", 0).await.unwrap();
        assert_eq!((first.step, first.path.as_str()), (1, "m/one"), "{name}");
        succeed(store.as_ref(), m.id, 2).await;
        let third = store.import_checkpoint(m.id, Uuid::now_v7(), "m/three", 0).await.unwrap();
        assert_eq!(third.step, 3, "{name}");
        assert_eq!(store.latest_step(m.id).await.unwrap(), 3);
        // While a job of the model is queued or runs, it owns the next step.
        store
            .create_job(&NewJob {
                model_id: m.id,
                kind: JobKind::Rl,
                config: json!({}),
                inputs: json!([]),
                rollout: None,
            })
            .await
            .unwrap();
        let busy = store.import_checkpoint(m.id, Uuid::now_v7(), "m/four", 0).await;
        assert!(matches!(busy, Err(StoreError::Conflict(_))), "{name}: queued: {busy:?}");
        store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
        let busy = store.import_checkpoint(m.id, Uuid::now_v7(), "m/four", 0).await;
        assert!(matches!(busy, Err(StoreError::Conflict(_))), "{name}: running: {busy:?}");
        assert_eq!(store.latest_step(m.id).await.unwrap(), 3, "{name}: nothing recorded");
    }
}

/// Writers that SQLite serialises run at once on PostgreSQL: concurrent appends to one job are
/// each seen once, in order, by a pager; concurrent uploads of one dataset name take distinct,
/// consecutive versions; concurrent logs at one step all reach its checkpoint's metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_keep_lists_consistent() {
    for (name, store, _dir) in backends().await {
        let (m, _) = store.create_model(&new_model("a", "m"), false).await.unwrap();
        succeed(store.as_ref(), m.id, 1).await;
        let job = store
            .create_job(&NewJob {
                model_id: m.id,
                kind: JobKind::Rl,
                config: json!({}),
                inputs: json!([]),
                rollout: None,
            })
            .await
            .unwrap();
        assert_eq!(store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap().job.id, job.id);
        // Three writers and a reader: as many connections as the SQLite file pool has.
        const WRITERS: usize = 3;
        const EACH: usize = 30;
        let (model_id, job_id) = (m.id, job.id);
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let (store, name) = (store.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let event = |i| json!({ "w": w, "i": i });
                for i in 0..EACH {
                    let appended =
                        store.append_event(job_id, tandem_store::TEST_OWNER, EventKind::GradientStep, &event(i)).await;
                    appended.unwrap_or_else(|e| panic!("{name}: {e}"));
                }
                let data = NewDataset {
                    entity: "a".into(),
                    project: "p".into(),
                    name: "d".into(),
                    num_rows: 1,
                    data: DatasetData::Inline(vec![w as u8]),
                };
                let version = store.create_dataset(&data).await.unwrap_or_else(|e| panic!("{name}: {e}")).version;
                let log = NewLog {
                    model_id,
                    split: "val".into(),
                    metrics: BTreeMap::from([(format!("val/w{w}"), w as f64)]),
                    num_groups: 0,
                    num_trajectories: 0,
                    trajectory_groups: json!([]),
                };
                store.append_log(&log).await.unwrap_or_else(|e| panic!("{name}: {e}"));
                version
            }));
        }
        // Page as ART's poller does while the writers append.
        let mut seen: Vec<(u64, u64)> = Vec::new();
        let mut after = None;
        loop {
            // Whether every writer was done before this page was read: then it is the last.
            let done = tasks.iter().all(|t| t.is_finished());
            let page =
                store.list_events("a", job.id, PageRequest { after, limit: 7, order: Order::Asc }).await.unwrap();
            after = page.items.last().map(|e| e.id).or(after);
            seen.extend(page.items.iter().map(|e| (e.data["w"].as_u64().unwrap(), e.data["i"].as_u64().unwrap())));
            if done && !page.has_more {
                break;
            }
            tokio::task::yield_now().await;
        }
        let mut versions = Vec::new();
        for t in tasks {
            versions.push(t.await.unwrap());
        }
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!((seen.len(), sorted.len()), (WRITERS * EACH, WRITERS * EACH), "{name}: every event exactly once");
        for w in 0..WRITERS as u64 {
            let own: Vec<u64> = seen.iter().filter(|(sw, _)| *sw == w).map(|(_, i)| *i).collect();
            assert_eq!(own, (0..EACH as u64).collect::<Vec<_>>(), "{name}: each writer's events in its order");
        }
        versions.sort_unstable();
        assert_eq!(versions, (0..WRITERS as i64).collect::<Vec<_>>(), "{name}: distinct consecutive versions");
        let cp = store.get_checkpoint(m.id, 1).await.unwrap();
        assert_eq!(cp.metrics.keys().filter(|k| k.starts_with("val/w")).count(), WRITERS, "{name}: {cp:?}");
    }
}

/// A claim holds its job under a lease: only the holder writes the job's events and its end; a
/// lease that runs out returns the job to the queue (once the other trainer looks), after which
/// the old holder's writes are refused, and the new holder finishes it with no event twice.
#[tokio::test]
async fn leases_keep_a_job_to_one_trainer() {
    use tandem_store::{Lease, LeaseState, Reclaim};
    for (name, store, _dir) in backends().await {
        let (m, _) = store.create_model(&new_model("a", "m"), false).await.unwrap();
        let new = NewJob { model_id: m.id, kind: JobKind::Rl, config: json!({}), inputs: json!([]), rollout: None };
        let job = store.create_job(&new).await.unwrap();
        let a = Lease { owner: "trainer-a".into(), ttl_ms: 60_000 };
        let b = Lease { owner: "trainer-b".into(), ttl_ms: 60_000 };
        assert_eq!(store.claim_next_job(&a).await.unwrap().unwrap().job.id, job.id);
        store.append_event(job.id, &a.owner, EventKind::TrainingStarted, &json!({"num_sequences": 2})).await.unwrap();
        store.append_event(job.id, &a.owner, EventKind::GradientStep, &json!({"loss": 1.0})).await.unwrap();
        let stray = store.append_event(job.id, &b.owner, EventKind::GradientStep, &json!({"loss": 9.0})).await;
        assert!(matches!(stray, Err(StoreError::LeaseLost)), "{name}: {stray:?}");
        assert_eq!(store.renew_lease(job.id, &a).await.unwrap(), LeaseState::Held { cancel_requested: false });
        assert_eq!(store.renew_lease(job.id, &b).await.unwrap(), LeaseState::Lost, "{name}");

        // A live lease is not reclaimed; one renewed to run out now is.
        let r = store.recover_interrupted_jobs(3, Reclaim::Expired).await.unwrap();
        assert!(r.requeued.is_empty(), "{name}: {r:?}");
        store.renew_lease(job.id, &Lease { ttl_ms: -1, ..a.clone() }).await.unwrap();
        let r = store.recover_interrupted_jobs(3, Reclaim::Expired).await.unwrap();
        assert_eq!(r.requeued, vec![job.id], "{name}");
        assert_eq!(store.renew_lease(job.id, &a).await.unwrap(), LeaseState::Lost);

        let again = store.claim_next_job(&b).await.unwrap().unwrap();
        assert_eq!((again.job.id, again.job.attempts), (job.id, 2), "{name}");
        // The old holder, still running, can neither write nor end the job.
        let late = store.append_event(job.id, &a.owner, EventKind::GradientStep, &json!({"loss": 2.0})).await;
        assert!(matches!(late, Err(StoreError::LeaseLost)), "{name}: {late:?}");
        let failed = JobOutcome::Failed { error_message: "a".into() };
        assert!(matches!(store.finish_job(job.id, &a.owner, &failed).await, Err(StoreError::LeaseLost)));
        store.cancel_job("a", job.id).await.unwrap();
        assert_eq!(store.renew_lease(job.id, &b).await.unwrap(), LeaseState::Held { cancel_requested: true });
        for loss in [1.5, 0.5] {
            store.append_event(job.id, &b.owner, EventKind::GradientStep, &json!({"loss": loss})).await.unwrap();
        }
        let cancelled = JobOutcome::Cancelled { error_message: "cancelled".into() };
        assert_eq!(store.finish_job(job.id, &b.owner, &cancelled).await.unwrap().status, JobStatus::Cancelled);

        let events = store.list_events("a", job.id, PageRequest::first(20)).await.unwrap().items;
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "training_started",
                "gradient_step",
                "training_restarted",
                "gradient_step",
                "gradient_step",
                "training_failed"
            ],
            "{name}"
        );
        assert_eq!(events[2].data["reason"], "the trainer running the job stopped renewing its lease");
        let mut ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), events.len());
        // The history shows the last attempt's steps only.
        let losses: Vec<f64> =
            store.gradient_step_history(m.id).await.unwrap().iter().map(|r| r.data["loss"].as_f64().unwrap()).collect();
        assert_eq!(losses, [1.5, 0.5], "{name}");
    }
}

/// The node registry: beats register and refresh a node, a drain reaches the node at its next
/// beat, a graceful stop leaves, and an unknown name is NotFound.
#[tokio::test]
async fn the_node_registry_tracks_beats_and_drains() {
    use tandem_store::NodeBeat;
    for (name, store, _dir) in backends().await {
        let beat = |id: &str, node: &str, role: &str| NodeBeat {
            id: id.into(),
            name: node.into(),
            role: role.into(),
            version: "0.1.0".into(),
            busy: false,
            address: format!("http://{node}:8000"),
        };
        assert!(!store.node_heartbeat(&beat("n1", "api-1", "api")).await.unwrap(), "{name}");
        assert!(!store.node_heartbeat(&beat("t1", "trainer-1", "trainer")).await.unwrap());
        let busy = NodeBeat { busy: true, ..beat("t1", "trainer-1", "trainer") };
        assert!(!store.node_heartbeat(&busy).await.unwrap());
        let nodes = store.list_nodes().await.unwrap();
        let seen: Vec<(&str, &str, bool, bool, bool)> =
            nodes.iter().map(|n| (n.name.as_str(), n.role.as_str(), n.alive, n.busy, n.draining)).collect();
        assert_eq!(seen, [("api-1", "api", true, false, false), ("trainer-1", "trainer", true, true, false)], "{name}");
        assert!(nodes.iter().all(|n| n.heartbeat_at >= n.started_at));
        assert_eq!(nodes[1].address, "http://trainer-1:8000", "{name}: where other nodes reach it");

        let drained = store.set_node_draining("trainer-1", true).await.unwrap();
        assert_eq!((drained.len(), drained[0].id.as_str(), drained[0].draining), (1, "t1", true), "{name}");
        assert!(store.node_heartbeat(&busy).await.unwrap(), "{name}: the node learns of the drain at its beat");
        assert!(store.set_node_draining("t1", false).await.unwrap().iter().all(|n| !n.draining), "by id too");
        assert!(matches!(store.set_node_draining("nobody", true).await, Err(StoreError::NotFound)));

        store.remove_node("n1").await.unwrap();
        let names: Vec<String> = store.list_nodes().await.unwrap().into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["trainer-1"], "{name}");
    }
}
