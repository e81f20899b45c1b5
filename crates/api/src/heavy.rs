//! Reads that decode and encode large JSON (a log's trajectory groups, up to the body limit) run
//! off the async workers: on a blocking thread that drives the store's future itself, one such
//! read per entity at a time (a second is a 429 with `Retry-After`) and two server-wide (more
//! wait their turn). Otherwise a few concurrent reads of one tenant's 60 MiB log kept every
//! async worker busy parsing, and `/health` and other tenants' requests waited behind them.

use crate::error::{ApiError, ErrorKind};
use crate::limiter::{EntityLimiter, Permit};
use std::future::Future;
use std::sync::{Arc, LazyLock};
use tokio::sync::{Semaphore, SemaphorePermit};

/// A bound on one kind of heavy work: one at a time per entity (a second is a 429 saying
/// `busy`, with `Retry-After`), `server_wide` at a time over every entity (more wait).
pub struct Gate {
    server_wide: Semaphore,
    per_entity: LazyLock<Arc<EntityLimiter>>,
    busy: &'static str,
}

impl Gate {
    pub const fn new(server_wide: usize, busy: &'static str) -> Self {
        Gate {
            server_wide: Semaphore::const_new(server_wide),
            per_entity: LazyLock::new(|| Arc::new(EntityLimiter::new(1))),
            busy,
        }
    }

    /// The entity's permit, then a server-wide one; held together until dropped.
    pub async fn enter(&'static self, entity: &str) -> Result<(Permit, SemaphorePermit<'static>), ApiError> {
        let mine = self
            .per_entity
            .acquire(entity)
            .ok_or_else(|| ApiError::new(ErrorKind::TooManyRequests, self.busy).with_retry_after(1))?;
        let all = self
            .server_wide
            .acquire()
            .await
            .map_err(|_| ApiError::new(ErrorKind::Unavailable, "this kind of read is shut down"))?;
        Ok((mine, all))
    }
}

static READS: Gate = Gate::new(2, "a large read of this entity is running; retry when it is done");

/// Runs `work` (store reads and the JSON it builds) on a blocking thread under the entity's
/// permit.
pub async fn run<T, F, Fut>(entity: &str, work: F) -> Result<T, ApiError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, ApiError>>,
    T: Send + 'static,
{
    let held = READS.enter(entity).await?;
    let handle = tokio::runtime::Handle::current();
    // A blocking thread is no async worker, so it may drive the future to its end itself.
    tokio::task::spawn_blocking(move || {
        let _held = held;
        handle.block_on(work())
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, format!("the read failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::run;

    #[tokio::test]
    async fn one_read_per_entity_at_a_time_and_others_go_on() {
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn(run("heavy-a", move || async move {
            held.await.ok();
            Ok::<_, crate::error::ApiError>(1)
        }));
        // Wait until the first read holds its entity's permit.
        while super::READS.per_entity.in_flight("heavy-a") == 0 {
            tokio::task::yield_now().await;
        }
        let second = run("heavy-a", || async { Ok::<_, crate::error::ApiError>(2) }).await;
        assert_eq!(second.unwrap_err().status().as_u16(), 429);
        assert_eq!(run("heavy-b", || async { Ok::<_, crate::error::ApiError>(3) }).await.unwrap(), 3);
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(run("heavy-a", || async { Ok::<_, crate::error::ApiError>(4) }).await.unwrap(), 4);
    }
}
