//! Datasets and SFT jobs through the router: upload, versions, validation, entity scoping, and
//! a job that runs through the same worker and events as RL jobs.

mod common;

use common::*;
use serde_json::{json, Value};
use std::sync::Arc;
use tandem_jobs::{NoTrainer, Worker, WorkerConfig};

const ROWS: &str = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yes\"}]}\n\
                    {\"messages\": [{\"role\": \"user\", \"content\": \"ok?\"}, {\"role\": \"assistant\", \"content\": \"yes\"}], \"tools\": []}\n";

async fn upload(app: &TestApp, key: &str, query: &str, body: &str) -> Reply {
    app.raw("POST", &format!("/v1/preview/datasets?{query}"), Some(key), Some(body.as_bytes().to_vec())).await
}

#[tokio::test]
async fn datasets_upload_version_and_stay_with_their_entity() {
    let app = test_app().await;
    let r = upload(&app, KEY_A, "project=proj&name=run-sft-data-0a1b", ROWS).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.bytes));
    let d = r.json();
    assert_eq!((d["version"].as_i64(), d["num_rows"].as_i64()), (Some(0), Some(2)));
    assert_eq!(d["url"], "wandb-artifact:///a/proj/run-sft-data-0a1b:v0");
    assert_eq!(d["size_bytes"].as_u64(), Some(ROWS.len() as u64));
    let again = upload(&app, KEY_A, "project=proj&name=run-sft-data-0a1b", ROWS).await.json();
    assert_eq!(again["url"], "wandb-artifact:///a/proj/run-sft-data-0a1b:v1");
    let id = d["id"].as_str().unwrap();
    assert_eq!(app.ok("GET", &format!("/v1/preview/datasets/{id}"), KEY_A, None).await["version"], 0);
    // Entity b sees nothing of a's.
    assert_eq!(app.call("GET", &format!("/v1/preview/datasets/{id}"), KEY_B, None).await.status, 404);
    assert_eq!(app.call("DELETE", &format!("/v1/preview/datasets/{id}"), KEY_B, None).await.status, 404);
    assert_eq!(app.ok("GET", "/v1/preview/datasets", KEY_B, None).await["data"], json!([]));
    assert_eq!(
        app.ok("GET", "/v1/preview/datasets?project=proj", KEY_A, None).await["data"].as_array().unwrap().len(),
        2
    );
    app.ok("DELETE", &format!("/v1/preview/datasets/{id}"), KEY_A, None).await;
    assert_eq!(app.call("GET", &format!("/v1/preview/datasets/{id}"), KEY_A, None).await.status, 404);
}

#[tokio::test]
async fn bad_datasets_are_422s_naming_the_line() {
    let app = test_app().await;
    let r = upload(&app, KEY_A, "project=proj", ROWS).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["detail"][0]["loc"], json!(["query", "name"]));
    let r = upload(&app, KEY_A, "project=proj&name=a/b", ROWS).await;
    assert_eq!(r.status, 422);
    let r = upload(&app, KEY_A, "project=proj&name=d", "{\"messages\": []}\nnope\n").await;
    assert_eq!(r.status, 422);
    let locs: Vec<Value> = r.json()["detail"].as_array().unwrap().iter().map(|d| d["loc"].clone()).collect();
    assert_eq!(locs, vec![json!(["body", 0, "messages"]), json!(["body", 1])]);
    let r = app.raw("POST", "/v1/preview/datasets?project=p&name=d", Some(KEY_A), Some(vec![0xff, 0xfe])).await;
    assert_eq!(r.status, 422);
    assert_eq!(upload(&app, KEY_A, "project=p&name=d", "\n\n").await.status, 422);
}

#[tokio::test]
async fn sft_jobs_name_a_dataset_and_report_like_rl_jobs() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let model_id = m["id"].as_str().unwrap();
    upload(&app, KEY_A, "project=proj&name=data", ROWS).await;
    let body = |url: &str, config: Value| json!({"model_id": model_id, "training_data_url": url, "config": config});

    // Bad URL, another entity's dataset, a missing version, bad config.
    let r = app.call("POST", "/v1/preview/sft-training-jobs", KEY_A, Some(body("s3://x/y", json!({})))).await;
    assert_eq!((r.status.as_u16(), r.json()["detail"][0]["loc"].clone()), (422, json!(["body", "training_data_url"])));
    let b_model = app.create_model(KEY_B, "agent").await;
    let foreign = json!({"model_id": b_model["id"], "training_data_url": "wandb-artifact:///a/proj/data:v0"});
    let r = app.call("POST", "/v1/preview/sft-training-jobs", KEY_B, Some(foreign)).await;
    assert_eq!((r.status.as_u16(), r.json()), (404, json!({"detail": "dataset not found"})));
    let r = app
        .call("POST", "/v1/preview/sft-training-jobs", KEY_A, Some(body("wandb-artifact:///a/proj/data:v7", json!({}))))
        .await;
    assert_eq!(r.status, 404);
    let r = app
        .call(
            "POST",
            "/v1/preview/sft-training-jobs",
            KEY_A,
            Some(body("wandb-artifact:///a/proj/data:v0", json!({"batch_size": 0}))),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.json()["detail"][0]["loc"].clone()),
        (422, json!(["body", "config", "batch_size"]))
    );

    // A good job: queued, kind sft, run by the worker (here without a trainer: it fails honestly),
    // its events under /training-jobs/{id}/events.
    let config = json!({"learning_rate": [1e-4], "assistant_turns": "all",
                        "metric_logging": {"enabled": true, "target_training_step": 1}});
    let job = app
        .ok("POST", "/v1/preview/sft-training-jobs", KEY_A, Some(body("wandb-artifact:///a/proj/data:latest", config)))
        .await;
    assert_eq!((job["status"].as_str(), job["kind"].as_str()), (Some("queued"), Some("sft")));
    let worker = Worker::new(
        app.store.clone(),
        tandem_store::Checkpoints::local(app.checkpoints.clone()),
        Arc::new(NoTrainer),
        WorkerConfig::default(),
    );
    assert!(worker.run_once().await.unwrap());
    let id = job["id"].as_str().unwrap();
    let events = app.ok("GET", &format!("/v1/preview/training-jobs/{id}/events"), KEY_A, None).await;
    let types: Vec<&str> = events["data"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, vec!["training_started", "training_failed"]);
    assert_eq!(app.call("GET", &format!("/v1/preview/training-jobs/{id}/events"), KEY_B, None).await.status, 404);
}
