//! What the Tinker service keeps between calls on the node that serves them: sessions, training
//! models with their calls' `seq_id` order, futures, sampling sessions, and each entity's
//! shares (sessions, models, pending results, queued bytes, samples in flight), each checked and
//! taken in one step. All in memory: a restart ends every session, as the SDK's server does
//! for a lost session; what outlives one is the catalog's ([`crate::Catalog`]).
//!
//! Generic over the sampling session `S` the front keeps (it holds engine handles this crate
//! does not know).

mod futures;
mod order;

pub use futures::{excerpt, Category, Outcome, Promise, MAX_ERROR_BYTES, MAX_FUTURES_PER_ENTITY};
pub use order::{Accepted, Waited};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tandem_core::seq_order::SeqOrder;
use tandem_core::tinker::{RunId, SavedSampler, TinkerError};
use tokio::sync::watch;

/// Whose a sampling session is.
pub trait Owned {
    fn entity(&self) -> &str;
}

/// A session: its entity and the models it created (released when it finishes).
struct SessionEntry {
    entity: String,
    models: Vec<RunId>,
    last_seen: Instant,
    /// Whether its client has sent a heartbeat (then missed beats end it: [`Waits::heartbeat`]).
    beats: bool,
    /// Taken over from a node that stopped: the calls that node held are lost.
    adopted: bool,
}

/// A training model: whose it is, what it trains, and where its calls are in `seq_id` order.
pub struct ModelEntry {
    pub id: RunId,
    pub entity: String,
    pub base_model: String,
    pub rank: usize,
    /// The request that created it (a retried `create_model` gets the same one).
    pub create_request: String,
    /// Its calls' `seq_id` order (training calls start at 1: the creation is 0).
    order: Mutex<SeqOrder>,
    /// Bumped at every change of `order`: waiting calls look at their turn again.
    moved: watch::Sender<u64>,
    /// Set when its session ends: calls still waiting fail at once and drop their data.
    released: std::sync::atomic::AtomicBool,
    /// The tandem model record its sampler weights are checkpoints of (project `tinker`).
    pub record_id: uuid::Uuid,
    /// Sampler weights saved this session, by name (the ephemeral kind too): the checkpoint
    /// each is.
    pub samplers: Mutex<HashMap<String, SavedSampler>>,
    /// What `forward_backward` calls added since the last `optim_step` (loss summed, tokens):
    /// the step's point on the dashboard's curves.
    pub pending: Mutex<Pending>,
    /// The target its inflight samplers follow: the model address of the newest weights saved
    /// with `kind: "inflight"` (empty until the first).
    pub inflight: Arc<std::sync::RwLock<String>>,
}

impl ModelEntry {
    /// A model of `entity` with no calls yet.
    pub fn new(
        id: RunId,
        entity: &str,
        base_model: &str,
        rank: usize,
        create_request: &str,
        record_id: uuid::Uuid,
    ) -> Self {
        ModelEntry {
            id,
            entity: entity.to_string(),
            base_model: base_model.to_string(),
            rank,
            create_request: create_request.to_string(),
            order: Mutex::default(),
            moved: watch::channel(0).0,
            released: Default::default(),
            record_id,
            samplers: Mutex::default(),
            pending: Mutex::default(),
            inflight: Arc::default(),
        }
    }

    /// The model rebuilt on this node after the node holding it stopped: its calls' order starts
    /// at the first call that arrives ([`SeqOrder::resumed`]).
    pub fn resumed(mut self) -> Self {
        self.order = Mutex::new(SeqOrder::resumed());
        self
    }
}

/// What ending sessions ended: their ids, and the models to release.
#[derive(Debug, Default)]
pub struct Ended {
    pub sessions: Vec<String>,
    pub models: Vec<RunId>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Pending {
    pub loss: f64,
    pub tokens: u64,
}

/// Training models one entity may hold at once (the server holds `--max-tinker-models` in all),
/// so no entity takes every place.
pub const MAX_MODELS_PER_ENTITY: usize = 4;
pub const MAX_SESSIONS_PER_ENTITY: usize = 64;
/// Sampling sessions one entity may hold (they end with their session).
pub const MAX_SAMPLERS_PER_ENTITY: usize = 1024;
/// Bytes of accepted, not yet finished calls (their decoded datums, sampling prompts) one
/// entity may hold: beyond it a call is answered 429, which the SDK retries (issue 50: 12 queued
/// calls had held 729 MB).
pub const MAX_QUEUED_BYTES_PER_ENTITY: u64 = 256 << 20;

/// How long sessions and calls wait (the server's settings; ten minutes each by default).
#[derive(Debug, Clone, Copy)]
pub struct Waits {
    /// `--tinker-idle-seconds`: a session without a heartbeat (the SDK beats every 10 s) or a
    /// call this long is ended and its models released.
    pub idle: Duration,
    /// `--tinker-seq-gap-seconds`: how long a call waits for the calls before it in `seq_id`
    /// order before it fails (and the missing calls are given up).
    pub seq_gap: Duration,
    /// `--tinker-heartbeat-seconds`: a session that has sent heartbeats is ended this long after
    /// its last heartbeat or call (its client has stopped: a recipe that exits without closing
    /// it). Sessions that never beat keep `idle`.
    pub heartbeat: Duration,
}

impl Default for Waits {
    fn default() -> Self {
        Waits { idle: Duration::from_secs(600), seq_gap: Duration::from_secs(600), heartbeat: Duration::from_secs(60) }
    }
}

/// The service's memory of sessions, models, futures and samplers on this node.
pub struct Registry<S> {
    pub waits: Waits,
    futures: Mutex<HashMap<String, futures::FutureEntry>>,
    sessions: Mutex<HashMap<String, SessionEntry>>,
    models: Mutex<HashMap<RunId, Arc<ModelEntry>>>,
    samplers: Mutex<HashMap<String, Arc<S>>>,
    /// Serialises the changes to one run's checkpoints (saves, deletes, TTLs, the sweep).
    pub runs: RunLocks,
    /// Places taken by model creations under way, per entity ([`Registry::reserve_model`]).
    places: Tally,
    /// Bytes of the calls each entity has accepted and not yet run ([`Registry::queue_bytes`]).
    queued: Tally,
    /// Each entity's samples in flight on the engine ([`Registry::sample_gate`]).
    sample_gates: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl<S> Default for Registry<S> {
    fn default() -> Self {
        Registry::new(Waits::default())
    }
}

/// Amounts taken per entity (model creations' places, queued bytes).
type Tally = Arc<Mutex<HashMap<String, u64>>>;

/// An amount taken under one of an entity's tallies (a model creation's place under its cap, a
/// call's bytes under [`MAX_QUEUED_BYTES_PER_ENTITY`]), given back when dropped (the model is
/// entered or failed; the call has run, failed, or its model was released).
pub struct Taken {
    tally: Tally,
    entity: String,
    amount: u64,
}

pub type QueuedBytes = Taken;
pub type ModelPlace = Taken;

impl Drop for Taken {
    fn drop(&mut self) {
        let mut counts = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.entity) {
            *n = n.saturating_sub(self.amount);
            if *n == 0 {
                counts.remove(&self.entity);
            }
        }
    }
}

/// Locks over runs' checkpoints, striped by (entity, run): a save, a delete, a TTL change and the
/// expiry sweep of one run never interleave, so the sweep deletes only what is still due when it
/// deletes (a TTL renewed or a name saved again meanwhile is kept). Striping keeps the memory
/// fixed; two runs sharing a stripe only wait for each other.
pub struct RunLocks(Vec<tokio::sync::Mutex<()>>);

impl Default for RunLocks {
    fn default() -> Self {
        RunLocks((0..64).map(|_| tokio::sync::Mutex::new(())).collect())
    }
}

impl RunLocks {
    fn stripe(&self, entity: &str, run: &str) -> &tokio::sync::Mutex<()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (entity, run).hash(&mut h);
        &self.0[h.finish() as usize % self.0.len()]
    }

    /// Holds `entity`'s run `run` (async callers).
    pub async fn lock(&self, entity: &str, run: &str) -> tokio::sync::MutexGuard<'_, ()> {
        self.stripe(entity, run).lock().await
    }

    /// Holds `entity`'s run `run` from a blocking thread (never from an async task).
    pub fn blocking_lock(&self, entity: &str, run: &str) -> tokio::sync::MutexGuard<'_, ()> {
        self.stripe(entity, run).blocking_lock()
    }
}

fn busy(what: String) -> TinkerError {
    TinkerError::Busy(what)
}

impl<S> Registry<S> {
    pub fn new(waits: Waits) -> Self {
        Registry {
            waits,
            futures: Mutex::default(),
            sessions: Mutex::default(),
            models: Mutex::default(),
            samplers: Mutex::default(),
            runs: RunLocks::default(),
            places: Tally::default(),
            queued: Tally::default(),
            sample_gates: Mutex::default(),
        }
    }

    /// A new session of `entity`: its id; `Busy` past [`MAX_SESSIONS_PER_ENTITY`].
    pub fn create_session(&self, entity: &str) -> Result<String, TinkerError> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if sessions.values().filter(|s| s.entity == entity).count() >= MAX_SESSIONS_PER_ENTITY {
            return Err(busy(format!("an entity may hold {MAX_SESSIONS_PER_ENTITY} sessions; finish one first")));
        }
        let id = format!("tandem-{}", uuid::Uuid::new_v4().simple());
        let session = SessionEntry {
            entity: entity.to_string(),
            models: Vec::new(),
            last_seen: Instant::now(),
            beats: false,
            adopted: false,
        };
        sessions.insert(id.clone(), session);
        Ok(id)
    }

    /// Takes over session `id` of `entity` from a node that stopped (its models are entered
    /// after, as they are rebuilt); false when this node holds it already.
    pub fn adopt_session(&self, entity: &str, id: &str) -> bool {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if sessions.contains_key(id) {
            return false;
        }
        let session = SessionEntry {
            entity: entity.to_string(),
            models: Vec::new(),
            last_seen: Instant::now(),
            beats: false,
            adopted: true,
        };
        sessions.insert(id.to_string(), session);
        true
    }

    /// Whether `entity`'s session `id` is held here (and whether it was taken over).
    pub fn session(&self, entity: &str, id: &str) -> Option<bool> {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.get(id).filter(|s| s.entity == entity).map(|s| s.adopted)
    }

    /// `entity`'s model `id`, or `None` (absent, or another entity's: the same answer).
    pub fn model(&self, entity: &str, id: &RunId) -> Option<Arc<ModelEntry>> {
        let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        models.get(id).filter(|m| m.entity == entity).cloned()
    }

    /// [`Self::model`] by the id as the client wrote it.
    pub fn model_named(&self, entity: &str, id: &str) -> Option<Arc<ModelEntry>> {
        self.model(entity, &RunId::parse(id)?)
    }

    /// Enters a model whose creation has begun (its place was reserved) into its session; a
    /// model of a session that ended meanwhile is not entered, and `false` says so.
    pub fn enter_model(&self, entry: Arc<ModelEntry>) -> bool {
        let mut models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        match sessions.get_mut(entry.id.session()) {
            Some(s) if s.entity == entry.entity => {
                s.models.push(entry.id.clone());
                models.insert(entry.id.clone(), entry);
                true
            }
            _ => false,
        }
    }

    /// Forgets a model whose creation or load failed.
    pub fn remove_model(&self, id: &RunId) {
        self.models.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    /// Ends the sessions `ending` picks, with their samplers and their models' entries.
    fn end_sessions(&self, ending: impl Fn(&str, &SessionEntry) -> bool) -> Ended {
        let ended: Vec<(String, SessionEntry)> = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            let ids: Vec<String> = sessions.iter().filter(|(k, s)| ending(k, s)).map(|(k, _)| k.clone()).collect();
            ids.into_iter().filter_map(|k| sessions.remove(&k).map(|s| (k, s))).collect()
        };
        let ids: HashSet<&str> = ended.iter().map(|(k, _)| k.as_str()).collect();
        self.samplers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|id, _| id.split_once(":sample:").is_none_or(|(session, _)| !ids.contains(session)));
        let sessions: Vec<String> = ended.iter().map(|(k, _)| k.clone()).collect();
        let models: Vec<RunId> = ended.into_iter().flat_map(|(_, s)| s.models).collect();
        let mut held = self.models.lock().unwrap_or_else(|e| e.into_inner());
        for m in &models {
            if let Some(entry) = held.remove(m) {
                entry.release();
            }
        }
        Ended { sessions, models }
    }

    /// Ends the sessions idle past [`Waits::idle`] (or past [`Waits::heartbeat`] once they
    /// beat).
    pub fn reap_idle(&self) -> Ended {
        self.end_sessions(|_, s| s.last_seen.elapsed() > if s.beats { self.waits.heartbeat } else { self.waits.idle })
    }

    /// Ends `entity`'s session `id`; `NotFound` when it has no such session.
    pub fn finish(&self, entity: &str, id: &str) -> Result<Ended, TinkerError> {
        let ended = self.end_sessions(|k, s| k == id && s.entity == entity);
        if ended.sessions.is_empty() {
            return Err(TinkerError::NotFound("session not found".into()));
        }
        Ok(ended)
    }

    /// Models `entity` holds.
    pub fn models_of(&self, entity: &str) -> usize {
        self.models.lock().unwrap_or_else(|e| e.into_inner()).values().filter(|m| m.entity == entity).count()
    }

    /// Takes `bytes` under `entity`'s queued budget; `Busy` when they do not fit (a call larger
    /// than the whole budget fits only when the entity has nothing else queued).
    pub fn queue_bytes(&self, entity: &str, bytes: u64) -> Result<QueuedBytes, TinkerError> {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        let held = queued.get(entity).copied().unwrap_or(0);
        if held > 0 && held.saturating_add(bytes) > MAX_QUEUED_BYTES_PER_ENTITY {
            return Err(busy(format!(
                "this entity's accepted Tinker calls already hold {} MiB waiting to run; retry when they have run",
                MAX_QUEUED_BYTES_PER_ENTITY >> 20
            )));
        }
        *queued.entry(entity.to_string()).or_default() += bytes;
        Ok(Taken { tally: self.queued.clone(), entity: entity.to_string(), amount: bytes })
    }

    /// The gate `entity`'s samples pass, in arrival order, to reach the engine: `permits` of them
    /// (its `--per-entity-limit`) at once, the rest waiting without polling, so a burst of
    /// thousands costs one waiting task each and never more than `permits` admission attempts.
    pub fn sample_gate(&self, entity: &str, permits: usize) -> Arc<tokio::sync::Semaphore> {
        let mut gates = self.sample_gates.lock().unwrap_or_else(|e| e.into_inner());
        gates.entry(entity.to_string()).or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(permits.max(1)))).clone()
    }

    /// A place for one more model of `entity`, counted with the models it holds and the places
    /// other creations hold, checked and taken under the models' lock; `Busy` past
    /// [`MAX_MODELS_PER_ENTITY`]. The place is given back when dropped, after the model is
    /// entered (or its creation failed).
    pub fn reserve_model(&self, entity: &str) -> Result<ModelPlace, TinkerError> {
        let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        let held = models.values().filter(|m| m.entity == entity).count() as u64;
        let taken = places.get(entity).copied().unwrap_or(0);
        if held + taken >= MAX_MODELS_PER_ENTITY as u64 {
            return Err(busy(format!(
                "an entity may hold {MAX_MODELS_PER_ENTITY} training models at once; finish a session first"
            )));
        }
        *places.entry(entity.to_string()).or_default() += 1;
        Ok(Taken { tally: self.places.clone(), entity: entity.to_string(), amount: 1 })
    }

    /// Whether `entity` owns session `id` (and marks it seen).
    pub fn touch_session(&self, entity: &str, id: &str) -> bool {
        self.seen(entity, id, false)
    }

    /// [`Self::touch_session`] for a heartbeat: from now on missed beats end the session.
    pub fn heartbeat(&self, entity: &str, id: &str) -> bool {
        self.seen(entity, id, true)
    }

    fn seen(&self, entity: &str, id: &str, beat: bool) -> bool {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        match sessions.get_mut(id) {
            Some(s) if s.entity == entity => {
                s.last_seen = Instant::now();
                s.beats |= beat;
                true
            }
            _ => false,
        }
    }
}

impl<S: Owned> Registry<S> {
    /// Adds a sampling session; `Busy` when its entity holds [`MAX_SAMPLERS_PER_ENTITY`].
    pub fn add_sampler(&self, id: String, sampler: S) -> Result<(), TinkerError> {
        let mut samplers = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        let held = samplers.values().filter(|s| s.entity() == sampler.entity()).count();
        if !samplers.contains_key(&id) && held >= MAX_SAMPLERS_PER_ENTITY {
            return Err(busy(format!(
                "an entity may hold {MAX_SAMPLERS_PER_ENTITY} sampling sessions; finish a session first"
            )));
        }
        samplers.insert(id, Arc::new(sampler));
        Ok(())
    }

    /// `entity`'s sampling session `id`.
    pub fn sampler(&self, entity: &str, id: &str) -> Option<Arc<S>> {
        let samplers = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        samplers.get(id).filter(|s| s.entity() == entity).cloned()
    }
}

#[cfg(test)]
mod tests;
