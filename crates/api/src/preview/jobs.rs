//! Training jobs: create (queued at once; the worker trains in the background), get, cancel,
//! and the cursor-paged event list ART polls.

use super::logs::groups_field;
use crate::auth::Caller;
use crate::body::{page_request, path_id, PreviewJson};
use crate::error::{ApiError, PreviewError};
use crate::views;
use crate::AppState;
use axum::extract::{Extension, Path, Query, State};
use axum::Json;
use serde_json::Value;
use std::collections::HashMap;
use tandem_core::metrics::log_metrics;
use tandem_core::names::{checkpoint_ref, CheckpointRef, ModelName};
use tandem_core::records::{JobKind, ModelRecord, Order, PageRequest};
use tandem_core::sequences::{tokenize_groups, ModelBounds, ModelTokenizer, RlInputs, TrainedModel};
use tandem_core::train_config::parse_train_config;
use tandem_core::train_config::KlReference;
use tandem_core::validate::{optional, Validator};
use tandem_store::{NewJob, Rollout, StoreError};
use uuid::Uuid;

fn job_not_found(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found("training job"),
        other => other.into(),
    }
}

#[utoipa::path(
    operation_id = "create_training_job",
    post,
    path = "/training-jobs",
    tag = "training",
    summary = "Queue an RL training job",
    request_body = crate::openapi::bodies::TrainingJobBody,
    responses(
        (status = 200, body = crate::views::JobView, links(("job" = (operation_id = "get_training_job", parameters(("job_id" = "$response.body#/id")))), ("cancel" = (operation_id = "cancel_training_job", parameters(("job_id" = "$response.body#/id")))), ("events" = (operation_id = "list_training_job_events", parameters(("job_id" = "$response.body#/id")))))),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 403, description = "The entity's storage quota would be exceeded; nothing was written", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 429, description = "Too many pending jobs", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PreviewJson(mut body): PreviewJson,
) -> Result<Json<views::JobView>, PreviewError> {
    let mut v = Validator::new("body");
    let Some(obj) = v.object(&body) else { return Err(ApiError::validation(v.into_errors()).into()) };
    let model_id = v.required(obj, "model_id").and_then(|m| v.at("model_id", |v| v.uuid(m)));
    let groups = groups_field(&mut v, obj, &state.limits().trajectories);
    let config = v.at("experimental_config", |v| parse_train_config(v, optional(obj, "experimental_config")));
    let (Some(model_id), Some(groups), Some(mut config)) = (model_id, groups, config) else {
        return Err(ApiError::validation(v.into_errors()).into());
    };
    let model = state.store().get_model(&caller.entity, model_id).await.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found("model"),
        other => other.into(),
    })?;
    check_pending_jobs(&state, &caller.entity).await?;
    if let Some(kl) = config.kl_penalty.as_mut() {
        kl.reference = kl_reference(&state, &model, &kl.reference).await?;
    }
    let trajectory_groups = body.as_object_mut().and_then(|o| o.remove("trajectory_groups")).unwrap_or(Value::Null);
    // Kept for people (curves, trajectory browser) beside the tokenized copy the trainer reads.
    let rollout = Rollout { metrics: log_metrics("train", &groups), groups: trajectory_groups.clone() };
    let inputs = tokenize_inputs(&state, &model, trajectory_groups, config.allow_training_without_logprobs).await?;
    if let RlInputs::Tokenized(t) = &inputs {
        let tokens = t.groups.iter().flat_map(|g| &g.trajectories).flat_map(|t| &t.sequences).map(|s| s.tokens.len());
        check_job_tokens(&state, "trajectory_groups", tokens.sum::<usize>() as u64)?;
    }
    let new = NewJob {
        model_id: model.id,
        kind: JobKind::Rl,
        config: serde_json::to_value(&config).unwrap_or(Value::Null),
        inputs: inputs.to_stored(),
        rollout: Some(rollout),
    };
    let job = queue_job(&state, &new).await?;
    tracing::info!(job_id = %job.id, model_id = %model.id, "training job queued");
    state.wake_jobs();
    Ok(Json(views::job(&job)))
}

/// A 429 (with `Retry-After`) once the entity has `max_pending_jobs` jobs queued or running:
/// checked before the work of reading a request's inputs, and again, atomically with the insert,
/// by [`queue_job`] (concurrent creations all pass this first check together).
pub(super) async fn check_pending_jobs(state: &AppState, entity: &str) -> Result<(), ApiError> {
    let limit = state.limits().max_pending_jobs;
    let pending = state.store().pending_jobs(entity).await?;
    if pending >= limit {
        return Err(too_many_jobs(pending, limit));
    }
    Ok(())
}

fn too_many_jobs(pending: i64, limit: i64) -> ApiError {
    ApiError::new(
        crate::error::ErrorKind::TooManyRequests,
        format!(
            "this entity already has {pending} training jobs queued or running (at most {limit}); wait for one to end"
        ),
    )
    .with_retry_after(5)
}

/// A 422 when a job would train on more tokens than the server's per-job budget
/// (`--max-job-tokens`).
pub(super) fn check_job_tokens(state: &AppState, field: &str, tokens: u64) -> Result<(), ApiError> {
    let limit = state.limits().max_job_tokens;
    if tokens <= limit {
        return Ok(());
    }
    let why = format!(
        "this job would train on {tokens} tokens, more than this server's budget of {limit} per job \
         (--max-job-tokens); split it into smaller jobs"
    );
    let mut v = Validator::new("body");
    v.at(field, |v| v.value_error(&Value::Null, &why));
    Err(ApiError::validation(v.into_errors()))
}

/// Reading and rendering a job's inputs at creation (tokenizing trajectories, rendering an SFT
/// dataset) is CPU work of up to the body limit: one per entity at a time (a few more queued),
/// two server-wide, on blocking threads, so one entity's large jobs neither hold every core nor
/// delay another entity's creation behind more than one of its own.
pub(super) static INPUT_CHECKS: crate::heavy::Gate =
    crate::heavy::Gate::new(2, "several training jobs of this entity are being checked; retry when they are done");

/// Inserts a job under the entity's pending-job cap (RL and SFT alike).
pub(super) async fn queue_job(state: &AppState, new: &NewJob) -> Result<tandem_core::records::Job, ApiError> {
    let limit = state.limits().max_pending_jobs;
    state.store().create_job_capped(new, Some(limit)).await.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found("model"),
        StoreError::AtLimit(pending) => too_many_jobs(pending, limit),
        other => other.into(),
    })
}

/// Checks the KL penalty's reference against the model's live checkpoints, and resolves
/// `kl_ref_adapter_path` to one of them (a step). A lag is resolved when the job starts.
async fn kl_reference(state: &AppState, model: &ModelRecord, reference: &KlReference) -> Result<KlReference, ApiError> {
    let invalid = |field: &str, input: &str, why: String| {
        let mut v = Validator::new("body");
        v.at("experimental_config", |v| v.at(field, |v| v.value_error(&Value::String(input.into()), &why)));
        ApiError::validation(v.into_errors())
    };
    let step_exists = |step: i64| async move {
        match state.store().get_checkpoint(model.id, step).await {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound) => Ok(false),
            Err(e) => Err(ApiError::from(e)),
        }
    };
    match reference {
        KlReference::Step(0) | KlReference::Lag(_) => Ok(reference.clone()),
        KlReference::Step(step) => {
            if step_exists(*step).await? {
                Ok(reference.clone())
            } else {
                let why = format!("the model has no checkpoint at step {step}");
                Err(invalid("kl_penalty_reference_step", &step.to_string(), why))
            }
        }
        KlReference::AdapterPath(path) => {
            let name = ModelName { id: model.id, entity: &model.entity, project: &model.project, name: &model.name };
            let step = match checkpoint_ref(path, &name) {
                Some(CheckpointRef::Latest) => Some(state.store().latest_step(model.id).await?),
                Some(CheckpointRef::Step(s)) => (s == 0 || step_exists(s).await?).then_some(s),
                Some(CheckpointRef::Id(id)) => checkpoint_step(state, model.id, id).await?,
                None => {
                    let why = "must name one of this model's checkpoints: `wandb-artifact:///{entity}/{project}/{name}:step{N}`, a checkpoint id, or ART's `.../{project}/models/{name}/checkpoints/{step}`";
                    return Err(invalid("kl_ref_adapter_path", path, why.into()));
                }
            };
            match step {
                Some(s) => Ok(KlReference::Step(s)),
                None => {
                    Err(invalid("kl_ref_adapter_path", path, "no live checkpoint of this model has that name".into()))
                }
            }
        }
    }
}

/// The step of the model's live checkpoint with this id.
async fn checkpoint_step(state: &AppState, model_id: Uuid, id: Uuid) -> Result<Option<i64>, ApiError> {
    let mut page = PageRequest { after: None, limit: 100, order: Order::Asc };
    loop {
        let p = state.store().list_checkpoints(model_id, page).await?;
        if let Some(cp) = p.items.iter().find(|c| c.id == id) {
            return Ok(Some(cp.step));
        }
        match (p.has_more, p.items.last()) {
            (true, Some(last)) => page.after = Some(last.id),
            _ => return Ok(None),
        }
    }
}

/// Tokenizes every trajectory once, as the trainer trains on it, on a blocking thread: the job
/// stores the token sequences, and a trajectory it cannot train on is a 422 now (naming it and
/// why) rather than a failed job later. Without a served model for the base there is nothing to
/// tokenize with: the groups are stored raw and the trainer decides.
async fn tokenize_inputs(
    state: &AppState,
    model: &ModelRecord,
    groups: Value,
    allow_without_logprobs: bool,
) -> Result<RlInputs, ApiError> {
    let Some(served) = state.model(&model.base_model).cloned() else { return Ok(RlInputs::Raw(groups)) };
    let held = INPUT_CHECKS.enter(&model.entity).await?;
    let model = model.clone();
    let result = held
        .blocking("the tokenize task", move || {
            let info = served.info().clone();
            let bounds = ModelBounds { vocab: info.vocab_size, context: info.context_len };
            let trained = TrainedModel { entity: &model.entity, project: &model.project, name: &model.name };
            tokenize_groups(&groups, &ModelTokenizer(served), &trained, allow_without_logprobs, bounds)
                .map_err(|errors| (groups, errors))
        })
        .await?;
    match result {
        Ok(tokenized) => Ok(RlInputs::Tokenized(tokenized)),
        Err((groups, errors)) => {
            let mut v = Validator::new("body");
            v.at("trajectory_groups", |v| {
                for e in errors {
                    let traj = &groups[e.group]["trajectories"][e.trajectory];
                    v.at(e.group, |v| {
                        v.at("trajectories", |v| v.at(e.trajectory, |v| v.value_error(traj, &e.message)))
                    });
                }
            });
            Err(ApiError::validation(v.into_errors()))
        }
    }
}

#[utoipa::path(
    operation_id = "list_model_training_jobs",
    get,
    path = "/models/{model_id}/training-jobs",
    tag = "training",
    summary = "A model's training jobs (RL and SFT), oldest first by default",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)"), crate::openapi::bodies::PageParams),
    responses(
        (status = 200, body = crate::views::ListView<crate::views::JobView>),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<views::ListView<views::JobView>>, PreviewError> {
    let page = page_request(&query, true)?;
    let model = super::owned_model(&state, &caller, &model_id).await?;
    let jobs = state.store().list_jobs(model.id, page).await?;
    Ok(Json(views::list(&jobs, |j| j.id, views::job)))
}

#[utoipa::path(
    operation_id = "get_training_job",
    get,
    path = "/training-jobs/{job_id}",
    tag = "training",
    summary = "A training job",
    params(("job_id" = Uuid, Path, description = "A job id (UUID)")),
    responses(
        (status = 200, body = crate::views::JobView),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such job for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(job_id): Path<String>,
) -> Result<Json<views::JobView>, PreviewError> {
    let id = path_id(&job_id, "training job")?;
    let job = state.store().get_job(&caller.entity, id).await.map_err(job_not_found)?;
    Ok(Json(views::job(&job)))
}

#[utoipa::path(
    operation_id = "cancel_training_job",
    post,
    path = "/training-jobs/{job_id}/cancel",
    tag = "training",
    summary = "Cancel a queued or running job",
    params(("job_id" = Uuid, Path, description = "A job id (UUID)")),
    responses(
        (status = 200, body = crate::views::JobView),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such job for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(job_id): Path<String>,
) -> Result<Json<views::JobView>, PreviewError> {
    let id = path_id(&job_id, "training job")?;
    let job = state.store().cancel_job(&caller.entity, id).await.map_err(job_not_found)?;
    Ok(Json(views::job(&job)))
}

#[utoipa::path(
    operation_id = "list_training_job_events",
    get,
    path = "/training-jobs/{job_id}/events",
    tag = "training",
    summary = "A job's events, in append order",
    params(("job_id" = Uuid, Path, description = "A job id (UUID)"), crate::openapi::bodies::EventPageParams),
    responses(
        (status = 200, body = crate::views::ListView<crate::views::EventView>),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such job for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(job_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<views::ListView<views::EventView>>, PreviewError> {
    let page = page_request(&query, false)?;
    let id = path_id(&job_id, "training job")?;
    let page = tandem_core::records::PageRequest { order: Order::Asc, ..page };
    let events = state.store().list_events(&caller.entity, id, page).await.map_err(job_not_found)?;
    Ok(Json(views::list(&events, |e| e.id, views::event)))
}
