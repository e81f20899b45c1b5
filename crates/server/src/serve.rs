//! `tandem serve`: open the store, start the training worker, serve HTTP until SIGTERM/SIGINT.

use crate::config::ServeConfig;
use crate::keys::open_store;
use anyhow::{bail, Context};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tandem_api::auth::{generate_key, StaticKeys};
use tandem_api::{AppConfig, AppState, Limits};
use tandem_core::inference::SharedBackend;
use tandem_engine::template::jail::TemplateJail;
use tandem_engine::{Engine, EngineConfig};
use tandem_jobs::{Worker, WorkerConfig};
use tandem_store::{CheckpointDir, Store};
use tandem_train::{LoraTrainer, ModelTokenizer, TrainBase};

pub async fn run(config: ServeConfig) -> anyhow::Result<()> {
    for m in &config.models {
        if !m.path.is_file() {
            bail!("model file {} not found (for the bundled model, run `make model`)", m.path.display());
        }
    }
    let store = open_store(&config.data_dir, config.database_url.as_deref()).await?;
    let lora_root = config.lora_root.as_deref().map(|r| lora_root(r, &config.data_dir)).transpose()?;
    let defaults = EngineConfig::default();
    let engine_config = EngineConfig {
        max_seqs: config.max_num_seqs,
        max_waiting: config.max_waiting,
        kv_cache_bytes: config.kv_cache_bytes.unwrap_or(defaults.kv_cache_bytes),
        max_model_len: config.max_model_len,
        step_tokens: config.max_num_batched_tokens.unwrap_or(defaults.step_tokens),
        prefix_cache_tokens: config.prefix_cache_tokens.unwrap_or(defaults.prefix_cache_tokens),
    };
    let (models, quantize) = (config.models.clone(), config.quantize);
    let started = std::time::Instant::now();
    let engine = tokio::task::spawn_blocking(move || -> anyhow::Result<Engine> {
        let mut engine = Engine::new();
        // Request-supplied chat templates render in `tandem __render-template` children.
        let exe = std::env::current_exe().context("locating the tandem binary for the template jail")?;
        engine.set_template_jail(TemplateJail::new(exe, vec![crate::RENDER_TEMPLATE.to_string()]));
        for m in &models {
            engine
                .add_path(&m.id, &m.path, quantize, engine_config.clone())
                .with_context(|| format!("loading {}", m.path.display()))?;
        }
        Ok(engine)
    })
    .await??;
    tracing::info!(secs = started.elapsed().as_secs_f32(), "models loaded");
    let checkpoints = CheckpointDir::open(config.data_dir.join("checkpoints"))?;

    let mut static_keys = StaticKeys::default();
    if let Some(key) = &config.api_key {
        static_keys.add(key, "local");
    } else if store.list_keys().await?.is_empty() {
        first_key(store.as_ref(), &config.data_dir).await?;
    }

    let backend: SharedBackend = Arc::new(engine);
    // The trainer renders and tokenizes with the engine's own template and tokenizer, so training
    // sees exactly the prompts serving saw.
    let bases = config
        .models
        .iter()
        .zip(backend.models())
        .map(|(m, served)| TrainBase {
            id: m.id.clone(),
            path: m.path.clone(),
            tokenizer: Arc::new(ModelTokenizer(served)),
        })
        .collect();
    let trainer = Arc::new(LoraTrainer::new(bases));
    let worker = Worker::new(
        store.clone(),
        checkpoints.clone(),
        trainer,
        WorkerConfig { max_attempts: config.job_max_attempts, ..WorkerConfig::default() },
    );
    worker.recover().await.context("recovering interrupted training jobs")?;
    let state = AppState::new(AppConfig {
        store: store.clone(),
        checkpoints,
        static_keys,
        served_models: config.models.iter().map(|m| m.id.clone()).collect(),
        limits: Limits { max_body_bytes: config.max_body_bytes, ..Limits::default() },
        jobs_waker: worker.waker(),
        backend: Some(backend),
        per_entity_limit: config.per_entity_limit,
        priority_scheduling: config.priority_scheduling,
        reasoning_parser: config.reasoning_parser,
        training_heartbeat: Some(worker.heartbeat()),
        training_metrics: Some(worker.metrics()),
        lora_root,
    });
    let worker_task = tokio::spawn(worker.clone().run());

    // Signal handlers are installed before the address is announced, so that a SIGTERM sent as
    // soon as the server is up is a graceful stop, not the default kill.
    let shutdown = shutdown_signal()?;
    let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port))
        .await
        .with_context(|| format!("binding {}:{}", config.host, config.port))?;
    let addr = listener.local_addr()?;
    // Scripts and tests read this line to learn the port.
    println!("tandem listening on http://{addr}");
    let served: Vec<&str> = config.models.iter().map(|m| m.id.as_str()).collect();
    tracing::info!(%addr, models = ?served, data_dir = %config.data_dir.display(), "serving");
    std::io::stdout().flush().ok();

    axum::serve(listener, tandem_api::app(state)).with_graceful_shutdown(shutdown).await?;
    tracing::info!("http server stopped; stopping the training worker");
    worker.stop();
    if tokio::time::timeout(Duration::from_secs(30), worker_task).await.is_err() {
        tracing::warn!("training worker did not stop in 30 s; its job resumes at the next start");
    }
    Ok(())
}

/// `--lora-root`, canonical. Adapters load from anywhere under it, for any entity, so it may not
/// hold the data directory (other entities' checkpoints) nor lie inside it.
fn lora_root(root: &Path, data_dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let root = root.canonicalize().with_context(|| format!("--lora-root {}", root.display()))?;
    if !root.is_dir() {
        bail!("--lora-root {} is not a directory", root.display());
    }
    let data = data_dir.canonicalize().with_context(|| format!("data directory {}", data_dir.display()))?;
    if root.starts_with(&data) || data.starts_with(&root) {
        bail!(
            "--lora-root {} overlaps the data directory {}: any key could load other entities' checkpoints",
            root.display(),
            data.display()
        );
    }
    tracing::info!(root = %root.display(), "runtime LoRA updating is on");
    Ok(root)
}

/// On first start with no keys, creates one for entity `local`, prints it once and writes it to
/// `<data-dir>/api-key`, readable by the owner only.
async fn first_key(store: &dyn Store, data_dir: &Path) -> anyhow::Result<()> {
    let (key, record) = generate_key("local");
    let path = data_dir.join("api-key");
    write_private(&path, &format!("{key}\n")).with_context(|| format!("writing {}", path.display()))?;
    store.insert_key(&record).await?;
    println!("created the first API key (entity `local`); it is also in {}:", path.display());
    println!("{key}");
    Ok(())
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    // `mode` applies only to a file it creates: an existing one is tightened too.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::info!("shutdown signal received; draining connections");
    })
}
