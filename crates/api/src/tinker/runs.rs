//! The RestClient's view of Tinker runs: a run is a Tinker model (`{session}:train:{seq}`), kept
//! as the tandem record `{session}-train-{seq}` of project `tinker`, with its saved training
//! states and sampler weights saved by name. `training_runs`, `training_runs/{id}`,
//! `training_runs/{id}/checkpoints` and `checkpoints` (every run's, across runs).

use super::routes::{tinker_error, Result};
use super::samplers;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use tandem_core::records::{ModelRecord, Order, PageRequest};
use tandem_core::tinker::{CheckpointKind, RunId};
use tandem_core::validate::Validator;
use tandem_store::StoreError;

/// Most runs a listing reads (an entity with more sees its newest ones).
const MAX_RUNS: usize = 2_000;
/// Most runs whose checkpoints `GET checkpoints` gathers (the newest): each costs file reads and
/// a paged read of its checkpoints, and the listing must not take the pool from other tenants.
const MAX_RUNS_SCANNED: usize = 20;

/// RFC 3339 of milliseconds since the epoch (the SDK parses `time` as a datetime).
pub(super) fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// The run id of a tandem record of project `tinker` (`None` for records not made by Tinker).
fn run_of(record: &str) -> Option<String> {
    RunId::of_record(record).map(|r| r.to_string())
}

/// A checkpoint as the SDK's `Checkpoint`, with its time in ms for ordering.
type Listed = (i64, Value);

/// One run's checkpoints (states, sampler weights by name: only saves whose checkpoint is still
/// the one they saved, then external weights; each with its expiry), and its LoRA rank where
/// something says it; `None` when the caller has no such run.
pub(super) async fn checkpoints_of(
    state: &AppState,
    entity: &str,
    run: &str,
) -> Result<Option<(Vec<Listed>, Option<usize>)>> {
    let model = state.tinker().model_named(entity, run);
    let entries = state.catalog().list(entity, Some(run)).await.map_err(tinker_error)?;
    let of = |kind: CheckpointKind| entries.iter().filter(move |e| e.key.kind == kind);
    let states: Vec<_> = of(CheckpointKind::Weights).collect();
    let external: Vec<_> = of(CheckpointKind::ExternalWeights).collect();
    let state_rank = states.first().and_then(|e| tandem_tinker::catalog::state_info(&e.meta)).map(|i| i.rank);
    let expiries: HashMap<String, i64> =
        entries.iter().filter_map(|e| Some((e.key.checkpoint(), e.expires_at?))).collect();
    let public: HashSet<String> = entries.iter().filter(|e| e.public).map(|e| e.key.checkpoint()).collect();
    let saved = samplers::all(state, entity, run).await?;
    if model.is_none() && states.is_empty() && saved.is_empty() && external.is_empty() {
        // A run whose saves are all deleted is still a run: its tandem record says it existed.
        let Some(record) = RunId::parse(run).map(|r| r.record_name()) else { return Ok(None) };
        match state.store().find_model(entity, "tinker", &record).await {
            Ok(_) => {}
            Err(StoreError::NotFound) => return Ok(None),
            Err(e) => return Err(ApiError::from(e).into()),
        }
    }
    let rank = model.as_ref().map(|m| m.rank).or(saved.first().map(|s| s.rank)).or(state_rank);
    let listed = |kind: &str, name: &str, at: i64, size: Option<u64>| {
        let (id, path_kind) = match kind {
            "training" => (format!("weights/{name}"), "weights"),
            "sampler" => (format!("sampler_weights/{name}"), "sampler_weights"),
            _ => (format!("external_weights/{name}"), "external_weights"),
        };
        let expires_at = expiries.get(&id).map(|ms| rfc3339(*ms));
        let mut c = json!({ "checkpoint_id": id, "checkpoint_type": kind, "time": rfc3339(at),
                            "tinker_path": format!("tinker://{run}/{path_kind}/{name}"), "public": public.contains(&id),
                            "expires_at": expires_at });
        if let Some(bytes) = size {
            c["size_bytes"] = json!(bytes);
        }
        (at, c)
    };
    let mut out: Vec<Listed> =
        states.iter().map(|e| listed("training", &e.key.name, e.created_at, Some(e.size_bytes as u64))).collect();
    for s in samplers::only_live(state, saved).await? {
        out.push(listed("sampler", &s.name, s.created_at, None));
    }
    out.extend(external.iter().map(|e| listed("external", &e.key.name, e.created_at, Some(e.size_bytes as u64))));
    Ok(Some((out, rank)))
}

/// `GET training_runs/{model_id}/checkpoints` (`RestClient.list_checkpoints`): the run's saved
/// training states, its sampler weights saved by name (kept after its session ends, as states
/// are; the ephemeral kind while its session lives) and its external weights.
#[utoipa::path(
    get,
    operation_id = "tinker_list_checkpoints",
    path = "/training_runs/{run}/checkpoints",
    tag = "tinker",
    summary = "A run's checkpoints with their expiries and publish marks",
    params(("run" = String, Path, description = "A run id, `{session}:train:{n}`")),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn list_checkpoints(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(run): Path<String>,
) -> Result<Json<Value>> {
    let (out, _) =
        checkpoints_of(&state, &caller.entity, &run).await?.ok_or_else(|| ApiError::not_found("training run"))?;
    Ok(Json(json!({ "checkpoints": out.into_iter().map(|(_, c)| c).collect::<Vec<_>>() })))
}

/// The entity's Tinker runs, newest first (at most [`MAX_RUNS`]).
async fn runs_of(state: &AppState, entity: &str) -> Result<Vec<ModelRecord>> {
    let mut out = Vec::new();
    let mut page = PageRequest { order: Order::Desc, ..PageRequest::first(500) };
    loop {
        let p = state.store().list_models(entity, Some("tinker"), None, page).await.map_err(ApiError::from)?;
        out.extend(p.items.iter().filter(|m| run_of(&m.name).is_some()).cloned());
        match (p.has_more, p.items.last()) {
            (true, Some(last)) if out.len() < MAX_RUNS => page.after = Some(last.id),
            _ => break,
        }
    }
    out.truncate(MAX_RUNS);
    Ok(out)
}

/// A run as the SDK's `TrainingRun`.
async fn run_view(state: &AppState, record: &ModelRecord) -> Result<Option<Value>> {
    let Some(run) = run_of(&record.name) else { return Ok(None) };
    let Some((checkpoints, rank)) = checkpoints_of(state, &record.entity, &run).await? else { return Ok(None) };
    let latest = |kind: &str| {
        checkpoints
            .iter()
            .filter(|(_, c)| c["checkpoint_type"] == kind)
            .max_by_key(|(at, _)| *at)
            .map(|(_, c)| c.clone())
    };
    let last_time = rfc3339(checkpoints.iter().map(|(at, _)| *at).max().unwrap_or(record.created_at));
    Ok(Some(json!({
        "training_run_id": run, "base_model": record.base_model, "model_owner": record.entity, "is_lora": true,
        "corrupted": false, "lora_rank": rank, "last_request_time": last_time,
        "last_checkpoint": latest("training"), "last_sampler_checkpoint": latest("sampler"),
    })))
}

/// `offset` and `limit` of a listing (the RestClient's paging): whole numbers, else a 422 in
/// FastAPI's shape naming the field (as every query of the preview API); then clamped, `limit`
/// to 1-100 and `offset` to the runs a listing reads.
fn window(query: &HashMap<String, String>, default: usize) -> Result<(usize, usize)> {
    let mut v = Validator::new("query");
    let mut read = |key: &str, fallback: i64| match query.get(key) {
        None => fallback,
        Some(raw) => v.at(key, |v| match raw.parse::<i64>() {
            Ok(n) => n,
            Err(_) => {
                let msg = "Input should be a valid integer, unable to parse string as an integer";
                v.error("int_parsing", msg, &json!(raw));
                fallback
            }
        }),
    };
    let (offset, limit) = (read("offset", 0), read("limit", default as i64));
    let window = (offset.clamp(0, MAX_RUNS as i64) as usize, limit.clamp(1, 100) as usize);
    Ok(v.finish(window).map_err(ApiError::validation)?)
}

/// `GET training_runs` (`RestClient.list_training_runs`): the caller's runs, newest first, by
/// offset.
#[utoipa::path(
    get,
    operation_id = "tinker_list_training_runs",
    path = "/training_runs",
    tag = "tinker",
    summary = "The entity's runs, newest first",
    params(crate::openapi::tinker::TinkerPage),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn list_runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>> {
    let (offset, limit) = window(&query, 20)?;
    let records = runs_of(&state, &caller.entity).await?;
    let mut runs = Vec::new();
    for r in records.iter().skip(offset).take(limit) {
        runs.extend(run_view(&state, r).await?);
    }
    Ok(Json(
        json!({ "training_runs": runs, "cursor": { "offset": offset, "limit": limit, "total_count": records.len() } }),
    ))
}

/// `GET training_runs/{id}` (`RestClient.get_training_run[_by_tinker_path]`).
#[utoipa::path(
    get,
    operation_id = "tinker_get_training_run",
    path = "/training_runs/{run}",
    tag = "tinker",
    summary = "A run",
    params(("run" = String, Path, description = "A run id, `{session}:train:{n}`")),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn get_run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(run): Path<String>,
) -> Result<Json<Value>> {
    let name = RunId::parse(&run).ok_or_else(|| ApiError::not_found("training run"))?.record_name();
    let record = match state.store().find_model(&caller.entity, "tinker", &name).await {
        Ok(r) => r,
        Err(StoreError::NotFound) => return Err(ApiError::not_found("training run").into()),
        Err(e) => return Err(ApiError::from(e).into()),
    };
    let view = run_view(&state, &record).await?.ok_or_else(|| ApiError::not_found("training run"))?;
    Ok(Json(view))
}

/// `GET checkpoints` (`RestClient.list_user_checkpoints`): the checkpoints of the entity's
/// newest [`MAX_RUNS_SCANNED`] runs, newest first.
#[utoipa::path(
    get,
    operation_id = "tinker_list_all_checkpoints",
    path = "/checkpoints",
    tag = "tinker",
    summary = "The entity's checkpoints across runs",
    params(crate::openapi::tinker::TinkerPage),
    responses(
        (status = 200, body = crate::openapi::tinker::TinkerObject),
        crate::openapi::tinker::TinkerErrors
    ),
    security(("x-api-key" = []), ("bearer" = []))
)]
pub async fn list_all_checkpoints(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>> {
    let (offset, limit) = window(&query, 100)?;
    let mut all = Vec::new();
    for r in runs_of(&state, &caller.entity).await?.into_iter().take(MAX_RUNS_SCANNED) {
        let Some(run) = run_of(&r.name) else { continue };
        if let Some((cps, _)) = checkpoints_of(&state, &caller.entity, &run).await? {
            all.extend(cps);
        }
    }
    all.sort_by_key(|c| std::cmp::Reverse(c.0));
    let total = all.len();
    let page: Vec<Value> = all.into_iter().skip(offset).take(limit).map(|(_, c)| c).collect();
    Ok(Json(json!({ "checkpoints": page, "cursor": { "offset": offset, "limit": limit, "total_count": total } })))
}
