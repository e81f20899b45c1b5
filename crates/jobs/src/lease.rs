//! Keeping a claimed job: a task renews the job's lease while it trains, so other trainers know
//! this one is alive, and tells the trainer to stop when the lease is lost (another trainer
//! re-claimed the job after this one could not renew in time). Cancellation is the sink's to
//! notice (`StoreSink::should_stop` polls it every 250 ms, far oftener than renewals).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_store::{Lease, LeaseState, Store};
use tokio::task::JoinHandle;
use uuid::Uuid;

/// Whether the lease was lost, read by the trainer's sink between steps.
#[derive(Debug, Default)]
pub(crate) struct LeaseFlags {
    lost: AtomicBool,
}

impl LeaseFlags {
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }
}

/// How often a lease of `ttl` is renewed: three times per lease, so two renewals in a row can
/// fail (a slow database, a lost packet) before the lease runs out.
pub fn renew_interval(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(50))
}

/// Renews the lease on `job_id` until aborted or lost. A renewal that fails (the database is
/// unreachable) is retried for as long as it fails: the lease is lost only when the store says
/// another trainer holds the job (or it ended). Training on through an outage is safe because
/// every write of the job checks that this trainer still holds it; and it is what keeps the job:
/// the renewal does not require an unexpired lease, and no trainer re-claims an expired one
/// until it has reached the store for a whole lease again ([`ReclaimGate`]), so the holder
/// renews first.
pub(crate) fn spawn_renewals(
    store: Arc<dyn Store>,
    job_id: Uuid,
    lease: Lease,
    flags: Arc<LeaseFlags>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let ttl = Duration::from_millis(lease.ttl_ms.max(0) as u64);
        let mut renewed_at = Instant::now();
        loop {
            tokio::time::sleep(renew_interval(ttl)).await;
            match store.renew_lease(job_id, &lease).await {
                Ok(LeaseState::Held { .. }) => renewed_at = Instant::now(),
                Ok(LeaseState::Lost) => {
                    tracing::warn!(%job_id, "lost the training job's lease: another trainer holds it or it ended");
                    flags.mark_lost();
                    return;
                }
                Err(e) if renewed_at.elapsed() >= ttl => {
                    tracing::warn!(%job_id, error = %e, "the training job's lease ran out while the store is unreachable; \
                        training on, renewing when it returns")
                }
                Err(e) => tracing::warn!(%job_id, error = %e, "could not renew the training job's lease; retrying"),
            }
        }
    })
}

/// When a trainer may re-claim other trainers' expired leases: only once it has reached the store
/// without a failure for a whole lease. After an outage every lease in the cluster has run out
/// at once, yet their holders are alive and renew within a third of a lease of the store's
/// return; re-claiming at once would restart every running job, the re-claiming trainer's own
/// included. A trainer that really died stays expired, and is re-claimed one lease later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimGate {
    /// Since when every call to the store has succeeded (None: the last one failed).
    reachable_since: Option<Instant>,
}

impl ReclaimGate {
    /// A trainer that just connected (its start needed the store) counts as reaching it.
    pub fn new(now: Instant) -> Self {
        ReclaimGate { reachable_since: Some(now) }
    }

    /// Records a call to the store: `reached` false for a failure that says it is unreachable.
    pub fn record(&mut self, reached: bool, now: Instant) {
        match (reached, self.reachable_since) {
            (false, _) => self.reachable_since = None,
            (true, None) => self.reachable_since = Some(now),
            (true, Some(_)) => {}
        }
    }

    /// Whether expired leases may be re-claimed now, leases being `ttl` long.
    pub fn may_reclaim(&self, now: Instant, ttl: Duration) -> bool {
        self.reachable_since.is_some_and(|since| now.saturating_duration_since(since) >= ttl)
    }
}

/// Aborts the renewals when dropped: however the job's run ends, its lease stops being renewed.
pub(crate) struct Renewals(pub(crate) JoinHandle<()>);

impl Renewals {
    /// Stops the renewals and waits until the task is gone, so no renewal lands after what the
    /// caller writes next.
    pub(crate) async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for Renewals {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_come_three_times_a_lease() {
        assert_eq!(renew_interval(Duration::from_secs(30)), Duration::from_secs(10));
        assert_eq!(renew_interval(Duration::from_millis(90)), Duration::from_millis(50));
    }

    #[test]
    fn the_gate_opens_a_whole_lease_after_the_store_returns() {
        let ttl = Duration::from_secs(30);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut gate = ReclaimGate::new(t0);
        // Started against a reachable store: dead trainers' jobs are re-claimed at once...
        assert!(gate.may_reclaim(at(30), ttl));
        gate.record(true, at(31));
        assert!(gate.may_reclaim(at(31), ttl));
        // ...but not after an outage (every lease lapsed in it) until a lease has passed since
        // the store answered again: the holders renew in that time.
        gate.record(false, at(40));
        assert!(!gate.may_reclaim(at(100), ttl));
        gate.record(true, at(100));
        assert!(!gate.may_reclaim(at(100), ttl));
        assert!(!gate.may_reclaim(at(129), ttl));
        gate.record(true, at(120)); // later successes do not move the start
        assert!(gate.may_reclaim(at(130), ttl));
        // One failure in between starts the wait again.
        gate.record(false, at(131));
        gate.record(true, at(132));
        assert!(!gate.may_reclaim(at(161), ttl));
        assert!(gate.may_reclaim(at(162), ttl));
    }
}
