//! A deadline on every call into a store over the network ([`Deadline`]).
//!
//! PostgreSQL's `statement_timeout` is the server's: a statement the network drops silently (a
//! firewall or NAT that forgets the flow, a partition without a reset) never reaches it, and the
//! client waits on TCP's retransmissions, which give up only after about fifteen minutes. So each
//! call is held to a deadline of its own here; past it the call is `Unavailable` (a 503 with
//! `Retry-After`, as for a server that is down). The connection it held is tested by a bounded
//! ping when the pool takes it back and closed when that gets no answer (`postgres::open`), so
//! a dead network does not keep pool slots either.
//!
//! A write the deadline cuts off may still have committed: like any 503, the answer acknowledges
//! nothing, and the caller's retry may write it again.

use crate::tinker::{TinkerCap, TinkerChange, TinkerEntry, TinkerSession};
use crate::*;
use std::future::Future;
use std::time::Duration;
use tandem_core::tinker::CheckpointKey;

/// `inner` with each call held to `limit`.
pub struct Deadline<S> {
    inner: S,
    limit: Duration,
}

impl<S> Deadline<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        Deadline { inner, limit }
    }

    async fn within<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.limit, call).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(format!("the database: no answer within {:?}", self.limit))),
        }
    }
}

/// `impl $trait for Deadline<S>`: the items in braces as written, and each listed method
/// forwarded to `inner` within the deadline. (The whole impl comes out of the macro so that
/// `async_trait` sees the methods.)
macro_rules! forward {
    ($trait:ident { $($own:tt)* } $( fn $name:ident(&self $(, $arg:ident: $ty:ty)* ) -> $ret:ty; )*) => {
        #[async_trait]
        impl<S: Store> $trait for Deadline<S> {
            $($own)*
            $( async fn $name(&self $(, $arg: $ty)*) -> $ret { self.within(self.inner.$name($($arg),*)).await } )*
        }
    };
}

forward! {
    Store {
        fn single_process(&self) -> bool {
            self.inner.single_process()
        }

        fn default_storage_quota(&self) -> Option<i64> {
            self.inner.default_storage_quota()
        }
    }
        fn ping(&self) -> Result<()>;
        fn notices(&self) -> Result<Option<tokio::sync::mpsc::Receiver<Notice>>>;
        fn insert_key(&self, key: &ApiKeyRecord) -> Result<()>;
        fn find_active_key(&self, key_hash: &[u8; 32]) -> Result<Option<ApiKeyRecord>>;
        fn list_keys(&self) -> Result<Vec<ApiKeyRecord>>;
        fn revoke_key(&self, id_or_prefix: &str) -> Result<ApiKeyRecord>;
        fn create_model(&self, new: &NewModel, return_existing: bool) -> Result<(ModelRecord, bool)>;
        fn get_model(&self, entity: &str, id: Uuid) -> Result<ModelRecord>;
        fn model_by_id(&self, id: Uuid) -> Result<ModelRecord>;
        fn find_model(&self, entity: &str, project: &str, name: &str) -> Result<ModelRecord>;
        fn list_models(&self, entity: &str, project: Option<&str>, search: Option<&str>, page: PageRequest)
            -> Result<Page<ModelRecord>>;
        fn delete_model(&self, entity: &str, id: Uuid) -> Result<DeletedModel>;
        fn model_summary(&self, model_id: Uuid) -> Result<ModelSummary>;
        fn list_checkpoints(&self, model_id: Uuid, page: PageRequest) -> Result<Page<Checkpoint>>;
        fn get_checkpoint(&self, model_id: Uuid, step: i64) -> Result<Checkpoint>;
        fn latest_step(&self, model_id: Uuid) -> Result<i64>;
        fn delete_checkpoints(&self, model_id: Uuid, steps: &[i64]) -> Result<DeletedCheckpoints>;
        fn import_checkpoint(&self, model_id: Uuid, id: Uuid, path: &str, size_bytes: i64) -> Result<Checkpoint>;
        fn live_checkpoint_paths(&self) -> Result<Vec<String>>;
        fn append_log(&self, new: &NewLog) -> Result<LogEntry>;
        fn list_logs(&self, model_id: Uuid, split: Option<&str>, page: PageRequest) -> Result<Page<LogEntry>>;
        fn get_log(&self, model_id: Uuid, log_id: Uuid) -> Result<(LogEntry, Value)>;
        fn create_dataset(&self, new: &NewDataset) -> Result<Dataset>;
        fn get_dataset(&self, entity: &str, id: Uuid) -> Result<Dataset>;
        fn find_dataset(&self, entity: &str, project: &str, name: &str, version: Option<i64>) -> Result<Dataset>;
        fn list_datasets(&self, entity: &str, project: Option<&str>, page: PageRequest) -> Result<Page<Dataset>>;
        fn dataset_data(&self, entity: &str, id: Uuid) -> Result<DatasetData>;
        fn live_dataset_blob_keys(&self) -> Result<Vec<String>>;
        fn delete_dataset(&self, entity: &str, id: Uuid) -> Result<()>;
        fn create_job_capped(&self, new: &NewJob, max_pending: Option<i64>) -> Result<Job>;
        fn pending_jobs(&self, entity: &str) -> Result<i64>;
        fn active_job_counts(&self) -> Result<Vec<(JobKind, JobStatus, i64)>>;
        fn gradient_step_history(&self, model_id: Uuid) -> Result<Vec<tandem_core::history::GradientStepRow>>;
        fn list_jobs(&self, model_id: Uuid, page: PageRequest) -> Result<Page<Job>>;
        fn get_job(&self, entity: &str, id: Uuid) -> Result<Job>;
        fn get_job_rollout(&self, entity: &str, id: Uuid) -> Result<JobRollout>;
        fn cancel_job(&self, entity: &str, id: Uuid) -> Result<Job>;
        fn list_events(&self, entity: &str, job_id: Uuid, page: PageRequest) -> Result<Page<JobEvent>>;
        fn claim_next_job_skipping(&self, lease: &Lease, skip_entities: &[String]) -> Result<Option<ClaimedJob>>;
        fn renew_lease(&self, job_id: Uuid, lease: &Lease) -> Result<LeaseState>;
        fn append_event(&self, job_id: Uuid, owner: &str, kind: tandem_core::records::EventKind, data: &Value)
            -> Result<JobEvent>;
        fn is_cancel_requested(&self, job_id: Uuid) -> Result<bool>;
        fn finish_job(&self, job_id: Uuid, owner: &str, outcome: &JobOutcome) -> Result<Job>;
        fn recover_interrupted_jobs(&self, max_attempts: i64, scope: Reclaim) -> Result<Recovery>;
        fn node_heartbeat(&self, beat: &NodeBeat) -> Result<bool>;
        fn list_nodes(&self) -> Result<Vec<NodeRecord>>;
        fn set_node_draining(&self, which: &str, draining: bool) -> Result<Vec<NodeRecord>>;
        fn remove_node(&self, id: &str) -> Result<()>;
        fn put_response(&self, response: &StoredResponse) -> Result<()>;
        fn get_response(&self, entity: &str, id: &str) -> Result<StoredResponse>;
        fn delete_response(&self, entity: &str, id: &str) -> Result<()>;
        fn storage_usage(&self, entity: &str) -> Result<StorageUsage>;
        fn list_storage(&self) -> Result<Vec<StorageUsage>>;
        fn set_storage_quota(&self, entity: &str, quota: EntityQuota) -> Result<()>;
}

forward! {
    TinkerCatalog {}
        fn tinker_put(&self, entry: &TinkerEntry, cap: Option<TinkerCap>) -> Result<Option<TinkerEntry>>;
        fn tinker_get(&self, owner: &str, key: &CheckpointKey) -> Result<Option<TinkerEntry>>;
        fn tinker_published(&self, key: &CheckpointKey) -> Result<Option<TinkerEntry>>;
        fn tinker_list(&self, owner: &str, model_id: Option<&str>) -> Result<Vec<TinkerEntry>>;
        fn tinker_delete(&self, owner: &str, key: &CheckpointKey) -> Result<Option<TinkerEntry>>;
        fn tinker_change(&self, owner: &str, key: &CheckpointKey, change: TinkerChange) -> Result<Option<TinkerEntry>>;
        fn tinker_expired(&self, now: i64, limit: i64) -> Result<Vec<TinkerEntry>>;
        fn tinker_secret(&self, name: &str, fresh: &str) -> Result<String>;
        fn tinker_session_put(&self, session: &TinkerSession) -> Result<()>;
        fn tinker_session(&self, id: &str) -> Result<Option<TinkerSession>>;
        fn tinker_session_move(&self, id: &str, from: &str, to: &str) -> Result<bool>;
        fn tinker_session_drop(&self, id: &str, node: &str) -> Result<()>;
        fn tinker_session_counts(&self) -> Result<Vec<(String, i64)>>;
        fn tinker_session_sweep(&self, before: i64) -> Result<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_past_the_deadline_is_unavailable_and_one_within_it_answers() {
        let store = Deadline::new(SqliteStore::in_memory().await.unwrap(), Duration::from_millis(400));
        assert!(store.ping().await.is_ok());
        let slow = store.within(async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok(())
        });
        match slow.await {
            Err(e @ StoreError::Unavailable(_)) => assert_eq!(e.failed_store(), Some("the database")),
            other => panic!("{other:?}"),
        }
        let quick = store.within(async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(7)
        });
        assert_eq!(quick.await.unwrap(), 7);
    }
}
