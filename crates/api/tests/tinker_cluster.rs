//! Tinker across the nodes of a cluster, on the fake compute port: an api node that does not
//! train places a session on a trainer node and forwards every call of it there; when that node
//! stops, the next call moves the session to another trainer, which rebuilds the model from its
//! last saved state, and a call the stopped node held answers that it was lost.

mod common;

use common::tinker_fake::{answer, post, FakeTrainer};
use common::{test_app_training, Node, TestApp, BASE, KEY_A, KEY_B};
use serde_json::json;
use std::sync::Arc;
use tandem_api::Limits;
use tandem_store::{NodeBeat, Store, TinkerCatalog};

/// A node on the base app's store: `trains` with its own fake, registered as `id`.
fn node(base: &TestApp, id: &str, trainer: Option<Arc<FakeTrainer>>) -> TestApp {
    let tinker = trainer.map(|t| t as Arc<dyn tandem_core::tinker::TinkerTrainer>);
    base.node(Node { limits: Limits::default(), backend: None, lora_root: None, tinker, node_id: Some(id.into()) })
}

/// Serves `app` on a local port (other nodes forward to it there); the server task.
async fn listen(app: &TestApp) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let router = app.router.clone();
    (address, tokio::spawn(async move { axum::serve(listener, router).await.unwrap() }))
}

async fn beat(store: &dyn Store, id: &str, role: &str, address: &str) {
    let beat = NodeBeat {
        id: id.into(),
        name: id.into(),
        role: role.into(),
        version: "test".into(),
        busy: false,
        address: address.into(),
    };
    store.node_heartbeat(&beat).await.unwrap();
}

#[tokio::test]
async fn a_session_runs_on_its_trainer_and_moves_when_that_node_stops() {
    let (fake1, fake2) = (Arc::new(FakeTrainer::default()), Arc::new(FakeTrainer::default()));
    let base = test_app_training(Limits::default(), None, None, None).await;
    let (trainer1, trainer2) =
        (node(&base, "trainer-1", Some(fake1.clone())), node(&base, "trainer-2", Some(fake2.clone())));
    let api = node(&base, "api-1", None);
    let (address1, server1) = listen(&trainer1).await;
    let (address2, _server2) = listen(&trainer2).await;
    let store = base.store.clone();
    beat(store.as_ref(), "api-1", "api", "").await;
    beat(store.as_ref(), "trainer-1", "trainer", &address1).await;
    beat(store.as_ref(), "trainer-2", "trainer", &address2).await;

    // Placed on the first of the two idle trainers; every call goes through the api node.
    let session =
        post(&api, KEY_A, "create_session", json!({})).await.json()["session_id"].as_str().unwrap().to_string();
    assert_eq!(store.tinker_session(&session).await.unwrap().unwrap().node, "trainer-1");
    let body = json!({ "session_id": session, "model_seq_id": 0, "base_model": BASE, "lora_config": { "rank": 8 } });
    let model = answer(&api, KEY_A, &post(&api, KEY_A, "create_model", body).await).await["model_id"]
        .as_str()
        .expect("created")
        .to_string();
    let step = |seq: i64, lr: f64| json!({ "model_id": model, "seq_id": seq, "adam_params": { "learning_rate": lr } });
    let done = answer(&api, KEY_A, &post(&api, KEY_A, "optim_step", step(1, 0.25)).await).await;
    assert!(done.get("error").is_none(), "{done}");
    let saved = answer(
        &api,
        KEY_A,
        &post(&api, KEY_A, "save_weights", json!({ "model_id": model, "seq_id": 2, "path": "s1" })).await,
    )
    .await;
    assert_eq!(saved["path"], format!("tinker://{model}/weights/s1"));
    // After the save: lost when its node stops. Its future is never fetched before.
    let unsaved = post(&api, KEY_A, "optim_step", step(3, 0.5)).await;
    let unfetched = unsaved.json()["request_id"].as_str().unwrap().to_string();
    while fake1.weight(&model) != Some(0.75) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(fake2.weight(&model), None, "only its host holds it");
    // Another entity's session is a 404 wherever it is held.
    assert_eq!(post(&api, KEY_B, "optim_step", step(4, 1.0)).await.status, 404);
    assert_eq!(post(&api, KEY_B, "retrieve_future", json!({ "request_id": unfetched })).await.status, 404);

    // trainer-1 stops (gone from the registry): the next call moves the session to trainer-2,
    // which rebuilds the model from s1 and runs the call where the client's order is.
    server1.abort();
    store.remove_node("trainer-1").await.unwrap();
    let done = answer(&api, KEY_A, &post(&api, KEY_A, "optim_step", step(4, 1.0)).await).await;
    assert!(done.get("error").is_none(), "{done}");
    assert_eq!(store.tinker_session(&session).await.unwrap().unwrap().node, "trainer-2");
    assert_eq!(fake2.weight(&model), Some(1.25), "s1's 0.25, then this step: the unsaved step is lost");
    let lost = post(&api, KEY_A, "retrieve_future", json!({ "request_id": unfetched })).await.json();
    assert_eq!(lost["category"], "server", "{lost}");
    assert!(lost["error"].as_str().unwrap().contains("lost"), "{lost}");
    assert_eq!(post(&api, KEY_B, "optim_step", step(5, 1.0)).await.status, 404, "still only A's");

    // Finished through the api node: its row goes with it.
    let finished = api.call("POST", &format!("/api/v1/sessions/{session}/finish"), KEY_A, None).await;
    assert_eq!(finished.status, 200);
    for _ in 0..100 {
        if store.tinker_session(&session).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(store.tinker_session(&session).await.unwrap(), None);
    assert_eq!(post(&api, KEY_A, "optim_step", step(5, 1.0)).await.status, 404);
}
