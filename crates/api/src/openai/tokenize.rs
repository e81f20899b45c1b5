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

pub async fn tokenize(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    OpenAiJson(body): OpenAiJson,
) -> Result<Json<Value>, OpenAiError> {
    let backend = super::engine(&state)?;
    let target = resolve(&state, &caller.entity, body.get("model").and_then(Value::as_str)).await?;
    let _permit = super::admit(&state, &caller.entity)?;
    let return_strs = body.get("return_token_strs").and_then(Value::as_bool).unwrap_or(false);
    let base = target.base;
    let ids = if body.get("messages").is_some() {
        // The chat form goes through the same validation and template as a chat completion.
        let plan = request::validate(&body, true)?;
        tokio::task::spawn_blocking({
            let backend = backend.clone();
            move || backend.render_chat(base, &plan.render)
        })
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?
        .map_err(|m| ApiError::bad_param("messages", m))?
    } else {
        let prompt = body
            .get("prompt")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_param("prompt", "either `prompt` (a string) or `messages` is required"))?
            .to_string();
        let special = body.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(true);
        let b = backend.clone();
        tokio::task::spawn_blocking(move || b.tokenize(base, &prompt, special))
            .await
            .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?
            .map_err(|m| ApiError::bad_param("prompt", m))?
    };
    let max_model_len = backend.models().get(base).map(|m| m.context_len);
    let strs: Value = if return_strs {
        json!(ids.iter().map(|t| backend.token_text(base, *t)).collect::<Vec<_>>())
    } else {
        Value::Null
    };
    Ok(Json(json!({ "count": ids.len(), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs })))
}

pub async fn detokenize(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    OpenAiJson(body): OpenAiJson,
) -> Result<Json<Value>, OpenAiError> {
    let backend = super::engine(&state)?;
    let target = resolve(&state, &caller.entity, body.get("model").and_then(Value::as_str)).await?;
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
    let base = target.base;
    let prompt = tokio::task::spawn_blocking(move || backend.detokenize(base, &tokens, false))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?
        .map_err(|m| ApiError::bad_param("tokens", m))?;
    Ok(Json(json!({ "prompt": prompt })))
}

/// Most token ids one `/detokenize` takes (far more than any context).
const MAX_DETOKENIZE: usize = 1 << 20;
