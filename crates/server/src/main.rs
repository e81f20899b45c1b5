//! The `tandem` binary: thin wiring over the library crates.

mod cluster;
mod config;
mod export;
mod keys;
mod models;
mod nodes;
mod quota;
mod serve;
mod store_copy;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

// Training allocates and frees gigabytes of activations per step. glibc's malloc raises its mmap
// threshold after such frees and keeps the memory in its arenas: a server that had trained sat at
// 11 GB resident. mimalloc hands freed pages back to the system: soon while the server only
// serves, a minute after they are freed while something trains (tandem_model::allocator: sooner
// costs training steps ~20% in page faults).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "tandem", version, about = "Serve chat completions and fine-tune them with RL, in one server.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve(Box<config::ServeArgs>),
    /// Manage API keys.
    Keys(keys::KeysArgs),
    /// Write a checkpoint merged into its base model as one GGUF file.
    Export(export::ExportArgs),
    /// List the cluster's nodes, or drain one.
    Nodes(nodes::NodesArgs),
    /// Inspect a model file: what it is and whether tandem serves it.
    Models(models::ModelsArgs),
    /// Copy a store into another (SQLite into PostgreSQL, or back), files into a blob store.
    Store(store_copy::StoreArgs),
    /// Show what each entity stores, or set an entity's own storage quota.
    Quota(quota::QuotaArgs),
}

/// The hidden subcommand that renders one request-supplied chat template (see
/// `tandem_engine::template::jail`). Handled before anything else starts: no threads, no logging.
pub const RENDER_TEMPLATE: &str = "__render-template";

fn render_template_jailed() -> anyhow::Result<()> {
    use rlimit::Resource;
    use tandem_engine::template::jail::{serve_one, JAIL_CPU_SECONDS, JAIL_MEMORY_BYTES};
    // Limits first: what follows runs the untrusted template. An allocation past the data limit
    // aborts this process only.
    Resource::DATA.set(JAIL_MEMORY_BYTES, JAIL_MEMORY_BYTES)?;
    Resource::CPU.set(JAIL_CPU_SECONDS, JAIL_CPU_SECONDS)?;
    Resource::CORE.set(0, 0)?;
    serve_one(std::io::stdin().lock(), std::io::stdout().lock())?;
    Ok(())
}

/// Errors end the process with one line on stderr (the causes joined by colons) and exit code 1:
/// an operator reads why, a script sees the failure, nobody reads a backtrace.
fn main() -> std::process::ExitCode {
    tandem_train::run_candle_ops_inline();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some(RENDER_TEMPLATE) {
        return render_template_jailed();
    }
    let command = Cli::parse().command;
    // Logs go to stderr; stdout carries only what scripts read (the address, a new key).
    let filter = EnvFilter::try_from_env("TANDEM_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    // Colours only on a terminal: a log file or a collector gets plain text, no escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        match command {
            Command::Serve(args) => serve::run(config::ServeConfig::resolve(*args)?).await,
            Command::Keys(args) => keys::run(args).await,
            Command::Export(args) => export::run(args).await,
            Command::Nodes(args) => nodes::run(args).await,
            Command::Models(args) => models::run(args),
            Command::Store(args) => store_copy::run(args).await,
            Command::Quota(args) => quota::run(args).await,
        }
    })
}
