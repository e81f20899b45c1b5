//! Deleting a run's checkpoints: one at a client's `DELETE`, and every one whose TTL has passed
//! (the sweep every node runs at start and every minute). Both remove a checkpoint the same way:
//! its catalog row, its files and, for sampler weights, the checkpoint of the run's tandem record
//! they are (through the front's [`SamplerCheckpoints`], which also makes the engine forget it).

use crate::catalog::{sampler_of, Catalog};
use crate::registry::Registry;
use std::future::Future;
use tandem_core::tinker::{CheckpointKey, CheckpointKind, SavedSampler, TinkerError};

/// What deleting sampler weights needs of the front: the checkpoint of the run's tandem record
/// removed, with its files and any served copy (a no-op when it is no longer that checkpoint).
pub trait SamplerCheckpoints: Send + Sync {
    fn drop_checkpoint(&self, saved: &SavedSampler) -> impl Future<Output = Result<(), TinkerError>> + Send;
}

/// Deletes `entity`'s checkpoint `{kind}/{name}` of `run` with its files; whether it existed. The
/// caller holds the run's lock (`Registry::runs`). An error (the store or the blob store did not
/// answer) leaves the checkpoint listed and its expiry kept, so a sweep tries again. Any node can:
/// the catalog is the store's.
pub async fn delete<S>(
    catalog: &Catalog,
    registry: &Registry<S>,
    samplers: &impl SamplerCheckpoints,
    entity: &str,
    run: &str,
    kind: &str,
    name: &str,
) -> Result<bool, TinkerError> {
    let Some(kind) = CheckpointKind::parse(kind) else { return Ok(false) };
    let key = CheckpointKey::new(run, kind, name);
    if kind != CheckpointKind::SamplerWeights {
        return Ok(catalog.delete(entity, &key).await?.is_some());
    }
    let held = registry.model_named(entity, run);
    let in_memory = held.as_ref().and_then(|m| m.samplers.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned());
    let listed = catalog.readable(entity, &key, false).await?;
    let listed = listed.as_ref().and_then(sampler_of);
    let Some(saved) = in_memory.or(listed.clone()) else { return Ok(false) };
    // The checkpoint first: if the store does not answer, the name stays listed and the sweep
    // finds it again (forgotten first, a served checkpoint would be left unlisted).
    samplers.drop_checkpoint(&saved).await?;
    if let Some(m) = held {
        m.samplers.lock().unwrap_or_else(|e| e.into_inner()).remove(name);
    }
    if listed.is_some() {
        catalog.delete(entity, &key).await?;
    }
    Ok(true)
}

/// Deletes every checkpoint whose expiry is at or before `now` (Unix ms), as [`delete`] does; how
/// many went. Each is checked again under its run's lock just before it goes: a TTL renewed or
/// removed, or a name saved again, since the sweep read the catalog is kept. Nodes sweeping at
/// once delete each checkpoint once (what another removed first is a no-op).
pub async fn sweep<S>(
    catalog: &Catalog,
    registry: &Registry<S>,
    samplers: &impl SamplerCheckpoints,
    now: i64,
) -> usize {
    let due = match catalog.expired(now).await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the expired Tinker checkpoints; the next sweep will");
            return 0;
        }
    };
    let mut deleted = 0;
    for x in due {
        let (owner, run) = (&x.owner, &x.key.model_id);
        let _run = registry.runs.lock(owner, run).await;
        let current = catalog.readable(owner, &x.key, false).await.ok().flatten();
        if current.and_then(|e| e.expires_at).is_none_or(|at| at > now) {
            continue;
        }
        match delete(catalog, registry, samplers, owner, run, x.key.kind.as_str(), &x.key.name).await {
            Ok(true) => deleted += 1,
            Ok(false) => {}
            // Kept, with its expiry, for the next sweep (a store outage must not lose it).
            Err(e) => {
                tracing::warn!(error = %e, checkpoint = x.key.checkpoint(), "could not delete an expired checkpoint")
            }
        }
    }
    if deleted > 0 {
        tracing::info!(deleted, "deleted expired Tinker checkpoints");
    }
    deleted
}
