//! The training worker's heartbeat, which `GET /v1/system-check` reads: the worker beats on
//! every pass of its loop and at every step of a job; the api judges from the last beat whether
//! the queue is being served. Times are Unix milliseconds given by the caller, so the rule is a
//! pure function.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// How long an idle worker may go without a beat (it polls every second).
pub const IDLE_SILENCE_MS: i64 = 30_000;
/// How long a worker running a job may go without a beat (one optimizer step of a long row, or
/// the reference policy's pass over a large job, can take minutes on a CPU).
pub const BUSY_SILENCE_MS: i64 = 15 * 60_000;

/// Shared between the worker (writer) and the api (reader).
#[derive(Debug, Default)]
pub struct Heartbeat {
    last_ms: AtomicI64,
    busy: AtomicBool,
    stopped: AtomicBool,
}

impl Heartbeat {
    pub fn beat(&self, now_ms: i64, busy: bool) {
        self.last_ms.store(now_ms, Ordering::Relaxed);
        self.busy.store(busy, Ordering::Relaxed);
    }

    /// Whether the last beat was made while running a job.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }

    /// The worker loop has ended (shutdown, or it died).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// `Ok(())` while the worker serves the queue, else why not.
    pub fn check(&self, now_ms: i64) -> Result<(), String> {
        if self.stopped.load(Ordering::Relaxed) {
            return Err("the training worker has stopped".into());
        }
        let last = self.last_ms.load(Ordering::Relaxed);
        if last == 0 {
            return Err("the training worker has not started".into());
        }
        let busy = self.busy.load(Ordering::Relaxed);
        let limit = if busy { BUSY_SILENCE_MS } else { IDLE_SILENCE_MS };
        let silent = now_ms.saturating_sub(last);
        if silent > limit {
            let doing = if busy { "running a job" } else { "idle" };
            return Err(format!("the training worker ({doing}) has not reported for {} s", silent / 1000));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_limits_depend_on_work() {
        let h = Heartbeat::default();
        assert!(h.check(1_000).unwrap_err().contains("not started"));
        h.beat(1_000, false);
        assert!(h.check(1_000 + IDLE_SILENCE_MS).is_ok());
        assert!(h.check(1_001 + IDLE_SILENCE_MS).unwrap_err().contains("idle"));
        h.beat(2_000, true);
        assert!(h.check(2_000 + BUSY_SILENCE_MS).is_ok());
        assert!(h.check(2_001 + BUSY_SILENCE_MS).unwrap_err().contains("running a job"));
        h.stop();
        assert!(h.check(2_000).unwrap_err().contains("stopped"));
    }
}
