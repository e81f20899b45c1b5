//! The OpenAI/vLLM-compatible area: `/v1/chat/completions` (also with a trailing slash),
//! `/v1/completions`, `/v1/responses` (and `GET`/`DELETE /v1/responses/{id}`), `/v1/models`, `/tokenize`, `/detokenize` and `/metrics`, with errors in the
//! OpenAI body shape; and Anthropic's `/v1/messages` (its key header and error shape), which runs
//! as a translated chat request.

mod beam;
mod chat;
pub(crate) mod completions;
mod generate;
pub mod lora;
mod messages;
mod nodes;
mod reasoning;
pub mod request;
pub(crate) mod resolve;
mod response;
mod responses;
mod sse;
mod tokenize;
pub(crate) mod tokenizer_files;
mod tools;
pub mod wire;

use crate::auth::{require_anthropic, require_openai, Caller};
use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::AppState;
use axum::extract::{Extension, State};
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Json;
use serde::Serialize;
use tandem_core::records::PageRequest;
use tandem_store::StoreError;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use resolve::{resolve, Target};

/// The 503 of a server that runs without an inference engine.
pub(crate) fn no_engine() -> ApiError {
    ApiError::new(ErrorKind::Unavailable, "this server has no inference engine")
}

pub fn router(state: AppState) -> OpenApiRouter<AppState> {
    // Anthropic's Messages API: its own key header and error shape.
    let anthropic = OpenApiRouter::new()
        .routes(routes!(messages::create))
        .routes(routes!(messages::count_tokens))
        .route_layer(from_fn_with_state(state.clone(), require_anthropic));
    OpenApiRouter::new()
        .routes(routes!(chat::create))
        .routes(routes!(completions::create))
        .routes(routes!(responses::create))
        .routes(routes!(responses::get, responses::delete))
        // vLLM accepts the trailing slash too; the same operation, documented once.
        .route("/v1/chat/completions/", post(chat::create))
        .routes(routes!(models))
        .routes(routes!(tokenize::tokenize))
        .routes(routes!(tokenize::detokenize))
        .routes(routes!(tokenizer_files::files))
        .routes(routes!(metrics))
        .routes(routes!(nodes::list))
        .routes(routes!(lora::load))
        .routes(routes!(lora::unload))
        .route_layer(from_fn_with_state(state, require_openai))
        .merge(anthropic)
}

/// Base models, the caller's runtime-loaded adapters, then the caller's trained models: each
/// model's latest alias and every step.
#[utoipa::path(
    get,
    operation_id = "list_served_models",
    path = "/v1/models",
    tag = "inference",
    summary = "Every model id this key can address",
    responses(
        (status = 200, body = ModelList),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::OpenAiErrorBody)
    ),
    security(("bearer" = []))
)]
async fn models(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<ModelList>, OpenAiError> {
    let mut data = Vec::new();
    for id in state.served_models() {
        data.push(ModelCard {
            id: id.clone(),
            object: "model",
            created: 0,
            owned_by: "tandem".into(),
            // vLLM puts the weights' path here; tandem never shows a server path to clients.
            root: id.clone(),
            parent: None,
            max_model_len: state.model(id).map(|m| m.info().context_len),
        });
    }
    // Adapters the caller loaded at run time, as vLLM lists LoRA modules (its `root` is the
    // path as the caller gave it).
    for (name, l) in state.loras().list(&caller.entity) {
        data.push(ModelCard {
            id: name,
            object: "model",
            created: l.created,
            owned_by: caller.entity.clone(),
            root: l.path,
            parent: Some(l.base),
            max_model_len: None,
        });
    }
    match trained_cards(&state, &caller.entity).await {
        Ok(cards) => data.extend(cards),
        // During a store outage: the names this node resolved before it, which go on serving
        // (`resolve::LastKnown`), so that clients listing models before they chat keep working.
        Err(StoreError::Unavailable(why)) => {
            tracing::debug!(error = %why, "the store is unavailable; listing the last known trained models");
            let last = state.last_known().names_of(&caller.entity);
            data.extend(last.into_iter().map(|(id, base)| ModelCard {
                root: id.clone(),
                id,
                object: "model",
                created: 0,
                owned_by: caller.entity.clone(),
                parent: Some(base),
                max_model_len: None,
            }));
        }
        Err(other) => return Err(ApiError::from(other).into()),
    }
    Ok(Json(ModelList { object: "list", data }))
}

/// The caller's trained models and each of their checkpoints, from the store.
async fn trained_cards(state: &AppState, entity: &str) -> Result<Vec<ModelCard>, StoreError> {
    let mut data = Vec::new();
    let mut page = PageRequest::first(100);
    loop {
        let models = state.store().list_models(entity, None, None, page).await?;
        for m in &models.items {
            let name = format!("wandb-artifact:///{}/{}/{}", m.entity, m.project, m.name);
            let card = |id: String, created_ms: i64| ModelCard {
                id,
                object: "model",
                created: created_ms.div_euclid(1000),
                owned_by: m.entity.clone(),
                root: name.clone(),
                parent: Some(m.base_model.clone()),
                max_model_len: None,
            };
            data.push(card(name.clone(), m.created_at));
            let mut cps = PageRequest::first(100);
            loop {
                let checkpoints = state.store().list_checkpoints(m.id, cps).await?;
                for c in &checkpoints.items {
                    data.push(card(format!("{name}:step{}", c.step), c.created_at));
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
    Ok(data)
}

/// `GET /v1/models`: the OpenAI list of model cards.
#[derive(Serialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    object: &'static str,
    data: Vec<ModelCard>,
}

/// One addressable model: a served base model, a model record (its latest checkpoint) or one
/// checkpoint (`name:stepN`). `created` is Unix seconds, as OpenAI's.
#[derive(Serialize, ToSchema)]
pub struct ModelCard {
    id: String,
    /// Always `model`.
    object: &'static str,
    created: i64,
    owned_by: String,
    root: String,
    /// The base model a trained model was created from.
    parent: Option<String>,
    /// The context length, for base models.
    max_model_len: Option<usize>,
}

#[utoipa::path(
    get,
    operation_id = "metrics",
    path = "/metrics",
    tag = "inference",
    summary = "Prometheus metrics: the engine's under vLLM's names, training, jobs and HTTP requests",
    responses(
        (status = 200, description = "OpenMetrics text when `Accept` asks for it (Prometheus does), else the classic text format 0.0.4", content_type = "text/plain", body = String),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::OpenAiErrorBody)
    ),
    security(("bearer" = []))
)]
async fn metrics(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: axum::http::HeaderMap,
) -> Result<impl IntoResponse, OpenAiError> {
    use crate::telemetry::{classic_text, wants_openmetrics, CLASSIC_CONTENT_TYPE, CONTENT_TYPE};
    let text = crate::telemetry::render(&state, &caller.entity).await?;
    let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
    Ok(if wants_openmetrics(accept) {
        ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text)
    } else {
        ([(axum::http::header::CONTENT_TYPE, CLASSIC_CONTENT_TYPE)], classic_text(&text))
    })
}

/// The entity's permit for an inference route (chat, tokenize, detokenize), or a 429 with
/// `Retry-After`: decided before any rendering, tokenizing or decoding.
pub(crate) fn admit(state: &AppState, entity: &str) -> Result<crate::limiter::Permit, ApiError> {
    state.limiter().acquire(entity).ok_or_else(|| {
        ApiError::new(ErrorKind::TooManyRequests, "too many concurrent requests for this API key's entity")
            .with_retry_after(1)
    })
}

/// Under overload, shed before reading and parsing the body: when no served model can take
/// another request, this answer is the same whatever the body says, and a burst of them must be
/// answered at once (R2), not after parsing hundreds of bodies.
pub(crate) fn shed(state: &AppState) -> Result<(), ApiError> {
    if state.models().iter().any(|m| m.has_capacity()) {
        return Ok(());
    }
    Err(if state.models().is_empty() { no_engine() } else { at_capacity() })
}

/// Every queue this request could join is full: the engine's own refusal, before asking it.
pub(crate) fn at_capacity() -> ApiError {
    generate::submit_error(tandem_core::inference::SubmitError::Overloaded)
}

/// Names the request's id in a response header (`x-request-id`; Anthropic's `request-id`).
pub(crate) fn tag_request_id(response: &mut axum::response::Response, header: &'static str, id: &str) {
    if let Ok(v) = axum::http::HeaderValue::from_str(id) {
        response.headers_mut().insert(header, v);
    }
}

/// The request's id: the body's `request_id`, else the `x-request-id` header, else a new one.
pub(crate) fn request_id(from_body: Option<&str>, headers: &axum::http::HeaderMap) -> String {
    from_body
        .map(str::to_string)
        .or_else(|| headers.get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_string))
        .unwrap_or_else(|| tandem_core::new_id().simple().to_string())
}
