//! The chat route against a fake served model: the request path from body to engine and back
//! (one validation, one submit) without the real engine, so each rule is checked in milliseconds.
//!
//! The fake's tokens are bytes; its "template" writes `role: content\n` per message; it answers
//! with the last message reversed (with `[checkpoint-id]` first when an adapter is loaded).

mod common;

use common::fake::*;
use common::*;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn chat(content: &str) -> Value {
    json!({"model": BASE, "messages": [{"role": "user", "content": content}]})
}

#[tokio::test]
async fn a_chat_is_validated_once_and_submitted_once() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let r = app.ok("POST", "/v1/chat/completions", KEY_A, Some(chat("hello"))).await;
    assert_eq!(r["choices"][0]["message"]["content"], "olleh");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert_eq!(r["model"], BASE);
    // "user: hello\n" is 12 byte tokens.
    assert_eq!((r["usage"]["prompt_tokens"].as_u64(), r["usage"]["completion_tokens"].as_u64()), (Some(12), Some(5)));
    assert_eq!((fake.prepared.load(Ordering::SeqCst), fake.submitted.load(Ordering::SeqCst)), (1, 1));

    // Two choices, the output cut by max_completion_tokens.
    let body = json!({"messages": [{"role": "user", "content": "abcdef"}], "n": 2, "max_completion_tokens": 3,
        "temperature": 0.7});
    let r = app.ok("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    let contents: Vec<&Value> = r["choices"].as_array().unwrap().iter().map(|c| &c["message"]["content"]).collect();
    assert_eq!(contents, [&json!("fed"), &json!("fed")]);
    assert_eq!(r["choices"][1]["finish_reason"], "length");

    // Streamed: role chunk, a delta per token, the finish, [DONE].
    let mut body = chat("ab");
    body["stream"] = json!(true);
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.bytes).unwrap();
    let deltas: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(deltas, "ba");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
}

#[tokio::test]
async fn the_model_half_of_validation_names_the_field() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let error = |r: Reply| (r.status.as_u16(), r.json()["error"]["param"].as_str().map(str::to_string));
    // The prompt must leave room in the context.
    let long = "x".repeat(CONTEXT);
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(chat(&long))).await;
    assert_eq!(error(r), (400, Some("messages".into())));
    // Asking for more than the whole context is an error, not a clamp.
    let mut body = chat("hi");
    body["max_completion_tokens"] = json!(CONTEXT + 1);
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(error(r), (400, Some("max_completion_tokens".into())));
    // Token ids beyond the vocabulary.
    for (field, value) in [("logit_bias", json!({"300": 1.0})), ("stop_token_ids", json!([257]))] {
        let mut body = chat("hi");
        body[field] = value;
        let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
        assert_eq!(error(r), (400, Some(field.into())), "{field}");
    }
    // The template's failure, and the engine's refusal of a constraint, are 400s naming the field.
    let mut body = chat("hi");
    body["chat_template"] = json!("{{ nope }}");
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(error(r), (400, Some("messages".into())));
    let mut body = chat("hi");
    body["structured_outputs"] = json!({"regex": "a+"});
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(error(r), (400, Some("structured_outputs".into())));
    // Nothing refused above reached the queue.
    assert_eq!(fake.submitted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_full_engine_is_a_503_before_the_body_is_read() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    fake.capacity.store(false, Ordering::SeqCst);
    let r = app.raw("POST", "/v1/chat/completions", Some(KEY_A), Some(b"{not json".to_vec())).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers.get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    fake.capacity.store(true, Ordering::SeqCst);
    let r = app.raw("POST", "/v1/chat/completions", Some(KEY_A), Some(b"{not json".to_vec())).await;
    assert_eq!(r.status, 400);
}

/// A checkpoint's adapter is loaded by `prepare` on a blocking thread: while one load is stuck,
/// this single-threaded runtime goes on answering other requests; the answer then comes from the
/// adapter. Another entity's model, or a checkpoint without files, never reaches the queue.
#[tokio::test(flavor = "current_thread")]
async fn adapters_load_off_the_async_worker() {
    let fake = Fake::new();
    let app = Arc::new(app_with(&fake).await);
    let m = app.create_model(KEY_A, "agent").await;
    let model_id: uuid::Uuid = m["id"].as_str().unwrap().parse().unwrap();
    let path = add_checkpoint(&app, model_id, 3).await;
    let checkpoint = app.ok("GET", &format!("/v1/preview/models/{model_id}/checkpoints"), KEY_A, None).await;
    let checkpoint_id = checkpoint["data"][0]["id"].as_str().unwrap().to_string();

    let (release, gate) = std::sync::mpsc::channel();
    *fake.load_gate.lock().unwrap() = Some(gate);
    let name = "wandb-artifact:///a/proj/agent:step3";
    let pending = tokio::spawn({
        let app = app.clone();
        async move {
            let body = json!({"model": name, "messages": [{"role": "user", "content": "abc"}]});
            app.ok("POST", "/v1/chat/completions", KEY_A, Some(body)).await
        }
    });
    // Let the chat reach its load, then ask for something else.
    while fake.prepared.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let models = tokio::time::timeout(std::time::Duration::from_secs(10), app.ok("GET", "/v1/models", KEY_A, None))
        .await
        .expect("the runtime answered while an adapter loaded");
    assert!(models["data"].as_array().unwrap().iter().any(|m| m["id"] == name));
    assert!(!pending.is_finished());
    release.send(()).unwrap();
    let r = pending.await.unwrap();
    assert_eq!(r["choices"][0]["message"]["content"], format!("[{checkpoint_id}]cba"));
    assert_eq!(r["model"], name);
    *fake.load_gate.lock().unwrap() = None;

    let submitted = fake.submitted.load(Ordering::SeqCst);
    let body = json!({"model": name, "messages": [{"role": "user", "content": "abc"}]});
    let r = app.call("POST", "/v1/chat/completions", KEY_B, Some(body)).await;
    assert_eq!(r.status, 404, "another entity's model");
    std::fs::remove_file(app.checkpoints.resolve(&path).unwrap().join("adapter_config.json")).unwrap();
    let body = json!({"model": name, "messages": [{"role": "user", "content": "abc"}]});
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.bytes));
    assert_eq!(fake.submitted.load(Ordering::SeqCst), submitted, "refused requests are never queued");
}
