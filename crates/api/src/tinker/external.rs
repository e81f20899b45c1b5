//! Adapters out as PEFT files, the way the SDK 0.38 downloads them (`tinker checkpoint
//! download`, `RestClient.get_external_weights_urls`):
//! - `save_weights_external` writes the model's adapter (`adapter_config.json`,
//!   `adapter_model.safetensors`) under a name, in the model's `seq_id` order, and answers
//!   `tinker://{model_id}/external_weights/{name}`;
//! - `training_runs/{id}/checkpoints/external_weights/{name}/external_weights_urls` answers a
//!   signed URL per file, good for an hour, which a plain HTTP client fetches without a key (as
//!   the SDK does): the URL carries the owner, the run, the name and the expiry, with an
//!   HMAC-SHA256 of them under the cluster's key (`tandem_tinker::urls`, kept in the store), so
//!   any node of a cluster serves a URL another signed, and a restart keeps them good;
//! - `ttl_seconds` makes them expire (`expiry`), and deleting the name removes them.

use super::expiry::ttl_expiry;
use super::order::{ordered_async, refused_in_order, Sequenced};
use super::routes::{bad, owned_model, tinker_error, trainer, Result, TinkerJson};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tandem_tinker::catalog::name_problem;
use tandem_tinker::registry::Outcome;

/// How long a signed URL is good for (the SDK signs again five minutes before).
const URL_LIFETIME: Duration = Duration::from_secs(3600);

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[derive(Deserialize)]
pub struct SaveExternal {
    path: String,
    #[serde(default)]
    ttl_seconds: Option<i64>,
    #[serde(default)]
    age_encryption_recipients: Option<Vec<String>>,
}

/// `save_weights_external`: the adapter's PEFT files under `path`, in the model's order.
#[utoipa::path(
    post,
    operation_id = "tinker_save_weights_external",
    path = "/save_weights_external",
    tag = "tinker",
    summary = "The adapter as PEFT files under a name, optionally age-encrypted (a future)",
    request_body = crate::openapi::tinker::TinkerSaveState,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerSubmitted),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn save(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(raw): TinkerJson<Value>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    let call = Sequenced::<SaveExternal>::read(raw)?;
    let (t, model) = owned_model(&state, &caller, &call.model_id)?;
    // Recipients are parsed by the trainer (one that is not one fails the call as the user's);
    // bounded here before anything is queued.
    let checked = call.body.and_then(|body| {
        let recipients = body.age_encryption_recipients.clone().unwrap_or_default();
        if recipients.len() > 10 || recipients.iter().any(|r| r.is_empty() || r.len() > 16 * 1024) {
            return Err("age_encryption_recipients: at most 10, each a non-empty age or SSH public key".to_string());
        }
        if let Some(problem) = name_problem(&body.path) {
            return Err(problem);
        }
        Ok((recipients, ttl_expiry(body.ttl_seconds)?, body.path))
    });
    let (recipients, expires, name) = match checked {
        Ok(c) => c,
        Err(e) => return refused_in_order(&t, model, &call.model_id, call.seq_id, e),
    };
    let (id, owner) = (call.model_id.clone(), caller.entity.clone());
    let tinker = t.clone();
    ordered_async(&t, model, &call.model_id, call.seq_id, async move {
        let _run = tinker.runs.lock(&owner, &id).await;
        let read = {
            let (trainer, id) = (trainer.clone(), id.clone());
            tokio::task::spawn_blocking(move || trainer.external_files(&id, &recipients)).await
        };
        let files = match read {
            Ok(Ok(files)) => files,
            Ok(Err(e)) => return Outcome::failed(e),
            Err(e) => return Outcome::server(format!("saving failed: {e}")),
        };
        // Saving over a name replaces its expiry too (none without `ttl_seconds`).
        match state.catalog().save_external(&owner, &id, &name, files, expires).await {
            Ok(bytes) => Outcome::Json(json!({
                "path": format!("tinker://{id}/external_weights/{name}"), "size_bytes": bytes,
                "type": "save_weights_external",
            })),
            Err(e) => Outcome::failed(e),
        }
    })
}

/// `GET training_runs/{run}/checkpoints/external_weights/{name}/external_weights_urls`.
#[utoipa::path(
    get,
    operation_id = "tinker_external_weights_urls",
    path = "/training_runs/{run}/checkpoints/{kind}/{name}/external_weights_urls",
    tag = "tinker",
    summary = "Signed download URLs of external weights, good for an hour",
    params(crate::openapi::tinker::TinkerCheckpointPath),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn urls(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path((run, kind, name)): Path<(String, String, String)>,
) -> Result<Json<Value>> {
    if kind != "external_weights" {
        return Err(bad(format!("{kind}/{name} is not external weights: save them with save_weights_external")).into());
    }
    let files = state.catalog().external_files(&caller.entity, &run, &name).await.map_err(tinker_error)?;
    let files = files.filter(|f| !f.is_empty()).ok_or_else(|| ApiError::not_found("external weights"))?;
    let expires = now_secs() + URL_LIFETIME.as_secs();
    let token = state.catalog().url_key().await.map_err(tinker_error)?.sign(&caller.entity, &run, &name, expires);
    let base = base_url(&headers);
    let urls: serde_json::Map<String, Value> = files
        .iter()
        .map(|(file, _)| (file.clone(), json!(format!("{base}/api/v1/external_weights_files/{token}/{file}"))))
        .collect();
    Ok(Json(json!({ "urls": urls, "expires": super::runs::rfc3339(expires as i64 * 1000) })))
}

/// Where the caller reached this server (its `Host`, and the scheme a proxy in front says).
fn base_url(headers: &HeaderMap) -> String {
    let text = |h: header::HeaderName| headers.get(h).and_then(|v| v.to_str().ok()).map(str::to_string);
    let host = text(header::HOST).unwrap_or_else(|| "127.0.0.1".into());
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|p| *p == "https" || *p == "http")
        .unwrap_or("http");
    format!("{scheme}://{host}")
}

/// `GET external_weights_files/{token}/{file}`: no key, the token is the permission.
#[utoipa::path(
    get,
    operation_id = "tinker_download_external_file",
    path = "/external_weights_files/{token}/{file}",
    tag = "tinker",
    summary = "A file of external weights by a signed URL (no key: the URL is the permission)",
    params(("token" = String, Path, description = "The signed token"), ("file" = String, Path, description = "`adapter_config.json` or `adapter_model.safetensors` (`.age` when encrypted)")),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 403, description = "Not a valid or an expired URL", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "The weights are gone", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 503, description = "The store did not answer; Retry-After", body = crate::openapi::bodies::PreviewErrorBody)
    ),
)]
pub async fn download(State(state): State<AppState>, Path((token, file)): Path<(String, String)>) -> Response {
    let gone = || PreviewError(ApiError::not_found("file")).into_response();
    let failed = |e| PreviewError(tinker_error(e)).into_response();
    let key = match state.catalog().url_key().await {
        Ok(key) => key,
        Err(e) => return failed(e),
    };
    let Some((owner, run, name)) = key.verify(&token, now_secs()) else {
        let refused = ApiError::new(ErrorKind::Forbidden, "the URL is not valid or has expired; sign it again");
        return PreviewError(refused).into_response();
    };
    // A store that does not answer is a 503 (retry), not a 404 (gone).
    let files = match state.catalog().external_files(&owner, &run, &name).await {
        Ok(files) => files,
        Err(e) => return failed(e),
    };
    let path = files.into_iter().flatten().find(|(f, _)| *f == file).map(|(_, p)| p);
    let Some(path) = path else { return gone() };
    match tokio::fs::read(&path).await {
        Ok(bytes) => {
            let mut r = bytes.into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            r
        }
        Err(_) => gone(),
    }
}
