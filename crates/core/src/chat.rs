//! Chat messages, typed where the server reads them and open where only the chat template does.
//!
//! The server reads a message's `role` and the text of its `content`; every other field (`name`,
//! `tool_calls`, `tool_call_id`, `reasoning`, vendor extensions) is kept as sent in `extra`,
//! because chat templates read whatever a client puts there.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// Text, a list of content parts, null, or absent (an assistant turn that only calls tools
    /// may send either): the template sees exactly what was sent.
    #[serde(default, skip_serializing_if = "Content::is_absent")]
    pub content: Content,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub enum Content {
    /// The message has no `content` field.
    #[default]
    Absent,
    /// `content: null`.
    Null,
    Text(String),
    /// OpenAI's content parts (`{"type": "text", "text": ...}`, images, ...) as sent.
    Parts(Vec<Value>),
}

impl Content {
    pub fn is_absent(&self) -> bool {
        matches!(self, Content::Absent)
    }

    /// The text of the content: a string as is, text parts joined by newlines (as vLLM joins
    /// them for templates that take a string), nothing otherwise.
    pub fn text(&self) -> String {
        match self {
            Content::Text(s) => s.clone(),
            Content::Parts(parts) => parts_text(parts),
            Content::Absent | Content::Null => String::new(),
        }
    }
}

impl Serialize for Content {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Content::Absent | Content::Null => s.serialize_none(),
            Content::Text(t) => s.serialize_str(t),
            Content::Parts(p) => p.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Content {
    /// Called only when the field is present (absence is the default).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(Content::Null),
            Value::String(s) => Ok(Content::Text(s)),
            Value::Array(p) => Ok(Content::Parts(p)),
            _ => Err(serde::de::Error::custom("content must be a string, a list of content parts or null")),
        }
    }
}

/// The text of a JSON `content` (a string, a list of parts, anything else empty), as
/// [`Content::text`] reads it.
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts_text(parts),
        _ => String::new(),
    }
}

fn parts_text(parts: &[Value]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("text").and_then(Value::as_str).map(str::to_string),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl ChatMessage {
    /// A message of plain text.
    pub fn text_message(role: &str, text: impl Into<String>) -> Self {
        ChatMessage { role: role.to_string(), content: Content::Text(text.into()), extra: Map::new() }
    }

    /// The text of the content; empty without content.
    pub fn text(&self) -> String {
        self.content.text()
    }

    /// The message's non-empty `tool_calls` list, if it has one.
    pub fn tool_calls(&self) -> Option<&Vec<Value>> {
        self.extra.get("tool_calls").and_then(Value::as_array).filter(|c| !c.is_empty())
    }

    /// Reads a message from JSON: an object with a string `role`, and `content` a string, a list
    /// or null. The error says what is wrong.
    pub fn from_value(v: &Value) -> Result<Self, String> {
        let obj = v.as_object().ok_or("a message must be an object")?;
        match obj.get("role") {
            Some(Value::String(_)) => {}
            Some(_) => return Err("a message's role must be a string".into()),
            None => return Err("a message needs a role".into()),
        }
        match obj.get("content") {
            None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
            Some(_) => return Err("a message's content must be a string, a list of content parts or null".into()),
        }
        serde_json::from_value(v.clone()).map_err(|e| e.to_string())
    }

    /// The message as the chat template sees it.
    pub fn to_value(&self) -> Value {
        // Strings, lists and maps of JSON values always serialise.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Reads a list of messages; the error names the first bad one (`messages[i]: ...`).
pub fn messages_from_values(values: &[Value]) -> Result<Vec<ChatMessage>, String> {
    values
        .iter()
        .enumerate()
        .map(|(i, m)| ChatMessage::from_value(m).map_err(|e| format!("messages[{i}]: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extra_fields_reach_the_template_as_sent() {
        let v = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1"}], "name": "bot"});
        let m = ChatMessage::from_value(&v).unwrap();
        assert_eq!(m.content, Content::Null);
        assert_eq!(m.tool_calls().unwrap().len(), 1);
        assert_eq!(m.to_value(), v);
        // Absent content stays absent (templates may test `is defined`).
        let m = ChatMessage::from_value(&json!({"role": "user"})).unwrap();
        assert_eq!(m.to_value(), json!({"role": "user"}));
        assert_eq!(m.text(), "");
    }

    #[test]
    fn content_text_joins_text_parts() {
        let m = ChatMessage::from_value(
            &json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, "b"]}),
        )
        .unwrap();
        assert_eq!(m.text(), "a\nb");
        assert_eq!(ChatMessage::text_message("system", "s").to_value(), json!({"role": "system", "content": "s"}));
    }

    #[test]
    fn malformed_messages_say_why() {
        for (bad, why) in [
            (json!("hi"), "must be an object"),
            (json!({"content": "x"}), "needs a role"),
            (json!({"role": 3}), "role must be a string"),
            (json!({"role": "user", "content": 5}), "content must be"),
        ] {
            assert!(ChatMessage::from_value(&bad).unwrap_err().contains(why), "{bad}");
        }
        let e = messages_from_values(&[json!({"role": "user"}), json!({})]).unwrap_err();
        assert!(e.starts_with("messages[1]: "), "{e}");
    }
}
