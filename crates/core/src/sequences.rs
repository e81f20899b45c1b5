//! From ART trajectories to token sequences (contract §3, ART 0.5.23's legacy path).
//!
//! Only Choices are trained: each trainable Choice contributes its `prompt_token_ids` as context
//! and its `token_ids` as trained tokens, with the Choice's logprobs as old logprobs. A Choice
//! whose prompt begins with the whole sequence built so far is appended to it (a multi-turn chat
//! becomes one sequence); otherwise a new sequence starts. Choices without token ids (older ART
//! clients) are re-rendered with the model's chat template, their completion ids taken from
//! `token_id:N` logprob tokens. Plain messages are context only. `additional_histories` are
//! tokenized the same way and belong to the same trajectory; as in ART, a Choice there whose
//! prompt continues the sequence built so far extends it. A trajectory recorded as `exchanges`
//! is tokenized from the exact ids of its calls ([`exchanges`]).

mod exchanges;
mod stored;

pub use exchanges::{times as exchange_times, TrainedModel, KINDS as EXCHANGE_KINDS};
pub use stored::{
    tokenize_groups, ModelBounds, RlInputs, TokenizeError, TokenizedGroup, TokenizedGroups, TokenizedTrajectory,
    TOKENIZED_FORMAT,
};

use crate::chat::{content_text, messages_from_values, ChatMessage};
use crate::inference::{ChatRender, InputError, ModelHandle};
use serde_json::Value;

/// Renders a conversation with the served model's chat template (generation prompt added) and
/// tokenizes text; the trainer gets it from the inference engine.
pub trait ChatTokenizer {
    /// `add_generation_prompt`: end with the opening of an assistant turn.
    fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, InputError>;
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, InputError>;
    /// The token whose raw bytes these are.
    fn token_id(&self, bytes: &[u8]) -> Option<u32>;
}

/// A served model's template and tokenizer: Choices that came without token ids are re-rendered
/// exactly as serving rendered the prompt.
pub struct ModelTokenizer(pub ModelHandle);

impl ChatTokenizer for ModelTokenizer {
    fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, InputError> {
        let chat = ChatRender {
            messages: messages.to_vec(),
            add_generation_prompt,
            tools: tools.cloned(),
            ..ChatRender::default()
        };
        self.0.render_chat(&chat)
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, InputError> {
        self.0.tokenize(text, false)
    }

    fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        self.0.token_id_for_bytes(bytes)
    }
}

/// One token sequence: context and trained tokens, in order. Stored compactly (see [`stored`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(into = "stored::StoredSequence", try_from = "stored::StoredSequence")]
pub struct Sequence {
    pub tokens: Vec<u32>,
    /// Whether token i is trained (predicted from the tokens before it).
    pub trained: Vec<bool>,
    /// The behaviour logprob of each trained token (NaN: unknown, treated as on-policy).
    pub old_lp: Vec<f64>,
}

impl Sequence {
    pub fn trained_count(&self) -> usize {
        self.trained.iter().filter(|t| **t).count()
    }

    pub(crate) fn push(&mut self, tokens: &[u32], trained: bool, lps: Option<&[f64]>) {
        for (i, t) in tokens.iter().enumerate() {
            self.tokens.push(*t);
            self.trained.push(trained);
            self.old_lp.push(lps.map_or(f64::NAN, |l| l[i]));
        }
    }
}

/// A Choice's parts, as the trainer uses them.
struct ChoiceTokens {
    prompt: Vec<u32>,
    completion: Vec<u32>,
    logprobs: Option<Vec<f64>>,
}

fn is_choice(item: &Value) -> bool {
    item.get("message").is_some_and(Value::is_object) && item.get("role").is_none()
}

fn ids(v: Option<&Value>) -> Option<Vec<u32>> {
    v?.as_array()?.iter().map(|x| x.as_u64().filter(|i| *i <= u32::MAX as u64).map(|i| i as u32)).collect()
}

/// One `logprobs.content[*]` entry.
struct Entry {
    token: String,
    bytes: Option<Vec<u8>>,
    logprob: f64,
}

/// `logprobs.content[*]` per generated token, or None without logprobs.
fn logprob_entries(choice: &Value) -> Option<Vec<Entry>> {
    let content = choice.get("logprobs")?.get("content")?.as_array()?;
    Some(
        content
            .iter()
            .map(|e| Entry {
                token: e.get("token").and_then(Value::as_str).unwrap_or_default().to_string(),
                bytes: e
                    .get("bytes")
                    .and_then(Value::as_array)
                    .and_then(|b| b.iter().map(|x| x.as_u64().filter(|v| *v < 256).map(|v| v as u8)).collect()),
                logprob: e.get("logprob").and_then(Value::as_f64).unwrap_or(f64::NAN),
            })
            .collect(),
    )
}

/// The token id of a logprob entry: `token_id:N`, else the token with the entry's raw bytes
/// (or its text's bytes).
fn entry_id(e: &Entry, tok: &dyn ChatTokenizer) -> Option<u32> {
    if let Some(n) = e.token.strip_prefix("token_id:") {
        return n.parse().ok();
    }
    tok.token_id(e.bytes.as_deref().unwrap_or(e.token.as_bytes()))
}

/// Sequences being built: the finished ones and the one Choices may still extend.
#[derive(Default)]
struct Builder {
    out: Vec<Sequence>,
    current: Option<Sequence>,
}

impl Builder {
    fn add(&mut self, c: ChoiceTokens) {
        match self.current.as_mut() {
            Some(seq) if c.prompt.starts_with(&seq.tokens) => {
                let new_context = c.prompt[seq.tokens.len()..].to_vec();
                seq.push(&new_context, false, None);
                seq.push(&c.completion, true, c.logprobs.as_deref());
            }
            _ => {
                self.out.extend(self.current.take());
                let mut seq = Sequence::default();
                seq.push(&c.prompt, false, None);
                seq.push(&c.completion, true, c.logprobs.as_deref());
                self.current = Some(seq);
            }
        }
    }

    fn finish(mut self) -> Vec<Sequence> {
        self.out.extend(self.current.take());
        self.out
    }
}

/// Tokenizes one history (`messages_and_choices` and its `tools`) into sequences. `at` names the
/// history in error messages.
pub fn tokenize_history(
    items: &[Value],
    tools: Option<&Value>,
    tok: &dyn ChatTokenizer,
    allow_without_logprobs: bool,
    at: &str,
) -> Result<Vec<Sequence>, String> {
    let mut b = Builder::default();
    add_history(&mut b, items, tools, tok, allow_without_logprobs, at)?;
    Ok(b.finish())
}

fn add_history(
    b: &mut Builder,
    items: &[Value],
    tools: Option<&Value>,
    tok: &dyn ChatTokenizer,
    allow_without_logprobs: bool,
    at: &str,
) -> Result<(), String> {
    let mut context: Vec<Value> = Vec::new();
    for (k, item) in items.iter().enumerate() {
        if !is_choice(item) {
            context.push(item.clone());
            continue;
        }
        let here = format!("{at}.messages_and_choices[{k}]");
        let entries = logprob_entries(item);
        if entries.is_none() && !allow_without_logprobs {
            // ART skips Choices it cannot train on; the message is still context.
            context.push(item["message"].clone());
            continue;
        }
        let c = choice_tokens(item, entries, &context, tools, tok, allow_without_logprobs, &here)?;
        context.push(item["message"].clone());
        b.add(c);
    }
    Ok(())
}

fn choice_tokens(
    item: &Value,
    entries: Option<Vec<Entry>>,
    context: &[Value],
    tools: Option<&Value>,
    tok: &dyn ChatTokenizer,
    allow_without_logprobs: bool,
    here: &str,
) -> Result<ChoiceTokens, String> {
    let (prompt, completion) = match (ids(item.get("prompt_token_ids")), ids(item.get("token_ids"))) {
        (Some(p), Some(c)) => (p, c),
        _ => {
            // An older client: render the conversation so far, and take the completion's ids from
            // the logprob entries (`token_id:N`, or each entry's raw bytes), else from its text.
            let messages =
                messages_from_values(context).map_err(|e| format!("{here}: the conversation before it: {e}"))?;
            let prompt = tok
                .render(&messages, tools, true)
                .map_err(|e| format!("{here}: cannot render the chat template: {e}"))?;
            let from_logprobs: Option<Vec<u32>> =
                entries.as_ref().and_then(|es| es.iter().map(|e| entry_id(e, tok)).collect());
            let completion = match from_logprobs {
                Some(c) => c,
                None => {
                    let text = content_text(&item["message"]["content"]);
                    tok.tokenize(&text).map_err(|e| format!("{here}: cannot tokenize the message: {e}"))?
                }
            };
            (prompt, completion)
        }
    };
    if completion.is_empty() {
        return Err(format!("{here}: the choice has no completion tokens"));
    }
    let logprobs = match entries {
        Some(es) if es.len() == completion.len() => Some(es.into_iter().map(|e| e.logprob).collect()),
        Some(es) if !allow_without_logprobs => {
            return Err(format!(
                "{here}: the choice has {} logprobs for {} token ids (request logprobs with return_token_ids)",
                es.len(),
                completion.len()
            ))
        }
        _ => None,
    };
    Ok(ChoiceTokens { prompt, completion, logprobs })
}

/// Token ids the client recorded (choices' `token_ids`, exchanges) must exist in the vocabulary,
/// and each sequence must fit the model's context: the trainer indexes embeddings and positions
/// by them.
pub fn fits_model(seqs: &[Sequence], vocab: usize, context: usize, at: &str) -> Result<(), String> {
    for seq in seqs {
        if let Some(bad) = seq.tokens.iter().find(|t| **t as usize >= vocab) {
            return Err(format!("{at}: token id {bad} is out of the model's vocabulary (size {vocab})"));
        }
        if seq.tokens.len() > context {
            return Err(format!(
                "{at}: a sequence of {} tokens is longer than the model's context of {context} tokens",
                seq.tokens.len()
            ));
        }
    }
    Ok(())
}

/// Every sequence of one trajectory: from its `exchanges` (the calls to `model`), or from its
/// main history and its `additional_histories`. A trajectory may not have both (as in ART).
pub fn tokenize_trajectory(
    traj: &Value,
    tok: &dyn ChatTokenizer,
    model: &TrainedModel,
    allow_without_logprobs: bool,
    at: &str,
) -> Result<Vec<Sequence>, String> {
    let empty = Vec::new();
    let items = traj.get("messages_and_choices").and_then(Value::as_array).unwrap_or(&empty);
    let extra = traj.get("additional_histories").and_then(Value::as_array).unwrap_or(&empty);
    let has_exchanges = traj.get("exchanges").and_then(Value::as_object).is_some_and(|x| {
        exchanges::KINDS.iter().any(|k| x.get(*k).and_then(Value::as_array).is_some_and(|a| !a.is_empty()))
    });
    if has_exchanges {
        if !items.is_empty() || !extra.is_empty() || traj.get("tools").is_some_and(|t| !t.is_null()) {
            return Err(format!(
                "{at}: a trajectory cannot have both exchanges and messages_and_choices, tools or additional_histories"
            ));
        }
        return exchanges::tokenize_exchanges(&traj["exchanges"], model, allow_without_logprobs, at);
    }
    let mut b = Builder::default();
    add_history(&mut b, items, traj.get("tools"), tok, allow_without_logprobs, at)?;
    for (h, hist) in extra.iter().enumerate() {
        let items = hist.get("messages_and_choices").and_then(Value::as_array).unwrap_or(&empty);
        let here = format!("{at}.additional_histories[{h}]");
        add_history(&mut b, items, hist.get("tools"), tok, allow_without_logprobs, &here)?;
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests;
