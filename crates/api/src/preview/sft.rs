//! `POST /sft-training-jobs`: supervised fine-tuning on a dataset uploaded to tandem, named by
//! `training_data_url` (`wandb-artifact:///{entity}/{project}/{name}:vN`, as ART sends it). The
//! job runs and reports exactly like an RL job (events under `/training-jobs/{id}/events`) and
//! makes one checkpoint.

use crate::auth::Caller;
use crate::body::PreviewJson;
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::views;
use crate::AppState;
use axum::extract::{Extension, State};
use axum::Json;
use serde_json::Value;
use tandem_core::records::JobKind;
use tandem_core::sequences::ModelTokenizer;
use tandem_core::sft::{
    parse_artifact_url, parse_dataset, parse_sft_config, sft_batches, DatasetLimits, DatasetVersion, SftConfig,
};
use tandem_core::validate::{optional, Validator};
use tandem_store::{NewJob, StoreError};

const URL_RULE: &str =
    "must be wandb-artifact:///{entity}/{project}/{name}:v{N} naming a dataset uploaded with POST /v1/preview/datasets";

fn invalid(field: &str, input: &str, why: &str) -> ApiError {
    let mut v = Validator::new("body");
    v.at(field, |v| v.value_error(&Value::String(input.into()), why));
    ApiError::validation(v.into_errors())
}

#[utoipa::path(
    operation_id = "create_sft_job",
    post,
    path = "/sft-training-jobs",
    tag = "training",
    summary = "Queue a supervised fine-tuning job",
    request_body = crate::openapi::bodies::SftJobBody,
    responses(
        (status = 200, body = crate::views::JobView, links(("job" = (operation_id = "get_training_job", parameters(("job_id" = "$response.body#/id")))), ("events" = (operation_id = "list_training_job_events", parameters(("job_id" = "$response.body#/id")))))),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 403, description = "The entity's storage quota would be exceeded; nothing was written", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model or dataset for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 429, description = "Too many pending jobs", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PreviewJson(body): PreviewJson,
) -> Result<Json<views::JobView>, PreviewError> {
    let mut v = Validator::new("body");
    let Some(obj) = v.object(&body) else { return Err(ApiError::validation(v.into_errors()).into()) };
    let model_id = v.required(obj, "model_id").and_then(|m| v.at("model_id", |v| v.uuid(m)));
    let url = v
        .required(obj, "training_data_url")
        .and_then(|u| v.at("training_data_url", |v| v.string_len(u, 1, 2048).map(str::to_string)));
    let config = v.at("config", |v| parse_sft_config(v, optional(obj, "config")));
    if let Some(x) = optional(obj, "experimental_config") {
        v.at("experimental_config", |v| v.object(x));
    }
    let (Some(model_id), Some(url), Some(config)) = (model_id, url, config) else {
        return Err(ApiError::validation(v.into_errors()).into());
    };
    let model = state.store().get_model(&caller.entity, model_id).await.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found("model"),
        other => other.into(),
    })?;
    let Some((entity, project, name, version)) = parse_artifact_url(&url) else {
        return Err(invalid("training_data_url", &url, URL_RULE).into());
    };
    // Another entity's dataset does not exist for this caller.
    let version = match version {
        DatasetVersion::Latest => None,
        DatasetVersion::V(n) => Some(n),
    };
    let found = if entity == caller.entity {
        state.store().find_dataset(entity, project, name, version).await
    } else {
        Err(StoreError::NotFound)
    };
    let dataset = found.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found("dataset"),
        other => other.into(),
    })?;
    super::jobs::check_pending_jobs(&state, &caller.entity).await?;
    let data = match state.store().dataset_data(&caller.entity, dataset.id).await? {
        tandem_store::DatasetData::Inline(bytes) => bytes,
        tandem_store::DatasetData::Blob { key, .. } => match state.checkpoints().remote() {
            Some(blobs) => blobs.get_dataset(&key).await?,
            None => {
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    "this dataset is in the cluster's blob store, and this server runs without --blob-store",
                )
                .into())
            }
        },
    };
    let held = super::jobs::INPUT_CHECKS.enter(&caller.entity).await?;
    let (rows, tokens) = check_trainable(&state, held, &model.base_model, data, config.clone()).await?;
    super::jobs::check_job_tokens(&state, "training_data_url", tokens)?;
    let new = NewJob {
        model_id: model.id,
        kind: JobKind::Sft,
        config: serde_json::to_value(&config).unwrap_or(Value::Null),
        inputs: Value::Array(rows),
        rollout: None,
    };
    let job = super::jobs::queue_job(&state, &new).await?;
    tracing::info!(job_id = %job.id, model_id = %model.id, dataset_id = %dataset.id, "SFT job queued");
    state.wake_jobs();
    Ok(Json(views::job(&job)))
}

/// Reads the dataset's rows and renders them as the trainer will, so that a conversation the
/// template cannot split, or a learning-rate list shorter than the batches, is a 422 now; with
/// the rows, the tokens the job trains on (0 without a served model to count them).
async fn check_trainable(
    state: &AppState,
    held: crate::heavy::Entered,
    base_model: &str,
    data: Vec<u8>,
    config: SftConfig,
) -> Result<(Vec<Value>, u64), ApiError> {
    let served = state.model(base_model).cloned();
    held.blocking("the SFT check", move || {
        let text = String::from_utf8_lossy(&data);
        let mut v = Validator::new("body");
        let rows = parse_dataset(&mut v, &text, &DatasetLimits::default())
            .ok_or_else(|| invalid("training_data_url", "", "the stored dataset no longer parses"))?;
        let Some(served) = served else { return Ok((rows, 0)) };
        let context = served.info().context_len;
        let tok = ModelTokenizer(served);
        let (batches, _) =
            sft_batches(&rows, &config, &tok, context).map_err(|e| invalid("training_data_url", "", &e))?;
        if batches.is_empty() {
            return Err(invalid("training_data_url", "", "no conversation of the dataset has a token to train on"));
        }
        if config.learning_rate.at(batches.len() - 1).is_none() {
            let why = format!("learning_rate lists fewer rates than the {} batches of the dataset", batches.len());
            let mut v = Validator::new("body");
            v.at("config", |v| v.at("learning_rate", |v| v.value_error(&Value::Null, &why)));
            return Err(ApiError::validation(v.into_errors()));
        }
        let tokens = batches.iter().flatten().map(|s| s.tokens.len() as u64).sum();
        Ok((rows, tokens))
    })
    .await?
}
