//! `tandem serve`: open the store, start the training worker, serve HTTP until SIGTERM/SIGINT.

use crate::config::ServeConfig;
use crate::keys::open_store_with_pool;
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
use tandem_store::{BlobStore, CheckpointDir, Checkpoints, NodeBeat, Reclaim, Store};
use tandem_train::tinker::TinkerModels;
use tandem_train::{LoraTrainer, ModelTokenizer, TrainBase};

pub async fn run(config: ServeConfig) -> anyhow::Result<()> {
    for m in &config.models {
        if !m.path.is_file() {
            bail!("model file {} not found (for the bundled model, run `make model`)", m.path.display());
        }
    }
    // Before any kernel runs: the tier is fixed for the process.
    let cpu = tandem_model::kernels::cpu::limit(config.cpu).map_err(anyhow::Error::msg)?;
    tracing::info!(kernels = cpu.name(), "cpu tier");
    let store =
        open_store_with_pool(&config.data_dir, config.database_url.as_deref(), config.db_pool, config.storage_quota)
            .await?;
    if config.role != crate::config::Role::All {
        // A node of a cluster shares the queue and the checkpoints with the others.
        if store.single_process() {
            bail!("--role {} needs a database the nodes share (--database-url postgres://...)", config.role.as_str());
        }
        if config.blob_store.is_none() {
            bail!("--role {} needs --blob-store, where every node finds the checkpoints", config.role.as_str());
        }
    }
    let lora_root = config.lora_root.as_deref().map(|r| lora_root(r, &config.data_dir)).transpose()?;
    let defaults = EngineConfig::default();
    let engine_config = EngineConfig {
        max_seqs: config.max_num_seqs,
        max_waiting: config.max_waiting,
        kv_cache_bytes: config.kv_cache_bytes.unwrap_or(defaults.kv_cache_bytes),
        max_model_len: config.max_model_len,
        step_tokens: config.max_num_batched_tokens.unwrap_or(defaults.step_tokens),
        prefix_cache_tokens: config.prefix_cache_tokens,
        team_spin: config.engine_spin_us.map_or(defaults.team_spin, std::time::Duration::from_micros),
    };
    let (models, quantize, adapter_cache_bytes) = (config.models.clone(), config.quantize, config.adapter_cache_bytes);
    let started = std::time::Instant::now();
    let engine = tokio::task::spawn_blocking(move || -> anyhow::Result<Engine> {
        let mut engine = Engine::new();
        // Request-supplied chat templates render in `tandem __render-template` children.
        let exe = std::env::current_exe().context("locating the tandem binary for the template jail")?;
        engine.set_template_jail(TemplateJail::new(exe, vec![crate::RENDER_TEMPLATE.to_string()]));
        engine.set_adapter_cache_bytes(adapter_cache_bytes);
        for m in &models {
            engine
                .add_path(&m.id, &m.path, quantize, engine_config.clone())
                .with_context(|| format!("loading {}", m.path.display()))?;
        }
        Ok(engine)
    })
    .await??;
    tracing::info!(secs = started.elapsed().as_secs_f32(), "models loaded");
    // Loading's temporaries (file bytes beside their packed copies) go back to the system.
    tandem_model::allocator::release_freed_memory();
    let local = CheckpointDir::open(config.data_dir.join("checkpoints"))?;
    let checkpoints = match &config.blob_store {
        Some(url) => {
            let blobs = BlobStore::open(url)?;
            tracing::info!(blob_store = %blobs.url(), "checkpoint files are shared through the blob store");
            Checkpoints::with_remote(local, blobs)
        }
        None => Checkpoints::local(local),
    }
    .with_publish_budget(config.blob_retry);

    let mut static_keys = StaticKeys::default();
    if let Some(key) = &config.api_key {
        static_keys.add(key, "local");
    } else if store.list_keys().await?.is_empty() {
        first_key(store.as_ref(), &config.data_dir).await?;
    }

    // The trainer reads the engine's matrices in place: one copy of the weights serves and trains.
    let served: Vec<_> = config.models.iter().filter_map(|m| Some((m.id.clone(), engine.llama(&m.id)?))).collect();
    let backend: SharedBackend = Arc::new(engine);
    let tokenizer_dirs = write_tokenizers(&config.data_dir, &backend)?;
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
    let mut trainer = LoraTrainer::new(bases).with_quantize(config.quantize);
    for (id, model) in served {
        trainer = trainer.with_served(&id, model);
    }
    if let Some(n) = config.train_recompute_tokens {
        trainer = trainer.with_recompute_above(n);
    }
    let trainer = Arc::new(trainer);
    // This process in the node registry and as a lease holder; operators (and the cluster
    // test) find the process by its pid.
    let worker_owner = format!("{} pid {} ({})", hostname(), std::process::id(), tandem_core::new_id());
    let parked = park_dir(&config.data_dir, store.single_process())?;
    let worker = Worker::new(
        store.clone(),
        checkpoints.clone(),
        trainer.clone(),
        WorkerConfig {
            max_attempts: config.job_max_attempts,
            lease_ttl: config.job_lease,
            max_runs: config.max_training_runs,
            max_parked: config.max_parked_training_runs,
            park_dir: Some(parked.clone()),
            // Alone on its store, this process's previous run left every running job; sharing
            // it, only jobs whose lease ran out are orphans.
            reclaim_at_start: if store.single_process() { Reclaim::All } else { Reclaim::Expired },
            owner: worker_owner.clone(),
            ..WorkerConfig::default()
        },
    );
    let role = config.role;
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if role.trains() {
        worker.recover().await.context("recovering interrupted training jobs")?;
    } else {
        // A serving node's local copies of deleted checkpoints; the shared store is the
        // trainers' to sweep.
        checkpoints.sweep_local(&store.live_checkpoint_paths().await?).await?;
    }
    import_old_tinker_catalog(&config.data_dir, &store, &checkpoints, &static_keys).await?;
    let state = AppState::new(AppConfig {
        store: store.clone(),
        checkpoints: checkpoints.clone(),
        static_keys,
        served_models: config.models.iter().map(|m| m.id.clone()).collect(),
        limits: Limits {
            max_body_bytes: config.max_body_bytes,
            max_job_tokens: config.max_job_tokens,
            tinker_waits: tandem_tinker::Waits {
                idle: config.tinker_idle,
                seq_gap: config.tinker_seq_gap,
                heartbeat: config.tinker_heartbeat,
            },
            ..Limits::default()
        },
        jobs_waker: worker.waker(),
        backend: Some(backend),
        tokenizer_dirs,
        per_entity_limit: config.per_entity_limit,
        priority_scheduling: config.priority_scheduling,
        reasoning_parser: config.reasoning_parser,
        training_heartbeat: role.trains().then(|| worker.heartbeat()),
        training_metrics: role.trains().then(|| worker.metrics()),
        lora_root,
        tinker: role.trains().then(|| {
            Arc::new(
                TinkerModels::new(trainer.clone(), worker.turns(), config.max_tinker_models)
                    .with_memory(config.tinker_memory, parked.clone()),
            ) as Arc<dyn tandem_core::tinker::TinkerTrainer>
        }),
        draining: draining.clone(),
        // Alone on its store a process holds every Tinker session itself.
        node_id: (!store.single_process()).then(|| worker_owner.clone()),
    });
    // Tinker checkpoints whose TTL has passed go at start and every minute after.
    tandem_api::tinker::expiry::spawn_sweeper(state.clone());
    let worker_task = role.trains().then(|| tokio::spawn(worker.clone().run()));
    tokio::spawn(crate::cluster::follow_notices(store.clone(), role, worker.waker(), checkpoints));

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
    let node = NodeBeat {
        id: worker_owner.clone(),
        name: config.node_name.clone().unwrap_or_else(|| format!("{}:{}", hostname(), addr.port())),
        role: role.as_str().to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        busy: false,
        address: config.advertise_url.clone().unwrap_or_else(|| match addr.ip().is_unspecified() {
            true => format!("http://{}:{}", hostname(), addr.port()),
            false => format!("http://{addr}"),
        }),
    };
    let beats =
        tokio::spawn(crate::cluster::beat(store.clone(), node, role.trains().then(|| worker.clone()), draining));
    tracing::info!(%addr, models = ?served, data_dir = %config.data_dir.display(), role = role.as_str(), "serving");
    std::io::stdout().flush().ok();

    let mut app = tandem_api::app(state);
    if !role.serves_api() {
        app = app.layer(axum::middleware::from_fn(crate::cluster::trainer_only));
    }
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    tracing::info!("http server stopped; stopping the training worker");
    beats.abort();
    if let Err(e) = store.remove_node(&worker_owner).await {
        tracing::warn!(error = %e, "could not leave the node registry");
    }
    worker.stop();
    if let Some(task) = worker_task {
        if tokio::time::timeout(Duration::from_secs(30), task).await.is_err() {
            tracing::warn!("training worker did not stop in 30 s; its job runs again later");
        }
    }
    Ok(())
}

/// Each served model's tokenizer as files a Hugging Face client loads offline, rewritten at every
/// start: a directory per model (`<data dir>/tokenizers/<model id, / as -->`), which Tinker's
/// `get_info` names so the SDK's `TrainingClient.get_tokenizer()` loads it, and the same files as
/// a hub cache (`<data dir>/hf-hub`), where loading by the model's name finds them
/// (`HF_HUB_CACHE=<data dir>/hf-hub HF_HUB_OFFLINE=1`: the SDK's sampling clients, tinker-cookbook
/// and ART load tokenizers by name).
fn write_tokenizers(
    data_dir: &Path,
    backend: &SharedBackend,
) -> anyhow::Result<std::collections::BTreeMap<String, std::path::PathBuf>> {
    use tandem_core::hf_files;
    let mut dirs = std::collections::BTreeMap::new();
    for m in backend.models() {
        let files = m.tokenizer_files();
        if files.is_empty() {
            continue;
        }
        let id = m.info().id.clone();
        let dir = data_dir.join("tokenizers").join(hf_files::dir_name(&id));
        crate::export::write_files(&dir, &files)
            .with_context(|| format!("writing the tokenizer of {id} to {}", dir.display()))?;
        let hub = data_dir.join("hf-hub");
        crate::export::write_files(&hub, &hf_files::hub_layout(&id, &files))
            .with_context(|| format!("writing the tokenizer of {id} to {}", hub.display()))?;
        dirs.insert(id, dir.canonicalize().unwrap_or(dir));
    }
    Ok(dirs)
}

/// Where parked training jobs' states go. A state outlives only its job's run (a job interrupted
/// by a restart runs again from its stored inputs), so a process alone on its store empties it
/// at start; processes sharing a database may share a data directory, and leave it.
fn park_dir(data_dir: &Path, alone: bool) -> anyhow::Result<std::path::PathBuf> {
    let dir = data_dir.join("parked");
    if alone && dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
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

/// This machine's name, for lease owners and logs ("localhost" when it cannot be read).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The Tinker catalog an older version kept as files in `<data-dir>/tinker-states`, moved into
/// the store once (docs/tinker.md).
async fn import_old_tinker_catalog(
    data_dir: &std::path::Path,
    store: &Arc<dyn Store>,
    checkpoints: &Checkpoints,
    static_keys: &StaticKeys,
) -> anyhow::Result<()> {
    let old = data_dir.join("tinker-states");
    if !old.is_dir() {
        return Ok(());
    }
    let mut entities: Vec<String> = store.list_keys().await?.into_iter().map(|k| k.entity).collect();
    entities.extend(static_keys.entities());
    entities.sort();
    entities.dedup();
    let catalog = tandem_tinker::Catalog::new(store.clone(), checkpoints.clone());
    let done = tandem_tinker::legacy::import(&old, &catalog, &entities)
        .await
        .map_err(|e| anyhow::anyhow!("importing the old Tinker catalog in {}: {e}", old.display()))?;
    if let Some(done) = done {
        tracing::info!(
            entries = done.entries,
            unknown_owners = done.unknown_owners.len(),
            "imported the old Tinker catalog"
        );
    }
    Ok(())
}
