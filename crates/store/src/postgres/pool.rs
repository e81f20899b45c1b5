//! The requests' pool: how it is built (a bounded ping when a connection comes back), and its
//! replacement when a silently dropped network has kept every connection.
//!
//! sqlx 0.8 gives a connection back to its pool in a task of its own (ping, or close when the
//! ping fails). On a connection whose peer vanished without a reset, the TLS close waits to read
//! and never ends, so the connection's slot is never given back (sqlx issue 4349) until TCP's
//! retransmissions give up, some fifteen minutes later; after as many such calls as the pool has
//! connections, every call waits out the acquire timeout. No call may hold a connection longer
//! than its deadline (`Deadline`) plus the release ping, so a pool that has been fully checked
//! out for longer than that, with no connection given back meanwhile, holds only dead ones: it is
//! swapped for a fresh pool (the old one's stuck tasks end with TCP).

use crate::errors::POSTGRES_ACQUIRE_TIMEOUT;
use crate::PoolSettings;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};
use std::time::Duration;

/// How long a connection given back to the pool has to answer a ping before it is closed.
pub(super) const RELEASE_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool of at most `size` connections as `settings` say; `released` is set to the time each
/// time a connection comes back alive.
pub(super) fn options(
    size: u32,
    settings: PoolSettings,
    released: std::sync::Arc<std::sync::atomic::AtomicI64>,
) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(size.max(1))
        .acquire_timeout(settings.acquire_timeout.unwrap_or(POSTGRES_ACQUIRE_TIMEOUT))
        // A connection comes back to the pool after each call, also one the call's deadline
        // cut off mid-statement. sqlx then pings it without a limit, which on a network that
        // drops packets silently waits for TCP's retransmissions (about fifteen minutes),
        // holding a slot of the pool all along. A ping of our own first, bounded: no answer
        // and the connection is closed at once. A connection whose statements were answered
        // answers it in one round trip.
        .after_release(move |conn, _| {
            let released = released.clone();
            Box::pin(async move {
                match tokio::time::timeout(RELEASE_PING_TIMEOUT, conn.ping()).await {
                    Ok(answered) => {
                        answered?;
                        released.store(crate::now_ms(), std::sync::atomic::Ordering::Relaxed);
                        Ok(true)
                    }
                    Err(_) => Err(sqlx::Error::PoolTimedOut),
                }
            })
        })
}

/// What replaces a stuck pool (`watch`): the store's pool, for as long as the store lives.
pub(super) struct Swap {
    pub(super) pool: std::sync::Weak<std::sync::RwLock<PgPool>>,
    pub(super) options: PgConnectOptions,
    pub(super) settings: PoolSettings,
    pub(super) size: u32,
    /// When a connection last came back alive (Unix ms), set by the pools' release hook.
    pub(super) released: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl Swap {
    pub(super) async fn watch(self, limit: Duration) {
        let mut ledger = PoolWatch::default();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let Some(shared) = self.pool.upgrade() else { return };
            let pool = shared.read().unwrap_or_else(|e| e.into_inner()).clone();
            let full = pool.size() >= self.size && pool.num_idle() == 0;
            let last = self.released.load(std::sync::atomic::Ordering::Relaxed);
            if ledger.stuck(crate::now_ms(), full, last, limit.as_millis() as i64) {
                tracing::warn!(
                    connections = self.size,
                    seconds = limit.as_secs(),
                    "every database connection has been held this long without one coming back (a network that \
                     dropped them silently); opening a new pool"
                );
                let fresh =
                    options(self.size, self.settings, self.released.clone()).connect_lazy_with(self.options.clone());
                *shared.write().unwrap_or_else(|e| e.into_inner()) = fresh;
            }
        }
    }
}

/// What the watch has seen of one pool (a pure ledger: times in milliseconds, passed in).
#[derive(Debug, Default)]
pub(crate) struct PoolWatch {
    /// Since when every connection has been checked out without one coming back.
    full_since: Option<i64>,
}

impl PoolWatch {
    /// One look at the pool at `now`: `full` when every connection is checked out, `last_release`
    /// when one last came back alive. True when it has been stuck for `limit`: replace it (the
    /// ledger starts over).
    pub(crate) fn stuck(&mut self, now: i64, full: bool, last_release: i64, limit: i64) -> bool {
        if !full {
            self.full_since = None;
            return false;
        }
        let since = *self.full_since.get_or_insert(now);
        let stuck = now - since >= limit && now - last_release >= limit;
        if stuck {
            self.full_since = None;
        }
        stuck
    }
}

#[cfg(test)]
mod tests {
    use super::PoolWatch;

    #[test]
    fn only_a_pool_full_and_silent_for_the_whole_limit_is_stuck() {
        let mut w = PoolWatch::default();
        assert!(!w.stuck(0, true, 0, 10));
        assert!(!w.stuck(9, true, 0, 10), "full for 9 of 10");
        assert!(w.stuck(10, true, 0, 10), "full and silent for 10");
        assert!(!w.stuck(11, true, 0, 10), "the ledger starts over after a replacement");
        // Busy but moving: connections keep coming back.
        let mut w = PoolWatch::default();
        for t in 0..100 {
            assert!(!w.stuck(t, true, t - 1, 10));
        }
        // A moment with an idle connection resets the count.
        let mut w = PoolWatch::default();
        assert!(!w.stuck(0, true, -100, 10));
        assert!(!w.stuck(5, false, -100, 10));
        assert!(!w.stuck(14, true, -100, 10), "full again only since 14");
        assert!(w.stuck(24, true, -100, 10));
    }
}
