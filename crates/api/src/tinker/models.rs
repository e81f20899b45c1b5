//! Training models: `create_model` (a LoRA model on a served base model, a future), `get_info`,
//! and the registration `load_weights` shares (the model's place, its tandem record, its entry in
//! its session).

use super::resume::ModelSpec;
use super::routes::{bad, new_future, reap, run_id, submitted, tinker_error, trainer, Result, TinkerJson};
use crate::auth::Caller;
use crate::error::{ApiError, PreviewError};
use crate::AppState;
use axum::extract::State;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use tandem_core::tinker::{LoraSpec, Modules, RunId};
use tandem_tinker::registry::{ModelEntry, Outcome, Promise};

#[derive(Deserialize)]
pub struct CreateModel {
    session_id: String,
    model_seq_id: i64,
    base_model: String,
    #[serde(default)]
    lora_config: Option<LoraConfig>,
    #[serde(default)]
    optimizer_config: Option<Value>,
}

#[derive(Deserialize)]
struct LoraConfig {
    rank: usize,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default = "yes")]
    train_mlp: bool,
    #[serde(default = "yes")]
    train_attn: bool,
    /// An adapter on the output head too (the SDK's default).
    #[serde(default = "yes")]
    train_unembed: bool,
}

fn yes() -> bool {
    true
}

#[utoipa::path(
    post,
    operation_id = "tinker_create_model",
    path = "/create_model",
    tag = "tinker",
    summary = "A LoRA training model on a served base model (a future)",
    request_body = crate::openapi::tinker::TinkerCreateModel,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerSubmitted),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn create_model(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(body): TinkerJson<CreateModel>,
) -> Result<Json<Value>> {
    let trainer = trainer(&state)?;
    reap(&state);
    let t = state.tinker().clone();
    if !t.touch_session(&caller.entity, &body.session_id) {
        return Err(ApiError::not_found("session").into());
    }
    let run = run_id(&body.session_id, body.model_seq_id)?;
    let model_id = run.to_string();
    if let Some(m) = t.model(&caller.entity, &run) {
        return Ok(submitted(&m.create_request, &model_id));
    }
    if state.model(&body.base_model).is_none() && !state.served_models().contains(&body.base_model) {
        return Err(PreviewError(bad(format!(
            "base_model {:?} is not served here (served: {})",
            body.base_model,
            state.served_models().join(", ")
        ))));
    }
    let lora = body.lora_config.ok_or_else(|| bad("lora_config is required: only LoRA models are trained"))?;
    if !(1..=256).contains(&lora.rank) {
        return Err(PreviewError(bad(format!("lora_config.rank {}: expected 1 to 256", lora.rank))));
    }
    let modules = Modules { attn: lora.train_attn, mlp: lora.train_mlp, unembed: lora.train_unembed };
    if !modules.any() {
        return Err(PreviewError(bad("train_attn, train_mlp and train_unembed are all false: nothing would train")));
    }
    if let Some(kind) = body.optimizer_config.as_ref().and_then(|o| o.get("type")).and_then(Value::as_str) {
        if kind != "adamw" {
            return Err(PreviewError(bad(format!("optimizer {kind:?} is not served: only adamw"))));
        }
    }
    let spec = LoraSpec { rank: lora.rank, seed: lora.seed, modules };
    let (request_id, promise) = register_model(&state, &caller.entity, &run, &body.base_model, spec, None).await?;
    let (id, base, entity) = (model_id.clone(), body.base_model, caller.entity.clone());
    tokio::task::spawn_blocking(move || {
        let outcome = match trainer.create(&entity, &id, &base, spec) {
            Ok(()) => Outcome::Json(json!({ "model_id": id, "type": "create_model" })),
            Err(e) => {
                t.remove_model(&run);
                Outcome::failed(e)
            }
        };
        promise.set(outcome);
    });
    Ok(submitted(&request_id, &model_id))
}

#[derive(Deserialize)]
pub struct ModelRef {
    model_id: String,
}

#[utoipa::path(
    post,
    operation_id = "tinker_get_info",
    path = "/get_info",
    tag = "tinker",
    summary = "A training model's base model, rank and tokenizer",
    request_body = crate::openapi::tinker::TinkerModelRef,
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn get_info(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    TinkerJson(body): TinkerJson<ModelRef>,
) -> Result<Json<Value>> {
    let m = state.tinker().model_named(&caller.entity, &body.model_id).ok_or_else(|| ApiError::not_found("model"))?;
    Ok(Json(json!({
        "model_id": body.model_id,
        "model_data": {
            "model_name": m.base_model,
            "arch": "llama",
            // A local directory (`AutoTokenizer.from_pretrained` takes it) on this machine.
            "tokenizer_id": state.tokenizer_dir(&m.base_model).map(|d| d.display().to_string()),
        },
        "optimizer_config": { "type": "adamw" },
        "is_lora": true,
        "lora_rank": m.rank,
        "model_name": m.base_model,
        "type": "get_info",
    })))
}

/// Registers model `run` of `entity` (and its tandem record, project `tinker`) before its
/// creation runs: its future, and the promise that completes it. In a cluster its session's row
/// notes how to rebuild it (`lora`, and the saved state it is `loaded` from).
pub(super) async fn register_model(
    state: &AppState,
    entity: &str,
    run: &RunId,
    base_model: &str,
    lora: LoraSpec,
    loaded: Option<String>,
) -> Result<(String, Promise)> {
    let t = state.tinker();
    // Checked and taken in one step: concurrent creations each hold a place until they are
    // entered or fail (issue 50: 16 at once had left an entity with 8 models).
    let _place = t.reserve_model(entity).map_err(tinker_error)?;
    // The model is a tandem model of the entity too: its sampler weights are its checkpoints,
    // served by every inference route and shown on the dashboard.
    let new = tandem_store::NewModel {
        entity: entity.to_string(),
        project: "tinker".into(),
        name: run.record_name(),
        base_model: base_model.to_string(),
    };
    let (record, created) = state.store().create_model(&new, true).await.map_err(ApiError::from)?;
    let (request_id, promise) = new_future(t, entity, run.session())?;
    let entry = ModelEntry::new(run.clone(), entity, base_model, lora.rank, &request_id, record.id);
    if !t.enter_model(Arc::new(entry)) {
        // The session ended meanwhile: the record made for it goes too (one found is kept).
        if created {
            if let Err(e) = state.store().delete_model(entity, record.id).await {
                tracing::warn!(error = %e, "could not remove the record of a model whose session ended");
            }
        }
        return Err(ApiError::not_found("session").into());
    }
    let noted = ModelSpec {
        seq: run.seq(),
        base_model: base_model.to_string(),
        rank: lora.rank,
        seed: lora.seed,
        modules: lora.modules,
        record: record.id,
        loaded,
    };
    if let Err(e) = super::resume::record_model(state, entity, run, noted).await {
        t.remove_model(run);
        return Err(tinker_error(e).into());
    }
    Ok((request_id, promise))
}
