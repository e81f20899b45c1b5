//! The one typed configuration of `tandem serve`: defaults < TOML file < `TANDEM_*` env < flags.
//!
//! One struct, [`ServeArgs`], declares every setting once: clap derives its flag and environment
//! variable, serde its TOML key (the field name). clap already merges flags over environment
//! variables; the file, parsed into the same struct, fills only what neither gave, and defaults
//! fill the rest. A test holds the README's configuration table to this struct.

use anyhow::{bail, Context};
use clap::Args;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use tandem_core::inference::ReasoningParser;

/// Where the bundled model lives after `make model`, relative to the working directory.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The id the bundled model is served under.
pub const BUNDLED_MODEL_ID: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

#[derive(Debug, Args, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (flags and TANDEM_* variables override it).
    #[arg(long, env = "TANDEM_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "TANDEM_HOST")]
    pub host: Option<String>,
    /// Port to listen on (0 picks a free one and prints it).
    #[arg(long, env = "TANDEM_PORT")]
    pub port: Option<u16>,
    /// Directory for the database, checkpoints and the first API key.
    #[arg(long, env = "TANDEM_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The database: `sqlite://PATH` or `postgres://USER@HOST/DB` (default: SQLite in
    /// `<data-dir>/tandem.db`).
    #[arg(long, env = "TANDEM_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Checkpoint files shared by every node: `file:///PATH`, `s3://BUCKET/PREFIX`,
    /// `gs://BUCKET/PREFIX` or `az://CONTAINER/PREFIX`, credentials from each cloud's usual
    /// variables (default: checkpoints only in `<data-dir>/checkpoints`, which then caches them).
    #[arg(long, env = "TANDEM_BLOB_STORE")]
    pub blob_store: Option<String>,
    /// What this process does: `all` (serve the API and inference, and train), `api` (serve
    /// the API and inference, train nothing; `inference` is the same role) or `trainer` (train
    /// jobs from the shared queue; HTTP serves only /health and /metrics).
    #[arg(long, env = "TANDEM_ROLE")]
    pub role: Option<String>,
    /// What the node registry (`tandem nodes`) calls this process (default: host:port).
    #[arg(long, env = "TANDEM_NODE_NAME")]
    pub node_name: Option<String>,
    /// The base URL the other nodes of a cluster reach this process at (`http://10.0.0.5:8000`):
    /// a Tinker session's calls are forwarded there by whichever node receives them (default:
    /// `http://<--host>:<port>`, or this machine's host name when --host is every address).
    #[arg(long, env = "TANDEM_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// Base model to serve, a GGUF file or a Hugging Face checkpoint directory; repeat for several.
    #[arg(long = "model", env = "TANDEM_MODEL", value_delimiter = ',')]
    pub models: Vec<PathBuf>,
    /// Id to serve each --model under, in the same order.
    #[arg(long = "served-model-name", env = "TANDEM_SERVED_MODEL_NAME", value_delimiter = ',')]
    pub served_model_names: Vec<String>,
    /// An API key that is valid for entity `local` (for scripts and tests).
    #[arg(long, env = "TANDEM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "TANDEM_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// `priority` (lower `priority` first, then arrival) or `fcfs` (non-zero priority is a 400).
    #[arg(long, env = "TANDEM_SCHEDULING")]
    pub scheduling: Option<String>,
    /// `think` (alias `qwen3`): split `<think>...</think>` output into `message.reasoning` (vLLM's
    /// `--reasoning-parser`, for models that reason in those tags); `deepseek_r1`: the output
    /// starts inside the reasoning (the template opened the tag); `none` (default) leaves it all
    /// in the content.
    #[arg(long, env = "TANDEM_REASONING_PARSER")]
    pub reasoning_parser: Option<String>,
    /// Sequences decoded together in one step.
    #[arg(long, env = "TANDEM_MAX_NUM_SEQS")]
    pub max_num_seqs: Option<usize>,
    /// Requests that may wait for admission before new ones get 503.
    #[arg(long, env = "TANDEM_MAX_WAITING")]
    pub max_waiting: Option<usize>,
    /// Inference requests one entity may have in flight before new ones get 429 (default: a
    /// quarter of --max-waiting, so that no one entity can fill the queue).
    #[arg(long, env = "TANDEM_PER_ENTITY_LIMIT")]
    pub per_entity_limit: Option<usize>,
    /// Memory for the KV caches of running sequences, in MiB (default: a quarter of the
    /// machine's memory). Decoding past it preempts sequences, as vLLM does.
    #[arg(long, env = "TANDEM_KV_CACHE_MIB")]
    pub kv_cache_mib: Option<u64>,
    /// Memory the loaded LoRA adapters may hold together, in MiB (default 1024): beyond it the
    /// least recently used are dropped and read from disk again when next asked for.
    #[arg(long, env = "TANDEM_ADAPTER_CACHE_MIB")]
    pub adapter_cache_mib: Option<u64>,
    /// Context length served, in tokens (vLLM's flag): at most the model's own; prompts, the
    /// default `max_tokens` and training sequences are bounded by it.
    #[arg(long, env = "TANDEM_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// New tokens per engine step, prefill chunks and decode together (vLLM's flag).
    #[arg(long, env = "TANDEM_MAX_NUM_BATCHED_TOKENS")]
    pub max_num_batched_tokens: Option<usize>,
    /// Prompt positions kept for prefix reuse (shared copy-on-write with running sequences);
    /// default: as many as 128 MiB of the model's KV hold.
    #[arg(long, env = "TANDEM_PREFIX_CACHE_TOKENS")]
    pub prefix_cache_tokens: Option<usize>,
    /// Microseconds the engine's helper threads spin after a parallel section before sleeping
    /// (default 1000): 0 gives the cores back at once, at ~30% of single-stream decode speed.
    #[arg(long, env = "TANDEM_ENGINE_SPIN_US")]
    pub engine_spin_us: Option<u64>,
    /// The highest SIMD tier the kernels use: `avx512` (default: all the CPU has), `avxvnni`,
    /// `avx2` or `scalar`, to run or measure the kernels most users' CPUs get.
    #[arg(long, env = "TANDEM_CPU")]
    pub cpu: Option<String>,
    /// Times a training job interrupted by restarts is run again before it is failed.
    #[arg(long, env = "TANDEM_JOB_MAX_ATTEMPTS")]
    pub job_max_attempts: Option<i64>,
    /// Seconds a trainer's claim on a job lasts without a renewal (renewed three times per
    /// lease): on a shared database, a dead trainer's job goes to another this long after.
    #[arg(long, env = "TANDEM_JOB_LEASE_SECONDS")]
    pub job_lease_seconds: Option<f64>,
    /// Training jobs a trainer holds in memory at once, each of another entity, time-sliced at
    /// gradient-step boundaries so a small job starts within a step of a long one (default 4).
    #[arg(long, env = "TANDEM_MAX_TRAINING_RUNS")]
    pub max_training_runs: Option<usize>,
    /// Jobs of further entities a trainer takes beyond `--max-training-runs`: each gets its
    /// turn by parking a held job's adapter and optimizer to disk (default 12; 0: they wait).
    #[arg(long, env = "TANDEM_MAX_PARKED_TRAINING_RUNS")]
    pub max_parked_training_runs: Option<usize>,
    /// A training part, or a shared prefix cut across parts, longer than this many tokens keeps
    /// only each layer's input through its forward and recomputes the rest in its backward
    /// (activation checkpointing: a fraction of the memory for about a fifth more time; default
    /// 256, half a part; 0: always; a large number: never).
    #[arg(long, env = "TANDEM_TRAIN_RECOMPUTE_TOKENS")]
    pub train_recompute_tokens: Option<usize>,
    /// Tinker training models this server holds at once, every entity's together (default 8).
    #[arg(long, env = "TANDEM_MAX_TINKER_MODELS")]
    pub max_tinker_models: Option<usize>,
    /// MiB the live Tinker models' adapters, optimizer moments and pending gradients may hold
    /// together; beyond it the least recently used are parked to files (default 2048).
    #[arg(long, env = "TANDEM_TINKER_MEMORY_MIB")]
    pub tinker_memory_mib: Option<u64>,
    /// Seconds a Tinker session lives without a heartbeat or a call before it is ended and its
    /// models released (default 600; the SDK beats every 10 s).
    #[arg(long, env = "TANDEM_TINKER_IDLE_SECONDS")]
    pub tinker_idle_seconds: Option<f64>,
    /// Seconds a Tinker call waits for the calls before it in `seq_id` order before it fails
    /// (default 600).
    #[arg(long, env = "TANDEM_TINKER_SEQ_GAP_SECONDS")]
    pub tinker_seq_gap_seconds: Option<f64>,
    /// Seconds a Tinker session that has sent heartbeats lives after its last heartbeat or call
    /// (default 60: six missed beats of the SDK's 10 s; a client that exits without closing its
    /// session gives its models back this soon).
    #[arg(long, env = "TANDEM_TINKER_HEARTBEAT_SECONDS")]
    pub tinker_heartbeat_seconds: Option<f64>,
    /// Most tokens one training job may train on (RL trajectories' or SFT conversations'
    /// tokens); a larger job is a 422 at creation (default 1048576).
    #[arg(long, env = "TANDEM_MAX_JOB_TOKENS")]
    pub max_job_tokens: Option<u64>,
    /// MiB of stored data (trajectory logs, job inputs, datasets, checkpoints, Tinker states,
    /// stored Responses) each entity may keep, unless `tandem quota set` gave it its own; a write
    /// past it is a 403 (default: no quota).
    #[arg(long, env = "TANDEM_STORAGE_QUOTA_MIB")]
    pub storage_quota_mib: Option<u64>,
    /// Database connections this process keeps (default 4 on SQLite, 8 on PostgreSQL).
    #[arg(long, env = "TANDEM_DB_POOL_SIZE")]
    pub db_pool_size: Option<u32>,
    /// Seconds a request waits for a database connection before it is answered 503 with
    /// `Retry-After` (default 2 on PostgreSQL, where it bounds the wait while the server is
    /// down; 10 on SQLite, whose waits are only queueing behind its one writer).
    #[arg(long, env = "TANDEM_DB_ACQUIRE_TIMEOUT")]
    pub db_acquire_timeout: Option<f64>,
    /// PostgreSQL: seconds the server lets one statement run, lock waits included, before it
    /// cancels it and the request is answered 503 with `Retry-After` (default 30; 0: no limit).
    #[arg(long, env = "TANDEM_DB_STATEMENT_TIMEOUT")]
    pub db_statement_timeout: Option<f64>,
    /// Seconds a checkpoint publish retries, with backoff, while the blob store does not answer
    /// or the disk is full, before the job fails with that error (default 60).
    #[arg(long, env = "TANDEM_BLOB_RETRY_SECONDS")]
    pub blob_retry_seconds: Option<f64>,
    /// Turns on `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING`) for PEFT adapter directories under this one; off
    /// when unset. It may not overlap the data directory.
    #[arg(long, env = "TANDEM_LORA_ROOT")]
    pub lora_root: Option<PathBuf>,
    /// How weight matrices are kept that are not stored in a format the kernels use as it is
    /// (Q4_1, Q4_K, Q5_K, Q6_K, Q4_0, Q5_0, Q5_1; Q8_0 unless q4_1 or q4_k is asked for): `q8_0` (int8 blocks of 32, the default),
    /// `q4_1` or `q4_k` (about half the memory), or `none` (float tensors stay f32).
    #[arg(long, env = "TANDEM_QUANTIZE")]
    pub quantize: Option<String>,
}

/// What one process of a cluster does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Serves the API and inference, and trains: the single-process default.
    All,
    /// Serves the API and inference, trains nothing. Each such node serves inference itself
    /// rather than forwarding to other nodes (docs/deploy.md says why).
    Api,
    /// Trains jobs from the shared queue; HTTP serves only `/health` and `/metrics`.
    Trainer,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "all" => Some(Role::All),
            "api" | "inference" => Some(Role::Api),
            "trainer" => Some(Role::Trainer),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Api => "api",
            Role::Trainer => "trainer",
        }
    }

    pub fn trains(self) -> bool {
        matches!(self, Role::All | Role::Trainer)
    }

    pub fn serves_api(self) -> bool {
        matches!(self, Role::All | Role::Api)
    }
}

/// One base model to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseModel {
    pub id: String,
    pub path: PathBuf,
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    pub blob_store: Option<String>,
    pub role: Role,
    pub node_name: Option<String>,
    pub advertise_url: Option<String>,
    pub models: Vec<BaseModel>,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub priority_scheduling: bool,
    pub reasoning_parser: Option<ReasoningParser>,
    pub max_num_seqs: usize,
    pub max_waiting: usize,
    pub per_entity_limit: usize,
    /// None: the engine's default (a quarter of the memory the process may use).
    pub kv_cache_bytes: Option<u64>,
    pub adapter_cache_bytes: usize,
    pub max_model_len: Option<usize>,
    /// None: the engine's defaults.
    pub max_num_batched_tokens: Option<usize>,
    pub prefix_cache_tokens: Option<usize>,
    /// None: the engine's default.
    pub engine_spin_us: Option<u64>,
    pub cpu: tandem_model::kernels::cpu::Tier,
    pub job_max_attempts: i64,
    pub job_lease: std::time::Duration,
    pub max_training_runs: usize,
    pub max_parked_training_runs: usize,
    /// None: the trainer's default (half a part).
    pub train_recompute_tokens: Option<usize>,
    pub max_tinker_models: usize,
    /// Bytes.
    pub tinker_memory: u64,
    pub tinker_idle: std::time::Duration,
    pub tinker_seq_gap: std::time::Duration,
    pub tinker_heartbeat: std::time::Duration,
    pub max_job_tokens: u64,
    /// The database pool's size and acquire timeout (None: the backend's defaults).
    pub db_pool: tandem_store::PoolSettings,
    /// Bytes each entity may store without a quota of its own (None: no quota).
    pub storage_quota: Option<i64>,
    pub blob_retry: std::time::Duration,
    pub lora_root: Option<PathBuf>,
    pub quantize: tandem_model::Quantize,
}

impl ServeConfig {
    pub fn resolve(args: ServeArgs) -> anyhow::Result<Self> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                toml::from_str::<ServeArgs>(&text).with_context(|| format!("parsing {}", path.display()))?
            }
            None => ServeArgs::default(),
        };
        let paths =
            non_empty(args.models).or(non_empty(file.models)).unwrap_or_else(|| vec![PathBuf::from(DEFAULT_MODEL)]);
        let names = non_empty(args.served_model_names).or(non_empty(file.served_model_names)).unwrap_or_default();
        if names.len() > paths.len() {
            bail!("{} --served-model-name values for {} --model files", names.len(), paths.len());
        }
        let models: Vec<BaseModel> = paths
            .iter()
            .enumerate()
            .map(|(i, path)| BaseModel {
                id: names.get(i).cloned().unwrap_or_else(|| default_model_id(path)),
                path: path.clone(),
            })
            .collect();
        let mut ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            bail!("two models are served under the same id; use --served-model-name");
        }
        let max_waiting = args.max_waiting.or(file.max_waiting).unwrap_or(256).max(1);
        Ok(ServeConfig {
            host: args.host.or(file.host).unwrap_or_else(|| "127.0.0.1".into()),
            port: args.port.or(file.port).unwrap_or(8000),
            data_dir: args.data_dir.or(file.data_dir).unwrap_or_else(|| PathBuf::from("data")),
            database_url: args.database_url.or(file.database_url),
            blob_store: args.blob_store.or(file.blob_store),
            role: match args.role.or(file.role) {
                None => Role::All,
                Some(r) => Role::parse(&r)
                    .ok_or_else(|| anyhow::anyhow!("--role {r:?}: expected all, api, inference or trainer"))?,
            },
            node_name: args.node_name.or(file.node_name).filter(|n| !n.trim().is_empty()),
            advertise_url: args.advertise_url.or(file.advertise_url).filter(|u| !u.trim().is_empty()),
            models,
            api_key: args.api_key.or(file.api_key).filter(|k| !k.is_empty()),
            max_body_bytes: args.max_body_bytes.or(file.max_body_bytes).unwrap_or(64 << 20),
            priority_scheduling: match args.scheduling.or(file.scheduling).as_deref() {
                None | Some("priority") => true,
                Some("fcfs") => false,
                Some(other) => bail!("--scheduling must be `priority` or `fcfs`, not {other:?}"),
            },
            reasoning_parser: match args.reasoning_parser.or(file.reasoning_parser) {
                None => None,
                Some(name) => ReasoningParser::from_name(&name).map_err(anyhow::Error::msg)?,
            },
            max_num_seqs: args.max_num_seqs.or(file.max_num_seqs).unwrap_or(32).max(1),
            max_waiting,
            per_entity_limit: args.per_entity_limit.or(file.per_entity_limit).unwrap_or(max_waiting / 4).max(1),
            kv_cache_bytes: args.kv_cache_mib.or(file.kv_cache_mib).map(|m| m.max(1) << 20),
            adapter_cache_bytes: args
                .adapter_cache_mib
                .or(file.adapter_cache_mib)
                .map_or(tandem_engine::adapter_cache::DEFAULT_BYTES, |m| (m.min(1 << 40) as usize) << 20),
            max_model_len: args.max_model_len.or(file.max_model_len).map(|n| n.max(16)),
            max_num_batched_tokens: args.max_num_batched_tokens.or(file.max_num_batched_tokens).map(|n| n.max(1)),
            prefix_cache_tokens: args.prefix_cache_tokens.or(file.prefix_cache_tokens),
            engine_spin_us: match args.engine_spin_us.or(file.engine_spin_us) {
                Some(us) if us > 1_000_000 => anyhow::bail!("--engine-spin-us {us}: expected at most 1000000"),
                us => us,
            },
            cpu: match args.cpu.or(file.cpu) {
                None => tandem_model::kernels::cpu::Tier::Avx512,
                Some(t) => tandem_model::kernels::cpu::Tier::parse(&t)
                    .with_context(|| format!("--cpu {t:?}: expected `avx512`, `avxvnni`, `avx2` or `scalar`"))?,
            },
            job_max_attempts: args.job_max_attempts.or(file.job_max_attempts).unwrap_or(3).max(1),
            job_lease: match args.job_lease_seconds.or(file.job_lease_seconds).unwrap_or(30.0) {
                s if s.is_finite() && (0.3..=86_400.0).contains(&s) => std::time::Duration::from_secs_f64(s),
                s => anyhow::bail!("--job-lease-seconds {s}: expected 0.3 to 86400"),
            },
            max_training_runs: args.max_training_runs.or(file.max_training_runs).unwrap_or(4).max(1),
            train_recompute_tokens: args.train_recompute_tokens.or(file.train_recompute_tokens),
            max_parked_training_runs: match args.max_parked_training_runs.or(file.max_parked_training_runs) {
                // Each is a waiting thread of the blocking pool, with its job's rows in memory.
                Some(n) if n > 256 => bail!("--max-parked-training-runs {n}: expected 0 to 256"),
                n => n.unwrap_or(12),
            },
            max_tinker_models: args.max_tinker_models.or(file.max_tinker_models).unwrap_or(8).max(1),
            tinker_memory: match args.tinker_memory_mib.or(file.tinker_memory_mib).unwrap_or(2048) {
                m if (1..=1 << 24).contains(&m) => m << 20,
                m => bail!("--tinker-memory-mib {m}: expected 1 to 16777216"),
            },
            tinker_idle: match args.tinker_idle_seconds.or(file.tinker_idle_seconds).unwrap_or(600.0) {
                s if (1.0..=86_400.0).contains(&s) => std::time::Duration::from_secs_f64(s),
                s => bail!("--tinker-idle-seconds {s}: expected 1 to 86400"),
            },
            tinker_seq_gap: match args.tinker_seq_gap_seconds.or(file.tinker_seq_gap_seconds).unwrap_or(600.0) {
                s if (0.1..=86_400.0).contains(&s) => std::time::Duration::from_secs_f64(s),
                s => bail!("--tinker-seq-gap-seconds {s}: expected 0.1 to 86400"),
            },
            tinker_heartbeat: match args.tinker_heartbeat_seconds.or(file.tinker_heartbeat_seconds).unwrap_or(60.0) {
                s if (1.0..=86_400.0).contains(&s) => std::time::Duration::from_secs_f64(s),
                s => bail!("--tinker-heartbeat-seconds {s}: expected 1 to 86400"),
            },
            max_job_tokens: args.max_job_tokens.or(file.max_job_tokens).unwrap_or(1 << 20).max(1),
            storage_quota: storage_quota(args.storage_quota_mib.or(file.storage_quota_mib))?,
            db_pool: tandem_store::PoolSettings {
                size: match args.db_pool_size.or(file.db_pool_size) {
                    Some(n) if !(1..=1000).contains(&n) => bail!("--db-pool-size {n}: expected 1 to 1000"),
                    n => n,
                },
                acquire_timeout: match args.db_acquire_timeout.or(file.db_acquire_timeout) {
                    Some(s) if !(0.1..=600.0).contains(&s) => {
                        bail!("--db-acquire-timeout {s}: expected 0.1 to 600 seconds")
                    }
                    s => s.map(std::time::Duration::from_secs_f64),
                },
                statement_timeout: match args.db_statement_timeout.or(file.db_statement_timeout) {
                    Some(s) if !(0.0..=86_400.0).contains(&s) => {
                        bail!("--db-statement-timeout {s}: expected 0 (no limit) to 86400 seconds")
                    }
                    s => s.map(std::time::Duration::from_secs_f64),
                },
            },
            blob_retry: match args.blob_retry_seconds.or(file.blob_retry_seconds).unwrap_or(60.0) {
                s if (0.0..=3600.0).contains(&s) => std::time::Duration::from_secs_f64(s),
                s => bail!("--blob-retry-seconds {s}: expected 0 to 3600"),
            },
            lora_root: args.lora_root.or(file.lora_root),
            quantize: match args.quantize.or(file.quantize) {
                None => tandem_model::Quantize::default(),
                Some(q) => tandem_model::Quantize::parse(&q)
                    .ok_or_else(|| anyhow::anyhow!("--quantize {q:?}: expected q8_0, q4_1, q4_k or none"))?,
            },
        })
    }
}

fn non_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

/// The bundled SmolLM2 GGUF is served under its Hugging Face id; any other file under its stem,
/// a checkpoint directory under its name.
pub(crate) fn default_model_id(path: &Path) -> String {
    let name = if path.is_dir() { path.file_name() } else { path.file_stem() };
    let stem = name.map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    if stem.to_ascii_lowercase().starts_with("smollm2-135m-instruct") {
        BUNDLED_MODEL_ID.to_string()
    } else {
        stem
    }
}

/// `--storage-quota-mib` in bytes.
pub fn storage_quota(mib: Option<u64>) -> anyhow::Result<Option<i64>> {
    match mib {
        None => Ok(None),
        Some(m) if m <= 1 << 33 => Ok(Some((m << 20) as i64)),
        Some(m) => bail!("--storage-quota-mib {m}: expected 0 to 8589934592"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_file_and_flags_layer() {
        let c = ServeConfig::resolve(ServeArgs::default()).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 8000));
        assert_eq!(c.models, vec![BaseModel { id: BUNDLED_MODEL_ID.into(), path: DEFAULT_MODEL.into() }]);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tandem.toml");
        std::fs::write(&file, "port = 9000\nhost = \"0.0.0.0\"\nmodels = [\"a/tiny.gguf\"]\n").unwrap();
        let args = ServeArgs { config: Some(file.clone()), port: Some(9100), ..Default::default() };
        let c = ServeConfig::resolve(args).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 9100));
        assert_eq!(c.models[0].id, "tiny");

        std::fs::write(&file, "prot = 1\n").unwrap();
        assert!(ServeConfig::resolve(ServeArgs { config: Some(file), ..Default::default() }).is_err());
    }

    /// The README's configuration table and TOML key list are this struct: every flag with its
    /// environment variable, every TOML key, and nothing else.
    #[test]
    fn the_readme_documents_every_setting() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ServeArgs,
        }
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
        let rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `--")).collect();
        let keys_start = readme.find("TOML keys:").expect("the README lists the TOML keys");
        let keys = &readme[keys_start..keys_start + readme[keys_start..].find(". ").unwrap()];
        let mut flags = Vec::new();
        for arg in Cli::command().get_arguments() {
            let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) else { continue };
            let env = env.to_string_lossy();
            flags.push(format!("--{long}"));
            assert!(
                rows.iter().any(|r| r.starts_with(&format!("| `--{long}`")) && r.contains(&format!("`{env}`"))),
                "README has no row for --{long} ({env})"
            );
            let key = arg.get_id().as_str();
            if key != "config" {
                assert!(keys.contains(&format!("`{key}`")), "README lists no TOML key `{key}`");
            }
        }
        for row in rows {
            let flag = row.split('`').nth(1).unwrap();
            assert!(flags.iter().any(|f| f == flag), "README documents {flag}, which tandem serve does not have");
        }
    }

    #[test]
    fn served_names_pair_with_models() {
        let args = ServeArgs {
            models: vec!["x.gguf".into(), "y.gguf".into()],
            served_model_names: vec!["org/x".into()],
            ..Default::default()
        };
        let c = ServeConfig::resolve(args).unwrap();
        assert_eq!(c.models[0].id, "org/x");
        assert_eq!(c.models[1].id, "y");
        let args = ServeArgs { models: vec!["a/m.gguf".into(), "b/m.gguf".into()], ..Default::default() };
        assert!(ServeConfig::resolve(args).is_err());
    }
}
