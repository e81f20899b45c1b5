//! Field-level validation of JSON request bodies with exact error locations.
//!
//! Request bodies are first parsed into `serde_json::Value` and then walked by hand with a
//! [`Validator`], which records every problem (not just the first) at its precise `loc` path, in the
//! shape and wording of FastAPI/pydantic v2 errors, because the preview area's clients expect that
//! shape. This module knows nothing of HTTP: the api crate turns [`FieldError`]s into a 422.

use serde::Serialize;
use serde_json::{json, Map, Value};

/// One element of an error location: an object key or an array index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Loc {
    Key(String),
    Index(usize),
}

impl From<&str> for Loc {
    fn from(s: &str) -> Self {
        Loc::Key(s.to_string())
    }
}

impl From<usize> for Loc {
    fn from(i: usize) -> Self {
        Loc::Index(i)
    }
}

/// One validation problem, serialised exactly as a pydantic v2 error item.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldError {
    pub loc: Vec<Loc>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub input: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctx: Option<Value>,
}

impl FieldError {
    pub fn new(loc: Vec<Loc>, kind: &str, msg: impl Into<String>, input: Value) -> Self {
        FieldError { loc, msg: msg.into(), kind: kind.to_string(), input, ctx: None }
    }

    pub fn with_ctx(mut self, ctx: Value) -> Self {
        self.ctx = Some(ctx);
        self
    }
}

/// Walks a JSON value, tracking the current location and collecting errors.
#[derive(Debug)]
pub struct Validator {
    path: Vec<Loc>,
    errors: Vec<FieldError>,
}

impl Validator {
    /// A validator whose locations start with `root` (`"body"` or `"query"`).
    pub fn new(root: &str) -> Self {
        Validator { path: vec![Loc::from(root)], errors: Vec::new() }
    }

    /// Runs `f` one level deeper, at `loc`.
    pub fn at<T>(&mut self, loc: impl Into<Loc>, f: impl FnOnce(&mut Self) -> T) -> T {
        self.path.push(loc.into());
        let out = f(self);
        self.path.pop();
        out
    }

    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    pub fn error_count(&self) -> usize {
        self.errors.len()
    }

    /// Finishes validation: `Ok(value)` only if no error was recorded.
    pub fn finish<T>(self, value: T) -> Result<T, Vec<FieldError>> {
        if self.errors.is_empty() {
            Ok(value)
        } else {
            Err(self.errors)
        }
    }

    pub fn into_errors(self) -> Vec<FieldError> {
        self.errors
    }

    /// Records an error at the current location.
    pub fn error(&mut self, kind: &str, msg: impl Into<String>, input: &Value) {
        self.errors.push(FieldError::new(self.path.clone(), kind, msg, input.clone()));
    }

    /// Records an error with a `ctx` object at the current location.
    pub fn error_ctx(&mut self, kind: &str, msg: impl Into<String>, input: &Value, ctx: Value) {
        self.errors.push(FieldError::new(self.path.clone(), kind, msg, input.clone()).with_ctx(ctx));
    }

    /// A custom rule failed (pydantic's `value_error`).
    pub fn value_error(&mut self, input: &Value, why: &str) {
        self.error_ctx("value_error", format!("Value error, {why}"), input, json!({ "error": why }));
    }

    /// The value must be a JSON object (a pydantic model).
    pub fn object<'a>(&mut self, value: &'a Value) -> Option<&'a Map<String, Value>> {
        match value {
            Value::Object(map) => Some(map),
            _ => {
                self.error(
                    "model_attributes_type",
                    "Input should be a valid dictionary or object to extract fields from",
                    value,
                );
                None
            }
        }
    }

    /// The value must be a JSON object used as a free-form dictionary.
    pub fn dict<'a>(&mut self, value: &'a Value) -> Option<&'a Map<String, Value>> {
        match value {
            Value::Object(map) => Some(map),
            _ => {
                self.error("dict_type", "Input should be a valid dictionary", value);
                None
            }
        }
    }

    /// A required key: records `missing` (with the containing object as input) if absent.
    pub fn required<'a>(&mut self, obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
        match obj.get(key) {
            Some(v) => Some(v),
            None => {
                self.at(key, |v| v.error("missing", "Field required", &Value::Object(obj.clone())));
                None
            }
        }
    }

    pub fn string<'a>(&mut self, value: &'a Value) -> Option<&'a str> {
        match value {
            Value::String(s) => Some(s),
            _ => {
                self.error("string_type", "Input should be a valid string", value);
                None
            }
        }
    }

    /// A string whose length (in characters) lies in `min..=max`.
    pub fn string_len<'a>(&mut self, value: &'a Value, min: usize, max: usize) -> Option<&'a str> {
        let s = self.string(value)?;
        let n = s.chars().count();
        if n < min {
            let msg = format!("String should have at least {min} character{}", plural(min));
            self.error_ctx("string_too_short", msg, value, json!({ "min_length": min }));
            None
        } else if n > max {
            let msg = format!("String should have at most {max} character{}", plural(max));
            self.error_ctx("string_too_long", msg, value, json!({ "max_length": max }));
            None
        } else {
            Some(s)
        }
    }

    /// Any JSON number, as f64. JSON itself cannot carry NaN or infinities.
    pub fn number(&mut self, value: &Value) -> Option<f64> {
        match value.as_f64() {
            Some(x) if value.is_number() && x.is_finite() => Some(x),
            Some(_) if value.is_number() => {
                self.error("finite_number", "Input should be a finite number", value);
                None
            }
            _ => {
                self.error("float_type", "Input should be a valid number", value);
                None
            }
        }
    }

    /// An integer; a float with no fractional part is accepted, as pydantic's lax mode does.
    pub fn integer(&mut self, value: &Value) -> Option<i64> {
        if let Some(i) = value.as_i64() {
            return Some(i);
        }
        match value.as_f64() {
            Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Some(x as i64),
            Some(_) => {
                self.error(
                    "int_from_float",
                    "Input should be a valid integer, got a number with a fractional part",
                    value,
                );
                None
            }
            None => {
                self.error("int_type", "Input should be a valid integer", value);
                None
            }
        }
    }

    pub fn boolean(&mut self, value: &Value) -> Option<bool> {
        match value {
            Value::Bool(b) => Some(*b),
            _ => {
                self.error("bool_type", "Input should be a valid boolean", value);
                None
            }
        }
    }

    pub fn array<'a>(&mut self, value: &'a Value) -> Option<&'a Vec<Value>> {
        match value {
            Value::Array(items) => Some(items),
            _ => {
                self.error("list_type", "Input should be a valid list", value);
                None
            }
        }
    }

    /// An array of at most `max` items.
    pub fn array_max<'a>(&mut self, value: &'a Value, max: usize) -> Option<&'a Vec<Value>> {
        let items = self.array(value)?;
        if items.len() > max {
            let msg =
                format!("List should have at most {max} item{} after validation, not {}", plural(max), items.len());
            let ctx = json!({ "field_type": "List", "max_length": max, "actual_length": items.len() });
            self.error_ctx("too_long", msg, &Value::Null, ctx);
            return None;
        }
        Some(items)
    }

    /// `lo <= x <= hi` for a number already read.
    pub fn range_f64(&mut self, value: &Value, x: f64, lo: Option<f64>, hi: Option<f64>) -> bool {
        if let Some(lo) = lo.filter(|lo| x < *lo) {
            let msg = format!("Input should be greater than or equal to {}", num_text(lo));
            self.error_ctx("greater_than_equal", msg, value, json!({ "ge": lo }));
            return false;
        }
        if let Some(hi) = hi.filter(|hi| x > *hi) {
            let msg = format!("Input should be less than or equal to {}", num_text(hi));
            self.error_ctx("less_than_equal", msg, value, json!({ "le": hi }));
            return false;
        }
        true
    }

    /// `x > lo` for a number already read.
    pub fn greater_than(&mut self, value: &Value, x: f64, lo: f64) -> bool {
        if x > lo {
            return true;
        }
        let msg = format!("Input should be greater than {}", num_text(lo));
        self.error_ctx("greater_than", msg, value, json!({ "gt": lo }));
        false
    }

    /// `lo <= i <= hi` for an integer already read.
    pub fn range_i64(&mut self, value: &Value, i: i64, lo: i64, hi: i64) -> bool {
        if i < lo {
            let msg = format!("Input should be greater than or equal to {lo}");
            self.error_ctx("greater_than_equal", msg, value, json!({ "ge": lo }));
            false
        } else if i > hi {
            let msg = format!("Input should be less than or equal to {hi}");
            self.error_ctx("less_than_equal", msg, value, json!({ "le": hi }));
            false
        } else {
            true
        }
    }

    /// The value must be one of `allowed` strings.
    pub fn literal<'a>(&mut self, value: &Value, allowed: &[&'a str]) -> Option<&'a str> {
        if let Some(s) = value.as_str() {
            if let Some(found) = allowed.iter().find(|a| **a == s) {
                return Some(found);
            }
        }
        let expected = literal_list(allowed);
        self.error_ctx("literal_error", format!("Input should be {expected}"), value, json!({ "expected": expected }));
        None
    }

    /// The value must be a UUID string.
    pub fn uuid(&mut self, value: &Value) -> Option<uuid::Uuid> {
        let s = self.string(value)?;
        match uuid::Uuid::parse_str(s) {
            Ok(id) => Some(id),
            Err(e) => {
                let msg = format!("Input should be a valid UUID, {e}");
                self.error_ctx("uuid_parsing", msg, value, json!({ "error": e.to_string() }));
                None
            }
        }
    }
}

/// `'a', 'b' or 'c'`, as pydantic lists literal choices.
fn literal_list(allowed: &[&str]) -> String {
    let quoted: Vec<String> = allowed.iter().map(|a| format!("'{a}'")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Numbers in messages as Python prints them: `1` for whole numbers, else shortest float form.
fn num_text(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// Reads an optional field: absent or `null` both mean "use the default" (contract §1).
pub fn optional<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_every_error_with_its_path() {
        let body = json!({"a": [1, "x", 3.5]});
        let mut v = Validator::new("body");
        let obj = v.object(&body).unwrap();
        let items = v.at("a", |v| v.array(&obj["a"]).unwrap().clone());
        for (i, item) in items.iter().enumerate() {
            v.at("a", |v| v.at(i, |v| v.integer(item)));
        }
        v.required(obj, "b");
        let errors = v.into_errors();
        assert_eq!(errors.len(), 3);
        let e = serde_json::to_value(&errors).unwrap();
        assert_eq!(e[0]["loc"], json!(["body", "a", 1]));
        assert_eq!(e[0]["type"], "int_type");
        assert_eq!(e[1]["loc"], json!(["body", "a", 2]));
        assert_eq!(e[1]["type"], "int_from_float");
        assert_eq!(e[2]["loc"], json!(["body", "b"]));
        assert_eq!(e[2]["msg"], "Field required");
        assert_eq!(e[2]["input"], body);
        assert!(e[2].get("ctx").is_none());
    }

    #[test]
    fn literal_and_range_messages_match_pydantic() {
        let mut v = Validator::new("body");
        v.literal(&json!("x"), &["token", "sequence", "average"]);
        v.range_f64(&json!(2), 2.0, Some(-1.0), Some(1.0));
        v.range_i64(&json!(0), 0, 1, 100);
        let e = serde_json::to_value(v.into_errors()).unwrap();
        assert_eq!(e[0]["msg"], "Input should be 'token', 'sequence' or 'average'");
        assert_eq!(e[1]["msg"], "Input should be less than or equal to 1");
        assert_eq!(e[1]["ctx"], json!({"le": 1.0}));
        assert_eq!(e[2]["msg"], "Input should be greater than or equal to 1");
    }

    #[test]
    fn numbers_accept_ints_and_integers_accept_whole_floats() {
        let mut v = Validator::new("body");
        assert_eq!(v.number(&json!(3)), Some(3.0));
        assert_eq!(v.integer(&json!(4.0)), Some(4));
        assert_eq!(v.number(&json!("3")), None);
        assert_eq!(v.boolean(&json!(1)), None);
        assert_eq!(v.into_errors().len(), 2);
    }
}
