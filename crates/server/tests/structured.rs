//! Structured outputs end to end on the real model, over HTTP against the real binary: every
//! constraint kind yields output that parses and conforms, streaming equals non-streaming, invalid
//! constraints are 400s naming the field, and random schemas and regexes never break the server.

mod common;

use common::*;
use serde_json::{json, Value};

async fn chat(c: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    post(c, &format!("{url}/v1/chat/completions"), KEY, &body).await.unwrap()
}

/// The chunks of a streamed request (without the final `[DONE]`).
async fn streamed(c: &reqwest::Client, url: &str, mut body: Value) -> Vec<Value> {
    body["stream"] = json!(true);
    let r = c.post(format!("{url}/v1/chat/completions")).bearer_auth(KEY).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    text.split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn req(prompt: &str, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 80, "temperature": 0,
                          "return_token_ids": true});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The first choice's content, after checking the request succeeded and ended by the grammar.
async fn conforming(c: &reqwest::Client, url: &str, body: Value) -> String {
    let (status, v) = chat(c, url, body.clone()).await;
    assert_eq!(status, 200, "{body} -> {v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body} -> {v}");
    // The final EOS is generated and counted, as for unconstrained output.
    assert_eq!(choice["token_ids"].as_array().unwrap().last().unwrap(), 2);
    choice["message"]["content"].as_str().unwrap().to_string()
}

fn person_schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
      "required": ["name", "age", "colors"], "additionalProperties": false})
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v.as_object().unwrap();
    assert_eq!(o.keys().collect::<Vec<_>>(), ["name", "age", "colors"], "{text}");
    assert!(o["name"].as_str().unwrap().chars().count() <= 12, "{text}");
    assert!((0..=150).contains(&o["age"].as_i64().unwrap()), "{text}");
    let colors = o["colors"].as_array().unwrap();
    assert!(colors.len() <= 3 && colors.iter().all(|c| ["red", "green", "blue"].contains(&c.as_str().unwrap())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_outputs_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--api-key", KEY]);
    let (c, url) = (client(), server.url.clone());
    let prompt = "Describe a person as JSON with name, age and favourite colors.";

    // JSON schema, three ways of asking for it, greedy and sampled.
    let so = json!({"structured_outputs": {"json": person_schema()}});
    check_person(&conforming(&c, &url, req(prompt, so.clone())).await);
    let as_string = json!({"structured_outputs": {"json": person_schema().to_string()}});
    check_person(&conforming(&c, &url, req(prompt, as_string)).await);
    let rf = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema(), "strict": true}}});
    check_person(&conforming(&c, &url, req(prompt, rf)).await);
    for seed in 0..3 {
        let body =
            req(prompt, json!({"structured_outputs": {"json": person_schema()}, "temperature": 1.0, "seed": seed}));
        check_person(&conforming(&c, &url, body).await);
    }
    // n > 1: each choice follows its own copy of the grammar.
    let (s, v) =
        chat(&c, &url, req(prompt, json!({"guided_json": person_schema(), "n": 2, "temperature": 1.0, "seed": 5})))
            .await;
    assert_eq!(s, 200, "{v}");
    for ch in v["choices"].as_array().unwrap() {
        assert_eq!(ch["finish_reason"], "stop");
        check_person(ch["message"]["content"].as_str().unwrap());
    }

    // Streaming gives the same text and ids as the non-streamed answer.
    let full = chat(&c, &url, req(prompt, so.clone())).await.1;
    let chunks = streamed(&c, &url, req(prompt, so.clone())).await;
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, full["choices"][0]["message"]["content"].as_str().unwrap());
    let ids: Vec<Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["token_ids"].as_array()).flatten().cloned().collect();
    assert_eq!(Value::Array(ids), full["choices"][0]["token_ids"]);

    // Any JSON object; compact JSON without free whitespace.
    let obj = conforming(
        &c,
        &url,
        req("Return {\"ok\": true} as JSON.", json!({"response_format": {"type": "json_object"}})),
    )
    .await;
    assert!(serde_json::from_str::<Value>(&obj).unwrap().is_object(), "{obj}");
    let compact = conforming(
        &c,
        &url,
        req(prompt, json!({"structured_outputs": {"json": person_schema(), "disable_any_whitespace": true}})),
    )
    .await;
    check_person(&compact);
    assert_eq!(compact, serde_json::to_string(&serde_json::from_str::<Value>(&compact).unwrap()).unwrap());
    // additionalProperties defaults to false when asked: only the declared key appears.
    let open =
        json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]});
    let closed = conforming(
        &c,
        &url,
        req(
            "Where do you live? Answer as JSON.",
            json!({"structured_outputs": {"json": open, "disable_additional_properties": true}}),
        ),
    )
    .await;
    let closed: Value = serde_json::from_str(&closed).unwrap();
    assert_eq!(closed.as_object().unwrap().keys().collect::<Vec<_>>(), ["city"]);

    // Regex, choice and a Lark grammar.
    let rx = "[0-9]{3}-[a-z]{2,4}";
    let out = conforming(&c, &url, req("Make up a code.", json!({"structured_outputs": {"regex": rx}}))).await;
    assert!(regex::Regex::new(&format!("^(?:{rx})$")).unwrap().is_match(&out), "{out:?}");
    let choices = ["yes", "no", "it depends (on you)"];
    for seed in 0..3 {
        let out = conforming(
            &c,
            &url,
            req("Is the sky blue?", json!({"guided_choice": choices, "temperature": 1.0, "seed": seed})),
        )
        .await;
        assert!(choices.contains(&out.as_str()), "{out:?}");
    }
    let grammar = "start: \"The answer is \" NUMBER \".\"\nNUMBER: /[1-9][0-9]{0,2}/";
    let out =
        conforming(&c, &url, req("What is 6 times 7?", json!({"structured_outputs": {"grammar": grammar}}))).await;
    assert!(regex::Regex::new(r"^The answer is [1-9][0-9]{0,2}\.$").unwrap().is_match(&out), "{out:?}");

    structural_tags(&c, &url).await;

    // Cut by length: the text may be incomplete, and says so.
    let (s, v) =
        chat(&c, &url, req(prompt, json!({"structured_outputs": {"json": person_schema()}, "max_tokens": 3}))).await;
    assert_eq!((s, v["choices"][0]["finish_reason"].as_str()), (200, Some("length")));

    // Invalid constraints: 400 naming the field.
    for (extra, field) in [
        (json!({"structured_outputs": {"regex": "(unclosed"}}), "structured_outputs"),
        (json!({"structured_outputs": {"grammar": "start: ???"}}), "structured_outputs"),
        (json!({"structured_outputs": {"json": {"type": "no-such-type"}}}), "structured_outputs"),
        (json!({"guided_regex": "[z-a]"}), "guided_regex"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"minimum": "x", "type": "integer"}}}}),
            "response_format",
        ),
    ] {
        let (s, v) = chat(&c, &url, req("x", extra.clone())).await;
        assert_eq!(s, 400, "{extra} -> {v}");
        assert_eq!(v["error"]["param"], field, "{extra} -> {v}");
    }

    // Random schemas and regexes (valid or not) never crash the server: 200 or 400, nothing else,
    // and a 200 that stopped by itself parses as JSON for schemas.
    let mut x: u64 = 0x9E3779B97F4A7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let atoms = ["string", "integer", "number", "boolean", "null", "object", "array", "weird"];
    let rx_parts =
        ["a", "[0-9]", "(", ")", "|", "*", "+", "{2}", "{3,1}", "\\d", "[^x]", "?", ".", "\\", "[a-", "x{1,3}"];
    for i in 0..24 {
        let (extra, is_json) = if i % 2 == 0 {
            let mut schema = json!({"type": atoms[(next() % 8) as usize]});
            for _ in 0..(next() % 3) {
                schema = json!({"type": "object", "properties": {format!("k{}", next() % 5): schema},
                                "required": if next() % 2 == 0 { json!([]) } else { json!(["k0"]) },
                                "minProperties": next() % 3, "maxProperties": next() % 3});
            }
            (json!({"structured_outputs": {"json": schema}}), true)
        } else {
            let rx: String = (0..1 + next() % 6).map(|_| rx_parts[(next() % rx_parts.len() as u64) as usize]).collect();
            (json!({"structured_outputs": {"regex": rx}}), false)
        };
        let mut body = req("Answer.", extra.clone());
        body["max_tokens"] = json!(24);
        let (s, v) = chat(&c, &url, body).await;
        assert!(s == 200 || s == 400, "{extra} -> {s} {v}");
        if s == 200 && is_json && v["choices"][0]["finish_reason"] == "stop" {
            let text = v["choices"][0]["message"]["content"].as_str().unwrap();
            assert!(serde_json::from_str::<Value>(text).is_ok(), "{extra} -> {text:?}");
        }
    }
    let health = c.get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);

    tools_end_to_end(&c, &url).await;
}

/// Structural tags in both shapes: xgrammar's format tree forcing one call, and vLLM's
/// `structures`/`triggers` string in which the model may write text, but every trigger it writes
/// opens a conforming call.
async fn structural_tags(c: &reqwest::Client, url: &str) {
    let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                         "required": ["city"], "additionalProperties": false});
    let check_args = |args: &str| {
        let v: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(v.as_object().unwrap().keys().collect::<Vec<_>>(), ["city"], "{args}");
    };
    let forced = json!({"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<function="],
        "tags": [{"begin": "<function=weather>", "content": {"type": "json_schema", "json_schema": weather},
                  "end": "</function>"}],
        "at_least_one": true, "stop_after_first": true}});
    let out = conforming(c, url, req("What is the weather in Paris?", json!({"response_format": forced}))).await;
    let args = out.strip_prefix("<function=weather>").and_then(|s| s.strip_suffix("</function>"));
    check_args(args.unwrap_or_else(|| panic!("{out:?}")));

    let legacy = json!({"structures": [{"begin": "<function=weather>", "schema": weather, "end": "</function>"}],
                        "triggers": ["<function="]})
    .to_string();
    let call = regex::Regex::new(r"<function=weather>(.*?)</function>").unwrap();
    let prompt = "Call the weather tool like <function=weather>{\"city\": \"Rome\"}</function> for Oslo.";
    for seed in 0..3 {
        let body =
            req(prompt, json!({"structured_outputs": {"structural_tag": legacy}, "temperature": 1.0, "seed": seed}));
        let (s, v) = chat(c, url, body).await;
        assert_eq!(s, 200, "{v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        if v["choices"][0]["finish_reason"] == "stop" {
            // Every trigger written is a whole call.
            assert_eq!(text.matches("<function=").count(), call.find_iter(text).count(), "{text:?}");
        }
        for m in call.captures_iter(text) {
            check_args(&m[1]);
        }
    }

    for tag in [
        json!({"type": "structural_tag", "structures": [{"begin": "<b>", "schema": {}, "end": "</b>"}], "triggers": ["<a"]}),
        json!({"type": "structural_tag", "format": {"type": "no-such-format"}}),
        json!({"type": "structural_tag"}),
    ] {
        let (s, v) = chat(c, url, req("x", json!({"response_format": tag.clone()}))).await;
        assert_eq!((s, v["error"]["param"].as_str()), (400, Some("response_format")), "{tag} -> {v}");
    }
}

/// With `--reasoning-parser think`: reasoning split from a scripted output (a regex that writes
/// the think tags covers the whole output), and other constraints hold for what follows an
/// optional reasoning block. SmolLM2 does not reason, but sampled output may open a `<think>`
/// block the grammar allows and never close it, so sampled answers are checked when they stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--api-key", KEY, "--reasoning-parser", "think"]);
    let (c, url) = (&client(), server.url.as_str());
    let prompt = "Describe a person as JSON with name, age and favourite colors.";
    check_person(&conforming(c, url, req(prompt, json!({"structured_outputs": {"json": person_schema()}}))).await);
    for seed in 0..3 {
        let body = req("Is the sky blue?", json!({"guided_choice": ["yes", "no"], "temperature": 1.0, "seed": seed}));
        let (s, v) = chat(c, url, body).await;
        assert_eq!(s, 200, "{v}");
        if v["choices"][0]["finish_reason"] == "stop" {
            let out = &v["choices"][0]["message"]["content"];
            assert!(out == "yes" || out == "no", "{v}");
        }
    }
    structural_tags(c, url).await;

    let script = json!({"structured_outputs": {"regex": "<think>[a-z ]{3,40}</think>\n(yes|no)"}});
    let (s, v) = chat(c, url, req("Is water wet?", script.clone())).await;
    assert_eq!(s, 200, "{v}");
    let m = &v["choices"][0]["message"];
    let reasoning = m["reasoning"].as_str().unwrap().to_string();
    assert!(!reasoning.is_empty() && !reasoning.contains("think"), "{v}");
    assert_eq!(m["reasoning_content"], m["reasoning"]);
    let content = m["content"].as_str().unwrap().to_string();
    assert!(content == "yes" || content == "no", "{v}");
    // The reasoning tokens: those up to `</think>`; the answer and EOS are not among them.
    let thought = v["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
    let total = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(thought >= 3 && thought + 2 <= total, "{v}");

    // include_reasoning: false drops it; the content is the same.
    let mut hidden = req("Is water wet?", script.clone());
    hidden["include_reasoning"] = json!(false);
    let (_, v) = chat(c, url, hidden).await;
    assert_eq!(
        (v["choices"][0]["message"]["reasoning"].clone(), v["choices"][0]["message"]["content"].as_str()),
        (Value::Null, Some(content.as_str()))
    );

    // Streaming splits the same way: reasoning deltas, then content deltas.
    let chunks = streamed(c, url, req("Is water wet?", script)).await;
    let streamed_reasoning: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["reasoning"].as_str()).collect();
    let streamed_content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!((streamed_reasoning, streamed_content), (reasoning, content));
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                         "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "Current time in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                         "required": ["city"], "additionalProperties": false}}}
    ])
}

fn check_call(call: &Value) {
    assert!(call["id"].as_str().unwrap().starts_with("chatcmpl-tool-"), "{call}");
    assert_eq!(call["type"], "function");
    let name = call["function"]["name"].as_str().unwrap();
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let keys: Vec<&String> = args.as_object().unwrap().keys().collect();
    match name {
        "get_weather" => {
            assert_eq!(keys, ["city", "unit"], "{call}");
            assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()));
        }
        "get_time" => assert_eq!(keys, ["city"], "{call}"),
        other => panic!("unknown tool {other}"),
    }
    assert!(args["city"].as_str().unwrap().chars().count() <= 20);
}

/// Tool calling on the bundled model, whose template ignores `tools`: the generic path.
async fn tools_end_to_end(c: &reqwest::Client, url: &str) {
    let ask = "What is the weather in Paris?";
    // A named tool: the arguments always parse and match; content is empty; finish_reason stop.
    let named = json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let (s, v) = chat(c, url, req(ask, named)).await;
    assert_eq!(s, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(
        (choice["finish_reason"].as_str(), choice["message"]["content"].as_str()),
        (Some("stop"), Some("")),
        "{v}"
    );
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!((calls.len(), calls[0]["function"]["name"].as_str()), (1, Some("get_weather")));
    check_call(&calls[0]);

    // Required, one call only: finish_reason tool_calls.
    let required = json!({"tools": tools(), "tool_choice": "required", "parallel_tool_calls": false});
    let (s, v) = chat(c, url, req(ask, required.clone())).await;
    assert_eq!(s, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    check_call(&calls[0]);

    // Streaming the same request: one delta naming the call, then its arguments as they are
    // written; the same result.
    let chunks = streamed(c, url, req(ask, required)).await;
    let deltas: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0)).collect();
    assert!(deltas.len() > 2, "the arguments stream as they grow: {chunks:?}");
    assert_eq!(deltas[0]["function"]["name"], calls[0]["function"]["name"]);
    assert!(deltas[0]["id"].as_str().unwrap().starts_with("chatcmpl-tool-"));
    assert!(deltas[1..].iter().all(|d| d.get("id").is_none() && d["function"].get("name").is_none()));
    let args: String = deltas.iter().filter_map(|d| d["function"]["arguments"].as_str()).collect();
    assert_eq!(args, calls[0]["function"]["arguments"].as_str().unwrap());
    let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, "", "no call text leaks into content");
    assert_eq!(chunks.iter().rev().find_map(|c| c["choices"][0]["finish_reason"].as_str()), Some("tool_calls"));

    // Auto: either plain text, or calls that parse and match their tools.
    for (seed, prompt) in [(1, ask), (2, "Tell me a joke."), (3, "What time is it in Tokyo? Use a tool.")] {
        let body = req(prompt, json!({"tools": tools(), "temperature": 1.0, "seed": seed}));
        let (s, v) = chat(c, url, body).await;
        assert_eq!(s, 200, "{v}");
        let choice = &v["choices"][0];
        match choice["message"]["tool_calls"].as_array() {
            Some(calls) => {
                assert_eq!(choice["finish_reason"], "tool_calls");
                calls.iter().for_each(check_call);
            }
            None => assert!(
                !choice["message"]["content"].as_str().unwrap().trim_start().starts_with('{')
                    || choice["finish_reason"] == "length",
                "{v}"
            ),
        }
    }

    // A conversation with a call and its result continues as text or another call.
    let history = json!([
        {"role": "user", "content": ask},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "18 degrees, sunny"}
    ]);
    let (s, v) = chat(c, url, json!({"messages": history, "tools": tools(), "max_tokens": 60, "temperature": 0})).await;
    assert_eq!(s, 200, "{v}");

    // Tools and a response format: each reply is calls, or text in the format (OpenAI's rule).
    for seed in 0..4 {
        let body = req(
            ask,
            json!({"tools": tools(), "response_format": {"type": "json_object"}, "temperature": 1.0,
                                   "seed": seed, "max_tokens": 60}),
        );
        let (s, v) = chat(c, url, body).await;
        assert_eq!(s, 200, "{v}");
        let choice = &v["choices"][0];
        match choice["message"]["tool_calls"].as_array() {
            Some(calls) => calls.iter().for_each(check_call),
            None if choice["finish_reason"] == "stop" => {
                let text = choice["message"]["content"].as_str().unwrap();
                assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{v}");
            }
            None => {}
        }
    }

    // Invalid uses are 400s naming the field.
    for (extra, field) in [
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice"),
        (
            json!({"tools": tools(), "response_format": {"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}}),
            "response_format",
        ),
    ] {
        let (s, v) = chat(c, url, req("x", extra.clone())).await;
        assert_eq!((s, v["error"]["param"].as_str()), (400, Some(field)), "{extra} -> {v}");
    }
}
