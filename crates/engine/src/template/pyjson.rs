//! The `tojson` filter as transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`.
//! minijinja's own `tojson` escapes `<`, `>`, `&` and `'` for HTML and writes other spacing, so a
//! tool schema rendered into a Qwen or Llama 3 prompt would differ from the text the model was
//! trained on and from what vLLM renders. Hand-written: no crate writes Python's exact layout.
//!
//! The output is bounded while it is written: an indented dump of deeply nested request data
//! (Llama 3's template writes each tool with `tojson(indent=4)`) grows by depth x indent per
//! value, so one request could otherwise allocate gigabytes inside the server's own render
//! before the render's output cap sees the string.

use super::MAX_OUTPUT;
use minijinja::value::{Kwargs, Value as JValue};
use minijinja::{Error as JError, ErrorKind};
use serde_json::Value;

/// How the dump is laid out (the filter's keyword arguments).
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub indent: Option<usize>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl Default for Layout {
    fn default() -> Self {
        Layout { indent: None, item_sep: ", ".into(), key_sep: ": ".into(), sort_keys: false, ensure_ascii: false }
    }
}

/// The filter: `{{ x | tojson }}`, `tojson(indent=4)`, `sort_keys=true`, `ensure_ascii=true`,
/// `separators=(",", ":")`.
pub(super) fn tojson(value: JValue, kwargs: Kwargs) -> Result<JValue, JError> {
    let mut layout = Layout { indent: kwargs.get("indent")?, ..Layout::default() };
    if layout.indent.is_some() {
        layout.item_sep = ",".into(); // Python's default item separator once indenting
    }
    layout.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    layout.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        let [item, key] = <[String; 2]>::try_from(seps)
            .map_err(|_| JError::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"))?;
        (layout.item_sep, layout.key_sep) = (item, key);
    }
    kwargs.assert_all_used()?;
    let v =
        serde_json::to_value(&value).map_err(|e| JError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    dumps(&v, &layout, 0, &mut out, MAX_OUTPUT).map_err(|()| {
        JError::new(ErrorKind::InvalidOperation, format!("tojson: the output exceeds {MAX_OUTPUT} bytes"))
    })?;
    Ok(JValue::from_safe_string(out))
}

/// Python's `json.dumps` layout: without an indent items are joined by the item separator; with
/// one, each item on its own line; empty containers as `[]` and `{}`. `Err` once `out` would pass
/// `budget` bytes.
pub(crate) fn dumps(v: &Value, layout: &Layout, depth: usize, out: &mut String, budget: usize) -> Result<(), ()> {
    let newline = |out: &mut String, depth: usize| -> Result<(), ()> {
        if let Some(n) = layout.indent {
            let width = n.saturating_mul(depth);
            if out.len().saturating_add(width) >= budget {
                return Err(());
            }
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width));
        }
        Ok(())
    };
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number(n)),
        Value::String(s) => string(s, layout.ensure_ascii, out),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Object(map) if map.is_empty() => out.push_str("{}"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&layout.item_sep);
                }
                newline(out, depth + 1)?;
                dumps(item, layout, depth + 1, out, budget)?;
            }
            newline(out, depth)?;
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if layout.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&layout.item_sep);
                }
                newline(out, depth + 1)?;
                string(k, layout.ensure_ascii, out);
                out.push_str(&layout.key_sep);
                dumps(item, layout, depth + 1, out, budget)?;
            }
            newline(out, depth)?;
            out.push('}');
        }
    }
    if out.len() > budget {
        return Err(());
    }
    Ok(())
}

/// Python's float repr where it differs from Rust's: an exponent keeps two digits and its sign
/// (`1e-07`, `1e+20`); integers stay integers. Both switch to exponents at the same magnitudes.
fn number(n: &serde_json::Number) -> String {
    if n.is_f64() {
        let s = format!("{:?}", n.as_f64().unwrap_or(0.0));
        if let Some((mantissa, exp)) = s.split_once('e') {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            return format!("{mantissa}e{sign}{digits:0>2}");
        }
        return s;
    }
    n.to_string()
}

/// A JSON string as Python writes it: quotes, backslashes and control characters escaped, and
/// with `ensure_ascii` everything past ASCII as `\uXXXX` (UTF-16 surrogate pairs beyond the BMP).
fn string(s: &str, ensure_ascii: bool, out: &mut String) {
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
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::{dumps, Layout};
    use serde_json::json;

    fn py(v: serde_json::Value, layout: Layout) -> String {
        let mut out = String::new();
        dumps(&v, &layout, 0, &mut out, 1 << 20).unwrap();
        out
    }

    fn indented(n: usize, sort_keys: bool) -> Layout {
        Layout { indent: Some(n), item_sep: ",".into(), sort_keys, ..Layout::default() }
    }

    // Expected strings are what CPython 3.11's json.dumps printed with the same arguments.
    #[test]
    fn compact_layout_keeps_order_and_text() {
        let v = json!({"type": "function", "b": [1, 2.5, null, true], "s": "Zürich <or> 'x' \"q\"\n\u{1}", "e": {}, "l": []});
        assert_eq!(
            py(v, Layout::default()),
            r#"{"type": "function", "b": [1, 2.5, null, true], "s": "Zürich <or> 'x' \"q\"\n\u0001", "e": {}, "l": []}"#
        );
    }

    #[test]
    fn indented_and_sorted() {
        let v = json!({"b": [1, {"x": 2}], "a": "y"});
        assert_eq!(
            py(v.clone(), indented(2, true)),
            "{\n  \"a\": \"y\",\n  \"b\": [\n    1,\n    {\n      \"x\": 2\n    }\n  ]\n}"
        );
        assert_eq!(
            py(v, indented(4, false)),
            "{\n    \"b\": [\n        1,\n        {\n            \"x\": 2\n        }\n    ],\n    \"a\": \"y\"\n}"
        );
    }

    #[test]
    fn ascii_escapes_and_separators() {
        // json.dumps({"k": "é😀"}, ensure_ascii=True, separators=(",", ":"))
        let layout = Layout { ensure_ascii: true, item_sep: ",".into(), key_sep: ":".into(), ..Layout::default() };
        assert_eq!(py(json!({"k": "é😀", "n": [1, 2]}), layout), r#"{"k":"\u00e9\ud83d\ude00","n":[1,2]}"#);
    }

    #[test]
    fn floats_as_python_prints_them() {
        assert_eq!(
            py(json!([1.0, 1e-7, 0.1, 1e20, -2.5e-10, 1e16, 123456789012345.6]), Layout::default()),
            "[1.0, 1e-07, 0.1, 1e+20, -2.5e-10, 1e+16, 123456789012345.6]"
        );
    }

    #[test]
    fn deep_indented_data_stops_at_the_budget() {
        let mut v = json!(0);
        for _ in 0..100 {
            v = json!([v, 1, 2, 3]);
        }
        let mut out = String::new();
        assert!(dumps(&v, &indented(4, false), 0, &mut out, 1 << 16).is_err());
        assert!(out.len() <= (1 << 16) + 64, "{}", out.len());
    }
}
