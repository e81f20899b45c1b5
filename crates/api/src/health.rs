//! `GET /health` (and `/v1/health`): no auth; 200 while the store answers and the inference
//! engine makes progress, else 503.

use crate::{AppState, HEALTH_TIMEOUT};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Json;
use axum::Router;
use serde_json::{json, Value};

pub fn router() -> Router<AppState> {
    Router::new().route("/health", get(health)).route("/v1/health", get(health))
}

async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
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
