//! `tandem keys create|list|revoke`: manage API keys in a data directory, also while a server
//! uses it (SQLite in WAL mode allows one writer process at a time and waits for the lock).

use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use tandem_store::{SqliteStore, Store, StoreError};

#[derive(Debug, Args)]
pub struct KeysArgs {
    /// Data directory of the server.
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data", global = true)]
    pub data_dir: PathBuf,
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key for an entity and print it (the last line of output is the key alone).
    Create {
        #[arg(long, default_value = "local")]
        entity: String,
    },
    /// List keys (prefix, entity, dates); keys themselves are never stored.
    List,
    /// Revoke a key by its id or prefix.
    Revoke { id_or_prefix: String },
}

pub async fn open_store(data_dir: &Path) -> anyhow::Result<SqliteStore> {
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let db = data_dir.join("tandem.db");
    SqliteStore::open(&db).await.with_context(|| format!("opening {}", db.display()))
}

pub async fn run(args: KeysArgs) -> anyhow::Result<()> {
    let store = open_store(&args.data_dir).await?;
    match args.command {
        KeysCommand::Create { entity } => {
            if let Some(why) = tandem_core::names::name_problem(&entity) {
                anyhow::bail!("entity {why}");
            }
            let (key, record) = tandem_api::auth::generate_key(&entity);
            store.insert_key(&record).await?;
            eprintln!("created key {} for entity {entity}; it is shown only now:", record.prefix);
            println!("{key}");
        }
        KeysCommand::List => {
            println!("{:<38} {:<14} {:<20} {:<14} revoked_at", "id", "prefix", "entity", "created_at");
            for k in store.list_keys().await? {
                let revoked = k.revoked_at.map_or("-".to_string(), |t| t.to_string());
                println!("{:<38} {:<14} {:<20} {:<14} {revoked}", k.id.to_string(), k.prefix, k.entity, k.created_at);
            }
        }
        KeysCommand::Revoke { id_or_prefix } => match store.revoke_key(&id_or_prefix).await {
            Ok(k) => println!("revoked key {} of entity {}", k.prefix, k.entity),
            Err(StoreError::NotFound) => anyhow::bail!("no key has id or prefix {id_or_prefix}"),
            Err(e) => return Err(e.into()),
        },
    }
    Ok(())
}
