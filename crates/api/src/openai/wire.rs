//! The chat response bodies as vLLM's OpenAI server writes them, as `Serialize` types: one
//! `chat.completion`, or `chat.completion.chunk` frames. Fields vLLM always writes as null
//! (`refusal`, `system_fingerprint`, ...) are [`Null`]; fields it writes only sometimes are
//! skipped when `None`.

use serde::ser::{Serialize, SerializeMap, Serializer};
use std::sync::Arc;
use tandem_core::inference::{RankedLogprob, StopReason};

/// A field that is always `null` on the wire.
pub type Null = Option<()>;

#[derive(Debug, serde::Serialize)]
pub struct ChatCompletion {
    pub id: Arc<str>,
    pub object: &'static str,
    pub created: u64,
    pub model: Arc<str>,
    pub choices: Vec<Choice>,
    pub usage: Usage,
    pub system_fingerprint: Null,
    pub service_tier: Null,
    pub prompt_logprobs: Option<Vec<Option<PositionLogprobs>>>,
    pub prompt_token_ids: Option<Vec<u32>>,
    pub kv_transfer_params: Null,
}

#[derive(Debug, serde::Serialize)]
pub struct Choice {
    pub index: usize,
    pub message: Message,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: &'static str,
    pub stop_reason: Option<StopReasonOut>,
    pub token_ids: Option<Vec<u32>>,
}

#[derive(Debug, serde::Serialize)]
pub struct Message {
    pub role: String,
    pub content: Option<String>,
    pub refusal: Null,
    pub annotations: Null,
    pub audio: Null,
    pub function_call: Null,
    pub reasoning: Option<String>,
    /// vLLM <= 0.11's name for `reasoning`, still read by older clients: written (possibly
    /// null) only when the server has a reasoning parser.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Option<String>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ChoiceLogprobs {
    pub content: Vec<LogprobEntry>,
}

/// A generated token's logprob entry; `bytes` are its raw bytes (whole even when the text shows
/// a split character), so a client can map it back to its token id.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LogprobEntry {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopEntry>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TopEntry {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// `stop_reason`: the stop string, or the stop token's id.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum StopReasonOut {
    Text(String),
    Token(u32),
}

impl From<&StopReason> for StopReasonOut {
    fn from(s: &StopReason) -> Self {
        match s {
            StopReason::Text(t) => StopReasonOut::Text(t.clone()),
            StopReason::Token(id) => StopReasonOut::Token(*id),
        }
    }
}

/// One prompt position's logprobs as vLLM writes them: `{"<token id>": {logprob, rank,
/// decoded_token}}`, the actual token first.
#[derive(Debug, Clone)]
pub struct PositionLogprobs(pub Vec<RankedLogprob>);

impl Serialize for PositionLogprobs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Entry<'a> {
            logprob: f32,
            rank: usize,
            decoded_token: &'a str,
        }
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for e in &self.0 {
            map.serialize_entry(
                &e.token_id.to_string(),
                &Entry { logprob: e.logprob, rank: e.rank, decoded_token: &e.decoded },
            )?;
        }
        map.end()
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    /// Only with a reasoning parser: how many completion tokens wrote reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: usize,
}

#[derive(Debug, serde::Serialize)]
pub struct Chunk {
    pub id: Arc<str>,
    pub object: &'static str,
    pub created: u64,
    pub model: Arc<str>,
    pub choices: Vec<ChunkChoice>,
    /// On the first chunk, with `return_token_ids`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// With `continuous_usage_stats`, and on the closing usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// Only on a choice's finishing chunk (where it may be null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Option<StopReasonOut>>,
    /// With `return_token_ids`: the chunk's token (none on the finishing chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// vLLM streams a call as one delta naming it (id, type, name, empty arguments), then one with
/// its arguments.
#[derive(Debug, serde::Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, serde::Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn always_null_and_sometimes_present_fields() {
        let m = Message {
            role: "assistant".into(),
            content: None,
            refusal: None,
            annotations: None,
            audio: None,
            function_call: None,
            reasoning: None,
            reasoning_content: Some(None),
            tool_calls: Vec::new(),
        };
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"role": "assistant", "content": null, "refusal": null, "annotations": null, "audio": null,
                   "function_call": null, "reasoning": null, "reasoning_content": null})
        );
        let p = PositionLogprobs(vec![
            RankedLogprob { token_id: 7, logprob: -0.5, rank: 3, decoded: "a".into() },
            RankedLogprob { token_id: 2, logprob: -0.25, rank: 1, decoded: "b".into() },
        ]);
        // The actual token first, whatever its rank.
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"7":{"logprob":-0.5,"rank":3,"decoded_token":"a"},"2":{"logprob":-0.25,"rank":1,"decoded_token":"b"}}"#
        );
        let stops = [StopReasonOut::from(&StopReason::Text("x".into())), StopReasonOut::from(&StopReason::Token(2))];
        assert_eq!(serde_json::to_value(stops).unwrap(), json!(["x", 2]));
    }
}
