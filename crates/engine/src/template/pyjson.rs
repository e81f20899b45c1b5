//! The `tojson` filter as transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`. minijinja's own
//! `tojson` escapes `<`, `>`, `&` and `'` for HTML and writes other spacing, so a tool schema
//! rendered into a Qwen or Llama 3 prompt would differ from the text the model was trained on and
//! from what vLLM renders. Hand-written: no crate writes Python's exact layout.

use minijinja::value::{Kwargs, Value as JValue};
use minijinja::Error as JError;
use serde_json::Value;

/// The filter: `{{ x | tojson }}`, `{{ x | tojson(indent=4) }}`, `sort_keys=true`.
pub(super) fn tojson(value: JValue, kwargs: Kwargs) -> Result<JValue, JError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // Accepted for compatibility; the output is never ASCII-escaped (transformers' default).
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let v = serde_json::to_value(&value)
        .map_err(|e| JError::new(minijinja::ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    dumps(&v, indent, sort_keys.unwrap_or(false), 0, &mut out);
    Ok(JValue::from_safe_string(out))
}

/// Python's `json.dumps` layout: `", "` and `": "` without an indent; with one, each item on its
/// own line and `","` at line ends; empty containers as `[]` and `{}`.
pub(crate) fn dumps(v: &Value, indent: Option<usize>, sort_keys: bool, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number(n)),
        Value::String(s) => string(s, out),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Object(map) if map.is_empty() => out.push_str("{}"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                dumps(item, indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                string(k, out);
                out.push_str(": ");
                dumps(item, indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

/// Python's float repr where it differs from Rust's: an exponent keeps two digits and its sign
/// (`1e-07`, `1e+20`); integers stay integers.
fn number(n: &serde_json::Number) -> String {
    if n.is_f64() {
        let f = n.as_f64().unwrap_or(0.0);
        let s = format!("{f:?}");
        if let Some((mantissa, exp)) = s.split_once('e') {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            return format!("{mantissa}e{sign}{digits:0>2}");
        }
        if f.abs() >= 1e16 {
            // Python switches to exponent form at 1e16; Rust's Debug does not.
            let s = format!("{f:e}");
            let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
            let mantissa = if mantissa.contains('.') { mantissa.to_string() } else { format!("{mantissa}.0") };
            return format!("{mantissa}e+{exp:0>2}");
        }
        return s;
    }
    n.to_string()
}

/// A JSON string as Python writes it with `ensure_ascii=False`: quotes, backslashes and control
/// characters escaped, everything else as it is.
fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::dumps;
    use serde_json::json;

    fn py(v: serde_json::Value, indent: Option<usize>, sort: bool) -> String {
        let mut out = String::new();
        dumps(&v, indent, sort, 0, &mut out);
        out
    }

    // Expected strings are what CPython 3.11's json.dumps(..., ensure_ascii=False) printed.
    #[test]
    fn compact_layout_keeps_order_and_text() {
        let v = json!({"type": "function", "b": [1, 2.5, null, true], "s": "Zürich <or> 'x' \"q\"\n\u{1}", "e": {}, "l": []});
        assert_eq!(
            py(v, None, false),
            r#"{"type": "function", "b": [1, 2.5, null, true], "s": "Zürich <or> 'x' \"q\"\n\u0001", "e": {}, "l": []}"#
        );
    }

    #[test]
    fn indented_and_sorted() {
        let v = json!({"b": [1, {"x": 2}], "a": "y"});
        assert_eq!(
            py(v.clone(), Some(2), true),
            "{\n  \"a\": \"y\",\n  \"b\": [\n    1,\n    {\n      \"x\": 2\n    }\n  ]\n}"
        );
        assert_eq!(
            py(v, Some(4), false),
            "{\n    \"b\": [\n        1,\n        {\n            \"x\": 2\n        }\n    ],\n    \"a\": \"y\"\n}"
        );
    }

    #[test]
    fn floats_as_python_prints_them() {
        assert_eq!(py(json!([1.0, 1e-7, 0.1, 1e20, -2.5e-10]), None, false), "[1.0, 1e-07, 0.1, 1e+20, -2.5e-10]");
    }
}
