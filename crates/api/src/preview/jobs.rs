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
use tandem_core::records::Order;
use tandem_core::sequences::{tokenize_trajectory, BackendTokenizer};
use tandem_core::train_config::parse_train_config;
use tandem_core::validate::{optional, Validator};
use tandem_store::{NewJob, StoreError};

fn job_not_found(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found("training job"),
        other => other.into(),
    }
}

pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PreviewJson(mut body): PreviewJson,
) -> Result<Json<Value>, PreviewError> {
    let mut v = Validator::new("body");
    let Some(obj) = v.object(&body) else { return Err(ApiError::validation(v.into_errors()).into()) };
    let model_id = v.required(obj, "model_id").and_then(|m| v.at("model_id", |v| v.uuid(m)));
    let groups = groups_field(&mut v, obj, &state.limits().trajectories);
    let config = v.at("experimental_config", |v| parse_train_config(v, optional(obj, "experimental_config")));
    let (Some(model_id), Some(_groups), Some(config)) = (model_id, groups, config) else {
        return Err(ApiError::validation(v.into_errors()).into());
    };
    let model = state.store().get_model(&caller.entity, model_id).await.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found("model"),
        other => other.into(),
    })?;
    let trajectory_groups = body.as_object_mut().and_then(|o| o.remove("trajectory_groups")).unwrap_or(Value::Null);
    let trajectory_groups =
        check_tokenizable(&state, &model.base_model, trajectory_groups, config.allow_training_without_logprobs).await?;
    let new =
        NewJob { model_id: model.id, config: serde_json::to_value(&config).unwrap_or(Value::Null), trajectory_groups };
    let job = state.store().create_job(&new).await.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found("model"),
        other => other.into(),
    })?;
    tracing::info!(job_id = %job.id, model_id = %model.id, "training job queued");
    state.wake_jobs();
    Ok(Json(views::job(&job)))
}

/// Tokenizes every trajectory as the trainer will, so that one it cannot train on is a 422 now
/// (naming the trajectory and why) rather than a failed job later. Rendering runs on a blocking
/// thread.
async fn check_tokenizable(
    state: &AppState,
    base_model: &str,
    groups: Value,
    allow_without_logprobs: bool,
) -> Result<Value, ApiError> {
    let (Some(backend), Some(base)) = (state.backend().cloned(), state.base_index(base_model)) else {
        return Ok(groups);
    };
    let result = tokio::task::spawn_blocking(move || {
        let tok = BackendTokenizer { backend, base };
        let empty = Vec::new();
        let mut v = Validator::new("body");
        v.at("trajectory_groups", |v| {
            for (g, group) in groups.as_array().unwrap_or(&empty).iter().enumerate() {
                let trajs = group.get("trajectories").and_then(Value::as_array).unwrap_or(&empty);
                for (t, traj) in trajs.iter().enumerate() {
                    let at = format!("trajectory_groups[{g}].trajectories[{t}]");
                    if let Err(msg) = tokenize_trajectory(traj, &tok, allow_without_logprobs, &at) {
                        v.at(g, |v| v.at("trajectories", |v| v.at(t, |v| v.value_error(traj, &msg))));
                    }
                }
            }
        });
        (groups, v)
    })
    .await
    .map_err(|e| ApiError::new(crate::error::ErrorKind::Internal, format!("tokenize task failed: {e}")))?;
    let (groups, v) = result;
    if v.has_errors() {
        return Err(ApiError::validation(v.into_errors()));
    }
    Ok(groups)
}

pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(job_id): Path<String>,
) -> Result<Json<Value>, PreviewError> {
    let id = path_id(&job_id, "training job")?;
    let job = state.store().get_job(&caller.entity, id).await.map_err(job_not_found)?;
    Ok(Json(views::job(&job)))
}

pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(job_id): Path<String>,
) -> Result<Json<Value>, PreviewError> {
    let id = path_id(&job_id, "training job")?;
    let job = state.store().cancel_job(&caller.entity, id).await.map_err(job_not_found)?;
    Ok(Json(views::job(&job)))
}

pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(job_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, PreviewError> {
    let page = page_request(&query, false)?;
    let id = path_id(&job_id, "training job")?;
    let page = tandem_core::records::PageRequest { order: Order::Asc, ..page };
    let events = state.store().list_events(&caller.entity, id, page).await.map_err(job_not_found)?;
    Ok(Json(views::list(&events, |e| e.id, views::event)))
}
