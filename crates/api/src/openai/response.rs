//! Engine events as OpenAI/vLLM chat responses: one `chat.completion`, or `chat.completion.chunk`
//! frames (role chunk per choice first, content chunks, one finish chunk per choice, an optional
//! usage chunk).

use super::reasoning;
use super::request::ChatPlan;
use super::tools::{self, Format, ToolMode};
use serde_json::{json, Value};
use tandem_core::inference::{
    FinishReason, InferEvent, RankedLogprob, ReasoningParser, StopReason, TokenLogprob, TopLogprob,
};

/// Everything generated for one choice.
#[derive(Debug, Clone, Default)]
pub struct ChoiceOut {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<(FinishReason, Option<StopReason>)>,
    /// The length of `text` after each token (which tokens wrote the reasoning).
    pub token_ends: Vec<usize>,
}

/// A whole non-streamed result.
#[derive(Debug, Clone)]
pub struct Collected {
    pub choices: Vec<ChoiceOut>,
    pub cached_tokens: usize,
    pub prompt_logprobs: Option<Vec<Option<Vec<RankedLogprob>>>>,
}

impl Collected {
    pub fn new(n: usize) -> Self {
        Collected { choices: vec![ChoiceOut::default(); n], cached_tokens: 0, prompt_logprobs: None }
    }

    pub fn done(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    pub fn push(&mut self, ev: InferEvent) {
        match ev {
            InferEvent::Started { cached_tokens } => self.cached_tokens = cached_tokens,
            InferEvent::Token { choice, token_id, text, logprob } => {
                if let Some(c) = self.choices.get_mut(choice) {
                    c.token_ids.push(token_id);
                    c.text.push_str(&text);
                    c.token_ends.push(c.text.len());
                    c.logprobs.extend(logprob);
                }
            }
            InferEvent::Finished { choice, reason, stop_reason, text } => {
                if let Some(c) = self.choices.get_mut(choice) {
                    c.text.push_str(&text);
                    c.finish = Some((reason, stop_reason));
                }
            }
            InferEvent::PromptLogprobs(p) => self.prompt_logprobs = Some(p),
            InferEvent::Error(_) => {}
        }
    }
}

/// Builds response bodies for one request.
pub struct Renderer {
    id: String,
    created: u64,
    model: String,
    role: String,
    n: usize,
    prompt: Vec<u32>,
    echo: Option<String>,
    logprobs: bool,
    return_token_ids: bool,
    tokens_as_ids: bool,
    include_usage: bool,
    continuous_usage: bool,
    /// Tool calls are parsed from the output (see `tools`).
    tools: Option<ToolMode>,
    /// `<think>` reasoning is split off the output; shown only with `include_reasoning`.
    reasoning: Option<ReasoningParser>,
    include_reasoning: bool,
    // streaming state
    state: Collected,
    finished: Vec<bool>,
    /// Bytes of each choice's content part already sent (tool output is held back).
    emitted: Vec<usize>,
    /// Bytes of each choice's reasoning part already sent.
    emitted_reasoning: Vec<usize>,
}

/// The `finish_reason` of a choice: `tool_calls` when calls were made and the engine stopped by
/// itself, except for a named tool choice (`stop`, as OpenAI and vLLM report it).
fn finish_json(reason: FinishReason, calls: &[tools::Call], mode: Option<&ToolMode>) -> &'static str {
    match (reason, mode) {
        (FinishReason::Stop, Some(m)) if !calls.is_empty() && !matches!(m.format, Format::Arguments(_)) => "tool_calls",
        _ => reason.as_str(),
    }
}

fn calls_json(calls: &[tools::Call]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| json!({"id": tools::call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect(),
    )
}

/// vLLM's shape: null for the first position, then `{"<id>": {logprob, rank, decoded_token}}`.
fn prompt_logprobs_json(p: &Option<Vec<Option<Vec<RankedLogprob>>>>) -> Value {
    let Some(positions) = p else { return Value::Null };
    Value::Array(
        positions
            .iter()
            .map(|pos| match pos {
                None => Value::Null,
                Some(entries) => Value::Object(
                    entries
                        .iter()
                        .map(|e| {
                            (
                                e.token_id.to_string(),
                                json!({ "logprob": e.logprob, "rank": e.rank, "decoded_token": e.decoded }),
                            )
                        })
                        .collect(),
                ),
            })
            .collect(),
    )
}

fn stop_reason_json(s: &Option<StopReason>) -> Value {
    match s {
        None => Value::Null,
        Some(StopReason::Text(t)) => json!(t),
        Some(StopReason::Token(id)) => json!(id),
    }
}

impl Renderer {
    pub fn new(plan: &ChatPlan, model: &str, request_id: &str, prompt: Vec<u32>, echo: Option<String>) -> Self {
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Renderer {
            id: format!("chatcmpl-{request_id}"),
            created,
            model: model.to_string(),
            role: plan.role.clone(),
            n: plan.n,
            prompt,
            echo,
            logprobs: plan.logprobs,
            return_token_ids: plan.return_token_ids,
            tokens_as_ids: plan.tokens_as_ids,
            include_usage: plan.include_usage,
            continuous_usage: plan.continuous_usage,
            tools: None,
            reasoning: None,
            include_reasoning: plan.include_reasoning,
            state: Collected::new(plan.n),
            finished: vec![false; plan.n],
            emitted: vec![0; plan.n],
            emitted_reasoning: vec![0; plan.n],
        }
    }

    /// Splits `<think>` reasoning off the output (the server's `--reasoning-parser`).
    pub fn with_reasoning(mut self, parser: Option<ReasoningParser>) -> Self {
        self.reasoning = parser;
        self
    }

    /// (reasoning, content) of an output; all content without a reasoning parser.
    fn parts<'t>(&self, text: &'t str) -> (Option<&'t str>, &'t str) {
        match self.reasoning {
            Some(parser) => reasoning::split(parser, text),
            None => (None, text),
        }
    }

    /// Parses tool calls out of the output in this mode.
    pub fn with_tools(mut self, mode: Option<ToolMode>) -> Self {
        self.tools = mode;
        self
    }

    /// Whether a content part must be held back (it is, or may become, a tool call).
    fn holding(&self, content: &str) -> bool {
        let Some(mode) = &self.tools else { return false };
        match mode.format {
            // Generic `auto`: plain text is streamed as soon as it cannot be a calls object.
            Format::Generic { required: false } => {
                let text = content.trim_start();
                text.is_empty() || text.starts_with('{')
            }
            _ => true,
        }
    }

    /// New reasoning and content of choice `i` since the last call (a partial think marker at
    /// the end is kept for later unless `last`); content that may be a tool call is held.
    fn deltas(&mut self, i: usize, last: bool) -> (String, String) {
        let full = self.state.choices.get(i).map(|c| c.text.clone()).unwrap_or_default();
        let shown = if last || self.reasoning.is_none() { full.as_str() } else { reasoning::stable(&full) };
        let (r, content) = self.parts(shown);
        let r = r.unwrap_or("");
        let reasoning = r.get(self.emitted_reasoning[i].min(r.len())..).unwrap_or("").to_string();
        self.emitted_reasoning[i] = self.emitted_reasoning[i].max(r.len());
        let content = if self.holding(content) && !last {
            String::new()
        } else {
            let d = content.get(self.emitted[i].min(content.len())..).unwrap_or("").to_string();
            self.emitted[i] = self.emitted[i].max(content.len());
            d
        };
        (if self.include_reasoning { reasoning } else { String::new() }, content)
    }

    fn top_json(&self, t: &TopLogprob) -> Value {
        // `bytes` are the token's raw bytes (whole even when the text shows a split character),
        // so a client can map an entry back to its token id.
        let (token, bytes) = if self.tokens_as_ids {
            let t = format!("token_id:{}", t.token_id);
            let b = t.as_bytes().to_vec();
            (t, b)
        } else {
            (t.token.clone(), t.bytes.clone())
        };
        json!({ "token": token, "logprob": t.logprob, "bytes": bytes })
    }

    fn logprob_json(&self, lp: &TokenLogprob) -> Value {
        let mut entry = self.top_json(&lp.token);
        entry["top_logprobs"] = Value::Array(lp.top.iter().map(|t| self.top_json(t)).collect());
        entry
    }

    /// Usage over `choices`; with a reasoning parser also how many tokens wrote reasoning.
    fn usage(&self, choices: &[ChoiceOut], cached: usize) -> Value {
        let completion: usize = choices.iter().map(|c| c.token_ids.len()).sum();
        let mut usage = json!({
            "prompt_tokens": self.prompt.len(),
            "completion_tokens": completion,
            "total_tokens": self.prompt.len() + completion,
            "prompt_tokens_details": { "cached_tokens": cached },
        });
        if let Some(parser) = self.reasoning {
            let thought: usize = choices.iter().map(|c| reasoning::tokens(parser, &c.text, &c.token_ends)).sum();
            usage["completion_tokens_details"] = json!({ "reasoning_tokens": thought });
        }
        usage
    }

    /// The non-streamed `chat.completion`.
    pub fn full(&self, c: Collected) -> Value {
        let choices: Vec<Value> = c
            .choices
            .iter()
            .enumerate()
            .map(|(i, ch)| {
                let (reason, stop) = ch.finish.clone().unwrap_or((FinishReason::Abort, None));
                let (thought, text) = self.parts(&ch.text);
                let (content, calls) = match &self.tools {
                    Some(mode) => tools::parse(mode, text),
                    None => (Some(format!("{}{}", self.echo.as_deref().unwrap_or(""), text)), Vec::new()),
                };
                let thought = thought.filter(|_| self.include_reasoning);
                let mut message = json!({
                    "role": self.role, "content": content, "refusal": null, "annotations": null,
                    "audio": null, "function_call": null, "reasoning": thought,
                });
                if self.reasoning.is_some() {
                    // vLLM <= 0.11's name, still read by older clients.
                    message["reasoning_content"] = json!(thought);
                }
                if !calls.is_empty() {
                    message["tool_calls"] = calls_json(&calls);
                }
                json!({
                    "index": i,
                    "message": message,
                    "logprobs": if self.logprobs { json!({ "content": ch.logprobs.iter().map(|l| self.logprob_json(l)).collect::<Vec<_>>() }) } else { Value::Null },
                    "finish_reason": finish_json(reason, &calls, self.tools.as_ref()),
                    "stop_reason": stop_reason_json(&stop),
                    "token_ids": if self.return_token_ids { json!(ch.token_ids) } else { Value::Null },
                })
            })
            .collect();
        json!({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": choices, "usage": self.usage(&c.choices, c.cached_tokens),
            "system_fingerprint": null, "service_tier": null, "prompt_logprobs": prompt_logprobs_json(&c.prompt_logprobs),
            "prompt_token_ids": if self.return_token_ids { json!(self.prompt) } else { Value::Null },
            "kv_transfer_params": null,
        })
    }

    fn chunk(&self, choice: Value) -> Value {
        json!({ "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model, "choices": [choice] })
    }

    fn with_usage(&self, mut chunk: Value, choice: usize) -> Value {
        if self.continuous_usage {
            let so_far = self.state.choices.get(choice..=choice).unwrap_or_default();
            chunk["usage"] = self.usage(so_far, self.state.cached_tokens);
        }
        chunk
    }

    /// The role chunk of every choice (and echo chunks), before any token.
    pub fn opening(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for i in 0..self.n {
            let mut c = self.chunk(json!({ "index": i, "delta": { "role": self.role, "content": "" }, "logprobs": null, "finish_reason": null }));
            if i == 0 && self.return_token_ids {
                c["prompt_token_ids"] = json!(self.prompt);
            }
            out.push(self.with_usage(c, i));
        }
        if let Some(echo) = &self.echo {
            for i in 0..self.n {
                let c = self.chunk(
                    json!({ "index": i, "delta": { "content": echo }, "logprobs": null, "finish_reason": null }),
                );
                out.push(self.with_usage(c, i));
            }
        }
        out
    }

    pub fn done(&self) -> bool {
        self.finished.iter().all(|f| *f)
    }

    /// Frames for one engine event.
    pub fn event(&mut self, ev: InferEvent) -> Vec<Value> {
        self.state.push(ev.clone());
        match ev {
            InferEvent::Token { choice, token_id, text: _, logprob } => {
                if choice >= self.n {
                    return Vec::new();
                }
                let (thought, text) = self.deltas(choice, false);
                if text.is_empty() && thought.is_empty() && !self.logprobs && !self.return_token_ids {
                    return Vec::new();
                }
                let mut body = json!({ "index": choice, "delta": { "content": text }, "finish_reason": null });
                if !thought.is_empty() {
                    body["delta"] = json!({ "reasoning": thought });
                    if !text.is_empty() {
                        body["delta"]["content"] = json!(text);
                    }
                }
                body["logprobs"] = match (&logprob, self.logprobs) {
                    (Some(lp), true) => json!({ "content": [self.logprob_json(lp)] }),
                    _ => Value::Null,
                };
                if self.return_token_ids {
                    body["token_ids"] = json!([token_id]);
                }
                vec![self.with_usage(self.chunk(body), choice)]
            }
            InferEvent::Finished { choice, reason, stop_reason, text: _ } => {
                if let Some(f) = self.finished.get_mut(choice) {
                    *f = true;
                }
                if choice >= self.n {
                    return Vec::new();
                }
                let mut out = Vec::new();
                let mut calls = Vec::new();
                let mode = self.tools.clone().filter(|_| self.emitted[choice] == 0);
                let (thought, rest_text) = self.deltas(choice, true);
                if !thought.is_empty() {
                    let body = json!({ "index": choice, "delta": { "reasoning": thought }, "logprobs": null, "finish_reason": null });
                    out.push(self.with_usage(self.chunk(body), choice));
                }
                let rest = if let Some(mode) = mode {
                    let full = self.state.choices.get(choice).map(|c| c.text.clone()).unwrap_or_default();
                    let content_part = self.parts(&full).1.to_string();
                    let (content, parsed) = tools::parse(&mode, &content_part);
                    // As vLLM streams calls: one delta naming each call, then its arguments.
                    for (k, c) in parsed.iter().enumerate() {
                        let named = json!({"index": k, "id": tools::call_id(), "type": "function",
                                           "function": {"name": c.name, "arguments": ""}});
                        let arguments = json!({"index": k, "function": {"arguments": c.arguments}});
                        for call in [named, arguments] {
                            let body = json!({ "index": choice, "delta": { "tool_calls": [call] }, "logprobs": null, "finish_reason": null });
                            out.push(self.with_usage(self.chunk(body), choice));
                        }
                    }
                    calls = parsed;
                    if calls.is_empty() {
                        rest_text
                    } else {
                        content.unwrap_or_default()
                    }
                } else {
                    rest_text
                };
                let mut body = json!({ "index": choice, "delta": { "content": rest }, "logprobs": null,
                                       "finish_reason": finish_json(reason, &calls, self.tools.as_ref()),
                                       "stop_reason": stop_reason_json(&stop_reason) });
                if self.return_token_ids {
                    body["token_ids"] = json!([]);
                }
                out.push(self.with_usage(self.chunk(body), choice));
                out
            }
            _ => Vec::new(),
        }
    }

    /// The usage chunk, when asked for.
    pub fn closing(&self) -> Vec<Value> {
        if !self.include_usage {
            return Vec::new();
        }
        vec![json!({ "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                     "choices": [], "usage": self.usage(&self.state.choices, self.state.cached_tokens) })]
    }
}
