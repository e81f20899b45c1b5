//! API keys: generation, hashing, and the middleware that turns a bearer token into a [`Caller`].
//!
//! Keys are random 192-bit secrets shown once at creation; the store keeps only their SHA-256.
//! A presented key is hashed, looked up by hash, and the stored hash compared in constant time.
//! The key is never logged: the middleware does not record headers, and errors never echo it.

use crate::error::{ApiError, ErrorKind};
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tandem_store::ApiKeyRecord;

/// Who is calling: the entity that owns the key in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub entity: String,
}

/// Keys accepted without the store: those given with `--api-key`, held as hashes.
#[derive(Debug, Clone, Default)]
pub struct StaticKeys {
    keys: Vec<([u8; 32], String)>,
}

impl StaticKeys {
    pub fn add(&mut self, key: &str, entity: &str) {
        self.keys.push((hash_key(key), entity.to_string()));
    }

    /// The entities the keys belong to.
    pub fn entities(&self) -> impl Iterator<Item = String> + '_ {
        self.keys.iter().map(|(_, e)| e.clone())
    }

    fn find(&self, hash: &[u8; 32]) -> Option<&str> {
        // Compare against every key, in constant time, whatever matches.
        let mut found = None;
        for (h, entity) in &self.keys {
            if bool::from(h.ct_eq(hash)) {
                found = Some(entity.as_str());
            }
        }
        found
    }
}

pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A fresh key for `entity`: the key (shown once) and the record to store.
pub fn generate_key(entity: &str) -> (String, ApiKeyRecord) {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    let key = format!("tdm_{}", hex::encode(bytes));
    let record = ApiKeyRecord {
        id: tandem_core::new_id(),
        entity: entity.to_string(),
        key_hash: hash_key(&key),
        prefix: key[..12].to_string(),
        created_at: tandem_store::now_ms(),
        revoked_at: None,
    };
    (key, record)
}

/// The bearer token of a request, if the header is well formed.
fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Resolves the caller from a bearer token (None when the header is absent or malformed).
pub async fn authenticate(state: &AppState, token: Option<&str>) -> Result<Caller, ApiError> {
    let unauthorized = || ApiError::new(ErrorKind::Unauthorized, "missing or invalid API key");
    let token = token.ok_or_else(unauthorized)?;
    let hash = hash_key(token);
    if let Some(entity) = state.static_keys().find(&hash) {
        return Ok(Caller { entity: entity.to_string() });
    }
    match state.store().find_active_key(&hash).await? {
        Some(record) if bool::from(record.key_hash.ct_eq(&hash)) => Ok(Caller { entity: record.entity }),
        _ => Err(unauthorized()),
    }
}

/// Anthropic's clients send the key as `x-api-key`; a bearer token works too.
fn api_key_or_bearer(req: &Request) -> Option<&str> {
    let key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim).filter(|k| !k.is_empty());
    key.or_else(|| bearer(req))
}

/// Runs the request as its authenticated caller, or returns why it may not run.
async fn admit(state: &AppState, req: Request, next: Next) -> Result<Response, ApiError> {
    // The token is copied out so that no borrow of the (non-Sync) request lives across an await.
    let token = bearer(&req).map(str::to_owned);
    admit_with(state, token, req, next).await
}

async fn admit_with(
    state: &AppState,
    token: Option<String>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let caller = authenticate(state, token.as_deref()).await?;
    req.extensions_mut().insert(caller);
    Ok(next.run(req).await)
}

/// Middleware for the preview area: rejects unauthenticated requests in its error shape.
pub async fn require_preview(State(state): State<AppState>, req: Request, next: Next) -> Response {
    admit(&state, req, next).await.unwrap_or_else(|e| e.into_preview_response().into_response())
}

/// Middleware for Anthropic's Messages API: the key from `x-api-key` or a bearer token, errors
/// in Anthropic's shape.
pub async fn require_anthropic(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let token = api_key_or_bearer(&req).map(str::to_owned);
    admit_with(&state, token, req, next).await.unwrap_or_else(|e| e.into_anthropic_response().into_response())
}

/// Middleware for the Tinker API: its SDK sends `X-API-Key` and only accepts keys that start
/// with `tml-`, so `tml-` followed by a tandem key is that key (a bare key or a bearer token
/// works too). Errors in FastAPI's shape.
pub async fn require_tinker(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let token = api_key_or_bearer(&req).map(|k| k.strip_prefix("tml-").unwrap_or(k).to_owned());
    admit_with(&state, token, req, next).await.unwrap_or_else(|e| e.into_preview_response().into_response())
}

/// Middleware for the OpenAI-compatible area: the same check, rendered in its error shape.
pub async fn require_openai(State(state): State<AppState>, req: Request, next: Next) -> Response {
    admit(&state, req, next).await.unwrap_or_else(|e| e.into_openai_response().into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_hashed() {
        let (a, ra) = generate_key("local");
        let (b, _) = generate_key("local");
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 48);
        assert_eq!(ra.key_hash, hash_key(&a));
        assert!(a.starts_with(&ra.prefix));
        let mut s = StaticKeys::default();
        s.add(&a, "local");
        assert_eq!(s.find(&hash_key(&a)), Some("local"));
        assert_eq!(s.find(&hash_key(&b)), None);
    }
}
