//! The routes the dashboard reads beyond ART's: job rollout metrics and their curve, zoomed
//! history, the trajectory browser's pages, and the models list's search and summaries.

mod common;

use common::*;
use serde_json::{json, Value};
use tandem_store::Store;
use uuid::Uuid;

fn tool_group(rewards: &[f64]) -> Value {
    let trajectories: Vec<Value> = rewards
        .iter()
        .enumerate()
        .map(|(i, r)| {
            json!({"reward": r, "metrics": {"turns": i},
                   "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
                   "messages_and_choices": [
                       {"role": "user", "content": "2+2?"},
                       {"role": "assistant", "content": null, "tool_calls": [
                           {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "[2,2]"}}]},
                       {"role": "tool", "tool_call_id": "c1", "content": "4"},
                       {"role": "assistant", "content": format!("answer {i}")}]})
        })
        .collect();
    json!({ "trajectories": trajectories, "metadata": {"task": "sum"} })
}

#[tokio::test]
async fn job_rollouts_give_a_reward_curve_and_a_trajectory_browser() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    let groups = json!([tool_group(&[1.0, 0.0]), tool_group(&[0.5, 0.25, 0.75])]);
    let body = json!({"model_id": id, "trajectory_groups": groups});
    let job = app.ok("POST", "/v1/preview/training-jobs", KEY_A, Some(body)).await;
    let job_id = job["id"].as_str().unwrap().to_string();
    // Five trajectories: (1 + 0 + 0.5 + 0.25 + 0.75) / 5 = 0.5.
    assert_eq!(job["rollout_metrics"]["train/reward"], 0.5);
    assert_eq!(job["rollout_metrics"]["train/turns"], 0.8);
    // A queued job is not on the curve yet; a running one is, at the step it will make.
    let h = app.ok("GET", &format!("/v1/preview/models/{id}/history"), KEY_A, None).await;
    assert!(h["series"].as_array().unwrap().iter().all(|s| s["source"] != "jobs"), "{h}");
    app.store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
    let h = app.ok("GET", &format!("/v1/preview/models/{id}/history"), KEY_A, None).await;
    let reward = h["series"].as_array().unwrap().iter().find(|s| s["key"] == "train/reward").cloned().unwrap();
    assert_eq!(reward["source"], "jobs");
    assert_eq!((reward["points"][0]["step"].as_f64(), reward["points"][0]["value"].as_f64()), (Some(1.0), Some(0.5)));

    // The browser: every group, as chats with the tool call and its result.
    let path = format!("/v1/preview/training-jobs/{job_id}/trajectories");
    let page = app.ok("GET", &path, KEY_A, None).await;
    assert_eq!((page["total_groups"].as_u64(), page["offset"].as_u64()), (Some(2), Some(0)));
    let t = &page["groups"][0]["trajectories"][0];
    assert_eq!((t["index"].as_u64(), t["reward"].as_f64()), (Some(0), Some(1.0)));
    let msgs = t["histories"][0]["messages"].as_array().unwrap();
    assert_eq!(
        msgs.iter().map(|m| m["role"].as_str().unwrap()).collect::<Vec<_>>(),
        ["user", "assistant", "tool", "assistant"]
    );
    assert_eq!(msgs[1]["tool_calls"], json!([{"name": "add", "arguments": "[2,2]"}]));
    assert_eq!((msgs[2]["tool_call_id"].as_str(), msgs[2]["content"].as_str()), (Some("c1"), Some("4")));
    assert_eq!(t["histories"][0]["tools"], json!(["add"]));
    assert_eq!(page["groups"][0]["metadata"], json!({"task": "sum"}));
    // No model is served in this test app: the tokens cannot be shown, and it says why.
    assert!(t["sequences_error"].as_str().unwrap().contains("not served"), "{t}");

    // From 0.3 up: group 0 keeps 1.0, group 1 keeps 0.5 and 0.75 (mean 0.625); sorted by mean
    // reward, trajectories by reward.
    let page = app.ok("GET", &format!("{path}?sort=reward_desc&min_reward=0.3"), KEY_A, None).await;
    let rewards: Vec<Vec<f64>> = page["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["trajectories"].as_array().unwrap().iter().map(|t| t["reward"].as_f64().unwrap()).collect())
        .collect();
    assert_eq!(rewards, [vec![1.0], vec![0.75, 0.5]]);
    // Below 0.9: group 0 keeps 0.0 (mean 0), group 1 all three (mean 0.5).
    let page = app.ok("GET", &format!("{path}?sort=reward_desc&max_reward=0.9&offset=1&limit=1"), KEY_A, None).await;
    assert_eq!((page["total_groups"].as_u64(), page["groups"][0]["index"].as_u64()), (Some(2), Some(0)));
    let page = app.ok("GET", &format!("{path}?sort=reward_asc&max_reward=0.9&offset=1&limit=1"), KEY_A, None).await;
    assert_eq!(page["groups"][0]["index"].as_u64(), Some(1));
    let page = app.ok("GET", &format!("{path}?min_reward=2"), KEY_A, None).await;
    assert_eq!((page["total_groups"].as_u64(), page["groups"].as_array().map(Vec::len)), (Some(0), Some(0)));
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=51", "limit"),
        ("offset=-1", "offset"),
        ("sort=random", "sort"),
        ("min_reward=NaN", "min_reward"),
        ("max_reward=inf", "max_reward"),
    ] {
        let r = app.call("GET", &format!("{path}?{query}"), KEY_A, None).await;
        assert_eq!(r.status, 422, "{query}");
        assert_eq!(r.json()["detail"][0]["loc"], json!(["query", field]), "{query}");
    }
    // Another entity's job, and a job that does not exist, are the same 404.
    assert_eq!(app.call("GET", &path, KEY_B, None).await.status, 404);
    let none = format!("/v1/preview/training-jobs/{}/trajectories", Uuid::now_v7());
    assert_eq!(app.call("GET", &none, KEY_A, None).await.status, 404);
}

#[tokio::test]
async fn a_logs_trajectories_and_jobs_without_rollouts() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "agent").await;
    let id = m["id"].as_str().unwrap();
    let out = app
        .ok(
            "POST",
            &format!("/v1/preview/models/{id}/log"),
            KEY_A,
            Some(json!({"split": "val", "trajectory_groups": [tool_group(&[0.5])]})),
        )
        .await;
    let log_id = out["id"].as_str().unwrap();
    let path = format!("/v1/preview/models/{id}/logs/{log_id}/trajectories");
    let page = app.ok("GET", &path, KEY_A, None).await;
    assert_eq!(page["groups"][0]["trajectories"][0]["histories"][0]["messages"][3]["content"], "answer 0");
    assert_eq!(app.call("GET", &path, KEY_B, None).await.status, 404);
    let other = format!("/v1/preview/models/{id}/logs/{}/trajectories", Uuid::now_v7());
    assert_eq!(app.call("GET", &other, KEY_A, None).await.status, 404);

    // A job that keeps no rollouts (SFT, or created before they were kept) says so.
    let sft = app
        .store
        .create_job(&tandem_store::NewJob {
            model_id: Uuid::parse_str(id).unwrap(),
            kind: tandem_core::records::JobKind::Sft,
            config: json!({}),
            inputs: json!([]),
            rollout: None,
        })
        .await
        .unwrap();
    let r = app.call("GET", &format!("/v1/preview/training-jobs/{}/trajectories", sft.id), KEY_A, None).await;
    assert_eq!(r.status, 409, "{:?}", r.json());
}

#[tokio::test]
async fn history_zooms_to_a_step_range() {
    let app = test_app().await;
    let m = app.create_model(KEY_A, "zoom").await;
    let id = m["id"].as_str().unwrap();
    let model_id = Uuid::parse_str(id).unwrap();
    let log = |r: f64| json!({"split": "val", "trajectory_groups": [group(&[r, r])]});
    for step in 1..=4 {
        add_checkpoint(&app, model_id, step).await;
        app.ok("POST", &format!("/v1/preview/models/{id}/log"), KEY_A, Some(log(step as f64 / 10.0))).await;
    }
    let h = app.ok("GET", &format!("/v1/preview/models/{id}/history?min_step=2&max_step=3"), KEY_A, None).await;
    let reward = h["series"].as_array().unwrap().iter().find(|s| s["key"] == "val/reward").cloned().unwrap();
    let steps: Vec<f64> = reward["points"].as_array().unwrap().iter().map(|p| p["step"].as_f64().unwrap()).collect();
    assert_eq!((steps, reward["total"].as_u64()), (vec![2.0, 3.0], Some(2)));
    for (query, field) in
        [("min_step=-1", "min_step"), ("max_step=x", "max_step"), ("min_step=3&max_step=2", "max_step")]
    {
        let r = app.call("GET", &format!("/v1/preview/models/{id}/history?{query}"), KEY_A, None).await;
        assert_eq!(r.status, 422, "{query}");
        assert_eq!(r.json()["detail"][0]["loc"], json!(["query", field]), "{query}");
    }
}

#[tokio::test]
async fn models_are_searched_and_summarised() {
    let app = test_app().await;
    let a = app.create_model(KEY_A, "alpha-agent").await;
    app.create_model(KEY_A, "beta").await;
    app.create_model(KEY_B, "alpha-other").await;
    let id = a["id"].as_str().unwrap();
    add_checkpoint(&app, Uuid::parse_str(id).unwrap(), 1).await;
    app.ok(
        "POST",
        &format!("/v1/preview/models/{id}/log"),
        KEY_A,
        Some(json!({"split": "val", "trajectory_groups": [group(&[0.25, 0.75])]})),
    )
    .await;

    let found = app.ok("GET", "/v1/preview/models?search=ALPHA&summary=true", KEY_A, None).await;
    let data = found["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "only this entity's match: {found}");
    let s = &data[0]["summary"];
    assert_eq!((s["latest_step"].as_i64(), s["last_reward"].as_f64()), (Some(1), Some(0.5)));
    assert_eq!(s["last_reward_key"], "val/reward");
    assert!(s["last_activity"].as_str().is_some());
    // Without `summary=true` the listing is as ART reads it.
    let plain = app.ok("GET", "/v1/preview/models?search=alpha", KEY_A, None).await;
    assert!(plain["data"][0].get("summary").is_none());
    // `summary` is a boolean as FastAPI reads one: `1` is true, `off` false, `null` a 422.
    let one = app.ok("GET", "/v1/preview/models?search=alpha&summary=1", KEY_A, None).await;
    assert!(one["data"][0]["summary"].is_object());
    let off = app.ok("GET", "/v1/preview/models?search=alpha&summary=off", KEY_A, None).await;
    assert!(off["data"][0].get("summary").is_none());
    let bad = app.call("GET", "/v1/preview/models?summary=null", KEY_A, None).await;
    assert_eq!(bad.status, 422);
    assert_eq!(bad.json()["detail"][0]["loc"], json!(["query", "summary"]));
    assert_eq!(app.ok("GET", "/v1/preview/models?search=%25", KEY_A, None).await["data"], json!([]));
    // A running job's rollouts are newer than the log: its reward is the last one.
    let body = json!({"model_id": id, "trajectory_groups": [group(&[0.0, 0.5])]});
    app.ok("POST", "/v1/preview/training-jobs", KEY_A, Some(body)).await;
    let queued = app.ok("GET", "/v1/preview/models?search=alpha&summary=true", KEY_A, None).await;
    assert_eq!(queued["data"][0]["summary"]["last_reward_key"], "val/reward", "a queued job is not on the curve yet");
    app.store.claim_next_job(&tandem_store::test_lease()).await.unwrap().unwrap();
    let running = app.ok("GET", "/v1/preview/models?search=alpha&summary=true", KEY_A, None).await;
    let s = &running["data"][0]["summary"];
    assert_eq!((s["last_reward_key"].as_str(), s["last_reward"].as_f64()), (Some("train/reward"), Some(0.25)));
    // 256 characters of three bytes each are allowed; 257 are not.
    let ok = "é".repeat(256);
    assert_eq!(app.call("GET", &format!("/v1/preview/models?search={ok}"), KEY_A, None).await.status, 200);
    let long = "x".repeat(300);
    let r = app.call("GET", &format!("/v1/preview/models?search={long}"), KEY_A, None).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["detail"][0]["loc"], json!(["query", "search"]));
}
