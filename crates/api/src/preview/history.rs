//! `GET /models/{model_id}/history`: a model's curves in one read, for the dashboard: every
//! metric of its trajectory logs and the per-job mean of every `gradient_step` metric, over
//! training steps, each downsampled to at most `max_points`, with its checkpoints' steps.

use super::owned_model;
use crate::auth::Caller;
use crate::error::{ApiError, PreviewError};
use crate::AppState;
use axum::extract::{Extension, Path, Query, State};
use axum::Json;
use serde::Serialize;
use serde_json::json;
use std::collections::HashMap;
use tandem_core::history::{add_logs, add_rollouts, add_training, downsample, Bucket, Point, Series};
use tandem_core::records::{Order, PageRequest};
use tandem_core::validate::Validator;
use utoipa::ToSchema;
use uuid::Uuid;

/// Points per series unless `max_points` says otherwise, and the most it may say.
pub const DEFAULT_POINTS: usize = 500;
pub const MAX_POINTS: usize = 5_000;
/// Logs and checkpoints read per store page.
const PAGE: u32 = 1_000;
/// Most logs (the newest) a history reads.
const MAX_LOGS: usize = 100_000;

/// A model's curves.
#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryView {
    pub model_id: Uuid,
    /// The newest live checkpoint's step (0 before any).
    pub latest_step: i64,
    /// Live checkpoints, oldest first (steps to mark on the x-axis).
    pub checkpoints: Vec<HistoryCheckpoint>,
    /// One per metric and source, by key: log metrics as stored (`val/reward`,
    /// `train/reward_std_dev`, ...), RL jobs' rollout metrics (`train/reward`, ... from the groups
    /// each job trained on) and training metrics as `training/{name}` (`training/loss`,
    /// `training/grad_norm`, ...).
    pub series: Vec<SeriesView>,
    /// Some observations were left out: more than 256 distinct keys, or more than 2,000,000
    /// observations in all (the series listed are still whole up to that point).
    pub truncated: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryCheckpoint {
    pub step: i64,
    /// Unix milliseconds.
    pub time_ms: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SeriesView {
    pub key: String,
    /// `logs`, `jobs` (rollout metrics) or `training`.
    pub source: &'static str,
    /// Observations in the step range before downsampling.
    pub total: usize,
    pub points: Vec<PointView>,
}

/// A bucket of consecutive observations (one observation when the series was not downsampled).
#[derive(Debug, Serialize, ToSchema)]
pub struct PointView {
    /// The mean step of the bucket's observations.
    pub step: f64,
    /// Unix milliseconds of its last observation.
    pub time_ms: i64,
    /// Their mean.
    pub value: f64,
    pub min: f64,
    pub max: f64,
    pub count: u64,
}

fn point(b: Bucket) -> PointView {
    PointView { step: b.step, time_ms: b.time, value: b.value, min: b.min, max: b.max, count: b.count }
}

/// What a history read asks for: points per series, and the steps to cover (a zoomed range).
struct Window {
    max: usize,
    min_step: i64,
    max_step: i64,
}

impl Window {
    fn holds(&self, p: &Point) -> bool {
        (self.min_step..=self.max_step).contains(&p.step)
    }
}

fn window(query: &HashMap<String, String>) -> Result<Window, ApiError> {
    let mut v = Validator::new("query");
    let mut int = |name: &str, lo: i64, hi: i64, default: i64| {
        let Some(raw) = query.get(name) else { return default };
        let value = json!(raw);
        let mut out = default;
        v.at(name, |v| match raw.parse::<i64>() {
            Ok(n) if v.range_i64(&value, n, lo, hi) => out = n,
            Ok(_) => {}
            Err(_) => {
                v.error("int_parsing", "Input should be a valid integer, unable to parse string as an integer", &value)
            }
        });
        out
    };
    let max = int("max_points", 2, MAX_POINTS as i64, DEFAULT_POINTS as i64) as usize;
    let min_step = int("min_step", 0, i64::MAX, 0);
    let max_step = int("max_step", 0, i64::MAX, i64::MAX);
    if min_step > max_step {
        v.at("max_step", |v| v.value_error(&json!(max_step), "max_step must not be below min_step"));
    }
    v.finish(Window { max, min_step, max_step }).map_err(ApiError::validation)
}

#[utoipa::path(
    operation_id = "model_history",
    get,
    path = "/models/{model_id}/history",
    tag = "training",
    summary = "A model's curves over training steps: log metrics and training metrics, downsampled",
    params(
        ("model_id" = Uuid, Path, description = "A model id (UUID)"),
        ("max_points" = Option<usize>, Query, description = "Points per series, 2 to 5000 (default 500)"),
        ("min_step" = Option<i64>, Query, description = "Leave out observations before this step (a zoomed range; default 0)"),
        ("max_step" = Option<i64>, Query, description = "Leave out observations after this step (default: none)")
    ),
    responses(
        (status = 200, body = HistoryView),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid max_points, min_step or max_step", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<HistoryView>, PreviewError> {
    let window = window(&query)?;
    let model = owned_model(&state, &caller, &model_id).await?;
    // Hundreds of logs' metrics are read and parsed: off the async workers, one per entity.
    let view = crate::heavy::run(&caller.entity, move || build(state, model.id, window)).await?;
    Ok(Json(view))
}

/// Reads and folds a model's history (on a blocking thread: `heavy::run`).
async fn build(state: AppState, model_id: uuid::Uuid, window: Window) -> Result<HistoryView, ApiError> {
    let store = state.store();
    // The newest logs, read newest first and bounded, folded page by page into bounded series.
    let mut series = Series::default();
    let mut read = 0;
    let mut page = PageRequest { after: None, limit: PAGE, order: Order::Desc };
    loop {
        let p = store.list_logs(model_id, None, page).await?;
        read += p.items.len();
        add_logs(&mut series, &p.items);
        match (p.has_more && read < MAX_LOGS, p.items.last()) {
            (true, Some(last)) => page.after = Some(last.id),
            _ => break,
        }
    }
    let mut checkpoints = Vec::new();
    let mut page = PageRequest { after: None, limit: PAGE, order: Order::Asc };
    loop {
        let p = store.list_checkpoints(model_id, page).await?;
        checkpoints.extend(p.items.iter().map(|c| HistoryCheckpoint { step: c.step, time_ms: c.created_at }));
        match (p.has_more, p.items.last()) {
            (true, Some(last)) => page.after = Some(last.id),
            _ => break,
        }
    }
    // Listed by step already (the store orders checkpoints by step).
    let latest_step = checkpoints.last().map_or(0, |c| c.step);
    let mut jobs = Vec::new();
    let mut page = PageRequest { after: None, limit: PAGE, order: Order::Asc };
    loop {
        let p = store.list_jobs(model_id, page).await?;
        jobs.extend(p.items.iter().filter(|j| !j.rollout_metrics.is_empty()).cloned());
        match (p.has_more, p.items.last()) {
            (true, Some(last)) => page.after = Some(last.id),
            _ => break,
        }
    }
    let steps = store.gradient_step_history(model_id).await?;
    // Grouping and downsampling is CPU work proportional to the history (already on a blocking
    // thread here).
    let (series, truncated) = {
        add_rollouts(&mut series, &jobs, latest_step);
        add_training(&mut series, &steps, latest_step);
        let out: Vec<SeriesView> = series
            .by_key
            .iter()
            .map(|((source, key), points)| {
                let inside: Vec<Point> = points.iter().copied().filter(|p| window.holds(p)).collect();
                SeriesView {
                    key: key.clone(),
                    source,
                    total: inside.len(),
                    points: downsample(&inside, window.max).into_iter().map(point).collect(),
                }
            })
            .collect();
        (out, series.truncated)
    };
    Ok(HistoryView { model_id, latest_step, checkpoints, series, truncated })
}
