//! `POST /v1/chat/completions`: parse the body, resolve the model, admit, validate against the
//! model (`generate::validate`, on a blocking thread), submit, then answer with one response or
//! an SSE stream.

use super::generate::{self, Validated};
use super::request::{self, ChatPlan};
use super::resolve::resolve;
use super::response::{Collected, Renderer};
use super::sse;
use crate::auth::Caller;
use crate::body::OpenAiJson;
use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::AppState;
use axum::extract::FromRequest;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use tandem_core::inference::InferEvent;
use tokio::sync::mpsc::UnboundedReceiver;

#[utoipa::path(
    post,
    operation_id = "create_chat_completion",
    path = "/v1/chat/completions",
    tag = "inference",
    summary = "Chat completion (vLLM's; streamed as server-sent events with `stream: true`)",
    request_body = crate::openapi::bodies::ChatCompletionBody,
    responses(
        (status = 200, description = "The completion, or its chunks as `text/event-stream`", content(
            (crate::openapi::bodies::ChatCompletionResponse = "application/json"),
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
    let plan = request::validate(&body, state.priority_scheduling())?;
    let run = start(&state, &caller, &headers, &plan).await?;
    let mut response = if plan.sampling.stream {
        sse::respond(run.renderer, run.events, run.permit)
    } else {
        let collected = collect(run.events, plan.sampling.n).await?;
        drop(run.permit);
        axum::Json(run.renderer.full(collected)).into_response()
    };
    super::tag_request_id(&mut response, "x-request-id", &run.request_id);
    Ok(response)
}

/// A chat request under way: its events, the renderer for them, and its admission permit
/// (held until the answer is sent).
pub(super) struct Run {
    pub renderer: Renderer,
    pub events: UnboundedReceiver<InferEvent>,
    pub permit: crate::limiter::Permit,
    pub request_id: String,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// The model name the response echoes.
    pub model: String,
}

/// Steps 3 to 7 of a chat request (docs/architecture.md): resolve the model, admit, validate
/// against the model on a blocking thread, and start generating. Shared with the fronts that
/// translate their bodies into a chat plan (Anthropic's Messages).
pub(super) async fn start(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    plan: &ChatPlan,
) -> Result<Run, ApiError> {
    let target = resolve(state, &caller.entity, plan.sampling.model.as_deref()).await?;
    // Admission comes before any rendering or tokenizing.
    let permit = super::admit(state, &caller.entity)?;
    if !target.model.has_capacity() {
        return Err(super::at_capacity());
    }
    let request_id = super::request_id(plan.sampling.request_id.as_deref(), headers);
    let draft = plan.draft(request_id.clone(), &caller.entity);
    let Validated { request: valid, tool_mode } =
        generate::validate_blocking(&target, draft, state.reasoning_parser()).await?;
    let prompt = valid.request().prompt.clone();
    let events = generate::start(&target, valid, &plan.sampling).await?;
    let renderer = Renderer::new(plan, &target.name, &request_id, prompt.clone(), echo_text(plan))
        .with_tools(tool_mode)
        .with_reasoning(state.reasoning_parser());
    Ok(Run { renderer, events, permit, request_id, prompt, model: target.name })
}

/// With `echo`, the last message's text is prepended when its role is the reply's role.
fn echo_text(plan: &ChatPlan) -> Option<String> {
    if !plan.echo {
        return None;
    }
    let last = plan.render.messages.last()?;
    (last.role == plan.role).then(|| last.text())
}

/// Waits for every choice to finish.
pub(super) async fn collect(mut rx: UnboundedReceiver<InferEvent>, n: usize) -> Result<Collected, ApiError> {
    let mut c = Collected::new(n);
    while !c.done() {
        match rx.recv().await {
            Some(InferEvent::Error(m)) => {
                return Err(ApiError::new(ErrorKind::Internal, format!("generation failed: {m}")))
            }
            Some(ev) => c.push(ev),
            None => return Err(ApiError::new(ErrorKind::Internal, "the inference engine stopped during generation")),
        }
    }
    Ok(c)
}
