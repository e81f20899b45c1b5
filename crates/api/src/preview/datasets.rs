//! Datasets for SFT jobs: ART uploads its JSONL to W&B artifacts, which an offline server
//! cannot read, so tandem keeps them itself. `POST /datasets?project=P&name=N` with the JSONL
//! file as the body stores it as the next version of `{entity}/{P}/{N}` and answers the
//! `wandb-artifact:///{entity}/{P}/{N}:vK` URL an SFT job's `training_data_url` may name.

use crate::auth::Caller;
use crate::body::{page_request, path_id};
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::views;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::Json;
use serde_json::Value;
use std::collections::HashMap;
use tandem_core::names::name_problem;
use tandem_core::sft::{parse_dataset, DatasetLimits};
use tandem_core::validate::Validator;
use tandem_store::{NewDataset, StoreError};

fn not_found(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found("dataset"),
        other => other.into(),
    }
}

/// `project` and `name` from the query, with the rules of a model name (they form an address).
fn names(query: &HashMap<String, String>) -> Result<(String, String), ApiError> {
    let mut v = Validator::new("query");
    let mut get = |key: &str| -> Option<String> {
        let Some(value) = query.get(key) else {
            v.at(key, |v| v.error("missing", "Field required", &Value::Null));
            return None;
        };
        match name_problem(value) {
            Some(why) => {
                v.at(key, |v| v.value_error(&Value::String(value.clone()), &format!("{key} {why}")));
                None
            }
            None => Some(value.clone()),
        }
    };
    let (project, name) = (get("project"), get("name"));
    match (project, name) {
        (Some(p), Some(n)) => Ok((p, n)),
        _ => Err(ApiError::validation(v.into_errors())),
    }
}

#[utoipa::path(
    operation_id = "upload_dataset",
    post,
    path = "/datasets",
    tag = "training",
    summary = "Upload an SFT dataset (JSONL of chat rows) as the next version of a name",
    params(crate::openapi::bodies::DatasetAddress),
    request_body(content = String, content_type = "text/plain", description = "One JSON object per line: {\"messages\": [...], \"tools\": [...]}"),
    responses(
        (status = 200, body = crate::views::DatasetView, links(("dataset" = (operation_id = "get_dataset", parameters(("dataset_id" = "$response.body#/id")))), ("deleteDataset" = (operation_id = "delete_dataset", parameters(("dataset_id" = "$response.body#/id")))))),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 403, description = "The entity's storage quota would be exceeded; nothing was written", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn upload(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Result<Json<views::DatasetView>, PreviewError> {
    let (project, name) = names(&query)?;
    // Parsing a large file is CPU work: off the async workers.
    let data = body.to_vec();
    let (data, rows) = tokio::task::spawn_blocking(move || {
        let mut v = Validator::new("body");
        let rows = match std::str::from_utf8(&data) {
            Ok(text) => parse_dataset(&mut v, text, &DatasetLimits::default()).map(|r| r.len()),
            Err(e) => {
                v.error("utf8_invalid", format!("the dataset is not UTF-8 text: {e}"), &Value::Null);
                None
            }
        };
        (data, rows.ok_or(v))
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, format!("dataset parse task failed: {e}")))?;
    let rows = rows.map_err(|v| ApiError::validation(v.into_errors()))?;
    // With a blob store the bytes go there first (under their hash), then the row names them.
    let data = match state.checkpoints().remote() {
        Some(blobs) => {
            let size = data.len() as i64;
            tandem_store::DatasetData::Blob { key: blobs.put_dataset(data).await?, size }
        }
        None => tandem_store::DatasetData::Inline(data),
    };
    let new = NewDataset { entity: caller.entity.clone(), project, name, num_rows: rows as i64, data };
    let dataset = state.store().create_dataset(&new).await?;
    tracing::info!(dataset_id = %dataset.id, rows, "dataset stored");
    Ok(Json(views::dataset(&dataset)))
}

#[utoipa::path(
    operation_id = "list_datasets",
    get,
    path = "/datasets",
    tag = "training",
    summary = "The key's datasets",
    params(crate::openapi::bodies::PageParams, crate::openapi::bodies::ProjectFilter),
    responses(
        (status = 200, body = crate::views::ListView<crate::views::DatasetView>),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<views::ListView<views::DatasetView>>, PreviewError> {
    let page = page_request(&query, true)?;
    let project = query.get("project").map(String::as_str);
    let items = state.store().list_datasets(&caller.entity, project, page).await?;
    Ok(Json(views::list(&items, |d| d.id, views::dataset)))
}

#[utoipa::path(
    operation_id = "get_dataset",
    get,
    path = "/datasets/{dataset_id}",
    tag = "training",
    summary = "A dataset",
    params(("dataset_id" = Uuid, Path, description = "A dataset id (UUID)")),
    responses(
        (status = 200, body = crate::views::DatasetView),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such dataset for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<views::DatasetView>, PreviewError> {
    let id = path_id(&id, "dataset")?;
    let d = state.store().get_dataset(&caller.entity, id).await.map_err(not_found)?;
    Ok(Json(views::dataset(&d)))
}

#[utoipa::path(
    operation_id = "delete_dataset",
    delete,
    path = "/datasets/{dataset_id}",
    tag = "training",
    summary = "Delete a dataset version",
    params(("dataset_id" = Uuid, Path, description = "A dataset id (UUID)")),
    responses(
        (status = 200, body = crate::views::DatasetDeleted),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such dataset for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<views::DatasetDeleted>, PreviewError> {
    let id = path_id(&id, "dataset")?;
    state.store().delete_dataset(&caller.entity, id).await.map_err(not_found)?;
    Ok(Json(views::DatasetDeleted { id, deleted: true }))
}
