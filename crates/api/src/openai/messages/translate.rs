//! An Anthropic Messages body into the chat-completions body it means, as vLLM's Anthropic
//! front translates it: `system` becomes the first message, content blocks become chat content,
//! `tool_use` blocks an assistant's `tool_calls`, `tool_result` blocks `tool` messages, and
//! `tools`/`tool_choice`/`stop_sequences`/`thinking` their chat equivalents. Fields Anthropic does
//! not define (vLLM's extras: `return_token_ids`, `logprobs`, `priority`, ...) pass through.

use crate::error::ApiError;
use crate::openai::request::bad;
use serde_json::{json, Map, Value};

/// The Anthropic fields this translation consumes (or, for the platform's own settings such as
/// `container`, `speed` or `inference_geo`, ignores); every other key passes through.
const OWN: [&str; 22] = [
    "output_config",
    "cache_control",
    "container",
    "diagnostics",
    "inference_geo",
    "service_tier",
    "speed",
    "user_profile_id",
    "workspace_id",
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
    "metadata",
    "temperature",
    "top_p",
    "top_k",
];

/// Chat fields whose errors name their Anthropic field instead.
pub const RENAMED: [(&str, &str); 4] = [
    ("max_completion_tokens", "max_tokens"),
    ("stop", "stop_sequences"),
    ("parallel_tool_calls", "tool_choice"),
    ("response_format", "output_config.format"),
];

/// The chat body of a Messages body.
pub fn to_chat(body: &Map<String, Value>) -> Result<Value, ApiError> {
    let mut chat = Map::new();
    for (k, v) in body {
        if !OWN.contains(&k.as_str()) {
            chat.insert(k.clone(), v.clone());
        }
    }
    for k in ["model", "temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = body.get(k) {
            chat.insert(k.into(), v.clone());
        }
    }
    match body.get("max_tokens") {
        Some(v) if !v.is_null() => chat.insert("max_completion_tokens".into(), v.clone()),
        _ => return Err(bad("max_tokens", "max_tokens is required")),
    };
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        // The closing `message_delta` reports the output tokens.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(stops) = body.get("stop_sequences").filter(|v| !v.is_null()) {
        chat.insert("stop".into(), stops.clone());
    }
    let mut messages = Vec::new();
    if let Some(system) = body.get("system").filter(|v| !v.is_null()) {
        messages.push(json!({"role": "system", "content": text_of(system, "system")?}));
    }
    let Some(Value::Array(items)) = body.get("messages") else {
        return Err(bad("messages", "messages must be a list of {role, content}"));
    };
    for (i, m) in items.iter().enumerate() {
        message(m, &format!("messages.{i}"), &mut messages)?;
    }
    // A last assistant turn is a prefill: the reply continues it (Anthropic's rule).
    if items.last().and_then(|m| m.get("role")).and_then(Value::as_str) == Some("assistant") {
        chat.insert("add_generation_prompt".into(), Value::Bool(false));
        chat.insert("continue_final_message".into(), Value::Bool(true));
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), self::tools(tools)?);
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        let (choice, parallel) = tool_choice(choice)?;
        chat.insert("tool_choice".into(), choice);
        if let Some(p) = parallel {
            chat.insert("parallel_tool_calls".into(), Value::Bool(p));
        }
    }
    if let Some(t) = body.get("thinking").filter(|v| !v.is_null()) {
        let enabled = match t.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive" | "between_tools") => true,
            Some("disabled") => false,
            _ => return Err(bad("thinking", "thinking.type must be enabled, adaptive, between_tools or disabled")),
        };
        // Reasoning is split off only with a reasoning parser; `disabled` drops it.
        chat.insert("include_reasoning".into(), Value::Bool(enabled));
        let kwargs = chat.entry("chat_template_kwargs").or_insert_with(|| json!({}));
        if let Some(k) = kwargs.as_object_mut() {
            k.insert("enable_thinking".into(), Value::Bool(enabled));
        }
    }
    if let Some(config) = body.get("output_config").filter(|v| !v.is_null()) {
        if let Some(effort) = config.get("effort").filter(|e| !e.is_null()) {
            chat.insert("reasoning_effort".into(), effort.clone());
        }
        if let Some(format) = config.get("format").filter(|f| !f.is_null()) {
            let schema = match (format.get("type").and_then(Value::as_str), format.get("schema")) {
                (Some("json_schema"), Some(schema)) => schema.clone(),
                _ => {
                    return Err(bad(
                        "output_config.format",
                        "output_config.format must be {\"type\": \"json_schema\", \"schema\"}",
                    ))
                }
            };
            chat.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
            );
            // Compact JSON: Anthropic's API has no whitespace option, and free whitespace lets a
            // sampled model spend max_tokens on blank lines before the JSON closes. A caller's own
            // `structured_outputs` (vLLM's extra) still decides.
            chat.entry("structured_outputs").or_insert_with(|| json!({"disable_any_whitespace": true}));
        }
    }
    Ok(Value::Object(chat))
}

/// A string, or a list of text blocks, as text.
fn text_of(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => parts.push(t.to_string()),
                    _ => return Err(bad(&format!("{field}.{i}"), "only text blocks are supported here")),
                }
            }
            Ok(parts.join("\n"))
        }
        _ => Err(bad(field, "must be a string or a list of text blocks")),
    }
}

/// One Anthropic message as chat messages (a user turn's tool results come first, as `tool`
/// messages).
fn message(m: &Value, at: &str, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        _ => return Err(bad(&format!("{at}.role"), "role must be \"user\" or \"assistant\"")),
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => return Err(bad(&format!("{at}.content"), "content must be a string or a list of content blocks")),
    };
    let (mut text, mut calls, mut thinking) = (Vec::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{at}.content.{j}");
        match (role, b.get("type").and_then(Value::as_str)) {
            (_, Some("text")) => text.push(
                b.get("text").and_then(Value::as_str).ok_or_else(|| bad(&here, "a text block needs text"))?.to_string(),
            ),
            ("assistant", Some("tool_use")) => {
                let id = b.get("id").and_then(Value::as_str).unwrap_or_default();
                let name =
                    b.get("name").and_then(Value::as_str).ok_or_else(|| bad(&here, "a tool_use block needs a name"))?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}),
                );
            }
            ("assistant", Some("thinking")) => {
                thinking.push(b.get("thinking").and_then(Value::as_str).unwrap_or_default().to_string())
            }
            ("assistant", Some("redacted_thinking")) => {}
            ("user", Some("tool_result")) => {
                let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or_default();
                let mut content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{here}.content"))?,
                };
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    content = format!("Error: {content}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (_, Some(other)) => {
                return Err(bad(
                    &here,
                    format!("content blocks of type {other:?} are not supported in a {role} message"),
                ))
            }
            (_, None) => return Err(bad(&here, "a content block needs a type")),
        }
    }
    if text.is_empty() && calls.is_empty() && role == "user" && !blocks.is_empty() {
        // Only tool results: they are the turn.
        return Ok(());
    }
    let mut msg = json!({"role": role, "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text.join("\n")) }});
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    if !thinking.is_empty() {
        // Under both names templates read (vLLM's `reasoning`, Qwen3's `reasoning_content`).
        msg["reasoning"] = Value::String(thinking.join("\n"));
        msg["reasoning_content"] = msg["reasoning"].clone();
    }
    out.push(msg);
    Ok(())
}

/// Anthropic tools (`{name, description, input_schema}`) as chat function tools.
fn tools(v: &Value) -> Result<Value, ApiError> {
    let Value::Array(items) = v else { return Err(bad("tools", "tools must be a list")) };
    let mut out = Vec::with_capacity(items.len());
    for (i, t) in items.iter().enumerate() {
        if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
            return Err(bad(
                &format!("tools.{i}"),
                format!("server tools ({kind}) are not supported: define custom tools"),
            ));
        }
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(&format!("tools.{i}.name"), "a tool needs a name"))?;
        let mut f = json!({"name": name, "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"}))});
        if let Some(d) = t.get("description") {
            f["description"] = d.clone();
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// `tool_choice` (`auto`, `any`, `tool` with a name, `none`) and `disable_parallel_tool_use`.
fn tool_choice(v: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let parallel = v.get("disable_parallel_tool_use").and_then(Value::as_bool).map(|d| !d);
    let choice = match v.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = v
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice.name", "a tool choice of type tool needs a name"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(bad("tool_choice", "tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}"))
        }
    };
    Ok((choice, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Value {
        to_chat(body.as_object().unwrap()).unwrap_or_else(|e| panic!("{}: {body}", e.message))
    }

    #[test]
    fn a_conversation_with_tools_becomes_the_chat_it_means() {
        let c = chat(json!({
        "model": "m", "max_tokens": 20, "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["END"], "temperature": 0.5, "top_k": 4, "priority": 2,
        "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "And?"}]},
        ]}));
        assert_eq!(c["max_completion_tokens"], 20);
        assert_eq!(
            (c["stop"].clone(), c["priority"].clone(), c["top_k"].clone()),
            (json!(["END"]), json!(2), json!(4))
        );
        assert_eq!(c["tool_choice"], "required");
        assert_eq!(c["parallel_tool_calls"], false);
        assert_eq!(c["tools"][0]["function"]["parameters"], json!({"type": "object"}));
        let m = c["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[2]["tool_calls"][0]["function"],
            json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
        );
        assert_eq!((m[2]["content"].clone(), m[2]["reasoning"].clone()), (json!("Checking."), json!("hm")));
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "t1", "content": "sunny"}));
        assert_eq!(m[4], json!({"role": "user", "content": "And?"}));
        assert!(c.get("system").is_none() && c.get("stop_sequences").is_none());
    }

    #[test]
    fn streaming_asks_for_usage_and_thinking_reaches_the_template() {
        let c = chat(json!({"max_tokens": 5, "stream": true, "thinking": {"type": "disabled"},
                             "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(c["stream_options"], json!({"include_usage": true}));
        assert_eq!(
            (c["include_reasoning"].clone(), c["chat_template_kwargs"]["enable_thinking"].clone()),
            (json!(false), json!(false))
        );
        // The newest SDK's output_config: a JSON schema and an effort; platform settings are dropped.
        let c = chat(json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "speed": "fast",
                             "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}},
                             "thinking": {"type": "adaptive"}}));
        assert_eq!(c["response_format"]["json_schema"]["schema"], json!({"type": "object"}));
        assert_eq!(c["structured_outputs"], json!({"disable_any_whitespace": true}));
        assert_eq!((c["reasoning_effort"].clone(), c["include_reasoning"].clone()), (json!("low"), json!(true)));
        assert!(c.get("speed").is_none() && c.get("output_config").is_none());
        // A last assistant turn is continued, not answered; an error result says so.
        let c = chat(json!({"max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": true}]},
            {"role": "assistant", "content": "The answer is"}]}));
        assert_eq!(
            (c["continue_final_message"].clone(), c["add_generation_prompt"].clone()),
            (json!(true), json!(false))
        );
        assert_eq!(c["messages"][0]["content"], "Error: boom");
    }

    #[test]
    fn what_cannot_be_translated_names_its_field() {
        let err = |body: Value| to_chat(body.as_object().unwrap()).unwrap_err().param.unwrap();
        let msgs = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(err(json!({"messages": msgs})), "max_tokens");
        assert_eq!(err(json!({"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]})), "messages.0.role");
        assert_eq!(
            err(json!({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})),
            "messages.0.content.0"
        );
        assert_eq!(
            err(json!({"max_tokens": 1, "messages": msgs, "tools": [{"type": "web_search_20250305", "name": "w"}]})),
            "tools.0"
        );
        assert_eq!(err(json!({"max_tokens": 1, "messages": msgs, "tool_choice": {"type": "maybe"}})), "tool_choice");
        assert_eq!(err(json!({"max_tokens": 1, "messages": "hi"})), "messages");
    }
}
