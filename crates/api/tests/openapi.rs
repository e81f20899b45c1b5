//! `/openapi.json`: every route the router serves is in it (the Tinker area's too) (the document is built from the same
//! `routes!` registrations), it needs no key, and it knows the served base models.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeSet;

#[tokio::test]
async fn the_document_lists_every_route_and_needs_no_key() {
    let app = test_app().await;
    let r = app.raw("GET", "/openapi.json", None, None).await;
    assert_eq!(r.status, 200);
    let doc = r.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut operations = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations.insert(format!("{} {path}", method.to_uppercase()));
            assert!(ids.insert(op["operationId"].as_str().unwrap().to_string()), "duplicate id at {method} {path}");
            let secured = op.get("security").is_some();
            // Signed download URLs carry their own permission.
            let open = path.contains("health") || path == "/v1/system-check" || path.contains("external_weights_files");
            assert_eq!(secured, !open, "{method} {path}");
            assert!(op["responses"]["200"].is_object(), "{method} {path} documents its success");
        }
    }
    let expected: BTreeSet<String> = [
        "GET /health",
        "GET /v1/health",
        "GET /v1/system-check",
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "POST /v1/messages",
        "POST /v1/messages/count_tokens",
        "POST /v1/responses",
        "GET /v1/responses/{response_id}",
        "DELETE /v1/responses/{response_id}",
        "GET /v1/models",
        "POST /tokenize",
        "POST /detokenize",
        "GET /v1/tokenizer",
        "GET /metrics",
        "GET /v1/nodes",
        "POST /v1/load_lora_adapter",
        "POST /v1/unload_lora_adapter",
        "POST /v1/preview/models",
        "GET /v1/preview/models",
        "GET /v1/preview/models/{model_id}",
        "DELETE /v1/preview/models/{model_id}",
        "GET /v1/preview/models/{model_id}/checkpoints",
        "GET /v1/preview/models/{model_id}/checkpoints/{step}/adapter",
        "GET /v1/preview/models/{model_id}/checkpoints/{step}/merged",
        "POST /v1/preview/models/{model_id}/checkpoints",
        "DELETE /v1/preview/models/{model_id}/checkpoints",
        "GET /v1/preview/models/{model_id}/history",
        "GET /v1/preview/models/{model_id}/training-jobs",
        "POST /v1/preview/models/{model_id}/log",
        "GET /v1/preview/models/{model_id}/logs",
        "GET /v1/preview/models/{model_id}/logs/{log_id}",
        "GET /v1/preview/models/{model_id}/logs/{log_id}/trajectories",
        "POST /v1/preview/datasets",
        "GET /v1/preview/datasets",
        "GET /v1/preview/datasets/{dataset_id}",
        "DELETE /v1/preview/datasets/{dataset_id}",
        "POST /v1/preview/sft-training-jobs",
        "POST /v1/preview/training-jobs",
        "GET /v1/preview/training-jobs/{job_id}",
        "POST /v1/preview/training-jobs/{job_id}/cancel",
        "GET /v1/preview/training-jobs/{job_id}/events",
        "GET /v1/preview/training-jobs/{job_id}/trajectories",
        "POST /api/v1/client/config",
        "POST /api/v1/client/dynamic_config",
        "POST /api/v1/telemetry",
        "GET /api/v1/get_server_capabilities",
        "POST /api/v1/create_session",
        "POST /api/v1/session_heartbeat",
        "POST /api/v1/sessions/{id}/finish",
        "POST /api/v1/create_model",
        "POST /api/v1/get_info",
        "POST /api/v1/forward_backward",
        "POST /api/v1/optim_step",
        "POST /api/v1/save_weights_for_sampler",
        "POST /api/v1/save_weights",
        "POST /api/v1/load_weights",
        "POST /api/v1/create_sampling_session",
        "GET /api/v1/samplers/{id}",
        "POST /api/v1/asample",
        "GET /api/v1/training_runs",
        "GET /api/v1/training_runs/{run}",
        "GET /api/v1/training_runs/{run}/checkpoints",
        "GET /api/v1/checkpoints",
        "DELETE /api/v1/training_runs/{run}/checkpoints/{kind}/{name}",
        "POST /api/v1/save_weights_external",
        "GET /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/external_weights_urls",
        "PUT /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/ttl",
        "POST /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/publish",
        "DELETE /api/v1/training_runs/{run}/checkpoints/{kind}/{name}/publish",
        "POST /api/v1/weights_info",
        "POST /api/v1/retrieve_future",
        "GET /api/v1/external_weights_files/{token}/{file}",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(operations, expected);
    // The served base models are the only ones a model record may name.
    let base = &doc["components"]["schemas"]["CreateModelBody"]["properties"]["base_model"]["enum"];
    assert_eq!(base, &serde_json::json!([BASE]));
    // A typed view is described by its own Serialize type: a model's fields are all there.
    let model_props: BTreeSet<&str> = doc["components"]["schemas"]["ModelView"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let created: Value = app.create_model(KEY_A, "described").await;
    let mut sent: BTreeSet<&str> = created.as_object().unwrap().keys().map(String::as_str).collect();
    // `summary` is sent only in a listing that asks for it.
    sent.insert("summary");
    assert_eq!(model_props, sent);
    // `/v1/models` cards: `created` is Unix seconds for trained models too, as OpenAI's.
    let list = app.ok("GET", "/v1/models", KEY_A, None).await;
    let cards = list["data"].as_array().unwrap();
    assert!(cards.iter().any(|c| c["id"].as_str().unwrap().ends_with("/described")), "{list}");
    assert!(cards.iter().all(|c| c["created"].is_i64()), "{list}");
}

/// The dashboard's pages: served without a key (they hold no data), under a CSP that lets only
/// this server's own files run, and offline (nothing they reference lives elsewhere).
#[tokio::test]
async fn the_dashboard_is_served_offline_under_a_strict_policy() {
    let app = common::test_app().await;
    let r = app.raw("GET", "/", None, None).await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"].to_str().unwrap().starts_with("text/html"));
    let csp = r.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'") && csp.contains("default-src 'none'"), "{csp}");
    let html = String::from_utf8(r.bytes).unwrap();
    assert!(html.contains(r#"src="/ui/app.js""#));
    // The stylesheet, the entry module and every module imported from there on is served.
    let mut files = vec![("app.css".to_string(), "text/css"), ("app.js".to_string(), "text/javascript")];
    let mut i = 0;
    while i < files.len() {
        let (file, kind) = files[i].clone();
        i += 1;
        let r = app.raw("GET", &format!("/ui/{file}"), None, None).await;
        assert_eq!(r.status, 200, "{file}");
        assert!(r.headers["content-type"].to_str().unwrap().starts_with(kind), "{file}");
        assert_eq!(r.headers["x-content-type-options"], "nosniff");
        let text = String::from_utf8(r.bytes).unwrap();
        // The SVG namespace is a name, not a load; nothing else may point off this server.
        let outside = text.replace("http://www.w3.org/2000/svg", "");
        assert!(!outside.contains("http://") && !outside.contains("https://"), "{file} points elsewhere");
        assert!(!text.contains("innerHTML"), "{file}: data goes in through the DOM, never as HTML");
        for import in text.split(" from \"./").skip(1) {
            let name = import.split('"').next().unwrap().to_string();
            if !files.iter().any(|(f, _)| *f == name) {
                files.push((name, "text/javascript"));
            }
        }
    }
    assert!(files.len() >= 9, "{files:?}");
    assert_eq!(app.raw("GET", "/ui/../Cargo.toml", None, None).await.status, 404);
    assert_eq!(app.raw("GET", "/ui/nope.js", None, None).await.status, 404);
}
