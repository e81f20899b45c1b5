//! The trajectory browser's reads: a page of a log's or an RL job's groups, each trajectory as
//! chat messages and as the token sequences the trainer trains on (sampled tokens with their
//! logprobs), sorted and filtered by reward.

use super::owned_model;
use crate::auth::Caller;
use crate::body::path_id;
use crate::error::{ApiError, ErrorKind, PreviewError};
use crate::trajectory_view::{group, token_runs, GroupView, TrajectoriesView, TrajectoryView};
use crate::AppState;
use axum::extract::{Extension, Path, Query, State};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use tandem_core::inference::ModelHandle;
use tandem_core::records::ModelRecord;
use tandem_core::sequences::{tokenize_trajectory, ModelTokenizer, RlInputs, Sequence, TrainedModel};
use tandem_core::validate::Validator;
use tandem_store::StoreError;

/// Groups per page unless `limit` says otherwise, and the most it may say (each trajectory's
/// sequences are rendered token by token).
const DEFAULT_GROUPS: usize = 10;
const MAX_GROUPS: usize = 50;
/// Most tokens one page decodes for its token view; trajectories past it are sent without
/// sequences (saying so). A page of 50 groups of 1,024 long trajectories would otherwise decode
/// hundreds of millions of tokens in one request.
const MAX_PAGE_TOKENS: usize = 262_144;

/// Trajectory pages being read and rendered at once, over every tenant: each parses a whole log
/// or job (up to the body limit) and decodes a page of tokens, so more would queue rather than
/// take memory and the cores from inference.
/// One of them per entity at a time (a second is a 429), so one tenant cannot hold both.
static RENDERS: crate::heavy::Gate =
    crate::heavy::Gate::new(2, "a trajectory page of this entity is being read; retry when it is done");

#[derive(Clone, Copy, PartialEq)]
enum Sort {
    Index,
    RewardDesc,
    RewardAsc,
}

struct Query_ {
    offset: usize,
    limit: usize,
    sort: Sort,
    min_reward: f64,
    max_reward: f64,
}

fn parse(query: &HashMap<String, String>) -> Result<Query_, ApiError> {
    let mut v = Validator::new("query");
    let mut q =
        Query_ { offset: 0, limit: DEFAULT_GROUPS, sort: Sort::Index, min_reward: f64::MIN, max_reward: f64::MAX };
    let int_error = "Input should be a valid integer, unable to parse string as an integer";
    if let Some(raw) = query.get("offset") {
        v.at("offset", |v| match raw.parse::<usize>() {
            Ok(n) => q.offset = n,
            Err(_) => v.error("int_parsing", int_error, &json!(raw)),
        });
    }
    if let Some(raw) = query.get("limit") {
        v.at("limit", |v| match raw.parse::<i64>() {
            Ok(n) if v.range_i64(&json!(raw), n, 1, MAX_GROUPS as i64) => q.limit = n as usize,
            Ok(_) => {}
            Err(_) => v.error("int_parsing", int_error, &json!(raw)),
        });
    }
    if let Some(raw) = query.get("sort") {
        if let Some(s) = v.at("sort", |v| v.literal(&json!(raw), &["index", "reward_desc", "reward_asc"])) {
            q.sort = match s {
                "reward_desc" => Sort::RewardDesc,
                "reward_asc" => Sort::RewardAsc,
                _ => Sort::Index,
            };
        }
    }
    for (name, slot) in [("min_reward", &mut q.min_reward), ("max_reward", &mut q.max_reward)] {
        if let Some(raw) = query.get(name) {
            v.at(name, |v| match raw.parse::<f64>() {
                Ok(x) if x.is_finite() => *slot = x,
                _ => v.error("finite_number", "Input should be a finite number", &json!(raw)),
            });
        }
    }
    v.finish(q).map_err(ApiError::validation)
}

/// Filters and sorts the groups, cuts the page, and renders it: each page trajectory's
/// sequences from `stored` (a job's tokenized inputs, by group and trajectory index) or, without
/// them, tokenized now as the trainer would.
fn render(
    groups: &Value,
    stored: Option<&RlInputs>,
    served: Option<&ModelHandle>,
    model: &ModelRecord,
    q: &Query_,
) -> TrajectoriesView {
    let trained = TrainedModel { entity: &model.entity, project: &model.project, name: &model.name };
    let is_trained = |m: &str| trained.matches(m);
    let empty = Vec::new();
    let raw = groups.as_array().unwrap_or(&empty);
    // Filter and sort on the rewards alone; only the page's groups are rendered (a job's groups
    // can be tens of megabytes).
    let reward = |t: &Value| t.get("reward").and_then(Value::as_f64).unwrap_or(0.0);
    let mut kept: Vec<(usize, Vec<(usize, f64)>)> = raw
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let trajs = g.get("trajectories").and_then(Value::as_array).map_or(&empty, |a| a);
            let rewards = trajs
                .iter()
                .map(reward)
                .enumerate()
                .filter(|(_, r)| (q.min_reward..=q.max_reward).contains(r))
                .collect();
            (i, rewards)
        })
        .filter(|(_, rewards): &(usize, Vec<(usize, f64)>)| !rewards.is_empty())
        .collect();
    let mean = |rs: &[(usize, f64)]| rs.iter().map(|(_, r)| r).sum::<f64>() / rs.len() as f64;
    if q.sort != Sort::Index {
        let desc = q.sort == Sort::RewardDesc;
        let order = |a: f64, b: f64| if desc { b.total_cmp(&a) } else { a.total_cmp(&b) };
        kept.sort_by(|a, b| order(mean(&a.1), mean(&b.1)));
        for (_, rs) in &mut kept {
            rs.sort_by(|a, b| order(a.1, b.1));
        }
    }
    let total_groups = kept.len();
    let page_of: Vec<(usize, Vec<(usize, f64)>)> = kept.into_iter().skip(q.offset).take(q.limit).collect();
    let mut page: Vec<GroupView> = page_of
        .into_iter()
        .map(|(i, rs)| {
            let mut g = group(i, &raw[i], &is_trained);
            let mut all: Vec<Option<TrajectoryView>> =
                std::mem::take(&mut g.trajectories).into_iter().map(Some).collect();
            g.trajectories = rs.iter().filter_map(|(t, _)| all.get_mut(*t).and_then(Option::take)).collect();
            g
        })
        .collect();
    let mut budget = MAX_PAGE_TOKENS;
    for g in &mut page {
        for t in &mut g.trajectories {
            if budget == 0 {
                t.sequences_error = Some(format!(
                    "not shown: this page already shows {MAX_PAGE_TOKENS} tokens (ask for fewer groups, or filter)"
                ));
                continue;
            }
            let at = format!("trajectory_groups[{}].trajectories[{}]", g.index, t.index);
            let seqs: Result<Vec<Sequence>, String> = match (stored, served) {
                (Some(RlInputs::Tokenized(tok)), _) => tok
                    .groups
                    .get(g.index)
                    .and_then(|sg| sg.trajectories.get(t.index))
                    .map(|st| st.sequences.clone())
                    .ok_or_else(|| format!("{at}: not among the job's tokenized inputs")),
                (_, Some(served)) => tokenize_trajectory(
                    &raw[g.index]["trajectories"][t.index],
                    &ModelTokenizer(served.clone()),
                    &trained,
                    true,
                    &at,
                ),
                (_, None) => Err(format!("the base model {} is not served here", model.base_model)),
            };
            match (seqs, served) {
                (Ok(seqs), Some(served)) => {
                    budget = budget.saturating_sub(seqs.iter().map(|q| q.tokens.len()).sum::<usize>());
                    for seq in &seqs {
                        match served.token_texts(&seq.tokens, false) {
                            Ok((mut texts, held)) => {
                                if let Some(last) = texts.last_mut() {
                                    last.push_str(&held);
                                }
                                t.sequences.push(token_runs(seq, &texts));
                            }
                            Err(e) => t.sequences_error = Some(e.to_string()),
                        }
                    }
                }
                (Ok(_), None) => {
                    t.sequences_error = Some(format!("the base model {} is not served here", model.base_model))
                }
                (Err(e), _) => t.sequences_error = Some(e),
            }
        }
    }
    TrajectoriesView { total_groups, offset: q.offset, groups: page }
}

async fn render_off_thread(
    state: &AppState,
    permits: crate::heavy::Entered,
    groups: Value,
    stored: Option<RlInputs>,
    model: ModelRecord,
    q: Query_,
) -> Result<TrajectoriesView, ApiError> {
    let served = state.model(&model.base_model).cloned();
    // Walking every group and decoding a page's tokens is CPU work: off the async workers, under
    // the entity's permits until it ends.
    permits
        .blocking("rendering trajectories", move || render(&groups, stored.as_ref(), served.as_ref(), &model, &q))
        .await
}

#[utoipa::path(
    operation_id = "log_trajectories",
    get,
    path = "/models/{model_id}/logs/{log_id}/trajectories",
    tag = "training",
    summary = "A page of a trajectory log's groups: chat messages, token sequences with logprobs",
    params(
        ("model_id" = Uuid, Path, description = "A model id (UUID)"),
        ("log_id" = Uuid, Path, description = "A log id (UUID)"),
        ("offset" = Option<usize>, Query, description = "Groups to skip (after filtering and sorting)"),
        ("limit" = Option<usize>, Query, description = "Groups per page, 1 to 50 (default 10)"),
        ("sort" = Option<String>, Query, description = "`index` (default), `reward_desc` or `reward_asc`: groups by mean reward, trajectories by reward"),
        ("min_reward" = Option<f64>, Query, description = "Leave out trajectories rewarded below this"),
        ("max_reward" = Option<f64>, Query, description = "Leave out trajectories rewarded above this")
    ),
    responses(
        (status = 200, body = TrajectoriesView),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such model or log for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 429, description = "Another trajectory page of this entity is being read", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn of_log(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((model_id, log_id)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<TrajectoriesView>, PreviewError> {
    let q = parse(&query)?;
    let model = owned_model(&state, &caller, &model_id).await?;
    let log_id = path_id(&log_id, "log")?;
    let permits = RENDERS.enter(&caller.entity).await?;
    let (_, groups) = state.store().get_log(model.id, log_id).await.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found("log"),
        other => other.into(),
    })?;
    Ok(Json(render_off_thread(&state, permits, groups, None, model, q).await?))
}

#[utoipa::path(
    operation_id = "job_trajectories",
    get,
    path = "/training-jobs/{job_id}/trajectories",
    tag = "training",
    summary = "A page of an RL job's groups: chat messages, the token sequences it trains on",
    params(
        ("job_id" = Uuid, Path, description = "A job id (UUID)"),
        ("offset" = Option<usize>, Query, description = "Groups to skip (after filtering and sorting)"),
        ("limit" = Option<usize>, Query, description = "Groups per page, 1 to 50 (default 10)"),
        ("sort" = Option<String>, Query, description = "`index` (default), `reward_desc` or `reward_asc`"),
        ("min_reward" = Option<f64>, Query, description = "Leave out trajectories rewarded below this"),
        ("max_reward" = Option<f64>, Query, description = "Leave out trajectories rewarded above this")
    ),
    responses(
        (status = 200, body = TrajectoriesView),
        (status = 401, description = "No valid API key", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 404, description = "No such job for this key's entity", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 429, description = "Another trajectory page of this entity is being read", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 409, description = "The job keeps no trajectories: an SFT job, or an RL job tokenized at creation before its groups were kept", body = crate::openapi::bodies::PreviewErrorBody),
        (status = 422, description = "Invalid request", body = crate::openapi::bodies::ValidationErrorBody)
    ),
    security(("bearer" = []))
)]
pub async fn of_job(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(job_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<TrajectoriesView>, PreviewError> {
    let q = parse(&query)?;
    let job_id = path_id(&job_id, "job")?;
    let permits = RENDERS.enter(&caller.entity).await?;
    let not_found = |e| match e {
        StoreError::NotFound => ApiError::not_found("job"),
        other => other.into(),
    };
    let rollout = state.store().get_job_rollout(&caller.entity, job_id).await.map_err(not_found)?;
    let model = state.store().get_model(&caller.entity, rollout.job.model_id).await.map_err(not_found)?;
    let stored = RlInputs::from_stored(rollout.inputs).ok();
    // Jobs from before rollouts were kept stored their raw groups as the inputs.
    let groups = match (rollout.groups, &stored) {
        (Some(groups), _) => groups,
        (None, Some(RlInputs::Raw(groups))) if rollout.job.kind == tandem_core::records::JobKind::Rl => groups.clone(),
        _ => {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                "this job keeps no trajectories (an SFT job, or an RL job created before tandem kept its groups)",
            )
            .into())
        }
    };
    Ok(Json(render_off_thread(&state, permits, groups, stored, model, q).await?))
}
