//! The one model-dependent validation every inference route shares. A route parses its body
//! into a [`Draft`] (no model needed), resolves the model to a [`Target`], and calls
//! [`validate`]: on a blocking thread it applies every default that depends on the model,
//! renders and tokenizes, checks ids against the vocabulary and the prompt against the context,
//! and has the served model prepare the request (limits, constraint compiled, adapter loaded).
//! What comes back is submitted as it is.

use super::request::MAX_HELD_LOGPROB_ENTRIES;
use super::resolve::Target;
use super::tools::{self, ToolMode, ToolPlan};
use crate::error::{ApiError, ErrorKind};
use tandem_core::inference::{
    ChatRender, GenerateRequest, InferEvent, LogitsProcessor, PromptScoring, ReasoningParser, SamplingParams,
    SubmitError, ValidRequest,
};
use tokio::sync::mpsc::UnboundedReceiver;

/// Where the prompt comes from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Messages, rendered with the chat template (the request's or the model's). Boxed: a
    /// render's inputs are large beside the other prompts.
    Chat(Box<ChatRender>),
    /// Text tokenized as it is; `add_special_tokens` adds what the tokenizer adds (a BOS).
    Text { text: String, add_special_tokens: bool },
    /// Token ids, as given.
    Tokens(Vec<u32>),
}

impl Prompt {
    /// The request field errors about the prompt name.
    fn field(&self) -> &'static str {
        match self {
            Prompt::Chat(_) => "messages",
            Prompt::Text { .. } | Prompt::Tokens(_) => "prompt",
        }
    }
}

/// A parsed request, before the model is consulted.
#[derive(Debug, Clone)]
pub struct Draft {
    pub request_id: String,
    /// The entity asking (scopes the prefix cache and, for the prompt's render, the template jail).
    pub tenant: String,
    pub prompt: Prompt,
    /// Tools whose calls the output is parsed for.
    pub tools: Option<ToolPlan>,
    /// Sampling with the model-independent defaults applied; `max_tokens` and `bad_words`
    /// are filled in here.
    pub params: SamplingParams,
    /// The requested output length (clamped to the context left), and the field it came from.
    pub max_tokens: Option<usize>,
    pub max_tokens_field: &'static str,
    pub n: usize,
    /// A beam search of width `n` (each beam extends by 2n candidates).
    pub beam: bool,
    /// vLLM's `truncate_prompt_tokens`: keep the last k prompt tokens (-1: the context).
    pub truncate_prompt_tokens: Option<i64>,
    /// `bad_words` as text: each is banned with and without a leading space.
    pub bad_words: Vec<String>,
    pub priority: i64,
    pub cache_salt: Option<String>,
    pub prompt_logprobs: Option<usize>,
    /// Tinker's further prompt scores (set only by its sampling route; needs `prompt_logprobs`).
    pub prompt_scoring: Option<Box<PromptScoring>>,
    /// The response is held whole until it is sent (not streamed, or a beam search), so its
    /// logprob entries count against [`MAX_HELD_LOGPROB_ENTRIES`].
    pub held_whole: bool,
    /// How many prompts' choices the response holds (completions take a list): the held
    /// entries are counted for all of them.
    pub prompts_in_response: usize,
    /// The prompt's logprobs appear on every choice (completions), not once per response.
    pub prompt_logprobs_per_choice: bool,
}

/// A request ready to submit, and what the response renderer needs of its validation.
#[derive(Debug)]
pub struct Validated {
    pub request: ValidRequest,
    pub tool_mode: Option<ToolMode>,
}

/// [`validate`] on a blocking thread.
pub async fn validate_blocking(
    target: &Target,
    draft: Draft,
    reasoning: Option<ReasoningParser>,
) -> Result<Validated, ApiError> {
    let target = target.clone();
    tokio::task::spawn_blocking(move || validate(&target, draft, reasoning))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("validation task failed: {e}")))?
}

/// Validates a draft against its model. Blocking: renders, tokenizes, compiles the constraint
/// and loads the adapter.
pub fn validate(target: &Target, draft: Draft, reasoning: Option<ReasoningParser>) -> Result<Validated, ApiError> {
    let model = target.model.as_ref();
    let info = model.info();
    let mut params = draft.params;
    let field = draft.prompt.field();
    if draft.beam && 2 * draft.n > info.vocab_size {
        return Err(ApiError::bad_param(
            "n",
            format!("a beam width of {} needs a vocabulary of at least {} tokens", draft.n, 2 * draft.n),
        ));
    }
    let (mut prompt, tool_mode) = match draft.prompt {
        Prompt::Chat(render) => {
            let mut render = *render;
            render.tenant = draft.tenant.clone();
            // Tools: the template renders them, or tandem's generic format is described and
            // enforced.
            let tool_mode = match draft.tools.as_ref() {
                Some(t) => {
                    let reply = params.constraint.take();
                    let (constraint, mode) =
                        tools::apply(t, model.tool_template(&render), &mut render, reply.as_ref())?;
                    params.constraint = Some(constraint);
                    // Mistral's opener is a control token: the output keeps it to be read back.
                    if mode.family == tandem_core::tool_calls::Family::Mistral {
                        params.skip_special_tokens = false;
                    }
                    Some(mode)
                }
                None => None,
            };
            // A chat reply may reason first; the constraint applies after the reasoning.
            if let Some(c) = params.constraint.as_mut() {
                c.after_reasoning = reasoning.filter(|_| !super::reasoning::scripts_reasoning(&c.kind));
            }
            let ids = model.render_chat(&render).map_err(|e| ApiError::bad_param(field, e.to_string()))?;
            (ids, tool_mode)
        }
        Prompt::Text { text, add_special_tokens } => {
            (model.tokenize(&text, add_special_tokens).map_err(|e| ApiError::bad_param(field, e.to_string()))?, None)
        }
        Prompt::Tokens(ids) => {
            if let Some(bad) = ids.iter().find(|t| **t as usize >= info.vocab_size) {
                return Err(ApiError::bad_param(
                    field,
                    format!("token id {bad} is out of vocabulary (size {})", info.vocab_size),
                ));
            }
            (ids, None)
        }
    };
    if let Some(t) = draft.truncate_prompt_tokens {
        let keep = if t == -1 { info.context_len } else { t as usize };
        if prompt.len() > keep {
            prompt.drain(..prompt.len() - keep);
        }
    }
    // The first token is sampled from the last prompt position, so there must be one.
    if prompt.is_empty() {
        let param = if draft.truncate_prompt_tokens == Some(0) { "truncate_prompt_tokens" } else { field };
        return Err(ApiError::bad_param(
            param,
            "The prompt is empty after the chat template, tokenization and truncation; at least one token is needed.",
        ));
    }
    check_vocabulary(&params, info.vocab_size)?;
    for word in &draft.bad_words {
        let w = word.trim_start();
        for variant in [w.to_string(), format!(" {w}")] {
            let ids = model.tokenize(&variant, false).map_err(|e| ApiError::bad_param("bad_words", e.to_string()))?;
            if !ids.is_empty() {
                params.bad_words.push(ids);
            }
        }
    }
    if prompt.len() >= info.context_len {
        return Err(ApiError::bad_param(
            field,
            format!(
                "This model's maximum context length is {} tokens. However, your prompt contains {} tokens.",
                info.context_len,
                prompt.len()
            ),
        ));
    }
    params.max_tokens = output_budget(draft.max_tokens, draft.max_tokens_field, prompt.len(), info.context_len)?;
    params.min_tokens = params.min_tokens.min(params.max_tokens);
    if let Some(scoring) = &draft.prompt_scoring {
        check_scoring(scoring, prompt.len(), info.vocab_size)?;
    }
    // Scoring the prompt (Tinker's targets, alternative draws) reports each position's own
    // logprob too: the engine is asked for k = 0 when nothing more was, and the held response
    // carries those entries.
    let prompt_logprobs = draft.prompt_logprobs.or(draft.prompt_scoring.as_ref().map(|_| 0));
    if draft.held_whole {
        let held = Held {
            n: draft.n,
            prompts: draft.prompts_in_response.max(1),
            prompt_logprobs,
            per_choice: draft.prompt_logprobs_per_choice,
            scored: draft.prompt_scoring.as_ref().map_or(0, |s| s.cells(prompt.len())),
        };
        held.check(&params, prompt.len())?;
    }
    let request = GenerateRequest {
        request_id: draft.request_id,
        adapter: target.adapter.clone(),
        prompt,
        n: draft.n,
        params,
        priority: draft.priority,
        tenant: draft.tenant,
        cache_salt: draft.cache_salt,
        prompt_logprobs,
        prompt_scoring: draft.prompt_scoring,
        beam_step: false,
    };
    let request = model.prepare(request).map_err(submit_error)?;
    Ok(Validated { request, tool_mode })
}

/// Tinker's prompt scoring against the prompt it scores: a row per position after the first,
/// token ids inside the vocabulary.
fn check_scoring(s: &PromptScoring, prompt_len: usize, vocab: usize) -> Result<(), ApiError> {
    let field = "target_prompt_logprobs";
    if !s.targets.is_empty() && s.targets.len() != prompt_len - 1 {
        let msg = format!("{} rows for a prompt of {prompt_len} tokens: expected len(prompt) - 1", s.targets.len());
        return Err(ApiError::bad_param(field, msg));
    }
    if let Some(bad) = s.targets.iter().flatten().find(|t| **t as usize >= vocab) {
        return Err(ApiError::bad_param(field, format!("token id {bad} is out of vocabulary (size {vocab})")));
    }
    Ok(())
}

/// A response held whole (not streamed, or a beam search) may carry at most
/// [`MAX_HELD_LOGPROB_ENTRIES`] logprob entries: the generated tokens' (`choices x max_tokens x
/// (k+1)`) and the prompt's (`copies x prompt x (k+1)`, copied per choice where the API puts
/// them on each choice), for every prompt of the response.
struct Held {
    n: usize,
    prompts: usize,
    prompt_logprobs: Option<usize>,
    /// The prompt's logprobs are repeated on every choice.
    per_choice: bool,
    /// Entries of further prompt scores (targets and alternative draws).
    scored: usize,
}

impl Held {
    fn check(&self, params: &SamplingParams, prompt_len: usize) -> Result<(), ApiError> {
        let prompts = self.prompts;
        let choices = self.n.saturating_mul(prompts);
        let generated = params.logprobs.map_or(0, |k| choices.saturating_mul(params.max_tokens).saturating_mul(k + 1));
        let copies = if self.per_choice { choices } else { prompts };
        let prompt_side = self.prompt_logprobs.map_or(0, |k| copies.saturating_mul(prompt_len).saturating_mul(k + 1));
        let prompt_side = prompt_side.saturating_add(self.scored);
        if generated.saturating_add(prompt_side) <= MAX_HELD_LOGPROB_ENTRIES {
            return Ok(());
        }
        let (field, what) = if self.scored > 0 && self.scored >= generated {
            ("target_prompt_logprobs", format!("{} target and alternative-token cells", self.scored))
        } else if generated >= prompt_side {
            ("max_tokens", format!("{choices} choices x max_tokens={} x (top logprobs + 1)", params.max_tokens))
        } else {
            ("prompt_logprobs", format!("{copies} copies of {prompt_len} prompt positions x (prompt logprobs + 1)"))
        };
        Err(ApiError::bad_param(
            field,
            format!(
            "{what} is more logprob entries than one response may hold ({MAX_HELD_LOGPROB_ENTRIES}); ask for fewer, \
             or stream the response"
        ),
        ))
    }
}

/// Every token id a request names must be in the vocabulary.
fn check_vocabulary(params: &SamplingParams, vocab: usize) -> Result<(), ApiError> {
    fn check(name: &str, mut ids: impl Iterator<Item = u32>, vocab: usize) -> Result<(), ApiError> {
        match ids.find(|t| *t as usize >= vocab) {
            Some(bad) => Err(ApiError::bad_param(name, format!("token id {bad} is out of vocabulary (size {vocab})"))),
            None => Ok(()),
        }
    }
    check("stop_token_ids", params.stop_token_ids.iter().copied(), vocab)?;
    check("allowed_token_ids", params.allowed_token_ids.iter().flatten().copied(), vocab)?;
    check("logit_bias", params.logit_bias.iter().map(|(t, _)| *t), vocab)?;
    for proc in &params.processors {
        if let LogitsProcessor::SuppressTokens { token_ids } = proc {
            check("logits_processors", token_ids.iter().copied(), vocab)?;
        }
    }
    Ok(())
}

/// The output length: what was asked, within the context the prompt leaves (vLLM: asking for
/// more than the whole context is an error; more than what is left is clamped), or all of it.
pub fn output_budget(
    asked: Option<usize>,
    field: &str,
    prompt_len: usize,
    context_len: usize,
) -> Result<usize, ApiError> {
    let room = context_len.saturating_sub(prompt_len);
    match asked {
        Some(m) if m > context_len => {
            Err(ApiError::bad_param(field, format!("{field}={m} cannot be greater than max_model_len={context_len}")))
        }
        Some(m) => Ok(m.min(room)),
        None => Ok(room),
    }
}

/// Starts a validated request: submits it, or runs its beam search to the end (whose result
/// then flows through the same renderers as ordinary engine events).
pub async fn start(
    target: &Target,
    valid: ValidRequest,
    sampling: &super::request::Sampling,
) -> Result<UnboundedReceiver<InferEvent>, ApiError> {
    let Some(length_penalty) = sampling.beam else { return target.model.submit(valid).map_err(submit_error) };
    let job = super::beam::BeamJob {
        width: sampling.n,
        length_penalty,
        top_logprobs: sampling.params.logprobs.unwrap_or(0),
        eos: target.model.info().eos_token_id,
    };
    let events = super::beam::run(&target.model, valid, job).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for ev in events {
        let _ = tx.send(ev);
    }
    Ok(rx)
}

/// An engine refusal as an API error (503 with `Retry-After` when full).
pub fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::Overloaded => ApiError::new(ErrorKind::Unavailable, e.to_string()).with_retry_after(1),
        SubmitError::Invalid(m) => ApiError::bad_param("model", m),
        SubmitError::InvalidField { field, message } => ApiError::bad_param(&field, message),
        SubmitError::Stopped => ApiError::new(ErrorKind::Unavailable, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_budget_is_clamped_to_the_room_left() {
        assert_eq!(output_budget(None, "max_tokens", 100, 2048).unwrap(), 1948);
        assert_eq!(output_budget(Some(50), "max_tokens", 100, 2048).unwrap(), 50);
        assert_eq!(output_budget(Some(2000), "max_tokens", 100, 2048).unwrap(), 1948);
        assert_eq!(output_budget(Some(2048), "max_tokens", 100, 2048).unwrap(), 1948);
        let err = output_budget(Some(2049), "max_completion_tokens", 100, 2048).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("max_completion_tokens"));
    }

    #[test]
    fn a_held_response_counts_the_prompt_positions_that_scoring_reports() {
        let params = SamplingParams { max_tokens: 4, ..SamplingParams::default() };
        // Scoring cells alone fit; with the k = 0 entry of each of 100 prompt positions they
        // do not.
        let held = |prompt_logprobs| Held {
            n: 1,
            prompts: 1,
            prompt_logprobs,
            per_choice: false,
            scored: MAX_HELD_LOGPROB_ENTRIES - 50,
        };
        assert!(held(None).check(&params, 100).is_ok());
        let err = held(Some(0)).check(&params, 100).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("target_prompt_logprobs"));
    }
}
