//! Tinker sampling: sampling sessions (a base model, or sampler weights saved by name) and
//! `asample`, run through the same engine, scheduler, fair shares and limits as
//! `/v1/completions` (the request is one, built from the Tinker call), and answered as the
//! SDK's protobuf `SampleResponse`.

use super::pb;
use super::routes::{bad, new_future, submitted_samples, tinker_error, Result, TinkerJson};
use super::scores::{self, Targets, TensorJson};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorKind};
use crate::openai::completions::Extras;
use crate::AppState;
use axum::extract::{Path, State};
use axum::{Extension, Json};
use prost::Message;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::{Arc, RwLock};
use tandem_core::inference::{FinishReason, InferEvent, PromptScoring, RankedLogprob};
use tandem_core::tinker::{RunId, SavedSampler};
use tandem_tinker::registry::Outcome;

/// A sampling session: whose it is and the model string it samples (as `/v1/completions`
/// takes it).
pub struct Sampler {
    pub entity: String,
    pub model: String,
    pub base_model: String,
    pub model_path: Option<String>,
    /// An inflight sampler's target (`kind: "inflight"`): shared by the training model's
    /// inflight samplers and moved to the newest weights by each later inflight save.
    pub follows: Option<Arc<RwLock<String>>>,
    /// Sampler weights another entity published: (owner, run, checkpoint), checked at each
    /// sample (unpublished, they are a 404 again).
    pub published: Option<(String, String, String)>,
    /// The save it samples: checked live at each sample, so that a deleted checkpoint whose
    /// step number a later save reuses is never served under this sampler (issue 50: another
    /// entity's sampler of a published `pub` had returned the private `secret`'s logprobs).
    pub saved: Option<SavedSampler>,
}

impl tandem_tinker::registry::Owned for Sampler {
    fn entity(&self) -> &str {
        &self.entity
    }
}

impl Sampler {
    /// A sampler of the sampler weights saved as checkpoint `step` of model `model_id`'s
    /// tandem record (`{entity}/tinker/{session}-train-{n}`), known to Tinker as `path`.
    pub fn of_checkpoint(entity: &str, model_id: &str, saved: &SavedSampler, path: String) -> Self {
        // Catalog keys name runs by their ids; anything else names its record itself.
        let record = RunId::parse(model_id).map_or_else(|| model_id.to_string(), |r| r.record_name());
        Sampler {
            entity: entity.to_string(),
            model: format!("{entity}/tinker/{record}:step{}", saved.step),
            base_model: saved.base_model.clone(),
            model_path: Some(path),
            follows: None,
            published: None,
            saved: Some(saved.clone()),
        }
    }

    /// The model address it samples now: its checkpoint, or an inflight target's newest.
    pub fn current(&self) -> String {
        match &self.follows {
            Some(target) => target.read().unwrap_or_else(|e| e.into_inner()).clone(),
            None => self.model.clone(),
        }
    }
}

#[derive(Deserialize)]
pub struct CreateSampler {
    session_id: String,
    sampling_session_seq_id: i64,
    #[serde(default)]
    base_model: Option<String>,
    #[serde(default)]
    model_path: Option<String>,
}

/// `create_sampling_session`: a base model, or `tinker://{model_id}/sampler_weights/{name}`.
#[utoipa::path(
    post,
    operation_id = "tinker_create_sampling_session",
    path = "/create_sampling_session",
    tag = "tinker",
    summary = "A sampling session of a base model or of sampler weights",
    request_body = crate::openapi::tinker::TinkerCreateSampler,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(body): TinkerJson<CreateSampler>,
) -> Result<Json<Value>> {
    let t = state.tinker().clone();
    if !t.touch_session(&caller.entity, &body.session_id) {
        return Err(ApiError::not_found("session").into());
    }
    let sampler = match (&body.model_path, &body.base_model) {
        (Some(path), _) => {
            let (model_id, name) =
                path.strip_prefix("tinker://").and_then(|r| r.split_once("/sampler_weights/")).ok_or_else(|| {
                    bad(format!("model_path {path:?}: expected tinker://<model_id>/sampler_weights/<name>"))
                })?;
            // This session's saves, or named ones of an earlier session (they outlive their run),
            // while their checkpoint is still the one they saved; or another entity's published.
            let (owner, saved) = super::samplers::readable(&state, &caller.entity, model_id, name)
                .await?
                .ok_or_else(|| ApiError::not_found("sampler weights"))?;
            let mut sampler = Sampler::of_checkpoint(&owner, model_id, &saved, path.clone());
            if owner != caller.entity {
                sampler.entity = caller.entity.clone();
                sampler.published = Some((owner, model_id.to_string(), format!("sampler_weights/{name}")));
            }
            sampler
        }
        (None, Some(base)) => {
            if state.model(base).is_none() {
                return Err(bad(format!("base_model {base:?} is not served here")).into());
            }
            Sampler {
                entity: caller.entity.clone(),
                model: base.clone(),
                base_model: base.clone(),
                model_path: None,
                follows: None,
                published: None,
                saved: None,
            }
        }
        (None, None) => return Err(bad("base_model or model_path is required").into()),
    };
    let id = format!("{}:sample:{}", body.session_id, body.sampling_session_seq_id);
    t.add_sampler(id.clone(), sampler).map_err(tinker_error)?;
    Ok(Json(json!({ "sampling_session_id": id, "type": "create_sampling_session" })))
}

/// `GET samplers/{id}`.
#[utoipa::path(
    get,
    operation_id = "tinker_get_sampler",
    path = "/samplers/{id}",
    tag = "tinker",
    summary = "A sampling session's base model and weights",
    params(("id" = String, Path, description = "The sampling session id")),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let s = state.tinker().sampler(&caller.entity, &id).ok_or_else(|| ApiError::not_found("sampler"))?;
    Ok(Json(json!({ "sampler_id": id, "base_model": s.base_model, "model_path": s.model_path })))
}

#[derive(Deserialize)]
pub struct Sample {
    sampling_session_id: String,
    #[serde(default = "one")]
    num_samples: usize,
    prompt: PromptBody,
    #[serde(default)]
    sampling_params: Params,
    #[serde(default)]
    prompt_logprobs: bool,
    /// Only the last N prompt positions' logprobs (the rest NaN, which the SDK checks; the
    /// top-k rows likewise).
    #[serde(default)]
    prompt_logprobs_last_n: Option<i64>,
    #[serde(default)]
    topk_prompt_logprobs: i64,
    #[serde(default)]
    topk_sample_logprobs: i64,
    #[serde(default)]
    prompt_alt_tokens_k: i64,
    #[serde(default)]
    target_prompt_logprobs: Option<TensorJson>,
}

/// What a sample asked for besides the sampled tokens, checked, as the response needs it.
#[derive(Default, Debug)]
struct Asked {
    prompt_logprobs: bool,
    last_n: Option<usize>,
    topk_prompt: usize,
    topk_sample: usize,
    targets: Option<Targets>,
    alt_k: usize,
}

/// Largest top-k width (vLLM's `max_logprobs`, as `/v1/completions` bounds it).
const MAX_TOPK: i64 = crate::openai::request::MAX_LOGPROBS;

fn one() -> usize {
    1
}

#[derive(Deserialize)]
struct PromptBody {
    chunks: Vec<Value>,
}

#[derive(Deserialize, Default)]
struct Params {
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    stop: Option<Value>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    top_p: Option<f64>,
}

/// The Tinker call as a `/v1/completions` body: the sampled tokens' logprobs always (RL needs
/// them), `stop: null` stopping at the end of sequence and `[]` never early.
fn completions_body(model: &str, s: &Sample) -> std::result::Result<(Value, Asked), String> {
    for (name, k) in
        [("topk_prompt_logprobs", s.topk_prompt_logprobs), ("topk_sample_logprobs", s.topk_sample_logprobs)]
    {
        if !(0..=MAX_TOPK).contains(&k) {
            return Err(format!("{name} {k}: expected 0 to {MAX_TOPK}"));
        }
    }
    if s.prompt_alt_tokens_k < 0 {
        return Err(format!("prompt_alt_tokens_k {}: expected 0 or more", s.prompt_alt_tokens_k));
    }
    if let Some(n) = s.prompt_logprobs_last_n.filter(|n| *n < 0) {
        return Err(format!("prompt_logprobs_last_n {n}: expected a count of positions, 0 or more"));
    }
    let mut tokens = Vec::new();
    for c in &s.prompt.chunks {
        if c["type"] != "encoded_text" {
            return Err(format!("prompt chunks of type {} are not served: only encoded_text", c["type"]));
        }
        let ids = c["tokens"].as_array().ok_or("an encoded_text chunk without tokens")?;
        for id in ids {
            tokens.push(id.as_u64().filter(|i| *i <= u32::MAX as u64).ok_or(format!("token id {id} is not valid"))?);
        }
    }
    let p = &s.sampling_params;
    let mut body = json!({
        "model": model, "prompt": tokens, "n": s.num_samples, "logprobs": 0,
        "temperature": p.temperature.unwrap_or(1.0), "top_p": p.top_p.unwrap_or(1.0),
        "skip_special_tokens": false,
    });
    if let Some(m) = p.max_tokens {
        body["max_tokens"] = json!(m);
    }
    if let Some(seed) = p.seed {
        body["seed"] = json!(seed);
    }
    if let Some(k) = p.top_k.filter(|k| *k > 0) {
        body["top_k"] = json!(k);
    }
    let targets = match &s.target_prompt_logprobs {
        Some(t) => Some(Targets::read(t, tokens.len())?),
        None => None,
    };
    let asked = Asked {
        prompt_logprobs: s.prompt_logprobs,
        last_n: s.prompt_logprobs_last_n.map(|n| n as usize),
        topk_prompt: s.topk_prompt_logprobs as usize,
        topk_sample: s.topk_sample_logprobs as usize,
        targets,
        alt_k: s.prompt_alt_tokens_k as usize,
    };
    if asked.prompt_logprobs || asked.topk_prompt > 0 {
        body["prompt_logprobs"] = json!(asked.topk_prompt);
    }
    match &p.stop {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) => body["stop"] = json!([t]),
        Some(Value::Array(a)) if a.is_empty() => body["ignore_eos"] = json!(true),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => body["stop"] = json!(a),
        Some(Value::Array(a)) if a.iter().all(Value::is_u64) => body["stop_token_ids"] = json!(a),
        Some(other) => return Err(format!("sampling_params.stop {other}: expected strings or token ids")),
    }
    Ok((body, asked))
}

/// The engine-side part of what was asked: a sampled token's top k need k + 1 candidates
/// (the engine lists the sampled token first), and the further prompt scores.
fn extras(asked: &Asked, temperature: f32) -> Extras {
    let scoring = (asked.targets.is_some() || asked.alt_k > 0).then(|| {
        let targets = asked.targets.as_ref().map_or_else(Vec::new, |t| t.ids.clone());
        Box::new(PromptScoring { targets, alt_k: asked.alt_k, temperature })
    });
    Extras {
        sampled_top: (asked.topk_sample > 0).then_some(asked.topk_sample + 1),
        prompt_scoring: scoring,
        owner: None,
    }
}

/// A sampled position's top-k candidates (token, logprob); `None` where the engine gave none.
type TopK = Vec<(u32, f32)>;

/// The engine's events as the SDK's `SampleResponse`: each sample's tokens (the stop token or
/// the tokens completing a stop string included) and their logprobs, and what else was asked
/// (see [`Asked`]): the prompt's logprobs (NaN at position 0, and before the last `last_n`
/// positions when given), top-k rows, target logprobs, alternative tokens.
fn response(n: usize, events: &[InferEvent], asked: &Asked) -> pb::SampleResponse {
    let mut seqs = vec![pb::SampledSequence::default(); n];
    let mut lps: Vec<Vec<u8>> = vec![Vec::new(); n];
    let mut tops: Vec<Vec<Option<TopK>>> = vec![Vec::new(); n];
    let mut out = pb::SampleResponse::default();
    for ev in events {
        match ev {
            InferEvent::Token { choice, token_id, logprob, .. } if *choice < n => {
                seqs[*choice].tokens.extend_from_slice(&(*token_id as i32).to_le_bytes());
                let lp = logprob.as_ref().map_or(f32::NAN, |l| l.token.logprob);
                lps[*choice].extend_from_slice(&lp.to_le_bytes());
                tops[*choice].push(logprob.as_ref().map(|l| scores::top(&l.top)));
            }
            InferEvent::Finished { choice, reason, .. } if *choice < n => {
                let length = matches!(reason, FinishReason::Length);
                seqs[*choice].stop_reason = if length { pb::StopReason::Length } else { pb::StopReason::Stop } as i32;
            }
            InferEvent::PromptLogprobs(p) => {
                let first = asked.last_n.map_or(0, |k| p.len().saturating_sub(k));
                // Positions before the last `last_n` are not reported (borrowed, not copied).
                let rows: Vec<Option<&[RankedLogprob]>> =
                    p.iter().enumerate().map(|(i, r)| r.as_deref().filter(|_| i >= first)).collect();
                if asked.prompt_logprobs {
                    let lp = |r: &Option<&[RankedLogprob]>| r.and_then(|r| r.first()).map_or(f32::NAN, |r| r.logprob);
                    out.prompt_logprobs = Some(rows.iter().flat_map(|r| lp(r).to_le_bytes()).collect());
                }
                if asked.topk_prompt > 0 {
                    let ranked: Vec<_> = rows.iter().map(|r| r.map(scores::ranked)).collect();
                    out.topk_prompt_logprobs = Some(scores::topk(&ranked, asked.topk_prompt));
                }
            }
            InferEvent::PromptScores(p) => {
                out.target_prompt_logprobs = asked.targets.as_ref().map(|t| t.answer(&p.targets));
                if asked.alt_k > 0 {
                    out.prompt_alt_tokens = Some(scores::alt_tokens(p, asked.alt_k));
                }
            }
            _ => {}
        }
    }
    for ((s, l), top) in seqs.iter_mut().zip(lps).zip(tops) {
        s.logprobs = Some(l);
        if asked.topk_sample > 0 {
            s.topk_sampled_logprobs = Some(scores::topk(&top, asked.topk_sample));
        }
    }
    out.sequences = seqs;
    out
}

/// `asample`: answered at once with a future and one sequence id per sample.
#[utoipa::path(
    post,
    operation_id = "tinker_asample",
    path = "/asample",
    tag = "tinker",
    summary = "Samples with logprobs (a future answering a protobuf `SampleResponse`)",
    request_body = crate::openapi::tinker::TinkerSample,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerSubmittedSamples),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn asample(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(body): TinkerJson<Sample>,
) -> Result<Json<Value>> {
    let t = state.tinker().clone();
    let sampler = t.sampler(&caller.entity, &body.sampling_session_id).ok_or_else(|| {
        let session = tandem_core::tinker::session_of(&body.sampling_session_id).unwrap_or_default();
        match t.session(&caller.entity, session) {
            // Taken over from a node that stopped: its sampling sessions were that node's.
            Some(true) => ApiError::new(
                crate::error::ErrorKind::NotFound,
                "sampling session not found: it was lost with the node that held its session; create a new sampling client",
            ),
            _ => ApiError::not_found("sampling session"),
        }
    })?;
    if !(1..=128).contains(&body.num_samples) {
        return Err(bad(format!("num_samples {}: expected 1 to 128", body.num_samples)).into());
    }
    let mut owner = None;
    if let Some((publisher, run, checkpoint)) = &sampler.published {
        if state.catalog().publisher(&caller.entity, run, checkpoint).await.as_ref() != Some(publisher) {
            return Err(ApiError::not_found("sampler weights").into());
        }
        owner = Some(publisher.clone());
    }
    // The very weights it was made for, or nothing (an inflight sampler follows on purpose).
    if let (Some(saved), None) = (&sampler.saved, &sampler.follows) {
        if !super::samplers::live(&state, saved).await? {
            return Err(ApiError::not_found("sampler weights").into());
        }
    }
    let (request, asked) = completions_body(&sampler.current(), &body).map_err(bad)?;
    let temperature = body.sampling_params.temperature.unwrap_or(1.0) as f32;
    // The prompt waits in memory until the engine takes it: counted as the entity's queued bytes.
    let bytes = 1024 + 24 * request["prompt"].as_array().map_or(0, Vec::len) as u64;
    let queued = t.queue_bytes(&caller.entity, bytes).map_err(tinker_error)?;
    let session = tandem_core::tinker::session_of(&body.sampling_session_id).unwrap_or("sample");
    let (request_id, promise) = new_future(&t, &caller.entity, session)?;
    let ids: Vec<String> = (0..body.num_samples).map(|i| format!("{request_id}:{i}")).collect();
    let entity = caller.entity.clone();
    let patience = t.waits.idle;
    let gate = t.sample_gate(&entity, state.limiter().limit());
    tokio::spawn(async move {
        let _queued = queued;
        let outcome = match run_queued(&state, &entity, &request, &gate, patience, || Extras {
            owner: owner.clone(),
            ..extras(&asked, temperature)
        })
        .await
        {
            Ok((n, events)) => Outcome::Proto(response(n, &events, &asked).encode_to_vec()),
            Err(e) => {
                if e.status().is_client_error() {
                    Outcome::user(e.message)
                } else {
                    Outcome::server(e.message)
                }
            }
        };
        promise.set(outcome);
    });
    Ok(submitted_samples(&request_id, &ids))
}

/// Runs a sample through the engine, waiting while the entity's concurrency limit or the
/// engine's queue is full for up to `patience`: the cookbook's evaluators send hundreds of
/// `compute_logprobs` at once, and the SDK raises a failed future without retrying it (issue 50),
/// so work past a limit waits here, its future pending, instead. Samples pass the entity's
/// `gate` in arrival order; a sample past it that admission still turns away (a 429 or 503: the
/// entity's chats hold its limit, or the engine's queue is full) tries again with backoff. The
/// entity's other requests and other entities are unaffected: each attempt is admitted by the
/// same per-entity limit and fair scheduler as any completion.
async fn run_queued(
    state: &AppState,
    entity: &str,
    request: &Value,
    gate: &tokio::sync::Semaphore,
    patience: std::time::Duration,
    extras: impl Fn() -> Extras,
) -> std::result::Result<(usize, Vec<InferEvent>), ApiError> {
    let started = std::time::Instant::now();
    let Ok(Ok(_permit)) = tokio::time::timeout(patience, gate.acquire()).await else {
        return Err(ApiError::new(
            ErrorKind::TooManyRequests,
            format!("the sample waited {} s behind this entity's others", patience.as_secs()),
        ));
    };
    let mut pause = std::time::Duration::from_millis(20);
    loop {
        match crate::openai::completions::run_to_end(state, entity, request, extras()).await {
            Err(e) if busy(&e) && started.elapsed() + pause < patience => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(500));
            }
            done => return done,
        }
    }
}

/// Whether `e` is admission's "not now" (the entity's limit or a full engine queue).
fn busy(e: &ApiError) -> bool {
    matches!(e.status().as_u16(), 429 | 503)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::inference::{RankedLogprob, StopReason, TokenLogprob, TopLogprob};

    fn token(choice: usize, id: u32, lp: f32) -> InferEvent {
        let top = TopLogprob { token_id: id, token: String::new(), bytes: vec![], logprob: lp };
        InferEvent::Token {
            choice,
            token_id: id,
            text: String::new(),
            logprob: Some(TokenLogprob { token: top, top: vec![] }),
        }
    }

    #[test]
    fn events_become_the_sdks_sample_response() {
        let ranked = |lp| Some(vec![RankedLogprob { token_id: 1, logprob: lp, rank: 1, decoded: String::new() }]);
        let events = vec![
            InferEvent::PromptLogprobs(vec![None, ranked(-1.5)]),
            token(1, 7, -0.5),
            token(0, 3, -0.25),
            InferEvent::Finished { choice: 1, reason: FinishReason::Length, stop_reason: None, text: String::new() },
            token(0, 2, -0.125),
            InferEvent::Finished {
                choice: 0,
                reason: FinishReason::Stop,
                stop_reason: Some(StopReason::Token(2)),
                text: String::new(),
            },
        ];
        let with_prompt = Asked { prompt_logprobs: true, ..Default::default() };
        let r = response(2, &events, &with_prompt);
        let ints = |b: &[u8]| b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
        let floats =
            |b: &[u8]| b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
        // The stop token is part of the sample, as Tinker returns it.
        assert_eq!(ints(&r.sequences[0].tokens), vec![3, 2]);
        assert_eq!(floats(r.sequences[0].logprobs.as_ref().unwrap()), vec![-0.25, -0.125]);
        assert_eq!(r.sequences[0].stop_reason, pb::StopReason::Stop as i32);
        assert_eq!(r.sequences[1].stop_reason, pb::StopReason::Length as i32);
        let prompt = floats(r.prompt_logprobs.as_ref().unwrap());
        assert!(prompt[0].is_nan() && prompt[1] == -1.5, "{prompt:?}");
        // prompt_logprobs_last_n: NaN before the last N positions, as the SDK checks.
        let three = vec![InferEvent::PromptLogprobs(vec![None, ranked(-1.5), ranked(-2.5)])];
        let last = floats(
            response(1, &three, &Asked { last_n: Some(1), prompt_logprobs: true, ..Default::default() })
                .prompt_logprobs
                .as_ref()
                .unwrap(),
        );
        assert!(last[0].is_nan() && last[1].is_nan() && last[2] == -2.5, "{last:?}");
        let all = floats(
            response(1, &three, &Asked { last_n: Some(5), prompt_logprobs: true, ..Default::default() })
                .prompt_logprobs
                .as_ref()
                .unwrap(),
        );
        assert!(all[0].is_nan() && all[1] == -1.5 && all[2] == -2.5, "{all:?}");
    }

    #[test]
    fn tinker_sampling_params_map_to_a_completions_body() {
        let s: Sample = serde_json::from_value(json!({
            "sampling_session_id": "s", "num_samples": 3,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}, {"type": "encoded_text", "tokens": [3]}]},
            "sampling_params": {"max_tokens": 5, "seed": 9, "stop": [13, 14], "temperature": 0.5, "top_k": -1},
            "prompt_logprobs": true,
        }))
        .unwrap();
        let b = completions_body("m", &s).unwrap().0;
        assert_eq!(b["prompt"], json!([1, 2, 3]));
        assert_eq!((b["n"].clone(), b["max_tokens"].clone(), b["seed"].clone()), (json!(3), json!(5), json!(9)));
        assert_eq!(b["stop_token_ids"], json!([13, 14]));
        assert!(b.get("top_k").is_none(), "-1 is every token");
        assert_eq!(b["prompt_logprobs"], json!(0));
        let mut never = s;
        never.sampling_params.stop = Some(json!([]));
        assert_eq!(completions_body("m", &never).unwrap().0["ignore_eos"], json!(true));
        never.prompt.chunks = vec![json!({"type": "image", "data": ""})];
        assert!(completions_body("m", &never).unwrap_err().contains("image"));
        // Out of bounds is refused with the field's name.
        let with = |extra: Value| {
            let mut v = json!({"sampling_session_id": "s", "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]}});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            completions_body("m", &serde_json::from_value::<Sample>(v).unwrap())
        };
        assert!(with(json!({"topk_sample_logprobs": 21})).unwrap_err().contains("topk_sample_logprobs 21"));
        assert!(with(json!({"topk_prompt_logprobs": -1})).unwrap_err().contains("topk_prompt_logprobs"));
        assert!(with(json!({"prompt_alt_tokens_k": -3})).unwrap_err().contains("prompt_alt_tokens_k"));
        let rows = json!({"target_prompt_logprobs": {"data": [1], "dtype": "int64", "shape": [1, 1]}});
        assert!(with(rows).unwrap_err().contains("1 rows for a prompt of 3"));
        assert!(with(json!({"prompt_logprobs_last_n": -1})).is_err());
        // Top-k prompt rows make the engine rank k candidates per position; the sampled
        // tokens' top k ask it for k + 1.
        let (b, asked) = with(json!({"topk_prompt_logprobs": 3, "topk_sample_logprobs": 2, "prompt_alt_tokens_k": 4,
            "target_prompt_logprobs": {"data": [-1, 7], "dtype": "int64", "shape": [2, 1]}}))
        .unwrap();
        assert_eq!(b["prompt_logprobs"], json!(3));
        let e = extras(&asked, 0.5);
        assert_eq!(e.sampled_top, Some(3));
        let scoring = e.prompt_scoring.unwrap();
        assert_eq!((scoring.targets.clone(), scoring.alt_k, scoring.temperature), (vec![vec![], vec![7]], 4, 0.5));
        // The SDK's defaults pass.
        let defaults = json!({"topk_prompt_logprobs": 0, "topk_sample_logprobs": 0, "prompt_alt_tokens_k": 0,
                              "target_prompt_logprobs": null, "prompt_logprobs_last_n": 2});
        assert!(with(defaults).is_ok());
    }
}
