//! `GET /health` (and `/v1/health`): no auth; 200 while the store answers and the inference
//! engine makes progress, else 503. `GET /v1/system-check` (W&B's): each part's state.
//!
//! `/health` answers from the store's last probe ([`StoreProbe`]) rather than waiting for the
//! store in the request: the probe runs on its own task at most once a second, so a probe
//! flood costs the store one ping a second and a saturated store pool does not hold `/health`.

use crate::{AppState, HEALTH_TIMEOUT};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The store's last ping result and when it was taken; a refresh runs on its own task.
#[derive(Default)]
pub struct StoreProbe {
    last: std::sync::Mutex<Option<(Instant, Result<(), String>)>>,
    running: std::sync::atomic::AtomicBool,
    done: tokio::sync::Notify,
}

impl StoreProbe {
    /// Results younger than this are answered without a new ping.
    const FRESH: std::time::Duration = std::time::Duration::from_secs(1);
    /// Results younger than this are answered at once while a new ping runs; an older one (or
    /// none) waits for that ping (which times out after `HEALTH_TIMEOUT`).
    const USABLE: std::time::Duration = std::time::Duration::from_secs(5);

    fn last(&self) -> Option<(Instant, Result<(), String>)> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The store's state as of at most `USABLE` ago.
    pub async fn status(self: &Arc<Self>, state: &AppState) -> Result<(), String> {
        let last = self.last();
        if let Some((at, r)) = &last {
            if at.elapsed() < Self::FRESH {
                return r.clone();
            }
        }
        let waiter = self.done.notified();
        self.refresh(state);
        match last {
            Some((at, r)) if at.elapsed() < Self::USABLE => r,
            _ => {
                let _ = tokio::time::timeout(HEALTH_TIMEOUT + Self::FRESH, waiter).await;
                self.last().map(|(_, r)| r).unwrap_or_else(|| Err("store timed out".into()))
            }
        }
    }

    /// Starts a ping unless one runs.
    fn refresh(self: &Arc<Self>, state: &AppState) {
        use std::sync::atomic::Ordering;
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let (me, state) = (self.clone(), state.clone());
        tokio::spawn(async move {
            let r = ping(&state, "store").await;
            *me.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), r));
            me.running.store(false, Ordering::Release);
            me.done.notify_waiters();
        });
    }
}

/// One round trip to the store within `HEALTH_TIMEOUT`; the error names `what` failed.
async fn ping(state: &AppState, what: &str) -> Result<(), String> {
    match tokio::time::timeout(HEALTH_TIMEOUT, state.store().ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "{what} is not answering");
            Err(format!("{what} is not answering"))
        }
        Err(_) => Err(format!("{what} timed out")),
    }
}

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
    let (db_ok, database) = part(t, ping(&state, "the database").await);
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
    match state.probe().status(&state).await {
        Ok(()) => (StatusCode::OK, Json(json!({ "status": "ok" }))),
        Err(detail) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "unavailable", "detail": detail }))),
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
