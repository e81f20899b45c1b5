//! Tool calls in each model family's own format: one description per family, from which the api
//! builds the constraint (`required`, a named choice, `auto`'s trigger) and [`scan`] reads the
//! output back, whole or while it streams.
//!
//! - [`grammar`]: the constraint of each tool choice, a structural tag in the family's syntax.
//! - [`scan`]: calls read back out of an output, whole or growing.
//!
//! The family is read off the chat template, as llama.cpp picks its chat format and vLLM its tool
//! parser: the template shows the model the syntax it was trained to write, so it names it.
//! Templates that show none (the bundled SmolLM2's, Gemma 3's) get tandem's generic format, a
//! `{"tool_calls": [...]}` object described in a system message.

pub mod grammar;
mod scan;
#[cfg(test)]
mod tests;

pub use scan::{scan, PartialCall, Scan};
use serde_json::{json, Map, Value};

/// `tool_choice`, once validated.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    Auto,
    Required,
    Named(String),
}

/// A request's tools, when the output is to be read for calls.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    pub choice: Choice,
    /// The `function` objects of `tools`.
    pub functions: Vec<Map<String, Value>>,
    pub parallel: bool,
}

/// A function's name.
pub fn name(f: &Map<String, Value>) -> &str {
    f.get("name").and_then(Value::as_str).unwrap_or_default()
}

/// A function's parameters schema (an empty object schema when it gives none).
pub fn parameters(f: &Map<String, Value>) -> Value {
    f.get("parameters")
        .filter(|p| p.is_object())
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}))
}

/// A model family's tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Hermes 2/3, Qwen2.5, Qwen3: `<tool_call>\n{"name": .., "arguments": ..}\n</tool_call>`.
    Hermes,
    /// Llama 3.1-3.3 JSON calls: `{"name": .., "parameters": ..}`, several joined by `; `.
    Llama3,
    /// Mistral (v3 tokenizers: 7B v0.3, Nemo): `[TOOL_CALLS][{"name": .., "arguments": ..}, ..]`.
    Mistral,
    /// DeepSeek V3 and R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name`,
    /// the arguments in a JSON code fence, `<｜tool▁call▁end｜>`, ..., `<｜tool▁calls▁end｜>`.
    DeepSeek,
    /// tandem's own, for templates without tools: `{"tool_calls": [{"name", "arguments"}]}`.
    Generic,
}

/// Where the pieces of a call go. A call is `call_begin` name `name_end` arguments `call_end`;
/// the calls of one reply are joined by `separator` and wrapped in `open` .. `close`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syntax {
    pub open: &'static str,
    pub call_begin: &'static str,
    pub name_end: &'static str,
    pub call_end: &'static str,
    pub separator: &'static str,
    pub close: &'static str,
    /// What starts the calls in free text (`auto`): the model's own opener.
    pub trigger: &'static str,
}

impl Family {
    pub const ALL: [Family; 5] = [Family::Hermes, Family::Llama3, Family::Mistral, Family::DeepSeek, Family::Generic];

    /// The family whose call syntax `template` (a chat template's source) shows.
    pub fn detect(template: &str) -> Family {
        if template.contains("<tool_call>") {
            Family::Hermes
        } else if template.contains("[TOOL_CALLS]") {
            Family::Mistral
        } else if template.contains("tool▁calls▁begin") {
            Family::DeepSeek
        } else if template.contains("<|start_header_id|>")
            && (template.contains("\"parameters\"") || template.contains("<|python_tag|>"))
        {
            Family::Llama3
        } else {
            Family::Generic
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Hermes => "hermes",
            Family::Llama3 => "llama3_json",
            Family::Mistral => "mistral",
            Family::DeepSeek => "deepseek_v3",
            Family::Generic => "generic",
        }
    }

    pub fn syntax(self) -> Syntax {
        const NAME: &str = "{\"name\": \"";
        match self {
            Family::Hermes => Syntax {
                open: "",
                call_begin: "<tool_call>\n{\"name\": \"",
                name_end: "\", \"arguments\": ",
                call_end: "}\n</tool_call>",
                separator: "\n",
                close: "",
                trigger: "<tool_call>",
            },
            Family::Llama3 => Syntax {
                open: "",
                call_begin: NAME,
                name_end: "\", \"parameters\": ",
                call_end: "}",
                separator: "; ",
                close: "",
                trigger: NAME,
            },
            Family::Mistral => Syntax {
                open: "[TOOL_CALLS][",
                call_begin: NAME,
                name_end: "\", \"arguments\": ",
                call_end: "}",
                separator: ", ",
                close: "]",
                trigger: "[TOOL_CALLS]",
            },
            Family::DeepSeek => Syntax {
                open: "<｜tool▁calls▁begin｜>",
                call_begin: "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
                name_end: "\n```json\n",
                call_end: "\n```<｜tool▁call▁end｜>",
                separator: "\n",
                close: "<｜tool▁calls▁end｜>",
                trigger: "<｜tool▁calls▁begin｜>",
            },
            Family::Generic => Syntax {
                open: "{\"tool_calls\": [",
                call_begin: NAME,
                name_end: "\", \"arguments\": ",
                call_end: "}",
                separator: ", ",
                close: "]}",
                trigger: "{",
            },
        }
    }

    /// The output text of `calls` ((name, arguments JSON) pairs) in this syntax: what a model of
    /// the family writes, and what the constraint accepts.
    pub fn write(self, calls: &[(&str, &str)]) -> String {
        let s = self.syntax();
        let body: Vec<String> =
            calls.iter().map(|(n, a)| format!("{}{n}{}{a}{}", s.call_begin, s.name_end, s.call_end)).collect();
        format!("{}{}{}", s.open, body.join(s.separator), s.close)
    }

    /// A tool-call id of the shape the family's template takes back: Mistral's templates
    /// refuse any but 9 alphanumerics; the rest get vLLM's `chatcmpl-tool-…`.
    pub fn call_id(self) -> String {
        let hex = crate::new_id().simple().to_string();
        match self {
            // The v7 id's random bits are at its end.
            Family::Mistral => hex[hex.len() - 9..].to_string(),
            _ => format!("chatcmpl-tool-{hex}"),
        }
    }
}
