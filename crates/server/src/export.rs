//! `tandem export`: a trained checkpoint out of a data directory as one GGUF file with the
//! adapter merged into its base model, for the tools that take a plain model (llama.cpp,
//! Ollama); or a model's tokenizer as the files a Hugging Face client loads offline (the tinker
//! SDK, tinker-cookbook and ART load one by the model's name). The adapter alone (PEFT) comes from
//! the API: `GET .../checkpoints/{step}/adapter`.

use crate::config::{default_model_id, BUNDLED_MODEL_ID, DEFAULT_MODEL};
use anyhow::{bail, Context};
use clap::Args;
use std::path::PathBuf;
use tandem_core::hf_files;
use tandem_engine::tokenizer_dir;
use tandem_model::merge::{merge_to_gguf, MergeFormat};
use tandem_store::CheckpointDir;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["merged", "tokenizer"])))]
pub struct ExportArgs {
    /// Data directory of the server.
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// The server's database when it is not `<data-dir>/tandem.db` (`postgres://...`).
    #[arg(long, env = "TANDEM_DATABASE_URL")]
    pub database_url: Option<String>,
    /// With `--merged`: the trained model's id (a UUID, as `/v1/preview/models` lists it). With
    /// `--tokenizer`: the model file (GGUF or Hugging Face directory) as `serve --model` takes it
    /// (default: the bundled model).
    #[arg(long = "model")]
    pub model: Option<String>,
    /// The checkpoint's step (default: the latest).
    #[arg(long)]
    pub step: Option<i64>,
    /// Write the base model with the checkpoint's adapter merged into this GGUF file.
    #[arg(long)]
    pub merged: Option<PathBuf>,
    /// Write the model's tokenizer (`tokenizer.json`, `tokenizer_config.json` with its chat
    /// template) into this directory, which `AutoTokenizer.from_pretrained(DIR)` loads.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// With `--tokenizer`: write the files as a Hugging Face hub cache under DIR instead
    /// (`models--org--name/...`), so that loading by the model's name finds them with
    /// `HF_HUB_CACHE=DIR HF_HUB_OFFLINE=1`.
    #[arg(long, requires = "tokenizer")]
    pub hub: bool,
    /// With `--tokenizer`: the name the model is served under (default: as `serve` names it).
    #[arg(long, requires = "tokenizer")]
    pub name: Option<String>,
    /// With `--tokenizer`: the context length `serve --max-model-len` gives it.
    #[arg(long, requires = "tokenizer")]
    pub max_model_len: Option<usize>,
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
    match (&args.merged, &args.tokenizer) {
        (Some(out), _) => merged(&args, out.clone()).await,
        (None, Some(dir)) => tokenizer(&args, dir),
        (None, None) => bail!("give --merged FILE or --tokenizer DIR"),
    }
}

/// The tokenizer files of the model file `--model` (read from its header), as a directory or a
/// hub cache. Prints the directory `AutoTokenizer.from_pretrained` takes (or the cache's root).
fn tokenizer(args: &ExportArgs, dir: &std::path::Path) -> anyhow::Result<()> {
    let path = PathBuf::from(args.model.as_deref().unwrap_or(DEFAULT_MODEL));
    let name = args.name.clone().unwrap_or_else(|| default_model_id(&path));
    let files =
        tokenizer_dir::files_of(&path, args.max_model_len).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let files = if args.hub { hf_files::hub_layout(&name, &files) } else { files };
    write_files(dir, &files).with_context(|| format!("writing {}", dir.display()))?;
    if args.hub {
        eprintln!(
            "tokenizer of {name} written as a hub cache: HF_HUB_CACHE={} HF_HUB_OFFLINE=1, then load {name:?}",
            dir.display()
        );
    } else {
        eprintln!("tokenizer of {name} written: AutoTokenizer.from_pretrained({:?})", dir.display().to_string());
    }
    println!("{}", dir.display());
    Ok(())
}

async fn merged(args: &ExportArgs, out: PathBuf) -> anyhow::Result<()> {
    let Some(model_id) = args.model.as_deref() else { bail!("--merged needs --model with the trained model's id") };
    let Ok(model_id) = uuid::Uuid::parse_str(model_id) else {
        bail!("--model {model_id:?} is not a model id (a UUID, as /v1/preview/models lists it)")
    };
    let Some(format) = MergeFormat::parse(&args.format) else {
        bail!("--format must be base, f32, f16 or q8_0, not {:?}", args.format);
    };
    // Never create a data directory: a mistyped path is an error, not an empty store.
    if args.database_url.is_none() && !args.data_dir.join("tandem.db").is_file() {
        bail!("{} is not a tandem data directory (it has no tandem.db)", args.data_dir.display());
    }
    let store = crate::keys::open_store(&args.data_dir, args.database_url.as_deref()).await?;
    let model = store
        .model_by_id(model_id)
        .await
        .with_context(|| format!("no model {} in {}", model_id, args.data_dir.display()))?;
    let base = match args.base.clone() {
        Some(path) => path,
        None if model.base_model == BUNDLED_MODEL_ID => PathBuf::from(DEFAULT_MODEL),
        None => {
            bail!("model {} was trained on {}: give --base with that model's GGUF file", model_id, model.base_model)
        }
    };
    let step = match args.step {
        Some(s) => s,
        None => store.latest_step(model_id).await?,
    };
    if step < 1 {
        bail!("--step must be 1 or more (step 0 is the base model itself); model {} has no checkpoint yet", model_id);
    }
    let checkpoint = store
        .get_checkpoint(model_id, step)
        .await
        .with_context(|| format!("model {} has no live checkpoint at step {step}", model_id))?;
    let dir = CheckpointDir::open(args.data_dir.join("checkpoints"))?
        .resolve(&checkpoint.path)
        .context("the checkpoint's stored path is not usable")?;
    let (from, to) = (base.clone(), out.clone());
    let report = tokio::task::spawn_blocking(move || merge_to_gguf(&from, &dir, &to, format))
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
    println!("{}", out.display());
    Ok(())
}

/// Writes `files` under `root`, creating directories; a file already there is replaced.
pub(crate) fn write_files(root: &std::path::Path, files: &[hf_files::File]) -> std::io::Result<()> {
    for (name, bytes) in files {
        let path = root.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes)?;
    }
    Ok(())
}
