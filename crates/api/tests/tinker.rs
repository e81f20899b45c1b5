//! The Tinker routes on a fake compute port (`common/tinker_fake.rs`): what a run keeps (saved
//! states, sampler names, external weights, TTLs, publish marks) is the store's catalog, so a
//! second node on the same store lists, deletes, publishes and serves downloads of it, and
//! another entity sees only what is published.

mod common;

use common::tinker_fake::{answer, post, FakeTrainer};
use common::{test_app_training, Node, Reply, TestApp, BASE, KEY_A, KEY_B};
use serde_json::{json, Value};
use std::sync::Arc;
use tandem_api::Limits;

struct Run {
    session: String,
    model: String,
    seq: i64,
}

impl Run {
    async fn new(app: &TestApp, key: &str) -> Run {
        let session =
            post(app, key, "create_session", json!({})).await.json()["session_id"].as_str().unwrap().to_string();
        let body =
            json!({ "session_id": session, "model_seq_id": 0, "base_model": BASE, "lora_config": { "rank": 8 } });
        let created = answer(app, key, &post(app, key, "create_model", body).await).await;
        Run { model: created["model_id"].as_str().expect("created").to_string(), session, seq: 0 }
    }

    /// A training call in the model's order.
    async fn call(&mut self, app: &TestApp, key: &str, path: &str, mut body: Value) -> Value {
        self.seq += 1;
        body["model_id"] = json!(self.model);
        body["seq_id"] = json!(self.seq);
        answer(app, key, &post(app, key, path, body).await).await
    }

    async fn step(&mut self, app: &TestApp, key: &str, lr: f64) {
        let done = self.call(app, key, "optim_step", json!({ "adam_params": { "learning_rate": lr } })).await;
        assert!(done.get("error").is_none(), "{done}");
    }
}

async fn listing(app: &TestApp, key: &str, run: &str) -> Reply {
    app.call("GET", &format!("/api/v1/training_runs/{run}/checkpoints"), key, None).await
}

fn ids(listed: &Value) -> Vec<String> {
    let mut ids: Vec<String> =
        listed["checkpoints"].as_array().unwrap().iter().map(|c| c["checkpoint_id"].as_str().unwrap().into()).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_runs_catalog_is_the_stores_and_every_node_reads_it() {
    let fake = Arc::new(FakeTrainer::default());
    let app = test_app_training(Limits::default(), None, None, Some(fake.clone())).await;
    // A node that does not train, on the same store and files.
    let other =
        app.node(Node { limits: Limits::default(), backend: None, lora_root: None, tinker: None, node_id: None });
    let mut run = Run::new(&app, KEY_A).await;
    run.step(&app, KEY_A, 0.25).await;
    let saved = run.call(&app, KEY_A, "save_weights", json!({ "path": "s1", "ttl_seconds": 3600 })).await;
    let path = format!("tinker://{}/weights/s1", run.model);
    assert_eq!(saved["path"], path.as_str());
    let ext = run.call(&app, KEY_A, "save_weights_external", json!({ "path": "ext" })).await;
    assert_eq!(ext["size_bytes"], 8 + json!({ "r": 8 }).to_string().len());
    let sampler = run.call(&app, KEY_A, "save_weights_for_sampler", json!({ "path": "samp" })).await;
    assert!(sampler["path"].as_str().unwrap().ends_with("/sampler_weights/samp"), "{sampler}");

    // Both nodes list the same; the TTL shows.
    let here = listing(&app, KEY_A, &run.model).await.json();
    let there = listing(&other, KEY_A, &run.model).await.json();
    assert_eq!(ids(&here), ["external_weights/ext", "sampler_weights/samp", "weights/s1"]);
    assert_eq!(ids(&there), ids(&here));
    let s1 =
        |l: &Value| l["checkpoints"].as_array().unwrap().iter().find(|c| c["checkpoint_id"] == "weights/s1").cloned();
    assert!(s1(&there).unwrap()["expires_at"].is_string());
    // Another entity: the run is missing, its paths unreadable.
    assert_eq!(listing(&other, KEY_B, &run.model).await.status, 404);
    assert_eq!(post(&app, KEY_B, "weights_info", json!({ "tinker_path": path })).await.status, 404);
    let info = post(&other, KEY_A, "weights_info", json!({ "tinker_path": path })).await;
    assert_eq!((info.status.as_u16(), info.json()["lora_rank"].clone()), (200, json!(8)));

    // Published on the node that does not train, loaded by another entity on the one that does.
    let publish = format!("/api/v1/training_runs/{}/checkpoints/weights/s1/publish", run.model);
    assert_eq!(other.call("POST", &publish, KEY_A, None).await.status, 200);
    let theirs = Run::new(&app, KEY_B).await;
    let body = json!({ "session_id": theirs.session, "model_seq_id": 1, "path": path });
    let loaded = answer(&app, KEY_B, &post(&app, KEY_B, "load_weights", body).await).await;
    let loaded_id = loaded["model_id"].as_str().expect("loaded").to_string();
    assert_eq!(fake.weight(&loaded_id), Some(0.25), "the bytes saved, read back");
    // New weights under the name: private again, and the name means them.
    run.step(&app, KEY_A, 0.5).await;
    run.call(&app, KEY_A, "save_weights", json!({ "path": "s1" })).await;
    assert_eq!(post(&app, KEY_B, "weights_info", json!({ "tinker_path": path })).await.status, 404);
    assert!(s1(&listing(&app, KEY_A, &run.model).await.json()).unwrap()["expires_at"].is_null(), "no TTL: none");
    let into = json!({ "model_id": run.model, "seq_id": run.seq + 1, "path": path });
    run.seq += 1;
    let reloaded = answer(&app, KEY_A, &post(&app, KEY_A, "load_weights", into).await).await;
    assert!(reloaded.get("error").is_none(), "{reloaded}");
    assert_eq!(fake.weight(&run.model), Some(0.75));

    // External weights download by their URL from any node; deleted on one, gone on both.
    let urls = format!("/api/v1/training_runs/{}/checkpoints/external_weights/ext/external_weights_urls", run.model);
    let signed = other.call("GET", &urls, KEY_A, None).await.json();
    let url = signed["urls"]["adapter_model.safetensors"].as_str().unwrap().to_string();
    let file = url.split_once("/api/v1/").unwrap().1;
    let got = other.raw("GET", &format!("/api/v1/{file}"), None, None).await;
    assert_eq!((got.status.as_u16(), got.bytes), (200, 0.25f64.to_le_bytes().to_vec()));
    // Signed on one node, served by the other: the key is the cluster's, kept in the store.
    let got = app.raw("GET", &format!("/api/v1/{file}"), None, None).await;
    assert_eq!((got.status.as_u16(), got.bytes), (200, 0.25f64.to_le_bytes().to_vec()));
    assert_eq!(app.call("GET", &urls, KEY_B, None).await.status, 404, "another entity's");
    let delete = format!("/api/v1/training_runs/{}/checkpoints/external_weights/ext", run.model);
    assert_eq!(app.call("DELETE", &delete, KEY_B, None).await.status, 404);
    assert_eq!(other.call("DELETE", &delete, KEY_A, None).await.status, 200);
    assert_eq!(app.call("GET", &urls, KEY_A, None).await.status, 404);
    assert_eq!(other.raw("GET", &format!("/api/v1/{file}"), None, None).await.status, 404);

    // A TTL set on one node shows on the other; another entity's is a 404.
    let ttl = format!("/api/v1/training_runs/{}/checkpoints/weights/s1/ttl", run.model);
    assert_eq!(other.call("PUT", &ttl, KEY_B, Some(json!({ "ttl_seconds": 7200 }))).await.status, 404);
    assert_eq!(other.call("PUT", &ttl, KEY_A, Some(json!({ "ttl_seconds": 7200 }))).await.status, 200);
    assert!(s1(&listing(&app, KEY_A, &run.model).await.json()).unwrap()["expires_at"].is_string());
}

#[tokio::test]
async fn a_refused_save_fails_its_own_call_and_the_next_runs() {
    let fake = Arc::new(FakeTrainer::default());
    let app = test_app_training(Limits::default(), None, None, Some(fake.clone())).await;
    let mut run = Run::new(&app, KEY_A).await;
    for bad in ["a/b", "..", ""] {
        let refused = run.call(&app, KEY_A, "save_weights", json!({ "path": bad })).await;
        assert_eq!(refused["category"], "user", "{bad:?}: {refused}");
        let refused = run.call(&app, KEY_A, "save_weights_external", json!({ "path": bad })).await;
        assert_eq!(refused["category"], "user", "{bad:?}: {refused}");
    }
    run.step(&app, KEY_A, 1.0).await;
    assert_eq!(fake.weight(&run.model), Some(1.0), "the model is not wedged");
    assert!(ids(&listing(&app, KEY_A, &run.model).await.json()).is_empty(), "nothing was kept");
    // What the held models take is on `/metrics`.
    let metrics = String::from_utf8(app.call("GET", "/metrics", KEY_A, None).await.bytes).unwrap();
    assert!(metrics.contains("tandem:tinker_models{state=\"live\"} 1\n"), "{metrics}");
    assert!(metrics.contains("tandem:tinker_models{state=\"parked\"} 0\n"));
    assert!(metrics.contains("tandem:tinker_live_bytes 8\n"));
}

/// Bad input at the edge in FastAPI's shape (never axum's plain-text rejection), caps as 429s the
/// SDK retries, strict run ids, and another entity's objects as 404s.
#[tokio::test]
async fn bodies_caps_and_ids_are_refused_in_the_sdks_shape() {
    let fake = Arc::new(FakeTrainer::default());
    let app = test_app_training(Limits::default(), None, None, Some(fake)).await;
    for (path, body) in [
        ("session_heartbeat", json!({})),
        ("session_heartbeat", json!({ "session_id": 7 })),
        ("create_model", json!({ "session_id": "s", "model_seq_id": "zero", "base_model": BASE })),
        ("retrieve_future", json!("req-1")),
    ] {
        let r = post(&app, KEY_A, path, body.clone()).await;
        assert_eq!(r.status, 422, "{path} {body}");
        let detail = &r.json()["detail"];
        let msg = detail[0]["msg"].as_str().unwrap_or_else(|| panic!("{path}: {detail}"));
        assert!(msg.contains("does not decode"), "{msg}");
    }
    let raw = app.raw("POST", "/api/v1/get_info", Some(KEY_A), Some(b"{not json".to_vec())).await;
    assert_eq!(raw.status, 422);
    assert!(raw.json()["detail"].is_array());

    let run = Run::new(&app, KEY_A).await;
    let session = run.session.clone();
    // A negative model number is no run.
    let body = json!({ "session_id": session, "model_seq_id": -1, "base_model": BASE, "lora_config": { "rank": 8 } });
    assert_eq!(post(&app, KEY_A, "create_model", body).await.status, 422);
    // Runs are named one way: the record's name, or a padded number, is not the run.
    let record = run.model.replace(":train:", "-train-");
    for other in [record, run.model.replace(":train:0", ":train:00")] {
        assert_eq!(app.call("GET", &format!("/api/v1/training_runs/{other}"), KEY_A, None).await.status, 404);
    }
    assert_eq!(app.call("GET", &format!("/api/v1/training_runs/{}", run.model), KEY_A, None).await.status, 200);
    // Another entity's run, model and session are 404s.
    assert_eq!(app.call("GET", &format!("/api/v1/training_runs/{}", run.model), KEY_B, None).await.status, 404);
    assert_eq!(post(&app, KEY_B, "get_info", json!({ "model_id": run.model })).await.status, 404);
    assert_eq!(post(&app, KEY_B, "session_heartbeat", json!({ "session_id": session })).await.status, 404);
    // The model cap (4 an entity) is a 429 with Retry-After, which the SDK retries.
    for seq in 1..4 {
        let body =
            json!({ "session_id": session, "model_seq_id": seq, "base_model": BASE, "lora_config": { "rank": 8 } });
        answer(&app, KEY_A, &post(&app, KEY_A, "create_model", body).await).await;
    }
    let body = json!({ "session_id": session, "model_seq_id": 9, "base_model": BASE, "lora_config": { "rank": 8 } });
    let capped = post(&app, KEY_A, "create_model", body).await;
    assert_eq!(capped.status, 429, "{}", String::from_utf8_lossy(&capped.bytes));
    assert_eq!(capped.headers.get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    assert!(capped.json()["detail"].as_str().unwrap().contains("training models at once"));
}
