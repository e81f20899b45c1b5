//! Checkpoints of a model: cursor-paged listing (ART learns the latest step from
//! `limit=1&order=desc`) and deletion by step.

use super::owned_model;
use crate::auth::Caller;
use crate::body::{page_request, PreviewJson};
use crate::error::{ApiError, PreviewError};
use crate::views;
use crate::AppState;
use axum::extract::{Extension, Path, Query, State};
use axum::Json;
use serde_json::Value;
use std::collections::HashMap;
use tandem_core::records::Checkpoint;
use tandem_core::validate::Validator;

#[utoipa::path(
    operation_id = "list_checkpoints",
    get,
    path = "/models/{model_id}/checkpoints",
    tag = "training",
    summary = "A model's checkpoints",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)"), crate::openapi::bodies::PageParams),
    responses(
        (status = 200, body = crate::views::ListView<crate::views::CheckpointView>),
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
) -> Result<Json<views::ListView<views::CheckpointView>>, PreviewError> {
    let page = page_request(&query, true)?;
    let model = owned_model(&state, &caller, &model_id).await?;
    let checkpoints = state.store().list_checkpoints(model.id, page).await?;
    Ok(Json(views::list(&checkpoints, |c| c.id, views::checkpoint)))
}

fn validate_steps(body: &Value, max: usize) -> Result<Vec<i64>, ApiError> {
    let mut v = Validator::new("body");
    let Some(obj) = v.object(body) else { return Err(ApiError::validation(v.into_errors())) };
    let mut steps = Vec::new();
    if let Some(value) = v.required(obj, "steps") {
        v.at("steps", |v| {
            for (i, s) in v.array_max(value, max).cloned().unwrap_or_default().iter().enumerate() {
                if let Some(step) = v.at(i, |v| v.integer(s)) {
                    steps.push(step);
                }
            }
        });
    }
    v.finish(steps).map_err(ApiError::validation)
}

#[utoipa::path(
    operation_id = "delete_checkpoints",
    delete,
    path = "/models/{model_id}/checkpoints",
    tag = "training",
    summary = "Delete checkpoints by step",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)")),
    request_body = crate::openapi::bodies::DeleteCheckpointsBody,
    responses(
        (status = 200, body = crate::views::CheckpointsDeleted),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 409, description = "A job of the model is running", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model_id): Path<String>,
    PreviewJson(body): PreviewJson,
) -> Result<Json<views::CheckpointsDeleted>, PreviewError> {
    let model = owned_model(&state, &caller, &model_id).await?;
    let steps = validate_steps(&body, state.limits().max_delete_steps)?;
    let out = state.store().delete_checkpoints(model.id, &steps).await?;
    remove_files(&state, &out.deleted).await;
    tracing::info!(model_id = %model.id, deleted = out.deleted.len(), "checkpoints deleted");
    Ok(Json(views::CheckpointsDeleted { deleted_count: out.deleted.len(), not_found_steps: out.not_found_steps }))
}

/// Removes deleted checkpoints' files. The rows are already gone, so nothing serves them; a file
/// that cannot be removed now is swept at the next start.
pub(crate) async fn remove_files(state: &AppState, deleted: &[Checkpoint]) {
    if let Some(backend) = state.backend() {
        for c in deleted {
            backend.forget_adapter(&c.id.to_string());
        }
    }
    let dir = state.checkpoints().clone();
    let paths: Vec<String> = deleted.iter().map(|c| c.path.clone()).collect();
    let result = tokio::task::spawn_blocking(move || {
        for p in &paths {
            if let Err(e) = dir.remove(p) {
                tracing::warn!(path = %p, error = %e, "could not remove checkpoint files");
            }
        }
    })
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "checkpoint file removal task failed");
    }
}
