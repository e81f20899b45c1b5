//! `POST /v1/completions` (vLLM's legacy completions): raw prompts (text or token ids, one or a
//! list) on the same path as chat. Parse the body, resolve the model, admit, validate every
//! prompt against the model (`generate::validate`, on a blocking thread) before any is queued,
//! submit them all, then answer with one response or an SSE stream whose choices are numbered
//! prompt by prompt.

mod body;
mod plan;

use super::generate::{self, Prompt, Validated};
use super::resolve::{resolve, Target};
use super::sse;
use crate::auth::Caller;
use crate::body::OpenAiJson;
use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::AppState;
use axum::extract::{Extension, FromRequest, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use body::{CompletionRenderer, PromptOut};
use plan::{CompletionPlan, PromptInput};
use serde_json::Value;
use tandem_core::inference::{InferEvent, ValidRequest};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

#[utoipa::path(
    post,
    operation_id = "create_completion",
    path = "/v1/completions",
    tag = "inference",
    summary = "Completion of raw prompts (vLLM's; streamed as server-sent events with `stream: true`)",
    request_body = crate::openapi::bodies::CompletionBody,
    responses(
        (status = 200, description = "The completion, or its chunks as `text/event-stream`", content(
            (crate::openapi::bodies::CompletionResponseBody = "application/json"),
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
    let plan = plan::validate(&body, state.priority_scheduling())?;
    let target = resolve(&state, &caller.entity, plan.sampling.model.as_deref()).await?;
    // Admission comes before any tokenizing.
    let permit = super::admit(&state, &caller.entity)?;
    if !target.model.has_capacity() {
        return Err(super::at_capacity().into());
    }
    let request_id = super::request_id(plan.sampling.request_id.as_deref(), &headers);
    // Every prompt is validated before any is queued: one bad prompt refuses the request whole.
    let mut valid = Vec::with_capacity(plan.prompts.len());
    for (i, p) in plan.prompts.iter().enumerate() {
        let id = if plan.prompts.len() == 1 { request_id.clone() } else { format!("{request_id}-{i}") };
        let prompt = match p {
            PromptInput::Text(text) => Prompt::Text { text: text.clone(), add_special_tokens: plan.add_special_tokens },
            PromptInput::Tokens(ids) => Prompt::Tokens(ids.clone()),
        };
        let mut draft = plan.sampling.draft(id, &caller.entity, prompt, "max_tokens");
        draft.prompts_in_response = plan.prompts.len();
        draft.prompt_logprobs_per_choice = true;
        // A raw prompt has no reasoning section for a parser to split off.
        let Validated { request, .. } = generate::validate_blocking(&target, draft, None).await?;
        valid.push(request);
    }
    let ids: Vec<Vec<u32>> = valid.iter().map(|v| v.request().prompt.clone()).collect();
    let prompts = prompt_outs(&target, &plan, ids).await?;
    let rx = start_all(&target, valid, &plan).await?;
    let renderer = CompletionRenderer::new(&plan, &target.name, &request_id, prompts);
    let mut response = if plan.sampling.stream {
        sse::respond(renderer, rx, permit)
    } else {
        let renderer = collect(renderer, rx).await?;
        drop(permit);
        axum::Json(renderer.full()).into_response()
    };
    super::tag_request_id(&mut response, "x-request-id", &request_id);
    Ok(response)
}

/// What the body needs of each prompt: its ids and, with `echo`, its text (the request's text,
/// or the decoded ids) and each token's text. Decoding runs on a blocking thread.
async fn prompt_outs(target: &Target, plan: &CompletionPlan, ids: Vec<Vec<u32>>) -> Result<Vec<PromptOut>, ApiError> {
    if !plan.echo {
        return Ok(ids.into_iter().map(|ids| PromptOut { ids, echo: None, token_texts: Vec::new() }).collect());
    }
    let (model, inputs) = (target.model.clone(), plan.prompts.clone());
    let skip_special = plan.sampling.params.skip_special_tokens;
    let truncated = plan.sampling.truncate_prompt_tokens.is_some();
    tokio::task::spawn_blocking(move || {
        ids.into_iter()
            .zip(inputs)
            .map(|(ids, input)| {
                let (token_texts, rest) =
                    model.token_texts(&ids, skip_special).map_err(|e| ApiError::bad_param("prompt", e.to_string()))?;
                let echo = match input {
                    // A text prompt is echoed as sent, unless it was truncated.
                    PromptInput::Text(t) if !truncated => t,
                    _ => token_texts.concat() + &rest,
                };
                Ok(PromptOut { ids, echo: Some(echo), token_texts })
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, format!("decoding task failed: {e}")))?
}

/// Submits every prompt (or runs its beam search) and merges their events, tagged with the
/// prompt's index. When the merged receiver is dropped (the client left), each forwarder's next
/// send fails and it drops its engine receiver, which cancels that generation.
async fn start_all(
    target: &Target,
    valid: Vec<ValidRequest>,
    plan: &CompletionPlan,
) -> Result<UnboundedReceiver<(usize, InferEvent)>, ApiError> {
    let (tx, rx) = unbounded_channel();
    let echo_only = plan.echo_only;
    for (i, v) in valid.into_iter().enumerate() {
        let mut events = generate::start(target, v, &plan.sampling).await?;
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                // Waiting on the merged channel's closing too: a prompt still queued (sending
                // nothing) is cancelled as soon as the client leaves, not at its first token.
                let ev = tokio::select! {
                    ev = events.recv() => ev,
                    _ = tx.closed() => return,
                };
                let Some(ev) = ev else { return };
                let ev = match ev {
                    // Echo-only: the prompt is the whole answer, as if the length ran out at once.
                    InferEvent::Token { .. } if echo_only => continue,
                    InferEvent::Finished { choice, .. } if echo_only => InferEvent::Finished {
                        choice,
                        reason: tandem_core::inference::FinishReason::Length,
                        stop_reason: None,
                        text: String::new(),
                    },
                    ev => ev,
                };
                if tx.send((i, ev)).is_err() {
                    return;
                }
            }
        });
    }
    Ok(rx)
}

/// Waits for every choice of every prompt to finish.
async fn collect(
    mut renderer: CompletionRenderer,
    mut rx: UnboundedReceiver<(usize, InferEvent)>,
) -> Result<CompletionRenderer, ApiError> {
    while !renderer.all_done() {
        match rx.recv().await {
            Some((_, InferEvent::Error(m))) => {
                return Err(ApiError::new(ErrorKind::Internal, format!("generation failed: {m}")))
            }
            Some((i, ev)) => renderer.push(i, ev),
            None => return Err(ApiError::new(ErrorKind::Internal, "the inference engine stopped during generation")),
        }
    }
    Ok(renderer)
}

/// What a caller of [`run_to_end`] may ask beyond a completions body (Tinker's sampling).
#[derive(Default)]
pub(crate) struct Extras {
    /// Top logprobs per sampled token, past the body's bound of 20 (Tinker asks k + 1 to rank
    /// k whether or not the sampled token is among them).
    pub sampled_top: Option<usize>,
    pub prompt_scoring: Option<Box<tandem_core::inference::PromptScoring>>,
    /// The entity whose trained model the body names, when not the caller's (sampler weights
    /// another entity published): the name resolves as theirs, the request is the caller's
    /// (its admission, fair share and limits).
    pub owner: Option<String>,
}

/// A one-prompt completions request run to its end for another front (Tinker's `asample`): the
/// body as `/v1/completions` takes it, validated, admitted and scheduled the same way. Returns
/// the number of choices and every event (the prompt logprobs, each choice's tokens and end).
pub(crate) async fn run_to_end(
    state: &AppState,
    entity: &str,
    body: &Value,
    extras: Extras,
) -> Result<(usize, Vec<InferEvent>), ApiError> {
    let plan = plan::validate(body, state.priority_scheduling())?;
    let target = resolve(state, extras.owner.as_deref().unwrap_or(entity), plan.sampling.model.as_deref()).await?;
    let permit = super::admit(state, entity)?;
    if !target.model.has_capacity() {
        return Err(super::at_capacity());
    }
    let [PromptInput::Tokens(ids)] = plan.prompts.as_slice() else {
        return Err(ApiError::new(ErrorKind::Validation, "one prompt of token ids is expected"));
    };
    let mut draft = plan.sampling.draft(
        super::request_id(None, &HeaderMap::new()),
        entity,
        Prompt::Tokens(ids.clone()),
        "max_tokens",
    );
    draft.prompt_logprobs_per_choice = false;
    if let Some(k) = extras.sampled_top {
        draft.params.logprobs = Some(k);
    }
    draft.prompt_scoring = extras.prompt_scoring;
    let Validated { request, .. } = generate::validate_blocking(&target, draft, None).await?;
    let n = plan.sampling.n;
    let mut events = generate::start(&target, request, &plan.sampling).await?;
    let (mut out, mut finished) = (Vec::new(), 0);
    while finished < n {
        match events.recv().await {
            Some(InferEvent::Error(m)) => {
                return Err(ApiError::new(ErrorKind::Internal, format!("generation failed: {m}")))
            }
            Some(ev) => {
                finished += matches!(ev, InferEvent::Finished { .. }) as usize;
                out.push(ev);
            }
            None => return Err(ApiError::new(ErrorKind::Internal, "the inference engine stopped during generation")),
        }
    }
    drop(permit);
    Ok((n, out))
}
