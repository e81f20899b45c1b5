//! Tinker's weights routes: `save_weights_for_sampler` (a checkpoint of the model's tandem
//! record, served by every inference route), `save_weights` (the training state) and
//! `load_weights` (a new model from a saved state, or a saved state into a held model),
//! `weights_info`, and deleting a run's checkpoints (`runs` lists them).

use super::expiry::ttl_expiry;
use super::order::{ordered, ordered_async, refused_in_order, Sequenced};
use super::routes::{bad, failed, owned_model, reap, register_model, submitted, trainer, Result};
use super::sample::Sampler;
use super::samplers;
use super::state::{Outcome, MAX_SAMPLERS_PER_ENTITY};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::AppState;
use axum::extract::State;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use tandem_core::tinker::{Modules, SavedSampler, StateInfo, TinkerError, TinkerTrainer};

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
pub async fn save_weights_for_sampler(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(raw): Json<Value>,
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
            (None, None) => {
                return Outcome::Failed {
                    error: "path or sampling_session_seq_id is required".into(),
                    category: "user",
                }
            }
        };
        if let Some(problem) = tandem_core::names::name_problem(&name) {
            return Outcome::Failed { error: format!("the name {name:?} {problem}"), category: "user" };
        }
        // Named weights, and ephemeral ones given a TTL (so the sweep finds them after their
        // session ends), are kept in the run's list.
        let kept = !ephemeral || expires.is_some();
        let _run = tinker.runs.lock(&entity, &id).await;
        let mut before = None;
        if kept {
            // Before anything is written: past the limit, or with a damaged expiry list, a save
            // leaves nothing behind. Saving over a name replaces its expiry too (none without
            // `ttl_seconds`).
            let (owner, id, name, trainer) = (entity.clone(), id.clone(), name.clone(), trainer.clone());
            let checked = tokio::task::spawn_blocking(move || {
                trainer.may_note_sampler(&owner, &id, &name)?;
                trainer.set_expiry(&owner, &id, &format!("sampler_weights/{name}"), expires)
            })
            .await;
            before = match checked {
                Ok(Ok(before)) => before,
                Ok(Err(e)) => return failed(e),
                Err(e) => return Outcome::Failed { error: format!("saving failed: {e}"), category: "server" },
            };
        }
        let save = SamplerSave { state: &state, entry: &entry, entity: &entity, id: &id, name: &name, kept, inflight };
        let outcome = save.run(&trainer, ephemeral.then_some(sampler_seq).flatten()).await;
        if kept && matches!(outcome, Outcome::Failed { .. }) {
            // The name's expiry goes back to what it was.
            restore_expiry(&trainer, &entity, &id, &format!("sampler_weights/{name}"), before).await;
        }
        outcome
    })
}

/// One `save_weights_for_sampler` past its checks, under the run's lock.
struct SamplerSave<'a> {
    state: &'a AppState,
    entry: &'a Arc<super::state::ModelEntry>,
    entity: &'a str,
    id: &'a str,
    name: &'a str,
    kept: bool,
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
                Ok(Err(e)) => return failed(e),
                Err(e) => return Outcome::Failed { error: format!("saving failed: {e}"), category: "server" },
            }
        };
        let cp = match publish(state, entry.record_id, files).await {
            Ok(cp) => cp,
            Err(e) => return Outcome::Failed { error: e.message, category: "server" },
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
        if self.kept {
            // Named weights outlive the session (their path samples after the run ends); the
            // checkpoint a name saved before is deleted with the name's move.
            let (owner, id, entry, trainer) = (entity.to_string(), id.to_string(), saved.clone(), trainer.clone());
            let noted = match tokio::task::spawn_blocking(move || trainer.note_sampler(&owner, &id, entry)).await {
                Ok(noted) => noted.map_err(failed),
                Err(e) => Err(Outcome::Failed { error: format!("saving failed: {e}"), category: "server" }),
            };
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
                let sampler_id = format!("{}:sample:{seq}", entry.session_id);
                let mut sampler = Sampler::of_checkpoint(entity, id, &saved, path);
                if self.inflight {
                    // Saved, then the shared target moves: every inflight sampler of this model
                    // samples these weights from its next request on.
                    *entry.inflight.write().unwrap_or_else(|e| e.into_inner()) = sampler.model.clone();
                    sampler.follows = Some(entry.inflight.clone());
                }
                if !state.tinker().add_sampler(sampler_id.clone(), sampler) {
                    return Outcome::Failed {
                        error: format!(
                            "an entity may hold {MAX_SAMPLERS_PER_ENTITY} sampling sessions; finish a session first"
                        ),
                        category: "user",
                    };
                }
                Outcome::Json(json!({ "sampling_session_id": sampler_id, "type": "save_weights_for_sampler" }))
            }
            None => Outcome::Json(json!({ "path": path, "type": "save_weights_for_sampler" })),
        }
    }
}

/// Puts a checkpoint's expiry back after a save that set it failed.
async fn restore_expiry(trainer: &Arc<dyn TinkerTrainer>, owner: &str, run: &str, checkpoint: &str, at: Option<i64>) {
    let (trainer, owner, run, checkpoint) =
        (trainer.clone(), owner.to_string(), run.to_string(), checkpoint.to_string());
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || trainer.set_expiry(&owner, &run, &checkpoint, at)).await {
        tracing::warn!(error = %e, "could not restore a checkpoint's expiry after a failed save");
    }
}

/// Runs a save of `checkpoint` (a blocking thread, the run's lock held) with its new expiry set
/// first: a damaged expiry list fails the save before it overwrites anything, and a save that
/// fails puts the expiry back.
pub(super) fn with_expiry<T>(
    trainer: &dyn TinkerTrainer,
    owner: &str,
    run: &str,
    checkpoint: &str,
    at: Option<i64>,
    save: impl FnOnce() -> std::result::Result<T, TinkerError>,
) -> std::result::Result<T, TinkerError> {
    let before = trainer.set_expiry(owner, run, checkpoint, at)?;
    save().inspect_err(|_| {
        if let Err(e) = trainer.set_expiry(owner, run, checkpoint, before) {
            tracing::warn!(error = %e, "could not restore a checkpoint's expiry after a failed save");
        }
    })
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
    let (dir, rel) = (state.checkpoints().dir().clone(), relative.clone());
    tokio::task::spawn_blocking(move || {
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
        dir.write_atomic(&rel, &refs).map(|_| ())
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, format!("writing the checkpoint failed: {e}")))??;
    state.checkpoints().upload(&relative).await?;
    match state.store().import_checkpoint(record, id, &relative).await {
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
pub async fn save_weights(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(raw): Json<Value>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let call = Sequenced::<SaveState>::read(raw)?;
    let (t, model) = owned_model(&state, &caller, &call.model_id)?;
    let checked = call.body.and_then(|body| Ok((ttl_expiry(body.ttl_seconds)?, body.path)));
    let (expires, name) = match checked {
        Ok(c) => c,
        Err(e) => return refused_in_order(&t, model, &call.model_id, call.seq_id, e),
    };
    let (id, owner) = (call.model_id.clone(), caller.entity.clone());
    let tinker = t.clone();
    ordered(&t, model, &call.model_id, call.seq_id, move || {
        let _run = tinker.runs.blocking_lock(&owner, &id);
        // Saving over a name replaces its expiry too (none without `ttl_seconds`).
        let checkpoint = format!("weights/{name}");
        let saved =
            with_expiry(&*trainer, &owner, &id, &checkpoint, expires, || trainer.save_state(&owner, &id, &name));
        match saved {
            Ok(()) => Outcome::Json(json!({ "path": format!("tinker://{id}/weights/{name}"), "type": "save_weights" })),
            Err(e) => failed(e),
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
pub async fn load_weights(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<LoadState>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let (source, name) = parse_state_path(&body.path).ok_or_else(|| {
        bad(format!("path {:?} is not a saved state: expected tinker://<model_id>/weights/<name>", body.path))
    })?;
    if let Some(model_id) = body.model_id.clone() {
        return load_into(state, caller, model_id, body, source, name).await;
    }
    let (Some(session_id), Some(seq)) = (body.session_id.clone(), body.model_seq_id) else {
        return Err(PreviewError(bad("load_weights needs model_id, or session_id and model_seq_id for a new model")));
    };
    let (from, StateInfo { base_model, rank, .. }) = readable_state(&state, &trainer, &caller.entity, &source, &name)
        .await
        .ok_or_else(|| ApiError::not_found("saved state"))?;
    reap(&state);
    let t = state.tinker().clone();
    if !t.touch_session(&caller.entity, &session_id) {
        return Err(ApiError::not_found("session").into());
    }
    let model_id = format!("{session_id}:train:{seq}");
    if let Some(m) = t.model(&caller.entity, &model_id) {
        return Ok(submitted(&m.create_request, &model_id));
    }
    let (request_id, promise) = register_model(&state, &caller.entity, &session_id, seq, &base_model, rank).await?;
    let (id, with_optimizer, entity) = (model_id.clone(), body.optimizer, caller.entity.clone());
    tokio::task::spawn_blocking(move || {
        let outcome = match trainer.load_state(&entity, &from, &id, &source, &name, with_optimizer) {
            Ok(()) => Outcome::Json(
                json!({ "model_id": id, "path": format!("tinker://{source}/weights/{name}"), "type": "load_weights" }),
            ),
            Err(e) => {
                t.models.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                failed(e)
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
    source: String,
    name: String,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let seq = body.seq_id.ok_or_else(|| bad("load_weights into a model needs its seq_id"))?;
    let (t, model) = owned_model(&state, &caller, &model_id)?;
    let Some((from, _)) = readable_state(&state, &trainer, &caller.entity, &source, &name).await else {
        // In order: the SDK has spent the seq_id.
        return refused_in_order(&t, model, &model_id, seq, format!("no saved state {:?} is readable", body.path));
    };
    let (id, with_optimizer, path) = (model_id.clone(), body.optimizer, body.path);
    let entry = model.clone();
    ordered(&t, model, &model_id, seq, move || {
        match trainer.load_state_into(&from, &id, &source, &name, with_optimizer) {
            Ok(()) => {
                // The losses summed so far were of gradients the load dropped.
                *entry.pending.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
                Outcome::Json(json!({ "path": path, "type": "load_weights" }))
            }
            Err(e) => failed(e),
        }
    })
}

#[derive(Deserialize)]
pub struct WeightsInfo {
    tinker_path: String,
}

/// `weights_info` (`RestClient.get_weights_info_by_tinker_path`): the base model and LoRA rank of
/// a saved state or of sampler weights saved by name, of the caller's entity.
pub async fn weights_info(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<WeightsInfo>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let path = body.tinker_path;
    let found = if let Some((source, name)) = parse_state_path(&path) {
        readable_state(&state, &trainer, &caller.entity, &source, &name).await.map(|(_, info)| info)
    } else if let Some((model, name)) = path.strip_prefix("tinker://").and_then(|r| r.split_once("/sampler_weights/")) {
        // Sampler weights are PEFT files with every projection (the untrained ones' B is 0),
        // and the output head's pair if it trained; the save noted which trained.
        samplers::readable(&state, &caller.entity, model, name).await?.map(|(_, s)| StateInfo {
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

/// The base model, rank and modules of `owner`'s saved state, read off the async threads.
async fn state_info(trainer: &Arc<dyn TinkerTrainer>, owner: &str, source: &str, name: &str) -> Option<StateInfo> {
    let (trainer, owner, source, name) = (trainer.clone(), owner.to_string(), source.to_string(), name.to_string());
    tokio::task::spawn_blocking(move || trainer.state_info(&owner, &source, &name)).await.ok().flatten()
}

/// Whose saved state `name` of `source` the caller may load, and what it is: the caller's own,
/// else one another entity published ([`super::publish`]).
async fn readable_state(
    state: &AppState,
    trainer: &Arc<dyn TinkerTrainer>,
    entity: &str,
    source: &str,
    name: &str,
) -> Option<(String, StateInfo)> {
    if let Some(info) = state_info(trainer, entity, source, name).await {
        return Some((entity.to_string(), info));
    }
    let owner = super::publish::publisher(state, entity, source, &format!("weights/{name}")).await?;
    let info = state_info(trainer, &owner, source, name).await?;
    Some((owner, info))
}

/// `tinker://{model_id}/weights/{name}` -> (model id, name).
fn parse_state_path(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("tinker://")?;
    let (model, name) = rest.split_once("/weights/")?;
    (!model.is_empty() && !name.is_empty() && !name.contains('/')).then(|| (model.to_string(), name.to_string()))
}

/// `DELETE training_runs/{model_id}/checkpoints/{kind}/{name}`: a saved training state, sampler
/// weights saved by name (their checkpoint of the model's tandem record goes too) or external
/// weights.
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

/// Deletes `entity`'s checkpoint `{kind}/{name}` of `run` and its expiry; whether it existed.
/// The caller holds the run's lock ([`super::state::RunLocks`]). An error (the store or the disk
/// did not answer) leaves the checkpoint listed and its expiry kept, so a sweep tries again.
pub(super) async fn delete_held(state: &AppState, entity: &str, run: &str, kind: &str, name: &str) -> Result<bool> {
    let trainer = trainer(state)?;
    let (owner, run, name) = (entity.to_string(), run.to_string(), name.to_string());
    let blocking =
        |what: tokio::task::JoinError| ApiError::new(ErrorKind::Internal, format!("deleting failed: {what}"));
    let gone = match kind {
        "weights" => {
            let (trainer, owner, run, name) = (trainer.clone(), owner.clone(), run.clone(), name.clone());
            tokio::task::spawn_blocking(move || trainer.delete_state(&owner, &run, &name))
                .await
                .map_err(blocking)?
                .map_err(tinker_error)?
        }
        "sampler_weights" => {
            let held = state.tinker().model(&owner, &run);
            let in_memory =
                held.as_ref().and_then(|m| m.samplers.lock().unwrap_or_else(|e| e.into_inner()).get(&name).cloned());
            let listed = {
                let (trainer, owner, run) = (trainer.clone(), owner.clone(), run.clone());
                tokio::task::spawn_blocking(move || trainer.saved_samplers(&owner, &run)).await.map_err(blocking)?
            };
            let listed = listed.into_iter().find(|s| s.name == name);
            let Some(saved) = in_memory.or(listed.clone()) else { return Ok(false) };
            // The checkpoint first: if the store does not answer, the name stays listed and the
            // sweep finds it again (forgotten first, a served checkpoint would be left unlisted).
            samplers::drop_checkpoint(state, &saved).await?;
            if let Some(m) = held {
                m.samplers.lock().unwrap_or_else(|e| e.into_inner()).remove(&name);
            }
            if listed.is_some() {
                let (trainer, owner, run, name) = (trainer.clone(), owner.clone(), run.clone(), name.clone());
                tokio::task::spawn_blocking(move || trainer.forget_sampler(&owner, &run, &name))
                    .await
                    .map_err(blocking)?
                    .map_err(tinker_error)?;
            }
            true
        }
        "external_weights" => {
            let (trainer, owner, run, name) = (trainer.clone(), owner.clone(), run.clone(), name.clone());
            tokio::task::spawn_blocking(move || trainer.delete_external(&owner, &run, &name))
                .await
                .map_err(blocking)?
                .map_err(tinker_error)?
        }
        _ => return Ok(false),
    };
    // A name saved again later starts without the old one's expiry (also cleared when the
    // checkpoint had gone another way: an expiry of nothing is only noise for the sweep).
    let checkpoint = format!("{kind}/{name}");
    tokio::task::spawn_blocking(move || trainer.set_expiry(&owner, &run, &checkpoint, None))
        .await
        .map_err(blocking)?
        .map_err(tinker_error)?;
    Ok(gone)
}

/// A trainer's error as the API's: the caller's mistake a 400, the rest a 500.
pub(super) fn tinker_error(e: TinkerError) -> ApiError {
    match e {
        TinkerError::User(m) => ApiError::new(ErrorKind::Validation, m),
        TinkerError::Server(m) => ApiError::new(ErrorKind::Internal, m),
    }
}
