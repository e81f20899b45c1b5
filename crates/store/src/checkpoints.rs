//! Where checkpoint files live: always a local directory ([`CheckpointDir`]), which models and
//! trainers read adapters from, and, with `--blob-store`, an object store ([`BlobStore`]) that
//! every node shares, for which the local directory is a read-through cache.
//!
//! Publishing is "write, then record": the files are durable locally and every object is
//! uploaded before the caller records the checkpoint row, so a node that finds the row finds
//! the files. A node that misses them locally downloads the checkpoint's objects into a
//! temporary directory and renames it into place (two downloads of one checkpoint at once both
//! end with the same bytes in place). Objects that no live checkpoint owns are swept only once
//! they are older than a grace period, since another node may be uploading one it is about to
//! record.

use crate::{CheckpointDir, Result, StoreError};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The shared object store and the key prefix checkpoints live under.
#[derive(Debug, Clone)]
pub struct BlobStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// What logs and errors show of the URL (no credentials are ever in it: they come from the
    /// environment).
    url: String,
}

/// Objects under this prefix of the blob store are checkpoint files: `checkpoints/<model>/<cp>/<file>`.
const CHECKPOINTS: &str = "checkpoints";

impl BlobStore {
    /// Opens `file:///path`, `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`
    /// or `memory:///` (one process's memory, for tests). Credentials and endpoints come from the
    /// usual variables of each cloud (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`,
    /// `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...).
    pub fn open(url: &str) -> Result<Self> {
        let bad = |why: String| StoreError::Io(format!("--blob-store {url}: {why}"));
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let (scheme, prefix) = object_store::ObjectStoreScheme::parse(&parsed).map_err(|e| bad(e.to_string()))?;
        use object_store::ClientConfigKey::ConnectTimeout as Connect;
        use object_store::ObjectStoreScheme as S;
        let store: Arc<dyn ObjectStore> = match scheme {
            S::Local => {
                let root = PathBuf::from(parsed.path());
                crate::create_private_dir_all(&root).map_err(|e| bad(e.to_string()))?;
                // The prefix is the directory itself here.
                return Ok(BlobStore {
                    store: Arc::new(
                        object_store::local::LocalFileSystem::new_with_prefix(&root)
                            .map_err(|e| bad(e.to_string()))?
                            .with_automatic_cleanup(true),
                    ),
                    url: url.to_string(),
                });
            }
            S::Memory => Arc::new(object_store::memory::InMemory::new()),
            S::AmazonS3 => {
                let mut b = object_store::aws::AmazonS3Builder::from_env();
                if std::env::var_os("AWS_CONNECT_TIMEOUT").is_none() {
                    b = b.with_config(object_store::aws::AmazonS3ConfigKey::Client(Connect), CONNECT_TIMEOUT);
                }
                Arc::new(b.with_url(url).with_retry(client_retries()).build().map_err(|e| bad(e.to_string()))?)
            }
            S::GoogleCloudStorage => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env();
                if std::env::var_os("GOOGLE_CONNECT_TIMEOUT").is_none() {
                    b = b.with_config(object_store::gcp::GoogleConfigKey::Client(Connect), CONNECT_TIMEOUT);
                }
                Arc::new(b.with_url(url).with_retry(client_retries()).build().map_err(|e| bad(e.to_string()))?)
            }
            S::MicrosoftAzure => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env();
                if std::env::var_os("AZURE_CONNECT_TIMEOUT").is_none() {
                    b = b.with_config(object_store::azure::AzureConfigKey::Client(Connect), CONNECT_TIMEOUT);
                }
                Arc::new(b.with_url(url).with_retry(client_retries()).build().map_err(|e| bad(e.to_string()))?)
            }
            other => return Err(bad(format!("{other:?} is not a supported blob store"))),
        };
        let store: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
            store
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(store, prefix))
        };
        Ok(BlobStore { store, url: url.to_string() })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Deletes an object; one already gone is not an error (another node's sweep, a retry).
    pub(crate) async fn delete_quietly(&self, key: &ObjectPath) -> Result<()> {
        match self.store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io(e)),
        }
    }

    fn key(relative: &str, name: &str) -> ObjectPath {
        ObjectPath::from(format!("{CHECKPOINTS}/{relative}/{name}"))
    }

    fn dir_key(relative: &str) -> ObjectPath {
        ObjectPath::from(format!("{CHECKPOINTS}/{relative}"))
    }

    /// Every object under a checkpoint's prefix: (file name, key).
    pub(crate) async fn list(&self, relative: &str) -> Result<Vec<(String, ObjectPath)>> {
        let prefix = Self::dir_key(relative);
        let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await.map_err(io)?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let name = m.location.filename()?.to_string();
                Some((name, m.location))
            })
            .collect())
    }
}

pub(crate) fn io(e: object_store::Error) -> StoreError {
    crate::errors::blob_error(e)
}

/// The cloud clients' own retries, kept short: a read of a checkpoint this node lacks answers
/// (a 503 when the store is down) within a few seconds instead of the clients' default three
/// minutes; a publish retries on top of this for longer ([`Checkpoints::with_publish_budget`]).
fn client_retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig::default(),
        max_retries: 3,
        retry_timeout: Duration::from_secs(5),
    }
}

/// How long connecting to the blob store may take before the attempt fails (the clients'
/// default is 5 s); a variable of the cloud's own (e.g. `AWS_CONNECT_TIMEOUT`) takes precedence.
const CONNECT_TIMEOUT: &str = "2s";

/// Checkpoint files: the local directory, and the shared blob store behind it when there is one.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    local: CheckpointDir,
    remote: Option<BlobStore>,
    /// One download per checkpoint at a time: requests for a checkpoint this node lacks wait for
    /// the first one's download instead of each holding a copy of the files in memory.
    fetching: Arc<Gates>,
    /// Checkpoints this node has downloaded from the blob store since it started.
    downloads: Arc<std::sync::atomic::AtomicU64>,
    /// How long a publish keeps retrying while the blob store is unreachable or the disk full.
    publish_budget: Duration,
}

/// [`Checkpoints::publish`]'s default retry budget: a blob store back within a minute costs the
/// job only the wait.
pub const PUBLISH_BUDGET: Duration = Duration::from_secs(60);

/// Objects no live checkpoint owns are removed only once they are this old: a node may be
/// uploading one it has not recorded yet (an upload of a checkpoint takes seconds, not an hour).
pub const SWEEP_GRACE: Duration = Duration::from_secs(3600);

impl Checkpoints {
    pub fn local(local: CheckpointDir) -> Self {
        Checkpoints {
            local,
            remote: None,
            fetching: Arc::default(),
            downloads: Arc::default(),
            publish_budget: PUBLISH_BUDGET,
        }
    }

    pub fn with_remote(local: CheckpointDir, remote: BlobStore) -> Self {
        Checkpoints { remote: Some(remote), ..Checkpoints::local(local) }
    }

    /// How long [`Self::publish`] retries a blob store that does not answer or a disk that is
    /// full before it gives up (`--blob-retry-seconds`).
    pub fn with_publish_budget(mut self, budget: Duration) -> Self {
        self.publish_budget = budget;
        self
    }

    /// The local directory (on a node with a blob store: its cache).
    pub fn dir(&self) -> &CheckpointDir {
        &self.local
    }

    pub fn remote(&self) -> Option<&BlobStore> {
        self.remote.as_ref()
    }

    /// How many checkpoints this node has downloaded from the blob store.
    pub fn downloads(&self) -> u64 {
        self.downloads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes a checkpoint's files durably (locally, then to the blob store) before the caller
    /// records it. While the blob store does not answer or the disk is full it retries with
    /// backoff for the publish budget, then fails with that error. On failure nothing of it is
    /// left.
    pub async fn publish(&self, relative: &str, files: Vec<(String, Vec<u8>)>) -> Result<PathBuf> {
        let files: Arc<Files> = Arc::new(files.into_iter().map(|(n, b)| (n, Bytes::from(b))).collect());
        let path = self.retrying("writing", relative, || self.write_local(relative, files.clone())).await?;
        if let Err(e) = self.retrying("uploading", relative, || self.upload_files(relative, &files)).await {
            let _ = self.remove(relative).await;
            return Err(e);
        }
        Ok(path)
    }

    /// Runs `attempt` until it succeeds, fails for good, or the publish budget is spent on
    /// `Unavailable`/`Full` failures (the last of which it returns).
    async fn retrying<T, F: std::future::Future<Output = Result<T>>>(
        &self,
        what: &str,
        relative: &str,
        mut attempt: impl FnMut() -> F,
    ) -> Result<T> {
        let deadline = tokio::time::Instant::now() + self.publish_budget;
        let mut wait = Duration::from_millis(250);
        loop {
            match attempt().await {
                Err(e @ (StoreError::Unavailable(_) | StoreError::Full(_))) => {
                    let now = tokio::time::Instant::now();
                    if now >= deadline {
                        tracing::error!(checkpoint = relative, error = %e, "gave up {what} a checkpoint");
                        return Err(e);
                    }
                    // The last attempt comes at the deadline.
                    let nap = wait.min(deadline - now);
                    tracing::warn!(checkpoint = relative, error = %e, retry_in_ms = nap.as_millis() as u64,
                        "{what} a checkpoint failed; retrying");
                    tokio::time::sleep(nap).await;
                    wait = (wait * 2).min(Duration::from_secs(8));
                }
                other => return other,
            }
        }
    }

    /// Uploads a checkpoint already written to the local directory (an import writes it there
    /// first, to check it against the base model). A no-op without a blob store. Unlike
    /// [`Self::publish`] it does not retry past the client's own retries: a request waits on it.
    pub async fn upload(&self, relative: &str) -> Result<()> {
        if self.remote.is_none() {
            return Ok(());
        }
        let dir = self.local.resolve(relative).ok_or_else(|| bad_path(relative))?;
        let files: Files = blocking(move || {
            let mut files = Vec::new();
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                files.push((
                    entry.file_name().to_string_lossy().into_owned(),
                    Bytes::from(std::fs::read(entry.path())?),
                ));
            }
            Ok(files)
        })
        .await?;
        // A request waits on this one: no retries beyond the client's own (a quick 503).
        self.upload_files(relative, &files).await
    }

    async fn upload_files(&self, relative: &str, files: &Files) -> Result<()> {
        let Some(remote) = &self.remote else { return Ok(()) };
        for (name, bytes) in files {
            remote.store.put(&BlobStore::key(relative, name), PutPayload::from(bytes.clone())).await.map_err(io)?;
        }
        Ok(())
    }

    /// The local directory of a recorded checkpoint, downloaded first when only the blob store
    /// has it. `None` when its files are nowhere (deleted meanwhile, or lost).
    pub async fn local_dir(&self, relative: &str) -> Result<Option<PathBuf>> {
        let Some(path) = self.local.resolve(relative) else { return Ok(None) };
        if path.is_dir() {
            return Ok(Some(path));
        }
        let Some(remote) = &self.remote else { return Ok(None) };
        let gate = FetchGate::enter(&self.fetching, relative);
        let _one_at_a_time = gate.gate.lock().await;
        // A request that waited finds what the first one fetched.
        if path.is_dir() {
            return Ok(Some(path));
        }
        self.download(remote, relative).await
    }

    async fn download(&self, remote: &BlobStore, relative: &str) -> Result<Option<PathBuf>> {
        let objects = remote.list(relative).await?;
        if objects.is_empty() {
            return Ok(None);
        }
        let mut files = Vec::with_capacity(objects.len());
        for (name, key) in objects {
            let bytes = remote.store.get(&key).await.map_err(io)?.bytes().await.map_err(io)?;
            files.push((name, bytes));
        }
        let path = self.write_local(relative, Arc::new(files)).await?;
        self.downloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(checkpoint = relative, "checkpoint fetched from the blob store");
        Ok(Some(path))
    }

    /// Writes files as one local checkpoint directory (atomically, on a blocking thread).
    async fn write_local(&self, relative: &str, files: Arc<Files>) -> Result<PathBuf> {
        let (dir, rel) = (self.local.clone(), relative.to_string());
        blocking(move || {
            let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (n.as_str(), b.as_ref())).collect();
            dir.write_atomic(&rel, &refs)
        })
        .await
    }

    /// Removes a checkpoint's files here and in the blob store; missing files are not an error.
    pub async fn remove(&self, relative: &str) -> Result<()> {
        let (dir, rel) = (self.local.clone(), relative.to_string());
        blocking(move || dir.remove(&rel)).await?;
        if let Some(remote) = &self.remote {
            for (_, key) in remote.list(relative).await? {
                remote.delete_quietly(&key).await?;
            }
        }
        Ok(())
    }

    /// Both sweeps: (local, remote) counts.
    pub async fn sweep(&self, live: &[String], grace: Duration) -> Result<(usize, usize)> {
        Ok((self.sweep_local(live).await?, self.sweep_remote(live, grace).await?))
    }

    /// Removes local files no live checkpoint owns (a failed write's leftovers, and on a node
    /// with a blob store the cache's copies of deleted checkpoints). Returns how many went.
    pub async fn sweep_local(&self, live: &[String]) -> Result<usize> {
        let (dir, owned) = (self.local.clone(), live.to_vec());
        blocking(move || dir.sweep(&owned)).await
    }

    /// Removes, from the blob store, checkpoints no live one owns that are older than `grace`
    /// (a trainer's job: serving nodes sweep only their cache). Returns how many went.
    pub async fn sweep_remote(&self, live: &[String], grace: Duration) -> Result<usize> {
        let Some(remote) = &self.remote else { return Ok(0) };
        let live: std::collections::HashSet<&str> = live.iter().map(String::as_str).collect();
        let cutoff = cutoff_ms(grace);
        // checkpoint -> (its keys, whether every one is older than the cutoff)
        let mut orphans: BTreeMap<String, (Vec<ObjectPath>, bool)> = BTreeMap::new();
        let prefix = ObjectPath::from(CHECKPOINTS);
        let metas: Vec<_> = remote.store.list(Some(&prefix)).try_collect().await.map_err(io)?;
        for meta in metas {
            let parts: Vec<String> = meta.location.parts().map(|p| p.as_ref().to_string()).collect();
            let [_, model, cp, ..] = parts.as_slice() else { continue };
            let relative = format!("{model}/{cp}");
            if live.contains(relative.as_str()) {
                continue;
            }
            let entry = orphans.entry(relative).or_insert_with(|| (Vec::new(), true));
            entry.1 &= meta.last_modified.timestamp_millis() <= cutoff;
            entry.0.push(meta.location);
        }
        let mut removed = 0;
        for (relative, (keys, old)) in orphans {
            if !old {
                continue;
            }
            for key in keys {
                remote.delete_quietly(&key).await?;
            }
            tracing::debug!(checkpoint = %relative, "swept checkpoint objects no checkpoint owns");
            removed += 1;
        }
        Ok(removed)
    }
}

type Gates = std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// A checkpoint's download gate, taken out of the map again when its last holder is done (also
/// when a request is dropped while it waits).
struct FetchGate<'a> {
    gates: &'a Gates,
    key: String,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> FetchGate<'a> {
    fn enter(gates: &'a Gates, key: &str) -> Self {
        let mut map = gates.lock().unwrap_or_else(|p| p.into_inner());
        let gate = map.entry(key.to_string()).or_default().clone();
        FetchGate { gates, key: key.to_string(), gate }
    }
}

impl Drop for FetchGate<'_> {
    fn drop(&mut self) {
        let mut map = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map and this holder have it: nobody else waits on it.
        if Arc::strong_count(&self.gate) <= 2 {
            map.remove(&self.key);
        }
    }
}

/// Unix milliseconds `grace` ago: objects last written at or before it are old enough to sweep.
pub(crate) fn cutoff_ms(grace: Duration) -> i64 {
    crate::now_ms() - grace.as_millis() as i64
}

/// A checkpoint's files: (name, bytes); `Bytes` so that a retried upload shares them.
type Files = Vec<(String, Bytes)>;

/// Runs file-system work on a blocking thread.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| StoreError::Io(e.to_string()))?
}

fn bad_path(relative: &str) -> StoreError {
    StoreError::Io(format!("bad checkpoint path {relative}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn new_relative() -> String {
        CheckpointDir::relative_path(Uuid::now_v7(), Uuid::now_v7())
    }

    fn node(dir: &tempfile::TempDir, remote: &BlobStore) -> Checkpoints {
        Checkpoints::with_remote(CheckpointDir::open(dir.path().join("checkpoints")).unwrap(), remote.clone())
    }

    /// Two nodes sharing a blob store: what one publishes the other reads through its cache;
    /// removal reaches both; the sweep keeps young orphans (an upload in flight) and live ones.
    #[tokio::test]
    async fn nodes_share_checkpoints_through_the_blob_store() {
        let (blobs, a_dir, b_dir) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let remote = BlobStore::open(&format!("file://{}", blobs.path().display())).unwrap();
        let (a, b, rel) = (node(&a_dir, &remote), node(&b_dir, &remote), new_relative());
        let files = vec![("adapter_config.json".to_string(), b"{}".to_vec()), ("w".to_string(), vec![7u8; 3000])];
        a.publish(&rel, files.clone()).await.unwrap();

        let cached = b.local_dir(&rel).await.unwrap().expect("fetched from the blob store");
        assert!(cached.starts_with(b_dir.path()));
        assert_eq!(std::fs::read(cached.join("w")).unwrap(), files[1].1);
        assert_eq!(std::fs::read(cached.join("adapter_config.json")).unwrap(), b"{}");
        // A second read is the cached copy.
        assert_eq!(b.local_dir(&rel).await.unwrap(), Some(cached.clone()));

        // An orphan upload (never recorded) survives a sweep while young, goes once old.
        let orphan = CheckpointDir::relative_path(Uuid::now_v7(), Uuid::now_v7());
        a.publish(&orphan, vec![("w".into(), vec![1])]).await.unwrap();
        assert_eq!(b.sweep(std::slice::from_ref(&rel), SWEEP_GRACE).await.unwrap(), (0, 0));
        assert_eq!(b.sweep(std::slice::from_ref(&rel), Duration::ZERO).await.unwrap().1, 1);
        let fresh = tempfile::tempdir().unwrap();
        assert_eq!(node(&fresh, &remote).local_dir(&orphan).await.unwrap(), None, "orphan swept");
        assert!(node(&fresh, &remote).local_dir(&rel).await.unwrap().is_some(), "live one kept");

        a.remove(&rel).await.unwrap();
        let fresh = tempfile::tempdir().unwrap();
        assert_eq!(node(&fresh, &remote).local_dir(&rel).await.unwrap(), None);
        // b's cached copy goes at its next sweep (the checkpoint is no longer live).
        assert_eq!(b.sweep(&[], SWEEP_GRACE).await.unwrap().0, 1);
        assert!(!cached.exists());
        assert!(b.local_dir("../x").await.unwrap().is_none());
    }

    /// Requests for a checkpoint a node lacks, all at once: each gets the files, fetched once
    /// behind one gate that is gone afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_fetches_of_one_checkpoint_share_one_download() {
        let (blobs, a_dir, b_dir) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let remote = BlobStore::open(&format!("file://{}", blobs.path().display())).unwrap();
        let (a, b, rel) = (node(&a_dir, &remote), node(&b_dir, &remote), new_relative());
        a.publish(&rel, vec![("w".into(), vec![9u8; 1 << 20])]).await.unwrap();
        let fetches: Vec<_> = (0..16)
            .map(|_| {
                let (b, rel) = (b.clone(), rel.clone());
                tokio::spawn(async move { b.local_dir(&rel).await })
            })
            .collect();
        for f in fetches {
            let dir = f.await.unwrap().unwrap().unwrap();
            assert_eq!(std::fs::read(dir.join("w")).unwrap().len(), 1 << 20);
        }
        assert_eq!(b.downloads(), 1, "one download for sixteen requests");
        assert!(b.fetching.lock().unwrap().is_empty(), "no gate left behind");
        let leftovers = std::fs::read_dir(b.dir().root().join(rel.split('/').next().unwrap())).unwrap().count();
        assert_eq!(leftovers, 1, "one directory, no temporary ones");
    }

    #[tokio::test]
    async fn without_a_blob_store_only_the_local_directory_counts() {
        let dir = tempfile::tempdir().unwrap();
        let c = Checkpoints::local(CheckpointDir::open(dir.path().join("c")).unwrap());
        let rel = CheckpointDir::relative_path(Uuid::now_v7(), Uuid::now_v7());
        assert_eq!(c.local_dir(&rel).await.unwrap(), None);
        let path = c.publish(&rel, vec![("w".into(), vec![1, 2])]).await.unwrap();
        assert_eq!(c.local_dir(&rel).await.unwrap(), Some(path.clone()));
        c.upload(&rel).await.unwrap();
        c.remove(&rel).await.unwrap();
        assert!(!path.exists());
        assert!(BlobStore::open("ftp://x/y").is_err());
        assert!(BlobStore::open("not a url").is_err());
    }

    /// An S3 endpoint where nothing listens: a stopped blob store.
    fn unreachable_s3() -> BlobStore {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let store = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(format!("http://127.0.0.1:{port}"))
            .with_allow_http(true)
            .with_bucket_name("b")
            .with_region("us-east-1")
            .with_access_key_id("k")
            .with_secret_access_key("s")
            .with_retry(client_retries())
            .build()
            .unwrap();
        BlobStore { store: Arc::new(store), url: "s3://b".into() }
    }

    #[tokio::test]
    async fn an_unreachable_blob_store_fails_a_publish_after_its_budget_and_leaves_nothing() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let remote = unreachable_s3();
        let c = node(&a, &remote).with_publish_budget(Duration::from_millis(1500));
        let rel = new_relative();
        let started = std::time::Instant::now();
        let e = c.publish(&rel, vec![("w".into(), vec![1, 2])]).await.unwrap_err();
        let took = started.elapsed();
        assert!(matches!(e, StoreError::Unavailable(ref m) if m.starts_with("blob store")), "{e:?}");
        // It retried (more than one attempt's client retries) but stopped near the budget.
        assert!(took >= Duration::from_millis(1000) && took < Duration::from_secs(20), "{took:?}");
        assert!(c.dir().resolve(&rel).is_some_and(|p| !p.exists()), "the local files are removed");
        // A node without the files answers unavailable, not an i/o error (the api's 503).
        let e = node(&b, &remote).local_dir(&rel).await.unwrap_err();
        assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
        // A request's upload does not wait out the publish budget.
        let c = c.with_publish_budget(Duration::from_secs(600));
        c.dir().write_atomic(&rel, &[("w", &[1u8][..])]).unwrap();
        let started = std::time::Instant::now();
        assert!(matches!(c.upload(&rel).await, Err(StoreError::Unavailable(_))));
        assert!(started.elapsed() < Duration::from_secs(20));
    }
}
