//! Tools for a template that does not render them: the tools and the reply format go into a
//! system message, in the syntax of the template's family (a template can show the call syntax
//! without taking `tools`, as DeepSeek V3's does) or tandem's generic one; in the generic format,
//! the history's calls are written back as the model would have written them.

use super::{name, parameters, Choice, ToolPlan};
use serde_json::{json, Value};
use tandem_core::chat::{ChatMessage, Content};
use tandem_core::inference::ChatRender;
use tandem_core::tool_calls::Family;

/// Describes the tools in the first system message and, for the generic format, rewrites the
/// history's calls.
pub(super) fn describe(plan: &ToolPlan, family: Family, render: &mut ChatRender) {
    inject_system(render, &system_text(plan, family));
    if family == Family::Generic {
        render.messages = render.messages.iter().map(history).collect();
    }
}

/// The instructions: the tools, then how to call them.
fn system_text(plan: &ToolPlan, family: Family) -> String {
    let list: Vec<String> = plan
        .functions
        .iter()
        .map(|f| json!({"name": name(f), "description": f.get("description").cloned().unwrap_or(Value::Null), "parameters": parameters(f)}).to_string())
        .collect();
    let shape = |n: &str| family.write(&[(n, "<arguments object>")]);
    let any = shape("<tool name>");
    let only = if family == Family::Generic { "only " } else { "" };
    let how = match &plan.choice {
        Choice::Auto => format!("To call tools, reply with {only}{any}. Otherwise reply in plain text."),
        Choice::Required => format!("Reply with {only}{any}, calling at least one tool."),
        Choice::Named(n) => format!("Call the tool {n}: reply with {only}{}.", shape(n)),
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

/// An assistant's `tool_calls` become the calls object it would have written; `tool` messages
/// keep their role with their text content.
fn history(m: &ChatMessage) -> ChatMessage {
    let Some(calls) = m.tool_calls() else { return m.clone() };
    let calls: Vec<(String, String)> = calls
        .iter()
        .map(|c| {
            let f = c.get("function").unwrap_or(&Value::Null);
            let args = match f.get("arguments") {
                Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| json!(s)),
                Some(v) => v.clone(),
                None => json!({}),
            };
            (f.get("name").and_then(Value::as_str).unwrap_or_default().to_string(), args.to_string())
        })
        .collect();
    let pairs: Vec<(&str, &str)> = calls.iter().map(|(n, a)| (n.as_str(), a.as_str())).collect();
    let object = Family::Generic.write(&pairs);
    let text = m.text();
    let mut out = m.clone();
    out.content = Content::Text(if text.trim().is_empty() { object } else { format!("{text}\n{object}") });
    out.extra.remove("tool_calls");
    out
}
