//! What a process does as one node of several sharing a database and a blob store: the HTTP
//! surface its role answers, and what it does with the other nodes' notices.

use crate::config::Role;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tandem_jobs::Worker;
use tandem_store::{Checkpoints, NodeBeat, Notice, Store, NODE_BEAT_MS};
use tokio::sync::Notify;

/// The paths a trainer node answers: it serves no API, but is watched like any node.
const TRAINER_PATHS: [&str; 4] = ["/health", "/v1/health", "/v1/system-check", "/metrics"];

/// Middleware for `--role trainer`: every other path is a 404 in the API's error shape, saying
/// where the API is. The Tinker routes are the exception: a trainer holds the Tinker sessions
/// placed on it, and api nodes forward their calls to it.
pub async fn trainer_only(request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if TRAINER_PATHS.contains(&path) || path.starts_with("/api/v1/") {
        return next.run(request).await;
    }
    let body = serde_json::json!({
        "detail": "this is a trainer node (--role trainer): it serves /health, /v1/system-check and /metrics only; send API requests to an api node"
    });
    (axum::http::StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

/// Acts on the other nodes' notices until the store stops sending them: a queued job wakes the
/// local trainer (when this node trains), a recorded checkpoint is fetched into the local cache
/// (when this node serves), so the first request for it does not wait for the download.
pub async fn follow_notices(store: Arc<dyn Store>, role: Role, jobs: Arc<Notify>, checkpoints: Checkpoints) {
    let mut notices = match store.notices().await {
        Ok(Some(rx)) => rx,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(error = %e, "could not listen for other nodes' notices; polling only");
            return;
        }
    };
    while let Some(notice) = notices.recv().await {
        match notice {
            Notice::JobQueued if role.trains() => jobs.notify_one(),
            Notice::CheckpointRecorded { path } if role.serves_api() && checkpoints.remote().is_some() => {
                let checkpoints = checkpoints.clone();
                tokio::spawn(async move {
                    match checkpoints.local_dir(&path).await {
                        Ok(Some(_)) => tracing::debug!(checkpoint = %path, "new checkpoint cached"),
                        Ok(None) => tracing::debug!(checkpoint = %path, "new checkpoint's files are gone already"),
                        Err(e) => tracing::warn!(checkpoint = %path, error = %e, "could not cache a new checkpoint"),
                    }
                });
            }
            _ => {}
        }
    }
}

/// Beats in the node registry every [`NODE_BEAT_MS`] until the process ends, and follows an
/// operator's drain: the trainer stops claiming and `/health` says `draining`.
pub async fn beat(store: Arc<dyn Store>, mut beat: NodeBeat, worker: Option<Worker>, draining: Arc<AtomicBool>) {
    let mut every = tokio::time::interval(std::time::Duration::from_millis(NODE_BEAT_MS as u64));
    loop {
        every.tick().await;
        beat.busy = worker.as_ref().is_some_and(|w| w.heartbeat().busy());
        match store.node_heartbeat(&beat).await {
            Ok(drain) => {
                if draining.swap(drain, Ordering::SeqCst) != drain {
                    tracing::warn!(node = %beat.name, drain, "an operator changed this node's drain");
                    if let Some(w) = &worker {
                        w.set_draining(drain);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not beat in the node registry"),
        }
    }
}
