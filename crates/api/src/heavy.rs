//! Reads that decode and encode large JSON (a log's trajectory groups, up to the body limit) run
//! off the async workers: on a blocking thread that drives the store's future itself, one such
//! read per entity at a time (a few more of the same entity wait their turn in order; beyond
//! them a 429 with `Retry-After`) and two server-wide (more wait their turn). Otherwise a few
//! concurrent reads of one tenant's 60 MiB log kept every async worker busy parsing, and
//! `/health` and other tenants' requests waited behind them. The per-entity queue, not a bare
//! refusal, is what a dashboard needs: it asks for a history while its user's script reads one.

use crate::error::{ApiError, ErrorKind};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};

/// How many reads of one entity a gate holds at once: one running, the rest waiting in order.
const PER_ENTITY_DEPTH: usize = 4;

/// A bound on one kind of heavy work: one at a time per entity (up to `PER_ENTITY_DEPTH - 1`
/// more wait; beyond them a 429 saying `busy`, with `Retry-After`), `server_wide` at a time over
/// every entity (more wait). An entity's waiters hold no server-wide permit, so one entity never
/// holds more than one of them.
pub struct Gate {
    server_wide: Semaphore,
    /// Entity -> (reads admitted: running or waiting, the entity's one-permit turn); `None`
    /// until first used (a `const` constructor cannot build a map).
    entities: Mutex<Option<Queues>>,
    busy: &'static str,
}

type Queues = HashMap<String, (usize, Arc<Semaphore>)>;

/// Held while a read runs: its place in the entity's count, its turn, a server-wide permit.
pub struct Entered {
    _all: SemaphorePermit<'static>,
    _turn: OwnedSemaphorePermit,
    _ticket: Ticket,
}

/// Counts an admitted read until dropped (also when its client leaves while it waits).
struct Ticket {
    gate: &'static Gate,
    entity: String,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut map = self.gate.entities.lock().unwrap_or_else(|e| e.into_inner());
        let Some(map) = map.as_mut() else { return };
        if let Some((n, _)) = map.get_mut(&self.entity) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.entity);
            }
        }
    }
}

impl Gate {
    pub const fn new(server_wide: usize, busy: &'static str) -> Self {
        Gate { server_wide: Semaphore::const_new(server_wide), entities: Mutex::new(None), busy }
    }

    /// Admits the read (or 429 when the entity's queue is full), waits for the entity's turn,
    /// then for a server-wide permit; all are held until the result is dropped.
    pub async fn enter(&'static self, entity: &str) -> Result<Entered, ApiError> {
        let (ticket, turn) = {
            let mut map = self.entities.lock().unwrap_or_else(|e| e.into_inner());
            let (n, turn) = map
                .get_or_insert_with(HashMap::new)
                .entry(entity.to_string())
                .or_insert_with(|| (0, Arc::new(Semaphore::new(1))));
            if *n >= PER_ENTITY_DEPTH {
                return Err(ApiError::new(ErrorKind::TooManyRequests, self.busy).with_retry_after(1));
            }
            *n += 1;
            (Ticket { gate: self, entity: entity.to_string() }, turn.clone())
        };
        let shut = || ApiError::new(ErrorKind::Unavailable, "this kind of read is shut down");
        let turn = turn.acquire_owned().await.map_err(|_| shut())?;
        let all = self.server_wide.acquire().await.map_err(|_| shut())?;
        Ok(Entered { _all: all, _turn: turn, _ticket: ticket })
    }

    #[cfg(test)]
    fn admitted(&self, entity: &str) -> usize {
        let map = self.entities.lock().unwrap_or_else(|e| e.into_inner());
        map.as_ref().and_then(|m| m.get(entity)).map_or(0, |(n, _)| *n)
    }
}

impl Entered {
    /// Runs `work` on a blocking thread that holds these permits until the work ends: a client
    /// that leaves drops only the request's future, and the permits still bound the work that
    /// goes on (held in the request instead, they were freed at once, and a client opening and
    /// closing connections could start any number of such tasks).
    pub async fn blocking<T: Send + 'static>(
        self,
        what: &str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        tokio::task::spawn_blocking(move || {
            let _held = self;
            work()
        })
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("{what} failed: {e}")))
    }
}

static READS: Gate =
    Gate::new(2, "several large reads of this entity are running or waiting; retry when they are done");

/// Runs `work` (store reads and the JSON it builds) on a blocking thread under the entity's
/// permit.
pub async fn run<T, F, Fut>(entity: &str, work: F) -> Result<T, ApiError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, ApiError>>,
    T: Send + 'static,
{
    let handle = tokio::runtime::Handle::current();
    // A blocking thread is no async worker, so it may drive the future to its end itself.
    READS.enter(entity).await?.blocking("the read", move || handle.block_on(work())).await?
}

#[cfg(test)]
mod tests {
    use super::{run, PER_ENTITY_DEPTH, READS};
    use crate::error::ApiError;

    #[tokio::test]
    async fn an_entity_reads_one_at_a_time_in_order_and_others_go_on() {
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let o = order.clone();
        let first = tokio::spawn(run("heavy-a", move || async move {
            held.await.ok();
            o.lock().unwrap().push(1);
            Ok::<_, ApiError>(1)
        }));
        while READS.admitted("heavy-a") == 0 {
            tokio::task::yield_now().await;
        }
        // The entity's next reads wait behind the first, in order, up to the queue's depth.
        let mut waiting = Vec::new();
        for i in 2..=PER_ENTITY_DEPTH {
            let o = order.clone();
            waiting.push(tokio::spawn(run("heavy-a", move || async move {
                o.lock().unwrap().push(i);
                Ok::<_, ApiError>(i)
            })));
            while READS.admitted("heavy-a") < i {
                tokio::task::yield_now().await;
            }
        }
        // One more is refused: the queue is full.
        let refused = run("heavy-a", || async { Ok::<_, ApiError>(0) }).await;
        assert_eq!(refused.unwrap_err().status().as_u16(), 429);
        // Another entity is not behind them.
        assert_eq!(run("heavy-b", || async { Ok::<_, ApiError>(7) }).await.unwrap(), 7);
        assert!(order.lock().unwrap().is_empty());
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        for (i, w) in (2..).zip(waiting) {
            assert_eq!(w.await.unwrap().unwrap(), i);
        }
        assert_eq!(*order.lock().unwrap(), (1..=PER_ENTITY_DEPTH).collect::<Vec<_>>());
        assert_eq!(READS.admitted("heavy-a"), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_gives_its_place_back() {
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn(run("heavy-c", move || async move {
            held.await.ok();
            Ok::<_, ApiError>(1)
        }));
        while READS.admitted("heavy-c") == 0 {
            tokio::task::yield_now().await;
        }
        let waiter = tokio::spawn(run("heavy-c", || async { Ok::<_, ApiError>(2) }));
        while READS.admitted("heavy-c") < 2 {
            tokio::task::yield_now().await;
        }
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(READS.admitted("heavy-c"), 1);
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(READS.admitted("heavy-c"), 0);
    }
}
