//! The fields every generating route shares: vLLM's sampling parameters and request extras,
//! typed in one pass that reports every wrong type (pydantic's shape), then ranged and defaulted
//! as vLLM's `SamplingParams` checks them. Chat and completions differ only in how they ask for
//! logprobs and in their own fields, which their validators add.

use super::structured;
use super::{bad, MAX_BAD_WORDS, MAX_BEAM_WIDTH, MAX_BIAS_ENTRIES, MAX_LOGPROBS, MAX_N, MAX_TOKEN_LIST};
use crate::error::ApiError;
use serde_json::{Map, Value};
use tandem_core::inference::{LogitsProcessor, SamplingParams};
use tandem_core::validate::{optional, Validator};

pub(crate) fn num(v: &mut Validator, obj: &Map<String, Value>, key: &str) -> Option<f64> {
    optional(obj, key).and_then(|x| v.at(key, |v| v.number(x)))
}

pub(crate) fn int(v: &mut Validator, obj: &Map<String, Value>, key: &str) -> Option<i64> {
    optional(obj, key).and_then(|x| v.at(key, |v| v.integer(x)))
}

pub(crate) fn flag(v: &mut Validator, obj: &Map<String, Value>, key: &str) -> Option<bool> {
    optional(obj, key).and_then(|x| v.at(key, |v| v.boolean(x)))
}

pub(crate) fn string(v: &mut Validator, obj: &Map<String, Value>, key: &str) -> Option<String> {
    optional(obj, key).and_then(|x| v.at(key, |v| v.string(x).map(str::to_string)))
}

/// The shared fields, type-checked but not yet ranged.
pub(crate) struct Fields {
    model: Option<String>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    presence: Option<f64>,
    frequency: Option<f64>,
    repetition: Option<f64>,
    seed: Option<i64>,
    n: Option<i64>,
    max_tokens: Option<i64>,
    min_tokens: Option<i64>,
    stream: bool,
    priority: i64,
    truncate: Option<i64>,
    prompt_logprobs: Option<i64>,
    use_beam: bool,
    length_penalty: Option<f64>,
    ignore_eos: bool,
    include_stop_str_in_output: bool,
    skip_special_tokens: bool,
}

/// The shared fields, checked: what a route's plan is built from.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub model: Option<String>,
    pub params: SamplingParams,
    /// The requested output length, clamped later to the context left.
    pub max_tokens: Option<usize>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub return_token_ids: bool,
    pub tokens_as_ids: bool,
    pub priority: i64,
    pub request_id: Option<String>,
    pub cache_salt: Option<String>,
    pub truncate_prompt_tokens: Option<i64>,
    pub prompt_logprobs: Option<usize>,
    /// `bad_words` as text; tokenized once the model is known.
    pub bad_words: Vec<String>,
    /// `use_beam_search`: the `length_penalty`; `n` is the beam width.
    pub beam: Option<f64>,
}

impl Fields {
    /// vLLM's echo-only scoring (`echo` with `max_tokens: 0`): the engine still samples one token,
    /// which the route then drops. True when `max_tokens` was 0 (it is now 1).
    pub(crate) fn zero_max_tokens_to_one(&mut self) -> bool {
        let zero = self.max_tokens == Some(0);
        if zero {
            self.max_tokens = Some(1);
        }
        zero
    }

    /// Type-checks the shared fields into `v`. `max_tokens_keys`: the route's names for the
    /// output length, first found wins.
    pub(crate) fn parse(v: &mut Validator, obj: &Map<String, Value>, max_tokens_keys: &[&str]) -> Fields {
        Fields {
            model: string(v, obj, "model"),
            temperature: num(v, obj, "temperature"),
            top_p: num(v, obj, "top_p"),
            top_k: int(v, obj, "top_k"),
            min_p: num(v, obj, "min_p"),
            presence: num(v, obj, "presence_penalty"),
            frequency: num(v, obj, "frequency_penalty"),
            repetition: num(v, obj, "repetition_penalty"),
            seed: int(v, obj, "seed"),
            n: int(v, obj, "n"),
            max_tokens: max_tokens_keys.iter().find_map(|k| int(v, obj, k)),
            min_tokens: int(v, obj, "min_tokens"),
            stream: flag(v, obj, "stream").unwrap_or(false),
            priority: int(v, obj, "priority").unwrap_or(0),
            truncate: int(v, obj, "truncate_prompt_tokens"),
            prompt_logprobs: int(v, obj, "prompt_logprobs"),
            use_beam: flag(v, obj, "use_beam_search").unwrap_or(false),
            length_penalty: num(v, obj, "length_penalty"),
            ignore_eos: flag(v, obj, "ignore_eos").unwrap_or(false),
            include_stop_str_in_output: flag(v, obj, "include_stop_str_in_output").unwrap_or(false),
            skip_special_tokens: flag(v, obj, "skip_special_tokens").unwrap_or(true),
        }
    }

    /// Ranges and defaults, as vLLM's `SamplingParams` checks them. `logprobs`: the top-k the
    /// route asked for (`Some(0)`: the sampled token's alone); `max_tokens_field` names the
    /// output length in errors.
    pub(crate) fn check(
        self,
        obj: &Map<String, Value>,
        logprobs: Option<usize>,
        max_tokens_field: &str,
        priority_scheduling: bool,
    ) -> Result<Sampling, ApiError> {
        let mut p = SamplingParams {
            ignore_eos: self.ignore_eos,
            include_stop_str_in_output: self.include_stop_str_in_output,
            skip_special_tokens: self.skip_special_tokens,
            ..Default::default()
        };
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(bad("temperature", format!("temperature must be in [0, 2], got {t}.")));
            }
            // vLLM raises tiny positive temperatures to 0.01.
            p.temperature = if t > 0.0 && t < 0.01 { 0.01 } else { t as f32 };
        }
        if let Some(tp) = self.top_p {
            if !(tp > 0.0 && tp <= 1.0) {
                return Err(bad("top_p", format!("top_p must be in (0, 1], got {tp}.")));
            }
            p.top_p = tp as f32;
        }
        if let Some(k) = self.top_k {
            if k < -1 {
                return Err(bad("top_k", format!("top_k must be -1 (disable), or at least 1, got {k}.")));
            }
            p.top_k = k.max(0) as usize;
        }
        if let Some(m) = self.min_p {
            if !(0.0..=1.0).contains(&m) {
                return Err(bad("min_p", format!("min_p must be in [0, 1], got {m}.")));
            }
            p.min_p = m as f32;
        }
        for (name, value, slot) in [
            ("presence_penalty", self.presence, &mut p.presence_penalty),
            ("frequency_penalty", self.frequency, &mut p.frequency_penalty),
        ] {
            if let Some(x) = value {
                if !(-2.0..=2.0).contains(&x) {
                    return Err(bad(name, format!("{name} must be in [-2, 2], got {x}.")));
                }
                *slot = x as f32;
            }
        }
        if let Some(r) = self.repetition {
            if r <= 0.0 {
                return Err(bad(
                    "repetition_penalty",
                    format!("repetition_penalty must be greater than zero, got {r}."),
                ));
            }
            p.repetition_penalty = r as f32;
        }
        p.seed = self.seed.map(|s| s as u64);
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(bad("n", format!("n must be between 1 and {MAX_N}, got {n}.")));
        }
        if n > 1 && p.is_greedy() && !self.use_beam {
            return Err(bad("n", format!("n must be 1 when using greedy sampling, got {n}.")));
        }
        let max_tokens = match self.max_tokens {
            Some(m) if m < 1 => return Err(bad(max_tokens_field, format!("max_tokens must be at least 1, got {m}."))),
            Some(m) => Some(m as usize),
            None => None,
        };
        if let Some(m) = self.min_tokens {
            if m < 0 || max_tokens.is_some_and(|mx| m as usize > mx) {
                return Err(bad("min_tokens", format!("min_tokens must be between 0 and max_tokens, got {m}.")));
            }
            p.min_tokens = m as usize;
        }
        p.logprobs = logprobs;
        if let Some(k) = self.prompt_logprobs {
            if !(0..=MAX_LOGPROBS).contains(&k) {
                return Err(bad(
                    "prompt_logprobs",
                    format!("prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {k}."),
                ));
            }
            if self.stream {
                return Err(bad("prompt_logprobs", "`prompt_logprobs` are not available when `stream=True`."));
            }
        }
        if self.priority != 0 && !priority_scheduling {
            return Err(bad(
                "priority",
                format!("Got priority {} but priority scheduling is not enabled.", self.priority),
            ));
        }
        if let Some(t) = self.truncate {
            if t < -1 || t == 0 {
                return Err(bad("truncate_prompt_tokens", "truncate_prompt_tokens must be -1 or positive."));
            }
        }
        p.stop = stop_strings(optional(obj, "stop").cloned())?;
        p.stop_token_ids = id_list("stop_token_ids", optional(obj, "stop_token_ids").cloned())?.unwrap_or_default();
        if p.stop_token_ids.len() > MAX_BIAS_ENTRIES {
            return Err(bad("stop_token_ids", format!("at most {MAX_BIAS_ENTRIES} stop_token_ids are allowed.")));
        }
        p.allowed_token_ids = id_list("allowed_token_ids", optional(obj, "allowed_token_ids").cloned())?;
        if p.allowed_token_ids.as_ref().is_some_and(Vec::is_empty) {
            return Err(bad("allowed_token_ids", "allowed_token_ids is not None and empty!"));
        }
        p.logit_bias = logit_bias(optional(obj, "logit_bias").cloned())?;
        let bad_words = string_list("bad_words", optional(obj, "bad_words").cloned())?;
        if bad_words.len() > MAX_BAD_WORDS {
            return Err(bad("bad_words", format!("at most {MAX_BAD_WORDS} bad_words are allowed.")));
        }
        if bad_words.iter().any(String::is_empty) {
            return Err(bad("bad_words", "bad_words cannot contain an empty string."));
        }
        let (include_usage, continuous_usage) = stream_opts(optional(obj, "stream_options").cloned(), self.stream)?;
        let cache_salt = match optional(obj, "cache_salt") {
            None => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 128 && !s.contains(['@', '/', '\\', '\0']) => {
                Some(s.clone())
            }
            Some(_) => return Err(bad(
                "cache_salt",
                "Parameter 'cache_salt' must be a non-empty string of at most 128 characters without @ / \\ or NUL.",
            )),
        };
        p.constraint = structured::constraint(obj)?;
        p.processors = processors(optional(obj, "logits_processors"))?;
        let beam = if self.use_beam {
            beam_compatible(&p, self.prompt_logprobs.is_some(), !bad_words.is_empty())?;
            // Each step runs one engine request per beam: the width is bounded like a batch.
            if n > MAX_BEAM_WIDTH {
                return Err(bad(
                    "n",
                    format!("use_beam_search supports a beam width (n) of at most {MAX_BEAM_WIDTH}."),
                ));
            }
            Some(self.length_penalty.unwrap_or(1.0))
        } else {
            None
        };
        Ok(Sampling {
            model: self.model,
            params: p,
            max_tokens,
            n: n as usize,
            stream: self.stream,
            include_usage,
            continuous_usage,
            return_token_ids: optional(obj, "return_token_ids").and_then(Value::as_bool).unwrap_or(false),
            tokens_as_ids: optional(obj, "return_tokens_as_token_ids").and_then(Value::as_bool).unwrap_or(false),
            priority: self.priority,
            request_id: optional(obj, "request_id").and_then(Value::as_str).map(str::to_string),
            cache_salt,
            truncate_prompt_tokens: self.truncate,
            prompt_logprobs: self.prompt_logprobs.map(|k| k as usize),
            bad_words,
            beam,
        })
    }
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
