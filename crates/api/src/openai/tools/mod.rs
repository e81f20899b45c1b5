//! Tool calling: request validation, the prompt and constraint of each choice, and reading the
//! calls back out of the output.
//!
//! The call syntax is the model family's own ([`Family`], read off the chat template): Hermes and
//! Qwen `<tool_call>`, Llama 3 JSON, Mistral `[TOOL_CALLS]`, DeepSeek's call tokens, or tandem's
//! generic `{"tool_calls": [...]}` object for templates that show none (the bundled SmolLM2's,
//! Gemma 3's), as llama.cpp does for templates without tool support.
//!
//! - **Prompt**: a template that renders `tools` gets them; otherwise the tools and the reply
//!   format are described in a system message ([`generic`]).
//! - **Constraint** ([`grammar`](tandem_core::tool_calls::grammar)): `required` and a named choice hold the reply to the family's
//!   syntax (a named choice writes the name itself), `auto` lets text run free until the model
//!   opens a call and then holds the call to the syntax.
//! - **Reading back**: [`tandem_core::tool_calls::scan`], whole or while streaming.

mod generic;
mod stream;

pub use stream::{Piece, Streamed};
pub use tandem_core::tool_calls::{Choice, ToolPlan};

use super::request::bad;
use crate::error::ApiError;
use serde_json::{json, Map, Value};
use tandem_core::inference::{ChatRender, Constraint, ToolTemplate};
use tandem_core::tool_calls::{grammar, name, parameters, scan, Family};

/// The most tools a request may give.
pub const MAX_TOOLS: usize = 128;

/// What the renderer needs: how to read the output back, and what the choice promised.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolMode {
    pub family: Family,
    pub choice: Choice,
    pub parallel: bool,
    /// The tools' names (a bare JSON object is a call only when it names one).
    pub names: Vec<String>,
}

impl ToolMode {
    pub fn names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// The reply is calls only (`required` or a named choice).
    pub fn forced(&self) -> bool {
        self.choice != Choice::Auto
    }
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
    // Absent, one call per reply, as llama.cpp defaults (OpenAI's default is several): held to
    // its own syntax by `required`, a small model that is not sure it is done writes the same
    // call again and again until `max_tokens` (vLLM's issues report it). Clients that want
    // several calls in one reply say so.
    let parallel = match get("parallel_tool_calls") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("parallel_tool_calls", "parallel_tool_calls must be a boolean")),
    };
    let mut functions = Vec::new();
    if let Some(t) = tools {
        let Value::Array(items) = t else { return Err(bad("tools", "tools must be a list.")) };
        // OpenAI's limit. Each tool is an alternative (and under `auto` a trigger) of the
        // request's grammar, compiled and masked for every token: unbounded, one request's list
        // could cost every other sequence on the engine step.
        if items.len() > MAX_TOOLS {
            return Err(bad("tools", format!("at most {MAX_TOOLS} tools may be given, not {}", items.len())));
        }
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

/// Prepares the render and the constraint of `plan` for the template; `reply` is the request's
/// structured output, which a reply without calls must match.
pub(super) fn apply(
    plan: &ToolPlan,
    template: ToolTemplate,
    render: &mut ChatRender,
    reply: Option<&Constraint>,
) -> Result<(Constraint, ToolMode), ApiError> {
    let family = template.family;
    if template.renders_tools {
        render.tools =
            Some(Value::Array(plan.functions.iter().map(|f| json!({"type": "function", "function": f})).collect()));
    } else {
        generic::describe(plan, family, render);
    }
    let names = plan.functions.iter().map(|f| name(f).to_string()).collect();
    let mode = ToolMode { family, choice: plan.choice.clone(), parallel: plan.parallel, names };
    let field = reply.map_or("tools", |r| r.field.as_str());
    let constraint = grammar::constraint(plan, family, reply).map_err(|e| bad(field, e))?;
    Ok((constraint, mode))
}

/// The calls in a finished output, and the text left as content (`None` when there is none).
/// Output that holds no whole call is all content.
pub fn parse(mode: &ToolMode, text: &str) -> (Option<String>, Vec<Call>) {
    let found = scan(mode.family, text, true, &mode.names());
    if found.calls.is_empty() {
        return (Some(text.to_string()), Vec::new());
    }
    let mut calls: Vec<Call> =
        found.calls.into_iter().map(|c| Call { name: c.name.unwrap_or_default(), arguments: c.arguments }).collect();
    if !mode.parallel {
        calls.truncate(1);
    }
    (content_before(mode, &text[..found.content_end]), calls)
}

/// The content of a reply with calls: the text before them, or none (an empty string for a
/// forced choice, as vLLM answers those).
pub fn content_before(mode: &ToolMode, before: &str) -> Option<String> {
    if !before.trim().is_empty() {
        Some(before.to_string())
    } else if mode.forced() {
        Some(String::new())
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
