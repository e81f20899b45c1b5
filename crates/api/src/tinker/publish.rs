//! Publishing (`RestClient.publish_checkpoint_from_tinker_path` and its `unpublish`): the owner
//! of a run makes a saved state or sampler weights loadable by every entity that knows its
//! `tinker://` path (`weights_info`, `create_sampling_client(model_path=...)` and
//! `create_training_client_from_state[_with_optimizer]`), and private again. Each use checks the
//! mark anew: once unpublished (or deleted, or saved over), a path is a 404 to others, also for
//! a sampling client made while it was public. Listings, deletes, TTLs and downloads stay the
//! owner's.

use super::routes::{bad, tinker_error, Result};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde_json::{json, Value};
use tandem_core::tinker::{CheckpointKey, CheckpointKind};

/// `POST training_runs/{run}/checkpoints/{kind}/{name}/publish`.
#[utoipa::path(
    post,
    operation_id = "tinker_publish_checkpoint",
    path = "/training_runs/{run}/checkpoints/{kind}/{name}/publish",
    tag = "tinker",
    summary = "Publishes a checkpoint to every entity that knows its path",
    params(crate::openapi::tinker::TinkerCheckpointPath),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn publish(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((run, kind, name)): Path<(String, String, String)>,
) -> Result<Json<Value>> {
    mark(&state, &caller, &run, &kind, &name, true).await
}

/// `DELETE training_runs/{run}/checkpoints/{kind}/{name}/publish`.
#[utoipa::path(
    delete,
    operation_id = "tinker_unpublish_checkpoint",
    path = "/training_runs/{run}/checkpoints/{kind}/{name}/publish",
    tag = "tinker",
    summary = "Makes a published checkpoint private again",
    params(crate::openapi::tinker::TinkerCheckpointPath),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn unpublish(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((run, kind, name)): Path<(String, String, String)>,
) -> Result<Json<Value>> {
    mark(&state, &caller, &run, &kind, &name, false).await
}

/// Sets the mark on a checkpoint the caller's run lists: 404 when it lists none such (another
/// entity's run included).
async fn mark(
    state: &AppState,
    caller: &Caller,
    run: &str,
    kind: &str,
    name: &str,
    public: bool,
) -> Result<Json<Value>> {
    if !matches!(kind, "weights" | "sampler_weights") {
        return Err(bad(format!(
            "{kind}/{name}: only saved states (weights/...) and sampler weights (sampler_weights/...) are \
             published; external weights are downloaded by their owner"
        ))
        .into());
    }
    let _run = state.tinker().runs.lock(&caller.entity, run).await;
    let checkpoint = format!("{kind}/{name}");
    let (listed, _) = super::runs::checkpoints_of(state, &caller.entity, run)
        .await?
        .ok_or_else(|| ApiError::not_found("training run"))?;
    if !listed.iter().any(|(_, c)| c["checkpoint_id"] == checkpoint.as_str()) {
        return Err(ApiError::not_found("checkpoint").into());
    }
    let key = CheckpointKey::of_run(run, &checkpoint).ok_or_else(|| ApiError::not_found("checkpoint"))?;
    if public && key.kind == CheckpointKind::SamplerWeights {
        // An ephemeral save lives in the session's memory only: published, it is kept in the
        // catalog (where other entities and nodes find the mark), as a save by name is.
        super::expiry::keep_ephemeral(state, &caller.entity, run, name, None).await?;
    }
    // Already so is a success: the SDK retries a 409 (which Tinker documents for it) for five
    // minutes before it raises, and the checkpoint is as asked either way.
    let marked = state.catalog().set_public(&caller.entity, &key, public).await.map_err(tinker_error)?;
    if marked.is_none() && public {
        return Err(ApiError::not_found("checkpoint").into());
    }
    Ok(Json(json!({})))
}
