//! One served base model as the api holds it (`ServedModel`): template, tokenizer, limits,
//! constraint compiler and adapter loader, and the queue of its engine loop.

use crate::adapter_cache::Ledger;
use crate::adapter_loads::Loads;
use crate::engine::Job;
use crate::grammar::Grammars;
use crate::metrics::EngineMetrics;
use crate::sequence;
use crate::template::jail::{JailJob, TemplateJail};
use crate::template::{ChatTemplate, RenderInputs};
use crate::tokenizer::{IncrementalDecoder, TextTokenizer};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tandem_core::chat::ChatMessage;
use tandem_core::inference::{
    AdapterRef, BaseModelInfo, ChatRender, ExportError, GenerateRequest, InferEvent, InputError, LoraActivity, LoraTag,
    ServedModel, SubmitError, ToolTemplate, ValidRequest,
};
use tandem_core::tool_calls::Family;
use tandem_model::{Llama, LoraAdapter};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// What every served model of one engine shares.
pub(crate) struct Shared {
    pub adapters: AdapterCache,
    /// Every served model's metric series, one family per name.
    pub families: crate::metrics::Families,
    /// Where request-supplied chat templates render; without one (tests, library use) they
    /// render in-process under the fuel and output limits only.
    pub jail: OnceLock<TemplateJail>,
}

impl Default for Shared {
    fn default() -> Self {
        let families = crate::metrics::Families::default();
        let adapters = AdapterCache {
            ledger: Mutex::new(Ledger::new(crate::adapter_cache::DEFAULT_BYTES)),
            reads: Arc::default(),
            loads: families.adapter_loads.clone(),
            bytes: families.adapter_bytes.clone(),
        };
        Shared { adapters, families, jail: OnceLock::new() }
    }
}

/// Adapters recently used, kept loaded within a byte budget (`adapter_cache`).
pub(crate) struct AdapterCache {
    ledger: Mutex<Ledger<LoraAdapter>>,
    /// Where adapters are read from disk: one at a time, in turn by entity (`adapter_loads`).
    reads: Arc<Loads>,
    /// `tandem:lora_adapter_loads` and `tandem:lora_adapter_cache_bytes`.
    loads: prometheus_client::metrics::counter::Counter,
    bytes: prometheus_client::metrics::gauge::Gauge,
}

impl AdapterCache {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger<LoraAdapter>> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the ledger and publishes the bytes it then holds.
    fn update<R>(&self, f: impl FnOnce(&mut Ledger<LoraAdapter>) -> R) -> R {
        let mut ledger = self.ledger();
        let out = f(&mut ledger);
        self.bytes.set(ledger.bytes() as i64);
        out
    }

    pub fn set_budget(&self, bytes: usize) {
        self.update(|l| l.set_budget(bytes));
    }

    /// The checkpoint's adapter, read from disk the first time (blocking).
    fn load(&self, a: &AdapterRef, base: &Llama) -> Result<Arc<LoraAdapter>, SubmitError> {
        let slot = self.ledger().slot(&a.checkpoint_id, &a.owner);
        let mut loaded = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(adapter) = loaded.as_ref() {
            return Ok(adapter.clone());
        }
        // The error names files on the server: logged, not sent. The slot stays empty, so a
        // later request tries again.
        if let Err(why) = check_confined(a) {
            tracing::error!(checkpoint = %a.checkpoint_id, error = %why, "a runtime adapter's files no longer pass");
            return Err(SubmitError::Invalid(format!("this adapter cannot be loaded: {why}")));
        }
        let adapter = self.read(a, base).map_err(|e| {
            tracing::error!(checkpoint = %a.checkpoint_id, error = %e, "cannot load a checkpoint's adapter");
            SubmitError::Invalid("this checkpoint's adapter cannot be loaded (the server logged why)".into())
        })?;
        self.loads.inc();
        let adapter = Arc::new(adapter);
        *loaded = Some(adapter.clone());
        drop(loaded);
        self.update(|l| l.loaded(&a.checkpoint_id, &slot, adapter.bytes()));
        Ok(adapter)
    }

    /// Reads `a` from disk in its owner's turn on the loader thread (`adapter_loads`).
    fn read(&self, a: &AdapterRef, base: &Llama) -> Result<LoraAdapter, tandem_model::ModelError> {
        let (path, config) = (a.path.clone(), base.config.clone());
        self.reads
            .run(&a.owner, move || LoraAdapter::load(&path, &config))
            .unwrap_or_else(|| Err(tandem_model::ModelError::Adapter("reading the adapter panicked".into())))
    }

    /// Keeps `owner`'s adapter the caller loaded already.
    fn insert(&self, checkpoint_id: &str, owner: &str, adapter: Arc<LoraAdapter>) {
        let bytes = adapter.bytes();
        self.loads.inc();
        self.update(|l| l.put(checkpoint_id, owner, adapter, bytes));
    }

    pub fn forget(&self, checkpoint_id: &str) {
        self.update(|l| l.forget(checkpoint_id));
    }
}

/// A runtime adapter's files (`AdapterRef::confined_to`): each must still resolve, links
/// followed, under the root and fit its size cap. Checked before every read, not only at
/// `/v1/load_lora_adapter`. (Whoever can write under the root can still swap a file between
/// this check and the read: the root's contents are the operator's.)
fn check_confined(a: &AdapterRef) -> Result<(), String> {
    use tandem_core::inference::{MAX_RUNTIME_ADAPTER_BYTES, MAX_RUNTIME_ADAPTER_CONFIG_BYTES};
    let Some(root) = &a.confined_to else { return Ok(()) };
    for (name, max) in [
        ("adapter_config.json", MAX_RUNTIME_ADAPTER_CONFIG_BYTES),
        ("adapter_model.safetensors", MAX_RUNTIME_ADAPTER_BYTES),
    ] {
        let file = a.path.join(name).canonicalize().map_err(|_| format!("{name} is missing"))?;
        if !file.starts_with(root) {
            return Err(format!("{name} resolves outside the LoRA root"));
        }
        let meta = std::fs::metadata(&file).map_err(|_| format!("{name} cannot be read"))?;
        if !meta.is_file() {
            return Err(format!("{name} is not a file"));
        }
        if meta.len() > max {
            return Err(format!("{name} is larger than {max} bytes"));
        }
    }
    Ok(())
}

/// One served base model and its loop.
pub(crate) struct Served {
    pub info: BaseModelInfo,
    pub model: Arc<Llama>,
    pub tok: Arc<TextTokenizer>,
    pub template: Option<ChatTemplate>,
    /// The template's source, for the tokenizer files a Hugging Face client loads.
    pub template_source: Option<String>,
    pub grammars: Grammars,
    pub tx: Mutex<std::sync::mpsc::Sender<Job>>,
    pub metrics: Arc<EngineMetrics>,
    pub max_waiting: usize,
    pub max_seqs: usize,
    pub kv_tokens: usize,
    pub shared: Arc<Shared>,
}

impl Served {
    /// The chat rendered to text with the request's template or the model's.
    fn render_text(&self, chat: &ChatRender) -> Result<String, InputError> {
        let inputs = RenderInputs {
            add_generation_prompt: chat.add_generation_prompt,
            continue_final_message: chat.continue_final_message,
            tools: chat.tools.clone(),
            documents: chat.documents.clone(),
            reasoning_effort: chat.reasoning_effort.clone(),
            kwargs: chat.kwargs.clone(),
            bos_token: self.tok.bos_id.map(|b| self.tok.token_text(b)).unwrap_or_default(),
            eos_token: self.tok.token_text(self.tok.eos_id),
        };
        let template_error = |e: &dyn std::fmt::Display| InputError::Template(e.to_string());
        // The template sees each message as JSON: its typed role and content, and every other
        // field as the client sent it.
        let messages: Vec<serde_json::Value> = chat.messages.iter().map(ChatMessage::to_value).collect();
        let own;
        let template = match (&chat.chat_template, self.shared.jail.get()) {
            // A request's own template: in the jail when there is one (see `template::jail`).
            (Some(source), Some(jail)) => {
                let job = JailJob { source: source.clone(), messages, inputs };
                return jail.render(&job, &chat.tenant).map_err(|e| template_error(&e));
            }
            (Some(source), None) => {
                own = ChatTemplate::new(source).map_err(|e| template_error(&e))?;
                &own
            }
            (None, _) => self
                .template
                .as_ref()
                .ok_or_else(|| InputError::Template("this model has no chat template; pass `chat_template`".into()))?,
        };
        template.render(&messages, &inputs).map_err(|e| template_error(&e))
    }

    fn check_vocabulary(&self, tokens: &[u32]) -> Result<(), InputError> {
        let vocab = self.tok.vocab_size();
        match tokens.iter().find(|t| **t as usize >= vocab) {
            Some(&token) => Err(InputError::OutOfVocabulary { token, vocab }),
            None => Ok(()),
        }
    }

    /// Every choice is a sequence, and all of them together must be able to start.
    fn check_fits(&self, request: &GenerateRequest) -> Result<(), SubmitError> {
        let invalid = |field: &str, message: String| SubmitError::InvalidField { field: field.into(), message };
        // A sequence samples from its last prompt position: there must be one.
        if request.prompt.is_empty() {
            return Err(invalid("messages", "the prompt is empty: at least one token is needed".into()));
        }
        if request.n > self.max_seqs {
            return Err(invalid(
                "n",
                format!("n={} is more than this server runs at once (--max-num-seqs {})", request.n, self.max_seqs),
            ));
        }
        let need = sequence::start_reserve(request.prompt.len(), request.n);
        if need > self.kv_tokens {
            return Err(invalid(
                "n",
                format!(
                    "{} choices of a {}-token prompt need {need} KV cache positions; this server's budget is {}",
                    request.n,
                    request.prompt.len(),
                    self.kv_tokens
                ),
            ));
        }
        Ok(())
    }

    fn renders_tools(&self, chat: &ChatRender) -> bool {
        // A template that uses `tools` puts the tool's name into the prompt; one that ignores them
        // (SmolLM2's) renders the same text with or without.
        const PROBE: &str = "tandem_probe_tool_7f3a";
        let probe = ChatRender {
            messages: vec![ChatMessage::text_message("user", "hi")],
            add_generation_prompt: true,
            tools: Some(serde_json::json!([{"type": "function", "function": {"name": PROBE, "description": PROBE,
                "parameters": {"type": "object", "properties": {}}}}])),
            chat_template: chat.chat_template.clone(),
            kwargs: chat.kwargs.clone(),
            tenant: chat.tenant.clone(),
            ..ChatRender::default()
        };
        self.render_text(&probe).is_ok_and(|t| t.contains(PROBE))
    }
}

impl ServedModel for Served {
    fn lora_activity(&self) -> LoraActivity {
        self.metrics.lora_activity(self.max_seqs)
    }

    fn tokenizer_files(&self) -> Vec<(String, Vec<u8>)> {
        crate::tokenizer_dir::with_config(
            self.tok.hf_files(self.template_source.as_deref(), self.info.context_len),
            self.model.config.arch,
        )
    }

    fn info(&self) -> &BaseModelInfo {
        &self.info
    }

    fn has_capacity(&self) -> bool {
        (self.metrics.queued() as usize) < self.max_waiting
    }

    fn tool_template(&self, chat: &ChatRender) -> ToolTemplate {
        let family = match (&chat.chat_template, &self.template) {
            (Some(source), _) => Family::detect(source),
            (None, Some(t)) => t.tool_family,
            (None, None) => Family::Generic,
        };
        ToolTemplate { renders_tools: self.renders_tools(chat), family }
    }

    fn render_chat(&self, chat: &ChatRender) -> Result<Vec<u32>, InputError> {
        let text = self.render_text(chat)?;
        self.tokenize(&text, chat.add_special_tokens)
    }

    fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, InputError> {
        // Tokenizing costs about 100 bytes of memory per byte of text. A text this long cannot
        // fit the context whatever its tokens (each stands for at most `max_token_bytes`), so it
        // is refused before the tokenizer sees it (twice the bound, to allow for normalisation).
        let context = self.info.context_len;
        let limit = 2 * context * self.tok.max_token_bytes();
        if text.len() > limit {
            return Err(InputError::TooLong { bytes: text.len(), context, limit });
        }
        let mut ids = Vec::new();
        if add_special_tokens && self.tok.add_bos {
            ids.extend(self.tok.bos_id);
        }
        ids.extend(self.tok.encode(text).map_err(|e| InputError::Tokenizer(e.to_string()))?);
        Ok(ids)
    }

    fn detokenize(&self, tokens: &[u32], skip_special_tokens: bool) -> Result<String, InputError> {
        self.check_vocabulary(tokens)?;
        Ok(self.tok.decode(tokens, skip_special_tokens))
    }

    fn token_texts(&self, tokens: &[u32], skip_special_tokens: bool) -> Result<(Vec<String>, String), InputError> {
        self.check_vocabulary(tokens)?;
        let mut decoder = IncrementalDecoder::default();
        let texts = tokens.iter().map(|t| decoder.push(&self.tok, *t, skip_special_tokens)).collect();
        Ok((texts, decoder.flush()))
    }

    fn token_text(&self, token: u32) -> String {
        self.tok.token_text(token)
    }

    fn token_id_for_bytes(&self, bytes: &[u8]) -> Option<u32> {
        self.tok.token_id_for_bytes(bytes)
    }

    fn prepare(&self, request: GenerateRequest) -> Result<ValidRequest, SubmitError> {
        self.check_fits(&request)?;
        let adapter = request.adapter.as_ref().map(|a| self.shared.adapters.load(a, &self.model)).transpose()?;
        // Compiled here, on the caller's (blocking) thread, so that an invalid constraint is a
        // 400 before anything is queued and a slow compile never holds up the engine's step.
        let matcher = match &request.params.constraint {
            Some(c) => Some(self.grammars.compile(c).map_err(|e| SubmitError::InvalidField {
                field: c.field.clone(),
                message: format!("invalid {}: {e}", c.field),
            })?),
            None => None,
        };
        Ok(ValidRequest::new(
            &self.info.id,
            request,
            adapter.map(|a| a as Arc<dyn std::any::Any + Send + Sync>),
            matcher.map(|m| Box::new(m) as Box<dyn std::any::Any + Send>),
        ))
    }

    fn load_adapter(&self, a: &AdapterRef) -> Result<(), String> {
        check_confined(a)?;
        let adapter = self.shared.adapters.read(a, &self.model).map_err(|e| {
            // The messages name the directory; the caller knows it by its own name.
            let dir = a.path.display().to_string();
            e.to_string().replace(&format!("{dir}/"), "").replace(&format!("{dir}: "), "").replace(&dir, "the adapter")
        })?;
        self.shared.adapters.insert(&a.checkpoint_id, &a.owner, Arc::new(adapter));
        Ok(())
    }

    fn export_merged(&self, adapter_dir: &Path, out: &Path, format: &str) -> Result<(), ExportError> {
        use tandem_model::merge::{merge_to_gguf, MergeFormat};
        use tandem_model::ModelError;
        let format =
            MergeFormat::parse(format).ok_or_else(|| ExportError::Unsupported(format!("format {format:?}")))?;
        let base = Path::new(&self.info.path);
        if !base.is_file() {
            return Err(ExportError::Unsupported(format!(
                "{} is served from a checkpoint directory; merged exports are written from a GGUF base",
                self.info.id
            )));
        }
        merge_to_gguf(base, adapter_dir, out, format).map(|_| ()).map_err(|e| match e {
            ModelError::Unsupported(m) | ModelError::Adapter(m) => ExportError::Unsupported(m),
            other => ExportError::Failed(other.to_string()),
        })
    }

    fn submit(&self, request: ValidRequest) -> Result<UnboundedReceiver<InferEvent>, SubmitError> {
        if request.model() != self.info.id {
            return Err(SubmitError::Invalid(format!(
                "this request was prepared for {}, not {}",
                request.model(),
                self.info.id
            )));
        }
        let (req, adapter, constraint) = request.into_parts();
        // What `prepare` made, back in its own types (a step derived from a prepared request
        // carries the same adapter).
        let adapter = adapter.map(|a| a.downcast::<LoraAdapter>()).transpose().map_err(|_| foreign())?;
        let matcher =
            constraint.map(|c| c.downcast::<llguidance::Matcher>().map(|m| *m)).transpose().map_err(|_| foreign())?;
        if req.prompt.is_empty()
            || req.adapter.is_some() != adapter.is_some()
            || req.params.constraint.is_some() != matcher.is_some()
        {
            return Err(foreign());
        }
        let (tx, rx) = unbounded_channel();
        let holds_place = !req.beam_step;
        let lora = req.adapter.as_ref().map(|a| Arc::new(LoraTag { name: a.name.clone(), owner: req.tenant.clone() }));
        let job = Job { req, adapter, lora, tx, received: Instant::now(), matcher, holds_place };
        // The place is taken last, after everything that can refuse the request.
        if holds_place && !self.metrics.try_enqueue(self.max_waiting) {
            return Err(SubmitError::Overloaded);
        }
        if self.tx.lock().unwrap_or_else(|e| e.into_inner()).send(job).is_err() {
            self.metrics.dequeued(usize::from(holds_place));
            return Err(SubmitError::Stopped);
        }
        Ok(rx)
    }
}

/// A request this engine did not prepare.
fn foreign() -> SubmitError {
    SubmitError::Invalid("this request was not prepared by this engine".into())
}

#[cfg(test)]
mod tests {
    use super::check_confined;
    use tandem_core::inference::AdapterRef;

    #[test]
    fn runtime_adapter_files_must_stay_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let at = root.join("a");
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(at.join("adapter_config.json"), "{}").unwrap();
        std::fs::write(at.join("adapter_model.safetensors"), "w").unwrap();
        let root = root.canonicalize().unwrap();
        let a = AdapterRef {
            checkpoint_id: "x".into(),
            name: "x".into(),
            owner: "e".into(),
            path: at.clone(),
            confined_to: Some(root),
        };
        assert_eq!(check_confined(&a), Ok(()));
        // Swapped for a link to a file outside the root after the load: refused at the next read.
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::fs::remove_file(at.join("adapter_model.safetensors")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), at.join("adapter_model.safetensors")).unwrap();
        assert!(check_confined(&a).unwrap_err().contains("outside the LoRA root"));
        std::fs::remove_file(at.join("adapter_model.safetensors")).unwrap();
        assert!(check_confined(&a).unwrap_err().contains("missing"));
        // Trained checkpoints are not confined.
        assert_eq!(check_confined(&AdapterRef { confined_to: None, ..a }), Ok(()));
    }
}
