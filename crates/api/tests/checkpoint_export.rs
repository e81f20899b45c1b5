//! A checkpoint leaves tandem as a PEFT adapter: one tar archive of a directory with the files
//! PEFT and vLLM read, entity-scoped.

mod common;

use common::*;
use std::io::Read;
use uuid::Uuid;

#[tokio::test]
async fn a_checkpoint_downloads_as_a_peft_adapter_archive() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    let path = add_checkpoint(&app, Uuid::parse_str(id).unwrap(), 1).await;
    let weights = vec![7u8; 70_000];
    let dir = app.checkpoints.resolve(&path).unwrap();
    std::fs::write(dir.join("adapter_model.safetensors"), &weights).unwrap();

    let url = format!("/v1/preview/models/{id}/checkpoints/1/adapter");
    let r = app.raw("GET", &url, Some(KEY_A), None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/x-tar");
    assert_eq!(r.headers["content-disposition"], "attachment; filename=\"proj-agent-step1.tar\"");
    let mut archive = tar::Archive::new(r.bytes.as_slice());
    let mut files = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        files.push((name, bytes));
    }
    assert_eq!(
        files,
        [
            ("proj-agent-step1/adapter_config.json".to_string(), b"{}".to_vec()),
            ("proj-agent-step1/adapter_model.safetensors".to_string(), weights)
        ]
    );

    // Another entity's model, a step that is not live, a step that is not a number.
    assert_eq!(app.raw("GET", &url, Some(KEY_B), None).await.status, 404);
    let none = format!("/v1/preview/models/{id}/checkpoints/2/adapter");
    assert_eq!(app.raw("GET", &none, Some(KEY_A), None).await.status, 404);
    let bad = app.raw("GET", &format!("/v1/preview/models/{id}/checkpoints/x/adapter"), Some(KEY_A), None).await;
    assert_eq!(bad.status, 422);
    // A deleted checkpoint is gone from the route too.
    let del = serde_json::json!({"steps": [1]});
    app.ok("DELETE", &format!("/v1/preview/models/{id}/checkpoints"), KEY_A, Some(del)).await;
    assert_eq!(app.raw("GET", &url, Some(KEY_A), None).await.status, 404);
}

#[tokio::test]
async fn an_import_needs_a_tar_archive_and_the_base_model_served() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    let url = format!("/v1/preview/models/{id}/checkpoints");
    // A well-formed archive: this test app serves no model to check it on.
    let mut tar = tar::Builder::new(Vec::new());
    for (name, bytes) in [("adapter_config.json", &b"{}"[..]), ("adapter_model.safetensors", &[0u8; 8][..])] {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, name, bytes).unwrap();
    }
    let archive = tar.into_inner().unwrap();
    let send = |key: &'static str, content_type: &'static str, body: Vec<u8>| {
        let app = &app;
        let url = url.clone();
        async move {
            let req = axum::http::Request::builder()
                .method("POST")
                .uri(url)
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", content_type)
                .body(axum::body::Body::from(body))
                .unwrap();
            app.send(req).await
        }
    };
    assert_eq!(send(KEY_B, "application/x-tar", archive.clone()).await.status, 404);
    let r = send(KEY_A, "application/json", archive.clone()).await;
    assert_eq!(r.status, 422, "{:?}", r.json());
    assert_eq!(r.json()["detail"][0]["loc"], serde_json::json!(["header", "content-type"]));
    assert!(r.json()["detail"][0]["msg"].as_str().unwrap().contains("tar archive"), "{:?}", r.json());
    let r = send(KEY_A, "application/x-tar", archive).await;
    assert_eq!(r.status, 409, "{:?}", r.json());
    assert!(r.json()["detail"].as_str().unwrap().contains("not served here"), "{:?}", r.json());
    assert_eq!(app.ok("GET", &url, KEY_A, None).await["data"], serde_json::json!([]), "nothing recorded");
}

fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, bytes) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, name, *bytes).unwrap();
    }
    tar.into_inner().unwrap()
}

async fn upload(app: &TestApp, model_id: &str, body: Vec<u8>) -> Reply {
    let req = axum::http::Request::builder()
        .method("POST")
        .uri(format!("/v1/preview/models/{model_id}/checkpoints"))
        .header("authorization", format!("Bearer {KEY_A}"))
        .header("content-type", "application/x-tar")
        .body(axum::body::Body::from(body))
        .unwrap();
    app.send(req).await
}

#[tokio::test]
async fn an_uploaded_adapter_is_the_next_checkpoint_served_at_once_and_a_refused_one_leaves_nothing() {
    use common::fake::*;
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    add_checkpoint(&app, Uuid::parse_str(id).unwrap(), 1).await;
    let dirs = || std::fs::read_dir(app.checkpoints.root().join(id)).unwrap().count();

    let good = tar_of(&[("out/adapter_config.json", b"{\"r\": 8}"), ("out/adapter_model.safetensors", b"w")]);
    let r = upload(&app, id, good).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let cp = r.json();
    assert_eq!(cp["step"], 2);
    assert_eq!(dirs(), 2);
    // Served at once under its step (the fake answers with the adapter's checkpoint id first).
    let chat = serde_json::json!({"model": "wandb-artifact:///a/proj/agent:step2",
                                  "messages": [{"role": "user", "content": "ab"}]});
    let answer = app.ok("POST", "/v1/chat/completions", KEY_A, Some(chat)).await;
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(content.starts_with(&format!("[{}]", cp["id"].as_str().unwrap())), "{content}");
    // And it leaves again as it came in.
    let out = app.raw("GET", &format!("/v1/preview/models/{id}/checkpoints/2/adapter"), Some(KEY_A), None).await;
    let mut names = Vec::new();
    for e in tar::Archive::new(out.bytes.as_slice()).entries().unwrap() {
        names.push(e.unwrap().path().unwrap().to_string_lossy().into_owned());
    }
    assert_eq!(names, ["proj-agent-step2/adapter_config.json", "proj-agent-step2/adapter_model.safetensors"]);

    // Refused by the base model's check: a 422 at the body, and no files or step left behind.
    let bad = tar_of(&[("adapter_config.json", b"{}"), ("adapter_model.safetensors", b"w")]);
    let r = upload(&app, id, bad).await;
    assert_eq!(r.status, 422, "{:?}", r.json());
    assert_eq!(r.json()["detail"][0]["loc"], serde_json::json!(["body"]));
    assert!(r.json()["detail"][0]["msg"].as_str().unwrap().contains("does not fit"), "{:?}", r.json());
    let not_tar = upload(&app, id, b"plain words".to_vec()).await;
    assert_eq!(not_tar.status, 422);
    assert_eq!(dirs(), 2);

    // A queued job owns the next step: a 409, and again nothing left behind.
    let job = serde_json::json!({"model_id": id, "trajectory_groups": [group(&[1.0, 0.0])]});
    app.ok("POST", "/v1/preview/training-jobs", KEY_A, Some(job)).await;
    let good = tar_of(&[("adapter_config.json", b"{\"r\": 8}"), ("adapter_model.safetensors", b"w")]);
    let r = upload(&app, id, good).await;
    assert_eq!(r.status, 409, "{:?}", r.json());
    assert_eq!(dirs(), 2);
    let listed = app.ok("GET", &format!("/v1/preview/models/{id}/checkpoints"), KEY_A, None).await;
    let steps: Vec<i64> = listed["data"].as_array().unwrap().iter().map(|c| c["step"].as_i64().unwrap()).collect();
    assert_eq!(steps, [1, 2]);
}

/// `GET .../checkpoints/{step}/merged`: the served base's merge of the checkpoint, streamed as
/// one file, entity-scoped; nothing of it stays on disk.
#[tokio::test]
async fn a_checkpoint_downloads_merged_into_its_base() {
    let fake = common::fake::Fake::new();
    let app = test_app_serving(
        tandem_api::Limits::default(),
        Some(std::sync::Arc::new(common::fake::FakeBackend(fake.clone()))),
    )
    .await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    add_checkpoint(&app, Uuid::parse_str(id).unwrap(), 1).await;
    let url = format!("/v1/preview/models/{id}/checkpoints/1/merged");
    let r = app.raw("GET", &url, Some(KEY_A), None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/octet-stream");
    assert_eq!(r.headers["content-disposition"], "attachment; filename=\"proj-agent-step1.gguf\"");
    assert_eq!(r.headers["content-length"], (3 << 20).to_string().as_str());
    assert_eq!(r.bytes.len(), 3 << 20);
    assert!(r.bytes.starts_with(b"GGUF base {}"), "{:?}", String::from_utf8_lossy(&r.bytes[..20]));
    let r = app.raw("GET", &format!("{url}?format=q8_0"), Some(KEY_A), None).await;
    assert!(r.status == 200 && r.bytes.starts_with(b"GGUF q8_0"));
    // The temporary file went with the response.
    let leftovers: Vec<_> = std::fs::read_dir(app.checkpoints.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".merge-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // An unknown format, a format the base cannot give, another entity, a step not live.
    let bad = app.raw("GET", &format!("{url}?format=q4_k"), Some(KEY_A), None).await;
    assert_eq!(bad.status, 422);
    assert_eq!(bad.json()["detail"][0]["loc"], serde_json::json!(["query", "format"]));
    assert_eq!(app.raw("GET", &format!("{url}?format=f16"), Some(KEY_A), None).await.status, 409);
    assert_eq!(app.raw("GET", &url, Some(KEY_B), None).await.status, 404);
    let none = format!("/v1/preview/models/{id}/checkpoints/2/merged");
    assert_eq!(app.raw("GET", &none, Some(KEY_A), None).await.status, 404);
}

/// Without the base model served (this app serves none), there is nothing to merge into.
#[tokio::test]
async fn a_merged_export_needs_the_base_model_served() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    add_checkpoint(&app, Uuid::parse_str(id).unwrap(), 1).await;
    let r = app.raw("GET", &format!("/v1/preview/models/{id}/checkpoints/1/merged"), Some(KEY_A), None).await;
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.bytes));
}
