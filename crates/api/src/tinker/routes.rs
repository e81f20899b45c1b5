//! The Tinker routes under `/api/v1/` that tandem serves: client configuration, sessions,
//! training models (`create_model`, `get_info`), `forward_backward`, `forward`, `optim_step` and
//! `retrieve_future`. Each training call answers at once with a future and runs in its
//! model's `seq_id` order on a blocking thread (docs/tinker.md).

pub(super) use super::answer::{bad, run_id, submitted, submitted_samples, tinker_error, Result, TinkerJson};
use super::order::{ordered, ordered_async, refused_in_order, Sequenced};
use super::wire;
use super::TinkerState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use prost::Message;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tandem_core::tinker::{AdamSettings, RunId, TinkerTrainer};
use tandem_tinker::registry::{ModelEntry, Outcome, Pending, Promise};

/// How long `retrieve_future` holds a pending request before `try_again` (the SDK re-polls at
/// once, and its own timeout is 45 s).
const HOLD: Duration = Duration::from_secs(20);

pub(super) fn trainer(state: &AppState) -> Result<Arc<dyn TinkerTrainer>> {
    state.tinker_trainer().ok_or_else(|| {
        PreviewError(ApiError::new(ErrorKind::Unavailable, "this node does not train (its --role has no trainer)"))
    })
}

/// Ends idle sessions and releases their models (at each new session and model).
pub(super) fn reap(state: &AppState) {
    let ended = state.tinker().reap_idle();
    release(state, &ended.models);
    if !ended.models.is_empty() {
        tracing::info!(models = ended.models.len(), "released the training models of idle Tinker sessions");
    }
    super::resume::forget_sessions(state, ended.sessions);
}

/// Frees the trainer's sessions of ended models.
fn release(state: &AppState, models: &[RunId]) {
    if let Some(trainer) = state.tinker_trainer() {
        for m in models {
            trainer.release(&m.to_string());
        }
    }
}

#[utoipa::path(
    post,
    operation_id = "tinker_client_config",
    path = "/client/config",
    tag = "tinker",
    summary = "The client settings the SDK asks for at start",
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn client_config() -> Json<Value> {
    // Uncompressed protobuf bodies; a training client from a saved state in one `load_weights`
    // (the SDK before 0.38 asks `weights_info`, `create_model` then `load_weights` without this;
    // 0.38 always does the former and ignores the flag). The rest of the SDK's defaults stand.
    Json(json!({ "pjwt_auth_enabled": false, "proto_compress_fwdbwd": false, "create_model_via_load_weights": true }))
}

#[utoipa::path(
    post,
    operation_id = "tinker_dynamic_config",
    path = "/client/dynamic_config",
    tag = "tinker",
    summary = "Dynamic client settings (none)",
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn dynamic_config() -> Json<Value> {
    Json(json!({}))
}

/// The served base models: every one is trainable and sampleable.
#[utoipa::path(
    get,
    operation_id = "tinker_get_server_capabilities",
    path = "/get_server_capabilities",
    tag = "tinker",
    summary = "The served base models, trainable and sampleable",
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn capabilities(State(state): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = state
        .models()
        .iter()
        .map(|m| {
            let info = m.info();
            // In a cluster, the trainer nodes train what an api node is asked to.
            let trainable = state.tinker_trainer().is_some() || state.node_id().is_some();
            json!({ "model_name": info.id, "max_context_length": info.context_len, "trainable": trainable, "sampleable": true })
        })
        .collect();
    Json(json!({ "supported_models": models }))
}

#[utoipa::path(
    post,
    operation_id = "tinker_telemetry",
    path = "/telemetry",
    tag = "tinker",
    summary = "The SDK's telemetry, accepted and dropped",
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn telemetry() -> Json<Value> {
    Json(json!({ "status": "accepted" }))
}

#[utoipa::path(
    post,
    operation_id = "tinker_create_session",
    path = "/create_session",
    tag = "tinker",
    summary = "A new session (its models and samplers end with it)",
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn create_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>> {
    reap(&state);
    let id = state.tinker().create_session(&caller.entity).map_err(tinker_error)?;
    if let Err(e) = super::resume::record_session(&state, &caller.entity, &id).await {
        // Unrecorded, no other node could find it: it is not handed out.
        let _ = state.tinker().finish(&caller.entity, &id);
        return Err(tinker_error(e).into());
    }
    Ok(Json(json!({ "session_id": id, "type": "create_session" })))
}

#[derive(Deserialize)]
pub struct SessionRef {
    session_id: String,
}

#[utoipa::path(
    post,
    operation_id = "tinker_session_heartbeat",
    path = "/session_heartbeat",
    tag = "tinker",
    summary = "Keeps a session alive",
    request_body = crate::openapi::tinker::TinkerSessionRef,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn heartbeat(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(body): TinkerJson<SessionRef>,
) -> Result<Json<Value>> {
    match state.tinker().heartbeat(&caller.entity, &body.session_id) {
        true => Ok(Json(json!({ "type": "session_heartbeat" }))),
        false => Err(ApiError::not_found("session").into()),
    }
}

/// Ends a session: its samplers go and its models are released.
#[utoipa::path(
    post,
    operation_id = "tinker_finish_session",
    path = "/sessions/{id}/finish",
    tag = "tinker",
    summary = "Ends a session: its models are released, its samplers go",
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn finish(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let ended = state.tinker().finish(&caller.entity, &id).map_err(tinker_error)?;
    release(&state, &ended.models);
    super::resume::forget_sessions(&state, ended.sessions);
    Ok(Json(json!({})))
}

/// The caller's model `id` (another entity's is the same 404 as none), its session marked seen.
pub(super) fn owned_model(state: &AppState, caller: &Caller, id: &str) -> Result<(Arc<TinkerState>, Arc<ModelEntry>)> {
    let t = state.tinker().clone();
    let model = t.model_named(&caller.entity, id).ok_or_else(|| ApiError::not_found("model"))?;
    t.touch_session(&caller.entity, model.id.session());
    Ok((t, model))
}

pub(super) fn new_future(t: &TinkerState, entity: &str, session: &str) -> Result<(String, Promise)> {
    Ok(t.future(entity, session).map_err(tinker_error)?)
}

/// `forward_backward` and `forward` (`forward_only`): a protobuf `ForwardBackwardRequest`.
#[utoipa::path(
    post,
    operation_id = "tinker_forward_backward",
    path = "/forward_backward",
    tag = "tinker",
    summary = "`forward_backward` or `forward` (`forward_only`): a protobuf `ForwardBackwardRequest`, in `seq_id` order (a future)",
    request_body(
        description = "A protobuf `ForwardBackwardRequest` (the SDK sends `application/x-protobuf`; the bytes are read whatever the type)",
        content(
            (crate::openapi::tinker::TinkerProtobuf = "application/x-protobuf"),
            (crate::openapi::tinker::TinkerProtobuf = "application/octet-stream")
        )
    ),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerSubmitted),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn forward_backward(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    // Bounded before decoding (wire::check_shape), decoded and read off the async workers: a
    // body's decoded form can be ~100x its size.
    let budget = state.limits().max_job_tokens;
    let decoded = tokio::task::spawn_blocking(move || wire::read_request(&body, budget))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("reading the call failed: {e}")))?;
    let (req, read) = decoded.map_err(bad)?;
    let (t, model) = owned_model(&state, &caller, &req.model_id)?;
    // The decoded datums wait in the queue: they count against the entity's queued bytes.
    let queued = match &read {
        Ok((data, _)) => {
            let bytes = data.iter().map(datum_bytes).sum::<u64>();
            Some(t.queue_bytes(&caller.entity, bytes).map_err(tinker_error)?)
        }
        Err(_) => None,
    };
    // What the request itself gets wrong fails its future, in order, so later calls still run.
    let id = req.model_id.clone();
    let entry = model.clone();
    ordered(&t, model, &req.model_id, i64::from(req.seq_id), move || {
        let _queued = queued;
        let (data, config) = match read {
            Ok(r) => r,
            Err(error) => return Outcome::user(error),
        };
        match trainer.forward_backward(&id, &data, &req.loss_fn, &config, !req.forward_only) {
            Ok(f) => {
                if !req.forward_only {
                    let mut p = entry.pending.lock().unwrap_or_else(|e| e.into_inner());
                    p.loss += f.loss;
                    p.tokens += data.iter().map(|d| d.tokens.len() as u64).sum::<u64>();
                }
                Outcome::Proto(wire::output(&f.logprobs, &[("loss:sum", f.loss)]).encode_to_vec())
            }
            Err(e) => Outcome::failed(e),
        }
    })
}

/// What a decoded datum holds in memory, roughly: its ids and its loss inputs' values.
fn datum_bytes(d: &wire::Datum) -> u64 {
    let values: usize = d.inputs.values().map(Vec::len).sum();
    (64 + 4 * (d.tokens.len() + d.targets.len()) + 8 * values + 48 * d.inputs.len()) as u64
}

#[derive(Deserialize)]
pub struct OptimStep {
    #[serde(default)]
    adam_params: Option<AdamParamsBody>,
}

#[derive(Deserialize, Clone, Copy)]
struct AdamParamsBody {
    learning_rate: f64,
    #[serde(default = "beta1")]
    beta1: f64,
    #[serde(default = "beta2")]
    beta2: f64,
    #[serde(default = "eps")]
    eps: f64,
    #[serde(default)]
    weight_decay: f64,
    #[serde(default)]
    grad_clip_norm: f64,
}

fn beta1() -> f64 {
    0.9
}
fn beta2() -> f64 {
    0.95
}
fn eps() -> f64 {
    1e-12
}

#[utoipa::path(
    post,
    operation_id = "tinker_optim_step",
    path = "/optim_step",
    tag = "tinker",
    summary = "An AdamW step of the summed gradients, in `seq_id` order (a future)",
    request_body = crate::openapi::tinker::TinkerOptimStep,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerSubmitted),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn optim_step(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(raw): TinkerJson<Value>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let call = Sequenced::<OptimStep>::read(raw)?;
    let (t, model) = owned_model(&state, &caller, &call.model_id)?;
    let (id, seq) = (call.model_id.clone(), call.seq_id);
    let adam = call.body.and_then(|b| b.adam_params.ok_or_else(|| "only adam_params (AdamW) steps are served".into()));
    let p = match adam {
        Ok(p) => p,
        Err(e) => return refused_in_order(&t, model, &id, seq, e),
    };
    let entry = model.clone();
    ordered_async(&t, model, &call.model_id, seq, async move {
        let settings = AdamSettings {
            learning_rate: p.learning_rate,
            beta1: p.beta1,
            beta2: p.beta2,
            eps: p.eps,
            weight_decay: p.weight_decay,
            grad_clip_norm: p.grad_clip_norm,
        };
        let stepped = tokio::task::spawn_blocking(move || trainer.optim_step(&id, settings)).await;
        // Taken whatever the outcome: a failed step's losses belong to no point.
        let taken = std::mem::take(&mut *entry.pending.lock().unwrap_or_else(|e| e.into_inner()));
        match stepped {
            Ok(Ok(norm)) => {
                if taken.tokens > 0 {
                    log_step(&state, entry.record_id, taken, norm, settings.learning_rate).await;
                }
                Outcome::Json(json!({ "metrics": { "grad_norm:mean": norm } }))
            }
            Ok(Err(e)) => Outcome::failed(e),
            Err(e) => Outcome::server(format!("the call failed: {e}")),
        }
    })
}

/// One optimizer step's point on the model record's curves (a metrics-only log, split `train`),
/// so the dashboard shows a Tinker run's loss like a job's. A log that cannot be written costs
/// the curve a point, never the step.
async fn log_step(state: &AppState, record: uuid::Uuid, taken: Pending, grad_norm: f64, lr: f64) {
    let mut metrics = std::collections::BTreeMap::new();
    metrics.insert("train/loss".to_string(), taken.loss);
    metrics.insert("train/loss_per_token".to_string(), taken.loss / taken.tokens as f64);
    metrics.insert("train/trained_tokens".to_string(), taken.tokens as f64);
    metrics.insert("train/grad_norm".to_string(), grad_norm);
    metrics.insert("train/learning_rate".to_string(), lr);
    metrics.retain(|_, v| v.is_finite());
    let new = tandem_store::NewLog {
        model_id: record,
        split: "train".into(),
        metrics,
        num_groups: 0,
        num_trajectories: 0,
        trajectory_groups: json!([]),
    };
    if let Err(e) = state.store().append_log(&new).await {
        tracing::warn!(error = %e, "could not record a Tinker step's metrics");
    }
}

#[derive(Deserialize)]
pub struct Retrieve {
    request_id: String,
}

#[utoipa::path(
    post,
    operation_id = "tinker_retrieve_future",
    path = "/retrieve_future",
    tag = "tinker",
    summary = "A call's result: JSON, a protobuf body, `{\"type\": \"try_again\"}` while pending (held up to 20 s), or `{\"error\", \"category\"}`",
    request_body = crate::openapi::tinker::TinkerRetrieve,
    responses(
        (status = 200, description = "The result, or `try_again`", content((crate::openapi::tinker::TinkerObject = "application/json"), (crate::openapi::tinker::TinkerProtobuf = "application/x-protobuf"))),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn retrieve_future(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(body): TinkerJson<Retrieve>,
) -> Result<Response> {
    let t = state.tinker().clone();
    let outcome = match t.wait(&caller.entity, &body.request_id, HOLD).await {
        Ok(outcome) => outcome,
        Err(e) => match super::resume::lost_call(&t, &caller.entity, &body.request_id) {
            Some(lost) => Some(Arc::new(lost)),
            None => return Err(tinker_error(e).into()),
        },
    };
    Ok(match outcome.as_deref() {
        None => {
            Json(json!({ "type": "try_again", "request_id": body.request_id, "queue_state": "active" })).into_response()
        }
        Some(Outcome::Json(v)) => Json(v.clone()).into_response(),
        Some(Outcome::Proto(bytes)) => {
            ([(header::CONTENT_TYPE, "application/x-protobuf")], bytes.clone()).into_response()
        }
        Some(Outcome::Failed { error, category }) => {
            Json(json!({ "error": error, "category": category.as_str() })).into_response()
        }
    })
}

/// Any other Tinker route: not served yet, said plainly (the SDK raises it to the caller).
pub async fn not_served(uri: axum::http::Uri) -> PreviewError {
    PreviewError(ApiError::new(
        ErrorKind::NotFound,
        format!("{} is not served by tandem yet (served: sessions, create_model, get_info, forward_backward, forward, optim_step, save_weights, load_weights, save_weights_for_sampler, weights_info, create_sampling_session, asample, get_server_capabilities, training_runs, training_runs/{{run}}[/checkpoints], checkpoints, retrieve_future)", uri.path()),
    ))
}
