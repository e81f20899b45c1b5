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
/// unreachable) is retried; once the lease could not be renewed for a whole `ttl`, another
/// trainer may have taken the job, so it counts as lost.
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
                    tracing::error!(%job_id, error = %e, "could not renew the training job's lease in time; giving it up");
                    flags.mark_lost();
                    return;
                }
                Err(e) => tracing::warn!(%job_id, error = %e, "could not renew the training job's lease; retrying"),
            }
        }
    })
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
