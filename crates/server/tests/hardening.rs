//! Issue 13's findings, each attacked over HTTP against the real binary and the real model, as a
//! tenant with a valid key would: one server, the checks in sequence. After every attack the
//! server must still serve the other tenant normally.

mod common;

use common::*;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

struct Api {
    c: reqwest::Client,
    url: String,
}

impl Api {
    async fn call(&self, key: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.c.request(method, format!("{}{path}", self.url)).bearer_auth(key);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, key: &str, path: &str, body: Value) -> (u16, Value) {
        self.call(key, reqwest::Method::POST, path, Some(body)).await
    }

    async fn chat(&self, key: &str, body: Value) -> (u16, Value) {
        self.post(key, "/v1/chat/completions", body).await
    }

    /// A plain request still works and `/health` is 200: the server was not hurt.
    async fn still_serves(&self, key: &str, after: &str) {
        let (s, v) = self.chat(key, json!({"messages": user("Say hi."), "max_tokens": 3, "temperature": 0})).await;
        assert_eq!(s, 200, "after {after}: a plain chat answered {s} {v}");
        let health = self.c.get(format!("{}/health", self.url)).send().await.unwrap().status();
        assert_eq!(health, 200, "after {after}: /health");
    }
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb / 1024
}

fn message(v: &Value) -> String {
    v["error"]["message"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_tenant_cannot_stop_starve_or_spy_on_another() {
    let dir = tempfile::tempdir().unwrap();
    // A second entity's key, made before the server starts.
    let out = Command::new(BIN)
        .args(["keys", "create", "--entity", "mallory", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mallory = String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim().to_string();
    let server = Server::start(dir.path(), &["--api-key", KEY, "--max-job-tokens", "20000"]);
    let pid = server.child.id();
    let api = Api { c: client(), url: server.url.clone() };
    api.still_serves(KEY, "start").await;

    // 13: the data directory, the database and the key file are the server user's only; no
    // server path is shown to clients.
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(dir.path()), 0o700);
    assert_eq!(mode(&dir.path().join("tandem.db")), 0o600);
    assert_eq!(mode(&dir.path().join("checkpoints")), 0o700);
    let (_, models) = api.call(KEY, reqwest::Method::GET, "/v1/models", None).await;
    assert!(!models.to_string().contains(&*model_path().to_string_lossy()), "{models}");

    // 1: an empty prompt is a 400 (it used to kill the engine thread for every entity).
    let (s, v) = api.chat(&mallory, json!({"messages": user("hi"), "truncate_prompt_tokens": 0})).await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("truncate_prompt_tokens")), "{v}");
    let (s, v) = api.chat(&mallory, json!({"messages": user("hi"), "chat_template": ""})).await;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("empty"), "{v}");
    api.still_serves(KEY, "empty prompts").await;

    // 3: a request's template that would allocate gigabytes is stopped in its jail; the server
    // itself does not grow (the audit saw +1.1 GB).
    let before = rss_mib(pid);
    let bomb = "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";
    let (s, v) = api.chat(&mallory, json!({"messages": user("hi"), "chat_template": bomb})).await;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("memory") || message(&v).contains("stopped"), "{v}");
    let (s, v) = api.post(&mallory, "/tokenize", json!({"messages": user("hi"), "chat_template": bomb})).await;
    assert_eq!(s, 400, "{v}");
    let repeat = r#"{% set s = "x" * 50000000 %}{% for i in range(12) %}{{ s }}{% endfor %}"#;
    let (s, v) = api.post(&mallory, "/tokenize", json!({"messages": user("hi"), "chat_template": repeat})).await;
    assert_eq!(s, 400, "{v}");
    let grew = rss_mib(pid).saturating_sub(before);
    println!("template bombs: server RSS {before} MiB -> +{grew} MiB");
    assert!(grew < 200, "the server grew by {grew} MiB");
    // A harmless request template still renders (in the jail).
    let own = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>";
    let (s, v) = api.chat(&mallory, json!({"messages": user("hi"), "chat_template": own, "max_tokens": 2})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"].as_u64().map(|n| n > 3), Some(true), "{v}");
    api.still_serves(KEY, "template bombs").await;

    // 4: the prefix cache is per entity: the victim's repeated prompt is cached for the victim,
    // never for another entity sending the same text.
    let secret = user("My password is hunter2-7f3a and you must never repeat it. Hello!");
    let body = json!({"messages": secret, "max_tokens": 1, "temperature": 0});
    api.chat(KEY, body.clone()).await;
    let (_, again) = api.chat(KEY, body.clone()).await;
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    assert!(cached(&again) > 0, "the owner's repeat is served from cache: {again}");
    let (s, spy) = api.chat(&mallory, body.clone()).await;
    assert_eq!((s, cached(&spy)), (200, 0), "another entity sees no cached tokens: {spy}");

    // 2 and 6: choices and beams are bounded by what the engine runs at once.
    let (s, v) = api.chat(&mallory, json!({"messages": user("hi"), "n": 33, "max_tokens": 1})).await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("n")), "{v}");
    let (s, v) = api.chat(&mallory, json!({"messages": user("hi"), "n": 17, "use_beam_search": true})).await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("n")), "{v}");
    let (s, v) = api
        .chat(
            &mallory,
            json!({"messages": user("hi"), "n": 16, "logprobs": true, "top_logprobs": 20, "max_tokens": 4000}),
        )
        .await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("max_tokens")), "{v}");

    // 7: a pathological regex is refused or ends its own request; never a 500.
    let (s, v) = api
        .chat(
            &mallory,
            json!({"messages": user("hi"), "max_tokens": 4, "structured_outputs": {"regex": "a{1000}{1000}"}}),
        )
        .await;
    // Its first mask fits the per-token limits (checked at submission), its first token does
    // not: the request ends at once with finish_reason "abort" (it used to stall every
    // sequence for about a second per token, then answer 500).
    println!("regex a{{1000}}{{1000}}: {s} {}", message(&v));
    let reason = v["choices"][0]["finish_reason"].as_str();
    assert!(s == 400 || (s == 200 && reason == Some("abort")), "{s} {v}");
    api.still_serves(KEY, "a pathological regex").await;

    // 8: side routes are bounded before the tokenizer runs (8.4 MB used to cost 785 MB).
    let huge = "word ".repeat(1_700_000);
    let (s, v) = api.post(&mallory, "/tokenize", json!({"prompt": huge})).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = api.post(&mallory, "/detokenize", json!({"tokens": vec![1; 1_100_000]})).await;
    assert_eq!(s, 400, "{v}");
    // A field of the wrong type is a 400, never silently the default (schemathesis, R8).
    for body in [json!({"prompt": "hi", "model": 5}), json!({"prompt": "hi", "add_special_tokens": "yes"})] {
        let (s, v) = api.post(&mallory, "/tokenize", body).await;
        assert_eq!(s, 400, "{v}");
    }
    let (s, v) = api.post(&mallory, "/detokenize", json!({"tokens": [1], "model": ["x"]})).await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("model")), "{v}");

    // 10: per-token lists are bounded.
    let (s, v) = api.chat(&mallory, json!({"messages": user("hi"), "allowed_token_ids": vec![1; 300_000]})).await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("allowed_token_ids")), "{v}");
    let bias: serde_json::Map<String, Value> = (0..2000).map(|i| (i.to_string(), json!(1))).collect();
    let (s, v) = api.chat(&mallory, json!({"messages": user("hi"), "logit_bias": bias})).await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("logit_bias")), "{v}");
    api.still_serves(KEY, "oversized lists").await;

    // 5 and 11: training inputs that would brick a model or panic the trainer are 422s, and
    // huge rewards never make a model unreadable.
    let (s, m) = api
        .post(
            &mallory,
            "/v1/preview/models",
            json!({"project": "p", "name": "m", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}),
        )
        .await;
    assert_eq!(s, 200, "{m}");
    let model_id = m["id"].as_str().unwrap().to_string();
    let traj = |ids: Vec<u32>, reward: f64| {
        let n = ids.len();
        json!({"reward": reward, "messages_and_choices": [
            {"role": "user", "content": "hi"},
            {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "yes"},
             "prompt_token_ids": [1, 2, 3], "token_ids": ids,
             "logprobs": {"content": vec![json!({"token": "x", "logprob": -1.0, "bytes": [120], "top_logprobs": []}); n]}}]})
    };
    let job = |groups: Value, config: Value| json!({"model_id": model_id, "trajectory_groups": groups, "experimental_config": config});
    let good = json!([{"trajectories": [traj(vec![5, 6], 1.0), traj(vec![7], 0.0)]}]);
    let (s, v) = api
        .post(
            &mallory,
            "/v1/preview/training-jobs",
            job(good.clone(), json!({"num_trajectories_learning_rate_multiplier_power": 2000})),
        )
        .await;
    assert_eq!(s, 422, "{v}");
    let out_of_vocab = json!([{"trajectories": [traj(vec![5, 999_999], 1.0), traj(vec![7], 0.0)]}]);
    let (s, v) = api.post(&mallory, "/v1/preview/training-jobs", job(out_of_vocab, json!({}))).await;
    assert_eq!(s, 422, "{v}");
    assert!(v.to_string().contains("vocabulary"), "{v}");
    let too_long = json!([{"trajectories": [traj(vec![5; 9000], 1.0), traj(vec![7], 0.0)]}]);
    let (s, v) = api.post(&mallory, "/v1/preview/training-jobs", job(too_long, json!({}))).await;
    assert_eq!(s, 422, "{v}");
    assert!(v.to_string().contains("context"), "{v}");
    // A job over the per-job token budget is a 422 naming the budget (trainer time is
    // time-sliced between entities; the budget bounds one job's length).
    let over_budget =
        json!([{"trajectories": [traj(vec![5; 7000], 1.0), traj(vec![6; 7000], 0.0), traj(vec![7; 7000], 0.5)]}]);
    let (s, v) = api.post(&mallory, "/v1/preview/training-jobs", job(over_budget, json!({}))).await;
    assert_eq!(s, 422, "{v}");
    assert!(v.to_string().contains("--max-job-tokens") && v.to_string().contains("20000"), "{v}");
    let huge_rewards = json!([{"trajectories": [traj(vec![5], 1e308), traj(vec![6], 1e308)]}]);
    let (s, v) = api
        .post(
            &mallory,
            &format!("/v1/preview/models/{model_id}/log"),
            json!({"split": "train", "trajectory_groups": huge_rewards}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = api.call(&mallory, reqwest::Method::GET, &format!("/v1/preview/models/{model_id}/logs"), None).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = api.call(&mallory, reqwest::Method::GET, "/v1/models", None).await;
    assert_eq!(s, 200, "{v}");

    api.still_serves(KEY, "every attack").await;
    api.still_serves(&mallory, "every attack").await;
}
