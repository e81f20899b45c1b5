//! `POST /v1/completions` against the fake served model (`common::fake`): prompt forms, choice
//! numbering, echo, the legacy logprobs shape, streaming, and refusals before anything is queued.

mod common;

use common::fake::*;
use common::*;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

const URL: &str = "/v1/completions";

fn texts(r: &Value) -> Vec<String> {
    r["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn every_prompt_form_completes_and_choices_are_numbered_prompt_by_prompt() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let r = app.ok("POST", URL, KEY_A, Some(json!({"model": BASE, "prompt": "hello"}))).await;
    assert_eq!(r["object"], "text_completion");
    assert!(r["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(texts(&r), ["olleh"]);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert_eq!((r["usage"]["prompt_tokens"].as_u64(), r["usage"]["completion_tokens"].as_u64()), (Some(5), Some(5)));
    // No ids unless asked.
    assert!(r["choices"][0]["token_ids"].is_null() && r["choices"][0]["prompt_token_ids"].is_null());

    // Token ids ("hi"), and ids asked back.
    let r = app.ok("POST", URL, KEY_A, Some(json!({"prompt": [104, 105], "return_token_ids": true}))).await;
    assert_eq!(texts(&r), ["ih"]);
    assert_eq!(r["choices"][0]["prompt_token_ids"], json!([104, 105]));
    assert_eq!(r["choices"][0]["token_ids"], json!([105, 104]));

    // Two prompts, two choices each: index = prompt * n + choice; one validation and one submit
    // per prompt.
    let (p0, s0) = (fake.prepared.load(Ordering::SeqCst), fake.submitted.load(Ordering::SeqCst));
    let body = json!({"prompt": ["ab", "xyz"], "n": 2, "temperature": 0.8});
    let r = app.ok("POST", URL, KEY_A, Some(body)).await;
    assert_eq!(texts(&r), ["ba", "ba", "zyx", "zyx"]);
    let idx: Vec<u64> = r["choices"].as_array().unwrap().iter().map(|c| c["index"].as_u64().unwrap()).collect();
    assert_eq!(idx, [0, 1, 2, 3]);
    assert_eq!(r["usage"]["prompt_tokens"], 5, "each prompt counted once");
    assert_eq!(r["usage"]["completion_tokens"], 10);
    assert_eq!((fake.prepared.load(Ordering::SeqCst) - p0, fake.submitted.load(Ordering::SeqCst) - s0), (2, 2));
    let r = app.ok("POST", URL, KEY_A, Some(json!({"prompt": [[97], [98, 99]]}))).await;
    assert_eq!(texts(&r), ["a", "cb"]);

    // vLLM's default output length is 16 tokens.
    let long = "abcdefghijklmnopqrstuvwxyz";
    let r = app.ok("POST", URL, KEY_A, Some(json!({"prompt": long}))).await;
    assert_eq!(texts(&r)[0].len(), 16);
    assert_eq!(r["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn echo_and_logprobs_in_the_legacy_shape() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let r = app.ok("POST", URL, KEY_A, Some(json!({"prompt": "ab", "logprobs": 1}))).await;
    let lp = &r["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["b", "a"]));
    assert_eq!(lp["token_logprobs"], json!([-0.5, -0.5]));
    assert_eq!(lp["text_offset"], json!([0, 1]));
    // The sampled token first, then the alternatives (a token seen twice is listed once).
    assert_eq!(lp["top_logprobs"][0], json!({"b": -0.5, "c": -2.0}));
    let r = app.ok("POST", URL, KEY_A, Some(json!({"prompt": "ab", "logprobs": 0}))).await;
    assert_eq!(r["choices"][0]["logprobs"]["top_logprobs"][1], json!({"a": -0.5}));

    // Echo: the prompt leads the text and, with logprobs, the token lists (nothing predicts the
    // first prompt token).
    let r = app.ok("POST", URL, KEY_A, Some(json!({"prompt": "ab", "echo": true, "logprobs": 0}))).await;
    assert_eq!(texts(&r), ["abba"]);
    let lp = &r["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["a", "b", "b", "a"]));
    assert_eq!(lp["token_logprobs"], json!([null, -1.0, -0.5, -0.5]));
    assert_eq!(lp["text_offset"], json!([0, 1, 2, 3]));
    assert!(lp["top_logprobs"][0].is_null());
    // The prompt's logprobs were computed for the echo: shown on the choice too (as vLLM).
    assert_eq!(
        r["choices"][0]["prompt_logprobs"][1],
        json!({"98": {"logprob": -1.0, "rank": 1, "decoded_token": "b"}})
    );
    let r = app.ok("POST", URL, KEY_A, Some(json!({"prompt": [120, 121], "echo": true}))).await;
    assert_eq!(texts(&r), ["xyyx"]);

    // Echo with max_tokens 0 scores the prompt alone (vLLM's form; what lm-eval sends): the
    // prompt's tokens and logprobs, nothing generated, finish_reason "length".
    let body = json!({"prompt": ["ab", "xyz"], "echo": true, "logprobs": 0, "max_tokens": 0, "return_token_ids": true});
    let r = app.ok("POST", URL, KEY_A, Some(body)).await;
    assert_eq!(texts(&r), ["ab", "xyz"]);
    let lp = &r["choices"][1]["logprobs"];
    assert_eq!(
        (lp["tokens"].clone(), lp["token_logprobs"].clone()),
        (json!(["x", "y", "z"]), json!([null, -1.0, -1.0]))
    );
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["choices"][0]["token_ids"], json!([]));
    assert_eq!(r["usage"]["completion_tokens"], 0);
    assert_eq!(r["usage"]["prompt_tokens"], 5);
    let mut streamed = json!({"prompt": "ab", "echo": true, "max_tokens": 0, "stream": true});
    let chunks = app.call("POST", URL, KEY_A, Some(streamed.clone())).await.sse_data();
    let all: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(all, "ab");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    streamed["echo"] = json!(false);
    assert_eq!(app.call("POST", URL, KEY_A, Some(streamed)).await.status, 400);
}

#[tokio::test]
async fn streams_chunk_per_token_with_echo_first_and_usage_last() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let body = json!({"prompt": ["ab", "c"], "stream": true, "echo": true, "return_token_ids": true,
                      "stream_options": {"include_usage": true}});
    let r = app.call("POST", URL, KEY_A, Some(body)).await;
    assert_eq!(r.status, 200);
    let chunks = r.sse_data();
    let text = String::from_utf8(r.bytes).unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let mut by_choice = [String::new(), String::new()];
    let mut prompt_ids = [None, None];
    for c in chunks.iter().filter(|c| !c["choices"].as_array().unwrap().is_empty()) {
        assert_eq!(c["object"], "text_completion");
        let ch = &c["choices"][0];
        let i = ch["index"].as_u64().unwrap() as usize;
        by_choice[i].push_str(ch["text"].as_str().unwrap());
        if let Some(ids) = ch.get("prompt_token_ids") {
            assert!(prompt_ids[i].replace(ids.clone()).is_none(), "prompt ids sent once per choice");
        }
    }
    assert_eq!(by_choice, ["abba", "cc"]);
    assert_eq!(prompt_ids, [Some(json!([97, 98])), Some(json!([99]))]);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!((usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()), (Some(3), Some(3)));
}

#[tokio::test]
async fn a_bad_prompt_refuses_the_request_before_anything_is_queued() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    // The second prompt's token is out of the fake's vocabulary (257).
    let r = app.call("POST", URL, KEY_A, Some(json!({"prompt": [[97], [999]]}))).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "prompt");
    // A prompt as long as the context.
    let long = "x".repeat(CONTEXT);
    let r = app.call("POST", URL, KEY_A, Some(json!({"prompt": ["ok", long]}))).await;
    assert_eq!((r.status.as_u16(), r.json()["error"]["param"].as_str()), (400, Some("prompt")));
    for (body, field) in [
        (json!({"prompt": "x", "suffix": "!"}), "suffix"),
        (json!({"prompt": "x", "best_of": 3}), "best_of"),
        (json!({"prompt": "x", "logprobs": true}), "logprobs"),
        (json!({"prompt": ""}), "prompt"),
    ] {
        let r = app.call("POST", URL, KEY_A, Some(body.clone())).await;
        let text = String::from_utf8_lossy(&r.bytes).into_owned();
        assert!(r.status == 400 || r.status == 422, "{body}: {}", r.status);
        assert!(text.contains(field), "{body}: {text}");
    }
    assert_eq!(fake.submitted.load(Ordering::SeqCst), 0);
    // Without a key: 401, as every inference route.
    let r = app.raw("POST", URL, None, Some(br#"{"prompt": "x"}"#.to_vec())).await;
    assert_eq!(r.status, 401);
}
