//! Checkpoints of a model: cursor-paged listing (ART learns the latest step from
//! `limit=1&order=desc`) and deletion by step.

use super::owned_model;
use crate::auth::Caller;
use crate::body::{page_request, PreviewJson};
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::views;
use crate::AppState;
use axum::extract::{Extension, Path, Query, State};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use tandem_core::records::{Checkpoint, ModelRecord};
use tandem_core::validate::{Loc, Validator};

#[utoipa::path(
    operation_id = "list_checkpoints",
    get,
    path = "/models/{model_id}/checkpoints",
    tag = "training",
    summary = "A model's checkpoints",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)"), crate::openapi::bodies::PageParams),
    responses(
        (status = 200, body = crate::views::ListView<crate::views::CheckpointView>),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<views::ListView<views::CheckpointView>>, PreviewError> {
    let page = page_request(&query, true)?;
    let model = owned_model(&state, &caller, &model_id).await?;
    let checkpoints = state.store().list_checkpoints(model.id, page).await?;
    Ok(Json(views::list(&checkpoints, |c| c.id, views::checkpoint)))
}

fn validate_steps(body: &Value, max: usize) -> Result<Vec<i64>, ApiError> {
    let mut v = Validator::new("body");
    let Some(obj) = v.object(body) else { return Err(ApiError::validation(v.into_errors())) };
    let mut steps = Vec::new();
    if let Some(value) = v.required(obj, "steps") {
        v.at("steps", |v| {
            for (i, s) in v.array_max(value, max).cloned().unwrap_or_default().iter().enumerate() {
                if let Some(step) = v.at(i, |v| v.integer(s)) {
                    steps.push(step);
                }
            }
        });
    }
    v.finish(steps).map_err(ApiError::validation)
}

#[utoipa::path(
    operation_id = "delete_checkpoints",
    delete,
    path = "/models/{model_id}/checkpoints",
    tag = "training",
    summary = "Delete checkpoints by step",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)")),
    request_body = crate::openapi::bodies::DeleteCheckpointsBody,
    responses(
        (status = 200, body = crate::views::CheckpointsDeleted),
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
    PreviewJson(body): PreviewJson,
) -> Result<Json<views::CheckpointsDeleted>, PreviewError> {
    let model = owned_model(&state, &caller, &model_id).await?;
    let steps = validate_steps(&body, state.limits().max_delete_steps)?;
    let out = state.store().delete_checkpoints(model.id, &steps).await?;
    remove_files(&state, &out.deleted).await;
    tracing::info!(model_id = %model.id, deleted = out.deleted.len(), "checkpoints deleted");
    Ok(Json(views::CheckpointsDeleted { deleted_count: out.deleted.len(), not_found_steps: out.not_found_steps }))
}

/// Removes deleted checkpoints' files. The rows are already gone, so nothing serves them; a file
/// that cannot be removed now is swept at the next start.
pub(crate) async fn remove_files(state: &AppState, deleted: &[Checkpoint]) {
    if let Some(backend) = state.backend() {
        for c in deleted {
            backend.forget_adapter(&c.id.to_string());
        }
    }
    for c in deleted {
        if let Err(e) = state.checkpoints().remove(&c.path).await {
            tracing::warn!(path = %c.path, error = %e, "could not remove checkpoint files");
        }
    }
}

/// The files of a PEFT adapter directory, as tandem writes them and PEFT and vLLM read them.
pub(crate) const ADAPTER_FILES: [&str; 2] = ["adapter_config.json", "adapter_model.safetensors"];

/// A checkpoint's adapter as one uncompressed tar archive of a directory named after it (the
/// safetensors data does not compress). Built on a blocking thread from the checkpoint's files.
fn adapter_tar(dir: std::path::PathBuf, folder: String) -> std::io::Result<Vec<u8>> {
    let files = ADAPTER_FILES
        .iter()
        .map(|name| Ok((format!("{folder}/{name}"), std::fs::read(dir.join(name))?)))
        .collect::<std::io::Result<Vec<_>>>()?;
    tar_of(&files)
}

/// Regular files (path in the archive, bytes) as one uncompressed tar archive, deterministic
/// (no times or owners): the PEFT adapter and the tokenizer downloads.
pub(crate) fn tar_of(files: &[(String, Vec<u8>)]) -> std::io::Result<Vec<u8>> {
    let mut out = tar::Builder::new(Vec::new());
    out.mode(tar::HeaderMode::Deterministic);
    for (name, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        out.append_data(&mut header, name, bytes.as_slice())?;
    }
    out.into_inner()
}

#[utoipa::path(
    operation_id = "export_checkpoint_adapter",
    get,
    path = "/models/{model_id}/checkpoints/{step}/adapter",
    tag = "training",
    summary = "Download a checkpoint as a PEFT LoRA adapter (a tar archive of one directory)",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)"), ("step" = i64, Path, description = "A live checkpoint's step")),
    responses(
        (status = 200, description = "`{project}-{name}-step{N}/adapter_config.json` and `adapter_model.safetensors`", content_type = "application/x-tar", body = String),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model or live checkpoint for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "The step is not a whole number", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn export(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((model_id, step)): Path<(String, String)>,
) -> Result<axum::response::Response, PreviewError> {
    use axum::http::{header, HeaderValue};
    use axum::response::IntoResponse;
    let (model, step, dir) = checkpoint_files(&state, &caller, &model_id, &step).await?;
    // Anything but ASCII letters, digits and `-._` becomes `_`: the archive's path and the
    // header's file name stay plain.
    let folder: String = format!("{}-{}-step{step}", model.project, model.name)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-._".contains(c) { c } else { '_' })
        .collect();
    let name = folder.clone();
    let bytes = tokio::task::spawn_blocking(move || adapter_tar(dir, name))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("export task failed: {e}")))?
        .map_err(|e| match e.kind() {
            // Deleted between the read of its row and of its files.
            std::io::ErrorKind::NotFound => ApiError::not_found("checkpoint"),
            _ => ApiError::new(ErrorKind::Internal, format!("could not read the checkpoint's files: {e}")),
        })?;
    let mut r = bytes.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-tar"));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{folder}.tar\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(r)
}

/// A live checkpoint of the caller's model: the model, the step and the checkpoint's directory
/// (404 for another entity's model or a step with no live checkpoint).
async fn checkpoint_files(
    state: &AppState,
    caller: &Caller,
    model_id: &str,
    step: &str,
) -> Result<(ModelRecord, i64, std::path::PathBuf), PreviewError> {
    let model = owned_model(state, caller, model_id).await?;
    let Ok(step) = step.parse::<i64>() else {
        let mut v = Validator::new("path");
        v.at("step", |v| {
            v.error(
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
                &json!(step),
            )
        });
        return Err(ApiError::validation(v.into_errors()).into());
    };
    let checkpoint = state.store().get_checkpoint(model.id, step).await.map_err(|e| match e {
        tandem_store::StoreError::NotFound => ApiError::not_found("checkpoint"),
        other => other.into(),
    })?;
    let dir = state
        .checkpoints()
        .local_dir(&checkpoint.path)
        .await?
        .ok_or_else(|| ApiError::new(ErrorKind::Internal, "the checkpoint's files are missing"))?;
    Ok((model, step, dir))
}

/// Merged exports run one at a time, server-wide: each reads the whole base model and writes a
/// file as large.
static MERGING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MergedQuery {
    /// Type of the weight matrices: `base` (each tensor keeps the base's type; default), `f32`,
    /// `f16` or `q8_0`.
    pub format: Option<String>,
}

#[utoipa::path(
    operation_id = "export_checkpoint_merged",
    get,
    path = "/models/{model_id}/checkpoints/{step}/merged",
    tag = "training",
    summary = "Download a checkpoint merged into its base model, as one GGUF file (llama.cpp, Ollama)",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)"), ("step" = i64, Path, description = "A live checkpoint's step"), MergedQuery),
    responses(
        (status = 200, description = "The base GGUF with `W + scale B A` in every adapted projection, all metadata kept", content_type = "application/octet-stream", body = String),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model or live checkpoint for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 409, description = "The base model is not served here, or not from a GGUF file", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "The step is not a whole number, or an unknown format", body = crate::openapi::bodies::ValidationErrorBody),
        (status = 429, description = "Another merged export is being written; retry", body = crate::openapi::bodies::PreviewErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn export_merged(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((model_id, step)): Path<(String, String)>,
    Query(query): Query<MergedQuery>,
) -> Result<axum::response::Response, PreviewError> {
    use axum::http::{header, HeaderValue};
    use tandem_core::inference::{ExportError, MERGE_FORMATS};
    let format = query.format.unwrap_or_else(|| "base".into());
    if !MERGE_FORMATS.contains(&format.as_str()) {
        let mut v = Validator::new("query");
        v.at("format", |v| {
            v.error("enum", format!("Input should be one of {}", MERGE_FORMATS.join(", ")), &json!(format))
        });
        return Err(ApiError::validation(v.into_errors()).into());
    }
    let (model, step, dir) = checkpoint_files(&state, &caller, &model_id, &step).await?;
    let served = state.model(&model.base_model).cloned().ok_or_else(|| {
        ApiError::new(ErrorKind::Conflict, format!("the base model {} is not served here", model.base_model))
    })?;
    let Ok(permit) = MERGING.try_acquire() else {
        return Err(ApiError::new(
            ErrorKind::TooManyRequests,
            "a merged export is being written; retry when it is done",
        )
        .with_retry_after(5)
        .into());
    };
    // Written beside the checkpoints (the same disk), read back as a stream, unlinked at once.
    let tmp = tempfile::Builder::new()
        .prefix(".merge-")
        .tempdir_in(state.checkpoints().dir().root())
        .map_err(|e| ApiError::from(tandem_store::StoreError::from(e)))?;
    let out = tmp.path().join("merged.gguf");
    // The permit and the temporary directory belong to the merge, not to this request: a client
    // that leaves drops this future, but the blocking merge runs on, and must keep holding the
    // one-at-a-time permit and then remove its file (otherwise every retry starts another merge
    // beside the orphaned ones, each as large as the model).
    let file = tokio::task::spawn_blocking(move || {
        let held = (permit, tmp);
        served.export_merged(&dir, &out, &format)?;
        let file = std::fs::File::open(&out).map_err(|e| ExportError::Failed(e.to_string()));
        drop(held); // unlinks the file; the open handle still reads it
        file
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, format!("merge task failed: {e}")))?
    .map_err(|e| match e {
        ExportError::Unsupported(m) => ApiError::new(ErrorKind::Conflict, m),
        // A full disk is the client's 507 (retry once space returns), not the server's fault.
        ExportError::Failed(m) if m.contains("os error 28") => {
            ApiError::new(ErrorKind::InsufficientStorage, "the server is out of disk space for the merged file")
        }
        ExportError::Failed(m) => ApiError::new(ErrorKind::Internal, format!("the merge failed: {m}")),
    })?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut r = axum::response::Response::new(axum::body::Body::from_stream(FileChunks::new(file)));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    let name: String = format!("{}-{}-step{step}.gguf", model.project, model.name)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-._".contains(c) { c } else { '_' })
        .collect();
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(r)
}

/// An open file as a stream of 1 MiB chunks, read on a blocking thread.
struct FileChunks {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
}

impl FileChunks {
    fn new(mut file: std::fs::File) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match std::io::Read::read(&mut file, &mut buf) {
                    Ok(0) => break,
                    // A client that left closed the channel: stop reading.
                    Ok(n) if tx.blocking_send(Ok(buf[..n].to_vec())).is_err() => break,
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        break;
                    }
                }
            }
        });
        FileChunks { rx }
    }
}

impl futures_core::Stream for FileChunks {
    type Item = std::io::Result<Vec<u8>>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// A 422 in the preview shape, at `loc`, saying `why`.
fn body_error(loc: Vec<Loc>, why: &str, input: Value) -> ApiError {
    ApiError::field(loc, "value_error", format!("Value error, {why}"), input)
}

/// Most entries an uploaded archive may hold (a PEFT directory has a few: the two files, a
/// README, maybe a tokenizer copy); more is not an adapter.
const MAX_ARCHIVE_ENTRIES: usize = 64;
/// Largest `adapter_config.json` accepted (as for runtime adapters).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The two adapter files out of an uploaded tar archive: both at its top level or both in the
/// same directory (`./` prefixes allowed); other files (a README, a trainer's `checkpoint-*/`) are
/// skipped; links, devices and the like are refused.
fn adapter_files(bytes: &[u8]) -> Result<Vec<(&'static str, Vec<u8>)>, String> {
    let mut archive = tar::Archive::new(bytes);
    let mut found: Vec<(&'static str, std::path::PathBuf, Vec<u8>)> = Vec::new();
    let entries = archive.entries().map_err(|e| format!("not a tar archive: {e}"))?;
    for (i, entry) in entries.enumerate() {
        if i >= MAX_ARCHIVE_ENTRIES {
            return Err(format!("the archive holds more than {MAX_ARCHIVE_ENTRIES} entries"));
        }
        let mut entry = entry.map_err(|e| format!("not a tar archive: {e}"))?;
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            // Directories, and pax headers `git archive` writes.
            tar::EntryType::Directory | tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => return Err(format!("the archive holds a {other:?} entry; an adapter is plain files")),
        }
        let path = entry.path().map_err(|e| format!("an entry's name is unreadable: {e}"))?.into_owned();
        let Some(name) = ADAPTER_FILES.iter().find(|n| path.file_name().is_some_and(|f| f == **n)) else { continue };
        let parts: Vec<_> = path.components().filter(|c| !matches!(c, std::path::Component::CurDir)).collect();
        if parts.len() > 2 || parts.iter().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            return Err(format!(
                "{}: the adapter's files must be at the top of the archive or in one directory",
                path.display()
            ));
        }
        let folder: std::path::PathBuf = parts[..parts.len() - 1].iter().collect();
        if found.iter().any(|(n, _, _)| n == name) {
            return Err(format!("the archive holds {name} twice"));
        }
        if found.iter().any(|(_, f, _)| *f != folder) {
            return Err("the adapter's two files are in different directories".into());
        }
        if *name == "adapter_config.json" && entry.size() > MAX_CONFIG_BYTES {
            return Err(format!("{name} is larger than {MAX_CONFIG_BYTES} bytes"));
        }
        let mut data = Vec::with_capacity(entry.size().min(bytes.len() as u64) as usize);
        std::io::Read::read_to_end(&mut entry, &mut data).map_err(|e| format!("{name}: {e}"))?;
        found.push((name, folder, data));
    }
    for name in ADAPTER_FILES {
        if !found.iter().any(|(n, _, _)| *n == name) {
            return Err(format!("the archive has no {name}"));
        }
    }
    Ok(found.into_iter().map(|(n, _, d)| (n, d)).collect())
}

/// Imports run one at a time over all entities, and one per entity at a time (another is a 429):
/// each holds an archive, its files and the tensors loaded from them.
static IMPORTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
static IMPORTS_PER_ENTITY: std::sync::LazyLock<std::sync::Arc<crate::limiter::EntityLimiter>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(crate::limiter::EntityLimiter::new(1)));

/// Writes, checks and records one import. Runs as a task of its own, so that a client leaving
/// half-way leaves no files and no cached adapter behind: every failure removes both.
async fn run_import(
    state: AppState,
    model: tandem_core::records::ModelRecord,
    served: tandem_core::inference::ModelHandle,
    body: axum::body::Bytes,
) -> Result<Checkpoint, ApiError> {
    let id = tandem_core::new_id();
    let relative = tandem_store::CheckpointDir::relative_path(model.id, id);
    let (dir, rel, owner) = (state.checkpoints().dir().clone(), relative.clone(), model.entity.clone());
    // Unpack, write durably and check against the base model (which loads and caches it, so it
    // is served at once), off the async workers; each copy is dropped once the next exists.
    let written = tokio::task::spawn_blocking(move || -> Result<i64, ApiError> {
        let files = adapter_files(&body).map_err(|m| body_error(vec![Loc::from("body")], &m, Value::Null))?;
        drop(body);
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        let size: i64 = refs.iter().map(|(_, b)| b.len() as i64).sum();
        let path = dir.write_atomic(&rel, &refs).map_err(ApiError::from)?;
        drop(files);
        let adapter = tandem_core::inference::AdapterRef {
            checkpoint_id: id.to_string(),
            name: id.to_string(),
            owner,
            path,
            confined_to: None,
        };
        served.load_adapter(&adapter).map_err(|m| {
            body_error(
                vec![Loc::from("body")],
                &format!("the adapter does not fit {}: {m}", served.info().id),
                Value::Null,
            )
        })?;
        Ok(size)
    })
    .await;
    let recorded = match written {
        // Write, then record: on a shared blob store, every node finds the files of what it finds
        // recorded.
        Ok(Ok(size)) => match state.checkpoints().upload(&relative).await {
            Ok(()) => state.store().import_checkpoint(model.id, id, &relative, size).await.map_err(ApiError::from),
            Err(e) => Err(ApiError::from(e)),
        },
        Ok(Err(e)) => Err(e),
        Err(e) => Err(ApiError::new(ErrorKind::Internal, format!("import task failed: {e}"))),
    };
    if recorded.is_err() {
        let gone =
            Checkpoint { id, model_id: model.id, step: 0, metrics: Default::default(), path: relative, created_at: 0 };
        remove_files(&state, std::slice::from_ref(&gone)).await;
    }
    recorded
}

#[utoipa::path(
    operation_id = "import_checkpoint_adapter",
    post,
    path = "/models/{model_id}/checkpoints",
    tag = "training",
    summary = "Upload a PEFT LoRA adapter as the model's next checkpoint (a tar archive)",
    params(("model_id" = Uuid, Path, description = "A model id (UUID)")),
    request_body(content = String, content_type = "application/x-tar",
                 description = "`adapter_config.json` and `adapter_model.safetensors`, at the top or in one directory"),
    responses(
        (status = 200, body = crate::views::CheckpointView),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 403, description = "The entity's storage quota would be exceeded; nothing was written", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 409, description = "A training job of the model is queued or running, or its base model is not served here", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 413, description = "Larger than the body limit", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Not a tar archive of a PEFT adapter that fits the base model", body = crate::openapi::bodies::ValidationErrorBody),
        (status = 429, description = "Another import of this entity is under way", body = crate::openapi::bodies::PreviewErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn import(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model_id): Path<String>,
    request: axum::extract::Request,
) -> Result<Json<views::CheckpointView>, PreviewError> {
    let model = owned_model(&state, &caller, &model_id).await?;
    let content_type = request.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let tar_type = content_type
        .is_some_and(|v| v.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/x-tar")));
    if !tar_type {
        return Err(body_error(
            vec![Loc::from("header"), Loc::from("content-type")],
            "send the adapter as a tar archive (Content-Type: application/x-tar)",
            json!(content_type.unwrap_or_default()),
        )
        .into());
    }
    let Some(served) = state.model(&model.base_model).cloned() else {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            format!("the base model {} is not served here", model.base_model),
        )
        .into());
    };
    let mine = IMPORTS_PER_ENTITY.acquire(&caller.entity).ok_or_else(|| {
        ApiError::new(
            ErrorKind::TooManyRequests,
            "an adapter import of this entity is under way; retry when it is done",
        )
        .with_retry_after(1)
    })?;
    let body = crate::body::read_bytes(request).await?;
    let task = tokio::spawn(async move {
        let _mine = mine;
        let _shared = IMPORTS.acquire().await;
        run_import(state, model, served, body).await
    });
    let checkpoint =
        task.await.map_err(|e| ApiError::new(ErrorKind::Internal, format!("import task failed: {e}")))??;
    tracing::info!(model_id = %checkpoint.model_id, step = checkpoint.step, "adapter imported as a checkpoint");
    Ok(Json(views::checkpoint(&checkpoint)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, bytes) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut h, name, *bytes).unwrap();
        }
        tar.into_inner().unwrap()
    }

    const CONFIG: &[u8] = b"{\"r\": 8}";
    const WEIGHTS: &[u8] = b"weights";

    #[test]
    fn the_two_files_are_found_at_the_top_or_in_one_directory() {
        for (c, w) in [
            ("adapter_config.json", "adapter_model.safetensors"),
            ("out/adapter_config.json", "out/adapter_model.safetensors"),
            ("./step3/adapter_config.json", "./step3/adapter_model.safetensors"),
        ] {
            let got = adapter_files(&archive(&[
                ("README.md", b"hi"),
                (c, CONFIG),
                ("checkpoint-5/x/y.bin", b"z"),
                (w, WEIGHTS),
            ]));
            assert_eq!(
                got,
                Ok(vec![("adapter_config.json", CONFIG.to_vec()), ("adapter_model.safetensors", WEIGHTS.to_vec())]),
                "{c}"
            );
        }
    }

    #[test]
    fn anything_else_is_refused_saying_why() {
        let refused = |entries: &[(&str, &[u8])], says: &str| {
            let e = adapter_files(&archive(entries)).unwrap_err();
            assert!(e.contains(says), "{e} (wanted {says})");
        };
        refused(&[("adapter_config.json", CONFIG)], "no adapter_model.safetensors");
        refused(
            &[("a/adapter_config.json", CONFIG), ("b/adapter_model.safetensors", WEIGHTS)],
            "different directories",
        );
        refused(&[("a/b/adapter_config.json", CONFIG), ("a/b/adapter_model.safetensors", WEIGHTS)], "one directory");
        refused(&[("adapter_config.json", CONFIG), ("adapter_config.json", CONFIG)], "twice");
        let big = vec![b' '; (MAX_CONFIG_BYTES + 1) as usize];
        refused(&[("adapter_config.json", &big), ("adapter_model.safetensors", WEIGHTS)], "larger than");
        let many: Vec<(String, &[u8])> = (0..70).map(|i| (format!("f{i}"), &b"x"[..])).collect();
        let many: Vec<(&str, &[u8])> = many.iter().map(|(n, b)| (n.as_str(), *b)).collect();
        refused(&many, "more than 64 entries");
        assert!(adapter_files(b"not a tar archive at all, just words").is_err());
        // A hard link (and any other special entry) is refused.
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Link);
        h.set_size(0);
        tar.append_link(&mut h, "adapter_model.safetensors", "/etc/passwd").unwrap();
        let e = adapter_files(&tar.into_inner().unwrap()).unwrap_err();
        assert!(e.contains("Link"), "{e}");
    }
}
