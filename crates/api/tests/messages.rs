//! `POST /v1/messages` (Anthropic's Messages API) against the fake served model (`common::fake`):
//! the translated chat request, the message and its stream events, Anthropic's key header and
//! error shape.

mod common;

use axum::body::Body;
use axum::http::Request;
use common::fake::*;
use common::*;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const URL: &str = "/v1/messages";

/// A request with `x-api-key` (as Anthropic's SDK sends it), or none.
async fn post(app: &TestApp, key: Option<&str>, body: Value) -> (u16, Vec<u8>) {
    post_to(app, URL, key, body).await
}

async fn post_to(app: &TestApp, url: &str, key: Option<&str>, body: Value) -> (u16, Vec<u8>) {
    let mut req = Request::builder().method("POST").uri(url).header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("x-api-key", k).header("anthropic-version", "2023-06-01");
    }
    let req = req.body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap();
    let res = app.router.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    (status, res.into_body().collect().await.unwrap().to_bytes().to_vec())
}

fn hello() -> Value {
    json!({"model": BASE, "max_tokens": 10, "messages": [{"role": "user", "content": "hello"}]})
}

#[tokio::test]
async fn a_message_answers_in_anthropics_shape() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let (status, bytes) = post(&app, Some(KEY_A), hello()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let m: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str(), m["model"].as_str()),
        (Some("message"), Some("assistant"), Some(BASE))
    );
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["content"], json!([{"type": "text", "text": "olleh"}]));
    assert_eq!((m["stop_reason"].as_str(), m["stop_sequence"].clone()), (Some("end_turn"), Value::Null));
    // "user: hello\n" is 12 byte tokens.
    assert_eq!(m["usage"], json!({"input_tokens": 12, "output_tokens": 5}));
    assert!(m.get("token_ids").is_none());

    // Cut by max_tokens; ids and logprobs asked for as vLLM's extras.
    let mut body = hello();
    body["max_tokens"] = json!(3);
    body["return_token_ids"] = json!(true);
    body["logprobs"] = json!(true);
    let m: Value = serde_json::from_slice(&post(&app, Some(KEY_A), body).await.1).unwrap();
    assert_eq!(m["stop_reason"], "max_tokens");
    assert_eq!(m["token_ids"], json!([111, 108, 108]));
    assert_eq!(m["logprobs"], json!([-0.5, -0.5, -0.5]));
    assert_eq!(m["prompt_token_ids"].as_array().unwrap().len(), 12);

    // count_tokens: the input tokens a message would take, without generating.
    let submitted = fake.submitted.load(std::sync::atomic::Ordering::SeqCst);
    let (status, bytes) = post_to(
        &app,
        "/v1/messages/count_tokens",
        Some(KEY_A),
        json!({"model": BASE,
        "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!((status, serde_json::from_slice::<Value>(&bytes).unwrap()), (200, json!({"input_tokens": 12})));
    assert_eq!(fake.submitted.load(std::sync::atomic::Ordering::SeqCst), submitted, "nothing generated");

    // A bearer token works too, and a system prompt becomes the first message.
    let mut body = hello();
    body["system"] = json!("Be brief.");
    let m = app.ok("POST", URL, KEY_A, Some(body)).await;
    assert_eq!(m["usage"]["input_tokens"], 12 + "system: Be brief.\n".len());
}

#[tokio::test]
async fn the_stream_is_anthropics_events_block_by_block() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let mut body = hello();
    body["stream"] = json!(true);
    let (status, bytes) = post(&app, Some(KEY_A), body).await;
    assert_eq!(status, 200);
    let text = String::from_utf8(bytes).unwrap();
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter_map(|frame| {
            let kind = frame.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = frame.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((kind.to_string(), serde_json::from_str(data).unwrap()))
        })
        .collect();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(kinds[kinds.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
    for (kind, data) in &events {
        assert_eq!(data["type"], kind.as_str(), "each event's data names its type");
    }
    assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 12);
    let streamed: String = events
        .iter()
        .filter(|(k, _)| k == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, "olleh");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 5);
    assert!(!text.contains("[DONE]"), "Anthropic streams end with message_stop");
}

#[tokio::test]
async fn errors_take_anthropics_shape_and_name_its_fields() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let (status, bytes) = post(&app, None, hello()).await;
    let e: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        (status, e["type"].as_str(), e["error"]["type"].as_str()),
        (401, Some("error"), Some("authentication_error"))
    );
    let (status, _) = post(&app, Some("wrong"), hello()).await;
    assert_eq!(status, 401);
    let cases = [
        (json!({"model": BASE, "messages": [{"role": "user", "content": "x"}]}), "max_tokens"),
        (json!({"max_tokens": 5, "temperature": 9, "messages": [{"role": "user", "content": "x"}]}), "temperature"),
        // Over the context: the chat side's max_completion_tokens is named as max_tokens.
        (json!({"max_tokens": CONTEXT + 1, "messages": [{"role": "user", "content": "x"}]}), "max_tokens"),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
            "messages.0.content.0",
        ),
        // A type error of a translated field names it as Anthropic does.
        (json!({"max_tokens": "x", "messages": [{"role": "user", "content": "x"}]}), "max_tokens"),
        // One message per request, whatever `n` says (2.0 is an integer to the chat validator).
        (json!({"max_tokens": 5, "n": 2.0, "temperature": 1, "messages": [{"role": "user", "content": "x"}]}), "n"),
    ];
    for (body, field) in cases {
        let (status, bytes) = post(&app, Some(KEY_A), body.clone()).await;
        let e: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!((status, e["error"]["type"].as_str()), (400, Some("invalid_request_error")), "{body}: {e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(field) && !message.contains("max_completion_tokens"), "{body}: {message}");
    }
    let mut missing = hello();
    missing["model"] = json!("wandb-artifact:///nobody/p/m");
    let (status, bytes) = post(&app, Some(KEY_A), missing).await;
    let e: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!((status, e["error"]["type"].as_str()), (404, Some("not_found_error")));
    assert_eq!(fake.submitted.load(std::sync::atomic::Ordering::SeqCst), 0);
}
