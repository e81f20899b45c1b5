//! Training jobs and their events in SQLite: the job state machine's transitions, each with its
//! event written in the same transaction, so the status and the event log never disagree.

use super::rows;
use crate::{
    now_ms, ClaimedJob, JobOutcome, JobRollout, Lease, LeaseState, NewJob, Reclaim, Recovery, Result, StoreError,
};
use serde_json::{json, Value};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool, Transaction};
use tandem_core::history::GradientStepRow;
use tandem_core::records::{EventKind, Job, JobEvent, JobKind, JobStatus, Page, PageRequest};
use uuid::Uuid;

pub(crate) async fn active_job_counts(pool: &SqlitePool) -> Result<Vec<(JobKind, JobStatus, i64)>> {
    // Served by the (status, seq) index: finished jobs, however many, are not read.
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT kind, status, COUNT(*) FROM training_jobs WHERE status IN ('queued', 'running')
         GROUP BY kind, status",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(kind, status, n)| match (JobKind::parse(&kind), JobStatus::parse(&status)) {
            (Some(k), Some(s)) => Ok((k, s, n)),
            _ => Err(StoreError::Database(format!("a training job has kind {kind:?} and status {status:?}"))),
        })
        .collect()
}

/// A model's `gradient_step` events with their jobs (of each job's last attempt), oldest first;
/// the newest [`crate::MAX_HISTORY_EVENTS`] when there are more.
pub(crate) async fn gradient_step_history(pool: &SqlitePool, model_id: Uuid) -> Result<Vec<GradientStepRow>> {
    let rows: Vec<(i64, String, Option<i64>, String, i64)> = sqlx::query_as(
        "SELECT job_seq, status, step, data, created_at FROM (
             SELECT j.seq AS job_seq, j.status, j.step, e.data, e.created_at, e.seq AS event_seq
             FROM job_events e JOIN training_jobs j ON j.id = e.job_id
             WHERE j.model_id = ? AND e.type = 'gradient_step'
               -- A job re-run after a restart keeps its first attempt's events: count only
               -- those after its last `training_restarted`.
               AND e.seq > COALESCE((SELECT MAX(r.seq) FROM job_events r
                                     WHERE r.job_id = e.job_id AND r.type = 'training_restarted'), 0)
             ORDER BY e.seq DESC LIMIT ?)
         ORDER BY event_seq",
    )
    .bind(model_id.to_string())
    .bind(crate::MAX_HISTORY_EVENTS)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(job_seq, status, job_step, data, created_at)| {
            Ok(GradientStepRow {
                job_seq,
                job_status: JobStatus::parse(&status)
                    .ok_or_else(|| StoreError::Database(format!("a training job has status {status:?}")))?,
                job_step,
                data: serde_json::from_str(&data).map_err(|e| StoreError::Database(e.to_string()))?,
                created_at,
            })
        })
        .collect()
}

/// A job's columns without its inputs and rollout groups (each can be megabytes): what every
/// read of a job as a record selects.
const JOB_COLUMNS: &str = "id, model_id, kind, status, step, error_message, cancel_requested, attempts, created_at, \
                           started_at, finished_at, rollout_metrics";

/// [`JOB_COLUMNS`] of the table aliased `j`.
fn job_columns_of_j() -> String {
    JOB_COLUMNS.split(", ").map(|c| format!("j.{c}")).collect::<Vec<_>>().join(", ")
}

pub(crate) async fn list_jobs(pool: &SqlitePool, model_id: Uuid, page: PageRequest) -> Result<Page<Job>> {
    let (cmp, order) = super::seq_clause(page.order);
    let after = match page.after {
        Some(a) => Some(super::cursor_seq(pool, "training_jobs", "model_id", &model_id.to_string(), a).await?),
        None => None,
    };
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM training_jobs WHERE model_id = ? AND (? IS NULL OR {cmp}) ORDER BY {order} LIMIT ?"
    );
    let rows = sqlx::query(&sql)
        .bind(model_id.to_string())
        .bind(after)
        .bind(after)
        .bind(page.limit as i64 + 1)
        .fetch_all(pool)
        .await?;
    let items = rows.iter().map(rows::job).collect::<Result<Vec<_>>>()?;
    Ok(rows::page(items, page.limit))
}

/// Inside the caller's `BEGIN IMMEDIATE` transaction, which holds the write lock from its start,
/// so the cap's count and the insert see no other writer in between.
pub(crate) async fn create_job(
    tx: &mut SqliteConnection,
    new: &NewJob,
    max_pending: Option<i64>,
    quota: Option<i64>,
) -> Result<Job> {
    let text = |v: &Value| serde_json::to_string(v).map_err(|e| StoreError::Database(e.to_string()));
    if let Some(cap) = max_pending {
        let pending: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM training_jobs j JOIN models m ON m.id = j.model_id
             WHERE m.entity = (SELECT entity FROM models WHERE id = ?) AND j.status IN ('queued', 'running')",
        )
        .bind(new.model_id.to_string())
        .fetch_one(&mut *tx)
        .await?;
        if pending >= cap {
            return Err(StoreError::AtLimit(pending));
        }
    }
    let sql = format!(
        "INSERT INTO training_jobs (id, model_id, kind, status, config, trajectory_groups, rollout_metrics,
                                    rollout_groups, created_at, size_bytes)
         VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?) RETURNING {JOB_COLUMNS}"
    );
    let (config, inputs) = (text(&new.config)?, text(&new.inputs)?);
    let groups = new.rollout.as_ref().map(|r| text(&r.groups)).transpose()?;
    let size = crate::storage::job_bytes(&config, &inputs, groups.as_deref());
    let row = sqlx::query(&sql)
        .bind(tandem_core::new_id().to_string())
        .bind(new.model_id.to_string())
        .bind(new.kind.as_str())
        .bind(config)
        .bind(inputs)
        .bind(
            new.rollout
                .as_ref()
                .map(|r| serde_json::to_string(&r.metrics))
                .transpose()
                .map_err(|e| StoreError::Database(e.to_string()))?,
        )
        .bind(groups)
        .bind(now_ms())
        .bind(size)
        .fetch_one(&mut *tx)
        .await?;
    let job = rows::job(&row)?;
    super::storage::charge_model(tx, new.model_id, size, quota).await?;
    Ok(job)
}

pub(crate) async fn get_job<'e, E: sqlx::SqliteExecutor<'e>>(ex: E, entity: &str, id: Uuid) -> Result<Job> {
    let sql = format!(
        "SELECT {} FROM training_jobs j JOIN models m ON m.id = j.model_id WHERE j.id = ? AND m.entity = ?",
        job_columns_of_j()
    );
    let row = sqlx::query(&sql).bind(id.to_string()).bind(entity).fetch_one(ex).await?;
    rows::job(&row)
}

pub(crate) async fn get_job_rollout(pool: &SqlitePool, entity: &str, id: Uuid) -> Result<JobRollout> {
    let row = sqlx::query(
        "SELECT j.* FROM training_jobs j JOIN models m ON m.id = j.model_id WHERE j.id = ? AND m.entity = ?",
    )
    .bind(id.to_string())
    .bind(entity)
    .fetch_one(pool)
    .await?;
    let groups = match row.try_get::<Option<String>, _>("rollout_groups")? {
        Some(text) => Some(serde_json::from_str(&text).map_err(|e| StoreError::Database(e.to_string()))?),
        None => None,
    };
    Ok(JobRollout { job: rows::job(&row)?, groups, inputs: rows::json(&row, "trajectory_groups")? })
}

async fn job_by_id(conn: &mut SqliteConnection, id: Uuid) -> Result<Job> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM training_jobs WHERE id = ?");
    let row = sqlx::query(&sql).bind(id.to_string()).fetch_one(conn).await?;
    rows::job(&row)
}

pub(crate) async fn cancel_job(tx: &mut Transaction<'_, Sqlite>, entity: &str, id: Uuid) -> Result<Job> {
    let job = get_job(&mut **tx, entity, id).await?;
    match job.status {
        JobStatus::Queued => {
            fail_with_event(tx, id, JobStatus::Cancelled, "training job cancelled before it started").await?;
        }
        JobStatus::Running => {
            sqlx::query("UPDATE training_jobs SET cancel_requested = 1 WHERE id = ?")
                .bind(id.to_string())
                .execute(&mut **tx)
                .await?;
        }
        _ => {}
    }
    job_by_id(tx, id).await
}

pub(crate) async fn list_events(
    pool: &SqlitePool,
    job_id: Uuid,
    after_seq: Option<i64>,
    limit: u32,
) -> Result<Page<JobEvent>> {
    let rows =
        sqlx::query("SELECT * FROM job_events WHERE job_id = ? AND (? IS NULL OR seq > ?) ORDER BY seq ASC LIMIT ?")
            .bind(job_id.to_string())
            .bind(after_seq)
            .bind(after_seq)
            .bind(limit as i64 + 1)
            .fetch_all(pool)
            .await?;
    let items = rows.iter().map(rows::event).collect::<Result<Vec<_>>>()?;
    Ok(rows::page(items, limit))
}

pub(crate) async fn claim_next_job(
    pool: &SqlitePool,
    lease: &Lease,
    skip_entities: &[String],
) -> Result<Option<ClaimedJob>> {
    // One statement, so the claim is atomic without an explicit transaction. Round robin between
    // entities: the next job is the oldest one of the entity whose latest job started longest
    // ago (never: first), so one entity's queue of jobs cannot hold back another's.
    let sql = format!(
        "UPDATE training_jobs SET status = 'running', started_at = ?1, attempts = attempts + 1,
                                  lease_owner = ?2, lease_expires_at = ?1 + ?3
         WHERE id = (
            SELECT j.id FROM training_jobs j JOIN models m ON m.id = j.model_id
            WHERE j.status = 'queued' AND NOT EXISTS (
                SELECT 1 FROM training_jobs r WHERE r.model_id = j.model_id AND r.status = 'running')
              AND m.entity NOT IN (SELECT value FROM json_each(?4))
            ORDER BY (SELECT MAX(s.started_at) FROM training_jobs s JOIN models sm ON sm.id = s.model_id
                      WHERE sm.entity = m.entity) ASC NULLS FIRST, j.seq
            LIMIT 1)
         RETURNING {JOB_COLUMNS}, config, trajectory_groups"
    );
    let skip = serde_json::to_string(skip_entities).map_err(|e| StoreError::Database(e.to_string()))?;
    let row =
        sqlx::query(&sql).bind(now_ms()).bind(&lease.owner).bind(lease.ttl_ms).bind(skip).fetch_optional(pool).await?;
    let Some(row) = row else { return Ok(None) };
    let job = rows::job(&row)?;
    let model = sqlx::query("SELECT * FROM models WHERE id = ?").bind(job.model_id.to_string()).fetch_one(pool).await?;
    Ok(Some(ClaimedJob {
        model: rows::model(&model)?,
        config: rows::json(&row, "config")?,
        inputs: rows::json(&row, "trajectory_groups")?,
        job,
    }))
}

pub(crate) async fn renew_lease(pool: &SqlitePool, job_id: Uuid, lease: &Lease) -> Result<LeaseState> {
    let row = sqlx::query(
        "UPDATE training_jobs SET lease_expires_at = ? + ?
         WHERE id = ? AND lease_owner = ? AND status = 'running' RETURNING cancel_requested",
    )
    .bind(now_ms())
    .bind(lease.ttl_ms)
    .bind(job_id.to_string())
    .bind(&lease.owner)
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        Some(row) => LeaseState::Held { cancel_requested: row.get::<i64, _>(0) != 0 },
        None => LeaseState::Lost,
    })
}

/// `LeaseLost` unless `owner` holds the running job (`NotFound` when it is gone).
pub(crate) async fn check_owner(conn: &mut SqliteConnection, job_id: Uuid, owner: &str) -> Result<()> {
    let row = sqlx::query("SELECT status = 'running' AND lease_owner IS ? FROM training_jobs WHERE id = ?")
        .bind(owner)
        .bind(job_id.to_string())
        .fetch_one(conn)
        .await?;
    if row.get::<bool, _>(0) {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

pub(crate) async fn append_event(
    tx: &mut Transaction<'_, Sqlite>,
    job_id: Uuid,
    owner: &str,
    kind: EventKind,
    data: &Value,
) -> Result<JobEvent> {
    check_owner(tx, job_id, owner).await?;
    insert_event(tx, job_id, kind, data).await
}

/// Whether a job has any event yet (ART reads `training_started` before anything else, so the
/// first event a job gets must be that one).
async fn has_events(conn: &mut SqliteConnection, job_id: Uuid) -> Result<bool> {
    Ok(sqlx::query("SELECT 1 FROM job_events WHERE job_id = ? LIMIT 1")
        .bind(job_id.to_string())
        .fetch_optional(conn)
        .await?
        .is_some())
}

/// Ends a job with `training_failed`, preceded by `training_started` if it never got one.
async fn fail_with_event(
    tx: &mut Transaction<'_, Sqlite>,
    id: Uuid,
    status: JobStatus,
    error_message: &str,
) -> Result<()> {
    set_terminal(tx, id, status, None, Some(error_message)).await?;
    if !has_events(tx, id).await? {
        insert_event(tx, id, EventKind::TrainingStarted, &json!({ "num_sequences": 0 })).await?;
    }
    insert_event(tx, id, EventKind::TrainingFailed, &json!({ "error_message": error_message })).await?;
    Ok(())
}

async fn insert_event(conn: &mut SqliteConnection, job_id: Uuid, kind: EventKind, data: &Value) -> Result<JobEvent> {
    let data = serde_json::to_string(data).map_err(|e| StoreError::Database(e.to_string()))?;
    let row =
        sqlx::query("INSERT INTO job_events (id, job_id, type, data, created_at) VALUES (?, ?, ?, ?, ?) RETURNING *")
            .bind(tandem_core::new_id().to_string())
            .bind(job_id.to_string())
            .bind(kind.as_str())
            .bind(data)
            .bind(now_ms())
            .fetch_one(conn)
            .await?;
    rows::event(&row)
}

async fn set_terminal(
    conn: &mut SqliteConnection,
    id: Uuid,
    status: JobStatus,
    step: Option<i64>,
    error: Option<&str>,
) -> Result<()> {
    sqlx::query("UPDATE training_jobs SET status = ?, step = ?, error_message = ?, finished_at = ? WHERE id = ?")
        .bind(status.as_str())
        .bind(step)
        .bind(error)
        .bind(now_ms())
        .bind(id.to_string())
        .execute(conn)
        .await?;
    Ok(())
}

pub(crate) async fn finish_job(
    tx: &mut Transaction<'_, Sqlite>,
    id: Uuid,
    owner: &str,
    outcome: &JobOutcome,
    quota: Option<i64>,
) -> Result<Job> {
    check_owner(tx, id, owner).await?;
    match outcome {
        JobOutcome::Succeeded { checkpoint, event_data } => {
            sqlx::query(
                "INSERT INTO checkpoints (id, model_id, step, path, metrics, created_at, size_bytes)
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(checkpoint.id.to_string())
            .bind(checkpoint.model_id.to_string())
            .bind(checkpoint.step)
            .bind(&checkpoint.path)
            .bind(rows::metrics_text(&checkpoint.metrics))
            .bind(now_ms())
            .bind(checkpoint.size_bytes)
            .execute(&mut **tx)
            .await?;
            set_terminal(tx, id, JobStatus::Succeeded, Some(checkpoint.step), None).await?;
            insert_event(tx, id, EventKind::TrainingEnded, event_data).await?;
            super::storage::charge_model(tx, checkpoint.model_id, checkpoint.size_bytes, quota).await?;
        }
        JobOutcome::Failed { error_message } | JobOutcome::Cancelled { error_message } => {
            let status = match outcome {
                JobOutcome::Cancelled { .. } => JobStatus::Cancelled,
                _ => JobStatus::Failed,
            };
            fail_with_event(tx, id, status, error_message).await?;
        }
    }
    job_by_id(tx, id).await
}

pub(crate) async fn recover(tx: &mut Transaction<'_, Sqlite>, max_attempts: i64, scope: Reclaim) -> Result<Recovery> {
    // A lease of NULL is a claim made before leases existed.
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM training_jobs
         WHERE status = 'running' AND (?1 OR lease_expires_at IS NULL OR lease_expires_at <= ?2) ORDER BY seq"
    );
    let rows = sqlx::query(&sql).bind(scope == Reclaim::All).bind(now_ms()).fetch_all(&mut **tx).await?;
    let mut out = Recovery::default();
    for row in &rows {
        let job = rows::job(row)?;
        if job.cancel_requested {
            fail_with_event(tx, job.id, JobStatus::Cancelled, "training job cancelled").await?;
            out.failed.push(job.id);
        } else if job.attempts >= max_attempts {
            let msg = crate::codec::gave_up_message(job.attempts);
            fail_with_event(tx, job.id, JobStatus::Failed, &msg).await?;
            out.failed.push(job.id);
        } else {
            sqlx::query(
                "UPDATE training_jobs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL WHERE id = ?",
            )
            .bind(job.id.to_string())
            .execute(&mut **tx)
            .await?;
            // Only a job whose events a client may have read says it restarts; one killed before
            // its `training_started` simply runs again, and its first event is still that one.
            if has_events(tx, job.id).await? {
                let data = json!({ "attempt": job.attempts + 1, "reason": crate::codec::restart_reason(scope) });
                insert_event(tx, job.id, EventKind::TrainingRestarted, &data).await?;
            }
            out.requeued.push(job.id);
        }
    }
    Ok(out)
}
