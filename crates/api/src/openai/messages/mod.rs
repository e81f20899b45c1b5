//! `POST /v1/messages`, Anthropic's Messages API as vLLM serves it: the body is translated into
//! the chat request it means ([`translate`]), validated and run exactly as a chat request
//! (`chat::start`), and the chat result is written back as Anthropic's `message` or stream
//! events ([`reply`]). Keys come as `x-api-key` or a bearer token; errors take Anthropic's shape.

mod reply;
mod translate;

use super::chat;
use super::request;
use super::sse;
use crate::auth::Caller;
use crate::body::OpenAiJson;
use crate::error::{AnthropicError, ApiError};
use crate::AppState;
use axum::extract::{Extension, FromRequest, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// A chat-side error, renamed to the Anthropic field it came from.
fn anthropic_field(e: ApiError) -> ApiError {
    request::front_field(e, &translate::RENAMED)
}

#[utoipa::path(
    post,
    operation_id = "create_message",
    path = "/v1/messages",
    tag = "inference",
    summary = "Anthropic Messages API (as vLLM serves it; streamed as Anthropic's events with `stream: true`)",
    request_body = crate::openapi::bodies::MessagesBody,
    responses(
        (status = 200, description = "The message, or its events as `text/event-stream`", content(
            (crate::openapi::bodies::MessageResponseBody = "application/json"),
            (String = "text/event-stream")
        )),
        crate::openapi::bodies::AnthropicErrors
    ),
    security(("bearer" = []), ("x-api-key" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    request: axum::extract::Request,
) -> Result<Response, AnthropicError> {
    super::shed(&state)?;
    let OpenAiJson(body) = OpenAiJson::from_request(request, &state).await.map_err(|e| e.0)?;
    let Some(obj) = body.as_object() else {
        return Err(ApiError::bad_param("body", "the body must be a JSON object").into());
    };
    let chat_body = translate::to_chat(obj)?;
    let plan = request::validate(&chat_body, state.priority_scheduling()).map_err(anthropic_field)?;
    request::one_choice(&plan)?;
    let with_ids = plan.sampling.return_token_ids;
    let with_logprobs = plan.logprobs;
    let run = chat::start(&state, &caller, &headers, &plan).await.map_err(anthropic_field)?;
    let mut response = if plan.sampling.stream {
        let stream = reply::Stream::new(run.renderer, &run.request_id, &run.model, run.prompt, with_ids, with_logprobs);
        sse::respond(stream, run.events, run.permit)
    } else {
        let collected = chat::collect(run.events, 1).await?;
        drop(run.permit);
        axum::Json(reply::message(run.renderer.full(collected), &run.request_id)).into_response()
    };
    super::tag_request_id(&mut response, "request-id", &run.request_id);
    Ok(response)
}

#[utoipa::path(
    post,
    operation_id = "count_message_tokens",
    path = "/v1/messages/count_tokens",
    tag = "inference",
    summary = "The input tokens a Messages request would take (Anthropic's count_tokens)",
    request_body = crate::openapi::bodies::MessagesBody,
    responses(
        (status = 200, description = "`{\"input_tokens\": N}`", body = Object),
        crate::openapi::bodies::AnthropicErrors
    ),
    security(("bearer" = []), ("x-api-key" = []))
)]
pub async fn count_tokens(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    request: axum::extract::Request,
) -> Result<axum::Json<Value>, AnthropicError> {
    let OpenAiJson(body) = OpenAiJson::from_request(request, &state).await.map_err(|e| e.0)?;
    let Some(obj) = body.as_object() else {
        return Err(ApiError::bad_param("body", "the body must be a JSON object").into());
    };
    // Counting needs no output length; the translation wants one.
    let mut obj = obj.clone();
    obj.entry("max_tokens").or_insert(Value::from(1));
    let chat_body = translate::to_chat(&obj)?;
    let mut plan = request::validate(&chat_body, true).map_err(anthropic_field)?;
    plan.sampling.max_tokens = Some(1);
    let target = super::resolve(&state, &caller.entity, plan.sampling.model.as_deref()).await?;
    let _permit = super::admit(&state, &caller.entity)?;
    // The prompt exactly as a message would render it (tools described, template applied).
    let draft = plan.draft(tandem_core::new_id().simple().to_string(), &caller.entity);
    let valid = super::generate::validate_blocking(&target, draft, state.reasoning_parser()).await?;
    Ok(axum::Json(serde_json::json!({"input_tokens": valid.request.request().prompt.len()})))
}
