//! `tandem quota list|set`: what each entity's stored data takes, and the quota an operator gives
//! one entity beside the nodes' `--storage-quota-mib` (kept in the database, so every node of a
//! cluster holds the entity to it at its next write).

use clap::{Args, Subcommand};
use std::path::PathBuf;
use tandem_store::EntityQuota;

#[derive(Debug, Args)]
pub struct QuotaArgs {
    /// Data directory of the server.
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data", global = true)]
    pub data_dir: PathBuf,
    /// The server's database when it is not `<data-dir>/tandem.db` (`postgres://...`).
    #[arg(long, env = "TANDEM_DATABASE_URL", global = true)]
    pub database_url: Option<String>,
    /// The servers' `--storage-quota-mib`, to show each entity's limit (read from the same
    /// variable the servers read).
    #[arg(long, env = "TANDEM_STORAGE_QUOTA_MIB", global = true)]
    pub storage_quota_mib: Option<u64>,
    #[command(subcommand)]
    pub command: QuotaCommand,
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Every entity that stores something or has a quota of its own: MiB used and its limit.
    List,
    /// Give an entity its own quota (exactly one of the three).
    Set {
        entity: String,
        /// This many MiB.
        #[arg(long, conflicts_with_all = ["unlimited", "default"], required_unless_present_any = ["unlimited", "default"])]
        mib: Option<u64>,
        /// No quota, whatever the servers' default.
        #[arg(long, conflicts_with = "default")]
        unlimited: bool,
        /// Back to the servers' `--storage-quota-mib`.
        #[arg(long)]
        default: bool,
    },
}

fn mib(bytes: i64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

pub async fn run(args: QuotaArgs) -> anyhow::Result<()> {
    let default = crate::config::storage_quota(args.storage_quota_mib)?;
    let store = crate::keys::open_store(&args.data_dir, args.database_url.as_deref()).await?;
    match args.command {
        QuotaCommand::List => {
            println!("{:<32} {:>12} {:>12} source", "entity", "used_mib", "quota_mib");
            for u in store.list_storage().await? {
                let limit = u.quota.limit(default).map_or("none".to_string(), mib);
                let source = match u.quota {
                    EntityQuota::Default => "default",
                    _ => "own",
                };
                println!("{:<32} {:>12} {:>12} {source}", u.entity, mib(u.used_bytes), limit);
            }
        }
        QuotaCommand::Set { entity, mib: size, unlimited, default: back } => {
            if let Some(why) = tandem_core::names::name_problem(&entity) {
                anyhow::bail!("entity {why}");
            }
            let quota = match (size, unlimited, back) {
                (Some(m), false, false) => EntityQuota::Bytes(crate::config::storage_quota(Some(m))?.unwrap_or(0)),
                (None, true, false) => EntityQuota::Unlimited,
                _ => EntityQuota::Default,
            };
            store.set_storage_quota(&entity, quota).await?;
            let usage = store.storage_usage(&entity).await?;
            let limit = usage.quota.limit(default).map_or("no quota".to_string(), |b| format!("{} MiB", mib(b)));
            println!("entity {entity}: {} MiB stored, limit {limit}", mib(usage.used_bytes));
        }
    }
    Ok(())
}
