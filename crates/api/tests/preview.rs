//! Every preview endpoint's success and error paths, through the router without a socket.

mod common;

use common::*;
use serde_json::{json, Value};
use std::sync::Arc;
use tandem_api::Limits;
use tandem_jobs::{NoTrainer, Worker, WorkerConfig};
use tandem_store::{ApiKeyRecord, Store};
use uuid::Uuid;

#[tokio::test]
async fn auth_is_required_everywhere_but_health() {
    let app = test_app().await;
    let h = app.raw("GET", "/health", None, None).await;
    assert_eq!((h.status.as_u16(), h.json()), (200, json!({"status": "ok"})));
    assert!(h.headers.contains_key("x-request-id"));

    let routes = [
        ("POST", "/v1/preview/models"),
        ("GET", "/v1/preview/models"),
        ("GET", "/v1/preview/models/0191d7a0-0000-7000-8000-000000000000"),
        ("DELETE", "/v1/preview/models/x"),
        ("GET", "/v1/preview/models/x/checkpoints"),
        ("DELETE", "/v1/preview/models/x/checkpoints"),
        ("POST", "/v1/preview/models/x/log"),
        ("GET", "/v1/preview/models/x/logs"),
        ("GET", "/v1/preview/models/x/logs/y"),
        ("POST", "/v1/preview/training-jobs"),
        ("GET", "/v1/preview/training-jobs/x"),
        ("POST", "/v1/preview/training-jobs/x/cancel"),
        ("GET", "/v1/preview/training-jobs/x/events"),
    ];
    // A revoked stored key, a stored key that works, and malformed headers.
    let (good, record) = tandem_api::auth::generate_key("a");
    app.store.insert_key(&record).await.unwrap();
    let (revoked, record2) = tandem_api::auth::generate_key("a");
    app.store.insert_key(&record2).await.unwrap();
    app.store.revoke_key(&record2.id.to_string()).await.unwrap();
    for (method, path) in routes {
        for key in [None, Some("nope"), Some(revoked.as_str()), Some("")] {
            let r = app.raw(method, path, key, Some(b"{}".to_vec())).await;
            assert_eq!(r.status, 401, "{method} {path} with {key:?}");
            assert_eq!(r.headers["www-authenticate"], "Bearer");
            assert_eq!(r.json(), json!({"detail": "missing or invalid API key"}));
        }
    }
    let r = app.raw("GET", "/v1/preview/models", None, None).await;
    assert_eq!(r.status, 401);
    let mut req =
        axum::http::Request::builder().uri("/v1/preview/models").header("authorization", format!("Basic {good}"));
    req = req.header("x-test", "1");
    let res =
        tower::ServiceExt::oneshot(app.router.clone(), req.body(axum::body::Body::empty()).unwrap()).await.unwrap();
    assert_eq!(res.status(), 401, "a non-bearer scheme is refused");
    assert_eq!(app.call("GET", "/v1/preview/models", &good, None).await.status, 200);
    let _unused: Option<ApiKeyRecord> = None;
}

#[tokio::test]
async fn model_create_get_list_delete() {
    let app = test_app().await;
    let body = json!({"entity": null, "project": "proj", "name": "agent", "base_model": BASE, "nvext": {"x": 1}});
    let m = app.ok("POST", "/v1/preview/models", KEY_A, Some(body.clone())).await;
    assert_eq!(
        (m["entity"].as_str(), m["project"].as_str(), m["name"].as_str()),
        (Some("a"), Some("proj"), Some("agent"))
    );
    assert_eq!(m["base_model"], BASE);
    assert!(m["run_id"].is_string());
    let id = m["id"].as_str().unwrap().to_string();

    let dup = app.call("POST", "/v1/preview/models", KEY_A, Some(body.clone())).await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.headers["x-should-retry"], "false");
    let mut again = body.clone();
    again["return_existing"] = json!(true);
    assert_eq!(app.ok("POST", "/v1/preview/models", KEY_A, Some(again)).await["id"], m["id"]);
    // The same name in another entity is another model.
    let mb = app.create_model(KEY_B, "agent").await;
    assert_ne!(mb["id"], m["id"]);

    let mut foreign = body.clone();
    foreign["entity"] = json!("b");
    assert_eq!(app.call("POST", "/v1/preview/models", KEY_A, Some(foreign)).await.status, 403);
    let mut own = body.clone();
    own["entity"] = json!("a");
    own["name"] = json!("agent2");
    assert_eq!(app.ok("POST", "/v1/preview/models", KEY_A, Some(own)).await["entity"], "a");

    let bad = app
        .call("POST", "/v1/preview/models", KEY_A, Some(json!({"project": "p/q", "name": 3, "base_model": "gpt-9"})))
        .await;
    assert_eq!(bad.status, 422);
    let e = bad.json();
    let locs: Vec<&Value> = e["detail"].as_array().unwrap().iter().map(|d| &d["loc"]).collect();
    assert_eq!(locs, vec![&json!(["body", "project"]), &json!(["body", "name"]), &json!(["body", "base_model"])]);
    assert_eq!(e["detail"][2]["type"], "literal_error");
    assert!(e["detail"][2]["msg"].as_str().unwrap().contains(BASE), "lists the served models");
    let missing = app.call("POST", "/v1/preview/models", KEY_A, Some(json!({}))).await.json();
    assert_eq!(missing["detail"].as_array().unwrap().len(), 3);
    assert_eq!(missing["detail"][0]["type"], "missing");

    assert_eq!(app.ok("GET", &format!("/v1/preview/models/{id}"), KEY_A, None).await, m);
    // Another entity's id and a random id answer the same bytes.
    let foreign_read = app.call("GET", &format!("/v1/preview/models/{id}"), KEY_B, None).await;
    let random_read = app.call("GET", &format!("/v1/preview/models/{}", Uuid::now_v7()), KEY_B, None).await;
    let junk_read = app.call("GET", "/v1/preview/models/not-a-uuid", KEY_B, None).await;
    assert_eq!(foreign_read.status, 404);
    assert_eq!(foreign_read.bytes, random_read.bytes);
    assert_eq!(foreign_read.bytes, junk_read.bytes);

    let list = app.ok("GET", "/v1/preview/models?limit=1", KEY_A, None).await;
    assert_eq!((list["object"].as_str(), list["has_more"].as_bool()), (Some("list"), Some(true)));
    assert_eq!(list["first_id"], m["id"]);
    let next = app.ok("GET", &format!("/v1/preview/models?after={id}"), KEY_A, None).await;
    assert_eq!(next["data"].as_array().unwrap().len(), 1);
    assert_eq!(app.ok("GET", "/v1/preview/models?project=zzz", KEY_A, None).await["data"], json!([]));
    let b_list = app.ok("GET", "/v1/preview/models", KEY_B, None).await;
    assert_eq!(b_list["data"].as_array().unwrap().len(), 1, "B never sees A's models");

    assert_eq!(app.call("DELETE", &format!("/v1/preview/models/{id}"), KEY_B, None).await.status, 404);
    let del = app.ok("DELETE", &format!("/v1/preview/models/{id}"), KEY_A, None).await;
    assert_eq!(del, json!({"model_id": id, "deleted_checkpoints": 0, "deleted_run": true}));
    assert_eq!(app.call("GET", &format!("/v1/preview/models/{id}"), KEY_A, None).await.status, 404);
}

#[tokio::test]
async fn checkpoints_list_and_delete() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    let mid = Uuid::parse_str(id).unwrap();
    let base = format!("/v1/preview/models/{id}/checkpoints");
    assert_eq!(
        app.ok("GET", &base, KEY_A, None).await,
        json!({"object": "list", "data": [], "first_id": null, "last_id": null, "has_more": false})
    );
    let mut paths = Vec::new();
    for step in 1..=3 {
        paths.push(add_checkpoint(&app, mid, step).await);
    }
    let latest = app.ok("GET", &format!("{base}?limit=1&order=desc"), KEY_A, None).await;
    assert_eq!((latest["data"][0]["step"].as_i64(), latest["has_more"].as_bool()), (Some(3), Some(true)));
    assert_eq!(latest["data"][0]["metrics"], json!({"loss": 1.5}));
    let first = app.ok("GET", &format!("{base}?limit=2"), KEY_A, None).await;
    let after = first["last_id"].as_str().unwrap();
    let rest = app.ok("GET", &format!("{base}?after={after}"), KEY_A, None).await;
    assert_eq!(
        rest["data"].as_array().unwrap().iter().map(|c| c["step"].as_i64().unwrap()).collect::<Vec<_>>(),
        vec![3]
    );

    for q in ["limit=0", "limit=101", "limit=x", "order=sideways", "after=nope"] {
        let r = app.call("GET", &format!("{base}?{q}"), KEY_A, None).await;
        assert_eq!(r.status, 422, "{q}");
        assert_eq!(r.json()["detail"][0]["loc"][0], "query");
    }
    let unknown_cursor = app.call("GET", &format!("{base}?after={}", Uuid::now_v7()), KEY_A, None).await;
    assert_eq!(unknown_cursor.status, 422);
    assert_eq!(app.call("GET", &base, KEY_B, None).await.status, 404);

    let bad = app.call("DELETE", &base, KEY_A, Some(json!({"steps": [1, "two"]}))).await;
    assert_eq!(bad.status, 422);
    assert_eq!(bad.json()["detail"][0]["loc"], json!(["body", "steps", 1]));
    assert_eq!(app.call("DELETE", &base, KEY_B, Some(json!({"steps": [1]}))).await.status, 404);
    let del = app.ok("DELETE", &base, KEY_A, Some(json!({"steps": [1, 3, 9]}))).await;
    assert_eq!(del, json!({"deleted_count": 2, "not_found_steps": [9]}));
    assert!(!app.checkpoints.root().join(&paths[0]).exists(), "files of deleted checkpoints are removed");
    assert!(app.checkpoints.root().join(&paths[1]).exists());
    let latest = app.ok("GET", &format!("{base}?limit=1&order=desc"), KEY_A, None).await;
    assert_eq!(latest["data"][0]["step"], 2);

    let gone = app.ok("DELETE", &format!("/v1/preview/models/{id}"), KEY_A, None).await;
    assert_eq!(gone["deleted_checkpoints"], 1);
    assert!(!app.checkpoints.root().join(&paths[1]).exists());
}

#[tokio::test]
async fn trajectory_logs() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    let path = format!("/v1/preview/models/{id}/log");
    let groups = json!([group(&[1.0, 0.0]), group(&[0.5, 0.5])]);
    let body = json!({"model_id": id, "split": "val", "trajectory_groups": groups});
    let out = app.ok("POST", &path, KEY_A, Some(body.clone())).await;
    assert_eq!((out["split"].as_str(), out["step"].as_i64()), (Some("val"), Some(0)));
    assert_eq!(out["metrics"]["val/reward"], 0.5);
    assert_eq!(out["metrics"]["val/reward_std_dev"], 0.25);
    assert_eq!(out["metrics"]["val/data/step_num_groups_trainable"], 1.0);
    let log_id = out["id"].as_str().unwrap();
    let stored = app.ok("GET", &format!("/v1/preview/models/{id}/logs/{log_id}"), KEY_A, None).await;
    assert_eq!(stored["trajectory_groups"], groups);
    assert_eq!(app.call("GET", &format!("/v1/preview/models/{id}/logs/{log_id}"), KEY_B, None).await.status, 404);
    assert_eq!(
        app.call("GET", &format!("/v1/preview/models/{id}/logs/{}", Uuid::now_v7()), KEY_A, None).await.status,
        404
    );

    // After a checkpoint exists, the log's metrics are attached to it.
    add_checkpoint(&app, Uuid::parse_str(id).unwrap(), 1).await;
    let out = app.ok("POST", &path, KEY_A, Some(body.clone())).await;
    assert_eq!(out["step"], 1);
    let cps = app.ok("GET", &format!("/v1/preview/models/{id}/checkpoints"), KEY_A, None).await;
    assert_eq!(cps["data"][0]["metrics"]["val/reward"], 0.5);
    assert_eq!(cps["data"][0]["metrics"]["loss"], 1.5);

    let list = app.ok("GET", &format!("/v1/preview/models/{id}/logs?split=val&limit=1"), KEY_A, None).await;
    assert_eq!((list["data"].as_array().unwrap().len(), list["has_more"].as_bool()), (1, Some(true)));
    assert!(list["data"][0].get("trajectory_groups").is_none());

    let bad = json!({"split": "", "trajectory_groups": [{"trajectories": [{"messages_and_choices": [], "reward": 1},
        {"messages_and_choices": [], "reward": 1}, {"messages_and_choices": [], "reward": "x"}]}]});
    let r = app.call("POST", &path, KEY_A, Some(bad)).await;
    assert_eq!(r.status, 422);
    let d = r.json()["detail"].clone();
    assert_eq!(d[0]["loc"], json!(["body", "split"]));
    assert_eq!(d[1]["loc"], json!(["body", "trajectory_groups", 0, "trajectories", 2, "reward"]));
    assert_eq!(d[1]["input"], "x");
    assert_eq!(app.call("POST", &path, KEY_B, Some(body.clone())).await.status, 404);
    let r = app.call("POST", &path, KEY_A, Some(json!({"split": "val"}))).await;
    assert_eq!(r.json()["detail"][0]["loc"], json!(["body", "trajectory_groups"]));
}

#[tokio::test]
async fn bodies_that_are_not_json_or_too_large() {
    let app = test_app_with(Limits { max_body_bytes: 1024, ..Limits::default() }).await;
    let r = app.raw("POST", "/v1/preview/models", Some(KEY_A), Some(b"{\"project\": ".to_vec())).await;
    assert_eq!(r.status, 422);
    let d = &r.json()["detail"][0];
    assert_eq!(
        (d["type"].as_str(), d["loc"][0].as_str(), d["loc"][1].as_u64()),
        (Some("json_invalid"), Some("body"), Some(12))
    );
    let big = json!({"project": "x".repeat(2000)});
    let r = app.call("POST", "/v1/preview/models", KEY_A, Some(big)).await;
    assert_eq!(r.status, 413);
    assert!(r.json()["detail"].is_string());
    let r = app.call("POST", "/v1/preview/models", KEY_A, Some(json!([1]))).await;
    assert_eq!(r.json()["detail"][0]["type"], "model_attributes_type");
    let r = app.call("GET", "/v1/preview/nothing-here", KEY_A, None).await;
    assert_eq!((r.status.as_u16(), r.json()), (404, json!({"detail": "Not Found"})));
}

#[tokio::test]
async fn training_jobs_fail_honestly_without_a_trainer() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    let body = json!({"model_id": id, "trajectory_groups": [group(&[1.0, 0.0])],
                      "experimental_config": {"learning_rate": 1e-5, "kimi_k2_tau": null, "future_knob": 3}});
    let job = app.ok("POST", "/v1/preview/training-jobs", KEY_A, Some(body.clone())).await;
    assert_eq!(job["status"], "queued");
    assert_eq!(job["model_id"], m["id"]);
    let job_id = job["id"].as_str().unwrap();
    assert_eq!(app.call("GET", &format!("/v1/preview/training-jobs/{job_id}"), KEY_B, None).await.status, 404);
    assert_eq!(app.call("GET", &format!("/v1/preview/training-jobs/{job_id}/events"), KEY_B, None).await.status, 404);

    let worker = Worker::new(
        app.store.clone() as Arc<dyn Store>,
        tandem_store::Checkpoints::local(app.checkpoints.clone()),
        Arc::new(NoTrainer),
        WorkerConfig::default(),
    );
    assert!(worker.run_once().await.unwrap());
    assert!(!worker.run_once().await.unwrap());

    let got = app.ok("GET", &format!("/v1/preview/training-jobs/{job_id}"), KEY_A, None).await;
    assert_eq!(got["status"], "failed");
    assert_eq!(got["error_message"], "no trainer is available in this build");
    let events = app.ok("GET", &format!("/v1/preview/training-jobs/{job_id}/events"), KEY_A, None).await;
    let data = events["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!((data[0]["type"].as_str(), &data[0]["data"]), (Some("training_started"), &json!({"num_sequences": 0})));
    assert_eq!(data[1]["type"], "training_failed");
    assert_eq!(data[1]["data"]["error_message"], "no trainer is available in this build");
    let first = data[0]["id"].as_str().unwrap();
    let page =
        app.ok("GET", &format!("/v1/preview/training-jobs/{job_id}/events?after={first}&limit=1"), KEY_A, None).await;
    assert_eq!((page["data"][0]["type"].as_str(), page["has_more"].as_bool()), (Some("training_failed"), Some(false)));
    let r = app.call("GET", &format!("/v1/preview/training-jobs/{job_id}/events?limit=500"), KEY_A, None).await;
    assert_eq!(r.status, 422);
    // Cancelling a finished job leaves it as it is.
    assert_eq!(
        app.ok("POST", &format!("/v1/preview/training-jobs/{job_id}/cancel"), KEY_A, None).await["status"],
        "failed"
    );

    // Cancel before the worker gets to it.
    let queued = app.ok("POST", "/v1/preview/training-jobs", KEY_A, Some(body.clone())).await;
    let qid = queued["id"].as_str().unwrap();
    assert_eq!(app.call("POST", &format!("/v1/preview/training-jobs/{qid}/cancel"), KEY_B, None).await.status, 404);
    let c = app.ok("POST", &format!("/v1/preview/training-jobs/{qid}/cancel"), KEY_A, None).await;
    assert_eq!(c["status"], "cancelled");
    assert!(!worker.run_once().await.unwrap());
    let ev = app.ok("GET", &format!("/v1/preview/training-jobs/{qid}/events"), KEY_A, None).await;
    // Even a job cancelled before it ran begins with `training_started` (ART reads it first).
    let kinds: Vec<&str> = ev["data"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["training_started", "training_failed"]);
}

#[tokio::test]
async fn training_job_validation() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    let r = app
        .call(
            "POST",
            "/v1/preview/training-jobs",
            KEY_A,
            Some(json!({"model_id": "nope", "trajectory_groups": [{"trajectories": [{"reward": "1"}]}],
            "experimental_config": {"importance_sampling_level": "tokens", "advantage_balance": 3}})),
        )
        .await;
    assert_eq!(r.status, 422);
    let locs: Vec<Value> = r.json()["detail"].as_array().unwrap().iter().map(|d| d["loc"].clone()).collect();
    assert_eq!(
        locs,
        vec![
            json!(["body", "model_id"]),
            json!(["body", "trajectory_groups", 0, "trajectories", 0, "reward"]),
            json!(["body", "experimental_config", "importance_sampling_level"]),
            json!(["body", "experimental_config", "advantage_balance"]),
        ]
    );
    let good_groups = json!([group(&[1.0, 0.0])]);
    let r = app
        .call(
            "POST",
            "/v1/preview/training-jobs",
            KEY_A,
            Some(json!({"model_id": Uuid::now_v7(), "trajectory_groups": good_groups})),
        )
        .await;
    assert_eq!((r.status.as_u16(), r.json()), (404, json!({"detail": "model not found"})));
    let r = app
        .call(
            "POST",
            "/v1/preview/training-jobs",
            KEY_B,
            Some(json!({"model_id": id, "trajectory_groups": good_groups})),
        )
        .await;
    assert_eq!((r.status.as_u16(), r.json()), (404, json!({"detail": "model not found"})));
    let r = app
        .call(
            "POST",
            "/v1/preview/training-jobs",
            KEY_A,
            Some(json!({"model_id": id, "trajectory_groups": good_groups, "experimental_config": null})),
        )
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn health_is_503_when_the_store_does_not_answer() {
    let app = test_app().await;
    assert_eq!(app.raw("GET", "/health", None, None).await.status, 200);
    app.store.close().await;
    // `/health` answers from a probe at most a second old, so the outage shows within one
    // probe interval plus the ping's timeout.
    let mut r = app.raw("GET", "/health", None, None).await;
    for _ in 0..40 {
        if r.status == 503 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        r = app.raw("GET", "/health", None, None).await;
    }
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["status"], "unavailable");
    // A scrape still answers (the job gauges keep their last values).
    assert_eq!(app.call("GET", "/metrics", KEY_A, None).await.status, 200);
    // Requests that need the store fail cleanly and quickly, not with a hang, a panic or a 500:
    // a 503 the clients retry after `Retry-After`.
    let started = std::time::Instant::now();
    let r = app.call("GET", "/v1/preview/models", KEY_A, None).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json(), json!({"detail": "the database is unavailable; retry shortly"}));
    assert_eq!(r.headers["retry-after"], "2");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[tokio::test]
async fn system_check_reports_each_part() {
    let app = test_app().await;
    // No engine in these tests, and the worker has not beaten yet: 503, naming both.
    let r = app.raw("GET", "/v1/system-check", None, None).await;
    assert_eq!(r.status, 503);
    let body = r.json();
    assert_eq!(body["api"], true);
    assert_eq!(body["database"]["success"], true);
    assert_eq!(body["database"]["error"], Value::Null);
    assert!(body["database"]["duration"].as_f64().unwrap() >= 0.0);
    assert_eq!(body["training_queue"]["success"], false);
    assert!(body["training_queue"]["error"].as_str().unwrap().contains("not started"));
    assert_eq!(body["inference"]["success"], false);
    app.heartbeat.beat(tandem_store::now_ms(), false);
    let body = app.raw("GET", "/v1/system-check", None, None).await.json();
    assert_eq!(body["training_queue"]["success"], true);
    app.store.close().await;
    let body = app.raw("GET", "/v1/system-check", None, None).await.json();
    assert_eq!(body["database"]["success"], false);
    assert_eq!(body["database"]["error"], "the database is not answering");
}

/// `GET /metrics`: the classic text format unless OpenMetrics is asked for (the Python suite reads a real server's with the Prometheus
/// client's strict parser). The engine's families, the jobs per state read from the store, and
/// HTTP requests labelled by route template: never by the ids a caller put in the path.
#[tokio::test]
async fn metrics_count_jobs_routes_and_the_engine() {
    let fake = common::fake::Fake::new();
    let app = common::fake::app_with(&fake).await;
    let model = app.create_model(KEY_A, "m").await;
    let model_id: Uuid = model["id"].as_str().unwrap().parse().unwrap();
    app.store
        .create_job(&tandem_store::NewJob {
            model_id,
            kind: tandem_core::records::JobKind::Sft,
            config: json!({}),
            inputs: json!([]),
            rollout: None,
        })
        .await
        .unwrap();
    let secret = Uuid::now_v7();
    assert_eq!(app.call("GET", &format!("/v1/preview/models/{secret}"), KEY_B, None).await.status, 404);
    assert_eq!(app.call("GET", &format!("/v1/preview/no-such-route/{secret}"), KEY_B, None).await.status, 404);

    assert_eq!(app.raw("GET", "/metrics", None, None).await.status, 401);
    // Made-up methods share one label value.
    for m in ["FROB1", "FROB2"] {
        app.raw(m, "/v1/preview/models", None, None).await;
    }
    let r = app.call("GET", "/metrics", KEY_A, None).await;
    assert_eq!(r.status, 200);
    // No `Accept` for OpenMetrics: the classic text format (the Python suite parses both).
    assert_eq!(r.headers["content-type"].to_str().unwrap(), "text/plain; version=0.0.4; charset=utf-8");
    let text = String::from_utf8(r.bytes).unwrap();
    for line in [
        "# TYPE vllm:num_requests_running gauge\n",
        "tandem:training_jobs{kind=\"sft\",state=\"queued\"} 1\n",
        "tandem:training_jobs{kind=\"rl\",state=\"queued\"} 0\n",
        "tandem:training_jobs{kind=\"sft\",state=\"running\"} 0\n",
        "# TYPE http_requests_total counter\n",
        "http_requests_total{handler=\"/v1/preview/models\",method=\"POST\",status=\"2xx\"} 1\n",
        "http_requests_total{handler=\"/v1/preview/models/{model_id}\",method=\"GET\",status=\"4xx\"} 1\n",
        "http_requests_total{handler=\"none\",method=\"GET\",status=\"4xx\"} 1\n",
        "http_request_duration_seconds_count{handler=\"/v1/preview/models\",method=\"POST\"} 1\n",
        "# TYPE tandem:training_gradient_steps_total counter\n",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    assert!(!text.contains(&secret.to_string()), "a path id leaked into a label");
    assert!(!text.contains("FROB") && text.contains("method=\"other\""), "{text}");
    assert!(!text.contains("# EOF") && !text.contains("# UNIT"));
    // Every family is declared once, with its help.
    let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
    assert_eq!(types.len(), helps);
    let mut names: Vec<&str> = types.iter().map(|l| l.split(' ').nth(2).unwrap()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), types.len(), "a family declared twice");
}

/// The dashboard's curves: each log metric and each training metric over steps, downsampled
/// server-side, with the checkpoints; another entity's model is a 404.
#[tokio::test]
async fn history_gives_curves_per_metric_downsampled() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "curves").await;
    let id = m["id"].as_str().unwrap();
    let model_id = Uuid::parse_str(id).unwrap();
    let log = |rewards: &[f64]| json!({"split": "val", "trajectory_groups": [group(rewards)]});
    let path = format!("/v1/preview/models/{id}/log");
    app.ok("POST", &path, KEY_A, Some(log(&[0.0, 0.5]))).await; // step 0: mean 0.25
    add_checkpoint(&app, model_id, 1).await;
    app.ok("POST", &path, KEY_A, Some(log(&[1.0, 0.5]))).await; // step 1: mean 0.75
    app.ok("POST", &path, KEY_A, Some(log(&[1.0, 1.0]))).await; // step 1: mean 1.0
                                                                // A running job toward step 2 with two gradient steps.
    let job = app
        .store
        .create_job(&tandem_store::NewJob {
            model_id,
            kind: tandem_core::records::JobKind::Rl,
            config: json!({}),
            inputs: json!([]),
            rollout: None,
        })
        .await
        .unwrap();
    app.store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
    for loss in [2.0, 1.0] {
        app.store
            .append_event(
                job.id,
                tandem_store::TEST_OWNER,
                tandem_core::records::EventKind::GradientStep,
                &json!({"loss": loss}),
            )
            .await
            .unwrap();
    }

    let h = app.ok("GET", &format!("/v1/preview/models/{id}/history"), KEY_A, None).await;
    assert_eq!((h["latest_step"].as_i64(), h["checkpoints"][0]["step"].as_i64()), (Some(1), Some(1)));
    let series = |key: &str| h["series"].as_array().unwrap().iter().find(|s| s["key"] == key).cloned().unwrap();
    let reward = series("val/reward");
    assert_eq!(reward["source"], "logs");
    let points: Vec<(f64, f64)> = reward["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["step"].as_f64().unwrap(), p["value"].as_f64().unwrap()))
        .collect();
    assert_eq!(points, [(0.0, 0.25), (1.0, 0.75), (1.0, 1.0)]);
    let loss = series("training/loss");
    assert_eq!((loss["source"].as_str(), loss["total"].as_u64()), (Some("training"), Some(1)));
    assert_eq!((loss["points"][0]["step"].as_f64(), loss["points"][0]["value"].as_f64()), (Some(2.0), Some(1.5)));

    // Downsampled to 2 points: [0, 1) and [1, 3): the second bucket holds both logs of step 1
    // (mean 0.875, extremes kept).
    let h = app.ok("GET", &format!("/v1/preview/models/{id}/history?max_points=2"), KEY_A, None).await;
    assert_eq!(h["truncated"], false);
    let reward = h["series"].as_array().unwrap().iter().find(|s| s["key"] == "val/reward").cloned().unwrap();
    assert_eq!(reward["total"], 3);
    assert_eq!(reward["points"][0]["count"], 1);
    let second = &reward["points"][1];
    assert_eq!(
        (second["step"].as_f64(), second["value"].as_f64(), second["min"].as_f64(), second["max"].as_f64()),
        (Some(1.0), Some(0.875), Some(0.75), Some(1.0))
    );
    assert_eq!(second["count"], 2);

    for bad in ["1", "0", "5001", "x", "-3"] {
        let r = app.call("GET", &format!("/v1/preview/models/{id}/history?max_points={bad}"), KEY_A, None).await;
        assert_eq!(r.status, 422, "{bad}");
        assert_eq!(r.json()["detail"][0]["loc"], json!(["query", "max_points"]));
    }
    assert_eq!(app.call("GET", &format!("/v1/preview/models/{id}/history"), KEY_B, None).await.status, 404);

    // The model's jobs, paged: the one from add_checkpoint (succeeded) and the running one.
    let jobs = app.ok("GET", &format!("/v1/preview/models/{id}/training-jobs?order=desc&limit=1"), KEY_A, None).await;
    assert_eq!((jobs["data"][0]["id"].as_str(), jobs["has_more"].as_bool()), (Some(&*job.id.to_string()), Some(true)));
    assert_eq!(jobs["data"][0]["status"], "running");
    let next = format!("/v1/preview/models/{id}/training-jobs?order=desc&after={}", job.id);
    let rest = app.ok("GET", &next, KEY_A, None).await;
    assert_eq!((rest["data"][0]["status"].as_str(), rest["has_more"].as_bool()), (Some("succeeded"), Some(false)));
    assert_eq!(app.call("GET", &format!("/v1/preview/models/{id}/training-jobs"), KEY_B, None).await.status, 404);
    assert_eq!(
        app.call("GET", &format!("/v1/preview/models/{}/history", Uuid::now_v7()), KEY_A, None).await.status,
        404
    );
}
