//! Model records: create (idempotent with `return_existing`), get, list, delete.

use super::owned_model;
use crate::auth::Caller;
use crate::body::{page_request, PreviewJson};
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::views;
use crate::AppState;
use axum::extract::{Extension, Path, Query, State};
use axum::Json;
use serde_json::Value;
use std::collections::HashMap;
use tandem_core::names::name_problem;
use tandem_core::validate::{optional, Validator};
use tandem_store::NewModel;

/// A validated create request.
struct CreateModel {
    entity: Option<String>,
    new: NewModel,
    return_existing: bool,
}

fn validate_create(body: &Value, served: &[String]) -> Result<CreateModel, ApiError> {
    let mut v = Validator::new("body");
    let Some(obj) = v.object(body) else { return Err(ApiError::validation(v.into_errors())) };
    let name_field = |v: &mut Validator, key: &str| -> Option<String> {
        let value = v.required(obj, key)?;
        v.at(key, |v| {
            let s = v.string(value)?;
            match name_problem(s) {
                Some(why) => {
                    v.value_error(value, &format!("{key} {why}"));
                    None
                }
                None => Some(s.to_string()),
            }
        })
    };
    let project = name_field(&mut v, "project");
    let name = name_field(&mut v, "name");
    let entity = optional(obj, "entity").and_then(|e| v.at("entity", |v| v.string(e).map(str::to_string)));
    let served_refs: Vec<&str> = served.iter().map(String::as_str).collect();
    let base_model = v
        .required(obj, "base_model")
        .and_then(|b| v.at("base_model", |v| v.literal(b, &served_refs)).map(str::to_string));
    let return_existing = optional(obj, "return_existing").and_then(|r| v.at("return_existing", |v| v.boolean(r)));
    if v.has_errors() {
        return Err(ApiError::validation(v.into_errors()));
    }
    let (Some(project), Some(name), Some(base_model)) = (project, name, base_model) else {
        return Err(ApiError::validation(v.into_errors()));
    };
    Ok(CreateModel {
        entity,
        new: NewModel { entity: String::new(), project, name, base_model },
        return_existing: return_existing.unwrap_or(false),
    })
}

#[utoipa::path(
    operation_id = "create_model",
    post,
    path = "/models",
    tag = "training",
    summary = "Create a model (or return the existing one)",
    request_body = crate::openapi::bodies::CreateModelBody,
    responses(
        (status = 200, body = crate::views::ModelView, links(("model" = (operation_id = "get_model", parameters(("model_id" = "$response.body#/id")))), ("deleteModel" = (operation_id = "delete_model", parameters(("model_id" = "$response.body#/id")))), ("checkpoints" = (operation_id = "list_checkpoints", parameters(("model_id" = "$response.body#/id")))), ("logs" = (operation_id = "list_logs", parameters(("model_id" = "$response.body#/id")))), ("log" = (operation_id = "create_log", parameters(("model_id" = "$response.body#/id")))))),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 403, description = "Another entity, or the entity's storage quota would be exceeded (nothing was written)", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 409, description = "The name exists", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PreviewJson(body): PreviewJson,
) -> Result<Json<views::ModelView>, PreviewError> {
    let mut req = validate_create(&body, state.served_models())?;
    if let Some(entity) = req.entity.filter(|e| *e != caller.entity) {
        let msg =
            format!("this API key belongs to entity '{}' and cannot create models in entity '{entity}'", caller.entity);
        return Err(ApiError::new(ErrorKind::Forbidden, msg).into());
    }
    req.new.entity = caller.entity;
    let (model, created) = state.store().create_model(&req.new, req.return_existing).await?;
    if created {
        tracing::info!(model_id = %model.id, project = %model.project, name = %model.name, "model created");
    }
    Ok(Json(views::model(&model)))
}

#[utoipa::path(
    operation_id = "get_model",
    get,
    path = "/models/{model_id}",
    tag = "training",
    summary = "A model",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)")),
    responses(
        (status = 200, body = crate::views::ModelView),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model_id): Path<String>,
) -> Result<Json<views::ModelView>, PreviewError> {
    let model = owned_model(&state, &caller, &model_id).await?;
    Ok(Json(views::model(&model)))
}

#[utoipa::path(
    operation_id = "list_models",
    get,
    path = "/models",
    tag = "training",
    summary = "The key's models",
    params(
        crate::openapi::bodies::PageParams,
        crate::openapi::bodies::ProjectFilter,
        ("search" = Option<String>, Query, description = "Only models whose `project/name` contains this text (ASCII case-insensitive, literal), at most 256 characters"),
        ("summary" = Option<bool>, Query, description = "`true`: add each model's progress (latest step, last activity, last reward). Read as FastAPI reads a boolean (`1`/`true`/`yes`/`on`, `0`/`false`/`no`/`off`); anything else is a 422")
    ),
    responses(
        (status = 200, body = crate::views::ListView<crate::views::ModelView>),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<views::ListView<views::ModelView>>, PreviewError> {
    let page = page_request(&query, true)?;
    let project = query.get("project").map(String::as_str);
    let search = query.get("search").map(String::as_str).filter(|s| !s.is_empty());
    if search.is_some_and(|s| s.chars().count() > 256) {
        let mut v = Validator::new("query");
        v.at("search", |v| v.value_error(&serde_json::json!(search), "search must be at most 256 characters"));
        return Err(ApiError::validation(v.into_errors()).into());
    }
    let summary = match query.get("summary").map(|s| query_bool(s)) {
        None => false,
        Some(Some(b)) => b,
        Some(None) => {
            let mut v = Validator::new("query");
            v.at("summary", |v| v.value_error(&serde_json::json!(query["summary"]), "summary must be a boolean"));
            return Err(ApiError::validation(v.into_errors()).into());
        }
    };
    let models = state.store().list_models(&caller.entity, project, search, page).await?;
    let mut list = views::list(&models, |m| m.id, views::model);
    if summary {
        // A page is at most 100 models; each summary is a few indexed reads.
        for view in &mut list.data {
            view.summary = Some(views::model_summary(&state.store().model_summary(view.id).await?));
        }
    }
    Ok(Json(list))
}

/// A query parameter as a boolean, the spellings FastAPI (pydantic) takes; `None` for any other.
fn query_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Some(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

#[utoipa::path(
    operation_id = "delete_model",
    delete,
    path = "/models/{model_id}",
    tag = "training",
    summary = "Delete a model with its logs, jobs and checkpoints",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)")),
    responses(
        (status = 200, body = crate::views::ModelDeleted),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 409, description = "A job of the model is running", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model_id): Path<String>,
) -> Result<Json<views::ModelDeleted>, PreviewError> {
    let model = owned_model(&state, &caller, &model_id).await?;
    let deleted = state.store().delete_model(&caller.entity, model.id).await?;
    super::checkpoints::remove_files(&state, &deleted.deleted_checkpoints).await;
    tracing::info!(model_id = %model.id, checkpoints = deleted.deleted_checkpoints.len(), "model deleted");
    Ok(Json(views::ModelDeleted {
        model_id: model.id,
        deleted_checkpoints: deleted.deleted_checkpoints.len(),
        deleted_run: true,
    }))
}
