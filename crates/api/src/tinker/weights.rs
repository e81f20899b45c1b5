//! Tinker's weights routes: `save_weights_for_sampler` (a checkpoint of the model's tandem
//! record, served by every inference route), `save_weights` (the training state) and
//! `load_weights` (a new model from a saved state, or a saved state into a held model),
//! `weights_info`, and deleting a run's checkpoints (`runs` lists them).

use super::expiry::ttl_expiry;
use super::order::{ordered, ordered_async, refused_in_order, Sequenced};
use super::routes::{bad, owned_model, reap, run_id, submitted, tinker_error, trainer, Result, TinkerJson};
use super::sample::Sampler;
use super::samplers;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::AppState;
use axum::extract::State;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use tandem_core::tinker::{
    CheckpointKey, CheckpointKind, LoraSpec, Modules, SavedSampler, StateInfo, TinkerError, TinkerTrainer,
};
use tandem_tinker::catalog::name_problem;
use tandem_tinker::registry::Outcome;

#[derive(Deserialize)]
pub struct SaveForSampler {
    /// The name of named sampler weights; absent for the ephemeral kind.
    #[serde(default)]
    path: Option<String>,
    /// The ephemeral kind's sampling session number (`save_weights_and_get_sampling_client`).
    #[serde(default)]
    sampling_session_seq_id: Option<i64>,
    #[serde(default)]
    ttl_seconds: Option<i64>,
    /// The ephemeral kind's sampler: `snapshot` (the default) samples these weights for good;
    /// `inflight` follows the model's newest inflight save (the SDK's `SamplingClientKind`).
    #[serde(default)]
    kind: Option<String>,
}

/// `save_weights_for_sampler`, named: the adapter becomes the next checkpoint of the model's
/// tandem record (served at once by every inference route as `{entity}/tinker/{name}:stepN`),
/// and its Tinker path `tinker://{model_id}/sampler_weights/{name}`.
#[utoipa::path(
    post,
    operation_id = "tinker_save_weights_for_sampler",
    path = "/save_weights_for_sampler",
    tag = "tinker",
    summary = "Sampler weights by name or ephemeral, served at once (a future)",
    request_body = crate::openapi::tinker::TinkerSaveForSampler,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerSubmitted),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn save_weights_for_sampler(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(raw): TinkerJson<Value>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let call = Sequenced::<SaveForSampler>::read(raw)?;
    let (t, model) = owned_model(&state, &caller, &call.model_id)?;
    let checked = call.body.and_then(|body| {
        let expires = ttl_expiry(body.ttl_seconds)?;
        let inflight = match body.kind.as_deref() {
            None | Some("snapshot") => false,
            Some("inflight") => true,
            Some(other) => return Err(format!("kind {other:?}: expected \"snapshot\" or \"inflight\"")),
        };
        Ok((body, expires, inflight))
    });
    let (body, expires, inflight) = match checked {
        Ok(c) => c,
        Err(e) => return refused_in_order(&t, model, &call.model_id, call.seq_id, e),
    };
    let entry = model.clone();
    let id = call.model_id.clone();
    let (path, sampler_seq) = (body.path.clone(), body.sampling_session_seq_id);
    let ephemeral = path.is_none();
    let entity = caller.entity.clone();
    let tinker = t.clone();
    ordered_async(&t, model, &call.model_id, call.seq_id, async move {
        // The ephemeral kind is a checkpoint too (so the engine serves it), named after its
        // sampling session, and answered with that session.
        let name = match (path, sampler_seq) {
            (Some(name), _) => name,
            (None, Some(seq)) => format!("sampler-{seq}"),
            (None, None) => return Outcome::user("path or sampling_session_seq_id is required"),
        };
        if let Some(problem) = tandem_core::names::name_problem(&name) {
            return Outcome::user(format!("the name {name:?} {problem}"));
        }
        // Named weights, and ephemeral ones given a TTL (so the sweep finds them after their
        // session ends), are kept in the run's list.
        let kept = !ephemeral || expires.is_some();
        let _run = tinker.runs.lock(&entity, &id).await;
        if kept {
            // Before anything is written: past the limit a save leaves nothing behind. (The
            // catalog checks again when it records the name, in one step with the write.)
            if let Err(e) = state.catalog().sampler_room(&entity, &id, &name).await {
                return Outcome::failed(e);
            }
        }
        let kept = kept.then_some(expires);
        let save = SamplerSave { state: &state, entry: &entry, entity: &entity, id: &id, name: &name, kept, inflight };
        save.run(&trainer, ephemeral.then_some(sampler_seq).flatten()).await
    })
}

/// One `save_weights_for_sampler` past its checks, under the run's lock.
struct SamplerSave<'a> {
    state: &'a AppState,
    entry: &'a Arc<tandem_tinker::ModelEntry>,
    entity: &'a str,
    id: &'a str,
    name: &'a str,
    /// Kept in the catalog (named, or given a TTL), with its expiry (saving over a name
    /// replaces its expiry too: none without `ttl_seconds`).
    kept: Option<Option<i64>>,
    /// The sampler follows the model's inflight target, which this save moves.
    inflight: bool,
}

impl SamplerSave<'_> {
    /// Writes the checkpoint, remembers it (in the run's list when kept) and answers the path,
    /// or the sampling session of the ephemeral kind (`sampler_seq`).
    async fn run(&self, trainer: &Arc<dyn TinkerTrainer>, sampler_seq: Option<i64>) -> Outcome {
        let (state, entry, entity, id, name) = (self.state, self.entry, self.entity, self.id, self.name);
        let (files, modules) = {
            let (id, trainer) = (id.to_string(), trainer.clone());
            let read = move || Ok::<_, TinkerError>((trainer.adapter_files(&id)?, trainer.modules(&id)?));
            match tokio::task::spawn_blocking(read).await {
                Ok(Ok(read)) => read,
                Ok(Err(e)) => return Outcome::failed(e),
                Err(e) => return Outcome::server(format!("saving failed: {e}")),
            }
        };
        let cp = match publish(state, entry.record_id, files).await {
            Ok(cp) => cp,
            // Over the entity's storage quota: the caller's to fix, and not worth a retry.
            Err(e) if e.kind == ErrorKind::Forbidden => return Outcome::user(e.message),
            Err(e) => return Outcome::server(e.message),
        };
        let saved = SavedSampler {
            name: name.to_string(),
            step: cp.step,
            checkpoint_id: cp.id,
            created_at: cp.created_at,
            record_id: entry.record_id,
            base_model: entry.base_model.clone(),
            rank: entry.rank,
            unembed: modules.unembed,
            attn: modules.attn,
            mlp: modules.mlp,
        };
        if let Some(expires) = self.kept {
            // Named weights outlive the session (their path samples after the run ends); the
            // checkpoint a name saved before is deleted with the name's move.
            let noted = state.catalog().note_sampler(entity, id, &saved, expires).await.map_err(Outcome::failed);
            let replaced = match noted {
                Ok(replaced) => replaced,
                Err(outcome) => {
                    // Not remembered, so not kept: the checkpoint just written goes again.
                    let _ = samplers::drop_checkpoint(state, &saved).await;
                    return outcome;
                }
            };
            if let Some(old) = replaced.filter(|old| old.checkpoint_id != saved.checkpoint_id) {
                if let Err(e) = samplers::drop_checkpoint(state, &old).await {
                    tracing::warn!(error = %e.message, "could not delete the checkpoint a saved name replaced");
                }
            }
        }
        entry.samplers.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), saved.clone());
        let path = format!("tinker://{id}/sampler_weights/{name}");
        match sampler_seq {
            Some(seq) => {
                let sampler_id = format!("{}:sample:{seq}", entry.id.session());
                let mut sampler = Sampler::of_checkpoint(entity, id, &saved, path);
                if self.inflight {
                    // Saved, then the shared target moves: every inflight sampler of this model
                    // samples these weights from its next request on.
                    *entry.inflight.write().unwrap_or_else(|e| e.into_inner()) = sampler.model.clone();
                    sampler.follows = Some(entry.inflight.clone());
                }
                if let Err(e) = state.tinker().add_sampler(sampler_id.clone(), sampler) {
                    return Outcome::user(e.to_string());
                }
                Outcome::Json(json!({ "sampling_session_id": sampler_id, "type": "save_weights_for_sampler" }))
            }
            None => Outcome::Json(json!({ "path": path, "type": "save_weights_for_sampler" })),
        }
    }
}

/// Writes adapter files as the next checkpoint of `record`: durably, then to the blob store,
/// then recorded (a node finds the files of every checkpoint it finds recorded).
async fn publish(
    state: &AppState,
    record: uuid::Uuid,
    files: Vec<(String, Vec<u8>)>,
) -> std::result::Result<tandem_core::records::Checkpoint, ApiError> {
    let id = tandem_core::new_id();
    let relative = tandem_store::CheckpointDir::relative_path(record, id);
    let size: i64 = files.iter().map(|(_, b)| b.len() as i64).sum();
    let (dir, rel) = (state.checkpoints().dir().clone(), relative.clone());
    tokio::task::spawn_blocking(move || {
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
        dir.write_atomic(&rel, &refs).map(|_| ())
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, format!("writing the checkpoint failed: {e}")))??;
    state.checkpoints().upload(&relative).await?;
    match state.store().import_checkpoint(record, id, &relative, size).await {
        Ok(cp) => Ok(cp),
        Err(e) => {
            let _ = state.checkpoints().remove(&relative).await;
            Err(e.into())
        }
    }
}

#[derive(Deserialize)]
pub struct SaveState {
    path: String,
    #[serde(default)]
    ttl_seconds: Option<i64>,
}

/// `save_weights` (`TrainingClient.save_state`): the adapter, AdamW moments and step, kept in the
/// data directory under the caller's entity; answers `tinker://{model_id}/weights/{name}`.
#[utoipa::path(
    post,
    operation_id = "tinker_save_weights",
    path = "/save_weights",
    tag = "tinker",
    summary = "The training state (adapter, AdamW moments, step) under a name (a future)",
    request_body = crate::openapi::tinker::TinkerSaveState,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerSubmitted),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn save_weights(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(raw): TinkerJson<Value>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let call = Sequenced::<SaveState>::read(raw)?;
    let (t, model) = owned_model(&state, &caller, &call.model_id)?;
    let checked = call.body.and_then(|body| match name_problem(&body.path) {
        Some(problem) => Err(problem),
        None => Ok((ttl_expiry(body.ttl_seconds)?, body.path)),
    });
    let (expires, name) = match checked {
        Ok(c) => c,
        Err(e) => return refused_in_order(&t, model, &call.model_id, call.seq_id, e),
    };
    let (id, owner) = (call.model_id.clone(), caller.entity.clone());
    let tinker = t.clone();
    ordered_async(&t, model, &call.model_id, call.seq_id, async move {
        let _run = tinker.runs.lock(&owner, &id).await;
        let read = {
            let (trainer, id) = (trainer.clone(), id.clone());
            tokio::task::spawn_blocking(move || trainer.state_files(&id)).await
        };
        let (files, info) = match read {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => return Outcome::failed(e),
            Err(e) => return Outcome::server(format!("saving failed: {e}")),
        };
        // Saving over a name replaces its expiry too (none without `ttl_seconds`).
        match state.catalog().save_state(&owner, &id, &name, files, &info, expires).await {
            Ok(()) => Outcome::Json(json!({ "path": format!("tinker://{id}/weights/{name}"), "type": "save_weights" })),
            Err(e) => Outcome::failed(e),
        }
    })
}

#[derive(Deserialize)]
pub struct LoadState {
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    model_seq_id: Option<i64>,
    #[serde(default)]
    model_id: Option<String>,
    path: String,
    #[serde(default)]
    optimizer: bool,
    /// Set when loading into an existing model (`TrainingClient.load_state`): a call in the
    /// model's `seq_id` order.
    #[serde(default)]
    seq_id: Option<i64>,
}

/// `load_weights` as `create_training_client_from_state[_with_optimizer]` sends it: a new model
/// `{session_id}:train:{model_seq_id}` from a state the caller's entity saved.
#[utoipa::path(
    post,
    operation_id = "tinker_load_weights",
    path = "/load_weights",
    tag = "tinker",
    summary = "A new model from a saved state, or a state into a held model (a future)",
    request_body = crate::openapi::tinker::TinkerLoadState,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerSubmitted),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn load_weights(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(body): TinkerJson<LoadState>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let key = state_key(&body.path).ok_or_else(|| {
        bad(format!("path {:?} is not a saved state: expected tinker://<model_id>/weights/<name>", body.path))
    })?;
    if let Some(model_id) = body.model_id.clone() {
        return load_into(state, caller, model_id, body, key).await;
    }
    let (Some(session_id), Some(seq)) = (body.session_id.clone(), body.model_seq_id) else {
        return Err(PreviewError(bad("load_weights needs model_id, or session_id and model_seq_id for a new model")));
    };
    let saved = state
        .catalog()
        .state(&caller.entity, &key, true)
        .await
        .map_err(tinker_error)?
        .ok_or_else(|| ApiError::not_found("saved state"))?;
    let StateInfo { base_model, rank, .. } = saved.info.clone();
    reap(&state);
    let t = state.tinker().clone();
    if !t.touch_session(&caller.entity, &session_id) {
        return Err(ApiError::not_found("session").into());
    }
    let run = run_id(&session_id, seq)?;
    let model_id = run.to_string();
    if let Some(m) = t.model(&caller.entity, &run) {
        return Ok(submitted(&m.create_request, &model_id));
    }
    let lora = LoraSpec { rank, seed: None, modules: saved.info.modules };
    let (request_id, promise) =
        super::models::register_model(&state, &caller.entity, &run, &base_model, lora, Some(key.path())).await?;
    let (id, with_optimizer, entity) = (model_id.clone(), body.optimizer, caller.entity.clone());
    tokio::task::spawn_blocking(move || {
        let outcome = match trainer.load_state(&entity, &id, &saved.dir, with_optimizer) {
            Ok(()) => Outcome::Json(json!({ "model_id": id, "path": key.path(), "type": "load_weights" })),
            Err(e) => {
                t.remove_model(&run);
                Outcome::failed(e)
            }
        };
        promise.set(outcome);
    });
    Ok(submitted(&request_id, &model_id))
}

/// `load_weights` into an existing model (`TrainingClient.load_state[_with_optimizer]`): in the
/// model's `seq_id` order, its adapter replaced by a state of the caller's entity of the same
/// base model and rank.
async fn load_into(
    state: AppState,
    caller: Caller,
    model_id: String,
    body: LoadState,
    key: CheckpointKey,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let seq = body.seq_id.ok_or_else(|| bad("load_weights into a model needs its seq_id"))?;
    let (t, model) = owned_model(&state, &caller, &model_id)?;
    let saved = match state.catalog().state(&caller.entity, &key, true).await {
        Ok(Some(saved)) => saved,
        // In order: the SDK has spent the seq_id.
        Ok(None) => {
            return refused_in_order(&t, model, &model_id, seq, format!("no saved state {:?} is readable", body.path))
        }
        Err(e) => return refused_in_order(&t, model, &model_id, seq, e.to_string()),
    };
    let (id, with_optimizer, path) = (model_id.clone(), body.optimizer, body.path);
    let entry = model.clone();
    ordered(&t, model, &model_id, seq, move || {
        match trainer.load_state_into(&id, &saved.dir, with_optimizer) {
            Ok(()) => {
                // The losses summed so far were of gradients the load dropped.
                *entry.pending.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
                Outcome::Json(json!({ "path": path, "type": "load_weights" }))
            }
            Err(e) => Outcome::failed(e),
        }
    })
}

#[derive(Deserialize)]
pub struct WeightsInfo {
    tinker_path: String,
}

/// `weights_info` (`RestClient.get_weights_info_by_tinker_path`): the base model and LoRA rank of
/// a saved state or of sampler weights saved by name, of the caller's entity.
#[utoipa::path(
    post,
    operation_id = "tinker_weights_info",
    path = "/weights_info",
    tag = "tinker",
    summary = "What a `tinker://` path names (the caller's or published)",
    request_body = crate::openapi::tinker::TinkerWeightsInfo,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn weights_info(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(body): TinkerJson<WeightsInfo>,
) -> Result<Json<Value>> {
    let path = body.tinker_path;
    let key = CheckpointKey::parse_path(&path).filter(|k| !k.name.contains('/'));
    let found = if let Some(key) = key.as_ref().filter(|k| k.kind == CheckpointKind::Weights) {
        let entry = state.catalog().readable(&caller.entity, key, true).await.map_err(tinker_error)?;
        entry.and_then(|e| tandem_tinker::catalog::state_info(&e.meta))
    } else if let Some(key) = key.as_ref().filter(|k| k.kind == CheckpointKind::SamplerWeights) {
        // Sampler weights are PEFT files with every projection (the untrained ones' B is 0),
        // and the output head's pair if it trained; the save noted which trained.
        samplers::readable(&state, &caller.entity, &key.model_id, &key.name).await?.map(|(_, s)| StateInfo {
            base_model: s.base_model,
            rank: s.rank,
            modules: Modules { attn: s.attn, mlp: s.mlp, unembed: s.unembed },
        })
    } else {
        return Err(bad(format!("{path:?} is not a tinker:// path of saved weights")).into());
    };
    let info = found.ok_or_else(|| ApiError::not_found("weights"))?;
    Ok(Json(json!({
        "base_model": info.base_model, "is_lora": true, "lora_rank": info.rank,
        "train_unembed": info.modules.unembed, "train_mlp": info.modules.mlp, "train_attn": info.modules.attn,
    })))
}

/// A `tinker://{model_id}/weights/{name}` path's key.
fn state_key(path: &str) -> Option<CheckpointKey> {
    CheckpointKey::parse_path(path).filter(|k| k.kind == CheckpointKind::Weights && !k.name.contains('/'))
}

/// `DELETE training_runs/{model_id}/checkpoints/{kind}/{name}`: a saved training state, sampler
/// weights saved by name (their checkpoint of the model's tandem record goes too) or external
/// weights.
#[utoipa::path(
    delete,
    operation_id = "tinker_delete_checkpoint",
    path = "/training_runs/{run}/checkpoints/{kind}/{name}",
    tag = "tinker",
    summary = "Deletes a checkpoint (its files, its name)",
    params(crate::openapi::tinker::TinkerCheckpointPath),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn delete_checkpoint(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    axum::extract::Path((run, kind, name)): axum::extract::Path<(String, String, String)>,
) -> Result<Json<Value>> {
    let _run = state.tinker().runs.lock(&caller.entity, &run).await;
    if !delete_held(&state, &caller.entity, &run, &kind, &name).await? {
        return Err(ApiError::not_found("checkpoint").into());
    }
    Ok(Json(json!({})))
}

/// Deletes `entity`'s checkpoint `{kind}/{name}` of `run` with its files (`tandem_tinker::sweep`);
/// whether it existed. The caller holds the run's lock.
pub(super) async fn delete_held(state: &AppState, entity: &str, run: &str, kind: &str, name: &str) -> Result<bool> {
    let samplers = super::samplers::Checkpoints(state);
    let deleted = tandem_tinker::sweep::delete(state.catalog(), state.tinker(), &samplers, entity, run, kind, name);
    Ok(deleted.await.map_err(tinker_error)?)
}
