//! The worker loop: wait for work, claim, train, finish.

use crate::lease::{spawn_renewals, LeaseFlags, Renewals};
use crate::sink::StoreSink;
use crate::turns::Turns;
use crate::{ReferencePolicy, TrainError, TrainJob, TrainOutput, TrainTask, Trainer};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_core::health::Heartbeat;
use tandem_core::records::{EventKind, JobKind, Order, PageRequest};
use tandem_core::sequences::RlInputs;
use tandem_core::sft::SftConfig;
use tandem_core::telemetry::TrainingMetrics;
use tandem_core::train_config::{KlReference, TrainConfig};
use tandem_store::{
    now_ms, CheckpointDir, Checkpoints, ClaimedJob, JobOutcome, Lease, NewCheckpoint, Reclaim, Store, StoreError,
};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// How often to look for jobs queued by another process, besides being notified.
    pub poll_interval: Duration,
    /// A job interrupted by restarts this many times is failed instead of re-run.
    pub max_attempts: i64,
    /// How long a claim holds a job without a renewal. A trainer that dies loses its job to
    /// another trainer this long after its last renewal.
    pub lease_ttl: Duration,
    /// Names this trainer as the holder of its leases: unique per process start.
    pub owner: String,
    /// Which running jobs [`Worker::recover`] takes back at start-up: all of them where this is
    /// the store's only process (SQLite), those whose lease ran out where trainers share it.
    pub reclaim_at_start: Reclaim,
    /// Jobs held in memory at once, each of another entity, time-sliced at gradient-step
    /// boundaries (`turns.rs`); each keeps its adapter, optimizer state and rows in memory.
    pub max_runs: usize,
    /// Jobs of further entities claimed beyond `max_runs`: their turn comes by parking a held
    /// job (its adapter and optimizer written to `park_dir`), so every entity with work shares
    /// the trainer. A parked job keeps only its rows in memory (and a waiting thread).
    pub max_parked: usize,
    /// Where parked jobs' states go (the data directory's `parked/`; the system's temporary
    /// directory when unset).
    pub park_dir: Option<std::path::PathBuf>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            poll_interval: Duration::from_secs(1),
            max_attempts: 3,
            lease_ttl: Duration::from_secs(30),
            owner: format!("trainer-{}", tandem_core::new_id()),
            reclaim_at_start: Reclaim::All,
            max_runs: 4,
            max_parked: 12,
            park_dir: None,
        }
    }
}

/// Runs training jobs: one per entity at a time, and only one computing at any moment (the
/// trainer uses every core it is given), the others waiting for their turn at a step boundary.
#[derive(Clone)]
pub struct Worker {
    store: Arc<dyn Store>,
    checkpoints: Checkpoints,
    trainer: Arc<dyn Trainer>,
    wake: Arc<Notify>,
    stopping: Arc<AtomicBool>,
    /// An operator asked this node to take no new job (it finishes the one it runs).
    draining: Arc<AtomicBool>,
    heartbeat: Arc<Heartbeat>,
    metrics: Arc<TrainingMetrics>,
    turns: Arc<Turns>,
    config: WorkerConfig,
}

impl Worker {
    pub fn new(
        store: Arc<dyn Store>,
        checkpoints: Checkpoints,
        trainer: Arc<dyn Trainer>,
        config: WorkerConfig,
    ) -> Self {
        Worker {
            store,
            checkpoints,
            trainer,
            wake: Arc::new(Notify::new()),
            stopping: Arc::new(AtomicBool::new(false)),
            draining: Arc::new(AtomicBool::new(false)),
            heartbeat: Arc::new(Heartbeat::default()),
            metrics: Arc::default(),
            turns: Arc::new(Turns::new(config.max_runs)),
            config,
        }
    }

    /// Beats while the loop serves the queue (`GET /v1/system-check` reads it).
    pub fn heartbeat(&self) -> Arc<Heartbeat> {
        self.heartbeat.clone()
    }

    /// Gradient steps, trained tokens and job durations (`GET /metrics` encodes them).
    pub fn metrics(&self) -> Arc<TrainingMetrics> {
        self.metrics.clone()
    }

    /// The turn between this worker's jobs, for other training work to take its share of it
    /// (the Tinker sessions' calls).
    pub fn turns(&self) -> Arc<Turns> {
        self.turns.clone()
    }

    /// Notified by the api when a job is queued, so it starts without waiting for the poll.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Stops (or resumes) claiming jobs; the job that runs, if any, runs to its end.
    pub fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Asks the loop to stop after (or, through the sink, during) the current job.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// The lease this worker claims jobs under.
    pub fn lease(&self) -> Lease {
        Lease { owner: self.config.owner.clone(), ttl_ms: self.config.lease_ttl.as_millis() as i64 }
    }

    /// Start-up recovery: re-queue or fail jobs a previous process left `running`, and remove
    /// checkpoint files that no checkpoint owns.
    pub async fn recover(&self) -> Result<(), StoreError> {
        self.reclaim(self.config.reclaim_at_start).await?;
        let live = self.store.live_checkpoint_paths().await?;
        let (local, shared) = self.checkpoints.sweep(&live, tandem_store::SWEEP_GRACE).await?;
        if local + shared > 0 {
            tracing::warn!(local, shared, "removed checkpoint files that no checkpoint owns");
        }
        if let Some(blobs) = self.checkpoints.remote() {
            let live = self.store.live_dataset_blob_keys().await?;
            let swept = blobs.sweep_datasets(&live, tandem_store::SWEEP_GRACE).await?;
            if swept > 0 {
                tracing::warn!(swept, "removed dataset objects that no dataset names");
            }
        }
        Ok(())
    }

    async fn reclaim(&self, scope: Reclaim) -> Result<(), StoreError> {
        let r = self.store.recover_interrupted_jobs(self.config.max_attempts, scope).await?;
        if !r.requeued.is_empty() || !r.failed.is_empty() {
            tracing::warn!(
                requeued = r.requeued.len(),
                failed = r.failed.len(),
                ?scope,
                "recovered interrupted training jobs"
            );
        }
        Ok(())
    }

    /// The loop, until [`Worker::stop`].
    pub async fn run(self) {
        // Marks the queue unserved however the loop ends, a panic included.
        struct Stopped(Arc<Heartbeat>);
        impl Drop for Stopped {
            fn drop(&mut self) {
                self.0.stop();
            }
        }
        let _stopped = Stopped(self.heartbeat.clone());
        let mut reclaimed_at: Option<Instant> = None;
        let mut gate = crate::lease::ReclaimGate::new(Instant::now());
        // The jobs this loop runs, with their entities (claims pass over those).
        let mut runs: JoinSet<()> = JoinSet::new();
        let mut running: HashMap<tokio::task::Id, String> = HashMap::new();
        while !self.stopping.load(Ordering::SeqCst) {
            self.heartbeat.beat(now_ms(), !runs.is_empty());
            // Jobs of trainers that died (another process's, on a shared database) come back
            // to the queue once their lease runs out; a few reads a lease are plenty.
            // Not right after an outage, though (`ReclaimGate`): until then, a ping tells when
            // the store is back (claims tell it too, but a draining node makes none).
            if reclaimed_at.is_none_or(|t| t.elapsed() >= crate::lease::renew_interval(self.config.lease_ttl)) {
                reclaimed_at = Some(Instant::now());
                let reached = if gate.may_reclaim(Instant::now(), self.config.lease_ttl) {
                    self.reclaim(Reclaim::Expired)
                        .await
                        .inspect_err(|e| tracing::error!(error = %e, "could not look for expired training job leases"))
                } else {
                    self.store.ping().await
                };
                gate.record(!matches!(reached, Err(StoreError::Unavailable(_))), Instant::now());
            }
            while !self.draining.load(Ordering::SeqCst)
                && runs.len() < self.config.max_runs.max(1) + self.config.max_parked
            {
                let busy: Vec<String> = running.values().cloned().collect();
                let claim = self.store.claim_next_job_skipping(&self.lease(), &busy).await;
                gate.record(!matches!(claim, Err(StoreError::Unavailable(_))), Instant::now());
                match claim {
                    Ok(Some(claimed)) => {
                        let (entity, worker) = (claimed.model.entity.clone(), self.clone());
                        let id = runs.spawn(async move { worker.run_claimed_job(claimed).await }).id();
                        running.insert(id, entity);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!(error = %e, "training worker error");
                        break;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::timeout(self.config.poll_interval, self.wake.notified()) => {}
                Some(done) = runs.join_next_with_id(), if !runs.is_empty() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(e) => {
                            tracing::error!(error = %e, "a training run ended abnormally");
                            e.id()
                        }
                    };
                    running.remove(&id);
                }
            }
        }
        // Each run sees `stopping` at its next step and ends; the jobs run again later.
        while runs.join_next().await.is_some() {}
        tracing::info!("training worker stopped");
    }

    /// Claims and runs one job to its end. `Ok(false)` when none was waiting.
    pub async fn run_once(&self) -> Result<bool, StoreError> {
        let Some(claimed) = self.store.claim_next_job(&self.lease()).await? else { return Ok(false) };
        self.run_claimed_job(claimed).await;
        Ok(true)
    }

    /// Runs a claimed job to its end, recording how it ended.
    async fn run_claimed_job(&self, claimed: ClaimedJob) {
        let job_id = claimed.job.id;
        let entity = claimed.model.entity.clone();
        tracing::info!(%job_id, model_id = %claimed.model.id, attempt = claimed.job.attempts, "training job started");
        let (claimed_at, kind) = (Instant::now(), claimed.job.kind.as_str());
        let outcome = match self.run_claimed(claimed).await {
            Ok(outcome) => outcome,
            Err(StoreError::NotFound) => None, // the model was deleted meanwhile, and the job with it
            // Another trainer re-claimed the job after this one could not renew its lease.
            Err(StoreError::LeaseLost) => {
                tracing::warn!(%job_id, "training job lost to another trainer; this run's results are dropped");
                None
            }
            Err(e) => {
                tracing::error!(%job_id, error = %e, "training job could not be finished");
                // An outage or a full disk outlasted the retries: say so (it is not a bug), but not
                // where the stores are (the log has the whole error).
                let why = match (&e, e.failed_store()) {
                    (StoreError::Full(_), _) => {
                        "the job's results could not be stored: the server is out of disk space".to_string()
                    }
                    (_, Some(store)) => format!("the job's results could not be stored: {store} did not answer"),
                    _ => format!("internal error: {e}"),
                };
                self.fail_until_recorded(&entity, job_id, why).await;
                Some("failed")
            }
        };
        if let Some(outcome) = outcome {
            self.metrics.job_finished(kind, outcome, claimed_at.elapsed().as_secs_f64());
        }
    }

    /// Ends a job that could not be finished normally (its checkpoint or its outcome could not be
    /// written: a full disk, a failing database) with `training_failed`, retrying with backoff
    /// until the store takes it: a job left `running` would hold back every later job of its
    /// model while ART polls its events forever. On shutdown the retries stop and start-up
    /// recovery ends the job instead.
    async fn fail_until_recorded(&self, entity: &str, job_id: Uuid, error_message: String) {
        let outcome = JobOutcome::Failed { error_message };
        let mut wait = Duration::from_millis(250);
        loop {
            self.heartbeat.beat(now_ms(), true);
            let recorded = async {
                // ART reads `training_started` before anything else; add it if the job never got one.
                if self.store.list_events(entity, job_id, PageRequest::first(1)).await?.items.is_empty() {
                    let data = json!({ "num_sequences": 0 });
                    self.store.append_event(job_id, &self.config.owner, EventKind::TrainingStarted, &data).await?;
                }
                ignore_gone(self.store.finish_job(job_id, &self.config.owner, &outcome).await)
            }
            .await;
            match recorded {
                Ok(_) | Err(StoreError::LeaseLost) => return,
                Err(e) if self.stopping.load(Ordering::SeqCst) => {
                    tracing::error!(%job_id, error = %e, "could not record the job's failure; recovery at the next start ends it");
                    return;
                }
                Err(e) => {
                    tracing::error!(%job_id, error = %e, retry_in_ms = wait.as_millis() as u64, "could not record the job's failure");
                    let _ = tokio::time::timeout(wait, self.wake.notified()).await;
                    wait = (wait * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// Runs a claimed job to its end: `Some(outcome)` once it is recorded as succeeded, failed or
    /// cancelled, `None` when shutdown interrupted it (it runs again at the next start).
    async fn run_claimed(&self, claimed: ClaimedJob) -> Result<Option<&'static str>, StoreError> {
        let job_id = claimed.job.id;
        // A database that is down for a moment as the job starts should not cost the job.
        let model_id = claimed.model.id;
        let base_step = self.while_unavailable(|| self.store.latest_step(model_id)).await?;
        let base_checkpoint = if base_step > 0 {
            let cp = self.while_unavailable(|| self.store.get_checkpoint(model_id, base_step)).await?;
            self.checkpoints.local_dir(&cp.path).await?
        } else {
            None
        };
        let task = match self.while_unavailable(|| self.task(&claimed, base_step)).await? {
            Ok(task) => task,
            Err(why) => return self.fail(job_id, false, why).await.map(|()| Some("failed")),
        };
        // An entity with no room left could not keep the checkpoint: fail before the trainer
        // spends its time on it (the checkpoint's own charge is the exact check).
        let entity = &claimed.model.entity;
        let usage = self.while_unavailable(|| self.store.storage_usage(entity)).await?;
        if let Some(over) = tandem_store::storage_no_room(&usage, self.store.default_storage_quota()) {
            return self.fail(job_id, false, over.to_string()).await.map(|()| Some("failed"));
        }
        let train_job = TrainJob { job_id, model: claimed.model.clone(), base_step, base_checkpoint, task };
        self.heartbeat.beat(now_ms(), true);
        let flags = Arc::new(LeaseFlags::default());
        let renewals = Renewals(spawn_renewals(self.store.clone(), job_id, self.lease(), flags.clone()));
        let kind = claimed.job.kind.as_str();
        let mut sink = StoreSink {
            heartbeat: self.heartbeat.clone(),
            metrics: self.metrics.clone(),
            kind,
            store: self.store.clone(),
            handle: Handle::current(),
            job_id,
            owner: self.config.owner.clone(),
            lease: flags.clone(),
            started: false,
            stopping: self.stopping.clone(),
            last_cancel_check: None,
            turn: None,
            unwritten: Vec::new(),
            park_path: self
                .config
                .park_dir
                .clone()
                .unwrap_or_else(std::env::temp_dir)
                .join(format!("tandem-parked-{job_id}.safetensors")),
        };
        let (trainer, turns) = (self.trainer.clone(), self.turns.clone());
        // The job's trainer time is its entity's, shared with the entity's Tinker calls.
        let entity = claimed.model.entity.clone();
        let (result, sink) = tokio::task::spawn_blocking(move || {
            // The job computes only while it holds the turn; between its steps another
            // entity's job may run (its state stays here, on this thread).
            sink.turn = Some(turns.enter_for(&entity));
            let result = match sink.interrupted() {
                Some(stop) => Err(stop),
                None => trainer.train(&train_job, &mut sink),
            };
            sink.turn = None;
            (result, sink)
        })
        .await
        .map_err(|e| StoreError::Io(format!("trainer thread panicked: {e}")))?;
        if flags.lost() {
            // Whatever the run produced, the job is another trainer's now.
            return Err(StoreError::LeaseLost);
        }
        if !matches!(result, Err(TrainError::Interrupted)) {
            // Events the store could not take during the run come before the outcome.
            self.write_unwritten(job_id, sink.unwritten).await?;
        }
        let outcome = match &result {
            Ok(_) => Some("succeeded"),
            Err(TrainError::Interrupted) => None,
            Err(TrainError::Cancelled) => Some("cancelled"),
            Err(_) => Some("failed"),
        };
        match result {
            Ok(output) => self.succeed(&claimed.model.id, job_id, sink.started, output).await,
            Err(TrainError::Interrupted) => {
                // The lease ends now rather than a whole lease from now, so a trainer sharing
                // the store takes the job at its next look; alone, this process re-runs it at
                // its next start.
                renewals.stop().await;
                let release = Lease { owner: self.config.owner.clone(), ttl_ms: 0 };
                if let Err(e) = self.store.renew_lease(job_id, &release).await {
                    tracing::warn!(%job_id, error = %e, "could not release the training job's lease");
                }
                tracing::warn!(%job_id, "training job interrupted by shutdown; it runs again from its stored inputs");
                Ok(())
            }
            Err(TrainError::Cancelled) => {
                let outcome = JobOutcome::Cancelled { error_message: "training job cancelled".into() };
                self.finish(job_id, sink.started, &outcome).await
            }
            Err(e) => self.fail(job_id, sink.started, e.to_string()).await,
        }
        .map(|()| outcome)
    }

    /// The job's stored inputs as a task; `Ok(Err(why))` fails the job.
    async fn task(&self, claimed: &ClaimedJob, base_step: i64) -> Result<Result<TrainTask, String>, StoreError> {
        match claimed.job.kind {
            JobKind::Rl => {
                let config: TrainConfig = match serde_json::from_value(claimed.config.clone()) {
                    Ok(c) => c,
                    Err(e) => return Ok(Err(format!("stored training config is unreadable: {e}"))),
                };
                let kl_reference = match &config.kl_penalty {
                    Some(kl) => match self.reference_policy(claimed.model.id, base_step, &kl.reference).await? {
                        Ok(r) => Some(r),
                        Err(why) => return Ok(Err(why)),
                    },
                    None => None,
                };
                match RlInputs::from_stored(claimed.inputs.clone()) {
                    Ok(inputs) => Ok(Ok(TrainTask::Rl { config, inputs, kl_reference })),
                    Err(why) => Ok(Err(why)),
                }
            }
            JobKind::Sft => {
                let config: SftConfig = match serde_json::from_value(claimed.config.clone()) {
                    Ok(c) => c,
                    Err(e) => return Ok(Err(format!("stored SFT config is unreadable: {e}"))),
                };
                let rows = claimed.inputs.as_array().cloned().unwrap_or_default();
                Ok(Ok(TrainTask::Sft { config, rows }))
            }
        }
    }

    /// The KL penalty's reference policy for a job that trains from `base_step`: step 0 is the
    /// base model; a lag names `base_step - lag`, or the newest live checkpoint below it when
    /// that one was deleted (ART's `delete_checkpoints` keeps only the latest and the best).
    /// `Ok(Err(why))` fails the job.
    async fn reference_policy(
        &self,
        model_id: Uuid,
        base_step: i64,
        reference: &KlReference,
    ) -> Result<Result<ReferencePolicy, String>, StoreError> {
        let checkpoint = |step: i64, dir: Option<std::path::PathBuf>| match dir {
            Some(dir) => Ok(ReferencePolicy::Checkpoint { step, dir }),
            None => Err(format!("the files of checkpoint {step} (the KL reference) are missing")),
        };
        match reference {
            KlReference::Step(0) => Ok(Ok(ReferencePolicy::Base)),
            KlReference::Step(step) => match self.store.get_checkpoint(model_id, *step).await {
                Ok(cp) => Ok(checkpoint(cp.step, self.checkpoints.local_dir(&cp.path).await?)),
                Err(StoreError::NotFound) => {
                    Ok(Err(format!("checkpoint {step}, the KL penalty's reference, no longer exists")))
                }
                Err(e) => Err(e),
            },
            KlReference::Lag(lag) => {
                let target = base_step.saturating_sub(*lag).max(0);
                let mut page = PageRequest { after: None, limit: 100, order: Order::Desc };
                loop {
                    let p = self.store.list_checkpoints(model_id, page).await?;
                    if let Some(cp) = p.items.iter().find(|c| c.step <= target) {
                        return Ok(checkpoint(cp.step, self.checkpoints.local_dir(&cp.path).await?));
                    }
                    match (p.has_more, p.items.last()) {
                        (true, Some(last)) => page.after = Some(last.id),
                        _ => return Ok(Ok(ReferencePolicy::Base)),
                    }
                }
            }
            KlReference::AdapterPath(p) => Ok(Err(format!("kl_ref_adapter_path {p:?} was not resolved"))),
        }
    }

    async fn succeed(
        &self,
        model_id: &Uuid,
        job_id: Uuid,
        started: bool,
        output: TrainOutput,
    ) -> Result<(), StoreError> {
        self.ensure_started(job_id, started).await?;
        let checkpoint_id = tandem_core::new_id();
        let path = CheckpointDir::relative_path(*model_id, checkpoint_id);
        let TrainOutput { files, metrics } = output;
        let size_bytes: i64 = files.iter().map(|(_, b)| b.len() as i64).sum();
        self.checkpoints.publish(&path, files).await?;
        // The files are stored: a database that is down for a moment should not cost the run.
        let (path_ref, metrics_ref) = (&path, &metrics);
        let recorded = self
            .while_unavailable(|| async move {
                let step = self.store.latest_step(*model_id).await? + 1;
                let (path, metrics) = (path_ref.clone(), metrics_ref.clone());
                let checkpoint =
                    NewCheckpoint { id: checkpoint_id, model_id: *model_id, step, path, metrics, size_bytes };
                let outcome = JobOutcome::Succeeded { checkpoint, event_data: json!({ "step": step }) };
                self.store.finish_job(job_id, &self.config.owner, &outcome).await.map(|_| step)
            })
            .await;
        match recorded {
            Ok(step) => {
                tracing::info!(%job_id, step, "training job succeeded");
                Ok(())
            }
            Err(e) => {
                // The row was never recorded, so the files belong to nothing.
                let _ = self.checkpoints.remove(&path).await;
                match e {
                    // The entity's data is at its quota: the job fails, saying so, and nothing of
                    // its checkpoint stays.
                    StoreError::OverQuota(over) => self.fail(job_id, true, over.to_string()).await,
                    e => Err(e),
                }
            }
        }
    }

    /// Runs `attempt` again with backoff while the store is unavailable, for up to
    /// [`RECORD_RETRY`] (less when shutting down).
    async fn while_unavailable<T, F: std::future::Future<Output = Result<T, StoreError>>>(
        &self,
        mut attempt: impl FnMut() -> F,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + RECORD_RETRY;
        let mut wait = Duration::from_millis(250);
        loop {
            match attempt().await {
                Err(StoreError::Unavailable(why))
                    if Instant::now() < deadline && !self.stopping.load(Ordering::SeqCst) =>
                {
                    // The last attempt comes at the deadline.
                    let nap = wait.min(deadline.saturating_duration_since(Instant::now()));
                    tracing::warn!(error = %why, retry_in_ms = nap.as_millis() as u64, "the store is unavailable; retrying");
                    self.heartbeat.beat(now_ms(), true);
                    tokio::time::sleep(nap).await;
                    wait = (wait * 2).min(Duration::from_secs(8));
                }
                other => return other,
            }
        }
    }

    async fn fail(&self, job_id: Uuid, started: bool, error_message: String) -> Result<(), StoreError> {
        tracing::warn!(%job_id, %error_message, "training job failed");
        self.finish(job_id, started, &JobOutcome::Failed { error_message }).await
    }

    /// Records a failed or cancelled job's outcome, through a short database outage.
    async fn finish(&self, job_id: Uuid, started: bool, outcome: &JobOutcome) -> Result<(), StoreError> {
        self.ensure_started(job_id, started).await?;
        let owner = &self.config.owner;
        ignore_gone(self.while_unavailable(|| self.store.finish_job(job_id, owner, outcome)).await).map(|_| ())
    }

    /// Every job's events begin with `training_started` (ART requires it before anything else).
    async fn ensure_started(&self, job_id: Uuid, started: bool) -> Result<(), StoreError> {
        if !started {
            let data = json!({ "num_sequences": 0 });
            self.write_unwritten(job_id, vec![(EventKind::TrainingStarted, data)]).await?;
        }
        Ok(())
    }

    /// Writes the events a run could not write while the store was unavailable, in order.
    async fn write_unwritten(
        &self,
        job_id: Uuid,
        events: Vec<(EventKind, serde_json::Value)>,
    ) -> Result<(), StoreError> {
        let owner = &self.config.owner;
        for (kind, data) in &events {
            self.while_unavailable(|| self.store.append_event(job_id, owner, *kind, data)).await?;
        }
        Ok(())
    }
}

/// How long a finished job's outcome is retried while the database is unavailable before the
/// job is handed to [`Worker::fail_until_recorded`]'s longer wait.
const RECORD_RETRY: Duration = Duration::from_secs(60);

fn ignore_gone<T>(r: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match r {
        Ok(t) => Ok(Some(t)),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}
