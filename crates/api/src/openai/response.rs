//! Engine events as OpenAI/vLLM chat responses ([`super::wire`]): one `chat.completion`, or
//! `chat.completion.chunk` frames (role chunk per choice first, content chunks, one finish chunk
//! per choice, an optional usage chunk).

use super::reasoning;
use super::request::ChatPlan;
use super::sse::{self, Frames};
use super::tools::{self, Piece, Streamed, ToolMode};
use super::wire::{
    ChatCompletion, Choice, ChoiceLogprobs, Chunk, ChunkChoice, CompletionTokensDetails, Delta, FunctionCall,
    FunctionDelta, LogprobEntry, Message, PositionLogprobs, PromptTokensDetails, StopReasonOut, ToolCall,
    ToolCallDelta, TopEntry, Usage,
};
use axum::body::Bytes;
use std::sync::Arc;
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
            // Only Tinker's sampling asks for further prompt scores.
            InferEvent::PromptScores(_) | InferEvent::Error(_) => {}
        }
    }
}

/// Builds response bodies for one request.
pub struct Renderer {
    id: Arc<str>,
    created: u64,
    model: Arc<str>,
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
    /// Bytes of each choice's content part already sent (without tools).
    emitted: Vec<usize>,
    /// What each choice has sent of its content and calls (with tools).
    streamed: Vec<Streamed>,
    /// Bytes of each choice's reasoning part already sent.
    emitted_reasoning: Vec<usize>,
}

/// The `finish_reason` of a choice: `tool_calls` when calls were made and the engine stopped by
/// itself, except for a named tool choice (`stop`, as OpenAI and vLLM report it).
fn finish_reason(reason: FinishReason, calls: &[tools::Call], mode: Option<&ToolMode>) -> &'static str {
    match (reason, mode) {
        (FinishReason::Stop, Some(m)) if !calls.is_empty() && !matches!(m.choice, tools::Choice::Named(_)) => {
            "tool_calls"
        }
        _ => reason.as_str(),
    }
}

fn tool_calls(calls: &[tools::Call], mode: Option<&ToolMode>) -> Vec<ToolCall> {
    let family = mode.map_or(tandem_core::tool_calls::Family::Generic, |m| m.family);
    calls
        .iter()
        .map(|c| ToolCall {
            id: family.call_id(),
            kind: "function",
            function: FunctionCall { name: c.name.clone(), arguments: c.arguments.clone() },
        })
        .collect()
}

/// vLLM's shape: null for the first position, then each position's ranked entries.
fn prompt_logprobs(p: &Option<Vec<Option<Vec<RankedLogprob>>>>) -> Option<Vec<Option<PositionLogprobs>>> {
    p.as_ref().map(|positions| positions.iter().map(|pos| pos.clone().map(PositionLogprobs)).collect())
}

fn stop_reason(s: &Option<StopReason>) -> Option<StopReasonOut> {
    s.as_ref().map(StopReasonOut::from)
}

impl Renderer {
    pub fn new(plan: &ChatPlan, model: &str, request_id: &str, prompt: Vec<u32>, echo: Option<String>) -> Self {
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Renderer {
            id: format!("chatcmpl-{request_id}").into(),
            created,
            model: model.into(),
            role: plan.role.clone(),
            n: plan.sampling.n,
            prompt,
            echo,
            logprobs: plan.logprobs,
            return_token_ids: plan.sampling.return_token_ids,
            tokens_as_ids: plan.sampling.tokens_as_ids,
            include_usage: plan.sampling.include_usage,
            continuous_usage: plan.sampling.continuous_usage,
            tools: None,
            reasoning: None,
            include_reasoning: plan.include_reasoning,
            state: Collected::new(plan.sampling.n),
            finished: vec![false; plan.sampling.n],
            emitted: vec![0; plan.sampling.n],
            streamed: (0..plan.sampling.n).map(|_| Streamed::default()).collect(),
            emitted_reasoning: vec![0; plan.sampling.n],
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

    /// New reasoning and content of choice `i` since the last call (a partial think marker at
    /// the end is kept for later unless `last`). With tools the content goes as [`Piece`]s
    /// ([`Self::tool_pieces`]) and this gives none.
    fn deltas(&mut self, i: usize, last: bool) -> (String, String) {
        let full = self.state.choices.get(i).map(|c| c.text.clone()).unwrap_or_default();
        let shown = if last || self.reasoning.is_none() { full.as_str() } else { reasoning::stable(&full) };
        let (r, content) = self.parts(shown);
        let r = r.unwrap_or("");
        let reasoning = r.get(self.emitted_reasoning[i].min(r.len())..).unwrap_or("").to_string();
        self.emitted_reasoning[i] = self.emitted_reasoning[i].max(r.len());
        let content = if self.tools.is_some() {
            String::new()
        } else {
            let d = content.get(self.emitted[i].min(content.len())..).unwrap_or("").to_string();
            self.emitted[i] = self.emitted[i].max(content.len());
            d
        };
        (if self.include_reasoning { reasoning } else { String::new() }, content)
    }

    /// The content and call pieces of choice `i` since the last call, and (`last`) its calls.
    fn tool_pieces(&mut self, i: usize, last: bool) -> (Vec<Piece>, Vec<tools::Call>) {
        let Some(mode) = self.tools.clone() else { return (Vec::new(), Vec::new()) };
        let full = self.state.choices.get(i).map(|c| c.text.clone()).unwrap_or_default();
        let shown = if last || self.reasoning.is_none() { full.as_str() } else { reasoning::stable(&full) };
        let content = self.parts(shown).1.to_string();
        match self.streamed.get_mut(i) {
            Some(s) => s.advance(&mode, &content, last),
            None => (Vec::new(), Vec::new()),
        }
    }

    /// A chunk of choice `i` for each piece.
    fn piece_chunks(&self, i: usize, pieces: Vec<Piece>) -> Vec<Chunk> {
        pieces
            .into_iter()
            .map(|p| {
                let delta = match p {
                    Piece::Content(text) => Delta { content: Some(text), ..Delta::default() },
                    Piece::Name { index, id, name } => Delta {
                        tool_calls: Some(vec![ToolCallDelta {
                            index,
                            id: Some(id),
                            kind: Some("function"),
                            function: FunctionDelta { name: Some(name), arguments: String::new() },
                        }]),
                        ..Delta::default()
                    },
                    Piece::Arguments { index, text } => Delta {
                        tool_calls: Some(vec![ToolCallDelta {
                            index,
                            id: None,
                            kind: None,
                            function: FunctionDelta { name: None, arguments: text },
                        }]),
                        ..Delta::default()
                    },
                };
                self.chunk(vec![ChunkChoice { index: i, delta, ..ChunkChoice::default() }], Some(i))
            })
            .collect()
    }

    fn top_entry(&self, t: &TopLogprob) -> TopEntry {
        let (token, bytes) = if self.tokens_as_ids {
            let t = format!("token_id:{}", t.token_id);
            let b = t.as_bytes().to_vec();
            (t, b)
        } else {
            (t.token.clone(), t.bytes.clone())
        };
        TopEntry { token, logprob: t.logprob, bytes }
    }

    fn logprob_entry(&self, lp: &TokenLogprob) -> LogprobEntry {
        let TopEntry { token, logprob, bytes } = self.top_entry(&lp.token);
        LogprobEntry { token, logprob, bytes, top_logprobs: lp.top.iter().map(|t| self.top_entry(t)).collect() }
    }

    /// Usage over `choices`; with a reasoning parser also how many tokens wrote reasoning.
    fn usage(&self, choices: &[ChoiceOut], cached: usize) -> Usage {
        let completion: usize = choices.iter().map(|c| c.token_ids.len()).sum();
        let completion_tokens_details = self.reasoning.map(|parser| CompletionTokensDetails {
            reasoning_tokens: choices.iter().map(|c| reasoning::tokens(parser, &c.text, &c.token_ends)).sum(),
        });
        Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: completion,
            total_tokens: self.prompt.len() + completion,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: cached },
            completion_tokens_details,
        }
    }

    /// The non-streamed `chat.completion`.
    pub fn full(&self, c: Collected) -> ChatCompletion {
        let choices = c
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
                let thought = thought.filter(|_| self.include_reasoning).map(str::to_string);
                let message = Message {
                    role: self.role.clone(),
                    content,
                    refusal: None,
                    annotations: None,
                    audio: None,
                    function_call: None,
                    reasoning_content: self.reasoning.map(|_| thought.clone()),
                    reasoning: thought,
                    tool_calls: tool_calls(&calls, self.tools.as_ref()),
                };
                Choice {
                    index: i,
                    message,
                    logprobs: self.logprobs.then(|| ChoiceLogprobs {
                        content: ch.logprobs.iter().map(|l| self.logprob_entry(l)).collect(),
                    }),
                    finish_reason: finish_reason(reason, &calls, self.tools.as_ref()),
                    stop_reason: stop_reason(&stop),
                    token_ids: self.return_token_ids.then(|| ch.token_ids.clone()),
                }
            })
            .collect();
        ChatCompletion {
            id: self.id.clone(),
            object: "chat.completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: self.usage(&c.choices, c.cached_tokens),
            system_fingerprint: None,
            service_tier: None,
            prompt_logprobs: prompt_logprobs(&c.prompt_logprobs),
            prompt_token_ids: self.return_token_ids.then(|| self.prompt.clone()),
            kv_transfer_params: None,
        }
    }

    /// A chunk of `choices`; with `continuous_usage_stats`, the usage of choice `usage_of` so far.
    fn chunk(&self, choices: Vec<ChunkChoice>, usage_of: Option<usize>) -> Chunk {
        let usage = match usage_of {
            Some(i) if self.continuous_usage => {
                let so_far = self.state.choices.get(i..=i).unwrap_or_default();
                Some(self.usage(so_far, self.state.cached_tokens))
            }
            _ => None,
        };
        Chunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            prompt_token_ids: None,
            usage,
        }
    }

    /// The role chunk of every choice (and echo chunks), before any token.
    pub fn opening_chunks(&self) -> Vec<Chunk> {
        let mut out = Vec::new();
        for i in 0..self.n {
            let delta = Delta { role: Some(self.role.clone()), content: Some(String::new()), ..Delta::default() };
            let mut c = self.chunk(vec![ChunkChoice { index: i, delta, ..ChunkChoice::default() }], Some(i));
            if i == 0 && self.return_token_ids {
                c.prompt_token_ids = Some(self.prompt.clone());
            }
            out.push(c);
        }
        if let Some(echo) = &self.echo {
            for i in 0..self.n {
                let delta = Delta { content: Some(echo.clone()), ..Delta::default() };
                out.push(self.chunk(vec![ChunkChoice { index: i, delta, ..ChunkChoice::default() }], Some(i)));
            }
        }
        out
    }

    /// Frames for one engine event.
    pub fn chunks_for(&mut self, ev: InferEvent) -> Vec<Chunk> {
        self.state.push(ev.clone());
        match ev {
            InferEvent::Token { choice, token_id, text: _, logprob } => {
                if choice >= self.n {
                    return Vec::new();
                }
                let (thought, text) = self.deltas(choice, false);
                let (pieces, _) = self.tool_pieces(choice, false);
                let logprobs = match (&logprob, self.logprobs) {
                    (Some(lp), true) => Some(ChoiceLogprobs { content: vec![self.logprob_entry(lp)] }),
                    _ => None,
                };
                let token_ids = self.return_token_ids.then(|| vec![token_id]);
                if !pieces.is_empty() {
                    // With tools: the reasoning first, then a chunk per piece; the token's
                    // logprobs and id ride on the first.
                    let mut out = Vec::new();
                    if !thought.is_empty() {
                        let delta = Delta { reasoning: Some(thought), ..Delta::default() };
                        out.push(
                            self.chunk(
                                vec![ChunkChoice { index: choice, delta, ..ChunkChoice::default() }],
                                Some(choice),
                            ),
                        );
                    }
                    out.extend(self.piece_chunks(choice, pieces));
                    if let Some(first) = out.first_mut().and_then(|c| c.choices.first_mut()) {
                        first.logprobs = logprobs;
                        first.token_ids = token_ids;
                    }
                    return out;
                }
                if text.is_empty() && thought.is_empty() && !self.logprobs && !self.return_token_ids {
                    return Vec::new();
                }
                // Content is sent even when empty (a logprobs-only chunk), except beside reasoning.
                let delta = if thought.is_empty() {
                    Delta { content: Some(text), ..Delta::default() }
                } else {
                    Delta {
                        reasoning: Some(thought),
                        content: Some(text).filter(|t| !t.is_empty()),
                        ..Delta::default()
                    }
                };
                let body = ChunkChoice { index: choice, delta, logprobs, token_ids, ..ChunkChoice::default() };
                vec![self.chunk(vec![body], Some(choice))]
            }
            InferEvent::Finished { choice, reason, stop_reason: stop, text: _ } => {
                if let Some(f) = self.finished.get_mut(choice) {
                    *f = true;
                }
                if choice >= self.n {
                    return Vec::new();
                }
                let mut out = Vec::new();
                let (thought, rest) = self.deltas(choice, true);
                if !thought.is_empty() {
                    let delta = Delta { reasoning: Some(thought), ..Delta::default() };
                    out.push(
                        self.chunk(vec![ChunkChoice { index: choice, delta, ..ChunkChoice::default() }], Some(choice)),
                    );
                }
                let (pieces, calls) = self.tool_pieces(choice, true);
                out.extend(self.piece_chunks(choice, pieces));
                let body = ChunkChoice {
                    index: choice,
                    delta: Delta { content: Some(rest), ..Delta::default() },
                    logprobs: None,
                    finish_reason: Some(finish_reason(reason, &calls, self.tools.as_ref())),
                    stop_reason: Some(stop_reason(&stop)),
                    token_ids: self.return_token_ids.then(Vec::new),
                };
                out.push(self.chunk(vec![body], Some(choice)));
                out
            }
            _ => Vec::new(),
        }
    }

    /// The usage chunk, when asked for.
    pub fn closing_chunks(&self) -> Vec<Chunk> {
        if !self.include_usage {
            return Vec::new();
        }
        let mut c = self.chunk(Vec::new(), None);
        c.usage = Some(self.usage(&self.state.choices, self.state.cached_tokens));
        vec![c]
    }
}

impl Frames for Renderer {
    type Event = InferEvent;

    fn opening(&mut self) -> Vec<Bytes> {
        self.opening_chunks().iter().map(sse::data).collect()
    }

    fn event(&mut self, ev: InferEvent) -> Result<Vec<Bytes>, String> {
        match ev {
            InferEvent::Error(m) => Err(format!("generation failed: {m}")),
            ev => Ok(self.chunks_for(ev).iter().map(sse::data).collect()),
        }
    }

    fn failure(&self, message: &str) -> Vec<Bytes> {
        vec![sse::data(&sse::openai_error(message)), sse::DONE]
    }

    fn closing(&mut self) -> Vec<Bytes> {
        let mut out: Vec<Bytes> = self.closing_chunks().iter().map(sse::data).collect();
        out.push(sse::DONE);
        out
    }

    fn done(&self) -> bool {
        self.finished.iter().all(|f| *f)
    }
}
