//! A pool whose every connection a silently dropped network has kept is replaced by a new one.
//!
//! sqlx 0.8 gives a connection back to its pool in a task of its own (ping, or close when the
//! ping fails). On a connection whose peer vanished without a reset, the TLS close waits to read
//! and never ends, so the connection's slot is never given back (sqlx issue 4349) until TCP's
//! retransmissions give up, some fifteen minutes later; after as many such calls as the pool has
//! connections, every call waits out the acquire timeout. No call may hold a connection longer
//! than its deadline (`Deadline`) plus the release ping, so a pool that has been fully checked
//! out for longer than that, with no connection given back meanwhile, holds only dead ones: it is
//! swapped for a fresh pool (the old one's stuck tasks end with TCP).

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
