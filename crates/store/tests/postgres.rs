//! PostgreSQL only: what several processes sharing one database must get right (SQLite has one
//! writer at a time and gets it for free). Skipped, loudly, without a server; see `common`.

use serde_json::json;
use std::collections::BTreeMap;
use tandem_core::records::{JobKind, JobStatus};
use tandem_store::{JobOutcome, NewJob, NewModel, PostgresStore, Store};
use uuid::Uuid;

mod common;
use common::{postgres, Scratch};

fn new_model(entity: &str, name: &str) -> NewModel {
    NewModel { entity: entity.into(), project: "p".into(), name: name.into(), base_model: "base".into() }
}

/// Trainer nodes claim from one PostgreSQL database: claims from several pools at once (two
/// "processes", two claiming tasks each) never take one job twice, nor two jobs of one model.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_claims_are_exclusive_between_pools() {
    let Some((first, scratch)) = postgres().await else { return };
    let Scratch::Schema { url, schema } = &scratch else { unreachable!() };
    let second = PostgresStore::connect_in_schema(url, schema).await.unwrap();
    const MODELS: usize = 12;
    const JOBS_PER_MODEL: usize = 3;
    let mut queued: BTreeMap<Uuid, Vec<Uuid>> = BTreeMap::new();
    for i in 0..MODELS {
        let (model, _) = first.create_model(&new_model(&format!("e{}", i % 3), &format!("m{i}")), false).await.unwrap();
        let new = NewJob { model_id: model.id, kind: JobKind::Rl, config: json!({}), inputs: json!([]), rollout: None };
        for _ in 0..JOBS_PER_MODEL {
            queued.entry(model.id).or_default().push(second.create_job(&new).await.unwrap().id);
        }
    }
    for round in 0..JOBS_PER_MODEL {
        let mut claimers = Vec::new();
        for store in [&first, &second, &first, &second] {
            let store = store.clone();
            claimers.push(tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(claimed) = store.claim_next_job(&tandem_store::test_lease()).await.unwrap() {
                    got.push(claimed.job);
                }
                got
            }));
        }
        let mut claimed = Vec::new();
        for c in claimers {
            claimed.extend(c.await.unwrap());
        }
        // Each model's oldest queued job, once: a job claimed twice would also show attempts 2.
        let mut got: Vec<(Uuid, Uuid)> = claimed.iter().map(|j| (j.model_id, j.id)).collect();
        got.sort_unstable();
        let want: Vec<(Uuid, Uuid)> = queued.iter().map(|(m, jobs)| (*m, jobs[round])).collect();
        assert_eq!(got, want, "round {round}");
        assert!(claimed.iter().all(|j| j.attempts == 1 && j.status == JobStatus::Running));
        for (i, job) in claimed.iter().enumerate() {
            let store = if i % 2 == 0 { &first } else { &second };
            store
                .finish_job(job.id, tandem_store::TEST_OWNER, &JobOutcome::Failed { error_message: "done".into() })
                .await
                .unwrap();
        }
    }
    assert!(first.claim_next_job(&tandem_store::test_lease()).await.unwrap().is_none());
    second.close().await;
    first.close().await;
}
