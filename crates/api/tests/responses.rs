//! The Responses API against the fake served model (`common::fake`): the response object, stored
//! responses (entity-scoped `GET`/`DELETE`, `previous_response_id`), and the stream events.

mod common;

use common::fake::*;
use common::*;
use serde_json::{json, Value};

const URL: &str = "/v1/responses";

fn text_of(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter().map(|p| p["text"].as_str().unwrap().to_string()))
        .collect()
}

#[tokio::test]
async fn a_response_is_stored_for_its_entity_and_continues_a_conversation() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let r = app.ok("POST", URL, KEY_A, Some(json!({"model": BASE, "input": "hello"}))).await;
    assert_eq!(
        (r["object"].as_str(), r["status"].as_str(), r["model"].as_str()),
        (Some("response"), Some("completed"), Some(BASE))
    );
    let id = r["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp_"));
    assert_eq!(r["output"][0]["type"], "message");
    assert_eq!(r["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(text_of(&r), "olleh");
    // "user: hello\n" is 12 byte tokens.
    assert_eq!((r["usage"]["input_tokens"].as_u64(), r["usage"]["output_tokens"].as_u64()), (Some(12), Some(5)));
    assert_eq!(
        (r["store"].clone(), r["temperature"].clone(), r["tool_choice"].clone()),
        (json!(true), json!(1.0), json!("auto"))
    );

    // Stored: the same object for its entity, a 404 for another.
    assert_eq!(app.ok("GET", &format!("{URL}/{id}"), KEY_A, None).await, r);
    assert_eq!(app.call("GET", &format!("{URL}/{id}"), KEY_B, None).await.status, 404);
    assert_eq!(app.call("DELETE", &format!("{URL}/{id}"), KEY_B, None).await.status, 404);

    // A continuation renders the stored conversation first: history, output, new input.
    let body = json!({"input": "again", "previous_response_id": id, "instructions": "Be brief."});
    let next = app.ok("POST", URL, KEY_A, Some(body)).await;
    let expected = "system: Be brief.\nuser: hello\nassistant: olleh\nuser: again\n".len();
    assert_eq!(next["usage"]["input_tokens"].as_u64(), Some(expected as u64));
    assert_eq!((text_of(&next).as_str(), next["previous_response_id"].as_str()), ("niaga", Some(id.as_str())));
    // Instructions are not inherited by a continuation of the continuation.
    let third = json!({"input": "x", "previous_response_id": next["id"]});
    let third = app.ok("POST", URL, KEY_A, Some(third)).await;
    let expected = "user: hello\nassistant: olleh\nuser: again\nassistant: niaga\nuser: x\n".len();
    assert_eq!(third["usage"]["input_tokens"].as_u64(), Some(expected as u64));

    // Another entity cannot continue it; an unknown id is a 404 naming the field.
    let r = app.call("POST", URL, KEY_B, Some(json!({"input": "x", "previous_response_id": id}))).await;
    assert_eq!((r.status.as_u16(), r.json()["error"]["param"].as_str()), (404, Some("previous_response_id")));

    // Deleted, it is gone; `store: false` keeps nothing.
    let d = app.ok("DELETE", &format!("{URL}/{id}"), KEY_A, None).await;
    assert_eq!(d, json!({"id": id, "object": "response", "deleted": true}));
    assert_eq!(app.call("GET", &format!("{URL}/{id}"), KEY_A, None).await.status, 404);
    let unstored = app.ok("POST", URL, KEY_A, Some(json!({"input": "x", "store": false}))).await;
    assert_eq!(app.call("GET", &format!("{URL}/{}", unstored["id"].as_str().unwrap()), KEY_A, None).await.status, 404);
}

#[tokio::test]
async fn limits_ids_and_field_names() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let body = json!({"input": "hello", "max_output_tokens": 3, "return_token_ids": true, "include": ["message.output_text.logprobs"]});
    let r = app.ok("POST", URL, KEY_A, Some(body)).await;
    assert_eq!(
        (r["status"].as_str(), r["incomplete_details"]["reason"].as_str()),
        (Some("incomplete"), Some("max_output_tokens"))
    );
    assert_eq!(text_of(&r), "oll");
    let g = &r["token_generations"][0];
    assert_eq!((g["prompt_token_ids"].as_array().unwrap().len(), g["token_ids"].clone()), (12, json!([111, 108, 108])));
    assert_eq!(g["compact_logprobs"], json!([-0.5, -0.5, -0.5]));
    assert_eq!(r["output"][0]["content"][0]["logprobs"][0]["logprob"], -0.5);
    for (body, field) in [
        (json!({"input": "x", "max_output_tokens": CONTEXT + 1}), "max_output_tokens"),
        (json!({"input": "x", "temperature": 9}), "temperature"),
        (json!({"input": []}), "input"),
        (json!({"input": "x", "background": true}), "background"),
        (json!({"input": "x", "n": 2.0, "temperature": 1}), "n"),
        // Too large to store: refused before any work, with the way out.
        (json!({"input": "y".repeat(1 << 20)}), "store"),
    ] {
        let r = app.call("POST", URL, KEY_A, Some(body.clone())).await;
        let e = r.json();
        assert_eq!((r.status.as_u16(), e["error"]["param"].as_str()), (400, Some(field)), "{body}: {e}");
        assert!(!e["error"]["message"].as_str().unwrap().contains("max_completion_tokens"), "{e}");
    }
}

#[tokio::test]
async fn the_stream_is_the_responses_events_and_the_result_is_stored_first() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let r = app.call("POST", URL, KEY_A, Some(json!({"input": "hello", "stream": true}))).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.bytes).unwrap();
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..4],
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    );
    assert_eq!(
        kinds[kinds.len() - 4..],
        ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, "olleh");
    let done = &events.last().unwrap()["response"];
    assert_eq!((done["status"].as_str(), text_of(done).as_str()), (Some("completed"), "olleh"));
    assert_eq!(done["usage"]["output_tokens"], 5);
    assert_eq!(events[2]["item"]["id"], done["output"][0]["id"], "the streamed item is the final one");
    // Stored before `response.completed` went out.
    let stored = app.ok("GET", &format!("{URL}/{}", done["id"].as_str().unwrap()), KEY_A, None).await;
    assert_eq!(&stored, done);
}
