//! [`Catalog`]: what a Tinker run keeps beyond its session, as rows of the store (so every node
//! of a cluster reads the same) and files in the checkpoint store (local, or the shared blob
//! store behind the node's cache). Every save writes its files to a fresh directory before its
//! row names them, and a row that replaces another removes the other's files after: a reader
//! never sees half a set, and a published name never comes to mean bytes written after it was
//! published (a new save under a name starts private).

use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use tandem_core::tinker::{CheckpointKey, CheckpointKind, Modules, SavedSampler, StateInfo, TinkerError, STATE_FILE};
use tandem_store::{Checkpoints, Store, StoreError, TinkerCap, TinkerChange, TinkerEntry};

/// Saved states one entity may keep (each is an adapter and its moments: ~29 MB at rank 8 on
/// the bundled model), and as many external weights; saving over a name does not count.
pub const MAX_STATES_PER_ENTITY: i64 = 64;
/// Sampler weights saved by name one run may keep listed (each is a checkpoint).
pub const MAX_SAMPLERS_PER_MODEL: i64 = 1024;
/// Longest name of a catalog entry, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Most expired entries one sweep takes (the next sweep takes the rest).
pub const SWEEP_BATCH: i64 = 1000;

pub type Result<T> = std::result::Result<T, TinkerError>;

/// A store error as a catalog error: an outage is `Unavailable` (the same call may succeed
/// shortly), another entity's run `NotFound` (as missing), the rest the server's.
pub fn store_error(e: StoreError, what: &str) -> TinkerError {
    match e {
        StoreError::NotFound | StoreError::Conflict(_) => TinkerError::NotFound(format!("{what}: no such run")),
        StoreError::Unavailable(_) | StoreError::Full(_) => {
            let failed = e.failed_store().unwrap_or("the store");
            TinkerError::Unavailable(format!("{what}: {failed} did not answer; try again"))
        }
        // The caller's to fix (a 400 the SDK does not retry), with the entity's own numbers.
        StoreError::OverQuota(over) => TinkerError::User(format!("{what}: {over}")),
        other => TinkerError::Server(format!("{what}: {other}")),
    }
}

/// Why a name cannot name an entry (`None`: it can).
pub fn name_problem(name: &str) -> Option<String> {
    let bad = name.is_empty()
        || name.len() > MAX_NAME_BYTES
        || name == "."
        || name == ".."
        || name.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    bad.then(|| {
        format!(
            "the name {name:?} may not be empty, `.` or `..`, hold '/', '\\' or control characters, or exceed {MAX_NAME_BYTES} bytes"
        )
    })
}

/// A saved state as `load_weights` uses it: what it is and its local directory.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedState {
    pub info: StateInfo,
    pub dir: PathBuf,
}

/// A state's description as its row keeps it.
pub fn state_meta(info: &StateInfo) -> Value {
    json!({
        "base_model": info.base_model, "rank": info.rank, "train_attn": info.modules.attn,
        "train_mlp": info.modules.mlp, "train_unembed": info.modules.unembed,
    })
}

/// A state row's description (`None`: a row of another shape).
pub fn state_info(meta: &Value) -> Option<StateInfo> {
    let flag = |k: &str, before: bool| meta[k].as_bool().unwrap_or(before);
    Some(StateInfo {
        base_model: meta["base_model"].as_str()?.to_string(),
        rank: meta["rank"].as_u64()? as usize,
        modules: Modules {
            attn: flag("train_attn", true),
            mlp: flag("train_mlp", true),
            unembed: flag("train_unembed", false),
        },
    })
}

/// A sampler row's checkpoint (`None`: a row of another shape).
pub fn sampler_of(e: &TinkerEntry) -> Option<SavedSampler> {
    serde_json::from_value(e.meta.clone()).ok()
}

pub struct Catalog {
    store: Arc<dyn Store>,
    files: Checkpoints,
    url_key: tokio::sync::OnceCell<crate::urls::UrlKey>,
}

/// The name of the secret download URLs are signed with.
const URL_SECRET: &str = "external_weights_urls";

impl Catalog {
    pub fn new(store: Arc<dyn Store>, files: Checkpoints) -> Self {
        Catalog { store, files, url_key: tokio::sync::OnceCell::new() }
    }

    /// The key download URLs are signed with: the cluster's (read from the store once, stored
    /// there by the first node that asks), so a URL any node signed downloads from every node.
    pub async fn url_key(&self) -> Result<&crate::urls::UrlKey> {
        self.url_key
            .get_or_try_init(|| async {
                let fresh = crate::urls::UrlKey::fresh_hex();
                let secret =
                    self.store.tinker_secret(URL_SECRET, &fresh).await.map_err(|e| store_error(e, "signing"))?;
                crate::urls::UrlKey::from_hex(&secret)
                    .ok_or_else(|| TinkerError::Server("the stored URL secret is not 32 bytes of hex".into()))
            })
            .await
    }

    /// Writes `files` to a fresh directory, then records `entry` naming it (past `cap`, or on any
    /// failure, the files go again); the entry it replaced loses its files.
    async fn put_files(
        &self,
        mut entry: TinkerEntry,
        files: Vec<(String, Vec<u8>)>,
        cap: TinkerCap,
        full: String,
    ) -> Result<u64> {
        let blob = tandem_store::tinker_blob_path(uuid::Uuid::now_v7());
        let bytes: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
        self.files.publish(&blob, files).await.map_err(|e| store_error(e, "writing the files"))?;
        entry.blob = Some(blob.clone());
        entry.size_bytes = bytes as i64;
        match self.store.tinker_put(&entry, Some(cap)).await {
            Ok(replaced) => {
                self.remove_files(replaced.as_ref()).await;
                Ok(bytes)
            }
            Err(e) => {
                self.remove_files(Some(&entry)).await;
                Err(match e {
                    StoreError::AtLimit(_) => TinkerError::User(full),
                    e => store_error(e, "recording the checkpoint"),
                })
            }
        }
    }

    /// Removes an entry's files; a failure is logged (the orphan sweep takes them later).
    async fn remove_files(&self, entry: Option<&TinkerEntry>) {
        let Some(blob) = entry.and_then(|e| e.blob.as_deref()) else { return };
        if let Err(e) = self.files.remove(blob).await {
            tracing::warn!(blob, error = %e, "removing a Tinker checkpoint's files failed; the sweep will");
        }
    }

    fn new_entry(owner: &str, key: CheckpointKey, expires_at: Option<i64>, meta: Value) -> Result<TinkerEntry> {
        if let Some(problem) = name_problem(&key.name) {
            return Err(TinkerError::User(problem));
        }
        let created_at = tandem_store::now_ms();
        Ok(TinkerEntry {
            owner: owner.into(),
            key,
            size_bytes: 0,
            created_at,
            expires_at,
            public: false,
            blob: None,
            meta,
        })
    }

    /// Keeps a training state (`save_weights`) as `tinker://{model_id}/weights/{name}`.
    pub async fn save_state(
        &self,
        owner: &str,
        model_id: &str,
        name: &str,
        files: Vec<(String, Vec<u8>)>,
        info: &StateInfo,
        expires_at: Option<i64>,
    ) -> Result<()> {
        let key = CheckpointKey::new(model_id, CheckpointKind::Weights, name);
        let entry = Self::new_entry(owner, key, expires_at, state_meta(info))?;
        let cap = TinkerCap { max: MAX_STATES_PER_ENTITY, per_model: false };
        let full = format!("an entity may keep {MAX_STATES_PER_ENTITY} saved states; save over an existing name");
        self.put_files(entry, files, cap, full).await.map(|_| ())
    }

    /// A saved state of `owner`'s, or one published by anyone when `published` allows it, with
    /// its files fetched to this node (`None`: no such state).
    pub async fn state(&self, reader: &str, key: &CheckpointKey, published: bool) -> Result<Option<SavedState>> {
        let Some(entry) = self.readable(reader, key, published).await? else { return Ok(None) };
        let info =
            state_info(&entry.meta).ok_or_else(|| TinkerError::Server("a saved state's record is damaged".into()))?;
        let Some(blob) = entry.blob.as_deref() else { return Ok(None) };
        let dir = self.files.local_dir(blob).await.map_err(|e| store_error(e, "reading the saved state"))?;
        Ok(dir.filter(|d| d.join(STATE_FILE).is_file()).map(|dir| SavedState { info, dir }))
    }

    /// The entry `reader` may read: its own, or (with `published`) a public one of anyone's.
    pub async fn readable(&self, reader: &str, key: &CheckpointKey, published: bool) -> Result<Option<TinkerEntry>> {
        if let Some(own) =
            self.store.tinker_get(reader, key).await.map_err(|e| store_error(e, "reading the catalog"))?
        {
            return Ok(Some(own));
        }
        match published {
            true => self.published(key).await,
            false => Ok(None),
        }
    }

    /// Keeps external weights (`save_weights_external`); the bytes written.
    pub async fn save_external(
        &self,
        owner: &str,
        model_id: &str,
        name: &str,
        files: Vec<(String, Vec<u8>)>,
        expires_at: Option<i64>,
    ) -> Result<u64> {
        let key = CheckpointKey::new(model_id, CheckpointKind::ExternalWeights, name);
        let entry = Self::new_entry(owner, key, expires_at, json!({}))?;
        let cap = TinkerCap { max: MAX_STATES_PER_ENTITY, per_model: false };
        let full =
            format!("an entity may keep {MAX_STATES_PER_ENTITY} external weights; delete some or save over a name");
        self.put_files(entry, files, cap, full).await
    }

    /// The files of `owner`'s external weights, fetched to this node: (file name, path).
    pub async fn external_files(
        &self,
        owner: &str,
        model_id: &str,
        name: &str,
    ) -> Result<Option<Vec<(String, PathBuf)>>> {
        let key = CheckpointKey::new(model_id, CheckpointKind::ExternalWeights, name);
        let entry = self.store.tinker_get(owner, &key).await.map_err(|e| store_error(e, "reading the catalog"))?;
        let Some(blob) = entry.and_then(|e| e.blob) else { return Ok(None) };
        let Some(dir) = self.files.local_dir(&blob).await.map_err(|e| store_error(e, "reading the weights"))? else {
            return Ok(None);
        };
        let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
            .map_err(|e| TinkerError::Server(format!("reading the weights: {e}")))?
            .flatten()
            .filter_map(|f| Some((f.file_name().to_str()?.to_string(), f.path())))
            .collect();
        files.sort();
        Ok(Some(files))
    }

    /// Whether `owner` may keep sampler weights `name` of `model_id` (a new name counts against
    /// the run's limit); checked before the weights are written, and again when recorded.
    pub async fn sampler_room(&self, owner: &str, model_id: &str, name: &str) -> Result<()> {
        if let Some(problem) = name_problem(name) {
            return Err(TinkerError::User(problem));
        }
        let kept = self.samplers(owner, model_id).await?;
        if kept.len() as i64 >= MAX_SAMPLERS_PER_MODEL && !kept.iter().any(|s| s.name == name) {
            return Err(TinkerError::User(Self::samplers_full()));
        }
        Ok(())
    }

    fn samplers_full() -> String {
        format!(
            "a model may keep {MAX_SAMPLERS_PER_MODEL} sampler weights saved by name; delete some or save over a name"
        )
    }

    /// Keeps sampler weights saved by name (their checkpoint is the run's record's); the entry
    /// it replaces, whose checkpoint the caller deletes.
    pub async fn note_sampler(
        &self,
        owner: &str,
        model_id: &str,
        saved: &SavedSampler,
        expires_at: Option<i64>,
    ) -> Result<Option<SavedSampler>> {
        let key = CheckpointKey::new(model_id, CheckpointKind::SamplerWeights, &saved.name);
        let meta = serde_json::to_value(saved).map_err(|e| TinkerError::Server(e.to_string()))?;
        let entry = Self::new_entry(owner, key, expires_at, meta)?;
        let cap = TinkerCap { max: MAX_SAMPLERS_PER_MODEL, per_model: true };
        match self.store.tinker_put(&entry, Some(cap)).await {
            Ok(replaced) => Ok(replaced.as_ref().and_then(sampler_of)),
            Err(StoreError::AtLimit(_)) => Err(TinkerError::User(Self::samplers_full())),
            Err(e) => Err(store_error(e, "recording the sampler weights")),
        }
    }

    /// `owner`'s sampler weights saved by name of `model_id`.
    pub async fn samplers(&self, owner: &str, model_id: &str) -> Result<Vec<SavedSampler>> {
        let all = self.list(owner, Some(model_id)).await?;
        Ok(all.iter().filter(|e| e.key.kind == CheckpointKind::SamplerWeights).filter_map(sampler_of).collect())
    }

    /// `owner`'s entries of one run, or of all.
    pub async fn list(&self, owner: &str, model_id: Option<&str>) -> Result<Vec<TinkerEntry>> {
        self.store.tinker_list(owner, model_id).await.map_err(|e| store_error(e, "reading the catalog"))
    }

    /// Deletes an entry and its files; the entry deleted (`None`: there was none).
    pub async fn delete(&self, owner: &str, key: &CheckpointKey) -> Result<Option<TinkerEntry>> {
        let gone = self.store.tinker_delete(owner, key).await.map_err(|e| store_error(e, "deleting the checkpoint"))?;
        self.remove_files(gone.as_ref()).await;
        Ok(gone)
    }

    /// Sets when an entry expires (`None`: never); false when there is no such entry.
    pub async fn set_expiry(&self, owner: &str, key: &CheckpointKey, at: Option<i64>) -> Result<bool> {
        let before = self.store.tinker_change(owner, key, TinkerChange::Expiry(at)).await;
        Ok(before.map_err(|e| store_error(e, "setting the expiry"))?.is_some())
    }

    /// Publishes an entry or makes it private; whether that changed anything (`None`: there is no
    /// such entry).
    pub async fn set_public(&self, owner: &str, key: &CheckpointKey, public: bool) -> Result<Option<bool>> {
        let before = self.store.tinker_change(owner, key, TinkerChange::Public(public)).await;
        Ok(before.map_err(|e| store_error(e, "publishing"))?.map(|b| b.public != public))
    }

    /// A published entry, whoever owns it.
    pub async fn published(&self, key: &CheckpointKey) -> Result<Option<TinkerEntry>> {
        self.store.tinker_published(key).await.map_err(|e| store_error(e, "reading the catalog"))
    }

    /// The owner of run `run` when its checkpoint (`weights/NAME`, `sampler_weights/NAME`) is
    /// published and `reader` is someone else (`None`: not public, not there, or the reader's
    /// own, which the reader looks up as its own).
    pub async fn publisher(&self, reader: &str, run: &str, checkpoint: &str) -> Option<String> {
        let key = CheckpointKey::of_run(run, checkpoint)?;
        let owner = self.published(&key).await.ok().flatten()?.owner;
        (owner != reader).then_some(owner)
    }

    /// Entries whose time to live has passed at `now` (ms since the epoch), soonest first.
    pub async fn expired(&self, now: i64) -> Result<Vec<TinkerEntry>> {
        self.store.tinker_expired(now, SWEEP_BATCH).await.map_err(|e| store_error(e, "reading the catalog"))
    }
}

#[cfg(test)]
mod tests;
