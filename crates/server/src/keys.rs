//! `tandem keys create|list|revoke`: manage API keys in a data directory, also while a server
//! uses it (SQLite in WAL mode allows one writer process at a time and waits for the lock).

use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tandem_store::{PoolSettings, PostgresStore, SqliteStore, Store, StoreError};

#[derive(Debug, Args)]
pub struct KeysArgs {
    /// Data directory of the server.
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data", global = true)]
    pub data_dir: PathBuf,
    /// The server's database when it is not `<data-dir>/tandem.db` (`postgres://...`).
    #[arg(long, env = "TANDEM_DATABASE_URL", global = true)]
    pub database_url: Option<String>,
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

/// Opens the store `database_url` names, `<data-dir>/tandem.db` when it names none.
///
/// `sqlite://PATH` (or none) is SQLite: the data directory holds every tenant's trajectories,
/// keys and checkpoints, so it is made (or tightened to) 0700, and the database file 0600 before
/// SQLite opens it (SQLite gives its -wal and -shm files the database file's permissions).
/// `postgres://` or `postgresql://` is PostgreSQL, its schema brought up to date on connect.
pub async fn open_store(data_dir: &Path, database_url: Option<&str>) -> anyhow::Result<Arc<dyn Store>> {
    open_store_with_pool(data_dir, database_url, PoolSettings::default(), None).await
}

/// [`open_store`] with the pool's size and acquire timeout where `pool` sets them (default: the
/// backend's own), holding entities without a quota of their own to `storage_quota` bytes.
pub async fn open_store_with_pool(
    data_dir: &Path,
    database_url: Option<&str>,
    pool: PoolSettings,
    storage_quota: Option<i64>,
) -> anyhow::Result<Arc<dyn Store>> {
    private_dir(data_dir)?;
    let db = match database_url {
        None => data_dir.join("tandem.db"),
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let store = PostgresStore::connect_with_pool(url, pool)
                .await
                .with_context(|| format!("connecting to {}", redacted(url)))?;
            let store = store.with_storage_quota(storage_quota);
            // Over a network a statement can vanish without an error: each call has a deadline.
            return Ok(match pool.call_deadline() {
                Some(limit) => Arc::new(tandem_store::Deadline::new(store, limit)),
                None => Arc::new(store),
            });
        }
        Some(url) => match url.strip_prefix("sqlite://") {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => anyhow::bail!("--database-url {:?}: expected sqlite://PATH or postgres://...", redacted(url)),
        },
    };
    private_file(&db)?;
    let store = SqliteStore::open_with_pool(&db, pool).await.with_context(|| format!("opening {}", db.display()))?;
    Ok(Arc::new(store.with_storage_quota(storage_quota)))
}

/// A database URL without its password, for messages and logs.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}:***{}", &url[..scheme + 3], user, &url[at..])
        }
        _ => url.to_string(),
    }
}

pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    tandem_store::create_private_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", dir.display()))
}

/// Creates `path` empty with mode 0600 if missing; an existing file is set to 0600.
pub(crate) fn private_file(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(0o600)))
        .with_context(|| format!("making {} private", path.display()))
}

pub async fn run(args: KeysArgs) -> anyhow::Result<()> {
    let store = open_store(&args.data_dir, args.database_url.as_deref()).await?;
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
