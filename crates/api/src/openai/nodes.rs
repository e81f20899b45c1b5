//! `GET /v1/nodes`: the processes serving and training with this store, from the node registry
//! (what `tandem nodes list` prints), for the dashboard's server page. Any valid key reads it: it
//! holds operators' facts (names, roles, liveness), nothing of any entity.

use crate::error::OpenAiError;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Serialize, ToSchema)]
pub struct NodeList {
    /// Always `list`.
    object: &'static str,
    data: Vec<NodeView>,
}

/// One node as the registry knows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeView {
    /// Unique per process start.
    id: String,
    /// `--node-name`, or host:port.
    name: String,
    /// `all`, `api` or `trainer`.
    role: String,
    version: String,
    /// Unix seconds.
    started_at: i64,
    /// Unix seconds of the last heartbeat (nodes beat every 5 s).
    heartbeat_at: i64,
    /// It beat in the last 15 s.
    alive: bool,
    /// It holds a training job.
    busy: bool,
    /// An operator is draining it (`tandem nodes drain`).
    draining: bool,
}

/// The nodes that beat in the last hour, by name.
#[utoipa::path(
    get,
    operation_id = "list_nodes",
    path = "/v1/nodes",
    tag = "health",
    summary = "The cluster's nodes from the registry",
    responses(
        (status = 200, body = NodeList),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::OpenAiErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<AppState>) -> Result<Json<NodeList>, OpenAiError> {
    let nodes = state.store().list_nodes().await?;
    let data = nodes
        .into_iter()
        .map(|n| NodeView {
            id: n.id,
            name: n.name,
            role: n.role,
            version: n.version,
            started_at: n.started_at / 1000,
            heartbeat_at: n.heartbeat_at / 1000,
            alive: n.alive,
            busy: n.busy,
            draining: n.draining,
        })
        .collect();
    Ok(Json(NodeList { object: "list", data }))
}
