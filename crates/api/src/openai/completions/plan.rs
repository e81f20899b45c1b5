//! Validation of a `POST /v1/completions` body into a [`CompletionPlan`], as vLLM's
//! `CompletionRequest` checks it: the shared sampling fields, then the prompt forms, `echo`,
//! integer `logprobs`, and the fields tandem refuses by name (`suffix`, `prompt_embeds`).

use crate::error::ApiError;
use crate::openai::request::{bad, flag, int, Fields, Sampling, MAX_LOGPROBS, MAX_N};
use serde_json::Value;
use tandem_core::validate::{optional, Validator};

/// Most prompts one request may carry; with `n` they also count against `MAX_N` choices.
pub const MAX_PROMPTS: usize = 64;
/// vLLM's default output length for completions (OpenAI's legacy API: 16).
const DEFAULT_MAX_TOKENS: usize = 16;

/// One prompt, as the request gave it.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// A validated completions request, before the model is consulted.
#[derive(Debug, Clone)]
pub struct CompletionPlan {
    pub sampling: Sampling,
    pub prompts: Vec<PromptInput>,
    pub echo: bool,
    /// `echo` with `max_tokens: 0`: the one token the engine samples is not shown.
    pub echo_only: bool,
    /// `logprobs`: how many top alternatives to show per token (0: the sampled token alone).
    pub logprobs: Option<usize>,
    /// Text prompts get the tokenizer's special tokens (a BOS), as vLLM's default.
    pub add_special_tokens: bool,
}

/// Validates a completions body. Errors name the field.
pub fn validate(body: &Value, priority_scheduling: bool) -> Result<CompletionPlan, ApiError> {
    let mut v = Validator::new("body");
    let Some(obj) = v.object(body) else { return Err(ApiError::validation(v.into_errors())) };
    if v.required(obj, "prompt").is_none() {
        return Err(ApiError::validation(v.into_errors()));
    }
    let mut fields = Fields::parse(&mut v, obj, &["max_tokens"]);
    let echo = flag(&mut v, obj, "echo").unwrap_or(false);
    let logprobs = int(&mut v, obj, "logprobs");
    let best_of = int(&mut v, obj, "best_of");
    let add_special_tokens = flag(&mut v, obj, "add_special_tokens").unwrap_or(true);
    if v.has_errors() {
        return Err(ApiError::validation(v.into_errors()));
    }
    for (field, why) in [
        ("suffix", "suffix is not currently supported"),
        ("prompt_embeds", "prompt_embeds are not supported: send text or token ids"),
    ] {
        if optional(obj, field).is_some() {
            return Err(bad(field, why));
        }
    }
    let prompts = prompts(&obj["prompt"])?;
    let logprobs = match logprobs {
        Some(k) if !(0..=MAX_LOGPROBS).contains(&k) => {
            return Err(bad("logprobs", format!("logprobs must be between 0 and {MAX_LOGPROBS}, got {k}.")))
        }
        k => k.map(|k| k as usize),
    };
    // `echo` with `max_tokens: 0` scores the prompt and generates nothing (vLLM's form).
    let echo_only = echo && fields.zero_max_tokens_to_one();
    let mut sampling = fields.check(obj, logprobs, "max_tokens", priority_scheduling)?;
    if let Some(b) = best_of {
        if b != sampling.n as i64 {
            return Err(bad(
                "best_of",
                format!(
                    "best_of ({b}) must equal n ({}): choosing the best of more samples is not supported",
                    sampling.n
                ),
            ));
        }
    }
    if prompts.len() * sampling.n > MAX_N as usize {
        return Err(bad(
            "n",
            format!("{} prompts x n={} is more than {MAX_N} choices in one request", prompts.len(), sampling.n),
        ));
    }
    sampling.max_tokens = Some(sampling.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    if echo && logprobs.is_some() {
        // The prompt's own logprobs come from the engine's prompt logprobs, which a beam search
        // (ranking by the raw model) does not compute.
        if sampling.beam.is_some() {
            return Err(bad("echo", "echo with logprobs cannot be combined with use_beam_search"));
        }
        if sampling.stream {
            return Err(bad(
                "echo",
                "echo with logprobs is not available when `stream=True` (the prompt's logprobs are computed whole)",
            ));
        }
        sampling.prompt_logprobs = Some(sampling.prompt_logprobs.unwrap_or(0).max(logprobs.unwrap_or(0)));
    }
    Ok(CompletionPlan { sampling, prompts, echo, echo_only, logprobs, add_special_tokens })
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
fn prompts(value: &Value) -> Result<Vec<PromptInput>, ApiError> {
    const SHAPE: &str =
        "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids";
    let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|x| x.as_u64().and_then(|i| u32::try_from(i).ok()).ok_or_else(|| bad("prompt", SHAPE)))
            .collect()
    };
    let out = match value {
        Value::String(s) => vec![PromptInput::Text(s.clone())],
        Value::Array(items) if items.is_empty() => return Err(bad("prompt", "prompt must not be empty")),
        Value::Array(items) if items.len() > MAX_PROMPTS && !items[0].is_number() => {
            return Err(bad("prompt", format!("at most {MAX_PROMPTS} prompts are allowed in one request")))
        }
        Value::Array(items) => match &items[0] {
            Value::Number(_) => vec![PromptInput::Tokens(ids(items)?)],
            Value::String(_) => items
                .iter()
                .map(|x| x.as_str().map(|s| PromptInput::Text(s.to_string())).ok_or_else(|| bad("prompt", SHAPE)))
                .collect::<Result<_, _>>()?,
            Value::Array(_) => items
                .iter()
                .map(|x| match x.as_array() {
                    Some(list) if !list.is_empty() => ids(list).map(PromptInput::Tokens),
                    Some(_) => Err(bad("prompt", "prompt must not contain an empty list of token ids")),
                    None => Err(bad("prompt", SHAPE)),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(bad("prompt", SHAPE)),
        },
        _ => return Err(bad("prompt", SHAPE)),
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(body: Value) -> CompletionPlan {
        validate(&body, true).unwrap_or_else(|e| panic!("{}: {}", e.message, body))
    }

    fn err(body: Value) -> (Option<String>, String) {
        let e = validate(&body, true).expect_err("should be rejected");
        (e.param.clone().or_else(|| e.fields.first().map(|f| format!("{:?}", f.loc))), e.message)
    }

    #[test]
    fn every_prompt_form_reads() {
        assert_eq!(ok(json!({"prompt": "hi"})).prompts, vec![PromptInput::Text("hi".into())]);
        assert_eq!(
            ok(json!({"prompt": ["a", "b"]})).prompts,
            vec![PromptInput::Text("a".into()), PromptInput::Text("b".into())]
        );
        assert_eq!(ok(json!({"prompt": [1, 2, 3]})).prompts, vec![PromptInput::Tokens(vec![1, 2, 3])]);
        assert_eq!(
            ok(json!({"prompt": [[1], [2, 3]]})).prompts,
            vec![PromptInput::Tokens(vec![1]), PromptInput::Tokens(vec![2, 3])]
        );
        for bad in [json!([]), json!([1, "a"]), json!(["a", 1]), json!([[1], []]), json!([-1]), json!(3), json!([{}])] {
            assert_eq!(err(json!({"prompt": bad})).0.as_deref(), Some("prompt"), "{bad}");
        }
        assert!(err(json!({})).0.unwrap().contains("prompt"));
    }

    #[test]
    fn defaults_and_limits_follow_vllm() {
        let p = ok(json!({"prompt": "x"}));
        assert_eq!(
            (p.sampling.max_tokens, p.sampling.n, p.echo, p.logprobs, p.add_special_tokens),
            (Some(16), 1, false, None, true)
        );
        assert_eq!(ok(json!({"prompt": "x", "logprobs": 0})).sampling.params.logprobs, Some(0));
        assert_eq!(err(json!({"prompt": "x", "logprobs": 21})).0.as_deref(), Some("logprobs"));
        assert_eq!(err(json!({"prompt": "x", "suffix": "y"})).0.as_deref(), Some("suffix"));
        assert_eq!(err(json!({"prompt": "x", "best_of": 2})).0.as_deref(), Some("best_of"));
        assert_eq!(ok(json!({"prompt": "x", "best_of": 2, "n": 2, "temperature": 1})).sampling.n, 2);
        assert_eq!(err(json!({"prompt": "x", "max_tokens": 0})).0.as_deref(), Some("max_tokens"));
        // 64 prompts x n=3 choices is over the per-request limit.
        let many: Vec<String> = (0..64).map(|i| i.to_string()).collect();
        assert_eq!(err(json!({"prompt": many, "n": 3, "temperature": 1})).0.as_deref(), Some("n"));
        let too_many: Vec<String> = (0..65).map(|i| i.to_string()).collect();
        assert_eq!(err(json!({"prompt": too_many})).0.as_deref(), Some("prompt"));
    }

    #[test]
    fn echo_with_logprobs_asks_for_the_prompts_logprobs() {
        let p = ok(json!({"prompt": "x", "echo": true, "logprobs": 2}));
        assert_eq!(p.sampling.prompt_logprobs, Some(2));
        assert_eq!(ok(json!({"prompt": "x", "echo": true})).sampling.prompt_logprobs, None);
        assert_eq!(err(json!({"prompt": "x", "echo": true, "logprobs": 1, "stream": true})).0.as_deref(), Some("echo"));
    }

    #[test]
    fn echo_with_zero_max_tokens_scores_the_prompt_only() {
        let p = ok(json!({"prompt": "x", "echo": true, "max_tokens": 0, "logprobs": 1}));
        assert_eq!((p.echo_only, p.sampling.max_tokens, p.sampling.prompt_logprobs), (true, Some(1), Some(1)));
        assert!(!ok(json!({"prompt": "x", "echo": true, "max_tokens": 1})).echo_only);
        assert_eq!(err(json!({"prompt": "x", "max_tokens": 0})).0.as_deref(), Some("max_tokens"));
        assert_eq!(err(json!({"prompt": "x", "echo": true, "max_tokens": -1})).0.as_deref(), Some("max_tokens"));
    }
}
