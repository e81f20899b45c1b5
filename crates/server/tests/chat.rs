//! Chat completions end to end on the real model, over HTTP against the real binary: one server,
//! every check in sequence (the model is loaded once; the checks share the machine's two cores).

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Api {
    c: reqwest::Client,
    url: String,
}

impl Api {
    async fn chat(&self, body: Value) -> (u16, Value) {
        post(&self.c, &format!("{}/v1/chat/completions", self.url), KEY, &body).await.unwrap()
    }

    async fn ok(&self, body: Value) -> Value {
        let (s, v) = self.chat(body.clone()).await;
        assert_eq!(s, 200, "{body} -> {v}");
        v
    }

    /// A streamed request: (chunks, whether it ended with [DONE]).
    async fn stream(&self, body: Value) -> (Vec<Value>, bool) {
        let r =
            self.c.post(format!("{}/v1/chat/completions", self.url)).bearer_auth(KEY).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let text = r.text().await.unwrap();
        let mut chunks = Vec::new();
        let mut done = false;
        for frame in text.split("\n\n").filter(|f| !f.is_empty()) {
            let data = frame.strip_prefix("data: ").expect("SSE data frame");
            if data == "[DONE]" {
                done = true;
            } else {
                assert!(!done, "data after [DONE]");
                chunks.push(serde_json::from_str(data).unwrap());
            }
        }
        (chunks, done)
    }
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--api-key", KEY]);
    let api = Api { c: client(), url: server.url.clone() };

    // Greedy, with logprobs and token ids as ART asks for them.
    let body = json!({"messages": user("Name three colors."), "temperature": 0, "max_tokens": 24,
                      "logprobs": true, "top_logprobs": 3, "return_token_ids": true, "return_tokens_as_token_ids": true,
                      "nvext": {"extra_fields": ["engine_data"]}, "chat_template_kwargs": {"preserve_thinking": true}});
    let full = api.ok(body.clone()).await;
    let choice = &full["choices"][0];
    let ids: Vec<u64> = choice["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let usage = &full["usage"];
    assert_eq!(full["object"], "chat.completion");
    assert_eq!(ids.len() as u64, usage["completion_tokens"].as_u64().unwrap());
    assert_eq!(full["prompt_token_ids"].as_array().unwrap().len() as u64, usage["prompt_tokens"].as_u64().unwrap());
    assert_eq!(
        usage["total_tokens"],
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    let entries = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(entries.len(), ids.len(), "one logprob entry per generated token");
    for (e, id) in entries.iter().zip(&ids) {
        assert_eq!(e["token"], format!("token_id:{id}"));
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"], "greedy: the chosen token leads the top list");
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }
    let content = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(!content.is_empty());
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));

    // Streaming gives the same text and ids, role first, usage last, then [DONE].
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let (chunks, done) = api.stream(sbody).await;
    assert!(done);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks[0]["prompt_token_ids"].is_array() && chunks[1].get("prompt_token_ids").is_none());
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"].get(0)).filter_map(|c| c["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, content);
    let streamed_ids: Vec<u64> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|c| c["token_ids"].as_array())
        .flatten()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(streamed_ids, ids);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], usage["completion_tokens"]);

    // n > 1 with a seed: reproducible, and choice i is sampled with seed + i.
    let sampled = |seed: u64, n: u64| json!({"messages": user("Tell me a word."), "n": n, "seed": seed, "temperature": 1.0, "max_tokens": 12, "return_token_ids": true});
    let a = api.ok(sampled(11, 2)).await;
    let b = api.ok(sampled(11, 2)).await;
    let c = api.ok(sampled(12, 1)).await;
    assert_eq!(a["choices"], b["choices"]);
    assert_eq!(a["choices"][1]["token_ids"], c["choices"][0]["token_ids"]);
    let total: u64 =
        a["choices"].as_array().unwrap().iter().map(|ch| ch["token_ids"].as_array().unwrap().len() as u64).sum();
    assert_eq!(a["usage"]["completion_tokens"], total);

    // Stop strings and lengths.
    let text = content.clone();
    if let Some(space) = text.find(' ') {
        let cut = api
            .ok(json!({"messages": user("Name three colors."), "temperature": 0, "max_tokens": 24, "stop": [" "]}))
            .await;
        assert_eq!(cut["choices"][0]["message"]["content"], text[..space]);
        assert_eq!(
            (cut["choices"][0]["finish_reason"].as_str(), cut["choices"][0]["stop_reason"].as_str()),
            (Some("stop"), Some(" "))
        );
    }
    let short = api.ok(json!({"messages": user("Count to ten."), "max_tokens": 3, "ignore_eos": true})).await;
    assert_eq!(
        (short["choices"][0]["finish_reason"].as_str(), short["usage"]["completion_tokens"].as_u64()),
        (Some("length"), Some(3))
    );

    // Beam search: width 1 without EOS is greedy decoding; width 3 returns three different
    // hypotheses ranked by cumulative logprob (length_penalty 0), each logprob the raw model's.
    let greedy = api
        .ok(json!({"messages": user("Name a fruit."), "temperature": 0, "max_tokens": 6, "ignore_eos": true,
                   "return_token_ids": true, "logprobs": true}))
        .await;
    let beam1 = api
        .ok(json!({"messages": user("Name a fruit."), "use_beam_search": true, "n": 1, "max_tokens": 6,
                   "ignore_eos": true, "return_token_ids": true}))
        .await;
    assert_eq!(beam1["choices"][0]["token_ids"], greedy["choices"][0]["token_ids"]);
    assert_eq!(beam1["choices"][0]["message"]["content"], greedy["choices"][0]["message"]["content"]);
    let beam_body = json!({"messages": user("Name a fruit."), "use_beam_search": true, "n": 3, "max_tokens": 6,
                           "length_penalty": 0.0, "logprobs": true, "top_logprobs": 2, "return_token_ids": true});
    let beams = api.ok(beam_body.clone()).await;
    let choices = beams["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let cum = |c: &Value| -> f64 {
        c["logprobs"]["content"].as_array().unwrap().iter().map(|e| e["logprob"].as_f64().unwrap()).sum()
    };
    for pair in choices.windows(2) {
        assert!(cum(&pair[0]) >= cum(&pair[1]) - 1e-4, "ranked by cumulative logprob: {beams}");
        assert_ne!(pair[0]["token_ids"], pair[1]["token_ids"]);
    }
    // The first step's logprobs are the greedy request's first-position ones.
    let first_greedy = &greedy["choices"][0]["logprobs"]["content"][0];
    let best_first = &choices[0]["logprobs"]["content"][0];
    if best_first["token"] == first_greedy["token"] {
        assert!((best_first["logprob"].as_f64().unwrap() - first_greedy["logprob"].as_f64().unwrap()).abs() < 1e-4);
    }
    let total: u64 = choices.iter().map(|c| c["token_ids"].as_array().unwrap().len() as u64).sum();
    assert_eq!(beams["usage"]["completion_tokens"], total);
    let mut sbeam = beam_body.clone();
    sbeam["stream"] = json!(true);
    let (chunks, done) = api.stream(sbeam).await;
    assert!(done);
    for (i, c) in choices.iter().enumerate() {
        let text: String = chunks
            .iter()
            .filter_map(|ch| ch["choices"].get(0))
            .filter(|ch| ch["index"] == i)
            .filter_map(|ch| ch["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, c["message"]["content"].as_str().unwrap(), "streamed beam {i}");
    }

    // Errors, in the OpenAI shape.
    for (body, status, param) in [
        (json!({"messages": user("x"), "temperature": 5}), 400, "temperature"),
        (json!({"messages": user("x"), "n": 2, "temperature": 0}), 400, "n"),
        (json!({"messages": user("x"), "model": "no-such-model"}), 404, "model"),
        (
            json!({"messages": [{"role": "assistant", "content": "Hi"}], "continue_final_message": true}),
            400,
            "continue_final_message",
        ),
        (json!({"messages": user("x"), "stop_token_ids": [999999]}), 400, "stop_token_ids"),
    ] {
        let (s, v) = api.chat(body.clone()).await;
        assert_eq!(s, status, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["code"], status);
    }
    let r = api
        .c
        .post(format!("{}/v1/chat/completions", api.url))
        .json(&json!({"messages": user("x")}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = api
        .c
        .post(format!("{}/v1/chat/completions", api.url))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // Prompt logprobs: null first, then the actual token (with its rank) and the top-k.
    let pl = api.ok(json!({"messages": user("Name three colors."), "max_tokens": 1, "prompt_logprobs": 2})).await;
    let positions = pl["prompt_logprobs"].as_array().unwrap();
    assert_eq!(positions.len() as u64, pl["usage"]["prompt_tokens"].as_u64().unwrap());
    assert!(positions[0].is_null());
    let prompt_ids = full["prompt_token_ids"].as_array().unwrap();
    for (i, pos) in positions.iter().enumerate().skip(1) {
        let entry = pos.as_object().unwrap();
        let actual = prompt_ids[i].to_string();
        assert!(entry.contains_key(&actual), "position {i} lacks the prompt token");
        assert!((2..=3).contains(&entry.len()));
        assert!(entry[&actual]["rank"].as_u64().unwrap() >= 1);
    }
    let (s, _) = api.chat(json!({"messages": user("x"), "prompt_logprobs": 1, "stream": true})).await;
    assert_eq!(s, 400);

    // Continuing a final assistant message, echoed.
    let cont = api
        .ok(json!({"messages": [{"role": "user", "content": "Greet me."}, {"role": "assistant", "content": "Hello"}],
                   "add_generation_prompt": false, "continue_final_message": true, "echo": true, "max_tokens": 5, "temperature": 0}))
        .await;
    assert!(cont["choices"][0]["message"]["content"].as_str().unwrap().starts_with("Hello"));

    // Trained-model addressing: a model without checkpoints serves the base.
    let (s, m) = post(
        &api.c,
        &format!("{}/v1/preview/models", api.url),
        KEY,
        &json!({"project": "p", "name": "agent", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}),
    )
    .await
    .unwrap();
    assert_eq!(s, 200, "{m}");
    for model in ["wandb-artifact:///local/p/agent", "wandb-artifact://local/p/agent:step0", "local/p/agent"] {
        let r = api.ok(json!({"messages": user("hi"), "model": model, "max_tokens": 2})).await;
        assert_eq!(r["model"], model);
    }
    for model in ["wandb-artifact:///local/p/agent:step3", "wandb-artifact:///other/p/agent", "local/p/nobody"] {
        let (s, v) = api.chat(json!({"messages": user("hi"), "model": model, "max_tokens": 2})).await;
        assert_eq!((s, v["error"]["type"].as_str()), (404, Some("NotFoundError")), "{model}");
    }

    // Tokenize the chat form: exactly the prompt a completion uses.
    let (s, tok) =
        post(&api.c, &format!("{}/tokenize", api.url), KEY, &json!({"messages": user("Name three colors.")}))
            .await
            .unwrap();
    assert_eq!(s, 200);
    assert_eq!(tok["tokens"], full["prompt_token_ids"]);
    let (_, detok) =
        post(&api.c, &format!("{}/detokenize", api.url), KEY, &json!({"tokens": tok["tokens"]})).await.unwrap();
    assert!(detok["prompt"].as_str().unwrap().contains("Name three colors."));
    // With tools too (SmolLM2's template ignores them: tandem's generic description is the prompt).
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}}}}]);
    let body =
        json!({"messages": user("Weather in Paris?"), "tools": tools, "max_tokens": 1, "return_token_ids": true});
    let with_tools = api.ok(body.clone()).await;
    let (_, tok) = post(&api.c, &format!("{}/tokenize", api.url), KEY, &body).await.unwrap();
    assert_eq!(tok["tokens"], with_tools["prompt_token_ids"]);
    let models: Value =
        api.c.get(format!("{}/v1/models", api.url)).bearer_auth(KEY).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "HuggingFaceTB/SmolLM2-135M-Instruct");
    assert!(models["data"].as_array().unwrap().iter().any(|m| m["id"] == "wandb-artifact:///local/p/agent"));

    // A client that goes away cancels its generation.
    {
        let mut r = api
            .c
            .post(format!("{}/v1/chat/completions", api.url))
            .bearer_auth(KEY)
            .json(&json!({"messages": user("Write a long story."), "max_tokens": 4000, "ignore_eos": true, "stream": true}))
            .send()
            .await
            .unwrap();
        let _first = r.chunk().await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = api.c.get(format!("{}/metrics", api.url)).bearer_auth(KEY).send().await.unwrap().text().await.unwrap();
        let running = m
            .lines()
            .find(|l| l.starts_with("vllm:num_requests_running{"))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or("?")
            .to_string();
        if running == "0" {
            assert!(m.contains("vllm:generation_tokens_total{"));
            break;
        }
        assert!(Instant::now() < deadline, "the abandoned stream is still running: {running}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let health = api.c.get(format!("{}/health", api.url)).send().await.unwrap();
    assert_eq!(health.status(), 200);
    server.kill9();
}
