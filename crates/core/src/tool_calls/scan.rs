//! Reading calls back out of a model's output, whole or as it grows. One pass serves both: the
//! streaming fronts diff successive scans (text before the calls as content, each call's name
//! once it is written, its arguments as they grow); the whole response keeps only the calls that
//! ended with arguments that parse as a JSON object.
//!
//! The reading is lenient where models slip (spacing, key order, arguments as a JSON string,
//! Llama's `{"name"` anywhere): the constraint makes the exact syntax, but `auto` text that never
//! wrote the trigger is free, and a client's own template may differ in blanks.

use super::Family;
use serde_json::Value;

/// One call as far as it is written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartialCall {
    /// Known once the whole name is written.
    pub name: Option<String>,
    /// The arguments' JSON text so far (grows only; a JSON-string form appears when it ends).
    pub arguments: String,
    /// The call's object (or DeepSeek's arguments) has ended.
    pub complete: bool,
}

/// What a scan found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scan {
    /// The content is `text[..content_end]`: what precedes the calls. While streaming, text that
    /// may yet turn out to open a call is held back; when the output is whole and holds no valid
    /// call, all of it is content.
    pub content_end: usize,
    /// While streaming, every call begun; when whole, the valid ones (arguments a JSON object).
    pub calls: Vec<PartialCall>,
}

/// Scans `text` for `family`'s calls; `last` when the output is whole. `tools` are the request's
/// tool names: a bare JSON call (Llama's syntax, and the slip Qwen's Hermes models make of writing
/// the object without its tags) counts only when it names one of them, so JSON about a person's
/// `"name"` stays text.
pub fn scan(family: Family, text: &str, last: bool, tools: &[&str]) -> Scan {
    let Some(start) = opener(family, text, tools) else {
        let held = if last { 0 } else { held_back(family, text, tools) };
        return Scan { content_end: text.len() - held, calls: Vec::new() };
    };
    let calls = calls_from(family, text, start, tools);
    // A code fence just before the calls (Qwen's "```json\n{...}\n```") belongs to them.
    let content_end = fence_start(text, start);
    if !last {
        return Scan { content_end, calls };
    }
    let valid: Vec<PartialCall> = calls.into_iter().filter_map(valid).collect();
    if valid.is_empty() {
        return Scan { content_end: text.len(), calls: valid };
    }
    Scan { content_end, calls: valid }
}

/// Where a code fence opening right before `at` (```` ``` ````, a language word, blanks) starts;
/// `at` when there is none. A `{` right before a call is taken with it: Qwen2.5's template shows
/// its models `{{"name": <function-name>, "arguments": <args-json-object>}}` (a format-string
/// escape left in), and they write the doubled brace.
fn fence_start(text: &str, at: usize) -> usize {
    let at = match text[..at].trim_end().strip_suffix('{') {
        Some(before) => before.len(),
        None => at,
    };
    let before = text[..at].trim_end();
    let word = before.trim_end_matches(|c: char| c.is_ascii_alphanumeric());
    if word.ends_with("```") {
        word.len() - 3
    } else {
        at
    }
}

/// A finished call with a name and arguments that are a JSON object (`{}` when it gave none).
fn valid(c: PartialCall) -> Option<PartialCall> {
    let name = c.name.filter(|n| !n.is_empty() && c.complete)?;
    let arguments = if c.arguments.trim().is_empty() { "{}".to_string() } else { c.arguments };
    serde_json::from_str::<Value>(&arguments).ok().filter(Value::is_object)?;
    Some(PartialCall { name: Some(name), arguments, complete: true })
}

/// The family's own markers, which open calls wherever they appear.
fn markers(family: Family) -> &'static [&'static str] {
    match family {
        Family::Hermes => &["<tool_call>"],
        Family::Mistral => &["[TOOL_CALLS]"],
        Family::DeepSeek => &["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"],
        Family::Llama3 | Family::Generic => &[],
    }
}

/// Whether the family's calls may be bare JSON objects that name a tool.
fn bare_objects(family: Family) -> bool {
    matches!(family, Family::Hermes | Family::Llama3)
}

/// A bare call object at or after `from`: where one naming a tool opens, or where one whose name
/// is still being written (and may name a tool) opens.
enum Bare {
    Found(usize),
    Partial(usize),
    Absent,
}

fn bare(text: &str, from: usize, tools: &[&str]) -> Bare {
    let b = text.as_bytes();
    let mut k = from;
    while let Some(off) = text[k..].find('{') {
        let at = k + off;
        k = at + 1;
        let i = skip_blank(b, at + 1);
        let rest = &text[i..];
        if !rest.starts_with("\"name\"") {
            if "\"name\"".starts_with(rest) {
                return Bare::Partial(at);
            }
            continue;
        }
        let i = skip_blank(b, i + 6);
        match b.get(i) {
            None => return Bare::Partial(at),
            Some(b':') => {}
            Some(_) => continue,
        }
        let i = skip_blank(b, i + 1);
        match b.get(i) {
            None => return Bare::Partial(at),
            Some(b'"') => {}
            Some(_) => continue,
        }
        match string_end(b, i) {
            Some(e) => {
                let name: String = serde_json::from_str(&text[i..e]).unwrap_or_default();
                if tools.contains(&name.as_str()) {
                    return Bare::Found(at);
                }
            }
            None => {
                let partial = &text[i + 1..];
                if tools.iter().any(|t| t.starts_with(partial)) {
                    return Bare::Partial(at);
                }
            }
        }
    }
    Bare::Absent
}

/// Where the calls start, if they have.
fn opener(family: Family, text: &str, tools: &[&str]) -> Option<usize> {
    if family == Family::Generic {
        let lead = text.len() - text.trim_start().len();
        return text[lead..].starts_with('{').then_some(lead);
    }
    let marked = markers(family).iter().filter_map(|m| text.find(m)).min();
    let bare = match bare(text, 0, tools) {
        Bare::Found(at) if bare_objects(family) => Some(at),
        _ => None,
    };
    marked.into_iter().chain(bare).min()
}

/// How many bytes at the end of `text` may still become the opener (held while streaming).
fn held_back(family: Family, text: &str, tools: &[&str]) -> usize {
    if family == Family::Generic {
        // Blank output may yet open the object.
        return if text.trim().is_empty() { text.len() } else { 0 };
    }
    let marked = markers(family)
        .iter()
        .filter_map(|m| (1..m.len()).rev().filter(|&k| m.is_char_boundary(k)).find(|&k| text.ends_with(&m[..k])))
        .max()
        .unwrap_or(0);
    if !bare_objects(family) {
        return marked;
    }
    // A bare object still being opened, and a code fence that may lead into one.
    let from = match bare(text, 0, tools) {
        Bare::Partial(at) => at,
        _ => text.len(),
    };
    marked.max(text.len() - fence_start(text, from))
}

/// Every call begun after `start`.
fn calls_from(family: Family, text: &str, start: usize, tools: &[&str]) -> Vec<PartialCall> {
    let mut calls = Vec::new();
    let mut at = start;
    if family == Family::Generic {
        // Into the `tool_calls` list of the outer object.
        let Some(key) = text[at..].find("\"tool_calls\"") else { return calls };
        let Some(list) = text[at + key..].find('[') else { return calls };
        at += key + list + 1;
    }
    loop {
        let (call, end) = match family {
            Family::Hermes => {
                // Tagged, or (the slip) a bare object naming a tool.
                let tagged = text[at..].find("<tool_call>").and_then(|k| text[at + k..].find('{').map(|b| at + k + b));
                let bare = match bare(text, at, tools) {
                    Bare::Found(b) => Some(b),
                    _ => None,
                };
                let Some(open) = tagged.into_iter().chain(bare).min() else { break };
                object_call(text, open)
            }
            Family::DeepSeek => {
                let Some(k) = text[at..].find("<｜tool▁call▁begin｜>") else { break };
                deepseek_call(text, at + k)
            }
            // JSON lists: only blanks and separators between the objects.
            _ => {
                let rest = &text[at..];
                let skip =
                    rest.len() - rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',' || c == ';').len();
                let lead = &rest[..skip];
                let next = &rest[skip..];
                let first = calls.is_empty();
                let opens =
                    next.starts_with('{') || (family == Family::Mistral && first && next.starts_with("[TOOL_CALLS]"));
                if !opens {
                    break;
                }
                if next.starts_with("[TOOL_CALLS]") {
                    let Some(b) = next.find('{') else { break };
                    object_call(text, at + skip + b)
                } else if !first && !lead.contains([',', ';']) && family != Family::Llama3 {
                    break;
                } else {
                    object_call(text, at + skip)
                }
            }
        };
        calls.push(call);
        match end {
            Some(e) => at = e,
            None => break,
        }
    }
    calls
}

/// The call whose JSON object opens at `at`, and where the object ends (if it has).
fn object_call(text: &str, at: usize) -> (PartialCall, Option<usize>) {
    let b = text.as_bytes();
    let mut call = PartialCall::default();
    let mut i = at + 1;
    loop {
        i = skip_blank(b, i);
        match b.get(i) {
            None => return (call, None),
            Some(b'}') => {
                call.complete = true;
                return (call, Some(i + 1));
            }
            Some(b',') => {
                i += 1;
                continue;
            }
            Some(b'"') => {}
            Some(_) => return (call, None),
        }
        let Some(key_end) = string_end(b, i) else { return (call, None) };
        let key: String = serde_json::from_str(&text[i..key_end]).unwrap_or_default();
        i = skip_blank(b, key_end);
        if b.get(i) != Some(&b':') {
            return (call, None);
        }
        i = skip_blank(b, i + 1);
        if i >= b.len() {
            return (call, None);
        }
        let end = value_end(b, i);
        match key.as_str() {
            "name" if b[i] == b'"' => match end {
                Some(e) => call.name = serde_json::from_str(&text[i..e]).ok(),
                None => return (call, None),
            },
            "arguments" | "parameters" => {
                // An object as it grows; the JSON-string form (OpenAI's own) decoded once it ends.
                if b[i] != b'"' {
                    call.arguments = text[i..end.unwrap_or(b.len())].to_string();
                } else if let Some(e) = end {
                    call.arguments = serde_json::from_str(&text[i..e]).unwrap_or_default();
                }
            }
            _ => {}
        }
        match end {
            Some(e) => i = e,
            None => return (call, None),
        }
    }
}

/// DeepSeek's `<｜tool▁call▁begin｜>type<｜tool▁sep｜>name\n```json\n{..}\n```<｜tool▁call▁end｜>`.
fn deepseek_call(text: &str, at: usize) -> (PartialCall, Option<usize>) {
    let mut call = PartialCall::default();
    let Some(sep) = text[at..].find("<｜tool▁sep｜>") else { return (call, None) };
    let name_at = at + sep + "<｜tool▁sep｜>".len();
    let Some(nl) = text[name_at..].find('\n') else { return (call, None) };
    call.name = Some(text[name_at..name_at + nl].trim().to_string());
    let Some(brace) = text[name_at + nl..].find('{') else { return (call, None) };
    let args_at = name_at + nl + brace;
    let end = value_end(text.as_bytes(), args_at);
    call.arguments = text[args_at..end.unwrap_or(text.len())].to_string();
    call.complete = end.is_some();
    // The call goes on to its end token; the next call is looked for after it.
    let after = end.map(|e| text[e..].find("<｜tool▁call▁end｜>").map_or(e, |k| e + k));
    (call, after)
}

fn skip_blank(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The end (exclusive) of the JSON string opening at `i`, if it has ended.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut k = i + 1;
    while k < b.len() {
        match b[k] {
            b'\\' => k += 2,
            b'"' => return Some(k + 1),
            _ => k += 1,
        }
    }
    None
}

/// The end (exclusive) of the JSON value starting at `i`, if it has ended. A bare scalar at the
/// end of the text has not (more digits may come).
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut k = i;
            while k < b.len() {
                match b[k] {
                    b'"' => {
                        k = string_end(b, k)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(k + 1);
                        }
                    }
                    _ => {}
                }
                k += 1;
            }
            None
        }
        _ => {
            let k = (i..b.len()).find(|&k| matches!(b[k], b',' | b'}' | b']') || b[k].is_ascii_whitespace())?;
            Some(k)
        }
    }
}
