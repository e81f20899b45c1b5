//! Chat templates: Hugging Face's Jinja dialect rendered with minijinja, built once per template.
//!
//! The environment matches transformers' (`trim_blocks`, `lstrip_blocks`, loop controls, Python
//! string methods through minijinja-contrib's pycompat, `raise_exception`, transformers' `tojson`
//! (`pyjson`: Python's `json.dumps` layout, keys in their given order),
//! `strftime_now`). It is sandboxed by construction (no file or network access) and each render
//! runs under a fuel limit (a bound on executed instructions, so on time) and an output cap.
//!
//! Like vLLM, a template is classified once: if it iterates over `message.content`, messages are
//! passed with content parts as given ("openai" format); otherwise text parts are joined with
//! "\n" into one string ("string" format), and a null content becomes "" so that templates that
//! concatenate `message['content']` (SmolLM2's) do not fail on an assistant turn with tool calls.

pub mod builtin;
pub mod jail;
mod pyjson;

use minijinja::value::{Serde, Value as JValue};
use minijinja::{Environment, Error as JError, ErrorKind};
use serde_json::{Map, Value};

/// Instructions one render may execute; SmolLM2's template needs a few hundred per message.
const FUEL: u64 = 5_000_000;
/// Largest rendered prompt, in bytes; enforced while rendering.
pub(crate) const MAX_OUTPUT: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template error: {0}")]
    Syntax(String),
    #[error("chat template failed: {0}")]
    Render(String),
    #[error("{0}")]
    Invalid(String),
}

/// How message content reaches the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    String,
    OpenAi,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    pub format: ContentFormat,
    /// The template tells a turn without content by `content is none` (DeepSeek V3 renders the
    /// calls of such a turn only): a null content stays null, where other string-content
    /// templates get "" (Qwen3 tests `'</think>' in message.content`, which fails on none).
    keeps_null_content: bool,
    /// The template joins a call's `arguments` to strings with `+` (DeepSeek V3's), so they stay
    /// the JSON text they arrive as rather than becoming an object.
    arguments_as_text: bool,
    /// The tool-call syntax the template shows.
    pub tool_family: tandem_core::tool_calls::Family,
}

/// Everything a render takes besides the messages.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RenderInputs {
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub tools: Option<Value>,
    pub documents: Option<Value>,
    pub reasoning_effort: Option<String>,
    /// `chat_template_kwargs`, merged under the named inputs above.
    pub kwargs: Map<String, Value>,
    pub bos_token: String,
    pub eos_token: String,
}

fn raise_exception(msg: String) -> Result<String, JError> {
    Err(JError::new(ErrorKind::InvalidOperation, msg))
}

fn strftime_now(format: String) -> String {
    // Templates use it for "today's date"; UTC from the system clock, formatted for the common
    // specifiers (anything else passes through).
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let days = secs.div_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    format
        .replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", MONTHS[(m - 1) as usize])
        .replace("%b", &MONTHS[(m - 1) as usize][..3])
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A template's source without blanks, for the checks on how it uses a message.
fn compact(source: &str) -> String {
    source.chars().filter(|c| !c.is_whitespace()).collect()
}

/// Whether `pattern` (`in message.content`, say) appears in a `for` tag: a containment test such
/// as Qwen3's `'</think>' in message.content` reads the content as a string.
fn loops_over(compact: &str, pattern: &str) -> bool {
    compact.match_indices(pattern).any(|(at, _)| {
        let tag = compact[..at].rfind("{%").map_or("", |open| &compact[open..at]);
        tag.trim_start_matches(['{', '%', '-']).starts_with("for")
    })
}

/// Whether a template walks over content parts (vLLM's "openai" content format).
pub fn detect_content_format(source: &str) -> ContentFormat {
    let compact = compact(source);
    let iterates = [
        "in message['content']",
        "in message[\"content\"]",
        "in message.content",
        "inm['content']",
        "inmsg['content']",
    ]
    .iter()
    .any(|p| loops_over(&compact, &p.replace(' ', "")));
    let checks_type = compact.contains("contentisstring")
        || compact.contains("contentisnotstring")
        || compact.contains("contentisiterable");
    if iterates || checks_type {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

impl ChatTemplate {
    pub fn new(source: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", pyjson::tojson);
        env.set_fuel(Some(FUEL));
        env.add_template_owned("chat", source.to_string()).map_err(|e| TemplateError::Syntax(describe(&e)))?;
        // The source without blanks, read once for the checks on how it uses a message.
        let bare = compact(source);
        Ok(ChatTemplate {
            env,
            format: detect_content_format(source),
            keeps_null_content: ["content']isnone", "content\"]isnone", "contentisnone"]
                .iter()
                .any(|p| bare.contains(p)),
            arguments_as_text: ["arguments']+", "arguments\"]+", ".arguments+"].iter().any(|p| bare.contains(p)),
            tool_family: tandem_core::tool_calls::Family::detect(source),
        })
    }

    /// Renders `messages` (already checked to be a list of objects with a role).
    pub fn render(&self, messages: &[Value], inputs: &RenderInputs) -> Result<String, TemplateError> {
        if inputs.continue_final_message && inputs.add_generation_prompt {
            return Err(TemplateError::Invalid(
                "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to generate a new assistant message instead.".into(),
            ));
        }
        let prepared: Vec<Value> = messages.iter().map(|m| self.prepare_message(m)).collect();
        let mut ctx = inputs.kwargs.clone();
        ctx.insert("messages".into(), Value::Array(prepared.clone()));
        ctx.insert("add_generation_prompt".into(), Value::Bool(inputs.add_generation_prompt));
        ctx.insert("bos_token".into(), Value::String(inputs.bos_token.clone()));
        ctx.insert("eos_token".into(), Value::String(inputs.eos_token.clone()));
        if let Some(t) = &inputs.tools {
            ctx.insert("tools".into(), t.clone());
        }
        if let Some(d) = &inputs.documents {
            ctx.insert("documents".into(), d.clone());
        }
        if let Some(r) = &inputs.reasoning_effort {
            ctx.insert("reasoning_effort".into(), Value::String(r.clone()));
        }
        let template = self.env.get_template("chat").map_err(|e| TemplateError::Render(describe(&e)))?;
        // Written through a capped writer: the render stops at the cap instead of growing a
        // string without bound first.
        let mut out = CappedWriter { buf: Vec::new(), cap: MAX_OUTPUT, hit: false };
        template.render_captured_to(JValue::from(Serde(Value::Object(ctx))), &mut out).map_err(|e| {
            if out.hit {
                TemplateError::Render(format!("the rendered prompt exceeds {MAX_OUTPUT} bytes"))
            } else {
                TemplateError::Render(describe(&e))
            }
        })?;
        let rendered = String::from_utf8(out.buf).map_err(|e| TemplateError::Render(e.to_string()))?;
        if inputs.continue_final_message {
            let last = prepared.last().ok_or_else(|| TemplateError::Invalid("messages must not be empty".into()))?;
            return cut_after_final_message(rendered, &final_text(last));
        }
        Ok(rendered)
    }

    fn prepare_message(&self, message: &Value) -> Value {
        let mut m = message.clone();
        if !self.arguments_as_text {
            arguments_as_objects(&mut m);
        }
        let null = message.get("content").is_none_or(Value::is_null);
        if self.format == ContentFormat::String && !(null && self.keeps_null_content) {
            if let Some(obj) = m.as_object_mut() {
                let content = obj.get("content").cloned().unwrap_or(Value::Null);
                obj.insert("content".into(), Value::String(tandem_core::chat::content_text(&content)));
            }
        }
        m
    }
}

/// An assistant turn's tool-call `arguments` arrive as the OpenAI JSON text; templates (Qwen's,
/// Llama 3's, Hermes') write them with `tojson` and expect an object, as transformers documents.
/// Like vLLM, text that parses becomes the value, and an empty or missing one becomes `{}`. Unlike
/// vLLM, which refuses the request, text that does not parse is passed on as it is (the template
/// then writes it as a string): a history a model wrote is rendered, not rejected.
fn arguments_as_objects(message: &mut Value) {
    if message.get("role").and_then(Value::as_str) != Some("assistant") {
        return;
    }
    let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) else { return };
    for call in calls {
        let Some(function) = call.get_mut("function").and_then(Value::as_object_mut) else { continue };
        let parsed = match function.get("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::String(s)) if s.is_empty() => Value::Object(Map::new()),
            Some(Value::String(s)) => match serde_json::from_str(s) {
                Ok(v) => v,
                Err(_) => continue,
            },
            Some(_) => continue,
        };
        function.insert("arguments".into(), parsed);
    }
}

/// An output buffer that refuses to grow past `cap` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
    hit: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.cap {
            self.hit = true;
            return Err(std::io::Error::other("output cap reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn final_text(message: &Value) -> String {
    tandem_core::chat::content_text(message.get("content").unwrap_or(&Value::Null))
}

/// transformers' rule: keep everything up to the last occurrence of the final message's text, so
/// its end-of-turn markup is cut and the model continues it.
fn cut_after_final_message(rendered: String, text: &str) -> Result<String, TemplateError> {
    let stripped = text.trim();
    let Some(loc) = rendered.rfind(stripped) else {
        return Err(TemplateError::Invalid(
            "continue_final_message is set but the final message does not appear in the chat after applying the chat template".into(),
        ));
    };
    let lstripped = text.trim_start();
    let keep = if rendered[loc..].starts_with(lstripped) { lstripped.len() } else { stripped.len() };
    Ok(rendered[..loc + keep].to_string())
}

/// A one-line description of a template error, with its line when known.
fn describe(e: &JError) -> String {
    match (e.detail(), e.line()) {
        (Some(d), Some(l)) => format!("{d} (line {l})"),
        (Some(d), None) => d.to_string(),
        (None, Some(l)) => format!("{} (line {l})", e.kind()),
        (None, None) => e.kind().to_string(),
    }
}

#[cfg(test)]
mod tests;
