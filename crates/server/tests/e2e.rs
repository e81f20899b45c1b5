//! End-to-end tests of the real `tandem` binary over loopback HTTP: first start and keys,
//! graceful shutdown, and durability of acknowledged trajectory logs across `kill -9`.

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_start_creates_a_key_and_keys_cli_works_alongside() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let key = server.banner.last().expect("the first key is printed").trim().to_string();
    let key_file = dir.path().join("api-key");
    assert_eq!(std::fs::read_to_string(&key_file).unwrap().trim(), key);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);

    let c = client();
    let health = c.get(format!("{}/health", server.url)).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let models = format!("{}/v1/preview/models", server.url);
    assert_eq!(c.get(&models).bearer_auth(&key).send().await.unwrap().status(), 200);

    // `tandem keys create` against the data dir of the running server.
    let out =
        Command::new(BIN).args(["keys", "create", "--entity", "team2", "--data-dir"]).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let key2 = String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim().to_string();
    let (status, m) = post(
        &c,
        &models,
        &key2,
        &json!({"project": "p", "name": "n", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}),
    )
    .await
    .unwrap();
    assert_eq!((status, m["entity"].as_str()), (200, Some("team2")));

    let list = Command::new(BIN).args(["keys", "list", "--data-dir"]).arg(dir.path()).output().unwrap();
    let listing = String::from_utf8(list.stdout).unwrap();
    assert!(listing.contains("team2") && listing.contains("local"));
    assert!(!listing.contains(&key2), "keys are never shown again");
    let prefix = &key2[..12];
    let rev = Command::new(BIN).args(["keys", "revoke", prefix, "--data-dir"]).arg(dir.path()).output().unwrap();
    assert!(rev.status.success(), "{}", String::from_utf8_lossy(&rev.stderr));
    assert_eq!(c.get(&models).bearer_auth(&key2).send().await.unwrap().status(), 401);
    server.kill9();

    // A second start finds the key and does not print a new one.
    let again = Server::start(dir.path(), &[]);
    assert!(again.banner.is_empty(), "{:?}", again.banner);
    again.kill9();
}

/// The cluster's commands on a single SQLite store: the one process is in the node registry
/// (`tandem nodes`, `GET /v1/nodes`), a drain reaches it, and the roles that need a shared
/// database refuse to start on SQLite, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_registry_and_roles_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--api-key", "k-nodes", "--node-name", "solo"]);
    let nodes = |args: &[&str]| Command::new(BIN).arg("nodes").args(args).arg("--data-dir").arg(dir.path()).output();
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(15);
    let listed = loop {
        let r = c.get(format!("{}/v1/nodes", server.url)).bearer_auth("k-nodes").send().await.unwrap();
        let body: Value = r.json().await.unwrap();
        if !body["data"].as_array().unwrap().is_empty() || Instant::now() > deadline {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let node = &listed["data"][0];
    assert_eq!(
        (node["name"].as_str(), node["role"].as_str(), node["alive"].as_bool()),
        (Some("solo"), Some("all"), Some(true))
    );
    let list = nodes(&["list"]).unwrap();
    assert!(String::from_utf8_lossy(&list.stdout).contains("solo\tall\tready"), "{list:?}");

    let drain = nodes(&["drain", "solo"]).unwrap();
    assert!(drain.status.success(), "{drain:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.get(format!("{}/health", server.url)).send().await.unwrap().status() != 503 {
        assert!(Instant::now() < deadline, "the drain never reached the node");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(nodes(&["undrain", "solo"]).unwrap().status.success());
    let unknown = nodes(&["drain", "nobody"]).unwrap();
    assert!(!unknown.status.success() && String::from_utf8_lossy(&unknown.stderr).contains("no node named"));
    server.kill9();

    for role in ["api", "trainer"] {
        let out = Command::new(BIN)
            .args(["serve", "--port", "0", "--role", role, "--data-dir"])
            .arg(dir.path())
            .arg("--model")
            .arg(model_path())
            .env("TANDEM_LOG", "warn")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("needs a database the nodes share"), "{role}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--api-key", KEY]);
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_logs_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--api-key", KEY]);
    let c = client();
    let (status, model) = post(
        &c,
        &format!("{}/v1/preview/models", server.url),
        KEY,
        &json!({"project": "p", "name": "crash", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    let model_id = model["id"].as_str().unwrap().to_string();

    let acked: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let mut url = server.url.clone();
    let mut server = Some(server);
    for round in 0..3 {
        let log_url = format!("{url}/v1/preview/models/{model_id}/log");
        let mut clients = Vec::new();
        for client_no in 0..4 {
            let (c, log_url, acked) = (c.clone(), log_url.clone(), acked.clone());
            clients.push(tokio::spawn(async move {
                for seq in 0.. {
                    let groups = json!([{"trajectories": [
                        {"messages_and_choices": [{"role": "user", "content": format!("r{round} c{client_no} s{seq}")}],
                         "reward": seq as f64 / 7.0, "metrics": {"client": client_no}},
                        {"messages_and_choices": [], "reward": 0.25}]}]);
                    match post(&c, &log_url, KEY, &json!({"split": "train", "trajectory_groups": groups})).await {
                        Ok((200, out)) => acked.lock().unwrap().push((out["id"].as_str().unwrap().to_string(), groups)),
                        Ok((status, out)) => panic!("unexpected {status}: {out}"),
                        Err(_) => break, // the server is gone
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        server.take().unwrap().kill9();
        for t in clients {
            t.await.unwrap();
        }
        let restarted = Server::start(dir.path(), &["--api-key", KEY]);
        url = restarted.url.clone();
        server = Some(restarted);
    }

    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 10, "too few logs acknowledged to mean anything: {}", acked.len());
    for (id, groups) in &acked {
        let r = c.get(format!("{url}/v1/preview/models/{model_id}/logs/{id}")).bearer_auth(KEY).send().await.unwrap();
        assert_eq!(r.status(), 200, "acknowledged log {id} is missing after kill -9");
        let body: Value = r.json().await.unwrap();
        assert_eq!(&body["trajectory_groups"], groups, "log {id} changed");
    }
    server.take().unwrap().kill9();
    let store = tandem_store_check(dir.path()).await;
    assert_eq!(store, "ok");
}

async fn tandem_store_check(data_dir: &Path) -> String {
    // Open the database the way the server does and ask SQLite to check every page.
    let store = tandem_store::SqliteStore::open(&data_dir.join("tandem.db")).await.unwrap();
    store.integrity_check().await.unwrap()
}
