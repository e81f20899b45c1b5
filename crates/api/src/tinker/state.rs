//! What the Tinker routes keep between calls: sessions, training models with their `seq_id`
//! order, and futures (a request's outcome, fetched by `retrieve_future`). All in memory: a
//! restart ends every session, as the SDK's server does for a lost session.

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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
}

/// A request's outcome once set; dropping it unset fails the future (its task ended early).
pub struct Promise(Option<watch::Sender<Option<Arc<Outcome>>>>);

impl Promise {
    pub fn set(mut self, outcome: Outcome) {
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
}

/// A training model: whose it is, what it trains, and where its calls are in `seq_id` order.
pub struct ModelEntry {
    pub entity: String,
    pub session_id: String,
    pub base_model: String,
    pub rank: usize,
    /// The request that created it (a retried `create_model` gets the same one).
    pub create_request: String,
    /// The next `seq_id` to run (training calls start at 1: the creation is 0).
    pub next: watch::Sender<u64>,
    /// `seq_id` -> request id of every call accepted, for retries of the same call.
    pub seen: Mutex<HashMap<i64, String>>,
    /// Notified when a call is accepted: a call waiting at a gap checks whether it is filled.
    pub arrived: tokio::sync::Notify,
    /// Every `seq_id` up to this one has been received (advanced under `seen`'s lock).
    pub through: std::sync::atomic::AtomicU64,
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
impl ModelEntry {
    /// Records call `seq_id` as received (its request id kept for retries); `seen` is its lock.
    pub fn receive(&self, seen: &mut HashMap<i64, String>, seq_id: i64, request_id: String) {
        use std::sync::atomic::Ordering::Relaxed;
        seen.insert(seq_id, request_id);
        let mut through = self.through.load(Relaxed);
        while seen.contains_key(&(through as i64 + 1)) {
            through += 1;
        }
        self.through.store(through, Relaxed);
    }

    /// The first `seq_id` in `next..seq` not received: a gap, which a call waits to be filled
    /// for [`Waits::seq_gap`] at most. Calls whose predecessors have all arrived only wait their
    /// turn behind running work, which has no time limit.
    pub fn gap(&self, next: u64, seq: u64) -> Option<u64> {
        let first_missing = self.through.load(std::sync::atomic::Ordering::Relaxed) + 1;
        (first_missing < seq).then_some(first_missing.max(next))
    }

    /// Waits until every call before `seq` has run. Only a gap (a `seq_id` before it not received)
    /// is timed: after `limit` of one, `Err` with the missing `seq_id`; calls that arrived
    /// and wait behind running work wait as long as it takes.
    pub async fn wait_turn(&self, seq: u64, limit: Duration) -> Result<(), u64> {
        let mut next = self.next.subscribe();
        let mut gap_since: Option<Instant> = None;
        loop {
            // Registered before the checks, so that an arrival between them is not missed.
            let arrived = self.arrived.notified();
            let at = *next.borrow_and_update();
            if at >= seq {
                return Ok(());
            }
            if let Some(missing) = self.gap(at, seq) {
                let since = *gap_since.get_or_insert_with(Instant::now);
                let left = limit.saturating_sub(since.elapsed());
                if left.is_zero() {
                    return Err(missing);
                }
                tokio::select! {
                    _ = next.changed() => {}
                    _ = arrived => {}
                    _ = tokio::time::sleep(left) => {}
                }
            } else {
                gap_since = None;
                if next.changed().await.is_err() {
                    return Err(at);
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
    /// order before it fails alone.
    pub seq_gap: Duration,
}

impl Default for Waits {
    fn default() -> Self {
        Waits { idle: Duration::from_secs(600), seq_gap: Duration::from_secs(600) }
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
        futures.retain(|_, f| f.created.elapsed() < FUTURE_TTL);
        if futures.values().filter(|f| f.entity == entity).count() >= MAX_FUTURES_PER_ENTITY {
            return None;
        }
        let id = format!("req-{}", uuid::Uuid::new_v4().simple());
        let (tx, rx) = watch::channel(None);
        futures.insert(id.clone(), FutureEntry { entity: entity.to_string(), done: rx, created: Instant::now() });
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
        Ok(ready.flatten().or_else(|| rx.borrow().clone()))
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
            held.remove(m);
        }
        (count, models)
    }

    /// Ends the sessions idle past [`Waits::idle`]: the ids of the models to release.
    pub fn reap_idle(&self) -> Vec<String> {
        self.end_sessions(|_, s| s.last_seen.elapsed() > self.waits.idle).1
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

    /// `entity`'s sampling session `id`.
    pub fn sampler(&self, entity: &str, id: &str) -> Option<Arc<super::sample::Sampler>> {
        let samplers = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        samplers.get(id).filter(|s| s.entity == entity).cloned()
    }

    /// Whether `entity` owns session `id` (and marks it seen).
    pub fn touch_session(&self, entity: &str, id: &str) -> bool {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        match sessions.get_mut(id) {
            Some(s) if s.entity == entity => {
                s.last_seen = Instant::now();
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Arc<ModelEntry> {
        Arc::new(ModelEntry {
            entity: "a".into(),
            session_id: "s".into(),
            base_model: "m".into(),
            rank: 8,
            create_request: "r".into(),
            next: watch::channel(1).0,
            seen: Mutex::default(),
            arrived: Default::default(),
            through: Default::default(),
            record_id: uuid::Uuid::nil(),
            samplers: Mutex::default(),
            pending: Mutex::default(),
            inflight: Arc::default(),
        })
    }

    fn receive(m: &ModelEntry, seq: i64) {
        m.receive(&mut m.seen.lock().unwrap(), seq, format!("req-{seq}"));
        m.arrived.notify_waiters();
    }

    #[test]
    fn the_first_seq_id_not_received_is_the_gap() {
        let m = entry();
        for s in [1, 2, 4] {
            receive(&m, s);
        }
        assert_eq!(m.gap(1, 3), None, "1 and 2 arrived");
        assert_eq!(m.gap(1, 5), Some(3));
        receive(&m, 3);
        assert_eq!(m.gap(1, 5), None, "3 filled it; 4 had come");
        assert_eq!(m.gap(2, 9), Some(5));
    }

    /// Only a gap is timed: a call whose predecessors all arrived waits for them as long as they
    /// run; one past a gap fails after the limit, naming the missing seq_id, unless it fills.
    #[tokio::test]
    async fn calls_wait_their_turn_and_only_gaps_time_out() {
        let limit = Duration::from_millis(100);
        let m = entry();
        for s in [1, 2, 3] {
            receive(&m, s);
        }
        let behind = tokio::spawn({
            let m = m.clone();
            async move { m.wait_turn(3, limit).await }
        });
        tokio::time::sleep(limit * 3).await;
        assert!(!behind.is_finished(), "it waits for 1 and 2 to run, untimed");
        m.next.send_replace(3);
        assert_eq!(behind.await.unwrap(), Ok(()));

        receive(&m, 9);
        let started = Instant::now();
        assert_eq!(m.wait_turn(9, limit).await, Err(4), "4 never came");
        assert!(started.elapsed() >= limit);

        let filled = tokio::spawn({
            let m = m.clone();
            async move { m.wait_turn(6, Duration::from_secs(30)).await }
        });
        receive(&m, 6);
        tokio::time::sleep(Duration::from_millis(20)).await;
        for s in [4, 5] {
            receive(&m, s);
        }
        m.next.send_replace(6);
        assert_eq!(filled.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn futures_are_per_entity_and_complete_once() {
        let state = TinkerState::default();
        let (id, promise) = state.future("a").unwrap();
        assert!(state.wait("b", &id, Duration::ZERO).await.is_err(), "another entity's future is unknown");
        assert!(state.wait("a", &id, Duration::from_millis(10)).await.unwrap().is_none(), "pending");
        promise.set(Outcome::Json(serde_json::json!({"ok": 1})));
        let got = state.wait("a", &id, Duration::from_secs(1)).await.unwrap().unwrap();
        assert!(matches!(&*got, Outcome::Json(v) if v["ok"] == 1));
        // A promise dropped unset fails its future rather than leaving it pending forever.
        let (id, promise) = state.future("a").unwrap();
        drop(promise);
        let got = state.wait("a", &id, Duration::from_secs(1)).await.unwrap().unwrap();
        assert!(matches!(&*got, Outcome::Failed { category: "server", .. }));
    }
}
