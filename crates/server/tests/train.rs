//! The RL loop end to end on the real model, over HTTP against the real binary: roll out with
//! logprobs and token ids, train, roll out again on the new checkpoint. The task is verifiable
//! and against the model's habit: answer a yes/no question starting with "yes" (the base model
//! does so about one time in ten). Held-out questions, fixed seeds; the learning rate is high
//! (1e-3) so that two jobs suffice.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const TRAIN: [&str; 8] = [
    "Is the sky blue?",
    "Is fire cold?",
    "Can fish swim?",
    "Is ice hot?",
    "Do cats bark?",
    "Is the sun a star?",
    "Can birds fly?",
    "Is water dry?",
];
const HELD_OUT: [&str; 6] =
    ["Is snow white?", "Do dogs meow?", "Is grass green?", "Can rocks talk?", "Is milk black?", "Do trees grow?"];

struct Api {
    c: reqwest::Client,
    url: String,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.c.request(method, format!("{}{path}", self.url)).bearer_auth(KEY);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let (s, v) = self.call(reqwest::Method::POST, path, Some(body.clone())).await;
        assert_eq!(s, 200, "POST {path} -> {v}");
        v
    }

    async fn get(&self, path: &str) -> Value {
        let (s, v) = self.call(reqwest::Method::GET, path, None).await;
        assert_eq!(s, 200, "GET {path} -> {v}");
        v
    }

    /// n samples per question; returns (groups of trajectories, mean reward).
    async fn rollout(&self, model: &str, questions: &[&str], n: usize, seed: u64) -> (Vec<Value>, f64) {
        let (mut groups, mut total, mut count) = (Vec::new(), 0.0, 0);
        for (i, q) in questions.iter().enumerate() {
            let messages = json!([{"role": "user", "content": format!("{q} Answer yes or no.")}]);
            let r = self
                .post(
                    "/v1/chat/completions",
                    json!({"model": model, "messages": messages, "n": n, "temperature": 1.0, "max_tokens": 6,
                           "seed": seed + i as u64, "logprobs": true, "return_token_ids": true}),
                )
                .await;
            let mut trajectories = Vec::new();
            for c in r["choices"].as_array().unwrap() {
                let reward = reward(c["message"]["content"].as_str().unwrap());
                (total, count) = (total + reward, count + 1);
                // As ART 0.5.23 records a Choice: the prompt ids travel with it.
                let mut choice = c.clone();
                choice["prompt_token_ids"] = r["prompt_token_ids"].clone();
                let mut items = messages.as_array().unwrap().clone();
                items.push(choice);
                trajectories.push(json!({"messages_and_choices": items, "reward": reward}));
            }
            groups.push(json!({"trajectories": trajectories}));
        }
        (groups, total / count as f64)
    }

    /// Submits a job and waits for its terminal event; returns (job, events).
    async fn train(&self, model_id: &str, groups: Vec<Value>) -> (Value, Vec<Value>) {
        let job = self
            .post(
                "/v1/preview/training-jobs",
                json!({"model_id": model_id, "trajectory_groups": groups, "experimental_config": {"learning_rate": 1e-3}}),
            )
            .await;
        let id = job["id"].as_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let j = self.get(&format!("/v1/preview/training-jobs/{id}")).await;
            if ["succeeded", "failed", "cancelled"].contains(&j["status"].as_str().unwrap()) {
                let events = self.get(&format!("/v1/preview/training-jobs/{id}/events?limit=100")).await;
                return (j, events["data"].as_array().unwrap().clone());
            }
            assert!(Instant::now() < deadline, "job {id} did not finish");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn reward(text: &str) -> f64 {
    if text.trim_start().to_lowercase().starts_with("yes") {
        1.0
    } else {
        0.0
    }
}

/// ART's event rules: training_started first with num_sequences = the number of gradient_step
/// events, every gradient_step value a number, training_ended last with the new step.
fn check_events(events: &[Value], step: i64) {
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"training_started"), "{types:?}");
    assert_eq!(types.last(), Some(&"training_ended"), "{types:?}");
    let steps: Vec<&Value> = events.iter().filter(|e| e["type"] == "gradient_step").collect();
    assert_eq!(events[0]["data"]["num_sequences"].as_u64(), Some(steps.len() as u64));
    for s in &steps {
        for key in [
            "loss",
            "grad_norm",
            "learning_rate",
            "entropy",
            "num_trainable_tokens",
            "tokens_per_second",
            "step_seconds",
        ] {
            assert!(s["data"][key].is_number(), "{key} in {}", s["data"]);
        }
    }
    assert_eq!(events.last().unwrap()["data"]["step"].as_i64(), Some(step));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rl_loop_learns_and_serves_each_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let loras = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--api-key", KEY, "--lora-root", loras.path().to_str().unwrap()]);
    let api = Api { c: client(), url: server.url.clone() };
    let m = api
        .post(
            "/v1/preview/models",
            json!({"project": "rl", "name": "yes", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}),
        )
        .await;
    let model_id = m["id"].as_str().unwrap().to_string();
    let name = format!("{}/rl/yes", m["entity"].as_str().unwrap());

    // A trajectory the trainer cannot use is refused before it is queued, saying which and why.
    let bad_choice = json!({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"},
                            "prompt_token_ids": [1, 2], "token_ids": [3, 4],
                            "logprobs": {"content": [{"token": "token_id:3", "logprob": -0.1}]}});
    let (status, body) = api
        .call(
            reqwest::Method::POST,
            "/v1/preview/training-jobs",
            Some(json!({"model_id": model_id, "trajectory_groups": [{"trajectories": [
                {"reward": 1.0, "messages_and_choices": [{"role": "user", "content": "q"}, bad_choice]}]}]})),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "trajectory_groups", 0, "trajectories", 0]));
    assert!(body["detail"][0]["msg"].as_str().unwrap().contains("1 logprobs for 2 token ids"), "{body}");

    // ART 0.5.18 asks for logprobs only: no token ids. The trainer re-renders the prompt and maps
    // each logprob entry back to its token through its raw bytes (EOS included), so it trains
    // exactly the generated tokens. A separate model, so the loop below starts from the base.
    let m2 = api
        .post(
            "/v1/preview/models",
            json!({"project": "rl", "name": "old-client", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}),
        )
        .await;
    let messages = json!([{"role": "user", "content": "Is the sky blue? Answer yes or no."}]);
    let r = api
        .post("/v1/chat/completions", json!({"messages": messages, "n": 2, "temperature": 1.0, "max_tokens": 24, "seed": 5, "logprobs": true, "return_token_ids": true}))
        .await;
    let mut trajectories = Vec::new();
    let mut generated = 0;
    for (i, c) in r["choices"].as_array().unwrap().iter().enumerate() {
        generated += c["token_ids"].as_array().unwrap().len();
        let mut choice = c.clone();
        choice.as_object_mut().unwrap().remove("token_ids");
        let mut items = messages.as_array().unwrap().clone();
        items.push(choice);
        trajectories.push(json!({"messages_and_choices": items, "reward": i as f64}));
    }
    let (job, events) = api.train(m2["id"].as_str().unwrap(), vec![json!({"trajectories": trajectories})]).await;
    assert_eq!(job["status"], "succeeded", "{job} {events:?}");
    assert_eq!(events[0]["data"]["num_trainable_tokens"].as_u64(), Some(generated as u64), "{}", events[0]);

    let before = api.rollout(&name, &HELD_OUT, 8, 7).await.1;
    for step in 1..=2 {
        let (groups, train_reward) = api.rollout(&name, &TRAIN, 8, 1000 * step).await;
        let (job, events) = api.train(&model_id, groups).await;
        assert_eq!(job["status"], "succeeded", "{job} {events:?}");
        check_events(&events, step as i64);
        eprintln!("step {step}: training reward {train_reward:.3}");
    }
    let after = api.rollout(&name, &HELD_OUT, 8, 7).await.1;
    eprintln!("held-out reward before {before:.3}, after {after:.3}");
    // 48 held-out samples each: a rise of 0.4 is far beyond sampling noise at these rates.
    assert!(after >= before + 0.4, "held-out reward before {before}, after {after}");

    // Both checkpoints are listed and served; the latest is what the bare name serves.
    let list = api.get(&format!("/v1/preview/models/{model_id}/checkpoints")).await;
    let steps: Vec<i64> = list["data"].as_array().unwrap().iter().map(|c| c["step"].as_i64().unwrap()).collect();
    assert!(steps.contains(&1) && steps.contains(&2), "{list}");
    let ask = |model: String| {
        json!({"model": model, "messages": [{"role": "user", "content": "Is snow white? Answer yes or no."}],
                                     "temperature": 0, "max_tokens": 4})
    };
    let latest = api.post("/v1/chat/completions", ask(format!("wandb-artifact:///{name}"))).await;
    let step2 = api.post("/v1/chat/completions", ask(format!("{name}:step2"))).await;
    assert_eq!(latest["choices"][0]["message"]["content"], step2["choices"][0]["message"]["content"]);
    api.post("/v1/chat/completions", ask(format!("{name}:step1"))).await;

    // Deleting step 1 removes its files and stops serving it.
    let (s, _) = api
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/preview/models/{model_id}/checkpoints"),
            Some(json!({"steps": [1]})),
        )
        .await;
    assert!(s == 200 || s == 204, "delete checkpoint: {s}");
    let (s, v) = api.call(reqwest::Method::POST, "/v1/chat/completions", Some(ask(format!("{name}:step1")))).await;
    assert_eq!(s, 404, "{v}");
    api.post("/v1/chat/completions", ask(format!("{name}:step2"))).await;

    // vLLM's runtime LoRA route: the step-2 adapter, copied under --lora-root as PEFT wrote it,
    // loads under a name and answers exactly as the checkpoint does.
    let model_dir = dir.path().join("checkpoints").join(&model_id);
    let step2_dir = std::fs::read_dir(&model_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("adapter_model.safetensors").is_file())
        .expect("step 2's files");
    std::fs::create_dir(loras.path().join("yes-2")).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(step2_dir.join(f), loras.path().join("yes-2").join(f)).unwrap();
    }
    let (s, v) = api
        .call(reqwest::Method::POST, "/v1/load_lora_adapter", Some(json!({"lora_name": "yes-2", "lora_path": "yes-2"})))
        .await;
    assert_eq!(s, 200, "{v}");
    let loaded = api.post("/v1/chat/completions", ask("yes-2".into())).await;
    assert_eq!(loaded["choices"][0]["message"]["content"], step2["choices"][0]["message"]["content"]);
    assert_eq!(loaded["model"], "yes-2");
    let models = api.get("/v1/models").await;
    let card = models["data"].as_array().unwrap().iter().find(|c| c["id"] == "yes-2").cloned().unwrap();
    assert_eq!(card["parent"], "HuggingFaceTB/SmolLM2-135M-Instruct");
    // An adapter of another shape is refused with the reason, and nothing is served under it.
    std::fs::create_dir(loras.path().join("wrong")).unwrap();
    std::fs::write(loras.path().join("wrong/adapter_config.json"), br#"{"r": 3, "lora_alpha": 8}"#).unwrap();
    std::fs::copy(step2_dir.join("adapter_model.safetensors"), loras.path().join("wrong/adapter_model.safetensors"))
        .unwrap();
    let (s, v) = api
        .call(reqwest::Method::POST, "/v1/load_lora_adapter", Some(json!({"lora_name": "wrong", "lora_path": "wrong"})))
        .await;
    assert_eq!(s, 400, "{v}");
    let why = v["error"]["message"].as_str().unwrap();
    assert!(why.contains("rank 3") && !why.contains(&*loras.path().to_string_lossy()), "{why}");

    // The jobs above, as Prometheus reads them.
    let text = api.c.get(format!("{}/metrics", api.url)).bearer_auth(KEY).send().await.unwrap().text().await.unwrap();
    let value = |series: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("{series} in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("tandem:training_job_duration_seconds_count{kind=\"rl\",outcome=\"succeeded\"}"), 3.0);
    assert!(value("tandem:training_gradient_steps_total{kind=\"rl\"}") >= 3.0);
    assert!(value("tandem:training_trained_tokens_total{kind=\"rl\"}") >= generated as f64);
    assert_eq!(value("tandem:training_jobs{kind=\"rl\",state=\"running\"}"), 0.0);
    assert!(value("vllm:generation_tokens_total{") > 0.0);
    assert!(value("vllm:request_success_total{model_name=\"HuggingFaceTB/SmolLM2-135M-Instruct\",engine=\"0\",finished_reason=\"length\"}") > 0.0);
    assert!(value("http_requests_total{handler=\"/v1/load_lora_adapter\",method=\"POST\",status=\"4xx\"}") >= 1.0);
}
