//! `tandem models inspect FILE`: what a GGUF file (or checkpoint directory) is and whether tandem
//! serves it, read from its header without loading weights. Exits 1 when it would be refused, so
//! scripts can check a download before starting a server on it.

use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ModelsArgs {
    #[command(subcommand)]
    pub command: ModelsCommand,
}

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Architecture, shape, tokenizer, chat template and tensor types of a model, and whether
    /// tandem serves it.
    Inspect { path: PathBuf },
}

pub fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let ModelsCommand::Inspect { path } = args.command;
    let report = tandem_engine::inspect::inspect(&path);
    for (key, value) in &report.lines {
        println!("{key:<14}{value}");
    }
    match report.verdict {
        Ok(()) => {
            println!("{:<14}yes", "served");
            Ok(())
        }
        Err(why) => {
            println!("{:<14}no: {why}", "served");
            std::process::exit(1)
        }
    }
}
