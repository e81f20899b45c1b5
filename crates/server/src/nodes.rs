//! `tandem nodes list|drain|undrain`: the cluster's processes as the registry knows them, and
//! draining one (it stops taking jobs and answers `/health` with 503, so that load balancers
//! send it nothing new; it learns of it at its next heartbeat, within five seconds).

use crate::keys::open_store;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use tandem_store::{NodeRecord, StoreError};

#[derive(Debug, Args)]
pub struct NodesArgs {
    /// Data directory of the server (its SQLite database, when no --database-url is given).
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data", global = true)]
    pub data_dir: PathBuf,
    /// The cluster's database (`postgres://...`).
    #[arg(long, env = "TANDEM_DATABASE_URL", global = true)]
    pub database_url: Option<String>,
    #[command(subcommand)]
    pub command: NodesCommand,
}

#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// The nodes that beat in the last hour: name, role, state, last beat.
    List,
    /// Ask a node (by name or id) to take no new work.
    Drain { node: String },
    /// Let a drained node take work again.
    Undrain { node: String },
}

pub async fn run(args: NodesArgs) -> anyhow::Result<()> {
    let store = open_store(&args.data_dir, args.database_url.as_deref()).await?;
    let (nodes, verb) = match &args.command {
        NodesCommand::List => (store.list_nodes().await?, None),
        NodesCommand::Drain { node } | NodesCommand::Undrain { node } => {
            let drain = matches!(args.command, NodesCommand::Drain { .. });
            match store.set_node_draining(node, drain).await {
                Ok(nodes) => (nodes, Some(if drain { "draining" } else { "undrained" })),
                Err(StoreError::NotFound) => anyhow::bail!("no node named {node:?} beat in the last hour"),
                Err(e) => return Err(e.into()),
            }
        }
    };
    if let Some(verb) = verb {
        println!("{verb} {} node(s); each learns it at its next heartbeat (within 5 s)", nodes.len());
    }
    let now = tandem_store::now_ms();
    for n in &nodes {
        println!("{}", line(n, now));
    }
    Ok(())
}

fn line(n: &NodeRecord, now: i64) -> String {
    let state = match (n.alive, n.draining, n.busy) {
        (false, _, _) => "gone",
        (true, true, true) => "draining (finishing a job)",
        (true, true, false) => "drained (idle: safe to stop)",
        (true, false, true) => "training",
        (true, false, false) => "ready",
    };
    let beat = (now - n.heartbeat_at).max(0) as f64 / 1000.0;
    format!("{}\t{}\t{}\tlast beat {:.0}s ago\tversion {}\t{}", n.name, n.role, state, beat, n.version, n.id)
}
