//! Adapters out as PEFT files, the way the SDK 0.38 downloads them (`tinker checkpoint
//! download`, `RestClient.get_external_weights_urls`):
//! - `save_weights_external` writes the model's adapter (`adapter_config.json`,
//!   `adapter_model.safetensors`) under a name, in the model's `seq_id` order, and answers
//!   `tinker://{model_id}/external_weights/{name}`;
//! - `training_runs/{id}/checkpoints/external_weights/{name}/external_weights_urls` answers a
//!   signed URL per file, good for an hour, which a plain HTTP client fetches without a key (as
//!   the SDK does): the URL carries the owner, the run, the name and the expiry, with an
//!   HMAC-SHA256 of them under a key this process drew at start (a restart voids old URLs);
//! - `ttl_seconds` makes them expire (`expiry`), and deleting the name removes them.

use super::expiry::ttl_expiry;
use super::order::{ordered_async, refused_in_order, Sequenced};
use super::routes::{bad, failed, owned_model, tinker_error, trainer, Result};
use super::state::Outcome;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Sha256;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tandem_tinker::catalog::name_problem;

/// How long a signed URL is good for (the SDK signs again five minutes before).
const URL_LIFETIME: Duration = Duration::from_secs(3600);

/// The key signed URLs are signed with: drawn at start, never stored.
pub struct UrlKey([u8; 32]);

impl Default for UrlKey {
    fn default() -> Self {
        UrlKey(rand::random())
    }
}

impl UrlKey {
    fn mac(&self, payload: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(payload.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// A token naming `owner`'s external weights `name` of `run`, good until `expires` (unix
    /// seconds): the fields hex-encoded (any bytes may be in an entity's name), then the MAC.
    fn sign(&self, owner: &str, run: &str, name: &str, expires: u64) -> String {
        let payload = format!("{}.{}.{}.{expires}", hex::encode(owner), hex::encode(run), hex::encode(name));
        let mac = self.mac(&payload);
        format!("{payload}.{mac}")
    }

    /// The (owner, run, name) of a token this key signed and that has not expired at `now`.
    fn verify(&self, token: &str, now: u64) -> Option<(String, String, String)> {
        let (payload, mac) = token.rsplit_once('.')?;
        // Compared in constant time (the MAC crate's check).
        let mut check = Hmac::<Sha256>::new_from_slice(&self.0).ok()?;
        check.update(payload.as_bytes());
        check.verify_slice(&hex::decode(mac).ok()?).ok()?;
        let mut parts = payload.split('.');
        let text = |p: Option<&str>| hex::decode(p?).ok().and_then(|b| String::from_utf8(b).ok());
        let (owner, run, name) = (text(parts.next())?, text(parts.next())?, text(parts.next())?);
        let expires: u64 = parts.next()?.parse().ok()?;
        (parts.next().is_none() && now < expires).then_some((owner, run, name))
    }
}

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
pub async fn save(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(raw): Json<Value>,
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
            Ok(Err(e)) => return failed(e),
            Err(e) => return Outcome::Failed { error: format!("saving failed: {e}"), category: "server" },
        };
        // Saving over a name replaces its expiry too (none without `ttl_seconds`).
        match state.catalog().save_external(&owner, &id, &name, files, expires).await {
            Ok(bytes) => Outcome::Json(json!({
                "path": format!("tinker://{id}/external_weights/{name}"), "size_bytes": bytes,
                "type": "save_weights_external",
            })),
            Err(e) => failed(e),
        }
    })
}

/// `GET training_runs/{run}/checkpoints/external_weights/{name}/external_weights_urls`.
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
    let token = state.tinker().url_key.sign(&caller.entity, &run, &name, expires);
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
pub async fn download(State(state): State<AppState>, Path((token, file)): Path<(String, String)>) -> Response {
    let gone = || PreviewError(ApiError::not_found("file")).into_response();
    let Some((owner, run, name)) = state.tinker().url_key.verify(&token, now_secs()) else {
        let refused = ApiError::new(ErrorKind::Forbidden, "the URL is not valid or has expired; sign it again");
        return PreviewError(refused).into_response();
    };
    let files = state.catalog().external_files(&owner, &run, &name).await.ok().flatten();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_tokens_name_what_they_were_signed_for_until_they_expire() {
        let key = UrlKey::default();
        let token = key.sign("ent.ity/x", "s:train:0", "final", 1_000);
        assert_eq!(key.verify(&token, 999), Some(("ent.ity/x".into(), "s:train:0".into(), "final".into())));
        assert_eq!(key.verify(&token, 1_000), None, "expired");
        // Another key, a changed field or a changed MAC: refused.
        assert_eq!(UrlKey::default().verify(&token, 0), None);
        let (payload, mac) = token.rsplit_once('.').unwrap();
        let later = payload.replace(".1000", ".9999");
        assert_eq!(key.verify(&format!("{later}.{mac}"), 0), None);
        let mut bad_mac = mac.to_string();
        bad_mac.replace_range(0..1, if mac.starts_with('0') { "1" } else { "0" });
        assert_eq!(key.verify(&format!("{payload}.{bad_mac}"), 0), None);
        assert_eq!(key.verify("garbage", 0), None);
    }
}
