//! `GET /v1/tokenizer`: a served base model's tokenizer as a tar archive of the files a Hugging
//! Face client loads offline with tandem's ids and chat template, for clients on other machines
//! (the tinker SDK, tinker-cookbook and ART load tokenizers by directory or by name). `layout=hub`
//! gives the same files as a hub cache, to unpack into `HF_HUB_CACHE`.

use crate::error::{ApiError, ErrorKind, OpenAiError};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use tandem_core::hf_files;

/// Archives already built, by (model, hub layout): a model's tokenizer never changes while the
/// process serves it, and building one serialises the whole vocabulary (megabytes for Qwen's), so
/// a thousand requests cost one build and share its bytes. Bounded by the served models (two
/// layouts each); the lock also makes concurrent first requests build once.
#[derive(Default)]
pub struct TarCache(tokio::sync::Mutex<HashMap<(String, bool), Bytes>>);

/// The query (documented through utoipa; read from the raw pairs).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TokenizerQuery {
    /// A served base model's id, as `/v1/models` lists it.
    pub model: String,
    /// `dir` (default): one directory named after the model; `hub`: a hub cache's
    /// `models--org--name/` tree.
    pub layout: Option<String>,
}

#[utoipa::path(
    get,
    operation_id = "tokenizer_files",
    path = "/v1/tokenizer",
    tag = "inference",
    summary = "A base model's tokenizer as files a Hugging Face client loads (a tar archive)",
    params(TokenizerQuery),
    responses(
        (status = 200, description = "`{model, / as -- and : as _}/tokenizer.json`, `tokenizer_config.json` and `config.json`, or with `layout=hub` `models--{org}--{name}/refs/main` and `snapshots/{revision}/...`", content_type = "application/x-tar", body = String),
        crate::openapi::bodies::InferenceErrors
    ),
    security(("bearer" = []))
)]
pub async fn files(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, OpenAiError> {
    // Read by hand, not by serde: a missing field is an error in the OpenAI shape, not axum's text.
    let q = TokenizerQuery {
        model: query
            .get("model")
            .cloned()
            .ok_or_else(|| ApiError::bad_param("model", "model (a served base model's id) is required"))?,
        layout: query.get("layout").cloned(),
    };
    let hub = match q.layout.as_deref() {
        None | Some("dir") => false,
        Some("hub") => true,
        Some(other) => {
            return Err(ApiError::bad_param("layout", format!("layout must be dir or hub, not {other:?}")).into())
        }
    };
    let model = state
        .model(&q.model)
        .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("The model `{}` does not exist.", q.model)))?
        .clone();
    let mut cache = state.tokenizer_tars().0.lock().await;
    if let Some(tar) = cache.get(&(q.model.clone(), hub)) {
        return Ok(([(header::CONTENT_TYPE, "application/x-tar")], tar.clone()).into_response());
    }
    let id = q.model.clone();
    let tar = tokio::task::spawn_blocking(move || {
        let files = model.tokenizer_files();
        if files.is_empty() {
            return Err(ApiError::new(ErrorKind::NotFound, format!("the model `{id}` has no tokenizer files to give")));
        }
        let files = if hub {
            hf_files::hub_layout(&id, &files)
        } else {
            let folder = hf_files::dir_name(&id);
            files.into_iter().map(|(name, bytes)| (format!("{folder}/{name}"), bytes)).collect()
        };
        crate::preview::checkpoints::tar_of(&files).map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))??;
    let tar = Bytes::from(tar);
    cache.insert((q.model, hub), tar.clone());
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], tar).into_response())
}
