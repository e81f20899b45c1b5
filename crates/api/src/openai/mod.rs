//! The OpenAI/vLLM-compatible area: `/v1/chat/completions` (also with a trailing slash),
//! `/v1/models`, `/tokenize`, `/detokenize` and `/metrics`. Errors use the OpenAI body shape.

mod beam;
mod chat;
mod reasoning;
pub mod request;
mod resolve;
mod response;
mod tokenize;
mod tools;

use crate::auth::{require_openai, Caller};
use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::views::timestamp;
use crate::AppState;
use axum::extract::{Extension, State};
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Json;
use axum::Router;
use serde_json::{json, Value};
use tandem_core::records::PageRequest;

pub use resolve::{resolve, Target};

/// The inference engine, or a 503 when this server runs without one.
pub(crate) fn engine(state: &AppState) -> Result<tandem_core::inference::SharedBackend, ApiError> {
    state.backend().cloned().ok_or_else(|| ApiError::new(ErrorKind::Unavailable, "this server has no inference engine"))
}

pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(chat::create))
        .route("/v1/chat/completions/", post(chat::create))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/metrics", get(metrics))
        .route_layer(from_fn_with_state(state, require_openai))
}

/// Base models, then the caller's trained models: each model's latest alias and every step.
async fn models(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, OpenAiError> {
    let mut data = Vec::new();
    let infos = state.backend().map(|b| b.models()).unwrap_or_default();
    for (i, id) in state.served_models().iter().enumerate() {
        let info = infos.get(i);
        data.push(json!({
            "id": id, "object": "model", "created": 0, "owned_by": "tandem",
            // vLLM puts the weights' path here; tandem never shows a server path to clients.
            "root": id, "parent": null,
            "max_model_len": info.map(|m| m.context_len),
        }));
    }
    let mut page = PageRequest::first(100);
    loop {
        let models = state.store().list_models(&caller.entity, None, page).await?;
        for m in &models.items {
            let name = format!("wandb-artifact:///{}/{}/{}", m.entity, m.project, m.name);
            data.push(json!({ "id": name, "object": "model", "created": timestamp(m.created_at), "owned_by": m.entity,
                              "root": name, "parent": m.base_model, "max_model_len": null }));
            let mut cps = PageRequest::first(100);
            loop {
                let checkpoints = state.store().list_checkpoints(m.id, cps).await?;
                for c in &checkpoints.items {
                    data.push(json!({ "id": format!("{name}:step{}", c.step), "object": "model", "created": timestamp(c.created_at),
                                      "owned_by": m.entity, "root": name, "parent": m.base_model, "max_model_len": null }));
                }
                match (checkpoints.has_more, checkpoints.items.last()) {
                    (true, Some(last)) => cps.after = Some(last.id),
                    _ => break,
                }
            }
        }
        match (models.has_more, models.items.last()) {
            (true, Some(last)) => page.after = Some(last.id),
            _ => break,
        }
    }
    Ok(Json(json!({ "object": "list", "data": data })))
}

async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, OpenAiError> {
    let backend = engine(&state)?;
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], backend.metrics_text()))
}

/// The entity's permit for an inference route (chat, tokenize, detokenize), or a 429 with
/// `Retry-After`: decided before any rendering, tokenizing or decoding.
pub(crate) fn admit(state: &AppState, entity: &str) -> Result<crate::limiter::Permit, ApiError> {
    state.limiter().acquire(entity).ok_or_else(|| {
        ApiError::new(ErrorKind::TooManyRequests, "too many concurrent requests for this API key's entity")
            .with_retry_after(1)
    })
}
