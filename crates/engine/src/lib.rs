//! tandem's inference engine: implements `core::inference::InferenceBackend` for one or more base
//! models, each a `ServedModel` (`served`) with its own continuous-batching loop thread.
//!
//! - [`tokenizer`]: the GGUF tokenizer and exact incremental detokenization.
//! - [`template`]: chat templates (minijinja).
//! - [`sampler`], [`stop`], [`scheduler`]: pure rules, unit-tested by hand.
//! - [`prefix`]: the prefix cache.
//! - [`grammar`]: structured outputs (llguidance), one parser factory per model.
//! - `engine`, `sequence`: the loop and the per-choice state machine.
//! - [`metrics`]: Prometheus series.
//! - [`inspect`]: what a model file is, and the checks made before its weights load.
//! - [`tokenizer_dir`]: a model's tokenizer as files a Hugging Face client loads offline.

pub mod adapter_cache;
pub mod adapter_loads;
mod engine;
pub mod fair;
pub mod grammar;
pub mod inspect;
mod lark;
pub mod metrics;
pub mod prefix;
mod pretok;
pub mod sampler;
pub mod scheduler;
mod sequence;
mod served;
pub mod share;
mod spm;
pub mod stop;
pub mod template;
pub mod tokenizer;
pub mod tokenizer_dir;

pub use engine::EngineConfig;

use engine::EngineLoop;
use served::{Served, Shared};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tandem_core::inference::{BaseModelInfo, InferenceBackend, ModelHandle};
use tandem_core::telemetry::prometheus_client::registry::Registry;
use tandem_model::{Llama, TokenizerMeta};
use template::jail::TemplateJail;
use tokenizer::TextTokenizer;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] tandem_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    #[error("{0}")]
    Template(#[from] template::TemplateError),
}

pub struct Engine {
    slots: Vec<Arc<Served>>,
    shared: Arc<Shared>,
}

impl Engine {
    pub fn new() -> Self {
        Engine { slots: Vec::new(), shared: Arc::new(Shared::default()) }
    }

    /// Keeps loaded LoRA adapters within `bytes` together (`adapter_cache`; default 1 GiB).
    pub fn set_adapter_cache_bytes(&mut self, bytes: usize) {
        self.shared.adapters.set_budget(bytes);
    }

    /// Renders request-supplied chat templates in child processes (for every served model,
    /// whenever it was added). Only the first call counts.
    pub fn set_template_jail(&mut self, jail: TemplateJail) {
        let _ = self.shared.jail.set(jail);
    }

    /// Loads a GGUF file or a Hugging Face checkpoint directory and starts its loop.
    pub fn add_path(
        &mut self,
        id: &str,
        path: &Path,
        quantize: tandem_model::Quantize,
        config: EngineConfig,
    ) -> Result<(), EngineError> {
        // Refuse what cannot be served before reading any weights. The tokenizer built for the
        // check is the one served: building it is, after the weights, a model's largest
        // allocation (~200 MB of temporaries for a 151,936-token vocabulary), so it is built
        // once, and its temporaries go back to the system before the weights come in rather
        // than adding to the peak (issue 31: peak RSS at or below llama.cpp's).
        // Every temporary of loading goes back to the system as it is freed, not a second later.
        let purging = tandem_model::allocator::PurgeAtOnce::begin();
        let tok = inspect::preflight(path)?.tokenizer;
        tandem_model::allocator::release_freed_memory();
        let loaded = tandem_model::load_model(path, quantize)?;
        drop(purging);
        self.add_model_with(id, &path.display().to_string(), loaded.model, &loaded.tokenizer, tok, config)
    }

    /// The weights served as `id`, for the trainer to read in place (one copy for both).
    pub fn llama(&self, id: &str) -> Option<Arc<Llama>> {
        self.slots.iter().find(|s| s.info.id == id).map(|s| s.model.clone())
    }

    /// Serves an already built model (tests use tiny random ones).
    pub fn add_model(
        &mut self,
        id: &str,
        path: &str,
        model: Llama,
        meta: &TokenizerMeta,
        config: EngineConfig,
    ) -> Result<(), EngineError> {
        let tok = TextTokenizer::from_meta(meta)?;
        self.add_model_with(id, path, model, meta, tok, config)
    }

    fn add_model_with(
        &mut self,
        id: &str,
        path: &str,
        mut model: Llama,
        meta: &TokenizerMeta,
        mut tok: TextTokenizer,
        config: EngineConfig,
    ) -> Result<(), EngineError> {
        if let Some(n) = config.max_model_len {
            // Only ever shorter: positions past the model's own context have no trained meaning.
            model.config.context_len = model.config.context_len.min(n.max(1));
        }
        let (template, template_source) =
            tokenizer_dir::served_template(meta.chat_template.as_deref(), model.config.arch, &mut tok)?;
        let tok = Arc::new(tok);
        let info = BaseModelInfo {
            id: id.to_string(),
            path: path.to_string(),
            context_len: model.config.context_len,
            vocab_size: model.config.vocab,
            eos_token_id: tok.eos_id,
        };
        tracing::info!(model = id, weights_mb = model.weight_bytes() / (1 << 20), "model loaded");
        let model = Arc::new(model);
        let metrics = Arc::new(self.shared.families.for_model(id, self.slots.len()));
        metrics.beat();
        let (tx, rx) = std::sync::mpsc::channel();
        let (max_waiting, max_seqs, kv_tokens) = (config.max_waiting, config.max_seqs, config.kv_tokens(&model.config));
        tracing::info!(model = id, kv_tokens, kv_cache_mb = config.kv_cache_bytes >> 20, "KV cache budget");
        self.shared.families.describe_cache(self.slots.len(), kv_tokens);
        let lp = EngineLoop::new(model.clone(), tok.clone(), config, rx, metrics.clone());
        std::thread::Builder::new()
            .name(format!("engine-{}", self.slots.len()))
            .spawn(move || lp.run_on_team())
            .map_err(|e| {
                EngineError::Model(tandem_model::ModelError::Unsupported(format!("cannot start engine thread: {e}")))
            })?;
        let grammars = grammar::Grammars::new(tok.clone());
        self.slots.push(Arc::new(Served {
            info,
            model,
            tok,
            template,
            template_source,
            grammars,
            tx: Mutex::new(tx),
            metrics,
            max_waiting,
            max_seqs,
            kv_tokens,
            shared: self.shared.clone(),
        }));
        Ok(())
    }
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl InferenceBackend for Engine {
    fn models(&self) -> Vec<ModelHandle> {
        self.slots.iter().map(|s| s.clone() as ModelHandle).collect()
    }

    fn forget_adapter(&self, checkpoint_id: &str) {
        self.shared.adapters.forget(checkpoint_id);
    }

    fn healthy(&self) -> bool {
        // The loop goes round at least every 500 ms when idle; a step of a few seconds is normal
        // under load, a minute without one is a wedged engine.
        self.slots.iter().all(|s| !s.metrics.is_stopped() && s.metrics.since_heartbeat_ms() < 60_000)
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.shared.families.register(registry);
    }
}
