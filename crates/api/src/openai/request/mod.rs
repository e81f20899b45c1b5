//! Validation of a generating request's body, before the model is consulted: every field typed,
//! ranged and defaulted as vLLM does. The fields all routes share are [`sampling`]'s; a chat body
//! becomes a [`ChatPlan`] here, a completions body a `completions::CompletionPlan`. Checks that
//! need the model (vocabulary, prompt length) happen in `generate::validate` once the model is
//! resolved; [`Sampling::draft`] hands them over.

mod sampling;
mod structured;

pub use sampling::Sampling;
pub(crate) use sampling::{flag, int, string, Fields};

use super::generate::{Draft, Prompt};
use crate::error::ApiError;
use serde_json::Value;
use tandem_core::chat::ChatMessage;
use tandem_core::inference::ChatRender;
use tandem_core::validate::{optional, Validator};

/// Most choices one request may ask for (as a batch: each is a sequence of its own).
pub const MAX_N: i64 = 128;
/// Most top logprobs per token, as vLLM's default `--max-logprobs`.
pub const MAX_LOGPROBS: i64 = 20;
/// Widest beam search (`n` with `use_beam_search`).
pub const MAX_BEAM_WIDTH: i64 = 16;
/// Most logprob entries (`n * max_tokens * (top_logprobs + 1)`) one response held whole (not
/// streamed, or a beam search) may carry: about 100 MB.
pub const MAX_HELD_LOGPROB_ENTRIES: usize = 1 << 20;
/// Longest token-id list (`allowed_token_ids`, `stop_token_ids`, `suppress_tokens`): larger than
/// any vocabulary served; the lists are applied at every sampled token, so they are bounded.
pub const MAX_TOKEN_LIST: usize = 1 << 18;
/// Most `logit_bias` entries and `stop_token_ids`, and most `bad_words`.
pub const MAX_BIAS_ENTRIES: usize = 1024;
pub const MAX_BAD_WORDS: usize = 128;

/// A validated chat request, before the model is consulted.
#[derive(Debug, Clone)]
pub struct ChatPlan {
    pub sampling: Sampling,
    pub render: ChatRender,
    /// `logprobs`: the sampled tokens' logprobs are returned.
    pub logprobs: bool,
    pub echo: bool,
    /// The role of the reply: assistant, or the last message's role without a generation prompt.
    pub role: String,
    /// Tools whose calls are parsed from the output (`tool_choice` other than `"none"`).
    pub tools: Option<super::tools::ToolPlan>,
    /// `include_reasoning` (default true): with a reasoning parser, false drops the reasoning.
    pub include_reasoning: bool,
}

impl ChatPlan {
    /// What the model-dependent validation needs of this plan.
    pub fn draft(&self, request_id: String, tenant: &str) -> Draft {
        let mut d = self.sampling.draft(
            request_id,
            tenant,
            Prompt::Chat(Box::new(self.render.clone())),
            "max_completion_tokens",
        );
        d.tools = self.tools.clone();
        d
    }
}

impl Sampling {
    /// The route-independent part of a [`Draft`].
    pub fn draft(&self, request_id: String, tenant: &str, prompt: Prompt, max_tokens_field: &'static str) -> Draft {
        Draft {
            request_id,
            tenant: tenant.to_string(),
            prompt,
            tools: None,
            params: self.params.clone(),
            max_tokens: self.max_tokens,
            max_tokens_field,
            n: self.n,
            beam: self.beam.is_some(),
            truncate_prompt_tokens: self.truncate_prompt_tokens,
            bad_words: self.bad_words.clone(),
            priority: self.priority,
            cache_salt: self.cache_salt.clone(),
            prompt_logprobs: self.prompt_logprobs,
            prompt_scoring: None,
            held_whole: !self.stream || self.beam.is_some(),
            prompts_in_response: 1,
            prompt_logprobs_per_choice: false,
        }
    }
}

pub(super) fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, msg)
}

/// A chat-side error of a front that translated its body into chat (Messages, Responses),
/// renamed to the front's own field through `renamed` (`(chat field, front field)` pairs).
pub(super) fn front_field(mut e: ApiError, renamed: &[(&str, &str)]) -> ApiError {
    if let Some(p) = e.param.as_deref() {
        if let Some((_, theirs)) = renamed.iter().find(|(ours, _)| *ours == p) {
            e.message = e.message.replace(p, theirs);
            e.param = Some(theirs.to_string());
        }
    }
    // Type errors locate their field instead (`["body", "max_completion_tokens"]`).
    for f in &mut e.fields {
        if let Some(tandem_core::validate::Loc::Key(k)) = f.loc.get_mut(1) {
            if let Some((_, theirs)) = renamed.iter().find(|(ours, _)| *ours == k.as_str()) {
                *k = theirs.to_string();
            }
        }
    }
    e
}

/// The Messages and Responses APIs answer with one output: `n` (a vLLM extra they pass
/// through) must be 1.
pub(super) fn one_choice(plan: &ChatPlan) -> Result<(), ApiError> {
    if plan.sampling.n == 1 {
        return Ok(());
    }
    Err(bad("n", "this API returns one output: n must be 1"))
}

/// Validates a chat body. Errors name the field (`param`).
pub fn validate(body: &Value, priority_scheduling: bool) -> Result<ChatPlan, ApiError> {
    let mut v = Validator::new("body");
    let Some(obj) = v.object(body) else { return Err(ApiError::validation(v.into_errors())) };
    let messages = match v.required(obj, "messages") {
        Some(m) => v.at("messages", |v| messages(v, m)),
        None => None,
    };
    let fields = Fields::parse(&mut v, obj, &["max_completion_tokens", "max_tokens"]);
    let logprobs = flag(&mut v, obj, "logprobs").unwrap_or(false);
    let top_logprobs = int(&mut v, obj, "top_logprobs");
    let mut render = ChatRender {
        add_generation_prompt: flag(&mut v, obj, "add_generation_prompt").unwrap_or(true),
        continue_final_message: flag(&mut v, obj, "continue_final_message").unwrap_or(false),
        add_special_tokens: flag(&mut v, obj, "add_special_tokens").unwrap_or(false),
        chat_template: string(&mut v, obj, "chat_template"),
        reasoning_effort: string(&mut v, obj, "reasoning_effort"),
        documents: optional(obj, "documents").cloned(),
        ..Default::default()
    };
    if let Some(k) = optional(obj, "chat_template_kwargs") {
        render.kwargs = v.at("chat_template_kwargs", |v| v.dict(k).cloned()).unwrap_or_default();
    }
    if v.has_errors() {
        return Err(ApiError::validation(v.into_errors()));
    }
    let messages = messages.ok_or_else(|| bad("messages", "messages must be a non-empty list"))?;
    // The sampling ranges are checked first (vLLM's order), then `top_logprobs`.
    let top = logprobs.then(|| top_logprobs.unwrap_or(0).clamp(0, MAX_LOGPROBS) as usize);
    let sampling = fields.check(obj, top, "max_completion_tokens", priority_scheduling)?;
    match top_logprobs {
        Some(k) if !(0..=MAX_LOGPROBS).contains(&k) => {
            return Err(bad("top_logprobs", format!("top_logprobs must be between 0 and {MAX_LOGPROBS}, got {k}.")));
        }
        Some(k) if k > 0 && !logprobs => {
            return Err(bad("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."))
        }
        _ => {}
    }
    if render.continue_final_message && render.add_generation_prompt {
        return Err(bad(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True (add_generation_prompt defaults to true: send it as false).",
        ));
    }
    if render.continue_final_message && messages.last().map(|m| m.role.as_str()) != Some("assistant") {
        return Err(bad(
            "continue_final_message",
            "continue_final_message requires the last message to be an assistant message.",
        ));
    }
    let tools = super::tools::validate(obj, &mut render)?;
    let include_reasoning = match optional(obj, "include_reasoning") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("include_reasoning", "include_reasoning must be a boolean")),
    };
    if tools.is_some() && sampling.beam.is_some() {
        return Err(bad("tools", "tool calling cannot be combined with use_beam_search"));
    }
    let role = if render.add_generation_prompt {
        "assistant".to_string()
    } else {
        messages.last().map_or("assistant", |m| m.role.as_str()).to_string()
    };
    render.messages = messages;
    Ok(ChatPlan {
        sampling,
        render,
        logprobs,
        echo: optional(obj, "echo").and_then(Value::as_bool).unwrap_or(false),
        role,
        tools,
        include_reasoning,
    })
}

/// A non-empty list of message objects, each with a string role; content a string, a list of
/// parts or null.
fn messages(v: &mut Validator, value: &Value) -> Option<Vec<ChatMessage>> {
    let items = v.array(value)?;
    if items.is_empty() {
        v.value_error(value, "messages must not be empty");
        return None;
    }
    let before = v.error_count();
    for (i, m) in items.iter().enumerate() {
        v.at(i, |v| {
            let Some(obj) = v.object(m) else { return };
            if let Some(role) = v.required(obj, "role") {
                v.at("role", |v| v.string(role));
            }
            if let Some(c) = optional(obj, "content") {
                if !(c.is_string() || c.is_array()) {
                    v.at("content", |v| {
                        v.error("string_type", "Input should be a valid string or list of content parts", c)
                    });
                }
            }
        });
    }
    if v.error_count() != before {
        return None;
    }
    // Checked above: every item reads as a message.
    items.iter().map(|m| ChatMessage::from_value(m).ok()).collect()
}

#[cfg(test)]
mod tests;
