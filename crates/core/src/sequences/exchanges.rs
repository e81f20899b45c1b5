//! Trajectories recorded as `exchanges` (ART 0.5.23's capture format): the raw request and
//! response of every inference call of a rollout, turned into token sequences from the exact
//! ids the server returned, as ART's own backends do.
//!
//! Only the calls to the model being trained count (a judge's calls are recorded too); they are
//! taken in time order. Each choice of a call extends the longest sequence built so far that its
//! prompt begins with (the prompt's new tokens are context), or starts a new one; the choices of
//! one call (`n > 1`) each get their own branch. A sampled token is trained once per
//! trajectory: a position whose whole token prefix was already trained in an earlier sequence is
//! context. Chat-completions, completions, Responses and Anthropic messages exchanges are trained
//! on (every endpoint tandem serves); the choices of a completions call with several prompts
//! extend or branch per prompt.
//! A trajectory whose calls to the model are of another kind is refused, naming it.

use super::Sequence;
use serde_json::Value;
use std::collections::HashSet;

/// The exchange kinds ART records, by their key in `exchanges`.
pub const KINDS: [&str; 4] = ["chat_completions", "completions", "responses", "messages"];

/// The model a trajectory trains: exchanges whose `model` names it (with or without a
/// `:stepN` suffix, with or without the `wandb-artifact://` scheme) are its calls.
pub struct TrainedModel<'a> {
    pub entity: &'a str,
    pub project: &'a str,
    pub name: &'a str,
}

impl TrainedModel<'_> {
    pub fn matches(&self, model: &str) -> bool {
        let path = model
            .strip_prefix("wandb-artifact:///")
            .or_else(|| model.strip_prefix("wandb-artifact://"))
            .unwrap_or(model);
        let (path, _) = crate::names::split_step_suffix(path);
        path == format!("{}/{}/{}", self.entity, self.project, self.name)
    }
}

/// The model an exchange called: the request's `model`, else the response's.
fn exchange_model(x: &Value) -> Option<&str> {
    x.get("request")
        .and_then(|r| r.get("model"))
        .and_then(Value::as_str)
        .or_else(|| x.get("response").and_then(|r| r.get("model")).and_then(Value::as_str))
}

/// A token id as ART accepts it: an integer, or `"token_id:N"`.
fn token_id(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|i| u32::try_from(i).ok()),
        Value::String(s) => s.strip_prefix("token_id:")?.parse().ok(),
        _ => None,
    }
}

fn id_list(v: Option<&Value>) -> Option<Vec<u32>> {
    let ids: Vec<u32> = v?.as_array()?.iter().map(token_id).collect::<Option<_>>()?;
    (!ids.is_empty()).then_some(ids)
}

/// Start and end time in nanoseconds since the epoch (ART sorts by both); a missing or
/// unreadable time sorts last.
pub fn times(x: &Value) -> (i128, i128) {
    let t = |k: &str| {
        x.get(k)
            .and_then(Value::as_str)
            .and_then(|s| time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok())
            .map_or(i128::MAX, |d| d.unix_timestamp_nanos())
    };
    (t("start_time"), t("end_time"))
}

/// Exchange kinds tandem trains on.
const TRAINED_KINDS: [&str; 4] = ["chat_completions", "completions", "messages", "responses"];

/// One sampled generation: the full prompt's ids, the sampled ids and their logprobs, and where
/// it is (for errors).
struct Generation {
    prompt: Vec<u32>,
    output: Vec<u32>,
    logprobs: Option<Vec<f64>>,
    at: String,
}

/// `compact_logprobs` (or `art_completion_logprobs`): one per sampled token, when present.
fn compact_logprobs(choice: &Value) -> Option<Option<Vec<f64>>> {
    match choice.get("compact_logprobs").or_else(|| choice.get("art_completion_logprobs"))? {
        Value::Array(xs) => Some(Some(xs.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect())),
        _ => Some(None),
    }
}

fn prompt_ids(response: &Value, choice: &Value, here: &str) -> Result<Vec<u32>, String> {
    id_list(choice.get("prompt_token_ids"))
        .or_else(|| id_list(response.get("prompt_token_ids")))
        .ok_or_else(|| format!("{here}: the response has no prompt_token_ids (request return_token_ids)"))
}

fn check_lengths(g: &Generation) -> Result<(), String> {
    match &g.logprobs {
        Some(l) if l.len() != g.output.len() => {
            Err(format!("{}: the choice has {} logprobs for {} token ids", g.at, l.len(), g.output.len()))
        }
        _ => Ok(()),
    }
}

/// The exact tokens of one chat-completions choice: ids on the choice, else on the response;
/// output ids from `token_ids`, else from `token_id:N` logprob entries; logprobs from
/// `compact_logprobs` / `art_completion_logprobs`, else from the logprob entries.
fn chat_generation(response: &Value, choice: &Value, here: &str) -> Result<Generation, String> {
    let prompt = prompt_ids(response, choice, here)?;
    let entries: Vec<&Value> = ["content", "refusal"]
        .iter()
        .filter_map(|k| choice.get("logprobs").and_then(|l| l.get(*k)).and_then(Value::as_array))
        .flatten()
        .collect();
    let from_entries: Option<Vec<u32>> = if entries.is_empty() {
        None
    } else {
        entries.iter().map(|e| e.get("token_id").or_else(|| e.get("token")).and_then(token_id)).collect()
    };
    let output = match (id_list(choice.get("token_ids")), from_entries) {
        (Some(ids), Some(from)) if ids != from => {
            return Err(format!("{here}: the choice's token_ids disagree with its logprob tokens"))
        }
        (Some(ids), _) => ids,
        (None, Some(from)) if !from.is_empty() => from,
        _ => return Err(format!("{here}: the choice has no token_ids (request return_token_ids)")),
    };
    let logprobs: Option<Vec<f64>> = match compact_logprobs(choice) {
        Some(compact) => compact,
        None if entries.is_empty() => None,
        None => Some(entries.iter().map(|e| e.get("logprob").and_then(Value::as_f64).unwrap_or(f64::NAN)).collect()),
    };
    let g = Generation { prompt, output, logprobs, at: here.to_string() };
    check_lengths(&g)?;
    Ok(g)
}

/// The exact tokens of one completions choice: prompt ids on the choice, else on the response;
/// output ids from `token_ids`, else from `logprobs.tokens` written as `token_id:N` (both present
/// and different is an error); logprobs from `compact_logprobs`, else `logprobs.token_logprobs`.
/// With `echo` (the request's) the legacy lists begin with the prompt's tokens, which are skipped.
fn completion_generation(response: &Value, choice: &Value, echo: bool, here: &str) -> Result<Generation, String> {
    let prompt = prompt_ids(response, choice, here)?;
    let skip = if echo { prompt.len() } else { 0 };
    let legacy = choice.get("logprobs").filter(|l| l.is_object());
    let list = |k: &str| -> Vec<Value> {
        let all = legacy.and_then(|l| l.get(k)).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        all.get(skip..).unwrap_or_default().to_vec()
    };
    let (tokens, token_lps) = (list("tokens"), list("token_logprobs"));
    let from_tokens: Option<Vec<u32>> = if tokens.is_empty() { None } else { tokens.iter().map(token_id).collect() };
    let output = match (id_list(choice.get("token_ids")), from_tokens) {
        (Some(ids), Some(from)) if ids != from => {
            return Err(format!("{here}: the choice's token_ids disagree with its logprob tokens"))
        }
        (Some(ids), _) => ids,
        (None, Some(from)) => from,
        (None, None) => return Err(format!("{here}: the choice has no token_ids (request return_token_ids)")),
    };
    let logprobs = match compact_logprobs(choice) {
        Some(compact) => compact,
        None if token_lps.is_empty() => None,
        None => Some(token_lps.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect()),
    };
    let g = Generation { prompt, output, logprobs, at: here.to_string() };
    check_lengths(&g)?;
    Ok(g)
}

/// The exact tokens of an Anthropic message (vLLM's extras on the message itself):
/// `prompt_token_ids`, `token_ids`, and `compact_logprobs` or a `logprobs` list of numbers.
fn messages_generation(response: &Value, here: &str) -> Result<Generation, String> {
    let prompt = id_list(response.get("prompt_token_ids"))
        .ok_or_else(|| format!("{here}: the message has no prompt_token_ids (request return_token_ids)"))?;
    let output = id_list(response.get("token_ids"))
        .ok_or_else(|| format!("{here}: the message has no token_ids (request return_token_ids)"))?;
    let logprobs = match compact_logprobs(response) {
        Some(compact) => compact,
        None => response
            .get("logprobs")
            .and_then(Value::as_array)
            .map(|xs| xs.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect()),
    };
    let g = Generation { prompt, output, logprobs, at: here.to_string() };
    check_lengths(&g)?;
    Ok(g)
}

/// The exact tokens of a Responses response: its `token_generations` (what tandem writes with
/// `return_token_ids`, and what ART reads), each `{prompt_token_ids, token_ids,
/// compact_logprobs?}` or `{prompt_token_ids, output_tokens: [{token_id | token, logprob}]}`.
fn responses_generations(response: &Value, here: &str) -> Result<Vec<Generation>, String> {
    let gens = response
        .get("token_generations")
        .and_then(Value::as_array)
        .filter(|g| !g.is_empty())
        .ok_or_else(|| format!("{here}: the response has no token_generations (request return_token_ids)"))?;
    gens.iter()
        .enumerate()
        .map(|(i, g)| {
            let at = format!("{here}.token_generations[{i}]");
            let prompt = id_list(g.get("prompt_token_ids")).ok_or_else(|| format!("{at}: no prompt_token_ids"))?;
            let tokens = g.get("output_tokens").and_then(Value::as_array);
            let output = match id_list(g.get("token_ids")) {
                Some(ids) => ids,
                None => tokens
                    .and_then(|t| {
                        t.iter().map(|e| e.get("token_id").or_else(|| e.get("token")).and_then(token_id)).collect()
                    })
                    .filter(|ids: &Vec<u32>| !ids.is_empty())
                    .ok_or_else(|| format!("{at}: no token_ids"))?,
            };
            let logprobs = match compact_logprobs(g) {
                Some(compact) => compact,
                None => tokens
                    .map(|t| t.iter().map(|e| e.get("logprob").and_then(Value::as_f64).unwrap_or(f64::NAN)).collect()),
            };
            let g = Generation { prompt, output, logprobs, at };
            check_lengths(&g)?;
            Ok(g)
        })
        .collect()
}

/// A trajectory's `exchanges`, tokenized (see the module docs). `allow_without_logprobs`: a
/// generation without logprobs trains with unknown old logprobs (ratio 1) instead of failing.
pub fn tokenize_exchanges(
    exchanges: &Value,
    model: &TrainedModel,
    allow_without_logprobs: bool,
    at: &str,
) -> Result<Vec<Sequence>, String> {
    let mut calls: Vec<(&str, usize, &Value)> = Vec::new();
    for kind in KINDS {
        for (k, x) in exchanges.get(kind).and_then(Value::as_array).into_iter().flatten().enumerate() {
            if exchange_model(x).is_some_and(|m| model.matches(m)) {
                calls.push((kind, k, x));
            }
        }
    }
    if calls.is_empty() {
        return Err(format!(
            "{at}.exchanges: no exchange calls the trained model wandb-artifact:///{}/{}/{}",
            model.entity, model.project, model.name
        ));
    }
    if let Some((kind, k, _)) = calls.iter().find(|(kind, _, _)| !TRAINED_KINDS.contains(kind)) {
        return Err(format!(
            "{at}.exchanges.{kind}[{k}]: tandem trains on chat_completions, completions, responses and messages exchanges only"
        ));
    }
    calls.sort_by_key(|(_, k, x)| (times(x), *k));

    let mut seqs: Vec<Sequence> = Vec::new();
    for (kind, k, x) in calls {
        let here = format!("{at}.exchanges.{kind}[{k}]");
        let response = x.get("response").unwrap_or(&Value::Null);
        let mut choices: Vec<&Value> =
            response.get("choices").and_then(Value::as_array).into_iter().flatten().collect();
        if choices.is_empty() && kind != "messages" && kind != "responses" {
            return Err(format!("{here}: the response has no choices"));
        }
        choices.sort_by_key(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0));
        if kind == "messages" {
            // An Anthropic message is its own (one) choice.
            extend(&mut seqs, &[messages_generation(response, &format!("{here}.response"))?], allow_without_logprobs)?;
            continue;
        }
        if kind == "responses" {
            for g in responses_generations(response, &format!("{here}.response"))? {
                extend(&mut seqs, std::slice::from_ref(&g), allow_without_logprobs)?;
            }
            continue;
        }
        let echo = x.get("request").and_then(|r| r.get("echo")).and_then(Value::as_bool).unwrap_or(false);
        let gens = choices
            .iter()
            .enumerate()
            .map(|(c, choice)| {
                let at = format!("{here}.response.choices[{c}]");
                match kind {
                    "completions" => completion_generation(response, choice, echo, &at),
                    _ => chat_generation(response, choice, &at),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Choices of one prompt are adjacent (a completions call numbers them prompt by prompt).
        for group in gens.chunk_by(|a, b| a.prompt == b.prompt) {
            extend(&mut seqs, group, allow_without_logprobs)?;
        }
    }
    train_each_prefix_once(&mut seqs);
    Ok(seqs)
}

/// Adds the choices of one prompt: the first extends the longest sequence the prompt continues
/// (or starts one); further choices branch from that sequence.
fn extend(seqs: &mut Vec<Sequence>, gens: &[Generation], allow_without_logprobs: bool) -> Result<(), String> {
    let parent = seqs
        .iter()
        .enumerate()
        .filter(|(_, s)| gens[0].prompt.starts_with(&s.tokens))
        .max_by_key(|(_, s)| s.tokens.len())
        .map(|(i, _)| i);
    let base = parent.map(|i| seqs[i].clone());
    for (c, g) in gens.iter().enumerate() {
        if g.logprobs.is_none() && !allow_without_logprobs {
            return Err(format!(
                "{}: the choice has no logprobs (request logprobs, or set allow_training_without_logprobs)",
                g.at
            ));
        }
        let mut seq = base.clone().unwrap_or_default();
        seq.push(&g.prompt[seq.tokens.len()..], false, None);
        seq.push(&g.output, true, g.logprobs.as_deref());
        match (c, parent) {
            // The first choice consumes its parent; further choices branch from it.
            (0, Some(i)) => seqs[i] = seq,
            _ => seqs.push(seq),
        }
    }
    Ok(())
}

/// Unmarks trained positions whose whole token prefix was already trained in an earlier
/// sequence (branches of one parent share its tokens; each is trained once).
fn train_each_prefix_once(seqs: &mut [Sequence]) {
    let mut seen: HashSet<(u64, u64, usize)> = HashSet::new();
    for s in seqs {
        let (mut h1, mut h2) = (0xcbf2_9ce4_8422_2325u64, 0x9e37_79b9_7f4a_7c15u64);
        for i in 0..s.tokens.len() {
            let t = u64::from(s.tokens[i]);
            // Two independent rolling hashes of the prefix, plus its length: a collision would
            // need both to collide at the same length.
            h1 = (h1 ^ t).wrapping_mul(0x0000_0100_0000_01b3);
            h2 = h2.wrapping_mul(0xff51_afd7_ed55_8ccd).wrapping_add(t + 1).rotate_left(29);
            if s.trained[i] && !seen.insert((h1, h2, i)) {
                s.trained[i] = false;
                s.old_lp[i] = f64::NAN;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MODEL: TrainedModel = TrainedModel { entity: "e", project: "p", name: "m" };

    fn call(start: &str, model: &str, choices: Value, prompt: &[u32]) -> Value {
        json!({"start_time": start, "end_time": start, "model": model,
               "request": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
               "response": {"model": model, "choices": choices, "prompt_token_ids": prompt}})
    }

    fn chat_choice(index: u32, ids: &[u32], lps: &[f64]) -> Value {
        let content: Vec<Value> =
            ids.iter().zip(lps).map(|(i, l)| json!({"token": format!("token_id:{i}"), "logprob": l})).collect();
        json!({"index": index, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"},
               "token_ids": ids, "logprobs": {"content": content}})
    }

    #[test]
    fn turns_in_time_order_extend_one_sequence_and_judges_are_ignored() {
        let m = "wandb-artifact:///e/p/m:step2";
        let x = json!({"chat_completions": [
            // Listed first, called second (completion order is not call order).
            call("2026-01-01T00:00:01.5Z", m, json!([chat_choice(0, &[7], &[-0.3])]), &[1, 2, 3, 4, 5, 6]),
            call("2026-01-01T00:00:01Z", m, json!([chat_choice(0, &[3, 4], &[-0.1, -0.2])]), &[1, 2]),
            call("2026-01-01T00:00:00Z", "gpt-judge", json!([chat_choice(0, &[9], &[-1.0])]), &[9]),
        ]});
        let seqs = tokenize_exchanges(&x, &MODEL, false, "t").unwrap();
        assert_eq!(seqs.len(), 1);
        assert_eq!(seqs[0].tokens, vec![1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(seqs[0].trained, vec![false, false, true, true, false, false, true]);
        assert_eq!(seqs[0].old_lp[6], -0.3);
    }

    #[test]
    fn n_choices_branch_and_shared_tokens_train_once() {
        let m = "e/p/m";
        let x = json!({"chat_completions": [
            call("2026-01-01T00:00:00Z", m, json!([chat_choice(0, &[3], &[-0.1])]), &[1, 2]),
            // Continues [1, 2, 3] with two choices: two branches sharing the trained 3.
            call("2026-01-01T00:00:01Z", m,
                 json!([chat_choice(1, &[6], &[-0.6]), chat_choice(0, &[5], &[-0.5])]), &[1, 2, 3, 4]),
        ]});
        let seqs = tokenize_exchanges(&x, &MODEL, false, "t").unwrap();
        assert_eq!(seqs.len(), 2);
        assert_eq!(seqs[0].tokens, vec![1, 2, 3, 4, 5]);
        assert_eq!(seqs[0].trained, vec![false, false, true, false, true]);
        assert_eq!(seqs[1].tokens, vec![1, 2, 3, 4, 6]);
        assert_eq!(seqs[1].trained, vec![false, false, false, false, true]);
        assert!(seqs[1].old_lp[2].is_nan());
    }

    #[test]
    fn what_cannot_be_trained_is_named() {
        let m = "e/p/m";
        let none = json!({"chat_completions": [call("2026-01-01T00:00:00Z", "other", json!([chat_choice(0, &[3], &[-0.1])]), &[1])]});
        assert!(tokenize_exchanges(&none, &MODEL, false, "t")
            .unwrap_err()
            .contains("no exchange calls the trained model"));
        let responses = json!({"responses": [call("2026-01-01T00:00:00Z", m, json!([]), &[1])]});
        let e = tokenize_exchanges(&responses, &MODEL, false, "t").unwrap_err();
        assert!(e.contains("t.exchanges.responses[0].response: the response has no token_generations"), "{e}");
        let mut no_ids = chat_choice(0, &[3], &[-0.1]);
        no_ids.as_object_mut().unwrap().remove("token_ids");
        no_ids["logprobs"]["content"][0]["token"] = json!("hello");
        let x = json!({"chat_completions": [call("2026-01-01T00:00:00Z", m, json!([no_ids]), &[1])]});
        let e = tokenize_exchanges(&x, &MODEL, false, "t").unwrap_err();
        assert!(e.contains("choices[0]: the choice has no token_ids"), "{e}");
        let mut no_lps = chat_choice(0, &[3], &[-0.1]);
        no_lps["logprobs"] = Value::Null;
        let x = json!({"chat_completions": [call("2026-01-01T00:00:00Z", m, json!([no_lps]), &[1])]});
        assert!(tokenize_exchanges(&x, &MODEL, false, "t").unwrap_err().contains("no logprobs"));
        let seqs = tokenize_exchanges(&x, &MODEL, true, "t").unwrap();
        assert!(seqs[0].trained[1] && seqs[0].old_lp[1].is_nan());
        let mut other = chat_choice(0, &[3], &[-0.1]);
        other["logprobs"]["content"][0]["token"] = json!("token_id:4");
        let x = json!({"chat_completions": [call("2026-01-01T00:00:00Z", m, json!([other]), &[1])]});
        assert!(tokenize_exchanges(&x, &MODEL, false, "t").unwrap_err().contains("disagree"));
    }

    #[test]
    fn compact_logprobs_and_string_ids() {
        let choice = json!({"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop",
                            "token_ids": ["token_id:3", 4], "compact_logprobs": [-0.1, -0.2],
                            "prompt_token_ids": [1, "token_id:2"]});
        let x = json!({"chat_completions": [{"start_time": "2026-01-01T00:00:00Z", "end_time": "2026-01-01T00:00:00Z",
                        "request": {"model": "e/p/m"}, "response": {"choices": [choice]}}]});
        let seqs = tokenize_exchanges(&x, &MODEL, false, "t").unwrap();
        assert_eq!(seqs[0].tokens, vec![1, 2, 3, 4]);
        assert_eq!(seqs[0].old_lp[2..], [-0.1, -0.2]);
    }

    fn completion_choice(index: u32, prompt: &[u32], ids: &[u32], lps: &[f64]) -> Value {
        json!({"index": index, "text": "x", "finish_reason": "length", "prompt_token_ids": prompt, "token_ids": ids,
               "logprobs": {"tokens": ids.iter().map(|i| format!("token_id:{i}")).collect::<Vec<_>>(),
                            "token_logprobs": lps, "top_logprobs": [], "text_offset": []}})
    }

    fn completions_call(start: &str, choices: Value) -> Value {
        json!({"start_time": start, "end_time": start,
               "request": {"model": "e/p/m", "prompt": "p"}, "response": {"model": "e/p/m", "choices": choices}})
    }

    #[test]
    fn completions_calls_extend_like_chat_and_each_prompt_branches_on_its_own() {
        let x = json!({"completions": [
            completions_call("2026-01-01T00:00:00Z", json!([completion_choice(0, &[1, 2], &[3], &[-0.1])])),
            // Two prompts, n = 1: [1, 2, 3, 4] continues the first call's sequence; [8] starts one.
            completions_call("2026-01-01T00:00:01Z", json!([
                completion_choice(0, &[1, 2, 3, 4], &[5, 6], &[-0.5, -0.6]),
                completion_choice(1, &[8], &[9], &[-0.9]),
            ])),
        ]});
        let seqs = tokenize_exchanges(&x, &MODEL, false, "t").unwrap();
        assert_eq!(seqs.len(), 2);
        assert_eq!(seqs[0].tokens, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(seqs[0].trained, vec![false, false, true, false, true, true]);
        assert_eq!(seqs[0].old_lp[4..], [-0.5, -0.6]);
        assert_eq!((seqs[1].tokens.clone(), seqs[1].old_lp[1]), (vec![8, 9], -0.9));
        // Chat and completions calls of one rollout join the same sequences.
        let mixed = json!({
            "completions": [completions_call("2026-01-01T00:00:00Z", json!([completion_choice(0, &[1], &[2], &[-0.2])]))],
            "chat_completions": [call("2026-01-01T00:00:01Z", "e/p/m", json!([chat_choice(0, &[4], &[-0.4])]), &[1, 2, 3])],
        });
        let seqs = tokenize_exchanges(&mixed, &MODEL, false, "t").unwrap();
        assert_eq!((seqs.len(), seqs[0].tokens.clone()), (1, vec![1, 2, 3, 4]));
    }

    #[test]
    fn echoed_completions_keep_only_the_sampled_tail() {
        // echo: the legacy lists start with the prompt (its first logprob null).
        let choice = json!({"index": 0, "text": "abx", "prompt_token_ids": [1, 2],
            "logprobs": {"tokens": ["token_id:1", "token_id:2", "token_id:7"], "token_logprobs": [null, -1.0, -0.7]}});
        let mut call = completions_call("2026-01-01T00:00:00Z", json!([choice.clone()]));
        call["request"]["echo"] = json!(true);
        let seqs = tokenize_exchanges(&json!({"completions": [call]}), &MODEL, false, "t").unwrap();
        assert_eq!(seqs[0].tokens, vec![1, 2, 7]);
        assert_eq!(seqs[0].trained, vec![false, false, true]);
        assert_eq!(seqs[0].old_lp[2], -0.7);
        // Without the request's echo the lists are all output: their lengths disagree with
        // nothing, so all three tokens are sampled ones (a guess would have trained one).
        let x = json!({"completions": [completions_call("2026-01-01T00:00:00Z", json!([choice]))]});
        let seqs = tokenize_exchanges(&x, &MODEL, true, "t").unwrap();
        assert_eq!(seqs[0].tokens, vec![1, 2, 1, 2, 7]);
        // token_ids that disagree with the logprob tokens.
        let odd = json!({"index": 0, "text": "x", "prompt_token_ids": [1], "token_ids": [4],
            "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.1]}});
        let x = json!({"completions": [completions_call("2026-01-01T00:00:00Z", json!([odd]))]});
        assert!(tokenize_exchanges(&x, &MODEL, false, "t").unwrap_err().contains("disagree"));
        // Without prompt ids there is nothing exact to train on.
        let bare = json!({"index": 0, "text": "x", "token_ids": [3], "logprobs": {"tokens": ["token_id:3"], "token_logprobs": [-0.1]}});
        let x = json!({"completions": [completions_call("2026-01-01T00:00:00Z", json!([bare]))]});
        let e = tokenize_exchanges(&x, &MODEL, false, "t").unwrap_err();
        assert!(e.contains("completions[0].response.choices[0]: the response has no prompt_token_ids"), "{e}");
    }

    #[test]
    fn anthropic_messages_train_from_their_own_ids() {
        let msg = |start: &str, prompt: &[u32], ids: &[u32], lps: &[f64]| {
            json!({"start_time": start, "end_time": start, "request": {"model": "e/p/m", "max_tokens": 5},
                   "response": {"type": "message", "model": "e/p/m", "content": [{"type": "text", "text": "x"}],
                                "prompt_token_ids": prompt, "token_ids": ids, "logprobs": lps}})
        };
        let x = json!({"messages": [msg("2026-01-01T00:00:00Z", &[1], &[2, 3], &[-0.2, -0.3]),
                                    msg("2026-01-01T00:00:01Z", &[1, 2, 3, 4], &[5], &[-0.5])]});
        let seqs = tokenize_exchanges(&x, &MODEL, false, "t").unwrap();
        assert_eq!(seqs.len(), 1);
        assert_eq!(seqs[0].tokens, vec![1, 2, 3, 4, 5]);
        assert_eq!(seqs[0].trained, vec![false, true, true, false, true]);
        assert_eq!(seqs[0].old_lp[4], -0.5);
        let bare = json!({"messages": [{"start_time": "2026-01-01T00:00:00Z", "end_time": "2026-01-01T00:00:00Z",
                           "request": {"model": "e/p/m"}, "response": {"type": "message", "content": []}}]});
        let e = tokenize_exchanges(&bare, &MODEL, false, "t").unwrap_err();
        assert!(e.contains("messages[0].response: the message has no prompt_token_ids"), "{e}");
    }

    #[test]
    fn responses_train_from_their_token_generations() {
        let resp = |start: &str, g: Value| {
            json!({"start_time": start, "end_time": start, "request": {"model": "e/p/m", "input": "x"},
                   "response": {"object": "response", "model": "e/p/m", "output": [], "token_generations": [g]}})
        };
        let x = json!({"responses": [
            resp("2026-01-01T00:00:00Z", json!({"prompt_token_ids": [1], "token_ids": [2], "compact_logprobs": [-0.2], "output_indices": [0]})),
            resp("2026-01-01T00:00:01Z", json!({"prompt_token_ids": [1, 2, 3], "output_indices": [0],
                "output_tokens": [{"token": "token_id:4", "logprob": -0.4}, {"token_id": 5, "logprob": -0.5}]})),
        ]});
        let seqs = tokenize_exchanges(&x, &MODEL, false, "t").unwrap();
        assert_eq!(seqs.len(), 1);
        assert_eq!(seqs[0].tokens, vec![1, 2, 3, 4, 5]);
        assert_eq!(seqs[0].trained, vec![false, true, false, true, true]);
        assert_eq!(seqs[0].old_lp[3..], [-0.4, -0.5]);
    }
}
