//! `tandem export`: a trained checkpoint out of a data directory as one GGUF file with the
//! adapter merged into its base model, for the tools that take a plain model (llama.cpp,
//! Ollama). The adapter alone (PEFT) comes from the API: `GET .../checkpoints/{step}/adapter`.

use crate::config::{BUNDLED_MODEL_ID, DEFAULT_MODEL};
use anyhow::{bail, Context};
use clap::Args;
use std::path::PathBuf;
use tandem_model::merge::{merge_to_gguf, MergeFormat};
use tandem_store::CheckpointDir;

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Data directory of the server.
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// The server's database when it is not `<data-dir>/tandem.db` (`postgres://...`).
    #[arg(long, env = "TANDEM_DATABASE_URL")]
    pub database_url: Option<String>,
    /// The model's id (a UUID, as `/v1/preview/models` lists it).
    #[arg(long = "model")]
    pub model_id: uuid::Uuid,
    /// The checkpoint's step (default: the latest).
    #[arg(long)]
    pub step: Option<i64>,
    /// Write the base model with the checkpoint's adapter merged into this GGUF file.
    #[arg(long)]
    pub merged: PathBuf,
    /// The base model's GGUF file, the one the server serves as the model's `base_model`
    /// (default: the bundled model's, when that is the model's base).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Type of the merged file's weight matrices: `base` (each tensor keeps its type), `f32`,
    /// `f16` or `q8_0`.
    #[arg(long, default_value = "base")]
    pub format: String,
}

pub async fn run(args: ExportArgs) -> anyhow::Result<()> {
    let Some(format) = MergeFormat::parse(&args.format) else {
        bail!("--format must be base, f32, f16 or q8_0, not {:?}", args.format);
    };
    // Never create a data directory: a mistyped path is an error, not an empty store.
    if args.database_url.is_none() && !args.data_dir.join("tandem.db").is_file() {
        bail!("{} is not a tandem data directory (it has no tandem.db)", args.data_dir.display());
    }
    let store = crate::keys::open_store(&args.data_dir, args.database_url.as_deref()).await?;
    let model = store
        .model_by_id(args.model_id)
        .await
        .with_context(|| format!("no model {} in {}", args.model_id, args.data_dir.display()))?;
    let base = match args.base.clone() {
        Some(path) => path,
        None if model.base_model == BUNDLED_MODEL_ID => PathBuf::from(DEFAULT_MODEL),
        None => bail!(
            "model {} was trained on {}: give --base with that model's GGUF file",
            args.model_id,
            model.base_model
        ),
    };
    let step = match args.step {
        Some(s) => s,
        None => store.latest_step(args.model_id).await?,
    };
    if step < 1 {
        bail!(
            "--step must be 1 or more (step 0 is the base model itself); model {} has no checkpoint yet",
            args.model_id
        );
    }
    let checkpoint = store
        .get_checkpoint(args.model_id, step)
        .await
        .with_context(|| format!("model {} has no live checkpoint at step {step}", args.model_id))?;
    let dir = CheckpointDir::open(args.data_dir.join("checkpoints"))?
        .resolve(&checkpoint.path)
        .context("the checkpoint's stored path is not usable")?;
    let (from, out) = (base.clone(), args.merged.clone());
    let report = tokio::task::spawn_blocking(move || merge_to_gguf(&from, &dir, &out, format))
        .await?
        .with_context(|| format!("merging step {step} into {}", base.display()))?;
    eprintln!(
        "merged step {step} of {}/{}/{} (base {} from {}): {} projections merged, {} tensors copied ({:?})",
        model.entity,
        model.project,
        model.name,
        model.base_model,
        base.display(),
        report.merged,
        report.copied,
        format
    );
    println!("{}", args.merged.display());
    Ok(())
}
