//! Futures: a call's outcome, set once by the work that answers it and fetched by
//! `retrieve_future` while it lives.

use super::Registry;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_core::tinker::TinkerError;
use tokio::sync::watch;

/// How a failed call is labelled for the SDK: `user` it never retries, `server` it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    User,
    Server,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::User => "user",
            Category::Server => "server",
        }
    }
}

/// A finished request.
#[derive(Debug, Clone)]
pub enum Outcome {
    Json(Value),
    /// A protobuf body (`ForwardBackwardOutput`, `SampleResponse`).
    Proto(Vec<u8>),
    Failed {
        error: String,
        category: Category,
    },
}

impl Outcome {
    /// The caller's mistake (the SDK does not retry it).
    pub fn user(error: impl Into<String>) -> Self {
        Outcome::Failed { error: error.into(), category: Category::User }
    }

    /// The server's failure.
    pub fn server(error: impl Into<String>) -> Self {
        Outcome::Failed { error: error.into(), category: Category::Server }
    }

    /// A failed call's future by its error's kind: the caller's mistakes (a bad input, a missing
    /// checkpoint) are `user`, the rest `server`.
    pub fn failed(e: TinkerError) -> Self {
        match e {
            TinkerError::User(error) | TinkerError::NotFound(error) => Outcome::user(error),
            TinkerError::Unavailable(error) | TinkerError::Busy(error) | TinkerError::Server(error) => {
                Outcome::server(error)
            }
        }
    }
}

pub(super) struct FutureEntry {
    entity: String,
    done: watch::Receiver<Option<Arc<Outcome>>>,
    created: Instant,
    /// When its result was first fetched: from then on it no longer counts against the
    /// entity's cap, and it stays fetchable (a retried poll) for [`FETCHED_TTL`] only.
    fetched: Option<Instant>,
}

/// How long a finished future stays fetchable, and how many one entity may hold.
const FUTURE_TTL: Duration = Duration::from_secs(3600);
/// (Each pending one is a waiting task: 10,000 bound what one entity holds to a few MB.)
pub const MAX_FUTURES_PER_ENTITY: usize = 10_000;
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
            let _ = tx.send(Some(Arc::new(Outcome::server("the request ended without a result"))));
        }
    }
}

impl<S> Registry<S> {
    /// A new pending future of `entity`, for a call of session `session`: its id (which names the
    /// session, so that any node of a cluster finds the node holding it) and the promise that
    /// completes it; `Busy` when the entity holds [`MAX_FUTURES_PER_ENTITY`] unfetched.
    pub fn future(&self, entity: &str, session: &str) -> Result<(String, Promise), TinkerError> {
        let mut futures = self.futures.lock().unwrap_or_else(|e| e.into_inner());
        futures
            .retain(|_, f| f.created.elapsed() < FUTURE_TTL && f.fetched.is_none_or(|at| at.elapsed() < FETCHED_TTL));
        let held = futures.values().filter(|f| f.entity == entity && f.fetched.is_none()).count();
        if held >= MAX_FUTURES_PER_ENTITY {
            return Err(TinkerError::Busy("too many pending results; fetch them first".into()));
        }
        let id = format!("{session}:req:{}", uuid::Uuid::new_v4().simple());
        let (tx, rx) = watch::channel(None);
        let entry = FutureEntry { entity: entity.to_string(), done: rx, created: Instant::now(), fetched: None };
        futures.insert(id.clone(), entry);
        Ok((id, Promise(Some(tx))))
    }

    /// The future's outcome, waiting up to `hold` for it: `NotFound` when `entity` has no such
    /// future (another entity's included), `Ok(None)` when it is still pending.
    pub async fn wait(&self, entity: &str, id: &str, hold: Duration) -> Result<Option<Arc<Outcome>>, TinkerError> {
        let mut rx = {
            let futures = self.futures.lock().unwrap_or_else(|e| e.into_inner());
            match futures.get(id) {
                Some(f) if f.entity == entity => f.done.clone(),
                _ => return Err(TinkerError::NotFound("request not found".into())),
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
}
