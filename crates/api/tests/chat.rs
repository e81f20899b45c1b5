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

/// vLLM's runtime LoRA routes: off without `--lora-root`; with it, an adapter directory under
/// the root is served under its name to the entity that loaded it, and to no one else.
#[tokio::test]
async fn runtime_lora_adapters_are_the_loading_entitys_own() {
    let fake = Fake::new();
    let off = app_with(&fake).await;
    let load = |name: &str, path: &str| json!({"lora_name": name, "lora_path": path});
    let r = off.call("POST", "/v1/load_lora_adapter", KEY_A, Some(load("x", "good"))).await;
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("--lora-root"));
    assert_eq!(off.call("POST", "/v1/unload_lora_adapter", KEY_A, Some(json!({"lora_name": "x"}))).await.status, 404);

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("root")).unwrap();
    let root = dir.path().join("root").canonicalize().unwrap();
    let adapter = |at: &std::path::Path, config: &str| {
        std::fs::create_dir_all(at).unwrap();
        std::fs::write(at.join("adapter_config.json"), config).unwrap();
        std::fs::write(at.join("adapter_model.safetensors"), b"weights").unwrap();
    };
    adapter(&root.join("good"), r#"{"r": 8}"#);
    adapter(&root.join("rankless"), r#"{"alpha": 8}"#);
    std::fs::create_dir_all(root.join("empty")).unwrap();
    adapter(&dir.path().join("outside"), r#"{"r": 8}"#);
    std::os::unix::fs::symlink(dir.path().join("outside"), root.join("link")).unwrap();
    // A directory inside the root whose weights file links outside it.
    std::fs::create_dir_all(root.join("filelink")).unwrap();
    std::fs::write(root.join("filelink/adapter_config.json"), r#"{"r": 8}"#).unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("outside/adapter_model.safetensors"),
        root.join("filelink/adapter_model.safetensors"),
    )
    .unwrap();
    let app = test_app_configured(
        tandem_api::Limits::default(),
        Some(Arc::new(FakeBackend(fake.clone()))),
        Some(root.clone()),
    )
    .await;

    let r = app.call("POST", "/v1/load_lora_adapter", KEY_A, Some(load("mine", "good"))).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.bytes));
    assert_eq!(String::from_utf8(r.bytes).unwrap(), "Success: LoRA adapter 'mine' added successfully.");
    let again = app.call("POST", "/v1/load_lora_adapter", KEY_A, Some(load("mine", "good"))).await;
    assert_eq!(again.status, 400);
    assert_eq!(again.json()["error"]["message"], "The lora adapter 'mine' has already been loaded.");
    let mut inplace = load("mine", &root.join("good").display().to_string());
    inplace["load_inplace"] = json!(true);
    assert_eq!(app.call("POST", "/v1/load_lora_adapter", KEY_A, Some(inplace)).await.status, 200);

    let ask = json!({"model": "mine", "messages": [{"role": "user", "content": "ab"}]});
    let r = app.ok("POST", "/v1/chat/completions", KEY_A, Some(ask.clone())).await;
    assert_eq!(r["model"], "mine");
    let content = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.starts_with("[runtime-lora-") && content.ends_with("ba"), "{content}");
    let models = app.ok("GET", "/v1/models", KEY_A, None).await;
    let card = models["data"].as_array().unwrap().iter().find(|c| c["id"] == "mine").unwrap().clone();
    assert_eq!((card["parent"].as_str(), card["owned_by"].as_str()), (Some(BASE), Some("a")));
    // `root` is lora_path exactly as the caller sent it (here, last, the absolute form).
    assert_eq!(card["root"], json!(root.join("good").display().to_string()));

    // Entity b sees nothing of it, and cannot unload it.
    assert_eq!(app.call("POST", "/v1/chat/completions", KEY_B, Some(ask.clone())).await.status, 404);
    let theirs = app.ok("GET", "/v1/models", KEY_B, None).await;
    assert!(theirs["data"].as_array().unwrap().iter().all(|c| c["id"] != "mine"));
    let r = app.call("POST", "/v1/unload_lora_adapter", KEY_B, Some(json!({"lora_name": "mine"}))).await;
    assert_eq!(
        (r.status.as_u16(), r.json()["error"]["message"].clone()),
        (404, json!("The lora adapter 'mine' cannot be found."))
    );
    // Entity b may load the same directory under the same name: its own.
    assert_eq!(app.call("POST", "/v1/load_lora_adapter", KEY_B, Some(load("mine", "good"))).await.status, 200);

    // At most 64 per entity, however the loads race: b holds 1, loads 59 more, then 8 at once.
    for i in 0..59 {
        assert_eq!(
            app.call("POST", "/v1/load_lora_adapter", KEY_B, Some(load(&format!("b{i}"), "good"))).await.status,
            200
        );
    }
    let racing = |i: usize| app.call("POST", "/v1/load_lora_adapter", KEY_B, Some(load(&format!("race{i}"), "good")));
    let (r0, r1, r2, r3, r4, r5, r6, r7) =
        tokio::join!(racing(0), racing(1), racing(2), racing(3), racing(4), racing(5), racing(6), racing(7));
    let ok = [r0, r1, r2, r3, r4, r5, r6, r7].iter().filter(|r| r.status == 200).count();
    assert_eq!(ok, 4, "64 minus the 60 loaded");
    let theirs = app.ok("GET", "/v1/models", KEY_B, None).await;
    let loaded = theirs["data"].as_array().unwrap().iter().filter(|c| c["owned_by"] == "b").count();
    assert_eq!(loaded, 64);

    let r = app.call("POST", "/v1/unload_lora_adapter", KEY_A, Some(json!({"lora_name": "mine"}))).await;
    assert_eq!(String::from_utf8(r.bytes).unwrap(), "Success: LoRA adapter 'mine' removed successfully.");
    assert_eq!(app.call("POST", "/v1/chat/completions", KEY_A, Some(ask)).await.status, 404);

    // Hostile input: each refused with the field named, nothing outside the root read.
    let outside_root = dir.path().join("outside").display().to_string();
    for (body, status, param) in [
        (load("x", "../outside"), 400, "lora_path"),
        (load("x", &outside_root), 400, "lora_path"),
        (load("x", "/etc"), 400, "lora_path"),
        (load("x", "link"), 400, "lora_path"),
        (load("x", "filelink"), 404, ""),
        (load("x", ""), 400, "lora_path"),
        (load("x", "nope"), 404, ""),
        (load("x", "empty"), 404, ""),
        (load("x", "rankless"), 400, "lora_path"),
        (load(BASE, "good"), 400, "lora_name"),
        (load("a b", "good"), 400, "lora_name"),
        (load("wandb-artifact:///a/p/n", "good"), 400, "lora_name"),
        (load("a/proj/m", "good"), 400, "lora_name"),
        (json!({"lora_name": "x"}), 400, ""),
        (json!({"lora_name": "x", "lora_path": "good", "surprise": 1}), 400, ""),
        (json!({"lora_name": "x", "lora_path": "good", "base_model_name": "other"}), 400, "base_model_name"),
    ] {
        let r = app.call("POST", "/v1/load_lora_adapter", KEY_A, Some(body.clone())).await;
        let v = r.json();
        assert_eq!(r.status.as_u16(), status, "{body}: {v}");
        assert_eq!(v["error"]["param"].as_str().unwrap_or(""), param, "{body}: {v}");
        assert!(!v.to_string().contains(&*dir.path().to_string_lossy()), "a server path leaked: {v}");
    }
    assert!(app.ok("GET", "/v1/models", KEY_A, None).await["data"].as_array().unwrap().iter().all(|c| c["id"] != "x"));
}
