//! Training jobs and their events in PostgreSQL: the job state machine's transitions, each with
//! its event written in the same transaction, so the status and the event log never disagree.
//!
//! Every transition reads the job's status under the job's row lock (SQLite's single writer makes
//! any read current; here a concurrent claim or cancel could have moved it on), and every event
//! is inserted under that lock too, so a job's events commit in `seq` order.

use super::{lock_key, lock_model, rows, seq_clause, DB_NOW_MS};
use crate::{
    now_ms, ClaimedJob, JobOutcome, JobRollout, Lease, LeaseState, NewJob, Reclaim, Recovery, Result, StoreError,
};
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool, Row};
use tandem_core::history::GradientStepRow;
use tandem_core::records::{EventKind, Job, JobEvent, JobKind, JobStatus, Page, PageRequest};
use uuid::Uuid;

/// A job's columns without its inputs and rollout groups (each can be megabytes): what every
/// read of a job as a record selects.
const JOB_COLUMNS: &str = "id, model_id, kind, status, step, error_message, cancel_requested, attempts, created_at, \
                           started_at, finished_at, rollout_metrics";

/// How often one claim looks again after losing a model to a concurrent claim (each retry means
/// another claim succeeded, so the queue moves on regardless).
const CLAIM_ATTEMPTS: usize = 32;

pub(crate) async fn active_job_counts(pool: &PgPool) -> Result<Vec<(JobKind, JobStatus, i64)>> {
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
pub(crate) async fn gradient_step_history(pool: &PgPool, model_id: Uuid) -> Result<Vec<GradientStepRow>> {
    let rows: Vec<(i64, String, Option<i64>, String, i64)> = sqlx::query_as(
        "SELECT job_seq, status, step, data, created_at FROM (
             SELECT j.seq AS job_seq, j.status, j.step, e.data, e.created_at, e.seq AS event_seq
             FROM job_events e JOIN training_jobs j ON j.id = e.job_id
             WHERE j.model_id = $1 AND e.type = 'gradient_step'
               -- A job re-run after a restart keeps its first attempt's events: count only
               -- those after its last `training_restarted`.
               AND e.seq > COALESCE((SELECT MAX(r.seq) FROM job_events r
                                     WHERE r.job_id = e.job_id AND r.type = 'training_restarted'), 0)
             ORDER BY e.seq DESC LIMIT $2) AS newest
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
                data: crate::codec::parse_json(&data, "data")?,
                created_at,
            })
        })
        .collect()
}

pub(crate) async fn list_jobs(pool: &PgPool, model_id: Uuid, page: PageRequest) -> Result<Page<Job>> {
    let (cmp, order) = seq_clause(page.order, 2);
    let after = match page.after {
        Some(a) => Some(super::cursor_seq(pool, "training_jobs", "model_id", &model_id.to_string(), a).await?),
        None => None,
    };
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM training_jobs WHERE model_id = $1 AND ($2::bigint IS NULL OR {cmp})
         ORDER BY {order} LIMIT $3"
    );
    let rows =
        sqlx::query(&sql).bind(model_id.to_string()).bind(after).bind(page.limit as i64 + 1).fetch_all(pool).await?;
    let items = rows.iter().map(rows::job).collect::<Result<Vec<_>>>()?;
    Ok(rows::page(items, page.limit))
}

pub(crate) async fn create_job(
    pool: &PgPool,
    new: &NewJob,
    max_pending: Option<i64>,
    quota: Option<i64>,
) -> Result<Job> {
    let sql = format!(
        "INSERT INTO training_jobs (id, model_id, kind, status, config, trajectory_groups, rollout_metrics,
                                    rollout_groups, created_at, size_bytes)
         VALUES ($1, $2, $3, 'queued', $4, $5, $6, $7, $8, $9) RETURNING {JOB_COLUMNS}"
    );
    let (config, inputs) = (rows::text(&new.config)?, rows::text(&new.inputs)?);
    let groups = new.rollout.as_ref().map(|r| rows::text(&r.groups)).transpose()?;
    let size = crate::storage::job_bytes(&config, &inputs, groups.as_deref());
    let mut tx = pool.begin().await?;
    // The model's lock keeps its jobs' `seq` in commit order, and an import from recording a
    // step between its "no job pending" check and its insert.
    if !lock_model(&mut tx, new.model_id).await? {
        return Err(StoreError::NotFound);
    }
    if let Some(cap) = max_pending {
        // The entity's jobs span its models, so the model's row lock is not enough: an advisory
        // lock per entity, held to the commit, orders concurrent creations. It is its own
        // statement so that the count below (READ COMMITTED) takes its snapshot after the wait.
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtextextended('tandem-job-cap:' || entity, 0)) FROM models WHERE id = $1",
        )
        .bind(new.model_id.to_string())
        .execute(&mut *tx)
        .await?;
        let pending: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM training_jobs j JOIN models m ON m.id = j.model_id
             WHERE m.entity = (SELECT entity FROM models WHERE id = $1) AND j.status IN ('queued', 'running')",
        )
        .bind(new.model_id.to_string())
        .fetch_one(&mut *tx)
        .await?;
        if pending >= cap {
            return Err(StoreError::AtLimit(pending));
        }
    }
    let row = sqlx::query(&sql)
        .bind(tandem_core::new_id().to_string())
        .bind(new.model_id.to_string())
        .bind(new.kind.as_str())
        .bind(config)
        .bind(inputs)
        // Finite numbers only, as every metrics column (the schema checks it).
        .bind(new.rollout.as_ref().map(|r| rows::metrics_text(&r.metrics)))
        .bind(groups)
        .bind(now_ms())
        .bind(size)
        .fetch_one(&mut *tx)
        .await?;
    super::notify::notify(&mut tx, super::notify::JOBS, "").await?;
    super::storage::charge_model(&mut tx, new.model_id, size, quota).await?;
    tx.commit().await?;
    rows::job(&row)
}

pub(crate) async fn get_job<'e, E: sqlx::PgExecutor<'e>>(ex: E, entity: &str, id: Uuid) -> Result<Job> {
    let columns = JOB_COLUMNS.split(", ").map(|c| format!("j.{c}")).collect::<Vec<_>>().join(", ");
    let sql = format!(
        "SELECT {columns} FROM training_jobs j JOIN models m ON m.id = j.model_id WHERE j.id = $1 AND m.entity = $2"
    );
    let row = sqlx::query(&sql).bind(id.to_string()).bind(entity).fetch_one(ex).await?;
    rows::job(&row)
}

pub(crate) async fn get_job_rollout(pool: &PgPool, entity: &str, id: Uuid) -> Result<JobRollout> {
    let row = sqlx::query(
        "SELECT j.* FROM training_jobs j JOIN models m ON m.id = j.model_id WHERE j.id = $1 AND m.entity = $2",
    )
    .bind(id.to_string())
    .bind(entity)
    .fetch_one(pool)
    .await?;
    let groups = match row.try_get::<Option<String>, _>("rollout_groups")? {
        Some(text) => Some(crate::codec::parse_json(&text, "rollout_groups")?),
        None => None,
    };
    Ok(JobRollout { job: rows::job(&row)?, groups, inputs: rows::json(&row, "trajectory_groups")? })
}

/// The job as it is now, locked until the transaction ends.
async fn lock_job(conn: &mut PgConnection, id: Uuid) -> Result<Job> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM training_jobs WHERE id = $1 FOR NO KEY UPDATE");
    let row = sqlx::query(&sql).bind(id.to_string()).fetch_one(conn).await?;
    rows::job(&row)
}

pub(crate) async fn cancel_job(pool: &PgPool, entity: &str, id: Uuid) -> Result<Job> {
    let mut tx = pool.begin().await?;
    get_job(&mut *tx, entity, id).await?;
    match lock_job(&mut tx, id).await?.status {
        JobStatus::Queued => {
            fail_with_event(&mut tx, id, JobStatus::Cancelled, "training job cancelled before it started").await?;
        }
        JobStatus::Running => {
            sqlx::query("UPDATE training_jobs SET cancel_requested = TRUE WHERE id = $1")
                .bind(id.to_string())
                .execute(&mut *tx)
                .await?;
        }
        _ => {}
    }
    let job = lock_job(&mut tx, id).await?;
    tx.commit().await?;
    Ok(job)
}

pub(crate) async fn list_events(
    pool: &PgPool,
    job_id: Uuid,
    after_seq: Option<i64>,
    limit: u32,
) -> Result<Page<JobEvent>> {
    let rows = sqlx::query(
        "SELECT * FROM job_events WHERE job_id = $1 AND ($2::bigint IS NULL OR seq > $2) ORDER BY seq ASC LIMIT $3",
    )
    .bind(job_id.to_string())
    .bind(after_seq)
    .bind(limit as i64 + 1)
    .fetch_all(pool)
    .await?;
    let items = rows.iter().map(rows::event).collect::<Result<Vec<_>>>()?;
    Ok(rows::page(items, limit))
}

/// The oldest claimable job, round robin between entities: the next job is the oldest one of the
/// entity whose latest job started longest ago (never: first), so one entity's queue of jobs
/// cannot hold back another's. Jobs another claim holds are skipped, not waited for.
///
/// "The oldest queued job of its model" is spelt out (SQLite's order implies it): a claim that
/// skips a model's oldest job because another claim holds it must not take the model's next one.
const CANDIDATE: &str = "
    SELECT j.id, j.model_id FROM training_jobs j JOIN models m ON m.id = j.model_id
    WHERE j.status = 'queued'
      AND NOT EXISTS (
        SELECT 1 FROM training_jobs r WHERE r.model_id = j.model_id AND r.status = 'running')
      AND NOT EXISTS (
        SELECT 1 FROM training_jobs o WHERE o.model_id = j.model_id AND o.status = 'queued' AND o.seq < j.seq)
      AND NOT (m.entity = ANY($1))
    ORDER BY (SELECT MAX(s.started_at) FROM training_jobs s JOIN models sm ON sm.id = s.model_id
              WHERE sm.entity = m.entity) ASC NULLS FIRST, j.seq
    LIMIT 1
    FOR NO KEY UPDATE OF j SKIP LOCKED";

/// Claims like SQLite's single `UPDATE`, between any number of processes. `SKIP LOCKED` keeps
/// two claims off one job (a job claimed meanwhile fails `status = 'queued'` when re-checked on
/// locking). The candidate's `NOT EXISTS` tests read the statement's snapshot, which may predate
/// another claim's commit; the oldest-job rule already keeps a second claim off a model whose
/// oldest job was just claimed, and "one running job per model" is checked once more under the
/// model's claim lock, in a fresh snapshot that sees every earlier claim, so the rule does not
/// rest on that argument alone.
pub(crate) async fn claim_next_job(
    pool: &PgPool,
    lease: &Lease,
    skip_entities: &[String],
) -> Result<Option<ClaimedJob>> {
    for _ in 0..CLAIM_ATTEMPTS {
        let mut tx = pool.begin().await?;
        let Some(candidate) = sqlx::query(CANDIDATE).bind(skip_entities).fetch_optional(&mut *tx).await? else {
            // At once rather than when the connection is next used: workers poll this.
            tx.rollback().await?;
            return Ok(None);
        };
        let (id, model_id): (String, String) = (candidate.try_get("id")?, candidate.try_get("model_id")?);
        // An advisory lock, not the model's row: a claim holds a job's row while it waits, and
        // deleting a model takes the model's row before its jobs'.
        lock_key(&mut tx, "claim", &model_id).await?;
        let running = sqlx::query("SELECT 1 FROM training_jobs WHERE model_id = $1 AND status = 'running' LIMIT 1")
            .bind(&model_id)
            .fetch_optional(&mut *tx)
            .await?;
        if running.is_some() {
            tx.rollback().await?;
            continue;
        }
        let sql = format!(
            "UPDATE training_jobs SET status = 'running', started_at = $1, attempts = attempts + 1,
                                      lease_owner = $3, lease_expires_at = {DB_NOW_MS} + $4
             WHERE id = $2
             RETURNING {JOB_COLUMNS}, config, trajectory_groups"
        );
        let row = sqlx::query(&sql)
            .bind(now_ms())
            .bind(&id)
            .bind(&lease.owner)
            .bind(lease.ttl_ms)
            .fetch_one(&mut *tx)
            .await?;
        let model = sqlx::query("SELECT * FROM models WHERE id = $1").bind(&model_id).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        return Ok(Some(ClaimedJob {
            model: rows::model(&model)?,
            config: rows::json(&row, "config")?,
            inputs: rows::json(&row, "trajectory_groups")?,
            job: rows::job(&row)?,
        }));
    }
    Ok(None)
}

pub(crate) async fn renew_lease(pool: &PgPool, job_id: Uuid, lease: &Lease) -> Result<LeaseState> {
    let sql = format!(
        "UPDATE training_jobs SET lease_expires_at = {DB_NOW_MS} + $1
         WHERE id = $2 AND lease_owner = $3 AND status = 'running' RETURNING cancel_requested"
    );
    let row =
        sqlx::query(&sql).bind(lease.ttl_ms).bind(job_id.to_string()).bind(&lease.owner).fetch_optional(pool).await?;
    Ok(match row {
        Some(row) => LeaseState::Held { cancel_requested: row.try_get::<bool, _>(0)? },
        None => LeaseState::Lost,
    })
}

/// Locks the job's row and checks that `owner` holds it running: `LeaseLost` otherwise,
/// `NotFound` when the job is gone. Re-claiming takes the same row lock, so a write that passed
/// this check commits before the job changes hands.
async fn lock_owned(conn: &mut PgConnection, job_id: Uuid, owner: &str) -> Result<()> {
    let (status, holder): (String, Option<String>) =
        sqlx::query_as("SELECT status, lease_owner FROM training_jobs WHERE id = $1 FOR NO KEY UPDATE")
            .bind(job_id.to_string())
            .fetch_one(conn)
            .await?;
    if status == JobStatus::Running.as_str() && holder.as_deref() == Some(owner) {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

pub(crate) async fn append_event(
    pool: &PgPool,
    job_id: Uuid,
    owner: &str,
    kind: EventKind,
    data: &Value,
) -> Result<JobEvent> {
    let mut tx = pool.begin().await?;
    lock_owned(&mut tx, job_id, owner).await?;
    let event = insert_event(&mut tx, job_id, kind, data).await?;
    tx.commit().await?;
    Ok(event)
}

/// Whether a job has any event yet (ART reads `training_started` before anything else, so the
/// first event a job gets must be that one).
async fn has_events(conn: &mut PgConnection, job_id: Uuid) -> Result<bool> {
    Ok(sqlx::query("SELECT 1 FROM job_events WHERE job_id = $1 LIMIT 1")
        .bind(job_id.to_string())
        .fetch_optional(conn)
        .await?
        .is_some())
}

/// Ends a job with `training_failed`, preceded by `training_started` if it never got one.
async fn fail_with_event(conn: &mut PgConnection, id: Uuid, status: JobStatus, error_message: &str) -> Result<()> {
    set_terminal(conn, id, status, None, Some(error_message)).await?;
    if !has_events(conn, id).await? {
        insert_event(conn, id, EventKind::TrainingStarted, &json!({ "num_sequences": 0 })).await?;
    }
    insert_event(conn, id, EventKind::TrainingFailed, &json!({ "error_message": error_message })).await?;
    Ok(())
}

/// Inserts an event under its job's row lock (a no-op when the transaction holds it already):
/// appends to one job are serialised, so their `seq`s commit in order and a reader paging by
/// `seq` never steps over one still to commit. `NotFound` when the job is gone.
async fn insert_event(conn: &mut PgConnection, job_id: Uuid, kind: EventKind, data: &Value) -> Result<JobEvent> {
    sqlx::query("SELECT 1 FROM training_jobs WHERE id = $1 FOR NO KEY UPDATE")
        .bind(job_id.to_string())
        .fetch_one(&mut *conn)
        .await?;
    let row = sqlx::query(
        "INSERT INTO job_events (id, job_id, type, data, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING *",
    )
    .bind(tandem_core::new_id().to_string())
    .bind(job_id.to_string())
    .bind(kind.as_str())
    .bind(rows::text(data)?)
    .bind(now_ms())
    .fetch_one(conn)
    .await?;
    rows::event(&row)
}

async fn set_terminal(
    conn: &mut PgConnection,
    id: Uuid,
    status: JobStatus,
    step: Option<i64>,
    error: Option<&str>,
) -> Result<()> {
    sqlx::query("UPDATE training_jobs SET status = $1, step = $2, error_message = $3, finished_at = $4 WHERE id = $5")
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
    pool: &PgPool,
    id: Uuid,
    owner: &str,
    outcome: &JobOutcome,
    quota: Option<i64>,
) -> Result<Job> {
    let mut tx = pool.begin().await?;
    // The model's row before the job's (the order deleting a model takes them in), since a
    // success records the model's next checkpoint.
    let model_id: String = sqlx::query_scalar("SELECT model_id FROM training_jobs WHERE id = $1")
        .bind(id.to_string())
        .fetch_one(&mut *tx)
        .await?;
    lock_model(&mut tx, crate::codec::parse_uuid(&model_id, "model_id")?).await?;
    lock_owned(&mut tx, id, owner).await?;
    match outcome {
        JobOutcome::Succeeded { checkpoint, event_data } => {
            sqlx::query(
                "INSERT INTO checkpoints (id, model_id, step, path, metrics, created_at, size_bytes)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(checkpoint.id.to_string())
            .bind(checkpoint.model_id.to_string())
            .bind(checkpoint.step)
            .bind(&checkpoint.path)
            .bind(rows::metrics_text(&checkpoint.metrics))
            .bind(now_ms())
            .bind(checkpoint.size_bytes)
            .execute(&mut *tx)
            .await?;
            set_terminal(&mut tx, id, JobStatus::Succeeded, Some(checkpoint.step), None).await?;
            insert_event(&mut tx, id, EventKind::TrainingEnded, event_data).await?;
            super::notify::notify(&mut tx, super::notify::CHECKPOINTS, &checkpoint.path).await?;
            // The job's row is already this transaction's, so the re-read below waits on nothing.
            super::storage::charge_model(&mut tx, checkpoint.model_id, checkpoint.size_bytes, quota).await?;
        }
        JobOutcome::Failed { error_message } | JobOutcome::Cancelled { error_message } => {
            let status = match outcome {
                JobOutcome::Cancelled { .. } => JobStatus::Cancelled,
                _ => JobStatus::Failed,
            };
            fail_with_event(&mut tx, id, status, error_message).await?;
        }
    }
    let job = lock_job(&mut tx, id).await?;
    tx.commit().await?;
    Ok(job)
}

pub(crate) async fn recover(pool: &PgPool, max_attempts: i64, scope: Reclaim) -> Result<Recovery> {
    let mut tx = pool.begin().await?;
    // Locked in `seq` order, so two recoveries at once cannot deadlock. A job whose row another
    // transaction holds (its trainer finishing it or appending an event, another recovery) is
    // skipped: it is alive, or the other recovery takes it. A lease of NULL is a claim made
    // before leases existed.
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM training_jobs
         WHERE status = 'running' AND ($1 OR lease_expires_at IS NULL OR lease_expires_at <= {DB_NOW_MS})
         ORDER BY seq FOR NO KEY UPDATE SKIP LOCKED"
    );
    let rows = sqlx::query(&sql).bind(scope == Reclaim::All).fetch_all(&mut *tx).await?;
    let mut out = Recovery::default();
    for row in &rows {
        let job = rows::job(row)?;
        if job.cancel_requested {
            fail_with_event(&mut tx, job.id, JobStatus::Cancelled, "training job cancelled").await?;
            out.failed.push(job.id);
        } else if job.attempts >= max_attempts {
            let msg = crate::codec::gave_up_message(job.attempts);
            fail_with_event(&mut tx, job.id, JobStatus::Failed, &msg).await?;
            out.failed.push(job.id);
        } else {
            sqlx::query(
                "UPDATE training_jobs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL WHERE id = $1",
            )
            .bind(job.id.to_string())
            .execute(&mut *tx)
            .await?;
            // Only a job whose events a client may have read says it restarts; one killed before
            // its `training_started` simply runs again, and its first event is still that one.
            if has_events(&mut tx, job.id).await? {
                let data = json!({ "attempt": job.attempts + 1, "reason": crate::codec::restart_reason(scope) });
                insert_event(&mut tx, job.id, EventKind::TrainingRestarted, &data).await?;
            }
            out.requeued.push(job.id);
        }
    }
    if !out.requeued.is_empty() {
        super::notify::notify(&mut tx, super::notify::JOBS, "").await?;
    }
    tx.commit().await?;
    Ok(out)
}
