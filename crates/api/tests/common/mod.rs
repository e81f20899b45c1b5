//! Helpers for driving the router without a socket.

#![allow(dead_code)]

pub mod fake;
pub mod tinker_fake;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::Arc;
use tandem_api::auth::StaticKeys;
use tandem_api::{AppConfig, AppState, Limits};
use tandem_core::health::Heartbeat;
use tandem_core::tinker::TinkerTrainer;
use tandem_store::{CheckpointDir, SqliteStore, Store};
use tower::ServiceExt;

pub const KEY_A: &str = "key-of-entity-a";
pub const KEY_B: &str = "key-of-entity-b";
pub const BASE: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

pub struct TestApp {
    pub router: Router,
    pub store: Arc<SqliteStore>,
    pub checkpoints: CheckpointDir,
    pub waker: Arc<tokio::sync::Notify>,
    pub heartbeat: Arc<Heartbeat>,
    _dir: tempfile::TempDir,
}

pub async fn test_app_with(limits: Limits) -> TestApp {
    test_app_serving(limits, None).await
}

/// A test app whose inference routes run on `backend` (a fake served model in the api's tests).
pub async fn test_app_serving(limits: Limits, backend: Option<tandem_core::inference::SharedBackend>) -> TestApp {
    test_app_configured(limits, backend, None).await
}

/// The same, with runtime LoRA loading from `lora_root` (canonical) when given.
pub async fn test_app_configured(
    limits: Limits,
    backend: Option<tandem_core::inference::SharedBackend>,
    lora_root: Option<std::path::PathBuf>,
) -> TestApp {
    test_app_training(limits, backend, lora_root, None).await
}

/// A test app whose Tinker routes train on `tinker` (the fake port in `tinker_fake.rs`).
pub async fn test_app_training(
    limits: Limits,
    backend: Option<tandem_core::inference::SharedBackend>,
    lora_root: Option<std::path::PathBuf>,
    tinker: Option<Arc<dyn TinkerTrainer>>,
) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("t.db")).await.unwrap());
    let checkpoints = CheckpointDir::open(dir.path().join("checkpoints")).unwrap();
    let waker = Arc::new(tokio::sync::Notify::new());
    let heartbeat = Arc::new(Heartbeat::default());
    let node = Node { limits, backend, lora_root, tinker, node_id: None };
    let state = node.state(store.clone(), &checkpoints, &waker, &heartbeat);
    TestApp { router: tandem_api::app(state), store, checkpoints, waker, heartbeat, _dir: dir }
}

/// What one server of a test is given beside its store and files.
pub struct Node {
    pub limits: Limits,
    pub backend: Option<tandem_core::inference::SharedBackend>,
    pub lora_root: Option<std::path::PathBuf>,
    pub tinker: Option<Arc<dyn TinkerTrainer>>,
    /// Its id in the node registry, as one node of a cluster (Tinker sessions are then held by
    /// one node each).
    pub node_id: Option<String>,
}

impl Node {
    fn state(
        self,
        store: Arc<SqliteStore>,
        checkpoints: &CheckpointDir,
        waker: &Arc<tokio::sync::Notify>,
        heartbeat: &Arc<Heartbeat>,
    ) -> AppState {
        let mut keys = StaticKeys::default();
        keys.add(KEY_A, "a");
        keys.add(KEY_B, "b");
        AppState::new(AppConfig {
            store: store as Arc<dyn Store>,
            checkpoints: tandem_store::Checkpoints::local(checkpoints.clone()),
            draining: Default::default(),
            static_keys: keys,
            served_models: vec![BASE.to_string()],
            limits: self.limits,
            jobs_waker: waker.clone(),
            backend: self.backend,
            per_entity_limit: 64,
            priority_scheduling: true,
            reasoning_parser: None,
            training_heartbeat: Some(heartbeat.clone()),
            training_metrics: Some(Arc::default()),
            lora_root: self.lora_root,
            tinker: self.tinker,
            tokenizer_dirs: Default::default(),
            node_id: self.node_id,
        })
    }
}

impl TestApp {
    /// A second server on this one's store and checkpoint files, as another node of a cluster
    /// (with the same keys).
    pub fn node(&self, node: Node) -> TestApp {
        let state = node.state(self.store.clone(), &self.checkpoints, &self.waker, &self.heartbeat);
        TestApp {
            router: tandem_api::app(state),
            store: self.store.clone(),
            checkpoints: self.checkpoints.clone(),
            waker: self.waker.clone(),
            heartbeat: self.heartbeat.clone(),
            _dir: tempfile::tempdir().unwrap(),
        }
    }
}

pub async fn test_app() -> TestApp {
    test_app_with(Limits::default()).await
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub bytes: Vec<u8>,
}

impl Reply {
    /// The JSON of each `data:` line of an SSE body, `[DONE]` left out.
    pub fn sse_data(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.bytes)
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes)
            .unwrap_or_else(|_| panic!("not json: {}", String::from_utf8_lossy(&self.bytes)))
    }
}

impl TestApp {
    pub async fn raw(&self, method: &str, path: &str, key: Option<&str>, body: Option<Vec<u8>>) -> Reply {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(body.map(Body::from).unwrap_or_else(Body::empty)).unwrap();
        self.send(req).await
    }

    /// Any request, as built by the caller (other content types, headers).
    pub async fn send(&self, req: Request<Body>) -> Reply {
        let res = self.router.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = res.into_body().collect().await.unwrap().to_bytes().to_vec();
        Reply { status, headers, bytes }
    }

    pub async fn call(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> Reply {
        self.raw(method, path, Some(key), body.map(|b| serde_json::to_vec(&b).unwrap())).await
    }

    pub async fn ok(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> Value {
        let r = self.call(method, path, key, body).await;
        assert_eq!(r.status, 200, "{method} {path}: {}", String::from_utf8_lossy(&r.bytes));
        r.json()
    }

    pub async fn create_model(&self, key: &str, name: &str) -> Value {
        let body = serde_json::json!({"project": "proj", "name": name, "base_model": BASE, "return_existing": true});
        self.ok("POST", "/v1/preview/models", key, Some(body)).await
    }
}

/// Runs a job to success by hand (no trainer runs here), with adapter files on disk; returns the
/// checkpoint's relative path.
pub async fn add_checkpoint(app: &TestApp, model_id: uuid::Uuid, step: i64) -> String {
    use tandem_store::{JobOutcome, NewCheckpoint, NewJob};
    let job = app
        .store
        .create_job(&NewJob {
            model_id,
            kind: tandem_core::records::JobKind::Rl,
            config: serde_json::json!({}),
            inputs: serde_json::json!([]),
            rollout: None,
        })
        .await
        .unwrap();
    app.store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
    let id = uuid::Uuid::now_v7();
    let path = CheckpointDir::relative_path(model_id, id);
    app.checkpoints.write_atomic(&path, &[("adapter_config.json", b"{}")]).unwrap();
    let metrics = std::collections::BTreeMap::from([("loss".into(), 1.5)]);
    let checkpoint = NewCheckpoint { id, model_id, step, path: path.clone(), metrics, size_bytes: 0 };
    app.store
        .finish_job(
            job.id,
            tandem_store::TEST_OWNER,
            &JobOutcome::Succeeded { checkpoint, event_data: serde_json::json!({"step": step}) },
        )
        .await
        .unwrap();
    path
}

/// A small valid group: rewards as given, one user message each.
pub fn group(rewards: &[f64]) -> Value {
    let trajectories: Vec<Value> = rewards
        .iter()
        .map(|r| serde_json::json!({"messages_and_choices": [{"role": "user", "content": "2+2?"}], "reward": r}))
        .collect();
    serde_json::json!({ "trajectories": trajectories })
}
