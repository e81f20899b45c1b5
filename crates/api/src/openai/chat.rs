//! `POST /v1/chat/completions`: parse the body, resolve the model, admit, validate against the
//! model (`generate::validate`, on a blocking thread), submit, then answer with one response or
//! an SSE stream.

use super::beam;
use super::generate::{self, submit_error, Validated};
use super::request::{self, ChatPlan};
use super::resolve::resolve;
use super::response::{Collected, Renderer};
use crate::auth::Caller;
use crate::body::OpenAiJson;
use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::FromRequest;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use std::convert::Infallible;
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
    // Under overload, shed before reading and parsing the body: when no served model can take
    // another request, this answer is the same whatever the body says, and a burst of them must
    // be answered at once (R2), not after parsing hundreds of bodies.
    if !state.models().iter().any(|m| m.has_capacity()) {
        let refusal = if state.models().is_empty() { super::no_engine() } else { at_capacity() };
        return Err(refusal.into());
    }
    let OpenAiJson(body) = OpenAiJson::from_request(request, &state).await?;
    let plan = request::validate(&body, state.priority_scheduling())?;
    let target = resolve(&state, &caller.entity, plan.model.as_deref()).await?;
    // Admission comes before any rendering or tokenizing.
    let permit = super::admit(&state, &caller.entity)?;
    if !target.model.has_capacity() {
        return Err(at_capacity().into());
    }
    let request_id = plan
        .request_id
        .clone()
        .or_else(|| headers.get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_string))
        .unwrap_or_else(|| tandem_core::new_id().simple().to_string());
    let draft = plan.draft(request_id.clone(), &caller.entity);
    let Validated { request: valid, tool_mode } =
        generate::validate_blocking(&target, draft, state.reasoning_parser()).await?;
    let prompt = valid.request().prompt.clone();
    let rx = match plan.beam {
        // The search runs to the end first; its result then flows through the same renderers.
        Some(length_penalty) => {
            let job = beam::BeamJob {
                width: plan.n,
                length_penalty,
                top_logprobs: plan.params.logprobs.unwrap_or(0),
                eos: target.model.info().eos_token_id,
            };
            let events = beam::run(&target.model, valid, job).await?;
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            for ev in events {
                let _ = tx.send(ev);
            }
            rx
        }
        None => target.model.submit(valid).map_err(submit_error)?,
    };
    let echo = echo_text(&plan);
    let renderer = Renderer::new(&plan, &target.name, &request_id, prompt, echo)
        .with_tools(tool_mode)
        .with_reasoning(state.reasoning_parser());
    let mut response = if plan.stream {
        stream(renderer, rx, permit)
    } else {
        let collected = collect(rx, plan.n).await?;
        drop(permit);
        axum::Json(renderer.full(collected)).into_response()
    };
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    Ok(response)
}

/// Every queue this request could join is full: the engine's own refusal, before asking it.
fn at_capacity() -> ApiError {
    submit_error(tandem_core::inference::SubmitError::Overloaded)
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
async fn collect(mut rx: UnboundedReceiver<InferEvent>, n: usize) -> Result<Collected, ApiError> {
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

/// SSE: a task turns engine events into frames; dropping the body (client gone) ends the task,
/// which drops the engine receiver, which cancels the generation.
/// How long a stream may be silent before it sends a keep-alive comment.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_millis(200);

fn stream(mut renderer: Renderer, mut rx: UnboundedReceiver<InferEvent>, permit: crate::limiter::Permit) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let _permit = permit;
        let mut opened = false;
        // One timer for the whole stream, pushed back at every event (not a new one per token).
        let silence = tokio::time::sleep(KEEP_ALIVE);
        tokio::pin!(silence);
        while !renderer.done() {
            // While nothing comes (queued, or a long prefill), an SSE comment every
            // KEEP_ALIVE: writing is how the server learns that the client has gone (hyper
            // notices a closed connection only on a write), so a request abandoned while it
            // waits is dropped before the engine admits it. Clients skip comment lines.
            let next = tokio::select! {
                ev = rx.recv() => ev,
                _ = &mut silence => {
                    silence.as_mut().reset(tokio::time::Instant::now() + KEEP_ALIVE);
                    if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            silence.as_mut().reset(tokio::time::Instant::now() + KEEP_ALIVE);
            // The role chunks go out with the engine's first event (its admission), as vLLM
            // sends its first chunk with the first output: a client that reads one chunk and
            // leaves has then been admitted, and its sequence is freed at its next token.
            if !opened {
                opened = true;
                for chunk in renderer.opening() {
                    if tx.send(frame(&chunk)).await.is_err() {
                        return;
                    }
                }
            }
            let chunks = match next {
                Some(InferEvent::Error(m)) => Err(format!("generation failed: {m}")),
                Some(ev) => Ok(renderer.event(ev)),
                None => Err("the inference engine stopped during generation".to_string()),
            };
            match chunks {
                Ok(chunks) => {
                    for chunk in chunks {
                        if tx.send(frame(&chunk)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(message) => {
                    let _ = tx.send(frame(&error_frame(&message))).await;
                    let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                    return;
                }
            }
        }
        for chunk in renderer.closing() {
            if tx.send(frame(&chunk)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let body = Body::from_stream(ReceiverStream { rx: out });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// One SSE data frame. The chunk types hold only strings, numbers and lists, which always
/// serialise.
fn frame<T: serde::Serialize>(v: &T) -> Bytes {
    let json = serde_json::to_string(v).unwrap_or_default();
    Bytes::from(format!("data: {json}\n\n"))
}

fn error_frame(message: &str) -> serde_json::Value {
    serde_json::json!({"error": {"message": message, "type": "InternalServerError", "param": null, "code": 500}})
}

/// A bounded receiver as a body stream.
struct ReceiverStream {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl futures_core::Stream for ReceiverStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|o| o.map(Ok))
    }
}
