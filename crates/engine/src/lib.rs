//! tandem's inference engine: implements `core::inference::InferenceBackend` for one or more base
//! models, each with its own continuous-batching loop thread.
//!
//! - [`tokenizer`]: the GGUF tokenizer and exact incremental detokenization.
//! - [`template`]: chat templates (minijinja).
//! - [`sampler`], [`stop`], [`scheduler`]: pure rules, unit-tested by hand.
//! - [`prefix`]: the prefix cache.
//! - `engine`, `sequence`: the loop and the per-choice state machine.
//! - [`metrics`]: Prometheus series.

mod engine;
mod grammar;
mod lark;
pub mod metrics;
pub mod prefix;
pub mod sampler;
pub mod scheduler;
mod sequence;
pub mod stop;
pub mod template;
pub mod tokenizer;

pub use engine::EngineConfig;

use engine::{EngineLoop, Job};
use metrics::EngineMetrics;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tandem_core::inference::{
    AdapterRef, BaseModelInfo, ChatRender, GenerateRequest, InferEvent, InferenceBackend, SubmitError,
};
use tandem_model::{Llama, LoraAdapter, TokenizerMeta};
use template::jail::{JailJob, TemplateJail};
use template::{ChatTemplate, RenderInputs};
use tokenizer::TextTokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] tandem_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    #[error("{0}")]
    Template(#[from] template::TemplateError),
}

/// One served base model and its loop.
struct Slot {
    info: BaseModelInfo,
    model: Arc<Llama>,
    tok: Arc<TextTokenizer>,
    template: Option<ChatTemplate>,
    grammars: grammar::Grammars,
    tx: Mutex<std::sync::mpsc::Sender<Job>>,
    metrics: Arc<EngineMetrics>,
    max_waiting: usize,
    max_seqs: usize,
    kv_tokens: usize,
}

/// Adapters recently used, kept loaded (bounded).
const ADAPTER_CACHE: usize = 16;

/// One checkpoint's adapter, loaded once. Requests for it wait on its own lock while it loads,
/// never on the cache's: loading one checkpoint holds up no request for another.
type AdapterSlot = Arc<Mutex<Option<Arc<LoraAdapter>>>>;

pub struct Engine {
    slots: Vec<Slot>,
    /// Checkpoint id -> its slot and when it was last used (the cache is bounded, LRU).
    adapters: Mutex<HashMap<String, (AdapterSlot, Instant)>>,
    /// Where request-supplied chat templates render; without one (tests, library use) they
    /// render in-process under the fuel and output limits only.
    jail: Option<TemplateJail>,
}

impl Engine {
    pub fn new() -> Self {
        Engine { slots: Vec::new(), adapters: Mutex::new(HashMap::new()), jail: None }
    }

    /// Renders request-supplied chat templates in child processes from now on.
    pub fn set_template_jail(&mut self, jail: TemplateJail) {
        self.jail = Some(jail);
    }

    /// Loads a GGUF file and starts its loop.
    pub fn add_gguf(&mut self, id: &str, path: &Path, config: EngineConfig) -> Result<(), EngineError> {
        let loaded = tandem_model::load_gguf(path)?;
        self.add_model(id, &path.display().to_string(), loaded.model, &loaded.tokenizer, config)
    }

    /// Serves an already built model (tests use tiny random ones).
    pub fn add_model(
        &mut self,
        id: &str,
        path: &str,
        mut model: Llama,
        meta: &TokenizerMeta,
        config: EngineConfig,
    ) -> Result<(), EngineError> {
        if let Some(n) = config.max_model_len {
            // Only ever shorter: positions past the model's own context have no trained meaning.
            model.config.context_len = model.config.context_len.min(n.max(1));
        }
        let tok = Arc::new(TextTokenizer::from_meta(meta)?);
        let template = meta.chat_template.as_deref().map(ChatTemplate::new).transpose()?;
        let info = BaseModelInfo {
            id: id.to_string(),
            path: path.to_string(),
            context_len: model.config.context_len,
            vocab_size: model.config.vocab,
            eos_token_id: tok.eos_id,
        };
        tracing::info!(model = id, weights_mb = model.weight_bytes() / (1 << 20), "model loaded");
        let model = Arc::new(model);
        let metrics = Arc::new(EngineMetrics::default());
        metrics.beat();
        let (tx, rx) = std::sync::mpsc::channel();
        let (max_waiting, max_seqs, kv_tokens) = (config.max_waiting, config.max_seqs, config.kv_tokens(&model.config));
        tracing::info!(model = id, kv_tokens, kv_cache_mb = config.kv_cache_bytes >> 20, "KV cache budget");
        let lp = EngineLoop::new(model.clone(), tok.clone(), config, rx, metrics.clone());
        std::thread::Builder::new().name(format!("engine-{}", self.slots.len())).spawn(move || lp.run()).map_err(
            |e| EngineError::Model(tandem_model::ModelError::Unsupported(format!("cannot start engine thread: {e}"))),
        )?;
        let grammars = grammar::Grammars::new(tok.clone());
        self.slots.push(Slot {
            info,
            model,
            tok,
            template,
            grammars,
            tx: Mutex::new(tx),
            metrics,
            max_waiting,
            max_seqs,
            kv_tokens,
        });
        Ok(())
    }

    fn slot(&self, base: usize) -> Result<&Slot, String> {
        self.slots.get(base).ok_or_else(|| format!("no base model {base}"))
    }

    fn adapter(&self, a: &AdapterRef, base: &Slot) -> Result<Arc<LoraAdapter>, SubmitError> {
        let slot = {
            let mut cache = self.adapters.lock().unwrap_or_else(|e| e.into_inner());
            match cache.get_mut(&a.checkpoint_id) {
                Some((slot, used)) => {
                    *used = Instant::now();
                    slot.clone()
                }
                None => {
                    if cache.len() >= ADAPTER_CACHE {
                        if let Some(oldest) = cache.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k.clone()) {
                            cache.remove(&oldest);
                        }
                    }
                    let slot = AdapterSlot::default();
                    cache.insert(a.checkpoint_id.clone(), (slot.clone(), Instant::now()));
                    slot
                }
            }
        };
        let mut loaded = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(adapter) = loaded.as_ref() {
            return Ok(adapter.clone());
        }
        // The error names files on the server: logged, not sent. The slot stays empty, so a
        // later request tries again.
        let adapter = LoraAdapter::load(&a.path, &base.model.config).map_err(|e| {
            tracing::error!(checkpoint = %a.checkpoint_id, error = %e, "cannot load a checkpoint's adapter");
            SubmitError::Invalid("this checkpoint's adapter cannot be loaded (the server logged why)".into())
        })?;
        let adapter = Arc::new(adapter);
        *loaded = Some(adapter.clone());
        Ok(adapter)
    }
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    /// The chat rendered to text with the request's template or the model's.
    fn render_text(&self, slot: &Slot, chat: &ChatRender) -> Result<String, String> {
        let inputs = RenderInputs {
            add_generation_prompt: chat.add_generation_prompt,
            continue_final_message: chat.continue_final_message,
            tools: chat.tools.clone(),
            documents: chat.documents.clone(),
            reasoning_effort: chat.reasoning_effort.clone(),
            kwargs: chat.kwargs.clone(),
            bos_token: slot.tok.bos_id.map(|b| slot.tok.token_text(b)).unwrap_or_default(),
            eos_token: slot.tok.token_text(slot.tok.eos_id),
        };
        let own;
        let template = match (&chat.chat_template, &self.jail) {
            // A request's own template: in the jail when there is one (see `template::jail`).
            (Some(source), Some(jail)) => {
                let job = JailJob { source: source.clone(), messages: chat.messages.clone(), inputs };
                return jail.render(&job, &chat.tenant).map_err(|e| e.to_string());
            }
            (Some(source), None) => {
                own = ChatTemplate::new(source).map_err(|e| e.to_string())?;
                &own
            }
            (None, _) => slot.template.as_ref().ok_or("this model has no chat template; pass `chat_template`")?,
        };
        template.render(&chat.messages, &inputs).map_err(|e| e.to_string())
    }
}

impl InferenceBackend for Engine {
    fn models(&self) -> Vec<BaseModelInfo> {
        self.slots.iter().map(|s| s.info.clone()).collect()
    }

    fn renders_tools(&self, base: usize, chat: &ChatRender) -> bool {
        // A template that uses `tools` puts the tool's name into the prompt; one that ignores them
        // (SmolLM2's) renders the same text with or without.
        const PROBE: &str = "tandem_probe_tool_7f3a";
        let Ok(slot) = self.slot(base) else { return false };
        let probe = ChatRender {
            messages: vec![serde_json::json!({"role": "user", "content": "hi"})],
            add_generation_prompt: true,
            tools: Some(serde_json::json!([{"type": "function", "function": {"name": PROBE, "description": PROBE,
                "parameters": {"type": "object", "properties": {}}}}])),
            chat_template: chat.chat_template.clone(),
            kwargs: chat.kwargs.clone(),
            ..ChatRender::default()
        };
        self.render_text(slot, &probe).is_ok_and(|t| t.contains(PROBE))
    }

    fn render_chat(&self, base: usize, chat: &ChatRender) -> Result<Vec<u32>, String> {
        let slot = self.slot(base)?;
        let text = self.render_text(slot, chat)?;
        self.tokenize(base, &text, chat.add_special_tokens)
    }

    fn tokenize(&self, base: usize, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        let slot = self.slot(base)?;
        // Tokenizing costs about 100 bytes of memory per byte of text. A text this long cannot
        // fit the context whatever its tokens (each stands for at most `max_token_bytes`), so it
        // is refused before the tokenizer sees it (twice the bound, to allow for normalisation).
        let limit = 2 * slot.info.context_len * slot.tok.max_token_bytes();
        if text.len() > limit {
            return Err(format!(
                "the text is {} bytes long: more than the model's context of {} tokens can hold (at most {limit} bytes)",
                text.len(),
                slot.info.context_len
            ));
        }
        let mut ids = Vec::new();
        if add_special_tokens && slot.tok.add_bos {
            ids.extend(slot.tok.bos_id);
        }
        ids.extend(slot.tok.encode(text).map_err(|e| e.to_string())?);
        Ok(ids)
    }

    fn detokenize(&self, base: usize, tokens: &[u32], skip_special_tokens: bool) -> Result<String, String> {
        let slot = self.slot(base)?;
        if let Some(bad) = tokens.iter().find(|t| **t as usize >= slot.tok.vocab_size()) {
            return Err(format!("token id {bad} is out of vocabulary"));
        }
        Ok(slot.tok.decode(tokens, skip_special_tokens))
    }

    fn token_texts(
        &self,
        base: usize,
        tokens: &[u32],
        skip_special_tokens: bool,
    ) -> Result<(Vec<String>, String), String> {
        let slot = self.slot(base)?;
        if let Some(bad) = tokens.iter().find(|t| **t as usize >= slot.tok.vocab_size()) {
            return Err(format!("token id {bad} is out of vocabulary"));
        }
        let mut decoder = tokenizer::IncrementalDecoder::default();
        let texts = tokens.iter().map(|t| decoder.push(&slot.tok, *t, skip_special_tokens)).collect();
        Ok((texts, decoder.flush()))
    }

    fn token_text(&self, base: usize, token: u32) -> String {
        self.slot(base).map(|s| s.tok.token_text(token)).unwrap_or_default()
    }

    fn token_id_for_bytes(&self, base: usize, bytes: &[u8]) -> Option<u32> {
        self.slot(base).ok()?.tok.token_id_for_bytes(bytes)
    }

    fn has_capacity(&self, base: usize) -> bool {
        self.slots.get(base).is_some_and(|s| (s.metrics.queued() as usize) < s.max_waiting)
    }

    fn submit(&self, request: GenerateRequest) -> Result<UnboundedReceiver<InferEvent>, SubmitError> {
        let slot = self.slot(request.base).map_err(SubmitError::Invalid)?;
        // A sequence samples from its last prompt position: there must be one.
        if request.prompt.is_empty() {
            return Err(SubmitError::InvalidField {
                field: "messages".into(),
                message: "the prompt is empty: at least one token is needed".into(),
            });
        }
        // Every choice is a sequence, and all of them together must be able to start.
        if request.n > slot.max_seqs {
            return Err(SubmitError::InvalidField {
                field: "n".into(),
                message: format!(
                    "n={} is more than this server runs at once (--max-num-seqs {})",
                    request.n, slot.max_seqs
                ),
            });
        }
        let need = sequence::start_reserve(request.prompt.len(), request.n);
        if need > slot.kv_tokens {
            return Err(SubmitError::InvalidField {
                field: "n".into(),
                message: format!(
                    "{} choices of a {}-token prompt need {need} KV cache positions; this server's budget is {}",
                    request.n,
                    request.prompt.len(),
                    slot.kv_tokens
                ),
            });
        }
        let adapter = request.adapter.as_ref().map(|a| self.adapter(a, slot)).transpose()?;
        // Compiled here, on the caller's thread, so that an invalid constraint is a 400 before
        // anything is queued and a slow compile never holds up the engine's step.
        let matcher = match &request.params.constraint {
            Some(c) => Some(slot.grammars.compile(c).map_err(|e| SubmitError::InvalidField {
                field: c.field.clone(),
                message: format!("invalid {}: {e}", c.field),
            })?),
            None => None,
        };
        let (tx, rx) = unbounded_channel();
        let holds_place = !request.beam_step;
        let job = Job { req: request, adapter, tx, received: Instant::now(), matcher, holds_place };
        // The place is taken last, after everything that can refuse the request.
        if job.holds_place && !slot.metrics.try_enqueue(slot.max_waiting) {
            return Err(SubmitError::Overloaded);
        }
        let holds_place = job.holds_place;
        if slot.tx.lock().unwrap_or_else(|e| e.into_inner()).send(job).is_err() {
            slot.metrics.dequeued(usize::from(holds_place));
            return Err(SubmitError::Stopped);
        }
        Ok(rx)
    }

    fn load_adapter(&self, base: usize, adapter: &AdapterRef) -> Result<(), SubmitError> {
        let slot = self.slot(base).map_err(SubmitError::Invalid)?;
        self.adapter(adapter, slot).map(|_| ())
    }

    fn forget_adapter(&self, checkpoint_id: &str) {
        self.adapters.lock().unwrap_or_else(|e| e.into_inner()).remove(checkpoint_id);
    }

    fn healthy(&self) -> bool {
        // The loop goes round at least every 500 ms when idle; a step of a few seconds is normal
        // under load, a minute without one is a wedged engine.
        self.slots.iter().all(|s| !s.metrics.is_stopped() && s.metrics.since_heartbeat_ms() < 60_000)
    }

    fn metrics_text(&self) -> String {
        self.slots.iter().map(|s| s.metrics.render(&s.info.id)).collect()
    }
}
