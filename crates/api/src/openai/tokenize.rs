//! vLLM's `POST /tokenize` (a prompt, or messages through the chat template) and
//! `POST /detokenize`.

use super::request;
use super::resolve::resolve;
use crate::auth::Caller;
use crate::body::OpenAiJson;
use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::AppState;
use axum::extract::{Extension, State};
use axum::Json;
use serde_json::{json, Value};

#[utoipa::path(
    post,
    operation_id = "tokenize",
    path = "/tokenize",
    tag = "inference",
    summary = "Token ids of a prompt or of rendered chat messages",
    request_body = crate::openapi::bodies::TokenizeBody,
    responses(
        (status = 200, body = crate::openapi::bodies::TokenizeResponse),
        crate::openapi::bodies::InferenceErrors
    ),
    security(("bearer" = []))
)]
pub async fn tokenize(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    OpenAiJson(body): OpenAiJson,
) -> Result<Json<Value>, OpenAiError> {
    let target = resolve(&state, &caller.entity, typed(&body, "model", Value::as_str, "a string")?).await?;
    let _permit = super::admit(&state, &caller.entity)?;
    let return_strs = typed(&body, "return_token_strs", Value::as_bool, "a boolean")?.unwrap_or(false);
    let model = target.model;
    let ids = if body.get("messages").is_some() {
        // The chat form goes through the same validation and template as a chat completion,
        // tools included (the template's own rendering of them, or tandem's generic format), so
        // the ids are the prompt a chat completion of the same body would have.
        let mut plan = request::validate(&body, true)?;
        plan.render.tenant = caller.entity.clone();
        tokio::task::spawn_blocking({
            let model = model.clone();
            move || {
                let mut render = plan.render;
                if let Some(tools) = &plan.tools {
                    // Without a structured output beside the tools, preparing them cannot fail.
                    let _ = super::tools::apply(tools, model.tool_template(&render), &mut render, None);
                }
                model.render_chat(&render)
            }
        })
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))?
    } else {
        let prompt = body
            .get("prompt")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_param("prompt", "either `prompt` (a string) or `messages` is required"))?
            .to_string();
        let special = typed(&body, "add_special_tokens", Value::as_bool, "a boolean")?.unwrap_or(true);
        let m = model.clone();
        tokio::task::spawn_blocking(move || m.tokenize(&prompt, special))
            .await
            .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?
            .map_err(|e| ApiError::bad_param("prompt", e.to_string()))?
    };
    let max_model_len = model.info().context_len;
    let strs: Value =
        if return_strs { json!(ids.iter().map(|t| model.token_text(*t)).collect::<Vec<_>>()) } else { Value::Null };
    Ok(Json(json!({ "count": ids.len(), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs })))
}

#[utoipa::path(
    post,
    operation_id = "detokenize",
    path = "/detokenize",
    tag = "inference",
    summary = "Text of token ids",
    request_body = crate::openapi::bodies::DetokenizeBody,
    responses(
        (status = 200, body = crate::openapi::bodies::DetokenizeResponse),
        crate::openapi::bodies::InferenceErrors
    ),
    security(("bearer" = []))
)]
pub async fn detokenize(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    OpenAiJson(body): OpenAiJson,
) -> Result<Json<Value>, OpenAiError> {
    let target = resolve(&state, &caller.entity, typed(&body, "model", Value::as_str, "a string")?).await?;
    let _permit = super::admit(&state, &caller.entity)?;
    let tokens: Vec<u32> = match body.get("tokens") {
        Some(Value::Array(items)) if items.len() > MAX_DETOKENIZE => {
            return Err(ApiError::bad_param(
                "tokens",
                format!("at most {MAX_DETOKENIZE} tokens may be detokenized at once"),
            )
            .into())
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| t.as_u64().filter(|v| *v <= u32::MAX as u64).map(|v| v as u32))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::bad_param("tokens", "tokens must be a list of non-negative integers"))?,
        _ => return Err(ApiError::bad_param("tokens", "tokens (a list of token ids) is required").into()),
    };
    let model = target.model;
    let prompt = tokio::task::spawn_blocking(move || model.detokenize(&tokens, false))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?
        .map_err(|e| ApiError::bad_param("tokens", e.to_string()))?;
    Ok(Json(json!({ "prompt": prompt })))
}

/// Most token ids one `/detokenize` takes (far more than any context).
const MAX_DETOKENIZE: usize = 1 << 20;

/// An optional field of one JSON type: absent or null is `None`; another type is a 400, never
/// silently the default (the OpenAPI document states the types, and a client that sends
/// `"model": 5` has a bug it should hear about).
fn typed<'a, T>(
    body: &'a Value,
    key: &str,
    get: impl Fn(&'a Value) -> Option<T>,
    what: &str,
) -> Result<Option<T>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => get(v).map(Some).ok_or_else(|| ApiError::bad_param(key, format!("{key} must be {what}"))),
    }
}
