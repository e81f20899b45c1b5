//! What a process does as one node of several sharing a database and a blob store: the HTTP
//! surface its role answers, and what it does with the other nodes' notices.

use crate::config::Role;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tandem_store::{Checkpoints, Notice, Store};
use tokio::sync::Notify;

/// The paths a trainer node answers: it serves no API, but is watched like any node.
const TRAINER_PATHS: [&str; 4] = ["/health", "/v1/health", "/v1/system-check", "/metrics"];

/// Middleware for `--role trainer`: every other path is a 404 in the API's error shape, saying
/// where the API is.
pub async fn trainer_only(request: Request, next: Next) -> Response {
    if TRAINER_PATHS.contains(&request.uri().path()) {
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
