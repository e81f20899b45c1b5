//! Checkpoints that expire: `ttl_seconds` on `save_weights`, `save_weights_for_sampler` and
//! `save_weights_external`, and `PUT training_runs/{run}/checkpoints/{kind}/{name}/ttl` (the SDK's
//! `set_checkpoint_ttl_from_tinker_path`, `tinker checkpoint set-ttl`). The cookbook saves its
//! periodic checkpoints with a week's TTL and its rolling ones with two hours', counting on the
//! service to clean up after it. The trainer keeps each checkpoint's expiry beside the run's
//! states; listings show it as `expires_at`; a sweep at start and every minute deletes what has
//! expired exactly as a `DELETE` of it would (sampler weights' checkpoints included).

use super::routes::{bad, trainer, Result};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    match ttl_seconds {
        None => Ok(None),
        Some(s) if TTL_SECONDS.contains(&s) => Ok(Some(now_ms() + s * 1000)),
        Some(s) => {
            Err(bad(format!("ttl_seconds {s}: expected 3600 (an hour) to 315360000 (ten years), or null")).into())
        }
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
    let exists = match kind.as_str() {
        "sampler_weights" => super::samplers::find(&state, &caller.entity, &run, &name).await?.is_some(),
        "weights" | "external_weights" => {
            let (trainer, owner, run, name, kind) =
                (trainer.clone(), caller.entity.clone(), run.clone(), name.clone(), kind.clone());
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
    let (owner, checkpoint) = (caller.entity.clone(), format!("{kind}/{name}"));
    tokio::task::spawn_blocking(move || trainer.set_expiry(&owner, &run, &checkpoint, at))
        .await
        .map_err(|e| ApiError::new(crate::error::ErrorKind::Internal, format!("setting the ttl failed: {e}")))?
        .map_err(|e| ApiError::new(crate::error::ErrorKind::Internal, e.to_string()))?;
    Ok(Json(json!({})))
}

/// Deletes every checkpoint whose expiry has passed, as `DELETE` would; how many went.
pub async fn sweep(state: &AppState) -> usize {
    let Some(trainer) = state.tinker_trainer() else { return 0 };
    let now = now_ms();
    let due = tokio::task::spawn_blocking(move || trainer.expired(now)).await.unwrap_or_default();
    let mut deleted = 0;
    for x in due {
        let Some((kind, name)) = x.checkpoint.split_once('/') else { continue };
        match super::weights::delete(state, &x.owner, &x.model_id, kind, name).await {
            Ok(true) => deleted += 1,
            // Already gone another way: only its expiry is left to clear.
            Ok(false) => {
                if let Some(trainer) = state.tinker_trainer() {
                    let _ = tokio::task::spawn_blocking(move || {
                        trainer.set_expiry(&x.owner, &x.model_id, &x.checkpoint, None)
                    })
                    .await;
                }
            }
            // Tried again at the next sweep (a store outage must not lose the expiry).
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

/// Sweeps at start and every [`SWEEP_EVERY`] while the process serves Tinker.
pub fn spawn_sweeper(state: AppState) {
    if state.tinker_trainer().is_none() {
        return;
    }
    tokio::spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            sweep(&state).await;
        }
    });
}

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
