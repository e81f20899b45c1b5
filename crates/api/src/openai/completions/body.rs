//! Engine events as vLLM's `text_completion` bodies: one response, or chunks. Choices are
//! numbered prompt by prompt (`prompt_index * n + choice`), as vLLM numbers them.

use super::plan::CompletionPlan;
use crate::openai::response::{ChoiceOut, Collected};
use crate::openai::sse::{self, Frames};
use crate::openai::wire::{Null, PositionLogprobs, PromptTokensDetails, StopReasonOut, Usage};
use axum::body::Bytes;
use serde::ser::{Serialize, SerializeMap, Serializer};
use std::sync::Arc;
use tandem_core::inference::{FinishReason, InferEvent, RankedLogprob, TokenLogprob, TopLogprob};

#[derive(Debug, serde::Serialize)]
pub struct CompletionResponse {
    pub id: Arc<str>,
    pub object: &'static str,
    pub created: u64,
    pub model: Arc<str>,
    pub choices: Vec<CompletionChoice>,
    pub service_tier: Null,
    pub system_fingerprint: Null,
    pub usage: Usage,
    pub kv_transfer_params: Null,
}

#[derive(Debug, serde::Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: &'static str,
    pub stop_reason: Option<StopReasonOut>,
    pub token_ids: Option<Vec<u32>>,
    pub prompt_logprobs: Option<Shared<Vec<Option<PositionLogprobs>>>>,
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A value every choice of a prompt shows, held once (a prompt's logprobs can be large).
#[derive(Debug, Clone)]
pub struct Shared<T>(pub Arc<T>);

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// The legacy completions logprobs: parallel lists per token.
#[derive(Debug, Default, serde::Serialize)]
pub struct CompletionLogprobs {
    pub text_offset: Vec<usize>,
    pub token_logprobs: Vec<Option<f32>>,
    pub tokens: Vec<String>,
    pub top_logprobs: Vec<Option<TopMap>>,
}

/// `{token: logprob}` in order, the sampled token first; a token text seen twice keeps its first
/// value (the map's keys are texts).
#[derive(Debug, Default)]
pub struct TopMap(Vec<(String, f32)>);

impl TopMap {
    fn insert(&mut self, token: String, logprob: f32) {
        if !self.0.iter().any(|(t, _)| *t == token) {
            self.0.push((token, logprob));
        }
    }
}

impl Serialize for TopMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (t, l) in &self.0 {
            map.serialize_entry(t, l)?;
        }
        map.end()
    }
}

#[derive(Debug, serde::Serialize)]
pub struct CompletionChunk {
    pub id: Arc<str>,
    pub object: &'static str,
    pub created: u64,
    pub model: Arc<str>,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, serde::Serialize)]
pub struct ChunkChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<StopReasonOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// What the body needs of one prompt: its ids, and with `echo` its text (and each token's text,
/// for the echoed logprobs).
#[derive(Debug, Clone)]
pub struct PromptOut {
    pub ids: Vec<u32>,
    pub echo: Option<String>,
    pub token_texts: Vec<String>,
}

/// Builds the bodies of one request.
pub struct CompletionRenderer {
    id: Arc<str>,
    created: u64,
    model: Arc<str>,
    n: usize,
    prompts: Vec<PromptOut>,
    logprobs: bool,
    /// `logprobs`: alternatives shown per token (an echoed prompt's too).
    top: usize,
    return_token_ids: bool,
    tokens_as_ids: bool,
    include_usage: bool,
    continuous_usage: bool,
    /// One per prompt.
    state: Vec<Collected>,
    // streaming state, per choice
    started: Vec<bool>,
    finished: Vec<bool>,
    /// Characters of token text already sent (the next token's `text_offset`).
    offset: Vec<usize>,
}

impl CompletionRenderer {
    pub fn new(plan: &CompletionPlan, model: &str, request_id: &str, prompts: Vec<PromptOut>) -> Self {
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let choices = prompts.len() * plan.sampling.n;
        CompletionRenderer {
            id: format!("cmpl-{request_id}").into(),
            created,
            model: model.into(),
            n: plan.sampling.n,
            state: prompts.iter().map(|_| Collected::new(plan.sampling.n)).collect(),
            prompts,
            logprobs: plan.logprobs.is_some(),
            top: plan.logprobs.unwrap_or(0),
            return_token_ids: plan.sampling.return_token_ids,
            tokens_as_ids: plan.sampling.tokens_as_ids,
            include_usage: plan.sampling.include_usage,
            continuous_usage: plan.sampling.continuous_usage,
            started: vec![false; choices],
            finished: vec![false; choices],
            offset: vec![0; choices],
        }
    }

    pub fn push(&mut self, prompt: usize, ev: InferEvent) {
        if let Some(s) = self.state.get_mut(prompt) {
            s.push(ev);
        }
    }

    pub fn all_done(&self) -> bool {
        self.state.iter().all(Collected::done)
    }

    fn token_name(&self, t: &TopLogprob) -> String {
        if self.tokens_as_ids {
            format!("token_id:{}", t.token_id)
        } else {
            t.token.clone()
        }
    }

    /// One generated token's entry in `logs`, at text offset `at`; returns the next offset.
    fn add_token(&self, logs: &mut CompletionLogprobs, lp: &TokenLogprob, at: usize) -> usize {
        let name = self.token_name(&lp.token);
        let mut top = TopMap::default();
        top.insert(name.clone(), lp.token.logprob);
        for t in &lp.top {
            top.insert(self.token_name(t), t.logprob);
        }
        let next = at + name.chars().count();
        logs.text_offset.push(at);
        logs.token_logprobs.push(Some(lp.token.logprob));
        logs.tokens.push(name);
        logs.top_logprobs.push(Some(top));
        next
    }

    /// The echoed prompt's entries: the first token has no logprob (nothing predicts it).
    fn add_prompt(
        &self,
        logs: &mut CompletionLogprobs,
        p: &PromptOut,
        ranked: Option<&[Option<Vec<RankedLogprob>>]>,
    ) -> usize {
        let mut at = 0;
        for (i, id) in p.ids.iter().enumerate() {
            let entries = ranked.and_then(|r| r.get(i)).and_then(Option::as_ref);
            // The entry's own text, so that `top_logprobs[i][tokens[i]]` finds it; the first
            // position has none (nothing predicts it).
            let name = match (self.tokens_as_ids, entries.and_then(|e| e.first())) {
                (true, _) => format!("token_id:{id}"),
                (false, Some(r)) => r.decoded.clone(),
                (false, None) => p.token_texts.get(i).cloned().unwrap_or_default(),
            };
            let (lp, top) = match entries {
                Some(e) => {
                    let mut top = TopMap::default();
                    // The actual token and `logprobs` alternatives, whatever prompt_logprobs
                    // asked the engine for.
                    for r in e.iter().take(self.top + 1) {
                        let t = if self.tokens_as_ids { format!("token_id:{}", r.token_id) } else { r.decoded.clone() };
                        top.insert(t, r.logprob);
                    }
                    (e.first().map(|r| r.logprob), Some(top))
                }
                None => (None, None),
            };
            logs.text_offset.push(at);
            at += name.chars().count();
            logs.token_logprobs.push(lp);
            logs.tokens.push(name);
            logs.top_logprobs.push(top);
        }
        at
    }

    fn usage(&self, outs: &[(&PromptOut, &[ChoiceOut])], cached: usize) -> Usage {
        let prompt: usize = outs.iter().map(|(p, _)| p.ids.len()).sum();
        let completion: usize = outs.iter().flat_map(|(_, c)| c.iter().map(|c| c.token_ids.len())).sum();
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: cached },
            completion_tokens_details: None,
        }
    }

    fn total_usage(&self) -> Usage {
        let outs: Vec<(&PromptOut, &[ChoiceOut])> =
            self.prompts.iter().zip(&self.state).map(|(p, s)| (p, s.choices.as_slice())).collect();
        self.usage(&outs, self.state.iter().map(|s| s.cached_tokens).sum())
    }

    /// The whole non-streamed response.
    pub fn full(&self) -> CompletionResponse {
        let mut choices = Vec::new();
        for (pi, (p, s)) in self.prompts.iter().zip(&self.state).enumerate() {
            // As vLLM: on every choice whenever they were computed (asked for, or for echo).
            let prompt_logprobs = s
                .prompt_logprobs
                .as_ref()
                .map(|ps| Shared(Arc::new(ps.iter().map(|pos| pos.clone().map(PositionLogprobs)).collect::<Vec<_>>())));
            for (j, ch) in s.choices.iter().enumerate() {
                let (reason, stop) = ch.finish.clone().unwrap_or((FinishReason::Abort, None));
                let logprobs = self.logprobs.then(|| {
                    let mut logs = CompletionLogprobs::default();
                    let mut at = match &p.echo {
                        Some(_) => self.add_prompt(&mut logs, p, s.prompt_logprobs.as_deref()),
                        None => 0,
                    };
                    for lp in &ch.logprobs {
                        at = self.add_token(&mut logs, lp, at);
                    }
                    logs
                });
                choices.push(CompletionChoice {
                    index: pi * self.n + j,
                    text: format!("{}{}", p.echo.as_deref().unwrap_or(""), ch.text),
                    logprobs,
                    finish_reason: reason.as_str(),
                    stop_reason: stop.as_ref().map(StopReasonOut::from),
                    token_ids: self.return_token_ids.then(|| ch.token_ids.clone()),
                    prompt_logprobs: prompt_logprobs.clone(),
                    prompt_token_ids: self.return_token_ids.then(|| p.ids.clone()),
                });
            }
        }
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            service_tier: None,
            system_fingerprint: None,
            usage: self.total_usage(),
            kv_transfer_params: None,
        }
    }

    fn chunk(&self, choice: ChunkChoice, prompt: usize) -> CompletionChunk {
        let usage = self.continuous_usage.then(|| {
            let j = choice.index % self.n;
            let s = &self.state[prompt];
            self.usage(&[(&self.prompts[prompt], s.choices.get(j..=j).unwrap_or_default())], s.cached_tokens)
        });
        CompletionChunk {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: vec![choice],
            usage,
        }
    }

    /// The first chunk of a choice carries the echoed prompt and, with `return_token_ids`, the
    /// prompt's ids.
    fn first(&mut self, prompt: usize, index: usize) -> (String, Option<Vec<u32>>) {
        if std::mem::replace(&mut self.started[index], true) {
            return (String::new(), None);
        }
        let p = &self.prompts[prompt];
        let echo = p.echo.clone().unwrap_or_default();
        self.offset[index] = echo.chars().count();
        (echo, self.return_token_ids.then(|| p.ids.clone()))
    }

    /// The chunks for one event of prompt `prompt`.
    pub fn chunks_for(&mut self, prompt: usize, ev: InferEvent) -> Vec<CompletionChunk> {
        if prompt >= self.prompts.len() {
            return Vec::new();
        }
        self.push(prompt, ev.clone());
        match ev {
            InferEvent::Token { choice, token_id, text, logprob } if choice < self.n => {
                let index = prompt * self.n + choice;
                let (echo, prompt_ids) = self.first(prompt, index);
                if text.is_empty() && echo.is_empty() && !self.logprobs && !self.return_token_ids {
                    return Vec::new();
                }
                let logprobs = match (&logprob, self.logprobs) {
                    (Some(lp), true) => {
                        let mut logs = CompletionLogprobs::default();
                        self.offset[index] = self.add_token(&mut logs, lp, self.offset[index]);
                        Some(logs)
                    }
                    _ => None,
                };
                let choice = ChunkChoice {
                    index,
                    text: echo + &text,
                    logprobs,
                    finish_reason: None,
                    stop_reason: None,
                    token_ids: self.return_token_ids.then(|| vec![token_id]),
                    prompt_token_ids: prompt_ids,
                };
                vec![self.chunk(choice, prompt)]
            }
            InferEvent::Finished { choice, reason, stop_reason, text } if choice < self.n => {
                let index = prompt * self.n + choice;
                self.finished[index] = true;
                let (echo, prompt_ids) = self.first(prompt, index);
                let choice = ChunkChoice {
                    index,
                    text: echo + &text,
                    logprobs: None,
                    finish_reason: Some(reason.as_str()),
                    stop_reason: stop_reason.as_ref().map(StopReasonOut::from),
                    token_ids: self.return_token_ids.then(Vec::new),
                    prompt_token_ids: prompt_ids,
                };
                vec![self.chunk(choice, prompt)]
            }
            _ => Vec::new(),
        }
    }
}

/// Streamed: events arrive tagged with their prompt's index.
impl Frames for CompletionRenderer {
    type Event = (usize, InferEvent);

    fn opening(&mut self) -> Vec<Bytes> {
        Vec::new()
    }

    fn event(&mut self, (prompt, ev): (usize, InferEvent)) -> Result<Vec<Bytes>, String> {
        match ev {
            InferEvent::Error(m) => Err(format!("generation failed: {m}")),
            ev => Ok(self.chunks_for(prompt, ev).iter().map(sse::data).collect()),
        }
    }

    fn failure(&self, message: &str) -> Vec<Bytes> {
        vec![sse::data(&sse::openai_error(message)), sse::DONE]
    }

    fn closing(&mut self) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.include_usage {
            let chunk = CompletionChunk {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices: Vec::new(),
                usage: Some(self.total_usage()),
            };
            out.push(sse::data(&chunk));
        }
        out.push(sse::DONE);
        out
    }

    fn done(&self) -> bool {
        self.finished.iter().all(|f| *f)
    }
}
