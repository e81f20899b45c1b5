//! The constraint of each tool choice, in the model family's own syntax, as a structural tag
//! (xgrammar's format tree, which the engine compiles with llguidance):
//!
//! - `required`: the family's opener, one call (or several joined by its separator with
//!   `parallel_tool_calls`) of any tool, its closer, then the end;
//! - named: the same with one call of that tool, its name written by the constraint;
//! - `auto`: free text until the model writes the family's opener (the trigger), after which the
//!   rest of the call is held to the syntax, as llama.cpp's lazy grammars do; for the generic
//!   format, text that does not start with `{` or one calls object.
//!
//! With `response_format` beside tools (`auto`), the reply is either the calls or a text that
//! matches the format, as OpenAI serves it (pydantic-ai's `NativeOutput`, the openai-agents
//! SDK's `output_type` with tools); a forced choice is calls only, and the format does not apply.
//!
//! Each call's arguments follow that function's `parameters` with `additionalProperties: false`
//! where the schema says nothing (OpenAI's strict tools), and the blank space between JSON tokens
//! is one space or one newline and up to 20 spaces or tabs (llama.cpp's bound): a constrained
//! call never spends its budget on blank lines or keys the tool does not take.

use super::{name, parameters, Choice, Family, Syntax, ToolPlan};
use crate::inference::{Constraint, ConstraintKind};
use serde_json::{json, Map, Value};

/// The blank space allowed between JSON tokens inside a call.
pub const WHITESPACE: &str = "( |\\n[ \\t]{0,20})?";

/// The constraint of `plan`'s choice for `family`; `reply` is the request's `response_format`
/// (or other structured output), which an `auto` reply without calls must match.
pub fn constraint(plan: &ToolPlan, family: Family, reply: Option<&Constraint>) -> Result<Constraint, String> {
    let s = family.syntax();
    let tree = match (&plan.choice, reply) {
        (Choice::Auto, Some(reply)) => {
            json!({"type": "or", "elements": [element(reply)?, wrapped(&s, calls(&s, &plan.functions, plan.parallel))]})
        }
        _ => forced_or_free(plan, family)?,
    };
    Ok(Constraint {
        kind: ConstraintKind::StructuralTag(json!({"type": "structural_tag", "format": tree})),
        disable_any_whitespace: false,
        disable_additional_properties: true,
        whitespace_pattern: Some(WHITESPACE.to_string()),
        field: if matches!(plan.choice, Choice::Named(_)) { "tool_choice" } else { "tools" }.to_string(),
        after_reasoning: None,
    })
}

/// A structured output as a format-tree element.
fn element(c: &Constraint) -> Result<Value, String> {
    Ok(match &c.kind {
        ConstraintKind::Json(schema) => json!({"type": "json_schema", "json_schema": schema}),
        ConstraintKind::JsonObject => json!({"type": "json_schema", "json_schema": {"type": "object"}}),
        ConstraintKind::Regex(pattern) => json!({"type": "regex", "pattern": pattern}),
        ConstraintKind::Choice(choices) => {
            json!({"type": "or", "elements": choices.iter().map(|c| json!({"type": "const_string", "value": c})).collect::<Vec<_>>()})
        }
        ConstraintKind::Grammar(grammar) => json!({"type": "grammar", "grammar": grammar}),
        ConstraintKind::StructuralTag(_) => {
            return Err(format!("`{}` as a structural tag cannot be combined with tools", c.field))
        }
    })
}

fn forced_or_free(plan: &ToolPlan, family: Family) -> Result<Value, String> {
    let s = family.syntax();
    Ok(match &plan.choice {
        Choice::Named(n) => {
            let f = plan.functions.iter().find(|f| name(f) == n).expect("validated");
            ended(wrapped(&s, call(&s, f)))
        }
        Choice::Required => ended(wrapped(&s, calls(&s, &plan.functions, plan.parallel))),
        Choice::Auto if family == Family::Generic => json!({"type": "or", "elements": [
            {"type": "regex", "pattern": "[^{](.|\\n)*"},
            wrapped(&s, calls(&s, &plan.functions, plan.parallel)),
        ]}),
        Choice::Auto if s.open.is_empty() => {
            // Each call starts with a trigger: Hermes' `<tool_call>`, or a bare object naming a
            // tool (Llama's syntax; in Hermes the slip of leaving the tags out, which llama.cpp
            // also takes). The name is in the trigger so that JSON about anything else stays text.
            let mut triggers = Vec::new();
            let mut tags = Vec::new();
            if family == Family::Hermes {
                triggers.push(s.trigger.to_string());
                tags.extend(plan.functions.iter().map(|f| call(&s, f)));
            }
            let key = if family == Family::Llama3 { "parameters" } else { "arguments" };
            for f in &plan.functions {
                triggers.push(format!("{{\"name\": \"{}\"", name(f)));
                tags.push(bare(f, key));
            }
            json!({"type": "triggered_tags", "triggers": triggers, "tags": tags, "stop_after_first": !plan.parallel})
        }
        Choice::Auto => {
            // The opener starts with the trigger and holds every call of the reply.
            let tag = json!({"type": "tag", "begin": s.open, "content": calls(&s, &plan.functions, plan.parallel),
                             "end": s.close});
            json!({"type": "triggered_tags", "triggers": [s.trigger], "tags": [tag], "stop_after_first": true})
        }
    })
}

/// One call of `f`: its name fixed, its arguments by its parameters.
fn call(s: &Syntax, f: &Map<String, Value>) -> Value {
    json!({
        "type": "tag",
        "begin": format!("{}{}{}", s.call_begin, name(f), s.name_end),
        "content": {"type": "json_schema", "json_schema": parameters(f)},
        "end": s.call_end,
    })
}

/// A bare JSON call object of `f`.
fn bare(f: &Map<String, Value>, key: &str) -> Value {
    json!({
        "type": "tag",
        "begin": format!("{{\"name\": \"{}\", \"{key}\": ", name(f)),
        "content": {"type": "json_schema", "json_schema": parameters(f)},
        "end": "}",
    })
}

/// One call of any of `functions`, or (`parallel`) one or more joined by the separator.
fn calls(s: &Syntax, functions: &[Map<String, Value>], parallel: bool) -> Value {
    let tags: Vec<Value> = functions.iter().map(|f| call(s, f)).collect();
    if parallel {
        return json!({"type": "tags_with_separator", "tags": tags, "separator": s.separator, "at_least_one": true});
    }
    match <[Value; 1]>::try_from(tags) {
        Ok([one]) => one,
        Err(tags) => json!({"type": "or", "elements": tags}),
    }
}

/// Forced calls, then the end, after at most one newline. Models end a call's line as they end
/// any line: Qwen2.5's vocabulary has `>\n` as one token, likelier than `>`, so a constraint
/// that ends right at `</tool_call>` leaves greedy decoding `>\n`, which only a next call could
/// follow: with parallel calls allowed it wrote the same call again until `max_tokens`.
fn ended(calls: Value) -> Value {
    json!({"type": "sequence", "elements": [calls, {"type": "regex", "pattern": "\\n?"}]})
}

/// `body` between the family's opener and closer.
fn wrapped(s: &Syntax, body: Value) -> Value {
    let mut elements = Vec::new();
    if !s.open.is_empty() {
        elements.push(json!({"type": "const_string", "value": s.open}));
    }
    elements.push(body);
    if !s.close.is_empty() {
        elements.push(json!({"type": "const_string", "value": s.close}));
    }
    match <[Value; 1]>::try_from(elements) {
        Ok([one]) => one,
        Err(elements) => json!({"type": "sequence", "elements": elements}),
    }
}
