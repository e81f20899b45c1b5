//! LISTEN/NOTIFY between the nodes sharing one database: a queued job wakes the trainers at
//! once, and a recorded checkpoint lets serving nodes fetch its files before the first request
//! for it. `pg_notify` runs inside the writing transaction, so a notice is delivered only if,
//! and after, the write commits. Notices are hints: one missed while a listener reconnects is
//! made up for by the trainers' polling and by fetching on first use.

use crate::{Notice, Result};
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};
use tokio::sync::mpsc;

pub(crate) const JOBS: &str = "tandem_jobs";
pub(crate) const CHECKPOINTS: &str = "tandem_checkpoints";

/// Sends a notice on `channel` when the caller's transaction commits.
pub(crate) async fn notify(conn: &mut PgConnection, channel: &str, payload: &str) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(channel).bind(payload).execute(conn).await?;
    Ok(())
}

/// A listener on both channels, on a connection of its own; ends when the receiver is dropped.
pub(crate) async fn subscribe(pool: &PgPool) -> Result<mpsc::Receiver<Notice>> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen_all([JOBS, CHECKPOINTS]).await?;
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        loop {
            let notice = match listener.try_recv().await {
                Ok(Some(n)) => match n.channel() {
                    JOBS => Notice::JobQueued,
                    CHECKPOINTS => Notice::CheckpointRecorded { path: n.payload().to_string() },
                    _ => continue,
                },
                // The connection dropped; the next `try_recv` reconnects and listens again.
                Ok(None) => {
                    tracing::warn!("notification connection lost; reconnecting");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "notification listener failed; retrying in 1 s");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
            };
            if tx.send(notice).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}
