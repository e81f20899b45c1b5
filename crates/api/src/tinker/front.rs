//! The Tinker routes of a node in a cluster (a store other nodes share): every call of a session
//! runs on the one node that holds the session, whichever node the load balancer sent it to.
//!
//! A session's models, futures and sampling sessions are its host's memory, and its host is a
//! node that trains (`--role trainer` or `all`). The store's `tinker_sessions` row names the host;
//! every id a call carries names its session (`core::tinker::session_of`), so any node finds the
//! host of any call, and forwards the request there unchanged (the host authenticates it again).
//! A host that stopped beating (`kill -9`, a lost machine) is replaced: the first node to see it
//! moves the row to the least-loaded live trainer (compare and swap, so nodes racing agree), and
//! that node takes the session over ([`super::resume`]). No affinity is asked of the balancer.
//!
//! The RestClient's routes (runs, checkpoints, TTLs, publishing, downloads) read the catalog in
//! the store and answer on any node; they pass through.

use super::answer::tinker_error;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorKind};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;
use tandem_core::tinker::{session_of, TinkerError};
use tandem_store::{NodeRecord, TinkerSession};
use tandem_tinker::catalog::store_error;

/// Set on a forwarded request (the sending node's id): the receiving node runs it or refuses it,
/// never forwards it again.
pub const FORWARDED: &str = "x-tandem-forwarded";

/// The HTTP client that forwards calls to their session's host.
pub struct Front {
    client: reqwest::Client,
}

impl Default for Front {
    fn default() -> Self {
        // A host that is not there fails fast (the caller is told to retry while the registry
        // catches up); a held `retrieve_future` answers within 20 s, a submitted call at once.
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(120))
            .build()
            .expect("an HTTP client with timeouts only");
        Front { client }
    }
}

/// Which node answers a Tinker route.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// This node (the catalog's routes, configuration).
    Here,
    /// A new session: the node it is placed on.
    Place,
    /// A call of this session: its host.
    Session(String),
}

/// The routes whose state is a session's (paths as nested under `/api/v1`).
const SESSION_ROUTES: [&str; 12] = [
    "/session_heartbeat",
    "/create_model",
    "/get_info",
    "/forward_backward",
    "/optim_step",
    "/retrieve_future",
    "/create_sampling_session",
    "/asample",
    "/save_weights_for_sampler",
    "/save_weights",
    "/load_weights",
    "/save_weights_external",
];

/// The ids a JSON body may carry (any one names the session).
#[derive(Deserialize, Default)]
struct Ids {
    session_id: Option<Value>,
    model_id: Option<Value>,
    sampling_session_id: Option<Value>,
    request_id: Option<Value>,
}

/// A `ForwardBackwardRequest`'s model id alone (prost skips the datums without decoding them).
#[derive(Clone, PartialEq, prost::Message)]
struct ModelOnly {
    #[prost(string, tag = "1")]
    model_id: String,
}

/// Where a request goes, from its path and body; a body that names no session runs here (its
/// handler refuses it in the SDK's shape).
fn route_of(path: &str, body: &[u8]) -> Route {
    if path == "/create_session" {
        return Route::Place;
    }
    let id = if let Some(id) = path.strip_prefix("/sessions/").and_then(|p| p.strip_suffix("/finish")) {
        Some(id.to_string())
    } else if let Some(id) = path.strip_prefix("/samplers/") {
        Some(id.to_string())
    } else if path == "/forward_backward" {
        <ModelOnly as prost::Message>::decode(body).ok().map(|m| m.model_id)
    } else if SESSION_ROUTES.contains(&path) {
        let ids: Ids = serde_json::from_slice(body).unwrap_or_default();
        [ids.session_id, ids.model_id, ids.sampling_session_id, ids.request_id]
            .into_iter()
            .flatten()
            .find_map(|v| v.as_str().map(str::to_string))
    } else {
        return Route::Here;
    };
    match id.as_deref().and_then(session_of) {
        Some(session) => Route::Session(session.to_string()),
        None => Route::Here,
    }
}

/// What a session route's call names that is not there.
fn missing(path: &str) -> &'static str {
    match path {
        "/retrieve_future" => "request",
        "/asample" => "sampling session",
        p if p.starts_with("/samplers/") => "sampling session",
        "/create_model" | "/create_sampling_session" | "/session_heartbeat" => "session",
        p if p.starts_with("/sessions/") => "session",
        _ => "model",
    }
}

fn unavailable(message: impl Into<String>) -> Response {
    tinker_error(TinkerError::Unavailable(message.into())).into_preview_response().into_response()
}

/// Middleware on the Tinker routes (inside authentication: the caller is known).
pub async fn route(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    request: Request,
    next: Next,
) -> Response {
    let Some(me) = state.node_id().map(str::to_string) else { return next.run(request).await };
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, state.limits().max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            let e = ApiError::new(ErrorKind::PayloadTooLarge, "the body is larger than this server accepts");
            return e.into_preview_response().into_response();
        }
    };
    // Only a node that holds sessions is forwarded to; elsewhere the header is a client's, ignored.
    let forwarded = parts.headers.contains_key(FORWARDED) && state.tinker_trainer().is_some();
    let here = |parts, bytes: Bytes| next.run(Request::from_parts(parts, bytes.into()));
    match route_of(parts.uri.path(), &bytes) {
        Route::Here => here(parts, bytes).await,
        Route::Place if forwarded || state.tinker_trainer().is_some() => here(parts, bytes).await,
        Route::Place => match async { place(&state, &nodes(&state).await?).await }.await {
            Ok(Some(node)) => forward(&state, &me, &node, parts, bytes).await,
            Ok(None) => unavailable("no trainer node is alive to hold a Tinker session; retry when one is"),
            Err(e) => tinker_error(e).into_preview_response().into_response(),
        },
        Route::Session(session) => {
            let row = match state.store().tinker_session(&session).await {
                Ok(row) => row,
                Err(e) => return ApiError::from(e).into_preview_response().into_response(),
            };
            // Another entity's session is the same 404 as none: a node that holds sessions answers
            // it as its handlers do; one that does not says what is missing itself.
            let Some(row) = row.filter(|r| r.entity == caller.entity) else {
                if state.tinker_trainer().is_some() {
                    return here(parts, bytes).await;
                }
                return ApiError::not_found(missing(parts.uri.path())).into_preview_response().into_response();
            };
            if row.node == me {
                if let Err(e) = super::resume::hold(&state, &row).await {
                    return tinker_error(e).into_preview_response().into_response();
                }
                return here(parts, bytes).await;
            }
            if forwarded {
                // The session moved while this request travelled: the client sends it again.
                return unavailable("this Tinker session moved to another node; retry");
            }
            match host_of(&state, &me, &row).await {
                Ok(Host::Here) => match super::resume::hold(&state, &row).await {
                    Ok(()) => here(parts, bytes).await,
                    Err(e) => tinker_error(e).into_preview_response().into_response(),
                },
                Ok(Host::Node(node)) => forward(&state, &me, &node, parts, bytes).await,
                Err(e) => tinker_error(e).into_preview_response().into_response(),
            }
        }
    }
}

/// Nodes that can hold a session: alive, not draining, training, reachable.
fn hosts(nodes: &[NodeRecord]) -> impl Iterator<Item = &NodeRecord> {
    nodes.iter().filter(|n| n.alive && !n.draining && (n.role == "trainer" || n.role == "all") && !n.address.is_empty())
}

/// The store's nodes.
async fn nodes(state: &AppState) -> Result<Vec<NodeRecord>, TinkerError> {
    state.store().list_nodes().await.map_err(|e| store_error(e, "reading the node registry"))
}

/// Of `nodes`, the live host holding the fewest sessions.
async fn place(state: &AppState, nodes: &[NodeRecord]) -> Result<Option<NodeRecord>, TinkerError> {
    let counts = state.store().tinker_session_counts().await.map_err(|e| store_error(e, "reading the sessions"))?;
    let load = |n: &NodeRecord| counts.iter().find(|(id, _)| *id == n.id).map_or(0, |(_, c)| *c);
    Ok(hosts(nodes).min_by_key(|n| load(n)).cloned())
}

enum Host {
    Here,
    Node(NodeRecord),
}

/// Where session `row` runs now: its host while that node beats; otherwise the session is moved
/// to a live trainer first (one node wins a race; the others follow the row it wrote).
async fn host_of(state: &AppState, me: &str, row: &TinkerSession) -> Result<Host, TinkerError> {
    let store = state.store();
    let failed = |e| store_error(e, "moving the session");
    let mut row = row.clone();
    for _ in 0..3 {
        let nodes = nodes(state).await?;
        if let Some(n) = nodes.iter().find(|n| n.id == row.node && n.alive) {
            return Ok(if n.id == me { Host::Here } else { Host::Node(n.clone()) });
        }
        let Some(to) = place(state, &nodes).await? else {
            return Err(TinkerError::Unavailable(
                "the node holding this Tinker session stopped and no trainer node is alive to take it over; retry"
                    .into(),
            ));
        };
        if store.tinker_session_move(&row.id, &row.node, &to.id).await.map_err(failed)? {
            tracing::warn!(session = %row.id, from = %row.node, to = %to.id, "a Tinker session's node stopped; moved");
            return Ok(if to.id == me { Host::Here } else { Host::Node(to) });
        }
        match store.tinker_session(&row.id).await.map_err(failed)? {
            Some(now) => row = now,
            None => return Err(TinkerError::NotFound("session not found".into())),
        }
    }
    Err(TinkerError::Unavailable("this Tinker session is moving between nodes; retry".into()))
}

/// Sends the request to `node` as it came, and its answer back as the node gave it.
async fn forward(
    state: &AppState,
    me: &str,
    node: &NodeRecord,
    parts: axum::http::request::Parts,
    bytes: Bytes,
) -> Response {
    // The Tinker router is nested under /api/v1, which its requests no longer carry.
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let target = format!("{}/api/v1{path}", node.address.trim_end_matches('/'));
    let mut headers = parts.headers.clone();
    for h in [header::HOST, header::CONTENT_LENGTH, header::CONNECTION, header::TRANSFER_ENCODING] {
        headers.remove(h);
    }
    headers.insert(FORWARDED, HeaderValue::from_str(me).unwrap_or(HeaderValue::from_static("node")));
    let sent = state.front().client.request(parts.method.clone(), &target).headers(headers).body(bytes).send().await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(e) => {
            // Killed moments ago, it still looks alive for up to three beats (15 s): the SDK
            // retries a submitted call's 503 ten times, honouring Retry-After, so 1 + 3 s each
            // outlasts that.
            tracing::warn!(node = %node.name, error = %e, "a Tinker session's node did not answer");
            // The SDK polls a future again at once after a 5xx: a pause here keeps a client
            // waiting out a failover from looping on this node.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let e = ApiError::new(
                ErrorKind::Unavailable,
                format!("the node holding this Tinker session ({}) does not answer; retry", node.name),
            );
            return e.with_retry_after(3).into_preview_response().into_response();
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut out = Response::builder().status(status);
    for h in [header::CONTENT_TYPE, header::RETRY_AFTER] {
        if let Some(v) = answer.headers().get(h.as_str()).and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()) {
            out = out.header(h, v);
        }
    }
    match answer.bytes().await {
        Ok(body) => out.body(axum::body::Body::from(body)).unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()),
        Err(e) => unavailable(format!("the node holding this Tinker session stopped mid-answer ({e}); retry")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn every_session_call_is_routed_by_the_id_it_carries() {
        let s = |id: &str| Route::Session(id.to_string());
        assert_eq!(route_of("/create_session", b"{}"), Route::Place);
        assert_eq!(route_of("/client/config", b"{}"), Route::Here);
        assert_eq!(route_of("/training_runs/tandem-a:train:0", b""), Route::Here, "the catalog's: any node");
        assert_eq!(route_of("/sessions/tandem-a/finish", b""), s("tandem-a"));
        assert_eq!(route_of("/samplers/tandem-a:sample:2", b""), s("tandem-a"));
        assert_eq!(route_of("/create_model", br#"{"session_id": "tandem-a", "model_seq_id": 0}"#), s("tandem-a"));
        assert_eq!(route_of("/optim_step", br#"{"model_id": "tandem-b:train:1", "seq_id": 3}"#), s("tandem-b"));
        assert_eq!(route_of("/asample", br#"{"sampling_session_id": "tandem-c:sample:0"}"#), s("tandem-c"));
        assert_eq!(route_of("/retrieve_future", br#"{"request_id": "tandem-d:req:ff"}"#), s("tandem-d"));
        assert_eq!(route_of("/retrieve_future", br#"{"request_id": 7}"#), Route::Here, "refused by its handler");
        assert_eq!(route_of("/optim_step", b"not json"), Route::Here);
        let fb = ModelOnly { model_id: "tandem-e:train:0".into() }.encode_to_vec();
        let mut body = fb.clone();
        body.extend_from_slice(&[0x10, 0x05]); // seq_id 5: skipped
        assert_eq!(route_of("/forward_backward", &body), s("tandem-e"));
        assert_eq!(route_of("/forward_backward", &[0xff, 0xff]), Route::Here);
    }
}
