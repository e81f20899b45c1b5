//! The `/v1/preview` area: the W&B-Training-style control plane ART's `ServerlessBackend` uses.
//! Every route requires a key; every object is scoped to the key's entity.

mod checkpoints;
mod datasets;
mod jobs;
mod logs;
mod models;
mod sft;

use crate::auth::{require_preview, Caller};
use crate::body::path_id;
use crate::error::ApiError;
use crate::AppState;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::Router;
use tandem_core::records::ModelRecord;

pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/models", post(models::create).get(models::list))
        .route("/models/{model_id}", get(models::get).delete(models::delete))
        .route("/models/{model_id}/checkpoints", get(checkpoints::list).delete(checkpoints::delete))
        .route("/models/{model_id}/log", post(logs::create))
        .route("/models/{model_id}/logs", get(logs::list))
        .route("/models/{model_id}/logs/{log_id}", get(logs::get))
        .route("/datasets", post(datasets::upload).get(datasets::list))
        .route("/datasets/{dataset_id}", get(datasets::get).delete(datasets::delete))
        .route("/sft-training-jobs", post(sft::create))
        .route("/training-jobs", post(jobs::create))
        .route("/training-jobs/{job_id}", get(jobs::get))
        .route("/training-jobs/{job_id}/cancel", post(jobs::cancel))
        .route("/training-jobs/{job_id}/events", get(jobs::events))
        .route_layer(from_fn_with_state(state, require_preview))
}

/// The caller's model with this path id, or the same 404 for unknown and foreign ids.
async fn owned_model(state: &AppState, caller: &Caller, raw_id: &str) -> Result<ModelRecord, ApiError> {
    let id = path_id(raw_id, "model")?;
    state.store().get_model(&caller.entity, id).await.map_err(|e| match e {
        tandem_store::StoreError::NotFound => ApiError::not_found("model"),
        other => other.into(),
    })
}
