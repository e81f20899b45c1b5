//! The chat result as a Responses `response` object, and the chat chunks as the Responses stream
//! events (`response.created`, `response.output_item.added`, `response.output_text.delta`,
//! `response.function_call_arguments.delta`, ..., `response.completed`). Reasoning becomes a
//! `reasoning` item, text a `message` item with one `output_text` part, tool calls
//! `function_call` items. With vLLM's `return_token_ids` the response also carries
//! `token_generations` (the prompt's and the output's ids, and the sampled tokens' logprobs when
//! they were asked for), which ART 0.5.23 reads from a recorded `responses` exchange.

use crate::openai::response::Renderer;
use crate::openai::sse::Frames;
use crate::openai::wire::{ChatCompletion, Chunk, Usage as ChatUsage};
use axum::body::Bytes;
use serde_json::{json, Map, Value};
use std::future::Future;
use std::pin::Pin;
use tandem_core::inference::InferEvent;

/// What every response of one request shares.
#[derive(Debug, Clone)]
pub struct Head {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    /// The request settings the object repeats (`instructions`, `tools`, `temperature`, ...).
    pub settings: Map<String, Value>,
    pub with_ids: bool,
    pub with_logprobs: bool,
}

impl Head {
    /// A fresh `resp_` id: made here, never from the client's request id, since stored
    /// responses are looked up by it.
    pub fn new(model: &str, settings: Map<String, Value>, with_ids: bool, with_logprobs: bool) -> Self {
        let created_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let id = format!("resp_{}", tandem_core::new_id().simple());
        Head { id, created_at, model: model.to_string(), settings, with_ids, with_logprobs }
    }

    fn item_id(&self, prefix: &str, n: usize) -> String {
        format!("{prefix}_{}_{n}", self.id.trim_start_matches("resp_"))
    }

    /// The response object: `status` `in_progress`, `completed` or `incomplete` (cut at
    /// `max_output_tokens`).
    fn object(&self, status: &str, output: Vec<Value>, usage: Option<&ChatUsage>) -> Value {
        let mut o = Map::new();
        o.insert("id".into(), json!(self.id));
        o.insert("object".into(), json!("response"));
        o.insert("created_at".into(), json!(self.created_at));
        o.insert("status".into(), json!(status));
        o.insert("model".into(), json!(self.model));
        o.insert("output".into(), Value::Array(output));
        o.insert("error".into(), Value::Null);
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        o.insert("incomplete_details".into(), incomplete.unwrap_or(Value::Null));
        o.insert(
            "usage".into(),
            usage.map_or(Value::Null, |u| {
                json!({
                    "input_tokens": u.prompt_tokens,
                    // The OpenAI SDK requires `cache_write_tokens`: tandem's prefix cache is
                    // written as a side effect, never billed, so 0.
                    "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens, "cache_write_tokens": 0},
                    "output_tokens": u.completion_tokens,
                    "output_tokens_details": {"reasoning_tokens": u.completion_tokens_details.as_ref().map_or(0, |d| d.reasoning_tokens)},
                    "total_tokens": u.total_tokens,
                })
            }),
        );
        for (k, v) in &self.settings {
            o.insert(k.clone(), v.clone());
        }
        Value::Object(o)
    }

    /// `token_generations`, as ART reads them: one generation covering every output item.
    fn token_generations(&self, prompt: &[u32], ids: &[u32], logprobs: &[f32], items: usize) -> Option<Value> {
        self.with_ids.then(|| {
            let mut g =
                json!({"prompt_token_ids": prompt, "token_ids": ids, "output_indices": (0..items).collect::<Vec<_>>()});
            if self.with_logprobs {
                g["compact_logprobs"] = json!(logprobs);
            }
            json!([g])
        })
    }
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}], "status": "completed"})
}

fn text_part(text: &str, logprobs: Option<&[Value]>) -> Value {
    let mut part = json!({"type": "output_text", "text": text, "annotations": []});
    if let Some(l) = logprobs {
        part["logprobs"] = json!(l);
    }
    part
}

fn message_item(id: &str, status: &str, content: Vec<Value>) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

/// The output text's logprobs in the Responses shape.
fn logprob_entries(entries: &[crate::openai::wire::LogprobEntry]) -> Vec<Value> {
    entries
        .iter()
        .map(|e| {
            let top: Vec<Value> = e
                .top_logprobs
                .iter()
                .map(|t| json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes}))
                .collect();
            json!({"token": e.token, "logprob": e.logprob, "bytes": e.bytes, "top_logprobs": top})
        })
        .collect()
}

/// A whole result: the response object, and its output as the chat assistant message that
/// continues the conversation.
pub fn response(head: &Head, c: ChatCompletion) -> (Value, Value) {
    let usage = c.usage.clone();
    let prompt = c.prompt_token_ids.clone().unwrap_or_default();
    let Some(choice) = c.choices.into_iter().next() else {
        return (head.object("incomplete", Vec::new(), Some(&usage)), json!({}));
    };
    let m = choice.message;
    let mut output = Vec::new();
    if let Some(thinking) = m.reasoning.as_deref().filter(|t| !t.is_empty()) {
        output.push(reasoning_item(&head.item_id("rs", 0), thinking));
    }
    let logprobs = choice.logprobs.as_ref().map(|l| logprob_entries(&l.content));
    let text = m.content.clone().unwrap_or_default();
    // A message when there is text, or when there is nothing else (as the stream has it).
    if !text.is_empty() || (output.is_empty() && m.tool_calls.is_empty()) {
        let part = text_part(&text, logprobs.as_deref().filter(|_| head.with_logprobs));
        output.push(message_item(&head.item_id("msg", 0), "completed", vec![part]));
    }
    for (k, call) in m.tool_calls.iter().enumerate() {
        output.push(call_item(
            &head.item_id("fc", k),
            &call.id,
            &call.function.name,
            &call.function.arguments,
            "completed",
        ));
    }
    let status = if choice.finish_reason == "length" { "incomplete" } else { "completed" };
    let sampled: Vec<f32> =
        choice.logprobs.as_ref().map(|l| l.content.iter().map(|e| e.logprob).collect()).unwrap_or_default();
    let ids = choice.token_ids.clone().unwrap_or_default();
    let generations = head.token_generations(&prompt, &ids, &sampled, output.len());
    let mut object = head.object(status, output, Some(&usage));
    if let Some(g) = generations {
        object["token_generations"] = g;
    }
    let mut assistant = json!({"role": "assistant", "content": m.content});
    if !m.tool_calls.is_empty() {
        assistant["tool_calls"] = json!(m.tool_calls);
    }
    (object, assistant)
}

/// Stores the finished response; the stream awaits it before `response.completed` goes out, so a
/// client may chain on the id at once.
pub type Store = Box<dyn FnOnce(Value, Value) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The item being streamed.
#[derive(Debug, Clone, PartialEq)]
enum Open {
    Reasoning { index: usize, id: String, text: String },
    Message { index: usize, id: String, text: String, logprobs: Vec<Value> },
    Call { index: usize, id: String, call_id: String, name: String, arguments: String },
}

/// Chat chunks as Responses stream events.
pub struct Stream {
    chat: Renderer,
    head: Head,
    prompt: Vec<u32>,
    seq: u64,
    open: Option<Open>,
    /// Finished output items, in order.
    output: Vec<Value>,
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    assistant_text: String,
    calls: Vec<Value>,
    finish: Option<&'static str>,
    store: Option<Store>,
}

impl Stream {
    pub fn new(chat: Renderer, head: Head, prompt: Vec<u32>, store: Option<Store>) -> Self {
        Stream {
            chat,
            head,
            prompt,
            seq: 0,
            open: None,
            output: Vec::new(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            assistant_text: String::new(),
            calls: Vec::new(),
            finish: None,
            store,
        }
    }

    fn event(&mut self, kind: &str, mut data: Value) -> Bytes {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
    }

    /// Ends the open item with its `done` events.
    fn close(&mut self, out: &mut Vec<Bytes>) {
        let Some(open) = self.open.take() else { return };
        let item = match open {
            Open::Reasoning { index, id, text } => {
                let e = json!({"item_id": id, "output_index": index, "content_index": 0, "text": text});
                out.push(self.event("response.reasoning_text.done", e));
                (index, reasoning_item(&id, &text))
            }
            Open::Message { index, id, text, logprobs } => {
                let lp = self.head.with_logprobs.then_some(logprobs.as_slice());
                let e = json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": logprobs});
                out.push(self.event("response.output_text.done", e));
                let part = text_part(&text, lp);
                let e = json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
                out.push(self.event("response.content_part.done", e));
                self.assistant_text.push_str(&text);
                (index, message_item(&id, "completed", vec![part]))
            }
            Open::Call { index, id, call_id, name, arguments } => {
                let e = json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments});
                out.push(self.event("response.function_call_arguments.done", e));
                self.calls.push(
                    json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}),
                );
                (index, call_item(&id, &call_id, &name, &arguments, "completed"))
            }
        };
        let (index, item) = item;
        out.push(self.event("response.output_item.done", json!({"output_index": index, "item": item.clone()})));
        self.output.push(item);
    }

    /// Opens a new item at the next output index.
    fn start(&mut self, open: Open, out: &mut Vec<Bytes>) {
        self.close(out);
        let index = self.output.len();
        let (open, item) = match open {
            Open::Reasoning { .. } => {
                let id = self.head.item_id("rs", index);
                let item =
                    json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"});
                (Open::Reasoning { index, id, text: String::new() }, item)
            }
            Open::Message { .. } => {
                let id = self.head.item_id("msg", index);
                (
                    Open::Message { index, id: id.clone(), text: String::new(), logprobs: Vec::new() },
                    message_item(&id, "in_progress", Vec::new()),
                )
            }
            Open::Call { call_id, name, .. } => {
                let id = self.head.item_id("fc", index);
                let item = call_item(&id, &call_id, &name, "", "in_progress");
                (Open::Call { index, id, call_id, name, arguments: String::new() }, item)
            }
        };
        let frame = self.event("response.output_item.added", json!({"output_index": index, "item": item}));
        out.push(frame);
        if let Open::Message { index, id, .. } = &open {
            let part = text_part("", self.head.with_logprobs.then_some(&[][..]));
            let e = json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
            let frame = self.event("response.content_part.added", e);
            out.push(frame);
        }
        self.open = Some(open);
    }

    fn chunk(&mut self, c: Chunk, out: &mut Vec<Bytes>) {
        for choice in c.choices {
            self.token_ids.extend(choice.token_ids.unwrap_or_default());
            let entries = choice.logprobs.map(|l| l.content).unwrap_or_default();
            self.logprobs.extend(entries.iter().map(|e| e.logprob));
            let d = choice.delta;
            if let Some(thinking) = d.reasoning.filter(|t| !t.is_empty()) {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    self.start(Open::Reasoning { index: 0, id: String::new(), text: String::new() }, out);
                }
                let e = match &mut self.open {
                    Some(Open::Reasoning { index, id, text }) => {
                        text.push_str(&thinking);
                        Some(json!({"item_id": id, "output_index": index, "content_index": 0, "delta": thinking}))
                    }
                    _ => None,
                };
                if let Some(e) = e {
                    let frame = self.event("response.reasoning_text.delta", e);
                    out.push(frame);
                }
            }
            let text = d.content.unwrap_or_default();
            if !text.is_empty() || (!entries.is_empty() && matches!(self.open, Some(Open::Message { .. }))) {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.start(
                        Open::Message { index: 0, id: String::new(), text: String::new(), logprobs: Vec::new() },
                        out,
                    );
                }
                let lps = logprob_entries(&entries);
                let shown: Vec<Value> = if self.head.with_logprobs { lps.clone() } else { Vec::new() };
                let e = match &mut self.open {
                    Some(Open::Message { index, id, text: all, logprobs }) => {
                        all.push_str(&text);
                        logprobs.extend(lps);
                        Some(
                            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": shown}),
                        )
                    }
                    _ => None,
                };
                if let Some(e) = e {
                    let frame = self.event("response.output_text.delta", e);
                    out.push(frame);
                }
            }
            for call in d.tool_calls.unwrap_or_default() {
                match call.function.name {
                    Some(name) => {
                        let call_id = call.id.unwrap_or_default();
                        self.start(
                            Open::Call { index: 0, id: String::new(), call_id, name, arguments: String::new() },
                            out,
                        );
                    }
                    None => {
                        let e = match &mut self.open {
                            Some(Open::Call { index, id, arguments, .. }) => {
                                arguments.push_str(&call.function.arguments);
                                Some(json!({"item_id": id, "output_index": index, "delta": call.function.arguments}))
                            }
                            _ => None,
                        };
                        if let Some(e) = e {
                            let frame = self.event("response.function_call_arguments.delta", e);
                            out.push(frame);
                        }
                    }
                }
            }
            if let Some(finish) = choice.finish_reason {
                self.close(out);
                if self.output.is_empty() {
                    // Nothing was generated: the response still holds one (empty) message.
                    self.start(
                        Open::Message { index: 0, id: String::new(), text: String::new(), logprobs: Vec::new() },
                        out,
                    );
                    self.close(out);
                }
                self.finish = Some(finish);
            }
        }
    }

    /// The finished object (with the usage of the closing chat chunk) and the assistant turn.
    fn finished(&mut self) -> (Value, Value) {
        let usage = self.chat.closing_chunks().into_iter().find_map(|c| c.usage);
        let status = if self.finish == Some("length") { "incomplete" } else { "completed" };
        let generations = self.head.token_generations(&self.prompt, &self.token_ids, &self.logprobs, self.output.len());
        let mut object = self.head.object(status, self.output.clone(), usage.as_ref());
        if let Some(g) = generations {
            object["token_generations"] = g;
        }
        let content = if self.assistant_text.is_empty() && !self.calls.is_empty() {
            Value::Null
        } else {
            json!(self.assistant_text)
        };
        let mut assistant = json!({"role": "assistant", "content": content});
        if !self.calls.is_empty() {
            assistant["tool_calls"] = json!(self.calls);
        }
        (object, assistant)
    }
}

impl Frames for Stream {
    type Event = InferEvent;

    fn opening(&mut self) -> Vec<Bytes> {
        let object = self.head.object("in_progress", Vec::new(), None);
        vec![
            self.event("response.created", json!({"response": object.clone()})),
            self.event("response.in_progress", json!({"response": object})),
        ]
    }

    fn event(&mut self, ev: InferEvent) -> Result<Vec<Bytes>, String> {
        if let InferEvent::Error(m) = ev {
            return Err(format!("generation failed: {m}"));
        }
        let mut out = Vec::new();
        for c in self.chat.chunks_for(ev) {
            self.chunk(c, &mut out);
        }
        Ok(out)
    }

    fn failure(&self, message: &str) -> Vec<Bytes> {
        let data = json!({"type": "error", "sequence_number": self.seq, "code": "server_error", "message": message, "param": null});
        vec![Bytes::from(format!("event: error\ndata: {data}\n\n"))]
    }

    fn finish(&mut self) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
        let store = self.store.take()?;
        let (object, assistant) = self.finished();
        Some(store(object, assistant))
    }

    fn closing(&mut self) -> Vec<Bytes> {
        let (object, _) = self.finished();
        let kind = if object["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
        vec![self.event(kind, json!({"response": object}))]
    }

    fn done(&self) -> bool {
        self.finish.is_some()
    }
}
