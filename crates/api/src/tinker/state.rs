//! What the Tinker routes keep between calls: sessions, training models with their `seq_id`
//! order, and futures (a request's outcome, fetched by `retrieve_future`). All in memory: a
//! restart ends every session, as the SDK's server does for a lost session.

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tandem_core::seq_order::{SeqOrder, Turn};
use tokio::sync::watch;

/// A finished request.
#[derive(Debug, Clone)]
pub enum Outcome {
    Json(Value),
    /// A protobuf body (`ForwardBackwardOutput`, `SampleResponse`).
    Proto(Vec<u8>),
    /// `category`: `user` (the SDK never retries it) or `server`.
    Failed {
        error: String,
        category: &'static str,
    },
}

struct FutureEntry {
    entity: String,
    done: watch::Receiver<Option<Arc<Outcome>>>,
    created: Instant,
    /// When its result was first fetched: from then on it no longer counts against the
    /// entity's cap, and it stays fetchable (a retried poll) for [`FETCHED_TTL`] only.
    fetched: Option<Instant>,
}

/// How long a fetched result stays fetchable again (the SDK re-polls only after a lost answer).
const FETCHED_TTL: Duration = Duration::from_secs(60);

/// The longest error a result keeps: failures quote their input (a name, a key), and a result
/// lives an hour, so what a client sent is kept only as a bounded excerpt.
pub const MAX_ERROR_BYTES: usize = 1024;

/// `error` cut to [`MAX_ERROR_BYTES`] at a character boundary, saying so.
pub fn excerpt(mut error: String) -> String {
    if error.len() > MAX_ERROR_BYTES {
        let mut cut = MAX_ERROR_BYTES;
        while !error.is_char_boundary(cut) {
            cut -= 1;
        }
        error.truncate(cut);
        error.push_str("... (cut)");
    }
    error
}

/// A request's outcome once set; dropping it unset fails the future (its task ended early).
pub struct Promise(Option<watch::Sender<Option<Arc<Outcome>>>>);

impl Promise {
    pub fn set(mut self, outcome: Outcome) {
        let outcome = match outcome {
            Outcome::Failed { error, category } => Outcome::Failed { error: excerpt(error), category },
            done => done,
        };
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Some(Arc::new(outcome)));
        }
    }
}

impl Drop for Promise {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let failed = Outcome::Failed { error: "the request ended without a result".into(), category: "server" };
            let _ = tx.send(Some(Arc::new(failed)));
        }
    }
}

/// A session: its entity and the models it created (released when it finishes).
pub struct SessionEntry {
    pub entity: String,
    pub models: Vec<String>,
    pub last_seen: Instant,
    /// Whether its client has sent a heartbeat (then missed beats end it: [`Waits::heartbeat`]).
    pub beats: bool,
}

/// A training model: whose it is, what it trains, and where its calls are in `seq_id` order.
pub struct ModelEntry {
    pub entity: String,
    pub session_id: String,
    pub base_model: String,
    pub rank: usize,
    /// The request that created it (a retried `create_model` gets the same one).
    pub create_request: String,
    /// Its calls' `seq_id` order (training calls start at 1: the creation is 0).
    pub order: Mutex<SeqOrder>,
    /// Bumped at every change of `order`: waiting calls look at their turn again.
    pub moved: watch::Sender<u64>,
    /// Set when its session ends: calls still waiting fail at once and drop their data.
    pub released: std::sync::atomic::AtomicBool,
    /// The tandem model record its sampler weights are checkpoints of (project `tinker`).
    pub record_id: uuid::Uuid,
    /// Sampler weights saved this session, by name (the ephemeral kind too): the checkpoint
    /// each is.
    pub samplers: Mutex<HashMap<String, tandem_core::tinker::SavedSampler>>,
    /// What `forward_backward` calls added since the last `optim_step` (loss summed, tokens):
    /// the step's point on the dashboard's curves.
    pub pending: Mutex<Pending>,
    /// The target its inflight samplers follow: the model address of the newest weights saved
    /// with `kind: "inflight"` (empty until the first).
    pub inflight: Arc<std::sync::RwLock<String>>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Pending {
    pub loss: f64,
    pub tokens: u64,
}

/// How long a finished future stays fetchable, and how many one entity may hold.
const FUTURE_TTL: Duration = Duration::from_secs(3600);
/// (Each pending one is a waiting task: 10,000 bound what one entity holds to a few MB.)
pub const MAX_FUTURES_PER_ENTITY: usize = 10_000;
pub const MAX_SESSIONS_PER_ENTITY: usize = 64;
/// Sampling sessions one entity may hold (they end with their session).
pub const MAX_SAMPLERS_PER_ENTITY: usize = 1024;
/// How a call's wait for its turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Every earlier call has its answer: run it.
    Run,
    /// It waited its time at a gap: `seq_id` `.0` (the first missing) never came. It is
    /// answered (failed) already in the order; its promise is the caller's to fail.
    GaveUp(u64),
    /// It was answered while it waited (it cannot be, but it must not run twice).
    Answered,
    /// Its model was released (its session ended) while it waited.
    Released,
}

impl ModelEntry {
    /// The order, locked (a poisoned lock still holds a consistent ledger: every change is one
    /// call).
    pub fn order(&self) -> std::sync::MutexGuard<'_, SeqOrder> {
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the calls waiting for their turn.
    pub fn bump(&self) {
        self.moved.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Call `seq` has its answer: the order moves on.
    pub fn finish(&self, seq: u64) {
        self.order().finish(seq);
        self.bump();
    }

    /// Waits until every call before `seq` has its answer. Only a gap (a `seq_id` before it not
    /// received) is timed: after `limit` of one the missing calls are given up and this one
    /// fails; calls behind received work wait as long as that work runs (bounded by its size).
    pub async fn wait_turn(&self, seq: u64, limit: Duration) -> Waited {
        let mut moved = self.moved.subscribe();
        let mut gap_since: Option<Instant> = None;
        loop {
            // Marked seen before the look, so that a change after it is not missed.
            moved.borrow_and_update();
            if self.released.load(std::sync::atomic::Ordering::Acquire) {
                return Waited::Released;
            }
            let turn = self.order().turn(seq);
            match turn {
                Turn::Now => return Waited::Run,
                Turn::Answered => return Waited::Answered,
                Turn::Behind => {
                    gap_since = None;
                    // The sender lives in `self`: this only ends with a change.
                    let _ = moved.changed().await;
                }
                Turn::Gap(_) => {
                    let since = *gap_since.get_or_insert_with(Instant::now);
                    let left = limit.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        let given = self.order().give_up(seq);
                        if let Some(first) = given {
                            self.bump();
                            return Waited::GaveUp(first);
                        }
                        continue;
                    }
                    tokio::select! {
                        _ = moved.changed() => {}
                        _ = tokio::time::sleep(left) => {}
                    }
                }
            }
        }
    }
}

/// Training models one entity may hold at once (the server holds `--max-tinker-models` in all),
/// so no entity takes every place.
pub const MAX_MODELS_PER_ENTITY: usize = 4;
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

#[derive(Default)]
pub struct TinkerState {
    pub waits: Waits,
    futures: Mutex<HashMap<String, FutureEntry>>,
    pub sessions: Mutex<HashMap<String, SessionEntry>>,
    pub models: Mutex<HashMap<String, Arc<ModelEntry>>>,
    pub samplers: Mutex<HashMap<String, Arc<super::sample::Sampler>>>,
    /// Signs the download URLs of external weights.
    pub url_key: super::external::UrlKey,
    /// Serialises the changes to one run's checkpoints (saves, deletes, TTLs, the sweep).
    pub runs: RunLocks,
    /// Places taken by model creations under way, per entity ([`TinkerState::reserve_model`]).
    places: Mutex<HashMap<String, u64>>,
    /// Bytes of the calls each entity has accepted and not yet run ([`TinkerState::queue_bytes`]).
    queued: Mutex<HashMap<String, u64>>,
    /// Each entity's samples in flight on the engine ([`TinkerState::sample_gate`]).
    sample_gates: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

/// Bytes of accepted, not yet finished calls (their decoded datums, sampling prompts) one
/// entity may hold: beyond it a call is answered 429, which the SDK retries (issue 50: 12 queued
/// calls had held 729 MB).
pub const MAX_QUEUED_BYTES_PER_ENTITY: u64 = 256 << 20;

/// What a [`Taken`] counts: model creations' places or queued bytes.
#[derive(Clone, Copy)]
enum Tally {
    Places,
    Queued,
}

/// An amount taken under one of an entity's tallies (a model creation's place under its cap, a
/// call's bytes under [`MAX_QUEUED_BYTES_PER_ENTITY`]), given back when dropped (the model is
/// entered or failed; the call has run, failed, or its model was released).
pub struct Taken {
    state: Arc<TinkerState>,
    tally: Tally,
    entity: String,
    amount: u64,
}

pub type QueuedBytes = Taken;
pub type ModelPlace = Taken;

impl Drop for Taken {
    fn drop(&mut self) {
        let mut counts = self.state.tally(self.tally).lock().unwrap_or_else(|e| e.into_inner());
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

impl TinkerState {
    pub fn new(waits: Waits) -> Self {
        TinkerState { waits, ..Default::default() }
    }

    /// A new pending future of `entity`: its id and the promise that completes it. `None` when
    /// the entity holds too many.
    pub fn future(&self, entity: &str) -> Option<(String, Promise)> {
        let mut futures = self.futures.lock().unwrap_or_else(|e| e.into_inner());
        futures
            .retain(|_, f| f.created.elapsed() < FUTURE_TTL && f.fetched.is_none_or(|at| at.elapsed() < FETCHED_TTL));
        let held = futures.values().filter(|f| f.entity == entity && f.fetched.is_none()).count();
        if held >= MAX_FUTURES_PER_ENTITY {
            return None;
        }
        let id = format!("req-{}", uuid::Uuid::new_v4().simple());
        let (tx, rx) = watch::channel(None);
        let entry = FutureEntry { entity: entity.to_string(), done: rx, created: Instant::now(), fetched: None };
        futures.insert(id.clone(), entry);
        Some((id, Promise(Some(tx))))
    }

    /// The future's outcome, waiting up to `hold` for it: `Err(())` when `entity` has no such
    /// future, `Ok(None)` when it is still pending.
    pub async fn wait(&self, entity: &str, id: &str, hold: Duration) -> Result<Option<Arc<Outcome>>, ()> {
        let mut rx = {
            let futures = self.futures.lock().unwrap_or_else(|e| e.into_inner());
            match futures.get(id) {
                Some(f) if f.entity == entity => f.done.clone(),
                _ => return Err(()),
            }
        };
        let ready =
            tokio::time::timeout(hold, rx.wait_for(|o| o.is_some())).await.ok().and_then(|r| r.ok().map(|o| o.clone()));
        let outcome = ready.flatten().or_else(|| rx.borrow().clone());
        if outcome.is_some() {
            // Fetched: it leaves the cap (a client that fetches everything is never refused).
            let mut futures = self.futures.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(f) = futures.get_mut(id) {
                f.fetched.get_or_insert_with(Instant::now);
            }
        }
        Ok(outcome)
    }

    /// `entity`'s model `id`, or `None` (absent, or another entity's: the same answer).
    pub fn model(&self, entity: &str, id: &str) -> Option<Arc<ModelEntry>> {
        // (See ModelEntry::gap for how calls wait for each other.)
        let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        models.get(id).filter(|m| m.entity == entity).cloned()
    }

    /// Ends the sessions `ending` picks, with their samplers and their models' entries: how many
    /// ended, and the ids of the models to release.
    fn end_sessions(&self, ending: impl Fn(&str, &SessionEntry) -> bool) -> (usize, Vec<String>) {
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
        let count = ended.len();
        let models: Vec<String> = ended.into_iter().flat_map(|(_, s)| s.models).collect();
        let mut held = self.models.lock().unwrap_or_else(|e| e.into_inner());
        for m in &models {
            if let Some(entry) = held.remove(m) {
                entry.released.store(true, std::sync::atomic::Ordering::Release);
                entry.bump();
            }
        }
        (count, models)
    }

    /// Ends the sessions idle past [`Waits::idle`]: the ids of the models to release.
    pub fn reap_idle(&self) -> Vec<String> {
        self.end_sessions(|_, s| s.last_seen.elapsed() > if s.beats { self.waits.heartbeat } else { self.waits.idle }).1
    }

    /// Ends `entity`'s session `id`: the ids of the models to release, `None` when it has no
    /// such session.
    pub fn finish(&self, entity: &str, id: &str) -> Option<Vec<String>> {
        let (count, models) = self.end_sessions(|k, s| k == id && s.entity == entity);
        (count > 0).then_some(models)
    }

    /// Adds a sampling session; `false` when its entity holds [`MAX_SAMPLERS_PER_ENTITY`].
    pub fn add_sampler(&self, id: String, sampler: super::sample::Sampler) -> bool {
        let mut samplers = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        let held = samplers.values().filter(|s| s.entity == sampler.entity).count();
        if !samplers.contains_key(&id) && held >= MAX_SAMPLERS_PER_ENTITY {
            return false;
        }
        samplers.insert(id, Arc::new(sampler));
        true
    }

    /// Models `entity` holds.
    pub fn models_of(&self, entity: &str) -> usize {
        self.models.lock().unwrap_or_else(|e| e.into_inner()).values().filter(|m| m.entity == entity).count()
    }

    fn tally(&self, tally: Tally) -> &Mutex<HashMap<String, u64>> {
        match tally {
            Tally::Places => &self.places,
            Tally::Queued => &self.queued,
        }
    }

    /// Takes `bytes` under `entity`'s queued budget; `None` when they do not fit (a call larger
    /// than the whole budget fits only when the entity has nothing else queued).
    pub fn queue_bytes(self: &Arc<Self>, entity: &str, bytes: u64) -> Option<QueuedBytes> {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        let held = queued.get(entity).copied().unwrap_or(0);
        if held > 0 && held.saturating_add(bytes) > MAX_QUEUED_BYTES_PER_ENTITY {
            return None;
        }
        *queued.entry(entity.to_string()).or_default() += bytes;
        Some(Taken { state: self.clone(), tally: Tally::Queued, entity: entity.to_string(), amount: bytes })
    }

    /// The gate `entity`'s samples pass, in arrival order, to reach the engine: `permits` of them
    /// (its `--per-entity-limit`) at once, the rest waiting without polling, so a burst of
    /// thousands costs one waiting task each and never more than `permits` admission attempts.
    pub fn sample_gate(&self, entity: &str, permits: usize) -> Arc<tokio::sync::Semaphore> {
        let mut gates = self.sample_gates.lock().unwrap_or_else(|e| e.into_inner());
        gates.entry(entity.to_string()).or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(permits.max(1)))).clone()
    }

    /// A place for one more model of `entity`, counted with the models it holds and the places
    /// other creations hold, checked and taken under the models' lock; `None` past
    /// [`MAX_MODELS_PER_ENTITY`]. The place is given back when dropped, after the model is
    /// entered (or its creation failed).
    pub fn reserve_model(self: &Arc<Self>, entity: &str) -> Option<ModelPlace> {
        let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        let held = models.values().filter(|m| m.entity == entity).count() as u64;
        let taken = places.get(entity).copied().unwrap_or(0);
        if held + taken >= MAX_MODELS_PER_ENTITY as u64 {
            return None;
        }
        *places.entry(entity.to_string()).or_default() += 1;
        Some(Taken { state: self.clone(), tally: Tally::Places, entity: entity.to_string(), amount: 1 })
    }

    /// `entity`'s sampling session `id`.
    pub fn sampler(&self, entity: &str, id: &str) -> Option<Arc<super::sample::Sampler>> {
        let samplers = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        samplers.get(id).filter(|s| s.entity == entity).cloned()
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

#[cfg(test)]
mod tests;
