//! Tool calling: request validation, the two ways a model gets tools, and parsing its output.
//!
//! - **Template path**: the chat template renders `tools` itself (checked by rendering a probe).
//!   `auto` output is parsed with the Hermes format (`<tool_call>{"name", "arguments"}</tool_call>`,
//!   what ChatML models with tool templates emit); other formats plug in as more [`Format`]s.
//! - **Generic path**, for templates that ignore `tools` (the bundled SmolLM2's): the tools and
//!   the reply format are described in a system message, and the reply is constrained to either a
//!   `{"tool_calls": [{"name", "arguments"}]}` object or plain text (`auto`), such an object
//!   (`required`), or the named function's arguments (named), as llama.cpp does for templates
//!   without tool support.
//!
//! On both paths `required` and a named choice are enforced by a JSON-schema constraint, so the
//! arguments always parse and match the function's `parameters` (vLLM 0.11 does the same).

use super::request::bad;
use crate::error::ApiError;
use serde_json::{json, Map, Value};
use tandem_core::chat::{ChatMessage, Content};
use tandem_core::inference::{ChatRender, Constraint, ConstraintKind};

/// `tool_choice`, once validated.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    Auto,
    Required,
    Named(String),
}

/// The request's tools, when the output is to be parsed for calls.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    pub choice: Choice,
    /// The `function` objects of `tools`.
    pub functions: Vec<Map<String, Value>>,
    pub parallel: bool,
}

/// How a finished output is read back.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// The whole output is the named function's arguments.
    Arguments(String),
    /// `{"tool_calls": [...]}`, or (`auto`) plain text.
    Generic { required: bool },
    /// Hermes `<tool_call>` blocks around JSON, with text before them as content.
    Hermes,
}

/// What the renderer needs: the format and whether to keep more than one call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolMode {
    pub format: Format,
    pub parallel: bool,
}

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// Validates `tools`, `tool_choice` and `parallel_tool_calls` (vLLM's rules and messages).
/// `tool_choice: "none"` passes the tools to the template and parses nothing.
pub(super) fn validate(obj: &Map<String, Value>, render: &mut ChatRender) -> Result<Option<ToolPlan>, ApiError> {
    let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let tools = get("tools");
    let choice = get("tool_choice");
    let parallel = match get("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("parallel_tool_calls", "parallel_tool_calls must be a boolean")),
    };
    let mut functions = Vec::new();
    if let Some(t) = tools {
        let Value::Array(items) = t else { return Err(bad("tools", "tools must be a list.")) };
        if items.is_empty() {
            return Err(bad(
                "tools",
                "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
            ));
        }
        for item in items {
            let f = item
                .get("function")
                .and_then(Value::as_object)
                .filter(|_| item.get("type").and_then(Value::as_str).unwrap_or("function") == "function")
                .ok_or_else(|| bad("tools", "each tool is {\"type\": \"function\", \"function\": {\"name\", ...}}"))?;
            let name = f.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty()
                || name.len() > 64
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(bad("tools", format!("invalid function name {name:?}: 1-64 of a-z, A-Z, 0-9, _ and -")));
            }
            if let Some(p) = f.get("parameters").filter(|p| !p.is_null() && !p.is_object()) {
                return Err(bad("tools", format!("the parameters of {name} must be a JSON schema object, not {p}")));
            }
            functions.push(f.clone());
        }
    }
    let choice = match (tools, choice) {
        (None, Some(c)) if c.as_str() != Some("none") => {
            return Err(bad("tool_choice", "When using `tool_choice`, `tools` must be set."))
        }
        (None, _) => return Ok(None),
        (Some(t), Some(Value::String(s))) if s == "none" => {
            render.tools = Some(t.clone());
            return Ok(None);
        }
        (Some(_), None) => Choice::Auto,
        (Some(_), Some(Value::String(s))) => match s.as_str() {
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!("Invalid value for `tool_choice`: {other}! Only named tools, \"none\", \"auto\" or \"required\" are supported."),
                ))
            }
        },
        (Some(_), Some(named)) => {
            let name = named
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad("tool_choice", "Expected field `name` in `function` of a named `tool_choice`"))?;
            if !functions.iter().any(|f| f.get("name").and_then(Value::as_str) == Some(name)) {
                return Err(bad("tool_choice", "The tool specified in `tool_choice` does not match any of the specified `tools`"));
            }
            Choice::Named(name.to_string())
        }
    };
    Ok(Some(ToolPlan { choice, functions, parallel }))
}

fn name(f: &Map<String, Value>) -> &str {
    f.get("name").and_then(Value::as_str).unwrap_or_default()
}

fn parameters(f: &Map<String, Value>) -> Value {
    f.get("parameters")
        .filter(|p| p.is_object())
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}))
}

/// The `{"tool_calls": [...]}` schema: each call names one tool and carries its parameters.
fn calls_schema(plan: &ToolPlan) -> Value {
    let variants: Vec<Value> = plan
        .functions
        .iter()
        .map(|f| {
            json!({"type": "object", "properties": {"name": {"const": name(f)}, "arguments": parameters(f)},
                   "required": ["name", "arguments"], "additionalProperties": false})
        })
        .collect();
    let mut calls = json!({"type": "array", "items": {"anyOf": variants}, "minItems": 1});
    if !plan.parallel {
        calls["maxItems"] = json!(1);
    }
    json!({"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"], "additionalProperties": false})
}

/// Prepares the render and the constraint for the path the template calls for.
pub(super) fn apply(
    plan: &ToolPlan,
    template_renders_tools: bool,
    render: &mut ChatRender,
) -> (Option<Constraint>, ToolMode) {
    let constraint = |kind, field: &str| Constraint {
        kind,
        disable_any_whitespace: false,
        disable_additional_properties: false,
        whitespace_pattern: None,
        field: field.to_string(),
        after_reasoning: None,
    };
    let mode = |format| ToolMode { format, parallel: plan.parallel };
    if template_renders_tools {
        render.tools =
            Some(Value::Array(plan.functions.iter().map(|f| json!({"type": "function", "function": f})).collect()));
        return match &plan.choice {
            Choice::Named(n) => {
                let f = plan.functions.iter().find(|f| name(f) == n).expect("validated");
                (
                    Some(constraint(ConstraintKind::Json(parameters(f)), "tool_choice")),
                    mode(Format::Arguments(n.clone())),
                )
            }
            Choice::Required => (
                Some(constraint(ConstraintKind::Json(calls_schema(plan)), "tools")),
                mode(Format::Generic { required: true }),
            ),
            Choice::Auto => (None, mode(Format::Hermes)),
        };
    }
    inject_system(render, &system_text(plan));
    render.messages = render.messages.iter().map(generic_history).collect();
    match &plan.choice {
        Choice::Named(n) => {
            let f = plan.functions.iter().find(|f| name(f) == n).expect("validated");
            (Some(constraint(ConstraintKind::Json(parameters(f)), "tool_choice")), mode(Format::Arguments(n.clone())))
        }
        Choice::Required => (
            Some(constraint(ConstraintKind::Json(calls_schema(plan)), "tools")),
            mode(Format::Generic { required: true }),
        ),
        Choice::Auto => {
            // Plain text (not starting with `{`) or one calls object.
            let grammar = format!("start: text | calls\ntext: /[^{{](.|\\n)*/\ncalls: %json {}", calls_schema(plan));
            (Some(constraint(ConstraintKind::Grammar(grammar), "tools")), mode(Format::Generic { required: false }))
        }
    }
}

/// The generic path's instructions.
fn system_text(plan: &ToolPlan) -> String {
    let list: Vec<String> = plan
        .functions
        .iter()
        .map(|f| json!({"name": name(f), "description": f.get("description").cloned().unwrap_or(Value::Null), "parameters": parameters(f)}).to_string())
        .collect();
    let how = match &plan.choice {
        Choice::Auto => "To call tools, reply with only a JSON object {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]}. Otherwise reply in plain text.".to_string(),
        Choice::Required => "Reply with only a JSON object {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]} calling at least one tool.".to_string(),
        Choice::Named(n) => format!("Call the tool {n}: reply with only its arguments as a JSON object."),
    };
    format!("You can call these tools:\n{}\n{how}", list.join("\n"))
}

/// Appends the instructions to the first system message, or puts one first.
fn inject_system(render: &mut ChatRender, text: &str) {
    if let Some(first) = render.messages.first_mut().filter(|m| m.role == "system") {
        first.content = Content::Text(format!("{}\n\n{text}", first.text()));
    } else {
        render.messages.insert(0, ChatMessage::text_message("system", text));
    }
}

/// History in the generic format: an assistant's `tool_calls` become the JSON object it would have
/// written; `tool` messages keep their role with their text content.
fn generic_history(m: &ChatMessage) -> ChatMessage {
    let Some(calls) = m.tool_calls() else { return m.clone() };
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            let f = c.get("function").unwrap_or(&Value::Null);
            let args = match f.get("arguments") {
                Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| json!(s)),
                Some(v) => v.clone(),
                None => json!({}),
            };
            json!({"name": f.get("name").cloned().unwrap_or(Value::Null), "arguments": args})
        })
        .collect();
    let text = m.text();
    let object = json!({"tool_calls": calls}).to_string();
    let mut out = m.clone();
    out.content = Content::Text(if text.trim().is_empty() { object } else { format!("{text}\n{object}") });
    out.extra.remove("tool_calls");
    out
}

/// The calls in a finished output, and the text left as content (`None` when there is none).
/// Output that holds no call is all content.
pub fn parse(mode: &ToolMode, text: &str) -> (Option<String>, Vec<Call>) {
    let none = || (Some(text.to_string()), Vec::new());
    let (content, mut calls) = match &mode.format {
        Format::Arguments(n) => {
            if !serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()) {
                return none();
            }
            (Some(String::new()), vec![Call { name: n.clone(), arguments: text.trim().to_string() }])
        }
        Format::Generic { required } => {
            let parsed = serde_json::from_str::<Value>(text.trim()).ok();
            let items = parsed.as_ref().and_then(|v| v.get("tool_calls")).and_then(Value::as_array);
            let calls: Vec<Call> = items.map(|i| i.iter().filter_map(call_of).collect()).unwrap_or_default();
            (if *required { Some(String::new()) } else { None }, calls)
        }
        Format::Hermes => {
            let Some(start) = text.find("<tool_call>") else { return none() };
            let mut calls = Vec::new();
            let mut rest = &text[start..];
            while let Some(open) = rest.find("<tool_call>") {
                let body = &rest[open + "<tool_call>".len()..];
                let (inner, after) = match body.find("</tool_call>") {
                    Some(close) => (&body[..close], &body[close + "</tool_call>".len()..]),
                    None => (body, ""),
                };
                calls.extend(serde_json::from_str::<Value>(inner.trim()).ok().as_ref().and_then(call_of));
                rest = after;
            }
            let before = &text[..start];
            (if before.trim().is_empty() { None } else { Some(before.to_string()) }, calls)
        }
    };
    if calls.is_empty() {
        return none();
    }
    if !mode.parallel {
        calls.truncate(1);
    }
    (content, calls)
}

/// A call object, if it is one: a name, and arguments that are JSON (an object, or a string
/// holding one). Arguments that do not parse are no call, as in vLLM's parsers: clients parse
/// them (Anthropic's stream accumulator, strict Responses tools).
fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or_else(|| json!({}));
    let arguments = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).ok().filter(Value::is_object).map(|_| s)?,
        Value::Object(_) => args.to_string(),
        _ => return None,
    };
    Some(Call { name, arguments })
}

/// A tool-call id as vLLM writes them.
pub fn call_id() -> String {
    format!("chatcmpl-tool-{}", tandem_core::new_id().simple())
}

#[cfg(test)]
mod tests;
