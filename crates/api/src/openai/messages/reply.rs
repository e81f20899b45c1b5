//! The chat result as Anthropic's `message`, and the chat chunks as Anthropic's stream events
//! (`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`,
//! `message_stop`). Reasoning becomes `thinking` blocks, text `text` blocks, tool calls
//! `tool_use` blocks. With vLLM's extras `return_token_ids` and `logprobs` the message also
//! carries `prompt_token_ids`, `token_ids` and the sampled tokens' `logprobs` (what ART trains on).

use crate::openai::response::Renderer;
use crate::openai::sse::Frames;
use crate::openai::wire::{ChatCompletion, Chunk, StopReasonOut};
use axum::body::Bytes;
use serde::Serialize;
use serde_json::{json, Value};
use tandem_core::inference::InferEvent;

#[derive(Debug, Serialize)]
pub struct Message {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<Block>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<f32>>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text { text: String },
    Thinking { thinking: String, signature: String },
    ToolUse { id: String, name: String, input: Value },
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Usage {
    pub input_tokens: usize,
    pub output_tokens: usize,
}

/// Anthropic's `stop_reason` (and `stop_sequence`) for a chat choice's finish.
fn stop(finish: &str, stop_reason: Option<&StopReasonOut>) -> (&'static str, Option<String>) {
    match (finish, stop_reason) {
        ("tool_calls", _) => ("tool_use", None),
        ("length", _) => ("max_tokens", None),
        ("stop", Some(StopReasonOut::Text(s))) => ("stop_sequence", Some(s.clone())),
        _ => ("end_turn", None),
    }
}

/// A call's arguments as the `input` object (the text itself if it is not JSON).
fn input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}

/// `msg_<request id>`.
pub fn message_id(request_id: &str) -> String {
    format!("msg_{request_id}")
}

/// The whole message of a non-streamed chat result (its one choice).
pub fn message(c: ChatCompletion, request_id: &str) -> Message {
    let usage = Usage { input_tokens: c.usage.prompt_tokens, output_tokens: c.usage.completion_tokens };
    let mut out = Message {
        id: message_id(request_id),
        kind: "message",
        role: "assistant",
        model: c.model.to_string(),
        content: Vec::new(),
        stop_reason: None,
        stop_sequence: None,
        usage,
        prompt_token_ids: c.prompt_token_ids,
        token_ids: None,
        logprobs: None,
    };
    let Some(choice) = c.choices.into_iter().next() else { return out };
    let m = choice.message;
    if let Some(thinking) = m.reasoning.filter(|t| !t.is_empty()) {
        out.content.push(Block::Thinking { thinking, signature: String::new() });
    }
    if let Some(text) = m.content.filter(|t| !t.is_empty() || m.tool_calls.is_empty()) {
        out.content.push(Block::Text { text });
    }
    for call in m.tool_calls {
        out.content.push(Block::ToolUse {
            id: call.id,
            name: call.function.name,
            input: input(&call.function.arguments),
        });
    }
    let called = out.content.iter().any(|b| matches!(b, Block::ToolUse { .. }));
    let (reason, sequence) =
        stop(if called { "tool_calls" } else { choice.finish_reason }, choice.stop_reason.as_ref());
    out.stop_reason = Some(reason);
    out.stop_sequence = sequence;
    out.token_ids = choice.token_ids;
    out.logprobs = choice.logprobs.map(|l| l.content.iter().map(|e| e.logprob).collect());
    out
}

/// One `event: <type>` frame.
fn event(kind: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// The kind of the content block being streamed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Text,
    Thinking,
    ToolUse,
}

/// Chat chunks as Anthropic stream events, block by block.
pub struct Stream {
    chat: Renderer,
    id: String,
    model: String,
    prompt_tokens: usize,
    prompt_token_ids: Option<Vec<u32>>,
    with_ids: bool,
    with_logprobs: bool,
    output_tokens: usize,
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    /// The index and kind of the open block.
    open: Option<(usize, Open)>,
    /// A tool_use block was sent (the stop reason is then `tool_use`, whatever the choice).
    called: bool,
    next_index: usize,
    finished: bool,
}

impl Stream {
    pub fn new(
        chat: Renderer,
        request_id: &str,
        model: &str,
        prompt: Vec<u32>,
        with_ids: bool,
        with_logprobs: bool,
    ) -> Self {
        Stream {
            chat,
            id: message_id(request_id),
            model: model.to_string(),
            prompt_tokens: prompt.len(),
            prompt_token_ids: with_ids.then_some(prompt),
            with_ids,
            with_logprobs,
            output_tokens: 0,
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            open: None,
            called: false,
            next_index: 0,
            finished: false,
        }
    }

    fn close(&mut self, out: &mut Vec<Bytes>) {
        if let Some((index, _)) = self.open.take() {
            out.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
        }
    }

    /// Makes `kind` the open block (closing another), starting it with `start`.
    fn ensure(&mut self, kind: Open, start: Value, out: &mut Vec<Bytes>) -> usize {
        if let Some((index, open)) = self.open {
            if open == kind && kind != Open::ToolUse {
                return index;
            }
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, kind));
        out.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        index
    }

    fn delta(index: usize, delta: Value) -> Bytes {
        event("content_block_delta", &json!({"type": "content_block_delta", "index": index, "delta": delta}))
    }

    /// The events of one chat chunk (the stream has one choice).
    fn chunk(&mut self, c: Chunk, out: &mut Vec<Bytes>) {
        for choice in c.choices {
            if let Some(ids) = choice.token_ids.filter(|_| self.with_ids) {
                self.token_ids.extend(ids);
            }
            if let Some(l) = choice.logprobs.filter(|_| self.with_logprobs) {
                self.logprobs.extend(l.content.iter().map(|e| e.logprob));
            }
            let d = choice.delta;
            if let Some(thinking) = d.reasoning.filter(|t| !t.is_empty()) {
                let i = self.ensure(Open::Thinking, json!({"type": "thinking", "thinking": "", "signature": ""}), out);
                out.push(Self::delta(i, json!({"type": "thinking_delta", "thinking": thinking})));
            }
            if let Some(text) = d.content.filter(|t| !t.is_empty()) {
                let i = self.ensure(Open::Text, json!({"type": "text", "text": ""}), out);
                out.push(Self::delta(i, json!({"type": "text_delta", "text": text})));
            }
            for call in d.tool_calls.unwrap_or_default() {
                match call.function.name {
                    // A call's first delta names it; the next carries its arguments.
                    Some(name) => {
                        let start =
                            json!({"type": "tool_use", "id": call.id.unwrap_or_default(), "name": name, "input": {}});
                        self.ensure(Open::ToolUse, start, out);
                        self.called = true;
                    }
                    None => {
                        if let Some((i, Open::ToolUse)) = self.open {
                            out.push(Self::delta(
                                i,
                                json!({"type": "input_json_delta", "partial_json": call.function.arguments}),
                            ));
                        }
                    }
                }
            }
            if let Some(finish) = choice.finish_reason {
                if self.next_index == 0 {
                    // Nothing was written: one empty text block, as the whole message has.
                    self.ensure(Open::Text, json!({"type": "text", "text": ""}), out);
                }
                self.close(out);
                let finish = if self.called { "tool_calls" } else { finish };
                let (reason, sequence) = stop(finish, choice.stop_reason.flatten().as_ref());
                let mut delta = json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                       "usage": {"output_tokens": self.output_tokens}});
                if self.with_ids {
                    delta["token_ids"] = json!(self.token_ids);
                }
                if self.with_logprobs {
                    delta["logprobs"] = json!(self.logprobs);
                }
                out.push(event("message_delta", &delta));
                out.push(event("message_stop", &json!({"type": "message_stop"})));
                self.finished = true;
            }
        }
    }
}

impl Frames for Stream {
    type Event = InferEvent;

    fn opening(&mut self) -> Vec<Bytes> {
        let mut message = json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}});
        if let Some(ids) = &self.prompt_token_ids {
            message["prompt_token_ids"] = json!(ids);
        }
        vec![
            event("message_start", &json!({"type": "message_start", "message": message})),
            event("ping", &json!({"type": "ping"})),
        ]
    }

    fn event(&mut self, ev: InferEvent) -> Result<Vec<Bytes>, String> {
        if let InferEvent::Error(m) = ev {
            return Err(format!("generation failed: {m}"));
        }
        if matches!(ev, InferEvent::Token { choice: 0, .. }) {
            self.output_tokens += 1;
        }
        let mut out = Vec::new();
        for c in self.chat.chunks_for(ev) {
            self.chunk(c, &mut out);
        }
        Ok(out)
    }

    fn failure(&self, message: &str) -> Vec<Bytes> {
        vec![event("error", &json!({"type": "error", "error": {"type": "api_error", "message": message}}))]
    }

    fn closing(&mut self) -> Vec<Bytes> {
        Vec::new()
    }

    fn done(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_map_to_anthropic_stop_reasons() {
        assert_eq!(stop("stop", None), ("end_turn", None));
        assert_eq!(stop("stop", Some(&StopReasonOut::Token(2))), ("end_turn", None));
        assert_eq!(stop("stop", Some(&StopReasonOut::Text("END".into()))), ("stop_sequence", Some("END".into())));
        assert_eq!(stop("length", None), ("max_tokens", None));
        assert_eq!(stop("tool_calls", None), ("tool_use", None));
        assert_eq!(input("{\"a\": 1}"), json!({"a": 1}));
        assert_eq!(input("not json"), json!("not json"));
        let b = serde_json::to_value(Block::ToolUse { id: "t".into(), name: "f".into(), input: json!({}) }).unwrap();
        assert_eq!(b, json!({"type": "tool_use", "id": "t", "name": "f", "input": {}}));
    }
}
