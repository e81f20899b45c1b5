//! tandem's durable state behind one [`Store`] trait: API keys, models, checkpoints, trajectory
//! logs, training jobs and their events, datasets, stored Responses.
//!
//! The trait speaks domain records (`tandem_core::records`); SQL stays inside the backends.
//! SQLite ([`SqliteStore`]) is the default; PostgreSQL ([`PostgresStore`]), for several servers
//! sharing one database, passes the same behaviour test (`tests/behaviour.rs`). Entity scoping
//! happens here: every read that takes an `entity` treats another entity's object exactly like a
//! missing one. Checkpoint files live in a local directory ([`CheckpointDir`]) and, for several
//! nodes, in a shared object store behind it ([`Checkpoints`]); the store only records their
//! relative paths.

mod blobs;
mod checkpoints;
mod codec;
pub mod copy;
mod dataset_blobs;
mod deadline;
mod errors;
mod postgres;
mod sqlite;
mod storage;
mod tinker;

pub use blobs::{create_private_dir_all, CheckpointDir};
pub use checkpoints::{BlobStore, Checkpoints, SWEEP_GRACE};
pub use deadline::Deadline;
pub use errors::PoolSettings;
pub use postgres::{PostgresStore, MAX_CONNECTIONS as POSTGRES_POOL_SIZE};
pub use sqlite::{SqliteStore, POOL_SIZE as SQLITE_POOL_SIZE};
pub use storage::{
    admits as storage_admits, no_room as storage_no_room, EntityQuota, OverQuota, StorageUsage, MODEL_ROW_BYTES,
};
pub use tinker::{blob_path as tinker_blob_path, TinkerCap, TinkerCatalog, TinkerChange, TinkerEntry, TinkerSession};

use async_trait::async_trait;
use serde_json::Value;
use std::collections::BTreeMap;
use tandem_core::records::{
    Checkpoint, Dataset, Job, JobEvent, JobKind, JobStatus, LogEntry, ModelRecord, Page, PageRequest,
};
use uuid::Uuid;

/// What can go wrong in the store, in terms the api can map to statuses.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("conflict: {0}")]
    Conflict(String),
    /// A page cursor that names no item of this list.
    #[error("unknown cursor")]
    InvalidCursor,
    #[error("database error: {0}")]
    Database(String),
    #[error("i/o error: {0}")]
    Io(String),
    /// A worker-side write for a job this worker no longer holds: its lease expired and another
    /// trainer re-claimed the job (or the job ended meanwhile). The write was not made.
    #[error("the job's lease is held by another trainer or has ended")]
    LeaseLost,
    /// A capped insert found the entity already at its cap (the count it found).
    #[error("at the limit: {0} already")]
    AtLimit(i64),
    /// The database or the blob store did not answer (stopped, unreachable, no connection free
    /// within the pool's acquire timeout, a connection lost mid-transaction, which rolled it
    /// back): nothing was written, and the same call may succeed shortly.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The disk (or the database's tablespace) is full: nothing was written.
    #[error("no space left: {0}")]
    Full(String),
    /// The write would take the entity past its storage quota: nothing was written.
    #[error("{0}")]
    OverQuota(OverQuota),
}

impl StoreError {
    /// Which store an `Unavailable` or `Full` error is about ("the blob store", "the database",
    /// "the disk"), for messages that say what failed but not where it is.
    pub fn failed_store(&self) -> Option<&'static str> {
        match self {
            StoreError::Unavailable(m) if m.starts_with("blob store") => Some("the blob store"),
            StoreError::Unavailable(_) => Some("the database"),
            StoreError::Full(_) => Some("the disk"),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// An API key as stored: its hash, never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: Uuid,
    pub entity: String,
    pub key_hash: [u8; 32],
    pub prefix: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// Fields of a model to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewModel {
    pub entity: String,
    pub project: String,
    pub name: String,
    pub base_model: String,
}

/// What deleting a model removed.
#[derive(Debug, Clone, PartialEq)]
pub struct DeletedModel {
    pub model_id: Uuid,
    pub deleted_checkpoints: Vec<Checkpoint>,
}

/// What deleting checkpoints by step did.
#[derive(Debug, Clone, PartialEq)]
pub struct DeletedCheckpoints {
    pub deleted: Vec<Checkpoint>,
    pub not_found_steps: Vec<i64>,
}

/// A trajectory log to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewLog {
    pub model_id: Uuid,
    pub split: String,
    pub metrics: BTreeMap<String, f64>,
    pub num_groups: i64,
    pub num_trajectories: i64,
    /// The groups exactly as received.
    pub trajectory_groups: Value,
}

/// A training job to enqueue; `config` is the serialised `TrainConfig` (RL) or `SftConfig`
/// (SFT), `inputs` the trajectory groups (RL) or the conversations (SFT).
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub model_id: Uuid,
    pub kind: JobKind,
    pub config: Value,
    pub inputs: Value,
    /// RL jobs: what people read of the rollouts (the trainer never does).
    pub rollout: Option<Rollout>,
}

/// An RL job's rollouts as submitted, and their metrics, kept for reading (the dashboard's curves
/// and trajectory browser).
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    /// `train/reward`, `train/reward_std_dev`, ... as a trajectory log of split `train` has them.
    pub metrics: BTreeMap<String, f64>,
    /// The `trajectory_groups` list exactly as received.
    pub groups: Value,
}

/// What a models list shows of each model's progress.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelSummary {
    /// The newest live checkpoint's step (0 before any).
    pub latest_step: i64,
    /// Unix milliseconds of the newest live checkpoint, log or job (None when there is none).
    pub last_activity: Option<i64>,
    /// The rollout metrics of the newest job that runs or succeeded, and the newest log's
    /// metrics, each with its time.
    pub job_metrics: Option<(i64, BTreeMap<String, f64>)>,
    pub log_metrics: Option<(i64, BTreeMap<String, f64>)>,
}

/// What a job's trajectory browser reads: the groups as submitted (absent for SFT jobs and jobs
/// from before they were kept) and the inputs as the trainer reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRollout {
    pub job: Job,
    pub groups: Option<Value>,
    pub inputs: Value,
}

/// A dataset to store as the next version of its name.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDataset {
    pub entity: String,
    pub project: String,
    pub name: String,
    pub num_rows: i64,
    pub data: DatasetData,
}

/// Where a dataset's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetData {
    /// In the dataset's row (a single server, or a cluster without a blob store).
    Inline(Vec<u8>),
    /// In the blob store, under the SHA-256 of the content ([`BlobStore::put_dataset`]).
    Blob { key: String, size: i64 },
}

impl DatasetData {
    pub fn size(&self) -> i64 {
        match self {
            DatasetData::Inline(b) => b.len() as i64,
            DatasetData::Blob { size, .. } => *size,
        }
    }
}

/// A job the worker has claimed, with the inputs it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    pub job: Job,
    pub model: ModelRecord,
    pub config: Value,
    pub inputs: Value,
}

/// How a job ended. `Succeeded` records the new checkpoint in the same transaction as the
/// terminal event, so `training_ended` is never visible before the checkpoint is listed.
#[derive(Debug, Clone, PartialEq)]
pub enum JobOutcome {
    Succeeded { checkpoint: NewCheckpoint, event_data: Value },
    Failed { error_message: String },
    Cancelled { error_message: String },
}

/// A checkpoint to record: its files must already be durable under `path`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCheckpoint {
    pub id: Uuid,
    pub model_id: Uuid,
    pub step: i64,
    pub path: String,
    pub metrics: BTreeMap<String, f64>,
    /// What its files take, charged to the model's entity.
    pub size_bytes: i64,
}

/// A stored Response (`/v1/responses` with `store: true`).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// `resp_...`.
    pub id: String,
    pub entity: String,
    /// The response object as returned.
    pub body: Value,
    /// The conversation up to and including this response's output, as chat messages.
    pub conversation: Value,
}

/// Most stored Responses an entity keeps; storing another drops its oldest.
pub const MAX_STORED_RESPONSES: usize = 1_000;

/// A trainer's hold on the jobs it claims. `owner` names the trainer process (unique per process
/// start); `ttl_ms` is how long a claim or a renewal holds the job. A job whose lease runs out
/// without a renewal is re-claimed by any trainer's [`Store::recover_interrupted_jobs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub owner: String,
    pub ttl_ms: i64,
}

/// Whether the trainer still holds a job it renewed the lease of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Renewed; `cancel_requested` says whether a client asked to cancel the job.
    Held { cancel_requested: bool },
    /// The job ended, was deleted, or another trainer re-claimed it: stop and write nothing.
    Lost,
}

/// Which `running` jobs recovery takes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    /// Every one: at the start of the only process that uses the store (SQLite), whose previous
    /// run left them.
    All,
    /// Those whose lease ran out (their trainer died or lost the database): any number of
    /// trainers share the store.
    Expired,
}

/// What one node tells the others through the database (PostgreSQL's LISTEN/NOTIFY).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A training job was queued: trainers look at once instead of at their next poll.
    JobQueued,
    /// A checkpoint was recorded with its files at `path`: serving nodes fetch them before a
    /// request asks.
    CheckpointRecorded { path: String },
}

/// What a node reports of itself at each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBeat {
    /// Unique per process start.
    pub id: String,
    pub name: String,
    /// `all`, `api` or `trainer`.
    pub role: String,
    pub version: String,
    /// It holds a training job.
    pub busy: bool,
    /// The base URL other nodes reach it at (`--advertise-url`), empty where none is known.
    pub address: String,
}

/// A node as the registry knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub id: String,
    pub name: String,
    pub role: String,
    pub version: String,
    pub started_at: i64,
    pub heartbeat_at: i64,
    pub busy: bool,
    pub draining: bool,
    /// It beat within [`NODE_ALIVE_MS`] (by the database's clock where there is a server).
    pub alive: bool,
    /// The base URL other nodes reach it at; empty where none is known.
    pub address: String,
}

/// How often a node beats.
pub const NODE_BEAT_MS: i64 = 5_000;
/// A node that has not beaten for this long counts as gone (three beats missed).
pub const NODE_ALIVE_MS: i64 = 3 * NODE_BEAT_MS;
/// Nodes silent for longer are left out of the list, and dropped a day after their last beat.
pub const NODE_LISTED_MS: i64 = 3_600_000;

/// What recovery did with jobs left `running` by a trainer that is gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    pub requeued: Vec<Uuid>,
    pub failed: Vec<Uuid>,
}

#[async_trait]
pub trait Store: TinkerCatalog + Send + Sync + 'static {
    /// Cheap round trip, for health checks.
    async fn ping(&self) -> Result<()>;
    /// Whether one process at a time uses this store (SQLite's file), so what the previous
    /// process left running is an orphan; false where servers share it (PostgreSQL).
    fn single_process(&self) -> bool;
    /// Notices from every node sharing the database, where it carries them (PostgreSQL); `None`
    /// for SQLite, whose one process needs none. Hints only: polling and fetching on first use
    /// make up for one that is lost.
    async fn notices(&self) -> Result<Option<tokio::sync::mpsc::Receiver<Notice>>>;

    // --- API keys ---
    async fn insert_key(&self, key: &ApiKeyRecord) -> Result<()>;
    /// The unrevoked key with this hash, if any.
    async fn find_active_key(&self, key_hash: &[u8; 32]) -> Result<Option<ApiKeyRecord>>;
    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>>;
    /// Revokes the key whose id or prefix is `id_or_prefix`; `NotFound` if none, `Conflict` if
    /// several keys share that prefix.
    async fn revoke_key(&self, id_or_prefix: &str) -> Result<ApiKeyRecord>;

    // --- models ---
    /// Creates a model, or with `return_existing` returns the existing one of the same name
    /// (`Ok((model, false))`). Without it a duplicate is `Conflict`.
    async fn create_model(&self, new: &NewModel, return_existing: bool) -> Result<(ModelRecord, bool)>;
    async fn get_model(&self, entity: &str, id: Uuid) -> Result<ModelRecord>;
    /// A model by id whatever its entity: for the operator's command line (`tandem export`),
    /// never for a request.
    async fn model_by_id(&self, id: Uuid) -> Result<ModelRecord>;
    /// The model named `{entity}/{project}/{name}`.
    async fn find_model(&self, entity: &str, project: &str, name: &str) -> Result<ModelRecord>;
    /// `search`: only models whose `project/name` contains this text (ASCII case-insensitive).
    async fn list_models(
        &self,
        entity: &str,
        project: Option<&str>,
        search: Option<&str>,
        page: PageRequest,
    ) -> Result<Page<ModelRecord>>;
    /// Deletes the model with its checkpoints, logs, jobs and events. Returns the checkpoints
    /// whose files the caller must remove.
    async fn delete_model(&self, entity: &str, id: Uuid) -> Result<DeletedModel>;
    /// A model's progress for a listing (the caller owns the model).
    async fn model_summary(&self, model_id: Uuid) -> Result<ModelSummary>;

    // --- checkpoints (the caller has checked that the model is the entity's) ---
    async fn list_checkpoints(&self, model_id: Uuid, page: PageRequest) -> Result<Page<Checkpoint>>;
    async fn get_checkpoint(&self, model_id: Uuid, step: i64) -> Result<Checkpoint>;
    /// The highest live step, or 0 when the model has no checkpoint.
    async fn latest_step(&self, model_id: Uuid) -> Result<i64>;
    async fn delete_checkpoints(&self, model_id: Uuid, steps: &[i64]) -> Result<DeletedCheckpoints>;
    /// Records adapter files already written at `path` as the model's next checkpoint (the
    /// latest live step + 1), as one write. A Conflict while a job of the model is queued or
    /// running: it trains from the latest step when it starts and writes the next one.
    async fn import_checkpoint(&self, model_id: Uuid, id: Uuid, path: &str, size_bytes: i64) -> Result<Checkpoint>;
    /// Every live checkpoint's path (the Tinker catalog's files included), to sweep files no
    /// checkpoint owns.
    async fn live_checkpoint_paths(&self) -> Result<Vec<String>>;

    // --- trajectory logs ---
    /// Appends a log at the model's latest step and merges its metrics into that checkpoint.
    async fn append_log(&self, new: &NewLog) -> Result<LogEntry>;
    async fn list_logs(&self, model_id: Uuid, split: Option<&str>, page: PageRequest) -> Result<Page<LogEntry>>;
    /// One log entry with its groups exactly as stored.
    async fn get_log(&self, model_id: Uuid, log_id: Uuid) -> Result<(LogEntry, Value)>;

    // --- datasets (scoped to the entity like models) ---
    async fn create_dataset(&self, new: &NewDataset) -> Result<Dataset>;
    async fn get_dataset(&self, entity: &str, id: Uuid) -> Result<Dataset>;
    /// The dataset `{entity}/{project}/{name}` at `version`, or its latest version.
    async fn find_dataset(&self, entity: &str, project: &str, name: &str, version: Option<i64>) -> Result<Dataset>;
    async fn list_datasets(&self, entity: &str, project: Option<&str>, page: PageRequest) -> Result<Page<Dataset>>;
    /// The file as uploaded, or where the blob store has it.
    async fn dataset_data(&self, entity: &str, id: Uuid) -> Result<DatasetData>;
    /// The blob keys live datasets name, to sweep the blob store's objects no dataset owns.
    async fn live_dataset_blob_keys(&self) -> Result<Vec<String>>;
    async fn delete_dataset(&self, entity: &str, id: Uuid) -> Result<()>;

    // --- training jobs ---
    async fn create_job(&self, new: &NewJob) -> Result<Job> {
        self.create_job_capped(new, None).await
    }
    /// Queues a job unless the model's entity already has `max_pending` jobs queued or running
    /// (`AtLimit`): the count and the insert are one atomic step, so concurrent creations never
    /// pass the cap together.
    async fn create_job_capped(&self, new: &NewJob, max_pending: Option<i64>) -> Result<Job>;
    /// Jobs of `entity` that are queued or running.
    async fn pending_jobs(&self, entity: &str) -> Result<i64>;
    /// Jobs of every entity that are queued or running, by kind and status (for `/metrics`;
    /// zero counts are left out).
    async fn active_job_counts(&self) -> Result<Vec<(JobKind, JobStatus, i64)>>;
    /// The model's `gradient_step` events with their jobs (the caller has checked that the model
    /// is the entity's), oldest first; the newest [`MAX_HISTORY_EVENTS`] when there are more.
    async fn gradient_step_history(&self, model_id: Uuid) -> Result<Vec<tandem_core::history::GradientStepRow>>;
    /// A model's jobs (the caller has checked that the model is the entity's), in creation order.
    async fn list_jobs(&self, model_id: Uuid, page: PageRequest) -> Result<Page<Job>>;
    /// The job, if its model belongs to `entity`.
    async fn get_job(&self, entity: &str, id: Uuid) -> Result<Job>;
    /// A job of this entity with its rollouts (reads the stored inputs: megabytes).
    async fn get_job_rollout(&self, entity: &str, id: Uuid) -> Result<JobRollout>;
    /// Cancels a queued job at once (with its `training_failed` event); marks a running one for
    /// the worker to stop at its next step; leaves a finished one as it is.
    async fn cancel_job(&self, entity: &str, id: Uuid) -> Result<Job>;
    async fn list_events(&self, entity: &str, job_id: Uuid, page: PageRequest) -> Result<Page<JobEvent>>;

    // --- the worker's side ---
    /// Atomically moves the oldest queued job whose model has no running job to `running`, held
    /// by `lease` (its expiry is reckoned by the database's clock where there is a server, so
    /// trainers' clocks need not agree).
    async fn claim_next_job(&self, lease: &Lease) -> Result<Option<ClaimedJob>> {
        self.claim_next_job_skipping(lease, &[]).await
    }
    /// [`Store::claim_next_job`], passing over the jobs of `skip_entities` (a trainer that
    /// time-slices between entities holds one job of each at a time).
    async fn claim_next_job_skipping(&self, lease: &Lease, skip_entities: &[String]) -> Result<Option<ClaimedJob>>;
    /// Extends the lease `lease.owner` holds on a running job by `lease.ttl_ms` from now.
    async fn renew_lease(&self, job_id: Uuid, lease: &Lease) -> Result<LeaseState>;
    /// Appends an event to a running job `owner` holds; `LeaseLost` (nothing written) otherwise,
    /// so a trainer that lost its job can never interleave events with the one that took it.
    async fn append_event(
        &self,
        job_id: Uuid,
        owner: &str,
        kind: tandem_core::records::EventKind,
        data: &Value,
    ) -> Result<JobEvent>;
    async fn is_cancel_requested(&self, job_id: Uuid) -> Result<bool>;
    /// Ends a running job `owner` holds with its terminal event (and, on success, its checkpoint)
    /// in one transaction; `LeaseLost` when another trainer holds it now.
    async fn finish_job(&self, job_id: Uuid, owner: &str, outcome: &JobOutcome) -> Result<Job>;
    /// Jobs left `running` by a trainer that is gone (which ones: [`Reclaim`]) are re-queued with
    /// a `training_restarted` event, or failed with `training_failed` once they have been
    /// attempted `max_attempts` times.
    async fn recover_interrupted_jobs(&self, max_attempts: i64, scope: Reclaim) -> Result<Recovery>;

    // --- the node registry (operators' view: no entity's data) ---
    /// Records that `beat.id` is alive now (registering it the first time); returns whether an
    /// operator asked it to drain.
    async fn node_heartbeat(&self, beat: &NodeBeat) -> Result<bool>;
    /// Nodes that beat within [`NODE_LISTED_MS`], by name.
    async fn list_nodes(&self) -> Result<Vec<NodeRecord>>;
    /// Sets `draining` on the listed nodes whose id or name is `which`; `NotFound` when none is.
    async fn set_node_draining(&self, which: &str, draining: bool) -> Result<Vec<NodeRecord>>;
    /// A node stopping gracefully leaves the registry.
    async fn remove_node(&self, id: &str) -> Result<()>;

    // --- stored Responses (scoped to the entity) ---
    /// Stores a response; beyond [`MAX_STORED_RESPONSES`] the entity's oldest is dropped.
    async fn put_response(&self, response: &StoredResponse) -> Result<()>;
    async fn get_response(&self, entity: &str, id: &str) -> Result<StoredResponse>;
    async fn delete_response(&self, entity: &str, id: &str) -> Result<()>;

    // --- per-entity storage (src/storage.rs) ---
    /// What `entity`'s stored data takes and its own quota (zero and the default when it has
    /// stored nothing).
    async fn storage_usage(&self, entity: &str) -> Result<StorageUsage>;
    /// Every entity that stores something or has a quota of its own, by name (operators' view).
    async fn list_storage(&self) -> Result<Vec<StorageUsage>>;
    /// Sets `entity`'s own quota (`Default` returns it to the node's).
    async fn set_storage_quota(&self, entity: &str, quota: EntityQuota) -> Result<()>;
    /// The quota of entities without one of their own (`--storage-quota-mib`), `None`: none.
    fn default_storage_quota(&self) -> Option<i64>;
}

/// Most `gradient_step` events one history read returns (the newest): a curve of a model with
/// more still shows its last 100,000 optimiser steps.
pub const MAX_HISTORY_EVENTS: i64 = 100_000;

/// Current time in Unix milliseconds.
pub fn now_ms() -> i64 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    d.as_millis() as i64
}

/// The lease owner tests claim jobs as (never a real trainer's name, which ends in a fresh id).
pub const TEST_OWNER: &str = "test-trainer";

/// A lease of a minute for [`TEST_OWNER`], for tests that drive the worker's side by hand.
pub fn test_lease() -> Lease {
    Lease { owner: TEST_OWNER.into(), ttl_ms: 60_000 }
}
