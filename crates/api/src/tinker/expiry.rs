//! Checkpoints that expire: `ttl_seconds` on `save_weights`, `save_weights_for_sampler` and
//! `save_weights_external`, and `PUT training_runs/{run}/checkpoints/{kind}/{name}/ttl` (the SDK's
//! `set_checkpoint_ttl_from_tinker_path`, `tinker checkpoint set-ttl`). The cookbook saves its
//! periodic checkpoints with a week's TTL and its rolling ones with two hours', counting on the
//! service to clean up after it. The catalog (`tandem-tinker`, rows of the store) keeps each
//! checkpoint's expiry; listings show it as `expires_at`; a sweep at start and every minute deletes what has
//! expired exactly as a `DELETE` of it would (sampler weights' checkpoints included).

use super::routes::{bad, tinker_error, Result, TinkerJson};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tandem_core::tinker::{CheckpointKey, CheckpointKind};

/// How often the sweep looks for expired checkpoints.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Tinker's TTL bounds: an hour to ten years.
const TTL_SECONDS: std::ops::RangeInclusive<i64> = 3600..=10 * 365 * 86_400;

/// Milliseconds since the epoch.
pub(super) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// When a checkpoint saved now with `ttl_seconds` expires (ms since the epoch; `None`: never),
/// or a 422 outside Tinker's bounds.
pub(super) fn expires_at(ttl_seconds: Option<i64>) -> Result<Option<i64>> {
    ttl_expiry(ttl_seconds).map_err(|e| bad(e).into())
}

/// [`expires_at`]'s rule, its refusal as text (a training call fails its future with it).
pub(super) fn ttl_expiry(ttl_seconds: Option<i64>) -> std::result::Result<Option<i64>, String> {
    match ttl_seconds {
        None => Ok(None),
        Some(s) if TTL_SECONDS.contains(&s) => Ok(Some(now_ms() + s * 1000)),
        Some(s) => Err(format!("ttl_seconds {s}: expected 3600 (an hour) to 315360000 (ten years), or null")),
    }
}

#[derive(Deserialize)]
pub struct Ttl {
    #[serde(default)]
    ttl_seconds: Option<i64>,
}

/// `PUT training_runs/{run}/checkpoints/{kind}/{name}/ttl`: the checkpoint now expires
/// `ttl_seconds` from now, or with `null` never.
#[utoipa::path(
    put,
    operation_id = "tinker_set_checkpoint_ttl",
    path = "/training_runs/{run}/checkpoints/{kind}/{name}/ttl",
    tag = "tinker",
    summary = "Sets or clears a checkpoint's TTL",
    request_body = crate::openapi::tinker::TinkerTtl,
    params(crate::openapi::tinker::TinkerCheckpointPath),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn set_ttl(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((run, kind, name)): Path<(String, String, String)>,
    TinkerJson(body): TinkerJson<Ttl>,
) -> Result<Json<Value>> {
    let at = expires_at(body.ttl_seconds)?;
    let _run = state.tinker().runs.lock(&caller.entity, &run).await;
    let key =
        CheckpointKey::of_run(&run, &format!("{kind}/{name}")).ok_or_else(|| ApiError::not_found("checkpoint"))?;
    if key.kind == CheckpointKind::SamplerWeights {
        if super::samplers::find(&state, &caller.entity, &run, &name).await?.is_none() {
            return Err(ApiError::not_found("checkpoint").into());
        }
        if state.catalog().readable(&caller.entity, &key, false).await.map_err(tinker_error)?.is_none() {
            // An ephemeral save lives in the session's memory only: given a TTL it is kept in
            // the catalog, as a save with `ttl_seconds` is, so the sweep finds it after the
            // session ends; without one it lives with its session, as it did.
            if at.is_some() {
                keep_ephemeral(&state, &caller.entity, &run, &name, at).await?;
            }
            return Ok(Json(json!({})));
        }
    }
    if !state.catalog().set_expiry(&caller.entity, &key, at).await.map_err(tinker_error)? {
        return Err(ApiError::not_found("checkpoint").into());
    }
    Ok(Json(json!({})))
}

/// Keeps an ephemeral save (in the session's memory only) in the catalog with `expires`; a
/// no-op for a save the catalog has already. The caller holds the run's lock.
pub(super) async fn keep_ephemeral(
    state: &AppState,
    entity: &str,
    run: &str,
    name: &str,
    expires: Option<i64>,
) -> Result<()> {
    let key = CheckpointKey::new(run, CheckpointKind::SamplerWeights, name);
    if state.catalog().readable(entity, &key, false).await.map_err(tinker_error)?.is_some() {
        return Ok(());
    }
    let held = state.tinker().model_named(entity, run);
    let saved = held.and_then(|m| m.samplers.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned());
    let Some(saved) = saved else { return Ok(()) };
    state.catalog().sampler_room(entity, run, name).await.map_err(tinker_error)?;
    state.catalog().note_sampler(entity, run, &saved, expires).await.map_err(tinker_error)?;
    Ok(())
}

/// Deletes every checkpoint whose expiry has passed, as `DELETE` would
/// (`tandem_tinker::sweep`); how many went.
pub async fn sweep(state: &AppState) -> usize {
    tandem_tinker::sweep::sweep(state.catalog(), state.tinker(), &super::samplers::Checkpoints(state), now_ms()).await
}

/// Sweeps at start and every [`SWEEP_EVERY`]; ends the sessions
/// whose client stopped (idle, or past its missed heartbeats) every [`REAP_EVERY`], so their
/// models' memory and places go back without waiting for another entity's next session.
///
/// Every node runs it (the catalog is the store's, so a cluster without trainers still sweeps);
/// nodes sweeping at once delete each checkpoint once: the catalog's delete and the checkpoint's
/// are both no-ops for what another node removed first.
pub fn spawn_sweeper(state: AppState) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(REAP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sweep: Option<tokio::time::Instant> = None;
        loop {
            every.tick().await;
            super::routes::reap(&state);
            if last_sweep.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
                last_sweep = Some(tokio::time::Instant::now());
                sweep(&state).await;
                super::resume::sweep_orphans(&state).await;
            }
        }
    });
}

/// How often sessions whose client stopped are ended.
const REAP_EVERY: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_bounded_as_tinker_bounds_them() {
        assert_eq!(expires_at(None).ok(), Some(None));
        let before = now_ms();
        let at = expires_at(Some(3600)).ok().flatten().unwrap();
        assert!((before + 3_600_000..=now_ms() + 3_600_000).contains(&at));
        for bad in [59, 3599, 10 * 365 * 86_400 + 1, i64::MAX, -1] {
            assert!(expires_at(Some(bad)).is_err(), "{bad}");
        }
    }
}
