//! `GET /health` (and `/v1/health`): no auth; 200 while the store answers and the inference
//! engine makes progress, else 503. `GET /v1/system-check` (W&B's): each part's state.

use crate::{AppState, HEALTH_TIMEOUT};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};
use std::time::Instant;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(health)).routes(routes!(v1_health)).routes(routes!(system_check))
}

/// One part's check, as W&B's system-check reports its queues: `success`, `duration` (seconds),
/// `error` (null when it succeeded).
fn part(started: Instant, result: Result<(), String>) -> (bool, Value) {
    let ok = result.is_ok();
    (ok, json!({ "success": ok, "duration": started.elapsed().as_secs_f64(), "error": result.err() }))
}

/// The api (reachable, so true), the database (a round trip), the training queue (the worker's
/// heartbeat) and the inference engine (making progress); 200 when every part is ok, else 503
/// with the failing parts' `error`. No auth, as W&B's; nothing in it is any entity's.
#[utoipa::path(
    get,
    operation_id = "system_check",
    path = "/v1/system-check",
    tag = "health",
    summary = "Each part's state (W&B's system check)",
    responses(
        (status = 200, body = crate::openapi::bodies::SystemCheckBody),
        (status = 503, description = "A part is failing", body = crate::openapi::bodies::SystemCheckBody)
    )
)]
async fn system_check(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let t = Instant::now();
    let db = match tokio::time::timeout(HEALTH_TIMEOUT, state.store().ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "system-check: store is not answering");
            Err("the database is not answering".to_string())
        }
        Err(_) => Err("the database timed out".to_string()),
    };
    let (db_ok, database) = part(t, db);
    let t = Instant::now();
    let queue = match state.training_heartbeat() {
        Some(h) => h.check(tandem_store::now_ms()),
        // An api node of a cluster: the queue is served when a trainer node is alive.
        None => cluster_trainers(&state).await,
    };
    let (queue_ok, training_queue) = part(t, queue);
    let t = Instant::now();
    let engine = match state.backend() {
        Some(b) if b.healthy() => Ok(()),
        Some(_) => Err("the inference engine is not making progress".to_string()),
        None => Err("no inference engine runs in this process".to_string()),
    };
    let (engine_ok, inference) = part(t, engine);
    let ok = db_ok && queue_ok && engine_ok;
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (
        status,
        Json(json!({ "api": true, "database": database, "training_queue": training_queue, "inference": inference })),
    )
}

#[utoipa::path(
    get,
    operation_id = "health",
    path = "/health",
    tag = "health",
    summary = "200 while the store answers and the engine makes progress",
    responses(
        (status = 200, body = crate::openapi::bodies::HealthBody),
        (status = 503, body = crate::openapi::bodies::HealthBody)
    )
)]
async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    if state.draining() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "draining", "detail": "an operator is draining this node (tandem nodes drain)" })),
        );
    }
    if state.backend().is_some_and(|b| !b.healthy()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "unavailable", "detail": "the inference engine is not making progress" })),
        );
    }
    match tokio::time::timeout(HEALTH_TIMEOUT, state.store().ping()).await {
        Ok(Ok(())) => (StatusCode::OK, Json(json!({ "status": "ok" }))),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "health: store is not answering");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "unavailable", "detail": "store is not answering" })),
            )
        }
        Err(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "unavailable", "detail": "store timed out" })))
        }
    }
}

/// `Ok(())` when the node registry has a live trainer that is not draining.
async fn cluster_trainers(state: &AppState) -> Result<(), String> {
    match tokio::time::timeout(HEALTH_TIMEOUT, state.store().list_nodes()).await {
        Ok(Ok(nodes)) => {
            let serving = nodes.iter().any(|n| n.alive && !n.draining && matches!(n.role.as_str(), "trainer" | "all"));
            if serving {
                Ok(())
            } else {
                Err("no trainer node of the cluster is alive and taking jobs".to_string())
            }
        }
        Ok(Err(_)) | Err(_) => Err("the node registry could not be read".to_string()),
    }
}

/// `/v1/health`: the same probe.
#[utoipa::path(
    get,
    operation_id = "v1_health",
    path = "/v1/health",
    tag = "health",
    summary = "The same as /health",
    responses(
        (status = 200, body = crate::openapi::bodies::HealthBody),
        (status = 503, body = crate::openapi::bodies::HealthBody)
    )
)]
async fn v1_health(state: State<AppState>) -> (StatusCode, Json<Value>) {
    health(state).await
}
