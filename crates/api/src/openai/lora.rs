//! vLLM's runtime LoRA routes: `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`.
//! Off unless the server was started with `--lora-root DIR` (vLLM needs
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING`); only PEFT adapter directories under that root load. A
//! loaded adapter belongs to the caller's entity: it is served under its name to that entity's
//! requests, listed in that entity's `/v1/models`, and unknown to everyone else. Loaded adapters
//! live in memory, as in vLLM: a restart forgets them.

use crate::auth::Caller;
use crate::body::OpenAiJson;
use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::AppState;
use axum::extract::{Extension, State};
use axum::response::IntoResponse;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use tandem_core::inference::AdapterRef;

/// Adapters one entity may have loaded at once.
pub const MAX_LOADED_PER_ENTITY: usize = 64;
const MAX_NAME_BYTES: usize = 256;

/// One loaded adapter.
#[derive(Debug, Clone)]
pub struct LoadedLora {
    /// The served base model it runs on.
    pub base: String,
    pub adapter: AdapterRef,
    /// `lora_path` as the caller sent it (never the server's absolute path).
    pub path: String,
    /// Unix seconds.
    pub created: i64,
}

/// Loaded adapters by (entity, name), and the one load that may run at a time.
pub struct LoraRegistry {
    loaded: Mutex<HashMap<(String, String), LoadedLora>>,
    /// Loads run one at a time, server-wide: each reads up to a GiB and converts it to f32, and
    /// checking the per-entity cap and the name under it leaves no window for a second load.
    loading: tokio::sync::Semaphore,
}

impl Default for LoraRegistry {
    fn default() -> Self {
        LoraRegistry { loaded: Mutex::default(), loading: tokio::sync::Semaphore::new(1) }
    }
}

impl LoraRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), LoadedLora>> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, entity: &str, name: &str) -> Option<LoadedLora> {
        self.lock().get(&(entity.to_string(), name.to_string())).cloned()
    }

    /// The entity's adapters, by name.
    pub fn list(&self, entity: &str) -> Vec<(String, LoadedLora)> {
        let mut out: Vec<_> =
            self.lock().iter().filter(|((e, _), _)| e == entity).map(|((_, n), l)| (n.clone(), l.clone())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Why a `lora_path` is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum PathRefusal {
    /// Empty, absolute outside the root, or climbing out of it with `..`.
    OutsideRoot,
}

/// `requested` joined to `root` and normalised without touching the file system: a relative path
/// is taken from the root, an absolute one must lie under it, and `..` may not climb above it.
/// (Symbolic links are checked after this, on the canonical path.)
pub fn lexically_under(root: &Path, requested: &str) -> Result<PathBuf, PathRefusal> {
    if requested.is_empty() || requested.contains('\0') {
        return Err(PathRefusal::OutsideRoot);
    }
    let p = Path::new(requested);
    let rest = if p.is_absolute() { p.strip_prefix(root).map_err(|_| PathRefusal::OutsideRoot)? } else { p };
    let mut out = root.to_path_buf();
    let mut depth = 0usize;
    for c in rest.components() {
        match c {
            Component::Normal(s) => {
                out.push(s);
                depth += 1;
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if depth == 0 {
                    return Err(PathRefusal::OutsideRoot);
                }
                out.pop();
                depth -= 1;
            }
            Component::RootDir | Component::Prefix(_) => return Err(PathRefusal::OutsideRoot),
        }
    }
    Ok(out)
}

/// What a `lora_name` may be: printable, without spaces, not a base model's id and not shaped
/// like a trained model's address (so that it can never shadow another way of naming a model).
pub fn check_name(name: &str, base_ids: &[String]) -> Result<(), String> {
    if name.is_empty() {
        return Err("lora_name must not be empty".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!("lora_name is longer than {MAX_NAME_BYTES} bytes"));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("lora_name must not contain spaces or control characters".into());
    }
    if base_ids.iter().any(|b| b == name) {
        return Err(format!("The lora adapter name '{name}' is the name of a base model."));
    }
    if name.starts_with("wandb-artifact:") || name.contains(":step") || name.split('/').count() == 3 {
        return Err(
            "lora_name must not look like a trained model's address (`wandb-artifact:`, `:step`, or `entity/project/name`)"
                .into(),
        );
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadBody {
    lora_name: String,
    lora_path: String,
    #[serde(default)]
    load_inplace: bool,
    /// tandem's extra: the served base model the adapter was trained on (default: the first).
    base_model_name: Option<String>,
}

#[derive(Deserialize)]
struct UnloadBody {
    lora_name: String,
    /// vLLM's, accepted and not needed: names identify adapters here.
    #[allow(dead_code)]
    lora_int_id: Option<i64>,
}

fn off() -> ApiError {
    ApiError::new(
        ErrorKind::NotFound,
        "runtime LoRA updating is off on this server (start it with --lora-root DIR to load adapters from DIR)",
    )
}

fn parse<T: serde::de::DeserializeOwned>(body: serde_json::Value) -> Result<T, ApiError> {
    serde_json::from_value(body).map_err(|e| ApiError::new(ErrorKind::Validation, format!("invalid request: {e}")))
}

fn text(message: String) -> axum::response::Response {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], message).into_response()
}

#[utoipa::path(
    post,
    operation_id = "load_lora_adapter",
    path = "/v1/load_lora_adapter",
    tag = "inference",
    summary = "Load a PEFT adapter from under the server's --lora-root and serve it under a name",
    request_body = crate::openapi::bodies::LoadLoraBody,
    responses(
        (status = 200, description = "`Success: LoRA adapter 'x' added successfully.`", content_type = "text/plain", body = String),
        (status = 400, description = "Bad name, path outside the root, already loaded, or not an adapter of the base", body = crate::openapi::bodies::OpenAiErrorBody),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::OpenAiErrorBody),
        (status = 404, description = "Runtime LoRA updating is off, or no adapter at the path", body = crate::openapi::bodies::OpenAiErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn load(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    OpenAiJson(body): OpenAiJson,
) -> Result<axum::response::Response, OpenAiError> {
    let Some(root) = state.lora_root() else { return Err(off().into()) };
    let body: LoadBody = parse(body)?;
    check_name(&body.lora_name, state.served_models()).map_err(|m| ApiError::bad_param("lora_name", m))?;
    let base = match &body.base_model_name {
        Some(b) => state
            .model(b)
            .ok_or_else(|| ApiError::bad_param("base_model_name", format!("no served base model is named {b:?}")))?,
        None => state.models().first().ok_or_else(super::no_engine)?,
    }
    .clone();
    let outside = || ApiError::bad_param("lora_path", "lora_path must name a directory under the server's LoRA root");
    let dir = lexically_under(root, &body.lora_path).map_err(|_| outside())?;
    // A load is inference-route work for the entity's concurrency limit, and one at a time
    // server-wide; the cap and the name are checked under that one permit.
    let _permit = super::admit(&state, &caller.entity)?;
    let registry = state.loras();
    let _loading =
        registry.loading.acquire().await.map_err(|_| ApiError::new(ErrorKind::Unavailable, "shutting down"))?;
    let key = (caller.entity.clone(), body.lora_name.clone());
    {
        let loaded = registry.lock();
        if loaded.contains_key(&key) && !body.load_inplace {
            let m = format!("The lora adapter '{}' has already been loaded.", body.lora_name);
            return Err(ApiError::bad_param("lora_name", m).into());
        }
        if !loaded.contains_key(&key)
            && loaded.keys().filter(|(e, _)| *e == caller.entity).count() >= MAX_LOADED_PER_ENTITY
        {
            let m = format!("at most {MAX_LOADED_PER_ENTITY} adapters may be loaded per entity; unload one first");
            return Err(ApiError::bad_param("lora_name", m).into());
        }
    }
    let shown = body.lora_path.clone();
    let (root, base_model, lora_name) = (root.to_path_buf(), base.clone(), body.lora_name.clone());
    let entity = caller.entity.clone();
    // File-system checks and the load itself are blocking.
    let adapter = tokio::task::spawn_blocking(move || -> Result<AdapterRef, ApiError> {
        let not_found = || {
            ApiError::new(ErrorKind::NotFound, format!("No adapter found at lora_path '{shown}' under the LoRA root."))
        };
        // A link inside the root may point anywhere: the canonical path must still be under it.
        let dir = dir.canonicalize().map_err(|_| not_found())?;
        if !dir.starts_with(&root) {
            return Err(outside());
        }
        // The files too (the engine checks them again, with the size caps, at every read).
        let present = |name: &str| dir.join(name).canonicalize().is_ok_and(|f| f.starts_with(&root) && f.is_file());
        if !present("adapter_config.json") || !present("adapter_model.safetensors") {
            return Err(not_found());
        }
        let adapter = AdapterRef {
            checkpoint_id: format!("runtime-lora-{}", uuid::Uuid::new_v4()),
            name: lora_name,
            owner: entity,
            path: dir,
            confined_to: Some(root),
        };
        base_model.load_adapter(&adapter).map_err(|why| {
            ApiError::bad_param(
                "lora_path",
                format!("this adapter cannot be served on {}: {why}", base_model.info().id),
            )
        })?;
        Ok(adapter)
    })
    .await
    .map_err(|e| {
        tracing::error!(error = %e, "loading a runtime LoRA adapter panicked");
        ApiError::new(ErrorKind::Internal, "loading the adapter failed (the server logged why)")
    })??;
    let created = tandem_store::now_ms().div_euclid(1000);
    let entry = LoadedLora { base: base.info().id.clone(), adapter, path: body.lora_path, created };
    let replaced = registry.lock().insert(key, entry);
    if let (Some(old), Some(backend)) = (replaced, state.backend()) {
        backend.forget_adapter(&old.adapter.checkpoint_id);
    }
    tracing::info!(entity = %caller.entity, name = %body.lora_name, "runtime LoRA adapter loaded");
    Ok(text(format!("Success: LoRA adapter '{}' added successfully.", body.lora_name)))
}

#[utoipa::path(
    post,
    operation_id = "unload_lora_adapter",
    path = "/v1/unload_lora_adapter",
    tag = "inference",
    summary = "Stop serving an adapter loaded with /v1/load_lora_adapter",
    request_body = crate::openapi::bodies::UnloadLoraBody,
    responses(
        (status = 200, description = "`Success: LoRA adapter 'x' removed successfully.`", content_type = "text/plain", body = String),
        (status = 400, description = "No lora_name", body = crate::openapi::bodies::OpenAiErrorBody),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::OpenAiErrorBody),
        (status = 404, description = "Runtime LoRA updating is off, or this entity has no adapter of that name", body = crate::openapi::bodies::OpenAiErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn unload(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    OpenAiJson(body): OpenAiJson,
) -> Result<axum::response::Response, OpenAiError> {
    if state.lora_root().is_none() {
        return Err(off().into());
    }
    let body: UnloadBody = parse(body)?;
    let removed = state.loras().lock().remove(&(caller.entity.clone(), body.lora_name.clone()));
    let Some(removed) = removed else {
        let m = format!("The lora adapter '{}' cannot be found.", body.lora_name);
        return Err(ApiError { param: Some("lora_name".into()), ..ApiError::new(ErrorKind::NotFound, m) }.into());
    };
    if let Some(backend) = state.backend() {
        backend.forget_adapter(&removed.adapter.checkpoint_id);
    }
    Ok(text(format!("Success: LoRA adapter '{}' removed successfully.", body.lora_name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_root() {
        let root = Path::new("/srv/loras");
        assert_eq!(lexically_under(root, "a/b"), Ok(PathBuf::from("/srv/loras/a/b")));
        assert_eq!(lexically_under(root, "./a/../b"), Ok(PathBuf::from("/srv/loras/b")));
        assert_eq!(lexically_under(root, "/srv/loras/a"), Ok(PathBuf::from("/srv/loras/a")));
        assert_eq!(lexically_under(root, "/srv/loras"), Ok(PathBuf::from("/srv/loras")));
        for bad in ["", "..", "a/../..", "../loras2/x", "/srv/loras2/x", "/etc", "/srv/loras/../x", "a\0b"] {
            assert_eq!(lexically_under(root, bad), Err(PathRefusal::OutsideRoot), "{bad:?}");
        }
    }

    #[test]
    fn names_cannot_shadow_other_models() {
        let bases = vec!["base".to_string()];
        assert!(check_name("sql-adapter", &bases).is_ok());
        assert!(check_name("org/adapter", &bases).is_ok());
        for bad in ["", "base", "a b", "x\n", "wandb-artifact:///e/p/n", "e/p/n:step3", "e/p/n"] {
            assert!(check_name(bad, &bases).is_err(), "{bad:?}");
        }
        assert!(check_name(&"a".repeat(257), &bases).is_err());
    }
}
