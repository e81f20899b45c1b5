//! Checkpoints that expire: `ttl_seconds` on `save_weights`, `save_weights_for_sampler` and
//! `save_weights_external`, and `PUT training_runs/{run}/checkpoints/{kind}/{name}/ttl` (the SDK's
//! `set_checkpoint_ttl_from_tinker_path`, `tinker checkpoint set-ttl`). The cookbook saves its
//! periodic checkpoints with a week's TTL and its rolling ones with two hours', counting on the
//! service to clean up after it. The trainer keeps each checkpoint's expiry beside the run's
//! states; listings show it as `expires_at`; a sweep at start and every minute deletes what has
//! expired exactly as a `DELETE` of it would (sampler weights' checkpoints included).

use super::routes::{bad, trainer, Result};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorKind};
use crate::AppState;
use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tandem_core::tinker::TinkerError;

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
pub async fn set_ttl(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((run, kind, name)): Path<(String, String, String)>,
    Json(body): Json<Ttl>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let at = expires_at(body.ttl_seconds)?;
    let _run = state.tinker().runs.lock(&caller.entity, &run).await;
    let (owner, checkpoint) = (caller.entity.clone(), format!("{kind}/{name}"));
    let exists = match kind.as_str() {
        "sampler_weights" => match super::samplers::find(&state, &caller.entity, &run, &name).await? {
            Some(saved) => {
                // An ephemeral save lives in the session's memory only: given a TTL it is kept
                // in the run's list, as a save with `ttl_seconds` is, so the sweep finds it after
                // the session ends.
                let (trainer, owner, run) = (trainer.clone(), owner.clone(), run.clone());
                let kept = tokio::task::spawn_blocking(move || {
                    if at.is_some() && !trainer.saved_samplers(&owner, &run).iter().any(|s| s.name == saved.name) {
                        trainer.may_note_sampler(&owner, &run, &saved.name)?;
                        trainer.note_sampler(&owner, &run, saved)?;
                    }
                    Ok::<_, TinkerError>(())
                })
                .await
                .map_err(|e| ApiError::new(ErrorKind::Internal, format!("setting the ttl failed: {e}")))?;
                kept.map_err(super::weights::tinker_error)?;
                true
            }
            None => false,
        },
        "weights" | "external_weights" => {
            let (trainer, owner, run, name, kind) =
                (trainer.clone(), owner.clone(), run.clone(), name.clone(), kind.clone());
            tokio::task::spawn_blocking(move || match kind.as_str() {
                "weights" => trainer.list_states(&owner, &run).iter().any(|(n, _, _)| *n == name),
                _ => trainer.external_files(&owner, &run, &name).is_some(),
            })
            .await
            .unwrap_or(false)
        }
        _ => false,
    };
    if !exists {
        return Err(ApiError::not_found("checkpoint").into());
    }
    tokio::task::spawn_blocking(move || trainer.set_expiry(&owner, &run, &checkpoint, at))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("setting the ttl failed: {e}")))?
        .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    Ok(Json(json!({})))
}

/// Deletes every checkpoint whose expiry has passed, as `DELETE` would; how many went. Each is
/// checked again under its run's lock just before it goes: a TTL renewed or removed, or a name
/// saved again, since the sweep read the lists is kept.
pub async fn sweep(state: &AppState) -> usize {
    let Some(trainer) = state.tinker_trainer() else { return 0 };
    let now = now_ms();
    let due = {
        let trainer = trainer.clone();
        tokio::task::spawn_blocking(move || trainer.expired(now)).await.unwrap_or_default()
    };
    let mut deleted = 0;
    for x in due {
        let Some((kind, name)) = x.checkpoint.split_once('/') else { continue };
        let _run = state.tinker().runs.lock(&x.owner, &x.model_id).await;
        let still_due = {
            let (trainer, owner, run, checkpoint) =
                (trainer.clone(), x.owner.clone(), x.model_id.clone(), x.checkpoint.clone());
            tokio::task::spawn_blocking(move || trainer.expiries(&owner, &run).get(&checkpoint).copied())
                .await
                .ok()
                .flatten()
                .is_some_and(|at| at <= now_ms())
        };
        if !still_due {
            continue;
        }
        match super::weights::delete_held(state, &x.owner, &x.model_id, kind, name).await {
            Ok(true) => deleted += 1,
            // Already gone another way: `delete_held` cleared its expiry.
            Ok(false) => {}
            // Kept, with its expiry, for the next sweep (a store outage must not lose it).
            Err(e) => {
                tracing::warn!(error = %e.0.message, checkpoint = %x.checkpoint, "could not delete an expired checkpoint")
            }
        }
    }
    if deleted > 0 {
        tracing::info!(deleted, "deleted expired Tinker checkpoints");
    }
    deleted
}

/// Sweeps at start and every [`SWEEP_EVERY`] while the process serves Tinker; ends the sessions
/// whose client stopped (idle, or past its missed heartbeats) every [`REAP_EVERY`], so their
/// models' memory and places go back without waiting for another entity's next session.
pub fn spawn_sweeper(state: AppState) {
    if state.tinker_trainer().is_none() {
        return;
    }
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
