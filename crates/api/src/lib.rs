//! tandem's HTTP surface. `app(state)` builds the whole router; tests call it without a socket.
//!
//! - [`auth`]: API keys and the bearer-token middleware.
//! - [`body`]: JSON bodies, path ids, page queries.
//! - [`error`]: the one mapping from failures to responses.
//! - [`preview`]: the `/v1/preview` area (models, checkpoints, logs, training jobs, events).
//! - [`health`]: `GET /health` and `GET /v1/system-check`.
//! - [`dashboard`]: the web pages at `/` (static, built in; they read the JSON routes).
//! - [`tinker`]: the Tinker training API (`/api/v1/`): sessions, models, forward_backward,
//!   optim_step, futures.
//!
//! This crate never sees a tensor: training is reached through the store (jobs are rows the
//! worker picks up) and a wake-up handle.

pub mod auth;
pub mod body;
pub mod dashboard;
pub mod error;
pub mod health;
pub mod heavy;
pub mod limiter;
pub mod openai;
pub mod openapi;
pub mod preview;
pub mod telemetry;
pub mod tinker;
pub mod trajectory_view;
pub(crate) mod views;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, Request};
use axum::Router;
use std::sync::Arc;
use std::time::Duration;
use tandem_core::health::Heartbeat;
use tandem_core::inference::{ModelHandle, ReasoningParser, SharedBackend};
use tandem_core::telemetry::TrainingMetrics;
use tandem_core::trajectory::TrajectoryLimits;
use tandem_store::{Checkpoints, Store};
use tokio::sync::Notify;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnFailure, TraceLayer};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

/// Size limits applied at the edge, before any work.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub trajectories: TrajectoryLimits,
    /// Most steps one checkpoint deletion may name.
    pub max_delete_steps: usize,
    /// Training jobs (RL and SFT) one entity may have queued or running; more are a 429. The
    /// queue is served round robin between entities, and this keeps one entity from filling it.
    pub max_pending_jobs: i64,
    /// Most tokens one training job may train on (all its sequences' tokens); more is a 422 at
    /// creation. With the trainer time-sliced between entities this bounds a job's length, not
    /// another entity's wait.
    pub max_job_tokens: u64,
    /// How long Tinker sessions live idle and calls wait at a `seq_id` gap.
    pub tinker_waits: tandem_tinker::Waits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 64 << 20,
            trajectories: TrajectoryLimits::default(),
            max_delete_steps: 10_000,
            max_pending_jobs: 16,
            max_job_tokens: 1 << 20,
            tinker_waits: tandem_tinker::Waits::default(),
        }
    }
}

/// What the api needs from the rest of the server.
pub struct AppConfig {
    pub store: Arc<dyn Store>,
    pub checkpoints: Checkpoints,
    pub static_keys: auth::StaticKeys,
    /// Ids of the base models this server serves; the first is the default.
    pub served_models: Vec<String>,
    pub limits: Limits,
    /// Woken when a training job is queued.
    pub jobs_waker: Arc<Notify>,
    /// The inference engine; `None` serves only the preview area (chat answers 503).
    pub backend: Option<SharedBackend>,
    /// Requests one entity may have in flight on the inference routes (429 beyond).
    pub per_entity_limit: usize,
    /// `fcfs` refuses a non-zero `priority`, as the interface requires of such servers.
    pub priority_scheduling: bool,
    /// `--reasoning-parser`: `<think>...</think>` output goes to `message.reasoning`.
    pub reasoning_parser: Option<ReasoningParser>,
    /// The training worker's heartbeat; `None` where no worker runs (system-check says so).
    pub training_heartbeat: Option<Arc<Heartbeat>>,
    /// The training worker's metrics, for `GET /metrics`; `None` where no worker runs.
    pub training_metrics: Option<Arc<TrainingMetrics>>,
    /// `--lora-root`, canonical: turns on `/v1/load_lora_adapter` for adapters under it.
    pub lora_root: Option<std::path::PathBuf>,
    /// Each served model's tokenizer directory (`tokenizer.json` and `tokenizer_config.json`),
    /// named to Tinker clients by `get_info`.
    pub tokenizer_dirs: std::collections::BTreeMap<String, std::path::PathBuf>,
    /// The Tinker training sessions; `None` where this node does not train.
    pub tinker: Option<Arc<dyn tandem_core::tinker::TinkerTrainer>>,
    /// Set while an operator drains this node: `/health` answers 503 so that load balancers
    /// send it nothing new (it still answers what reaches it).
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// This node's id in the node registry when it shares its store with other nodes (a
    /// cluster): Tinker sessions are then held by one node each and their calls forwarded there
    /// (`tinker::front`). `None` alone on a store.
    pub node_id: Option<String>,
}

/// Shared, cheap-to-clone handler state.
#[derive(Clone)]
pub struct AppState(
    Arc<AppConfig>,
    Arc<limiter::EntityLimiter>,
    Arc<[ModelHandle]>,
    Arc<telemetry::Telemetry>,
    Arc<openai::lora::LoraRegistry>,
    Arc<health::StoreProbe>,
    Arc<tinker::TinkerState>,
    Arc<openai::tokenizer_files::TarCache>,
    Arc<openai::resolve::LastKnown>,
    Arc<tandem_tinker::Catalog>,
    Arc<tinker::front::Front>,
);

impl AppState {
    pub fn new(config: AppConfig) -> Self {
        let limiter = Arc::new(limiter::EntityLimiter::new(config.per_entity_limit));
        let models = config.backend.as_ref().map(|b| b.models()).unwrap_or_default().into();
        let telemetry =
            Arc::new(telemetry::Telemetry::new(config.backend.as_ref(), config.training_metrics.as_deref()));
        let tinker = tinker::TinkerState::new(config.limits.tinker_waits);
        let catalog = tandem_tinker::Catalog::new(config.store.clone(), config.checkpoints.clone());
        AppState(
            Arc::new(config),
            limiter,
            models,
            telemetry,
            Arc::default(),
            Arc::default(),
            Arc::new(tinker),
            Arc::default(),
            Arc::default(),
            Arc::new(catalog),
            Arc::default(),
        )
    }

    /// This node's registry id, in a cluster.
    pub(crate) fn node_id(&self) -> Option<&str> {
        self.0.node_id.as_deref()
    }

    /// The client that forwards Tinker calls to the node holding their session.
    pub(crate) fn front(&self) -> &tinker::front::Front {
        &self.10
    }

    /// What Tinker runs keep beyond their sessions, in the store (any node reads it).
    pub(crate) fn catalog(&self) -> &tandem_tinker::Catalog {
        &self.9
    }

    /// The Tinker routes' sessions, models and futures.
    pub(crate) fn tinker(&self) -> &Arc<tinker::TinkerState> {
        &self.6
    }

    /// What trained models' names last resolved to, for serving through a database outage.
    pub(crate) fn last_known(&self) -> &openai::resolve::LastKnown {
        &self.8
    }

    /// `GET /v1/tokenizer`'s archives, built once per model and layout.
    pub(crate) fn tokenizer_tars(&self) -> &openai::tokenizer_files::TarCache {
        &self.7
    }

    pub(crate) fn tokenizer_dir(&self, model: &str) -> Option<&std::path::Path> {
        self.0.tokenizer_dirs.get(model).map(|p| p.as_path())
    }

    pub(crate) fn tinker_trainer(&self) -> Option<Arc<dyn tandem_core::tinker::TinkerTrainer>> {
        self.0.tinker.clone()
    }

    /// The store's last health probe (`/health` answers from it).
    pub(crate) fn probe(&self) -> &Arc<health::StoreProbe> {
        &self.5
    }

    /// Adapters loaded at run time (`/v1/load_lora_adapter`), per entity.
    pub fn loras(&self) -> &openai::lora::LoraRegistry {
        &self.4
    }

    pub fn lora_root(&self) -> Option<&std::path::Path> {
        self.0.lora_root.as_deref()
    }

    pub(crate) fn telemetry(&self) -> &telemetry::Telemetry {
        &self.3
    }

    pub fn backend(&self) -> Option<&SharedBackend> {
        self.0.backend.as_ref()
    }

    /// The engine's served base models (none without an engine), the default first.
    pub fn models(&self) -> &[ModelHandle] {
        &self.2
    }

    /// The served base model of this id.
    pub fn model(&self, id: &str) -> Option<&ModelHandle> {
        self.2.iter().find(|m| m.info().id == id)
    }

    pub fn limiter(&self) -> &Arc<limiter::EntityLimiter> {
        &self.1
    }

    pub fn priority_scheduling(&self) -> bool {
        self.0.priority_scheduling
    }

    pub fn reasoning_parser(&self) -> Option<ReasoningParser> {
        self.0.reasoning_parser
    }

    pub fn store(&self) -> &dyn Store {
        self.0.store.as_ref()
    }

    pub fn checkpoints(&self) -> &Checkpoints {
        &self.0.checkpoints
    }

    pub fn static_keys(&self) -> &auth::StaticKeys {
        &self.0.static_keys
    }

    pub fn served_models(&self) -> &[String] {
        &self.0.served_models
    }

    pub fn limits(&self) -> &Limits {
        &self.0.limits
    }

    pub fn draining(&self) -> bool {
        self.0.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn training_heartbeat(&self) -> Option<&Heartbeat> {
        self.0.training_heartbeat.as_deref()
    }

    pub fn wake_jobs(&self) {
        self.0.jobs_waker.notify_one();
    }
}

/// The whole router with its middleware: request ids, tracing, body limit, panic guard.
pub fn app(state: AppState) -> Router {
    let request_id = HeaderName::from_static("x-request-id");
    let max_body = state.limits().max_body_bytes;
    let (router, document) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(health::router())
        .nest("/v1/preview", preview::router(state.clone()))
        .merge(openai::router(state.clone()))
        .nest("/api/v1", tinker::router(state.clone()))
        .split_for_parts();
    // Rendered once: the document is fixed for the process's life.
    let document: Arc<str> = openapi::render(&document, state.served_models()).into();
    router
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let body = document.clone();
                async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], body.to_string()) }
            }),
        )
        .merge(dashboard::router())
        .fallback(|| async { error::PreviewError(error::ApiError::new(error::ErrorKind::NotFound, "Not Found")) })
        .with_state(state.clone())
        .layer(DefaultBodyLimit::max(max_body))
        .layer(CatchPanicLayer::custom(|_| {
            error::ApiError::new(error::ErrorKind::Internal, "internal server error").into_preview_response()
        }))
        // Per route (`Router::layer` wraps each route after routing, so the route template is
        // known), outside the panic guard so that a caught panic counts as the 500 it became.
        .layer(axum::middleware::from_fn_with_state(state.clone(), telemetry::track))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request<_>| {
                    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
                })
                // A 503 for a full queue is the server working as designed: one line per
                // rejected request at ERROR would flood the log under exactly the load it sheds.
                // Internal errors are logged where they happen.
                .on_failure(DefaultOnFailure::new().level(tracing::Level::WARN)),
        )
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
}

/// How long `/health` waits for the store before calling it unavailable.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
