//! Trajectory logs: store the groups durably, compute ART's metrics, attach them to the
//! checkpoint at the model's latest step; list and fetch stored logs.

use super::owned_model;
use crate::auth::Caller;
use crate::body::{page_request, path_id, PreviewJson};
use crate::error::{ApiError, PreviewError};
use crate::views;
use crate::AppState;
use axum::extract::{Extension, Path, Query, State};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::Value;
use std::collections::HashMap;
use tandem_core::metrics::log_metrics;
use tandem_core::trajectory::{validate_groups, GroupSummary, TrajectoryLimits};
use tandem_core::validate::Validator;
use tandem_store::{NewLog, StoreError};

/// Validates `trajectory_groups` of a body object; shared with training jobs.
pub(super) fn groups_field(
    v: &mut Validator,
    obj: &serde_json::Map<String, Value>,
    limits: &TrajectoryLimits,
) -> Option<Vec<GroupSummary>> {
    let value = v.required(obj, "trajectory_groups")?;
    v.at("trajectory_groups", |v| validate_groups(v, value, limits))
}

#[utoipa::path(
    operation_id = "create_log",
    post,
    path = "/models/{model_id}/log",
    tag = "training",
    summary = "Log scored trajectory groups",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)")),
    request_body = crate::openapi::bodies::LogBody,
    responses(
        (status = 200, body = crate::views::LogView, links(("getLog" = (operation_id = "get_log", parameters(("model_id" = "$response.body#/model_id"), ("log_id" = "$response.body#/id")))))),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 403, description = "The entity's storage quota would be exceeded; nothing was written", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model_id): Path<String>,
    PreviewJson(mut body): PreviewJson,
) -> Result<Json<views::LogView>, PreviewError> {
    let model = owned_model(&state, &caller, &model_id).await?;
    let mut v = Validator::new("body");
    let Some(obj) = v.object(&body) else { return Err(ApiError::validation(v.into_errors()).into()) };
    let split = v.required(obj, "split").and_then(|s| {
        v.at("split", |v| {
            let s = v.string_len(s, 1, 64)?;
            if s.contains('/') {
                v.value_error(&Value::String(s.into()), "split must not contain '/'");
                return None;
            }
            Some(s.to_string())
        })
    });
    let groups = groups_field(&mut v, obj, &state.limits().trajectories);
    let (Some(split), Some(groups)) = (split, groups) else {
        return Err(ApiError::validation(v.into_errors()).into());
    };
    let metrics = log_metrics(&split, &groups);
    let trajectory_groups = body.as_object_mut().and_then(|o| o.remove("trajectory_groups")).unwrap_or(Value::Null);
    let new = NewLog {
        model_id: model.id,
        split,
        metrics,
        num_groups: groups.len() as i64,
        num_trajectories: groups.iter().map(|g| g.trajectories.len() as i64).sum(),
        trajectory_groups,
    };
    let entry = state.store().append_log(&new).await.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found("model"),
        other => other.into(),
    })?;
    Ok(Json(views::log_entry(&entry)))
}

#[utoipa::path(
    operation_id = "list_logs",
    get,
    path = "/models/{model_id}/logs",
    tag = "training",
    summary = "A model's trajectory logs",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)"), crate::openapi::bodies::PageParams, crate::openapi::bodies::SplitFilter),
    responses(
        (status = 200, body = crate::views::ListView<crate::views::LogView>),
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
) -> Result<Json<views::ListView<views::LogView>>, PreviewError> {
    let page = page_request(&query, true)?;
    let model = owned_model(&state, &caller, &model_id).await?;
    let split = query.get("split").map(String::as_str);
    let logs = state.store().list_logs(model.id, split, page).await?;
    Ok(Json(views::list(&logs, |l| l.id, views::log_entry)))
}

#[utoipa::path(
    operation_id = "get_log",
    get,
    path = "/models/{model_id}/logs/{log_id}",
    tag = "training",
    summary = "One trajectory log with its groups",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)"), ("log_id" = Uuid, Path, description = "A log id (UUID)")),
    responses(
        (status = 200, body = crate::views::LogView),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model or log for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 429, description = "A large read of this entity is running; retry", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((model_id, log_id)): Path<(String, String)>,
) -> Result<axum::response::Response, PreviewError> {
    let model = owned_model(&state, &caller, &model_id).await?;
    let log_id = path_id(&log_id, "log")?;
    // A log's groups may be tens of megabytes: read, parsed and written off the async workers.
    let store = state.clone();
    let body = crate::heavy::run(&caller.entity, move || async move {
        let (entry, groups) = store.store().get_log(model.id, log_id).await.map_err(|e| match e {
            StoreError::NotFound => ApiError::not_found("log"),
            other => other.into(),
        })?;
        let mut view = views::log_entry(&entry);
        view.trajectory_groups = Some(groups);
        serde_json::to_vec(&view).map_err(|e| ApiError::new(crate::error::ErrorKind::Internal, e.to_string()))
    })
    .await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}
