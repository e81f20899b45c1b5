//! `POST /v1/chat/completions`: validate, resolve the model, admit, render and tokenize (on a
//! blocking thread), submit to the engine, then answer with one response or an SSE stream.

use super::beam;
use super::request::{self, ChatPlan};
use super::resolve::{resolve, Target};
use super::response::{Collected, Renderer};
use super::tools::{self, ToolMode};
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
use tandem_core::inference::{GenerateRequest, InferEvent, ReasoningParser, SharedBackend, SubmitError};
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
    let backend = super::engine(&state)?;
    // Under overload, shed before reading and parsing the body: when no served model can take
    // another request, this answer is the same whatever the body says, and a burst of them must
    // be answered at once (R2), not after parsing hundreds of bodies.
    if (0..state.served_models().len()).all(|b| !backend.has_capacity(b)) {
        return Err(ApiError::new(ErrorKind::Unavailable, "the server is at capacity; retry shortly")
            .with_retry_after(1)
            .into());
    }
    let OpenAiJson(body) = OpenAiJson::from_request(request, &state).await?;
    let mut plan = request::validate(&body, state.priority_scheduling())?;
    plan.render.tenant = caller.entity.clone();
    let target = resolve(&state, &caller.entity, plan.model.as_deref()).await?;
    // Admission comes before any rendering or tokenizing.
    let permit = super::admit(&state, &caller.entity)?;
    if !backend.has_capacity(target.base) {
        return Err(ApiError::new(ErrorKind::Unavailable, "the server is at capacity; retry shortly")
            .with_retry_after(1)
            .into());
    }
    let request_id = plan
        .request_id
        .clone()
        .or_else(|| headers.get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_string))
        .unwrap_or_else(|| tandem_core::new_id().simple().to_string());
    let (generate, prompt, tool_mode) =
        prepare(backend.clone(), &plan, &target, &caller.entity, request_id.clone(), state.reasoning_parser()).await?;
    // A checkpoint's adapter is read from disk on a blocking thread, never on an async worker;
    // the submits below (the beam search's too) then find it loaded.
    if let Some(adapter) = generate.adapter.clone() {
        let (b, base) = (backend.clone(), target.base);
        tokio::task::spawn_blocking(move || b.load_adapter(base, &adapter))
            .await
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("adapter task failed: {e}")))?
            .map_err(submit_error)?;
    }
    let rx = match plan.beam {
        // The search runs to the end first; its result then flows through the same renderers.
        Some(length_penalty) => {
            let info = backend.models().get(target.base).cloned();
            let (eos, vocab) = info.map_or((0, 0), |m| (m.eos_token_id, m.vocab_size));
            // Each beam extends by 2n candidates; fewer tokens than that would leave beams unfilled.
            if 2 * plan.n > vocab {
                return Err(ApiError::bad_param(
                    "n",
                    format!("a beam width of {} needs a vocabulary of at least {} tokens", plan.n, 2 * plan.n),
                )
                .into());
            }
            let job =
                beam::BeamJob { width: plan.n, length_penalty, top_logprobs: plan.params.logprobs.unwrap_or(0), eos };
            let events = beam::run(&backend, &generate, job).await?;
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            for ev in events {
                let _ = tx.send(ev);
            }
            rx
        }
        // A constraint is compiled at submit (llguidance, bounded but possibly tens of
        // milliseconds for a large schema): off the async workers.
        None if generate.params.constraint.is_some() => {
            let b = backend.clone();
            tokio::task::spawn_blocking(move || b.submit(generate))
                .await
                .map_err(|e| ApiError::new(ErrorKind::Internal, format!("submit task failed: {e}")))?
                .map_err(submit_error)?
        }
        None => backend.submit(generate).map_err(submit_error)?,
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

/// The model-dependent half of validation, on a blocking thread: render, tokenize, check ids
/// against the vocabulary and the prompt against the context.
async fn prepare(
    backend: SharedBackend,
    plan: &ChatPlan,
    target: &Target,
    tenant: &str,
    request_id: String,
    reasoning: Option<ReasoningParser>,
) -> Result<(GenerateRequest, Vec<u32>, Option<ToolMode>), ApiError> {
    let plan = plan.clone();
    let target = target.clone();
    let tenant = tenant.to_string();
    tokio::task::spawn_blocking(move || {
        let info = backend
            .models()
            .get(target.base)
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorKind::Internal, "base model vanished"))?;
        // Tools: the template renders them, or tandem's generic format is described and enforced.
        let mut render = plan.render.clone();
        let mut params = plan.params.clone();
        let tool_mode = plan.tools.as_ref().map(|t| {
            let (constraint, mode) = tools::apply(t, backend.renders_tools(target.base, &render), &mut render);
            params.constraint = constraint;
            mode
        });
        if let Some(c) = params.constraint.as_mut() {
            c.after_reasoning = reasoning.filter(|_| !super::reasoning::scripts_reasoning(&c.kind));
        }
        let mut prompt = backend.render_chat(target.base, &render).map_err(|m| ApiError::bad_param("messages", m))?;
        if let Some(t) = plan.truncate_prompt_tokens {
            let keep = if t == -1 { info.context_len } else { t as usize };
            if prompt.len() > keep {
                prompt.drain(..prompt.len() - keep);
            }
        }
        // The first token is sampled from the last prompt position, so there must be one.
        if prompt.is_empty() {
            let param = if plan.truncate_prompt_tokens == Some(0) { "truncate_prompt_tokens" } else { "messages" };
            return Err(ApiError::bad_param(
                param,
                "The prompt is empty after the chat template and truncation; at least one token is needed.",
            ));
        }
        let vocab = info.vocab_size as u32;
        let check = |name: &str, ids: &[u32]| match ids.iter().find(|t| **t >= vocab) {
            Some(bad) => Err(ApiError::bad_param(name, format!("token id {bad} is out of vocabulary (size {vocab})"))),
            None => Ok(()),
        };
        check("stop_token_ids", &params.stop_token_ids)?;
        check("allowed_token_ids", params.allowed_token_ids.as_deref().unwrap_or(&[]))?;
        check("logit_bias", &params.logit_bias.iter().map(|(t, _)| *t).collect::<Vec<_>>())?;
        for proc in &params.processors {
            if let tandem_core::inference::LogitsProcessor::SuppressTokens { token_ids } = proc {
                check("logits_processors", token_ids)?;
            }
        }
        for word in &plan.bad_words {
            let w = word.trim_start();
            for variant in [w.to_string(), format!(" {w}")] {
                let ids =
                    backend.tokenize(target.base, &variant, false).map_err(|m| ApiError::bad_param("bad_words", m))?;
                if !ids.is_empty() {
                    params.bad_words.push(ids);
                }
            }
        }
        if prompt.len() >= info.context_len {
            return Err(ApiError::bad_param(
                "messages",
                format!(
                    "This model's maximum context length is {} tokens. However, your prompt contains {} tokens.",
                    info.context_len,
                    prompt.len()
                ),
            ));
        }
        let room = info.context_len - prompt.len();
        params.max_tokens = match plan.max_tokens {
            Some(m) if m > info.context_len => {
                return Err(ApiError::bad_param(
                    "max_completion_tokens",
                    format!("max_completion_tokens={m} cannot be greater than max_model_len={}", info.context_len),
                ));
            }
            Some(m) => m.min(room),
            None => room,
        };
        params.min_tokens = params.min_tokens.min(params.max_tokens);
        // A response that is held whole (not streamed, or a beam search) keeps every logprob
        // entry in memory until it is sent.
        if let Some(k) = params.logprobs.filter(|_| !plan.stream || plan.beam.is_some()) {
            let entries = plan.n.saturating_mul(params.max_tokens).saturating_mul(k + 1);
            if entries > request::MAX_HELD_LOGPROB_ENTRIES {
                return Err(ApiError::bad_param(
                    "max_tokens",
                    format!(
                        "n={} x max_tokens={} x (top_logprobs+1)={} logprob entries is more than one response may \
                         hold ({}); lower max_tokens or n, or stream the response",
                        plan.n,
                        params.max_tokens,
                        k + 1,
                        request::MAX_HELD_LOGPROB_ENTRIES
                    ),
                ));
            }
        }
        let req = GenerateRequest {
            request_id,
            base: target.base,
            adapter: target.adapter.clone(),
            prompt: prompt.clone(),
            n: plan.n,
            params,
            priority: plan.priority,
            tenant: tenant.clone(),
            cache_salt: plan.cache_salt.clone(),
            prompt_logprobs: plan.prompt_logprobs,
            beam_step: false,
        };
        Ok((req, prompt, tool_mode))
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, format!("render task failed: {e}")))?
}

/// An engine refusal as an API error (503 with `Retry-After` when full).
pub(super) fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::Overloaded => ApiError::new(ErrorKind::Unavailable, e.to_string()).with_retry_after(1),
        SubmitError::Invalid(m) => ApiError::bad_param("model", m),
        SubmitError::InvalidField { field, message } => ApiError::bad_param(&field, message),
        SubmitError::Stopped => ApiError::new(ErrorKind::Unavailable, e.to_string()),
    }
}

/// With `echo`, the last message's text is prepended when its role is the reply's role.
fn echo_text(plan: &ChatPlan) -> Option<String> {
    if !plan.echo {
        return None;
    }
    let last = plan.render.messages.last()?;
    (last.get("role").and_then(|r| r.as_str()) == Some(plan.role.as_str()))
        .then(|| tandem_core::inference::content_text(last.get("content").unwrap_or(&serde_json::Value::Null)))
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
        let frame = |v: serde_json::Value| Bytes::from(format!("data: {v}\n\n"));
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
                    if tx.send(frame(chunk)).await.is_err() {
                        return;
                    }
                }
            }
            let chunks = match next {
                Some(InferEvent::Error(m)) => vec![error_frame(&format!("generation failed: {m}"))],
                Some(ev) => renderer.event(ev),
                None => vec![error_frame("the inference engine stopped during generation")],
            };
            let failed = chunks.iter().any(|c| c.get("error").is_some());
            for chunk in chunks {
                if tx.send(frame(chunk)).await.is_err() {
                    return;
                }
            }
            if failed {
                let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                return;
            }
        }
        for chunk in renderer.closing() {
            if tx.send(frame(chunk)).await.is_err() {
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
