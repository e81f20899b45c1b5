//! Validation of a chat-completion body into a [`ChatPlan`]: every field typed, ranged and
//! defaulted as vLLM does, in one place. Checks that need the model (vocabulary, prompt length)
//! happen in `generate::validate` once the model is resolved; [`ChatPlan::draft`] hands them over.

use super::generate::{Draft, Prompt};
use crate::error::ApiError;
use serde_json::{Map, Value};
use tandem_core::chat::ChatMessage;
use tandem_core::inference::{ChatRender, LogitsProcessor, SamplingParams};
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
    pub model: Option<String>,
    pub render: ChatRender,
    pub params: SamplingParams,
    /// `max_completion_tokens` (or `max_tokens`), clamped later to the context left.
    pub max_tokens: Option<usize>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub logprobs: bool,
    pub return_token_ids: bool,
    pub tokens_as_ids: bool,
    pub echo: bool,
    pub priority: i64,
    pub request_id: Option<String>,
    pub cache_salt: Option<String>,
    pub truncate_prompt_tokens: Option<i64>,
    pub prompt_logprobs: Option<usize>,
    /// `bad_words` as text; tokenized once the model is known.
    pub bad_words: Vec<String>,
    /// The role of the reply: assistant, or the last message's role without a generation prompt.
    pub role: String,
    /// `use_beam_search`: the `length_penalty`; `n` is the beam width.
    pub beam: Option<f64>,
    /// Tools whose calls are parsed from the output (`tool_choice` other than `"none"`).
    pub tools: Option<super::tools::ToolPlan>,
    /// `include_reasoning` (default true): with a reasoning parser, false drops the reasoning.
    pub include_reasoning: bool,
}

impl ChatPlan {
    /// What the model-dependent validation needs of this plan.
    pub fn draft(&self, request_id: String, tenant: &str) -> Draft {
        Draft {
            request_id,
            tenant: tenant.to_string(),
            prompt: Prompt::Chat(self.render.clone()),
            tools: self.tools.clone(),
            params: self.params.clone(),
            max_tokens: self.max_tokens,
            max_tokens_field: "max_completion_tokens",
            n: self.n,
            beam: self.beam.is_some(),
            truncate_prompt_tokens: self.truncate_prompt_tokens,
            bad_words: self.bad_words.clone(),
            priority: self.priority,
            cache_salt: self.cache_salt.clone(),
            prompt_logprobs: self.prompt_logprobs,
            held_whole: !self.stream || self.beam.is_some(),
        }
    }
}

fn num(v: &mut Validator, obj: &Map<String, Value>, key: &str) -> Option<f64> {
    optional(obj, key).and_then(|x| v.at(key, |v| v.number(x)))
}

fn int(v: &mut Validator, obj: &Map<String, Value>, key: &str) -> Option<i64> {
    optional(obj, key).and_then(|x| v.at(key, |v| v.integer(x)))
}

fn flag(v: &mut Validator, obj: &Map<String, Value>, key: &str) -> Option<bool> {
    optional(obj, key).and_then(|x| v.at(key, |v| v.boolean(x)))
}

fn string(v: &mut Validator, obj: &Map<String, Value>, key: &str) -> Option<String> {
    optional(obj, key).and_then(|x| v.at(key, |v| v.string(x).map(str::to_string)))
}

pub(super) fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, msg)
}

/// Validates the body. Errors name the field (`param`).
pub fn validate(body: &Value, priority_scheduling: bool) -> Result<ChatPlan, ApiError> {
    let mut v = Validator::new("body");
    let Some(obj) = v.object(body) else { return Err(ApiError::validation(v.into_errors())) };
    let messages = match v.required(obj, "messages") {
        Some(m) => v.at("messages", |v| messages(v, m)),
        None => None,
    };
    let model = string(&mut v, obj, "model");
    let temperature = num(&mut v, obj, "temperature");
    let top_p = num(&mut v, obj, "top_p");
    let top_k = int(&mut v, obj, "top_k");
    let min_p = num(&mut v, obj, "min_p");
    let presence = num(&mut v, obj, "presence_penalty");
    let frequency = num(&mut v, obj, "frequency_penalty");
    let repetition = num(&mut v, obj, "repetition_penalty");
    let seed = int(&mut v, obj, "seed");
    let n = int(&mut v, obj, "n");
    let max_completion = int(&mut v, obj, "max_completion_tokens").or_else(|| int(&mut v, obj, "max_tokens"));
    let min_tokens = int(&mut v, obj, "min_tokens");
    let logprobs = flag(&mut v, obj, "logprobs").unwrap_or(false);
    let top_logprobs = int(&mut v, obj, "top_logprobs");
    let stream = flag(&mut v, obj, "stream").unwrap_or(false);
    let priority = int(&mut v, obj, "priority").unwrap_or(0);
    let truncate = int(&mut v, obj, "truncate_prompt_tokens");
    let prompt_logprobs = int(&mut v, obj, "prompt_logprobs");
    let use_beam = flag(&mut v, obj, "use_beam_search").unwrap_or(false);
    let length_penalty = num(&mut v, obj, "length_penalty");
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
    let mut p = SamplingParams {
        ignore_eos: flag(&mut v, obj, "ignore_eos").unwrap_or(false),
        include_stop_str_in_output: flag(&mut v, obj, "include_stop_str_in_output").unwrap_or(false),
        skip_special_tokens: flag(&mut v, obj, "skip_special_tokens").unwrap_or(true),
        ..Default::default()
    };
    let stop = optional(obj, "stop").cloned();
    let stop_token_ids = optional(obj, "stop_token_ids").cloned();
    let allowed = optional(obj, "allowed_token_ids").cloned();
    let bias = optional(obj, "logit_bias").cloned();
    let bad_words = optional(obj, "bad_words").cloned();
    let stream_options = optional(obj, "stream_options").cloned();
    if v.has_errors() {
        return Err(ApiError::validation(v.into_errors()));
    }
    let messages = messages.ok_or_else(|| bad("messages", "messages must be a non-empty list"))?;

    // Ranges, as vLLM's SamplingParams checks them.
    if let Some(t) = temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(bad("temperature", format!("temperature must be in [0, 2], got {t}.")));
        }
        // vLLM raises tiny positive temperatures to 0.01.
        p.temperature = if t > 0.0 && t < 0.01 { 0.01 } else { t as f32 };
    }
    if let Some(tp) = top_p {
        if !(tp > 0.0 && tp <= 1.0) {
            return Err(bad("top_p", format!("top_p must be in (0, 1], got {tp}.")));
        }
        p.top_p = tp as f32;
    }
    if let Some(k) = top_k {
        if k < -1 {
            return Err(bad("top_k", format!("top_k must be -1 (disable), or at least 1, got {k}.")));
        }
        p.top_k = k.max(0) as usize;
    }
    if let Some(m) = min_p {
        if !(0.0..=1.0).contains(&m) {
            return Err(bad("min_p", format!("min_p must be in [0, 1], got {m}.")));
        }
        p.min_p = m as f32;
    }
    for (name, value, slot) in [
        ("presence_penalty", presence, &mut p.presence_penalty),
        ("frequency_penalty", frequency, &mut p.frequency_penalty),
    ] {
        if let Some(x) = value {
            if !(-2.0..=2.0).contains(&x) {
                return Err(bad(name, format!("{name} must be in [-2, 2], got {x}.")));
            }
            *slot = x as f32;
        }
    }
    if let Some(r) = repetition {
        if r <= 0.0 {
            return Err(bad("repetition_penalty", format!("repetition_penalty must be greater than zero, got {r}.")));
        }
        p.repetition_penalty = r as f32;
    }
    p.seed = seed.map(|s| s as u64);
    let n = n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(bad("n", format!("n must be between 1 and {MAX_N}, got {n}.")));
    }
    if n > 1 && p.is_greedy() && !use_beam {
        return Err(bad("n", format!("n must be 1 when using greedy sampling, got {n}.")));
    }
    let max_tokens = match max_completion {
        Some(m) if m < 1 => {
            return Err(bad("max_completion_tokens", format!("max_tokens must be at least 1, got {m}.")))
        }
        Some(m) => Some(m as usize),
        None => None,
    };
    if let Some(m) = min_tokens {
        if m < 0 || max_tokens.is_some_and(|mx| m as usize > mx) {
            return Err(bad("min_tokens", format!("min_tokens must be between 0 and max_tokens, got {m}.")));
        }
        p.min_tokens = m as usize;
    }
    match top_logprobs {
        Some(k) if !(0..=MAX_LOGPROBS).contains(&k) => {
            return Err(bad("top_logprobs", format!("top_logprobs must be between 0 and {MAX_LOGPROBS}, got {k}.")));
        }
        Some(k) if k > 0 && !logprobs => {
            return Err(bad("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."))
        }
        _ => {}
    }
    if logprobs {
        p.logprobs = Some(top_logprobs.unwrap_or(0) as usize);
    }
    if let Some(k) = prompt_logprobs {
        if !(0..=MAX_LOGPROBS).contains(&k) {
            return Err(bad(
                "prompt_logprobs",
                format!("prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {k}."),
            ));
        }
        if stream {
            return Err(bad("prompt_logprobs", "`prompt_logprobs` are not available when `stream=True`."));
        }
    }
    if priority != 0 && !priority_scheduling {
        return Err(bad("priority", format!("Got priority {priority} but priority scheduling is not enabled.")));
    }
    if let Some(t) = truncate {
        if t < -1 || t == 0 {
            return Err(bad("truncate_prompt_tokens", "truncate_prompt_tokens must be -1 or positive."));
        }
    }
    p.stop = stop_strings(stop)?;
    p.stop_token_ids = id_list("stop_token_ids", stop_token_ids)?.unwrap_or_default();
    if p.stop_token_ids.len() > MAX_BIAS_ENTRIES {
        return Err(bad("stop_token_ids", format!("at most {MAX_BIAS_ENTRIES} stop_token_ids are allowed.")));
    }
    p.allowed_token_ids = id_list("allowed_token_ids", allowed)?;
    if p.allowed_token_ids.as_ref().is_some_and(Vec::is_empty) {
        return Err(bad("allowed_token_ids", "allowed_token_ids is not None and empty!"));
    }
    p.logit_bias = logit_bias(bias)?;
    let bad_words = string_list("bad_words", bad_words)?;
    if bad_words.len() > MAX_BAD_WORDS {
        return Err(bad("bad_words", format!("at most {MAX_BAD_WORDS} bad_words are allowed.")));
    }
    if bad_words.iter().any(String::is_empty) {
        return Err(bad("bad_words", "bad_words cannot contain an empty string."));
    }
    let (include_usage, continuous_usage) = stream_opts(stream_options, stream)?;
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
    let cache_salt =
        match optional(obj, "cache_salt") {
            None => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 128 && !s.contains(['@', '/', '\\', '\0']) => {
                Some(s.clone())
            }
            Some(_) => return Err(bad(
                "cache_salt",
                "Parameter 'cache_salt' must be a non-empty string of at most 128 characters without @ / \\ or NUL.",
            )),
        };
    let tools = super::tools::validate(obj, &mut render)?;
    let include_reasoning = match optional(obj, "include_reasoning") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("include_reasoning", "include_reasoning must be a boolean")),
    };
    p.constraint = structured::constraint(obj)?;
    if let (Some(_), Some(c)) = (&tools, &p.constraint) {
        return Err(bad(&c.field, "You can only either use constraints for structured outputs or tools, not both."));
    }
    p.processors = processors(optional(obj, "logits_processors"))?;
    let beam = if use_beam {
        beam_compatible(&p, prompt_logprobs.is_some(), !bad_words.is_empty())?;
        if tools.is_some() {
            return Err(bad("tools", "tool calling cannot be combined with use_beam_search"));
        }
        // Each step runs one engine request per beam: the width is bounded like a batch.
        if n > MAX_BEAM_WIDTH {
            return Err(bad("n", format!("use_beam_search supports a beam width (n) of at most {MAX_BEAM_WIDTH}.")));
        }
        Some(length_penalty.unwrap_or(1.0))
    } else {
        None
    };
    let role = if render.add_generation_prompt {
        "assistant".to_string()
    } else {
        messages.last().map_or("assistant", |m| m.role.as_str()).to_string()
    };
    render.messages = messages;
    Ok(ChatPlan {
        model,
        render,
        params: p,
        max_tokens,
        n: n as usize,
        stream,
        include_usage,
        continuous_usage,
        logprobs,
        return_token_ids: optional(obj, "return_token_ids").and_then(Value::as_bool).unwrap_or(false),
        tokens_as_ids: optional(obj, "return_tokens_as_token_ids").and_then(Value::as_bool).unwrap_or(false),
        echo: optional(obj, "echo").and_then(Value::as_bool).unwrap_or(false),
        priority,
        request_id: optional(obj, "request_id").and_then(Value::as_str).map(str::to_string),
        cache_salt,
        truncate_prompt_tokens: truncate,
        prompt_logprobs: prompt_logprobs.map(|k| k as usize),
        bad_words,
        role,
        beam,
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

fn stop_strings(stop: Option<Value>) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s],
        Some(other) => string_list("stop", Some(other))?,
    };
    if list.len() > 4 {
        return Err(bad("stop", format!("at most 4 stop strings are allowed, got {}.", list.len())));
    }
    if list.iter().any(String::is_empty) {
        return Err(bad("stop", "stop cannot contain an empty string."));
    }
    Ok(list)
}

fn string_list(name: &str, value: Option<Value>) -> Result<Vec<String>, ApiError> {
    match value {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|x| match x {
                Value::String(s) => Ok(s),
                _ => Err(bad(name, format!("{name} must be a list of strings."))),
            })
            .collect(),
        Some(_) => Err(bad(name, format!("{name} must be a list of strings."))),
    }
}

/// A list of token ids, at most [`MAX_TOKEN_LIST`] long, sorted and without duplicates (the
/// sampler walks it alongside the logits once per token).
fn id_list(name: &str, value: Option<Value>) -> Result<Option<Vec<u32>>, ApiError> {
    let ids = match value {
        None => return Ok(None),
        Some(Value::Array(items)) if items.len() > MAX_TOKEN_LIST => {
            return Err(bad(name, format!("{name} may hold at most {MAX_TOKEN_LIST} token ids.")))
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| {
                x.as_u64()
                    .filter(|i| *i <= u32::MAX as u64)
                    .map(|i| i as u32)
                    .ok_or_else(|| bad(name, format!("{name} must be a list of token ids.")))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(bad(name, format!("{name} must be a list of token ids."))),
    };
    let mut ids = ids;
    ids.sort_unstable();
    ids.dedup();
    Ok(Some(ids))
}

fn logit_bias(value: Option<Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(value) = value else { return Ok(Vec::new()) };
    let Value::Object(map) = value else {
        return Err(bad("logit_bias", "logit_bias must be an object of token id to bias."));
    };
    if map.len() > MAX_BIAS_ENTRIES {
        return Err(bad("logit_bias", format!("logit_bias may hold at most {MAX_BIAS_ENTRIES} tokens.")));
    }
    let mut out = Vec::with_capacity(map.len());
    for (k, b) in map {
        let id: u32 = k.parse().map_err(|_| {
            bad("logit_bias", format!("logit_bias contains key(s) that cannot be converted to integer token IDs: {k}"))
        })?;
        let b = b.as_f64().ok_or_else(|| bad("logit_bias", "logit_bias values must be numbers."))?;
        out.push((id, b.clamp(-100.0, 100.0) as f32));
    }
    Ok(out)
}

fn stream_opts(value: Option<Value>, stream: bool) -> Result<(bool, bool), ApiError> {
    let Some(value) = value else { return Ok((false, false)) };
    let Value::Object(o) = &value else { return Err(bad("stream_options", "stream_options must be an object.")) };
    if !stream {
        return Err(bad("stream_options", "Stream options can only be defined when `stream=True`."));
    }
    let include = o.get("include_usage").and_then(Value::as_bool).unwrap_or(false);
    let continuous = o.get("continuous_usage_stats").and_then(Value::as_bool).unwrap_or(false);
    Ok((include, include && continuous))
}

/// Beam search ranks hypotheses by the raw model's logprobs, so fields that change sampling or
/// cut text would be silently ignored (vLLM ignores them); they are refused instead.
fn beam_compatible(p: &SamplingParams, prompt_logprobs: bool, bad_words: bool) -> Result<(), ApiError> {
    let d = SamplingParams::default();
    let ignored = [
        ("stop", !p.stop.is_empty()),
        ("stop_token_ids", !p.stop_token_ids.is_empty()),
        ("min_tokens", p.min_tokens != 0),
        ("logit_bias", !p.logit_bias.is_empty()),
        ("allowed_token_ids", p.allowed_token_ids.is_some()),
        ("bad_words", bad_words),
        ("logits_processors", !p.processors.is_empty()),
        ("presence_penalty", p.presence_penalty != d.presence_penalty),
        ("frequency_penalty", p.frequency_penalty != d.frequency_penalty),
        ("repetition_penalty", p.repetition_penalty != d.repetition_penalty),
        ("top_p", p.top_p != d.top_p),
        ("top_k", p.top_k != d.top_k),
        ("min_p", p.min_p != d.min_p),
        ("prompt_logprobs", prompt_logprobs),
        (p.constraint.as_ref().map_or("structured_outputs", |c| c.field.as_str()), p.constraint.is_some()),
    ];
    match ignored.iter().find(|(_, set)| *set) {
        Some((name, _)) => Err(bad(
            name,
            format!("`{name}` cannot be combined with use_beam_search (beam search ranks by the raw model's logprobs)"),
        )),
        None => Ok(()),
    }
}

/// `logits_processors`: names (or `{qualname, args, kwargs}`) of built-in processors only.
fn processors(value: Option<&Value>) -> Result<Vec<LogitsProcessor>, ApiError> {
    let Some(value) = value else { return Ok(Vec::new()) };
    let Value::Array(items) = value else { return Err(bad("logits_processors", "logits_processors must be a list.")) };
    if items.len() > 16 {
        return Err(bad("logits_processors", "at most 16 logits processors are allowed"));
    }
    let known = LogitsProcessor::NAMES.join(", ");
    let mut out = Vec::new();
    for item in items {
        let (name, args, kwargs) = match item {
            Value::String(s) => (s.as_str(), None, None),
            Value::Object(o) => (
                o.get("qualname")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("logits_processors", "each processor needs a `qualname`"))?,
                o.get("args").and_then(Value::as_array),
                o.get("kwargs").and_then(Value::as_object),
            ),
            _ => return Err(bad("logits_processors", "each processor is a name or {qualname, args, kwargs}")),
        };
        let arg = |key: &str| kwargs.and_then(|k| k.get(key)).or_else(|| args.and_then(|a| a.first()));
        let proc = match name {
            "no_repeat_ngram" => {
                let n = arg("n")
                    .and_then(Value::as_u64)
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| bad("logits_processors", "no_repeat_ngram needs n, an integer from 1 to 64"))?;
                LogitsProcessor::NoRepeatNgram { n: n as usize }
            }
            "suppress_tokens" => {
                let ids = id_list("logits_processors", arg("token_ids").cloned())
                    .map_err(|_| {
                        bad(
                            "logits_processors",
                            format!("suppress_tokens needs token_ids, a list of at most {MAX_TOKEN_LIST} token ids"),
                        )
                    })?
                    .ok_or_else(|| bad("logits_processors", "suppress_tokens needs token_ids, a list of token ids"))?;
                LogitsProcessor::SuppressTokens { token_ids: ids }
            }
            other => {
                return Err(bad(
                    "logits_processors",
                    format!("unknown logits processor {other:?}; built-in processors: {known}"),
                ))
            }
        };
        out.push(proc);
    }
    Ok(out)
}

mod structured;
#[cfg(test)]
mod tests;
