//! A Responses API body into the chat-completions body it means, as vLLM's Responses front
//! translates it: `instructions` become the first (system) message, the stored conversation of
//! `previous_response_id` follows, then the `input` items (messages; `function_call` items as an
//! assistant's `tool_calls`; `function_call_output` items as `tool` messages); `tools`,
//! `tool_choice`, `text.format`, `reasoning` and `max_output_tokens` become their chat
//! equivalents. Fields the Responses API does not define (vLLM's extras: `return_token_ids`,
//! `priority`, `top_k`, ...) pass through. What the response object repeats of the request is
//! collected in [`Translated::settings`].

use crate::error::ApiError;
use crate::openai::request::bad;
use serde_json::{json, Map, Value};

/// Responses fields this translation consumes; every other key passes through.
const OWN: [&str; 26] = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_logprobs",
    "stream",
    "store",
    "previous_response_id",
    "metadata",
    "user",
    "truncation",
    "include",
    "background",
    "service_tier",
    "prompt",
    "conversation",
    "prompt_cache_key",
    "safety_identifier",
    "max_tool_calls",
];

/// Chat fields whose errors name their Responses field instead.
pub const RENAMED: [(&str, &str); 3] =
    [("max_completion_tokens", "max_output_tokens"), ("messages", "input"), ("response_format", "text.format")];

/// A translated request.
#[derive(Debug)]
pub struct Translated {
    /// The chat body to validate and run.
    pub chat: Value,
    /// This request's input as chat messages (without `instructions`, which a continuation does
    /// not inherit): stored with the output for `previous_response_id`.
    pub input: Vec<Value>,
    /// The request settings the response object shows, with the Responses API's defaults.
    pub settings: Map<String, Value>,
    pub store: bool,
    /// `include` asked for the output text's logprobs (or `top_logprobs` was given).
    pub logprobs: bool,
}

/// The chat body of a Responses body; `history` is the stored conversation of
/// `previous_response_id` (empty without one).
pub fn to_chat(body: &Map<String, Value>, history: &[Value]) -> Result<Translated, ApiError> {
    for (field, why) in [
        ("background", "background responses are not supported"),
        ("prompt", "prompt templates are not supported: send `input` and `instructions`"),
        ("conversation", "the Conversations API is not supported: chain with `previous_response_id`"),
    ] {
        if body.get(field).is_some_and(|v| !v.is_null() && *v != Value::Bool(false)) {
            return Err(bad(field, why));
        }
    }
    let mut chat = Map::new();
    for (k, v) in body {
        if !OWN.contains(&k.as_str()) {
            chat.insert(k.clone(), v.clone());
        }
    }
    let get = |k: &str| body.get(k).filter(|v| !v.is_null());
    for k in ["model", "temperature", "top_p", "stream", "parallel_tool_calls"] {
        if let Some(v) = get(k) {
            chat.insert(k.into(), v.clone());
        }
    }
    if let Some(v) = get("max_output_tokens") {
        chat.insert("max_completion_tokens".into(), v.clone());
    }
    let stream = get("stream").and_then(Value::as_bool).unwrap_or(false);
    if stream {
        // The final `response.completed` reports the usage.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let include: Vec<&str> = match get("include") {
        None => Vec::new(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        Some(_) => return Err(bad("include", "include must be a list of strings")),
    };
    let logprobs = include.contains(&"message.output_text.logprobs") || get("top_logprobs").is_some();
    if logprobs {
        chat.insert("logprobs".into(), Value::Bool(true));
        if let Some(k) = get("top_logprobs") {
            chat.insert("top_logprobs".into(), k.clone());
        }
    }
    let mut messages = Vec::new();
    if let Some(instructions) = get("instructions") {
        let Value::String(text) = instructions else {
            return Err(bad("instructions", "instructions must be a string"));
        };
        messages.push(json!({"role": "system", "content": text}));
    }
    messages.extend(history.iter().cloned());
    let input = match get("input") {
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(items)) => items_to_messages(items)?,
        _ => return Err(bad("input", "input must be a string or a list of input items")),
    };
    if input.is_empty() && history.is_empty() {
        return Err(bad("input", "input must not be empty"));
    }
    messages.extend(input.iter().cloned());
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = get("tools") {
        let tools = self::tools(tools)?;
        if !tools.as_array().is_some_and(Vec::is_empty) {
            chat.insert("tools".into(), tools);
        }
    }
    if let Some(choice) = get("tool_choice") {
        chat.insert("tool_choice".into(), tool_choice(choice)?);
    }
    if let Some(format) = get("text").and_then(|t| t.get("format")).filter(|f| !f.is_null()) {
        if let Some(rf) = response_format(format)? {
            chat.insert("response_format".into(), rf);
        }
    }
    if let Some(effort) = get("reasoning").and_then(|r| r.get("effort")).filter(|e| !e.is_null()) {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    let store = match get("store") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("store", "store must be a boolean")),
    };
    if let Some(m) = get("metadata") {
        let ok = m
            .as_object()
            .is_some_and(|o| o.len() <= 16 && o.values().all(|v| v.as_str().is_some_and(|s| s.len() <= 512)));
        if !ok {
            return Err(bad("metadata", "metadata is at most 16 string values of at most 512 characters"));
        }
    }
    let settings = settings(body, store)?;
    Ok(Translated { chat: Value::Object(chat), input, settings, store, logprobs })
}

/// The request settings a response object shows, rebuilt from what was checked (so a stored
/// response holds nothing a request could pad it with), with the Responses API's defaults.
fn settings(body: &Map<String, Value>, store: bool) -> Result<Map<String, Value>, ApiError> {
    let get = |k: &str| body.get(k).filter(|v| !v.is_null());
    let short = |k: &str, max: usize| -> Result<Value, ApiError> {
        match get(k) {
            None => Ok(Value::Null),
            Some(Value::String(s)) if s.len() <= max => Ok(Value::String(s.clone())),
            Some(_) => Err(bad(k, format!("{k} must be a string of at most {max} characters"))),
        }
    };
    let truncation = match get("truncation").and_then(Value::as_str) {
        None => "disabled",
        Some(t @ ("auto" | "disabled")) => t,
        Some(_) => return Err(bad("truncation", "truncation must be \"auto\" or \"disabled\"")),
    };
    let reasoning = get("reasoning");
    let reasoning_part = |k: &str| -> Result<Value, ApiError> {
        match reasoning.and_then(|r| r.get(k)).filter(|v| !v.is_null()) {
            None => Ok(Value::Null),
            Some(Value::String(s)) if s.len() <= 32 => Ok(Value::String(s.clone())),
            Some(_) => Err(bad(&format!("reasoning.{k}"), format!("reasoning.{k} must be a short string"))),
        }
    };
    let format = get("text").and_then(|t| t.get("format")).filter(|f| !f.is_null()).cloned();
    let tools: Vec<Value> = get("tools")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|t| {
                    let mut f = json!({"type": "function"});
                    for k in ["name", "description", "parameters", "strict"] {
                        if let Some(v) = t.get(k) {
                            f[k] = v.clone();
                        }
                    }
                    f
                })
                .collect()
        })
        .unwrap_or_default();
    let tool_choice = match get("tool_choice") {
        None => json!("auto"),
        Some(Value::String(s)) => json!(s),
        Some(o) => json!({"type": "function", "name": o.get("name")}),
    };
    let mut out = Map::new();
    out.insert("instructions".into(), get("instructions").cloned().unwrap_or(Value::Null));
    out.insert("max_output_tokens".into(), get("max_output_tokens").cloned().unwrap_or(Value::Null));
    out.insert("metadata".into(), get("metadata").cloned().unwrap_or_else(|| json!({})));
    out.insert("parallel_tool_calls".into(), get("parallel_tool_calls").cloned().unwrap_or(Value::Bool(false)));
    out.insert("previous_response_id".into(), get("previous_response_id").cloned().unwrap_or(Value::Null));
    out.insert("reasoning".into(), json!({"effort": reasoning_part("effort")?, "summary": reasoning_part("summary")?}));
    out.insert("store".into(), Value::Bool(store));
    out.insert("temperature".into(), get("temperature").cloned().unwrap_or(json!(1.0)));
    out.insert("text".into(), json!({"format": format.unwrap_or_else(|| json!({"type": "text"}))}));
    out.insert("tool_choice".into(), tool_choice);
    out.insert("tools".into(), Value::Array(tools));
    out.insert("top_logprobs".into(), get("top_logprobs").cloned().unwrap_or(Value::Null));
    out.insert("top_p".into(), get("top_p").cloned().unwrap_or(json!(1.0)));
    out.insert("truncation".into(), json!(truncation));
    out.insert("user".into(), short("user", 256)?);
    out.insert("background".into(), Value::Bool(false));
    Ok(out)
}

/// The text of a message's content: a string, or `input_text` / `output_text` / `text` /
/// `refusal` parts.
fn content_text(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let text = match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => p.get("text").and_then(Value::as_str),
                    Some("refusal") => p.get("refusal").and_then(Value::as_str),
                    Some(other) => {
                        return Err(bad(
                            &format!("{at}.content.{j}"),
                            format!("content parts of type {other:?} are not supported"),
                        ))
                    }
                    None => None,
                };
                out.push(
                    text.ok_or_else(|| bad(&format!("{at}.content.{j}"), "a content part needs its text"))?.to_string(),
                );
            }
            Ok(out.join("\n"))
        }
        _ => Err(bad(&format!("{at}.content"), "content must be a string or a list of content parts")),
    }
}

/// Input items as chat messages.
fn items_to_messages(items: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input.{i}");
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some(r @ ("user" | "system" | "developer" | "assistant")) => r,
                    _ => return Err(bad(&format!("{at}.role"), "role must be user, system, developer or assistant")),
                };
                let text = content_text(item.get("content").unwrap_or(&Value::Null), &at)?;
                out.push(json!({"role": role, "content": text}));
            }
            "function_call" => {
                let name =
                    item.get("name").and_then(Value::as_str).ok_or_else(|| bad(&at, "a function_call needs a name"))?;
                let call_id = item.get("call_id").and_then(Value::as_str).unwrap_or_default();
                let arguments = item.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                let call =
                    json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                // Calls made in one turn belong to one assistant message.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        let calls = last.as_object_mut().map(|o| o.entry("tool_calls").or_insert_with(|| json!([])));
                        if let Some(Value::Array(calls)) = calls {
                            calls.push(call);
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let call_id = item.get("call_id").and_then(Value::as_str).unwrap_or_default();
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other @ Value::Array(_)) => content_text(&json!({"content": other})["content"], &at)?,
                    _ => return Err(bad(&format!("{at}.output"), "a function_call_output needs its output")),
                };
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            // Reasoning of an earlier turn is not shown to the model again (as vLLM).
            "reasoning" => {}
            other => {
                return Err(bad(&format!("{at}.type"), format!("input items of type {other:?} are not supported")))
            }
        }
    }
    Ok(out)
}

/// Function tools (`{type: "function", name, description, parameters, strict}`) as chat tools.
fn tools(v: &Value) -> Result<Value, ApiError> {
    let Value::Array(items) = v else { return Err(bad("tools", "tools must be a list")) };
    let mut out = Vec::with_capacity(items.len());
    for (i, t) in items.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(bad(
                    &format!("tools.{i}"),
                    format!("tools of type {other:?} are not supported: define function tools"),
                ))
            }
            None => return Err(bad(&format!("tools.{i}.type"), "a tool needs a type")),
        }
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(&format!("tools.{i}.name"), "a function tool needs a name"))?;
        let mut f = json!({"name": name, "parameters": t.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}))});
        if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
            f["description"] = d.clone();
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

fn tool_choice(v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::String(s) if ["auto", "none", "required"].contains(&s.as_str()) => Ok(v.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice.name", "a function tool choice needs a name"))?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(bad(
            "tool_choice",
            "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\"}",
        )),
    }
}

/// `text.format` as chat's `response_format` (none for plain text).
fn response_format(f: &Value) -> Result<Option<Value>, ApiError> {
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = f
                .get("schema")
                .cloned()
                .ok_or_else(|| bad("text.format.schema", "a json_schema format needs a schema"))?;
            let mut js = json!({"name": f.get("name").cloned().unwrap_or(json!("response")), "schema": schema});
            if let Some(strict) = f.get("strict").filter(|s| !s.is_null()) {
                js["strict"] = strict.clone();
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        _ => Err(bad("text.format", "text.format.type must be text, json_object or json_schema")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value, history: &[Value]) -> Translated {
        to_chat(body.as_object().unwrap(), history).unwrap_or_else(|e| panic!("{}: {body}", e.message))
    }

    #[test]
    fn items_become_the_conversation_they_mean() {
        let t = chat(
            json!({"model": "m", "instructions": "Be brief.", "max_output_tokens": 30, "priority": 1,
                   "input": [
                       {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                       {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                       {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                       {"type": "reasoning", "summary": []},
                   ],
                   "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
                   "tool_choice": {"type": "function", "name": "get_weather"},
                   "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}}}),
            &[json!({"role": "user", "content": "earlier"})],
        );
        let c = &t.chat;
        assert_eq!((c["max_completion_tokens"].clone(), c["priority"].clone()), (json!(30), json!(1)));
        let m = c["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[1],
            json!({"role": "user", "content": "earlier"}),
            "the stored conversation follows the instructions"
        );
        assert_eq!(m[2], json!({"role": "user", "content": "Weather?"}));
        assert_eq!(m[3]["tool_calls"].as_array().unwrap().len(), 2, "one assistant turn holds both calls");
        assert_eq!(m[4], json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}));
        assert_eq!(m.len(), 5);
        assert_eq!(c["tool_choice"], json!({"type": "function", "function": {"name": "get_weather"}}));
        assert_eq!(
            c["response_format"]["json_schema"],
            json!({"name": "w", "schema": {"type": "object"}, "strict": true})
        );
        assert_eq!(t.input.len(), 3, "the instructions are not part of the stored input");
        assert!(t.store && !t.logprobs);
        assert_eq!(t.settings["instructions"], "Be brief.");
        assert_eq!(t.settings["top_p"], 1.0);
    }

    #[test]
    fn text_input_logprobs_and_refusals() {
        let t = chat(
            json!({"input": "hi", "store": false, "include": ["message.output_text.logprobs"], "top_logprobs": 2, "stream": true}),
            &[],
        );
        assert_eq!(t.chat["messages"], json!([{"role": "user", "content": "hi"}]));
        assert_eq!((t.chat["logprobs"].clone(), t.chat["top_logprobs"].clone()), (json!(true), json!(2)));
        assert_eq!(t.chat["stream_options"], json!({"include_usage": true}));
        assert!(!t.store && t.logprobs);
        let err = |body: Value| to_chat(body.as_object().unwrap(), &[]).unwrap_err().param.unwrap();
        assert_eq!(err(json!({"input": "x", "background": true})), "background");
        assert_eq!(
            err(json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})),
            "input.0.content.0"
        );
        assert_eq!(err(json!({"input": "x", "tools": [{"type": "web_search"}]})), "tools.0");
        assert_eq!(err(json!({"input": [{"type": "item_reference", "id": "x"}]})), "input.0.type");
        assert_eq!(err(json!({"input": []})), "input");
        assert_eq!(err(json!({"input": "x", "text": {"format": {"type": "yaml"}}})), "text.format");
        // What the response repeats is rebuilt from checked values: nothing to pad it with.
        assert_eq!(err(json!({"input": "x", "user": "u".repeat(300)})), "user");
        assert_eq!(err(json!({"input": "x", "truncation": "sometimes"})), "truncation");
        let t = chat(
            json!({"input": "x", "text": {"format": {"type": "text"}, "junk": "j"},
                            "tools": [{"type": "function", "name": "f", "junk": "j"}]}),
            &[],
        );
        assert_eq!(t.settings["text"], json!({"format": {"type": "text"}}));
        assert_eq!(t.settings["tools"], json!([{"type": "function", "name": "f"}]));
    }
}
