//! Constraints written in llguidance's Lark dialect: `structural_tag`, and any constraint behind
//! an optional reasoning block.
//!
//! Structural tags come in two shapes, both accepted as vLLM does:
//! - the original one, `{"structures": [{"begin", "schema", "end"}], "triggers": [..]}`: free
//!   text in which every trigger must open one of the structures (vLLM's guidance backend);
//! - xgrammar's format tree, `{"format": {"type": ..}}` with `const_string`, `json_schema`,
//!   `regex`, `grammar` (llguidance Lark here, not GBNF), `any_text`, `sequence`, `or`, `tag`,
//!   `triggered_tags` and `tags_with_separator`.
//!
//! The one subtle part is free text that must stop at a delimiter (a trigger, or a tag's end).
//! llguidance lexes greedily without backtracking, so `TEXT "</end>"` cannot work: the text
//! lexeme would swallow the delimiter's first bytes. Instead the text and its delimiter are
//! one terminal, "anything that ends with the delimiter and holds no delimiter before that",
//! written with llguidance's `&` and `~` terminal operators. Such a terminal cannot be
//! extended once the delimiter is written, so the lexer ends it exactly there.
//!
//! A string of the tag (a begin, an end, a trigger, a `const_string`) that holds a special
//! token's text means that token (`<[id]>`): the model writes `[TOOL_CALLS]` as one control token,
//! never as the characters, and text cannot hold a special token, so such a trigger needs no
//! guard in the text before it.

use serde_json::Value;

/// Free text of any length, newlines included.
const ANY: &str = "/(.|\\n)*/";

/// `body` (a Lark expression) behind a `<think>…</think>` block of free text and the whitespace
/// after it, which the reasoning parser splits off (vLLM applies the grammar once reasoning has
/// ended). Not `leading` (the `think` parser): the block is optional, and output that does not
/// reason is held to the grammar from the start. `leading` (DeepSeek-R1: the output starts inside
/// the reasoning): the block is required, its opening tag optional.
pub fn after_reasoning(body: &str, leading: bool) -> String {
    let (open, block) =
        if leading { ("/[ \\t\\r\\n]*/ \"<think>\"?", "THINK") } else { ("/[ \\t\\r\\n]*/ \"<think>\"", "THINK?") };
    format!(
        "%llguidance {{}}\nstart: {block} body\nbody: {body}\n\
         THINK: ({open} {ANY} \"</think>\" /[ \\t\\r\\n]*/) & ~({open} {ANY} \"</think>\" {ANY} \"</think>\" {ANY})\n"
    )
}

/// Builds the grammar; `json` attaches the request's JSON options to each embedded schema;
/// `special` lists the vocabulary's special tokens (text and id).
pub fn structural_tag(
    spec: &Value,
    json: &dyn Fn(Value) -> Result<Value, String>,
    special: &[(String, u32)],
) -> Result<String, String> {
    let mut b = Builder { rules: Vec::new(), json, special };
    let root = if let Some(format) = spec.get("format") {
        b.format(format)?
    } else if spec.get("structures").is_some() || spec.get("triggers").is_some() {
        b.legacy(spec)?
    } else {
        return Err("a structural tag needs `format` (xgrammar's format tree) or `structures` and `triggers`".into());
    };
    let mut out = String::from("%llguidance {}\n");
    out.push_str(&format!("start: {root}\n"));
    for rule in &b.rules {
        out.push_str(rule);
        out.push('\n');
    }
    Ok(out)
}

struct Builder<'a> {
    rules: Vec<String>,
    json: &'a dyn Fn(Value) -> Result<Value, String>,
    special: &'a [(String, u32)],
}

/// One `begin content end` tag.
struct Tag<'v> {
    begin: &'v str,
    content: &'v Value,
    end: &'v str,
}

impl Builder<'_> {
    /// The first special token in `s`: its byte offset, length and id (the longest at a tie).
    fn first_special(&self, s: &str) -> Option<(usize, usize, u32)> {
        self.special
            .iter()
            .filter(|(t, _)| !t.is_empty())
            .filter_map(|(t, id)| s.find(t.as_str()).map(|at| (at, t.len(), *id)))
            .min_by_key(|&(at, len, _)| (at, usize::MAX - len))
    }

    /// `s` as a sequence of text literals and the special tokens it holds.
    fn lit(&self, s: &str) -> String {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some((at, len, id)) = self.first_special(rest) {
            if at > 0 {
                parts.push(literal(&rest[..at]));
            }
            parts.push(format!("<[{id}]>"));
            rest = &rest[at + len..];
        }
        if !rest.is_empty() || parts.is_empty() {
            parts.push(literal(rest));
        }
        parts.join(" ")
    }

    /// A new rule (or terminal, when `terminal`) with this body; returns its name.
    fn rule(&mut self, body: String, terminal: bool) -> String {
        let name = if terminal { format!("T{}", self.rules.len()) } else { format!("r{}", self.rules.len()) };
        self.rules.push(format!("{name}: {body}"));
        name
    }

    fn legacy(&mut self, spec: &Value) -> Result<String, String> {
        let triggers = strings(spec.get("triggers"), "triggers")?;
        let structures = spec.get("structures").and_then(Value::as_array).ok_or("`structures` must be a list")?;
        let mut tags = Vec::new();
        for s in structures {
            let begin = s.get("begin").and_then(Value::as_str).ok_or("every structure needs a string `begin`")?;
            let end = s.get("end").and_then(Value::as_str).ok_or("every structure needs a string `end`")?;
            let content = s.get("schema").ok_or("every structure needs a `schema`")?;
            tags.push((Tag { begin, content, end }, true));
        }
        self.triggered(&triggers, &tags, false, false)
    }

    /// The grammar symbol (rule name or inline expression) of a format object.
    fn format(&mut self, f: &Value) -> Result<String, String> {
        let kind = f.get("type").and_then(Value::as_str).ok_or("every format object needs a string `type`")?;
        match kind {
            "const_string" => Ok(self.lit(field_str(f, "value", kind)?)),
            "json_schema" => {
                let schema = f.get("json_schema").ok_or("json_schema format needs `json_schema`")?;
                self.schema(schema)
            }
            "regex" => Ok(self.rule(regex_literal(field_str(f, "pattern", kind)?), true)),
            "grammar" => Ok(format!("%lark {{\n{}\n}}", field_str(f, "grammar", kind)?)),
            "any_text" => {
                let excluded = strings(f.get("excluded_str"), "excluded_str")?;
                Ok(self.rule(text_without(&excluded), true))
            }
            "sequence" | "or" => {
                let elements = f.get("elements").and_then(Value::as_array).filter(|e| !e.is_empty());
                let elements = elements.ok_or_else(|| format!("{kind} format needs a non-empty `elements` list"))?;
                let parts = elements.iter().map(|e| self.format(e)).collect::<Result<Vec<_>, _>>()?;
                let body = parts.join(if kind == "or" { " | " } else { " " });
                Ok(self.rule(body, false))
            }
            "tag" => {
                let tag = tag_of(f)?;
                self.tag(&tag)
            }
            "triggered_tags" => {
                let triggers = strings(f.get("triggers"), "triggers")?;
                let tags = tags_of(f)?.into_iter().map(|t| (t, false)).collect::<Vec<_>>();
                self.triggered(&triggers, &tags, flag(f, "at_least_one")?, flag(f, "stop_after_first")?)
            }
            "tags_with_separator" => {
                let tags = tags_of(f)?;
                let separator = f
                    .get("separator")
                    .and_then(Value::as_str)
                    .ok_or("tags_with_separator needs a string `separator`")?;
                let one = tags.iter().map(|t| self.tag(t)).collect::<Result<Vec<_>, _>>()?.join(" | ");
                let one = self.rule(one, false);
                let body = match (flag(f, "at_least_one")?, flag(f, "stop_after_first")?) {
                    (true, true) => one,
                    (false, true) => format!("{one}?"),
                    (true, false) => format!("{one} ({} {one})*", self.lit(separator)),
                    (false, false) => format!("({one} ({} {one})*)?", self.lit(separator)),
                };
                Ok(self.rule(body, false))
            }
            other => Err(format!("unknown structural tag format type {other:?}")),
        }
    }

    fn schema(&mut self, schema: &Value) -> Result<String, String> {
        let schema = match schema {
            Value::String(s) => {
                serde_json::from_str(s).map_err(|e| format!("a schema given as a string is not JSON: {e}"))?
            }
            Value::Bool(true) => serde_json::json!({}),
            other => other.clone(),
        };
        let schema = (self.json)(schema)?;
        Ok(self.rule(format!("%json {schema}"), false))
    }

    /// `begin content end`. Free-text content is one terminal with the end, see the module doc.
    fn tag(&mut self, tag: &Tag) -> Result<String, String> {
        let body = if tag.content.get("type").and_then(Value::as_str) == Some("any_text") {
            let excluded = strings(tag.content.get("excluded_str"), "excluded_str")?;
            let text = self.rule(text_until(tag.end, &excluded), true);
            format!("{} {text}", self.lit(tag.begin))
        } else {
            let content = self.format(tag.content)?;
            format!("{} {content} {}", self.lit(tag.begin), self.lit(tag.end))
        };
        Ok(self.rule(body, false))
    }

    /// Free text in which each trigger opens one of `tags`. `legacy` marks a tag whose content
    /// is a bare JSON schema (the original format) rather than a format object.
    fn triggered(
        &mut self,
        triggers: &[String],
        tags: &[(Tag, bool)],
        at_least_one: bool,
        stop_after_first: bool,
    ) -> Result<String, String> {
        if triggers.is_empty() || tags.is_empty() {
            return Err("triggered tags need at least one trigger and one tag".into());
        }
        if triggers.iter().any(String::is_empty) {
            return Err("a trigger cannot be empty".into());
        }
        // Each trigger's alternatives: what follows the trigger, up to the tag's end; a whole tag
        // is its trigger then that rest.
        let mut after: Vec<Vec<String>> = vec![Vec::new(); triggers.len()];
        let mut whole = Vec::new();
        for (tag, legacy) in tags {
            let matching: Vec<usize> = (0..triggers.len()).filter(|&i| tag.begin.starts_with(&triggers[i])).collect();
            let [i] = matching[..] else {
                return Err(format!("the tag beginning {:?} must start with exactly one of the triggers", tag.begin));
            };
            let rest = Tag { begin: &tag.begin[triggers[i].len()..], content: tag.content, end: tag.end };
            let rest = if *legacy {
                let schema = self.schema(tag.content)?;
                self.rule(format!("{} {schema} {}", self.lit(rest.begin), self.lit(rest.end)), false)
            } else {
                self.tag(&rest)?
            };
            whole.push(format!("{} {rest}", self.lit(&triggers[i])));
            after[i].push(rest);
        }
        let mut segments = Vec::new();
        for (i, alternatives) in after.iter().enumerate() {
            if alternatives.is_empty() {
                continue;
            }
            // Text up to and including this trigger, with no trigger before it. A trigger that
            // holds a special token follows text that has no other trigger (text never holds the
            // token itself).
            let lead = if self.first_special(&triggers[i]).is_some() {
                let text = self.rule(text_without(triggers), true);
                format!("{text} {}", self.lit(&triggers[i]))
            } else {
                self.rule(
                    format!("({ANY} {}) & ~({ANY} ({}) /(.|\\n)+/)", literal(&triggers[i]), any_of(triggers)),
                    true,
                )
            };
            segments.push(format!("{lead} ({})", alternatives.join(" | ")));
        }
        let segment = self.rule(segments.join(" | "), false);
        let tail = self.rule(text_without(triggers), true);
        let first = self.rule(whole.join(" | "), false);
        let body = match (at_least_one, stop_after_first) {
            (false, false) => format!("{segment}* {tail}"),
            (false, true) => format!("{segment} | {tail}"),
            (true, false) => format!("{first} {segment}* {tail}"),
            (true, true) => first,
        };
        Ok(self.rule(body, false))
    }
}

/// A Lark string literal (JSON escapes are what llguidance's Lark reads).
pub fn literal(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// `(a | b | ..)` over string literals.
fn any_of<S: AsRef<str>>(strings: &[S]) -> String {
    strings.iter().map(|s| literal(s.as_ref())).collect::<Vec<_>>().join(" | ")
}

/// Any text that contains none of `excluded`.
fn text_without(excluded: &[String]) -> String {
    let excluded: Vec<&String> = excluded.iter().filter(|s| !s.is_empty()).collect();
    if excluded.is_empty() {
        return ANY.to_string();
    }
    format!("{ANY} & ~({ANY} ({}) {ANY})", any_of(&excluded))
}

/// Text ending with `end` that holds neither `end` nor any of `excluded` before it.
fn text_until(end: &str, excluded: &[String]) -> String {
    let mut banned: Vec<String> = excluded.iter().filter(|s| !s.is_empty()).cloned().collect();
    if end.is_empty() {
        return text_without(&banned);
    }
    let no_early_end = format!("~({ANY} {} /(.|\\n)+/)", literal(end));
    banned.retain(|s| s != end);
    let mut body = format!("({ANY} {}) & {no_early_end}", literal(end));
    if !banned.is_empty() {
        // An excluded string may not appear in the text (it may only overlap the end).
        body.push_str(&format!(" & ~({ANY} ({}) {ANY} {})", any_of(&banned), literal(end)));
    }
    body
}

/// A Lark regex literal for `pattern`: slashes escaped, newlines written as `\n`.
pub fn regex_literal(pattern: &str) -> String {
    let mut out = String::from("/");
    let mut escaped = false;
    for ch in pattern.chars() {
        match ch {
            '/' if !escaped => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            _ => out.push(ch),
        }
        escaped = ch == '\\' && !escaped;
    }
    out.push('/');
    out
}

fn field_str<'v>(f: &'v Value, key: &str, kind: &str) -> Result<&'v str, String> {
    f.get(key).and_then(Value::as_str).ok_or_else(|| format!("{kind} format needs a string `{key}`"))
}

fn strings(v: Option<&Value>, what: &str) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(|| format!("`{what}` must be a list of strings")))
            .collect(),
        Some(_) => Err(format!("`{what}` must be a list of strings")),
    }
}

fn flag(f: &Value, key: &str) -> Result<bool, String> {
    match f.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("`{key}` must be a boolean")),
    }
}

fn tag_of(f: &Value) -> Result<Tag<'_>, String> {
    Ok(Tag {
        begin: f.get("begin").and_then(Value::as_str).ok_or("a tag needs a string `begin`")?,
        content: f.get("content").ok_or("a tag needs `content`")?,
        end: f.get("end").and_then(Value::as_str).ok_or("a tag needs a string `end`")?,
    })
}

fn tags_of(f: &Value) -> Result<Vec<Tag<'_>>, String> {
    let tags =
        f.get("tags").and_then(Value::as_array).filter(|t| !t.is_empty()).ok_or("`tags` must be a non-empty list")?;
    tags.iter().map(tag_of).collect()
}

#[cfg(test)]
#[path = "lark_tests.rs"]
mod tests;
