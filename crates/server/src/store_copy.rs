//! `tandem store copy --from URL --to URL`: moves a store, SQLite into PostgreSQL when a team
//! outgrows one machine, or back. Files first, then records: with `--blob-store`, every
//! checkpoint and Tinker state the source's records name is uploaded from `--data-dir` into the
//! blob store before any record is written, as a trainer publishes; then every record is copied
//! in one transaction and verified (`tandem_store::copy`). A target that already holds records
//! is refused. Stop the servers on the source first: what they write during the copy is not in it.

use clap::{Args, Subcommand};
use std::path::PathBuf;
use tandem_store::copy::{copy_files, copy_records, Endpoint};
use tandem_store::{BlobStore, CheckpointDir, Checkpoints, PoolSettings, PostgresStore, SqliteStore, Store};

#[derive(Debug, Args)]
pub struct StoreArgs {
    #[command(subcommand)]
    pub command: StoreCommand,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Copy every record of one store into another (empty) one, and verify it.
    Copy(CopyArgs),
}

#[derive(Debug, Args)]
pub struct CopyArgs {
    /// The store to read: `sqlite://PATH` (e.g. `sqlite://data/tandem.db`) or `postgres://...`.
    #[arg(long)]
    pub from: String,
    /// The store to fill: `postgres://...` (the database must exist) or `sqlite://PATH` (a new file).
    #[arg(long)]
    pub to: String,
    /// The source's data directory: its checkpoint files are in `checkpoints/` under it.
    #[arg(long, default_value = "data")]
    pub data_dir: PathBuf,
    /// The target's blob store (`s3://...`, `file://...`, ...): the checkpoint files in
    /// `--data-dir` are uploaded into it. Without it the files stay where they are, and the
    /// target's servers must use the same directory (or the blob store the source used).
    #[arg(long)]
    pub blob_store: Option<String>,
    /// Copy the records even when some checkpoint files they name are nowhere to be found.
    #[arg(long)]
    pub allow_missing_files: bool,
}

enum Opened {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

impl Opened {
    async fn open(url: &str, must_exist: bool) -> anyhow::Result<Opened> {
        let shown = crate::keys::redacted(url);
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            // No statement timeout: reading a large table streams for as long as its rows take
            // to write into the other store.
            let pool = PoolSettings { statement_timeout: Some(std::time::Duration::ZERO), ..Default::default() };
            let store = PostgresStore::connect_with_pool(url, pool)
                .await
                .map_err(|e| anyhow::anyhow!("connecting to {shown}: {e}"))?;
            return Ok(Opened::Postgres(store));
        }
        let Some(path) = url.strip_prefix("sqlite://").filter(|p| !p.is_empty()) else {
            anyhow::bail!("{shown:?}: expected sqlite://PATH or postgres://...");
        };
        let path = PathBuf::from(path);
        if must_exist && !path.is_file() {
            anyhow::bail!("{}: no such SQLite database", path.display());
        }
        if !must_exist {
            if path.exists() {
                anyhow::bail!("{}: already exists; the copy makes a new SQLite database", path.display());
            }
            // Readable by its owner only, as the server keeps its own database.
            crate::keys::private_file(&path)?;
        }
        let store = SqliteStore::open(&path).await.map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
        Ok(Opened::Sqlite(store))
    }

    fn endpoint(&self) -> Endpoint<'_> {
        match self {
            Opened::Sqlite(s) => Endpoint::Sqlite(s),
            Opened::Postgres(p) => Endpoint::Postgres(p),
        }
    }

    fn store(&self) -> &dyn Store {
        match self {
            Opened::Sqlite(s) => s,
            Opened::Postgres(p) => p,
        }
    }
}

pub async fn run(args: StoreArgs) -> anyhow::Result<()> {
    let StoreCommand::Copy(args) = args.command;
    let from = Opened::open(&args.from, true).await?;
    let to = Opened::open(&args.to, false).await?;

    let live = from.store().live_checkpoint_paths().await?;
    let local = CheckpointDir::open(args.data_dir.join("checkpoints"))?;
    let checkpoints = match &args.blob_store {
        Some(url) => Checkpoints::with_remote(local, BlobStore::open(url)?),
        None => Checkpoints::local(local),
    };
    let files = copy_files(&live, &checkpoints).await?;
    println!(
        "files: {} checkpoint and Tinker state directories named; {} uploaded, {} already in the blob store, {} missing",
        live.len(),
        files.uploaded,
        files.in_blob_store,
        files.missing.len()
    );
    if !files.missing.is_empty() {
        for path in files.missing.iter().take(20) {
            println!("  missing: {path}");
        }
        if !args.allow_missing_files {
            anyhow::bail!(
                "{} checkpoint directories are neither in {} nor in a blob store; nothing was copied \
                 (--data-dir names the source's data directory; --allow-missing-files copies the records anyway)",
                files.missing.len(),
                checkpoints.dir().root().display()
            );
        }
    }

    let copied = copy_records(&from.endpoint(), &to.endpoint()).await?;
    for t in &copied {
        println!("{:<20} {:>10} rows  verified", t.table, t.rows);
    }
    println!("copied {} records into {}", copied.iter().map(|t| t.rows).sum::<u64>(), crate::keys::redacted(&args.to));
    Ok(())
}
