//! Model addressing (contract §2): a served base id (the default), an adapter the caller's entity
//! loaded with `/v1/load_lora_adapter` (by its name), or a trained model of the
//! caller's entity as `wandb-artifact:///{entity}/{project}/{name}[:stepN]` (two slashes too) or
//! `{entity}/{project}/{name}[:stepN]`. No suffix = the latest checkpoint (the base if none),
//! `:step0` = the base. Anything else, another entity's model or a deleted step is a 404.

use crate::error::{ApiError, ErrorKind};
use crate::AppState;
use tandem_core::inference::{AdapterRef, ModelHandle};
use tandem_core::names::split_step_suffix;
use tandem_store::StoreError;

/// What a `model` string resolves to: the served base model and, for a trained step, its adapter.
#[derive(Clone)]
pub struct Target {
    pub model: ModelHandle,
    pub adapter: Option<AdapterRef>,
    /// The name echoed in responses.
    pub name: String,
}

fn not_found(model: &str, state: &AppState) -> ApiError {
    let aliases = state.served_models().join(", ");
    ApiError {
        param: Some("model".into()),
        ..ApiError::new(ErrorKind::NotFound, format!("The model `{model}` does not exist. Valid aliases: {aliases}."))
    }
}

/// Resolves `model` for `entity`; a 503 when this server runs no inference engine.
pub async fn resolve(state: &AppState, entity: &str, model: Option<&str>) -> Result<Target, ApiError> {
    let served = state.models();
    let Some(model) = model else {
        let Some(base) = served.first() else { return Err(super::no_engine()) };
        return Ok(Target { model: base.clone(), adapter: None, name: base.info().id.clone() });
    };
    if let Some(base) = state.model(model) {
        return Ok(Target { model: base.clone(), adapter: None, name: model.to_string() });
    }
    if served.is_empty() {
        return Err(super::no_engine());
    }
    // An adapter this entity loaded at run time (`/v1/load_lora_adapter`).
    if let Some(l) = state.loras().get(entity, model) {
        let base = state.model(&l.base).cloned().ok_or_else(|| not_found(model, state))?;
        return Ok(Target { model: base, adapter: Some(l.adapter), name: model.to_string() });
    }
    let path =
        model.strip_prefix("wandb-artifact:///").or_else(|| model.strip_prefix("wandb-artifact://")).unwrap_or(model);
    let (path, step) = split_step_suffix(path);
    let parts: Vec<&str> = path.split('/').collect();
    let [e, project, name] = parts.as_slice() else { return Err(not_found(model, state)) };
    if *e != entity {
        return Err(not_found(model, state));
    }
    let record = state.store().find_model(entity, project, name).await.map_err(|e| match e {
        StoreError::NotFound => not_found(model, state),
        other => other.into(),
    })?;
    let base = state.model(&record.base_model).cloned().ok_or_else(|| not_found(model, state))?;
    let step = match step {
        Some(s) => s,
        None => state.store().latest_step(record.id).await?,
    };
    if step == 0 {
        return Ok(Target { model: base, adapter: None, name: model.to_string() });
    }
    let cp = state.store().get_checkpoint(record.id, step).await.map_err(|e| match e {
        StoreError::NotFound => not_found(model, state),
        other => other.into(),
    })?;
    // On a node sharing a blob store, the first request for a checkpoint downloads it.
    let path = state.checkpoints().local_dir(&cp.path).await?.ok_or_else(|| not_found(model, state))?;
    Ok(Target {
        model: base,
        adapter: Some(AdapterRef { checkpoint_id: cp.id.to_string(), path, confined_to: None }),
        name: model.to_string(),
    })
}
