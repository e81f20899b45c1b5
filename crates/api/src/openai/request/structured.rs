//! Structured outputs: `structured_outputs`, `response_format` and vLLM 0.11's `guided_*`
//! aliases merged into one [`Constraint`], with vLLM's rules (exactly one kind; `response_format`
//! updates `structured_outputs`). Whether the schema, regex or grammar compiles is the engine's
//! call (llguidance), answered as a 400 naming the field.

use super::{bad, optional};
use crate::error::ApiError;
use serde_json::{Map, Value};
use tandem_core::inference::{Constraint, ConstraintKind};

/// vLLM refuses JSON schemas nested deeper than this.
const MAX_NESTING: usize = 64;

/// The request's constraint, if any.
pub(super) fn constraint(obj: &Map<String, Value>) -> Result<Option<Constraint>, ApiError> {
    let mut found: Vec<(String, ConstraintKind)> = Vec::new();
    let mut c = Constraint {
        kind: ConstraintKind::JsonObject,
        disable_any_whitespace: false,
        disable_additional_properties: false,
        whitespace_pattern: None,
        field: String::new(),
        after_reasoning: None,
    };
    if let Some(so) = optional(obj, "structured_outputs") {
        let Value::Object(so) = so else {
            return Err(bad("structured_outputs", "structured_outputs must be an object."));
        };
        found.extend(kinds(so, "structured_outputs", "")?);
        c.disable_any_whitespace = flag(so, "disable_any_whitespace")?;
        c.disable_additional_properties = flag(so, "disable_additional_properties")?;
        flag(so, "disable_fallback")?; // one backend: nothing to fall back from
        c.whitespace_pattern = pattern(so.get("whitespace_pattern"), "structured_outputs")?;
        let known = [
            "json",
            "regex",
            "choice",
            "grammar",
            "json_object",
            "structural_tag",
            "disable_any_whitespace",
            "disable_additional_properties",
            "disable_fallback",
            "whitespace_pattern",
        ];
        if let Some(k) = so.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(bad("structured_outputs", format!("structured_outputs has no field `{k}`")));
        }
    }
    if let Some(rf) = optional(obj, "response_format") {
        if let Some(kind) = response_format(rf)? {
            found.push(("response_format".into(), kind));
        }
    }
    // vLLM 0.11's aliases (removed in later versions, still sent by older clients).
    found.extend(kinds(obj, "", "guided_")?);
    if let Some(ws) = pattern(optional(obj, "guided_whitespace_pattern"), "guided_whitespace_pattern")? {
        c.whitespace_pattern = Some(ws);
    }
    match found.len() {
        0 => {
            if optional(obj, "structured_outputs").is_some() {
                return Err(bad(
                    "structured_outputs",
                    "You can only use one kind of structured outputs constraint but none are specified",
                ));
            }
            Ok(None)
        }
        1 => {
            let (field, kind) = found.pop().expect("one");
            c.field = field;
            c.kind = kind;
            Ok(Some(c))
        }
        _ => Err(bad(
            &found[1].0,
            format!(
                "You can only use one kind of structured outputs constraint but multiple are specified ({})",
                found.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// The constraint kinds set in `map`, keys named `{prefix}json` etc.; `field` names the
/// enclosing object in errors (empty: the key itself is the field).
fn kinds(map: &Map<String, Value>, field: &str, prefix: &str) -> Result<Vec<(String, ConstraintKind)>, ApiError> {
    let name = |key: &str| if field.is_empty() { format!("{prefix}{key}") } else { field.to_string() };
    let get = |key: &str| map.get(&format!("{prefix}{key}")).filter(|v| !v.is_null());
    let mut out = Vec::new();
    if let Some(v) = get("json") {
        let schema = match v {
            Value::String(s) => serde_json::from_str(s)
                .map_err(|e| bad(&name("json"), format!("the JSON schema given as a string is not JSON: {e}")))?,
            other => other.clone(),
        };
        if !schema.is_object() {
            return Err(bad(&name("json"), "a JSON schema must be an object (or a string holding one)"));
        }
        if depth(&schema) > MAX_NESTING {
            return Err(bad(&name("json"), format!("the JSON schema is nested more than {MAX_NESTING} levels deep")));
        }
        out.push((name("json"), ConstraintKind::Json(schema)));
    }
    if let Some(v) = get("regex") {
        let Value::String(rx) = v else { return Err(bad(&name("regex"), "regex must be a string")) };
        out.push((name("regex"), ConstraintKind::Regex(rx.clone())));
    }
    if let Some(v) = get("choice") {
        let choices =
            v.as_array().and_then(|a| a.iter().map(|c| c.as_str().map(str::to_string)).collect::<Option<Vec<_>>>());
        match choices {
            Some(c) if !c.is_empty() => out.push((name("choice"), ConstraintKind::Choice(c))),
            _ => return Err(bad(&name("choice"), "choice must be a non-empty list of strings")),
        }
    }
    if let Some(v) = get("grammar") {
        let Value::String(g) = v else { return Err(bad(&name("grammar"), "grammar must be a string")) };
        out.push((name("grammar"), ConstraintKind::Grammar(g.clone())));
    }
    if prefix.is_empty() {
        match get("json_object") {
            Some(Value::Bool(true)) => out.push((name("json_object"), ConstraintKind::JsonObject)),
            Some(Value::Bool(false)) | None => {}
            Some(_) => return Err(bad(&name("json_object"), "json_object must be a boolean")),
        }
        if let Some(v) = get("structural_tag") {
            // vLLM takes a JSON string; an object is accepted too.
            let spec = match v {
                Value::String(s) => serde_json::from_str(s).map_err(|e| {
                    bad(&name("structural_tag"), format!("structural_tag must hold a JSON object: {e}"))
                })?,
                other => other.clone(),
            };
            if !spec.is_object() {
                return Err(bad(
                    &name("structural_tag"),
                    "structural_tag must be a JSON object (or a string holding one)",
                ));
            }
            out.push((name("structural_tag"), ConstraintKind::StructuralTag(spec)));
        }
    }
    Ok(out)
}

/// `response_format` as vLLM maps it onto structured outputs.
fn response_format(rf: &Value) -> Result<Option<ConstraintKind>, ApiError> {
    let field = "response_format";
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ConstraintKind::JsonObject)),
        Some("json_schema") => {
            let schema =
                rf.get("json_schema").and_then(|j| j.get("schema")).filter(|s| !s.is_null()).ok_or_else(|| {
                    bad(field, "When response_format type is 'json_schema', the 'json_schema' field must be provided.")
                })?;
            if !schema.is_object() {
                return Err(bad(field, "json_schema.schema must be an object"));
            }
            if depth(schema) > MAX_NESTING {
                return Err(bad(field, format!("the JSON schema is nested more than {MAX_NESTING} levels deep")));
            }
            Ok(Some(ConstraintKind::Json(schema.clone())))
        }
        // The whole object is the tag, as vLLM serializes it (`structures` and `triggers`, or
        // xgrammar's `format`); a malformed one is a 400 when the engine compiles it.
        Some("structural_tag") => Ok(Some(ConstraintKind::StructuralTag(rf.clone()))),
        Some(other) => Err(bad(
            field,
            format!(
                "response_format type must be one of text, json_object, json_schema, structural_tag; got {other:?}"
            ),
        )),
        None => Err(bad(field, "response_format needs a type")),
    }
}

fn flag(map: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad("structured_outputs", format!("{key} must be a boolean"))),
    }
}

fn pattern(v: Option<&Value>, field: &str) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(field, "whitespace_pattern must be a string")),
    }
}

/// Nesting depth of a JSON value (a scalar is 0).
fn depth(v: &Value) -> usize {
    match v {
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}
