//! The `/v1/preview` area: the W&B-Training-style control plane ART's `ServerlessBackend` uses.
//! Every route requires a key; every object is scoped to the key's entity.

pub(crate) mod checkpoints;
mod datasets;
mod history;
mod jobs;
mod logs;
mod models;
mod sft;
mod trajectories;

use crate::auth::{require_preview, Caller};
use crate::body::path_id;
use crate::error::ApiError;
use crate::AppState;
use axum::middleware::from_fn_with_state;
use tandem_core::records::ModelRecord;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router(state: AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(models::create, models::list))
        .routes(routes!(models::get, models::delete))
        .routes(routes!(checkpoints::list, checkpoints::delete, checkpoints::import))
        .routes(routes!(checkpoints::export))
        .routes(routes!(checkpoints::export_merged))
        .routes(routes!(history::get))
        .routes(routes!(logs::create))
        .routes(routes!(logs::list))
        .routes(routes!(logs::get))
        .routes(routes!(trajectories::of_log))
        .routes(routes!(trajectories::of_job))
        .routes(routes!(datasets::upload, datasets::list))
        .routes(routes!(datasets::get, datasets::delete))
        .routes(routes!(sft::create))
        .routes(routes!(jobs::create))
        .routes(routes!(jobs::get))
        .routes(routes!(jobs::list))
        .routes(routes!(jobs::cancel))
        .routes(routes!(jobs::events))
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
