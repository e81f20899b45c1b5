//! OpenAI's Responses API as vLLM serves it: `POST /v1/responses` translates the body (with the
//! stored conversation of `previous_response_id`) into the chat request it means
//! ([`translate`]), runs it as chat (`chat::start`), and writes the result back as a `response`
//! object or the Responses stream events ([`reply`]). With `store` (the default) the response and
//! its conversation are kept in the store, scoped to the entity, for `GET`/`DELETE
//! /v1/responses/{id}` and for chaining.

mod reply;
mod translate;

use super::chat;
use super::request;
use super::sse;
use crate::auth::Caller;
use crate::body::OpenAiJson;
use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::AppState;
use axum::extract::{Extension, FromRequest, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tandem_store::{StoreError, StoredResponse};

/// Most bytes of conversation and settings one stored response may hold (with
/// `tandem_store::MAX_STORED_RESPONSES` per entity, an entity stores at most about 1 GiB).
const MAX_STORED_BYTES: usize = 1 << 20;

/// A chat-side error, renamed to the Responses field it came from.
fn responses_field(e: ApiError) -> ApiError {
    request::front_field(e, &translate::RENAMED)
}

fn not_found(id: &str, field: Option<&str>) -> ApiError {
    ApiError {
        param: field.map(str::to_string),
        ..ApiError::new(ErrorKind::NotFound, format!("Response with id '{id}' not found."))
    }
}

/// A store answer about the response `id`: missing (or another entity's) is a 404.
fn found<T>(r: Result<T, StoreError>, id: &str) -> Result<T, ApiError> {
    r.map_err(|e| match e {
        StoreError::NotFound => not_found(id, None),
        e => e.into(),
    })
}

#[utoipa::path(
    post,
    operation_id = "create_response",
    path = "/v1/responses",
    tag = "inference",
    summary = "OpenAI Responses API (as vLLM serves it; streamed as the Responses events with `stream: true`)",
    request_body = crate::openapi::bodies::ResponsesBody,
    responses(
        (status = 200, description = "The response, or its events as `text/event-stream`", content(
            (crate::openapi::bodies::ResponseObjectBody = "application/json"),
            (String = "text/event-stream")
        )),
        crate::openapi::bodies::InferenceErrors
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    request: axum::extract::Request,
) -> Result<Response, OpenAiError> {
    super::shed(&state)?;
    let OpenAiJson(body) = OpenAiJson::from_request(request, &state).await?;
    let Some(obj) = body.as_object() else {
        return Err(ApiError::bad_param("body", "the body must be a JSON object").into());
    };
    let history = match obj.get("previous_response_id").filter(|v| !v.is_null()) {
        None => Vec::new(),
        Some(Value::String(id)) => match state.store().get_response(&caller.entity, id).await {
            Ok(previous) => previous.conversation.as_array().cloned().unwrap_or_default(),
            Err(StoreError::NotFound) => return Err(not_found(id, Some("previous_response_id")).into()),
            Err(e) => return Err(ApiError::from(e).into()),
        },
        Some(_) => {
            return Err(ApiError::bad_param("previous_response_id", "previous_response_id must be a string").into())
        }
    };
    let t = translate::to_chat(obj, &history)?;
    if t.store {
        // Checked before any work: the output adds at most the context's worth of text.
        let size = t.chat["messages"].to_string().len() + Value::Object(t.settings.clone()).to_string().len();
        if size > MAX_STORED_BYTES {
            let why = format!(
                "a stored response holds at most {MAX_STORED_BYTES} bytes of conversation and settings, this one \
                 {size}: send `store: false`, or start a new conversation"
            );
            return Err(ApiError::bad_param("store", why).into());
        }
    }
    let plan = request::validate(&t.chat, state.priority_scheduling()).map_err(responses_field)?;
    request::one_choice(&plan)?;
    let with_ids = plan.sampling.return_token_ids;
    let run = chat::start(&state, &caller, &headers, &plan).await.map_err(responses_field)?;
    let head = reply::Head::new(&run.model, t.settings, with_ids, t.logprobs);
    // What a later request continues: the history, this input, and (added at the end) the output.
    let mut conversation = history;
    conversation.extend(t.input);
    let keeper = t.store.then(|| Keeper { state: state.clone(), entity: caller.entity.clone(), id: head.id.clone() });
    let mut response = if plan.sampling.stream {
        let store: Option<reply::Store> = keeper.map(|k| {
            Box::new(move |object: Value, assistant: Value| {
                let mut conversation = conversation;
                conversation.push(assistant);
                Box::pin(async move { k.keep(object, conversation).await })
                    as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
            }) as reply::Store
        });
        let stream = reply::Stream::new(run.renderer, head, run.prompt, store);
        sse::respond(stream, run.events, run.permit)
    } else {
        let collected = chat::collect(run.events, 1).await?;
        drop(run.permit);
        let (object, assistant) = reply::response(&head, run.renderer.full(collected));
        if let Some(k) = keeper {
            conversation.push(assistant);
            k.keep(object.clone(), conversation).await;
        }
        Json(object).into_response()
    };
    super::tag_request_id(&mut response, "x-request-id", &run.request_id);
    Ok(response)
}

/// Stores a finished response for its entity.
struct Keeper {
    state: AppState,
    entity: String,
    id: String,
}

impl Keeper {
    /// A failed write is logged, not returned: the client already has (or is getting) the
    /// response, and only a later `previous_response_id` or `GET` will miss it.
    async fn keep(self, body: Value, conversation: Vec<Value>) {
        let stored =
            StoredResponse { id: self.id, entity: self.entity, body, conversation: Value::Array(conversation) };
        if let Err(e) = self.state.store().put_response(&stored).await {
            tracing::warn!(error = %e, response_id = %stored.id, "could not store a response");
        }
    }
}

#[utoipa::path(
    get,
    operation_id = "get_response",
    path = "/v1/responses/{response_id}",
    tag = "inference",
    summary = "A stored response",
    params(("response_id" = String, Path, description = "`resp_...`")),
    responses(
        (status = 200, body = crate::openapi::bodies::ResponseObjectBody),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::OpenAiErrorBody),
        (status = 404, description = "No such stored response for this key's entity", body = crate::openapi::bodies::OpenAiErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, OpenAiError> {
    let r = state.store().get_response(&caller.entity, &id).await;
    Ok(Json(found(r, &id)?.body))
}

#[utoipa::path(
    delete,
    operation_id = "delete_response",
    path = "/v1/responses/{response_id}",
    tag = "inference",
    summary = "Delete a stored response",
    params(("response_id" = String, Path, description = "`resp_...`")),
    responses(
        (status = 200, description = "`{id, object: \"response\", deleted: true}`", body = Object),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::OpenAiErrorBody),
        (status = 404, description = "No such stored response for this key's entity", body = crate::openapi::bodies::OpenAiErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, OpenAiError> {
    found(state.store().delete_response(&caller.entity, &id).await, &id)?;
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})))
}
