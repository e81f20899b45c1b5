//! Sampler weights saved by name (and this session's ephemeral ones): found in the held model's
//! memory or in the catalog (`tandem-tinker`, rows of the store), and live only while the
//! checkpoint at their step is still the one they saved (a step number is reused once the
//! latest checkpoint is deleted, e.g. through `/v1/preview`).

use super::routes::tinker_error;
use crate::error::ApiError;
use crate::AppState;
use std::collections::HashSet;
use tandem_core::records::PageRequest;
use tandem_core::tinker::{CheckpointKey, CheckpointKind, SavedSampler};
use tandem_store::StoreError;

/// Whether the checkpoint `s` names is still the one it saved.
pub(super) async fn live(state: &AppState, s: &SavedSampler) -> Result<bool, ApiError> {
    match state.store().get_checkpoint(s.record_id, s.step).await {
        Ok(cp) => Ok(cp.id == s.checkpoint_id),
        Err(StoreError::NotFound) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Every save of `run` by `entity` (memory first, then the kept list), by name.
pub(super) async fn all(state: &AppState, entity: &str, run: &str) -> Result<Vec<SavedSampler>, ApiError> {
    let kept = state.catalog().samplers(entity, run).await.map_err(tinker_error)?;
    let mut by_name: std::collections::BTreeMap<String, SavedSampler> =
        kept.into_iter().map(|s| (s.name.clone(), s)).collect();
    if let Some(m) = state.tinker().model_named(entity, run) {
        let held = m.samplers.lock().unwrap_or_else(|e| e.into_inner());
        by_name.extend(held.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    Ok(by_name.into_values().collect())
}

/// The live save `name` of `run` that `entity` may sample: its own, else one another entity
/// published ([`super::publish`]); with its owner.
pub(super) async fn readable(
    state: &AppState,
    entity: &str,
    run: &str,
    name: &str,
) -> Result<Option<(String, SavedSampler)>, ApiError> {
    if let Some(s) = find(state, entity, run, name).await? {
        return Ok(Some((entity.to_string(), s)));
    }
    let Some(owner) = state.catalog().publisher(entity, run, &format!("sampler_weights/{name}")).await else {
        return Ok(None);
    };
    Ok(find(state, &owner, run, name).await?.map(|s| (owner, s)))
}

/// The live save `name` of `run` by `entity`.
pub(super) async fn find(
    state: &AppState,
    entity: &str,
    run: &str,
    name: &str,
) -> Result<Option<SavedSampler>, ApiError> {
    let held = state
        .tinker()
        .model_named(entity, run)
        .and_then(|m| m.samplers.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned());
    let found = match held {
        Some(s) => Some(s),
        None => {
            let key = CheckpointKey::new(run, CheckpointKind::SamplerWeights, name);
            let kept = state.catalog().readable(entity, &key, false).await.map_err(tinker_error)?;
            kept.as_ref().and_then(tandem_tinker::catalog::sampler_of)
        }
    };
    match found {
        Some(s) if live(state, &s).await? => Ok(Some(s)),
        _ => Ok(None),
    }
}

/// The live ones of `saves`: one paged read of each record's checkpoints, not one per save.
pub(super) async fn only_live(state: &AppState, saves: Vec<SavedSampler>) -> Result<Vec<SavedSampler>, ApiError> {
    let records: HashSet<uuid::Uuid> = saves.iter().map(|s| s.record_id).collect();
    let mut ids = HashSet::new();
    for record in records {
        let mut page = PageRequest::first(500);
        loop {
            let p = state.store().list_checkpoints(record, page).await?;
            ids.extend(p.items.iter().map(|c| c.id));
            match (p.has_more, p.items.last()) {
                (true, Some(last)) => page.after = Some(last.id),
                _ => break,
            }
        }
    }
    Ok(saves.into_iter().filter(|s| ids.contains(&s.checkpoint_id)).collect())
}

/// Deletes the checkpoint `s` saved, if it is still that one (the engine forgets the adapter
/// and the files go, as the preview API deletes).
pub(super) async fn drop_checkpoint(state: &AppState, s: &SavedSampler) -> Result<(), ApiError> {
    if !live(state, s).await? {
        return Ok(());
    }
    let deleted = state.store().delete_checkpoints(s.record_id, &[s.step]).await?;
    crate::preview::checkpoints::remove_files(state, &deleted.deleted).await;
    Ok(())
}

/// The front's side of deleting sampler weights (`tandem_tinker::sweep`): their checkpoint of the
/// run's tandem record, with its files and the engine's copy.
pub(super) struct Checkpoints<'a>(pub &'a AppState);

impl tandem_tinker::sweep::SamplerCheckpoints for Checkpoints<'_> {
    async fn drop_checkpoint(&self, saved: &SavedSampler) -> Result<(), tandem_core::tinker::TinkerError> {
        drop_checkpoint(self.0, saved).await.map_err(|e| match e.kind {
            crate::error::ErrorKind::Unavailable => tandem_core::tinker::TinkerError::Unavailable(e.message),
            _ => tandem_core::tinker::TinkerError::Server(e.message),
        })
    }
}
