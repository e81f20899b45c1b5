//! A fake served model for driving the inference routes without the real engine.
//!
//! Its tokens are bytes; its "template" writes `role: content\n` per message; it answers with the
//! last line of the prompt reversed (only the content, for a `role: content` line), with
//! `[checkpoint-id]` first when an adapter is loaded.

use super::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use tandem_api::Limits;
use tandem_core::inference::{
    AdapterRef, BaseModelInfo, ChatRender, FinishReason, GenerateRequest, InferEvent, InferenceBackend, InputError,
    ModelHandle, RankedLogprob, ServedModel, SubmitError, TokenLogprob, TopLogprob, ValidRequest,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub const CONTEXT: usize = 96;
pub const EOS: u32 = 256;

pub struct Fake {
    pub info: BaseModelInfo,
    pub capacity: AtomicBool,
    /// While set, loading an adapter waits for a message on it (a slow safetensors read).
    pub load_gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    pub prepared: AtomicUsize,
    pub submitted: AtomicUsize,
}

impl Fake {
    pub fn new() -> Arc<Self> {
        Arc::new(Fake {
            info: BaseModelInfo {
                id: BASE.into(),
                path: "/nowhere".into(),
                context_len: CONTEXT,
                vocab_size: 257,
                eos_token_id: EOS,
            },
            capacity: AtomicBool::new(true),
            load_gate: Mutex::new(None),
            prepared: AtomicUsize::new(0),
            submitted: AtomicUsize::new(0),
        })
    }
}

pub struct FakeBackend(pub Arc<Fake>);

impl InferenceBackend for FakeBackend {
    fn models(&self) -> Vec<ModelHandle> {
        vec![self.0.clone() as ModelHandle]
    }
    fn forget_adapter(&self, _: &str) {}
    fn healthy(&self) -> bool {
        true
    }
    fn register_metrics(&self, registry: &mut tandem_core::telemetry::prometheus_client::registry::Registry) {
        use tandem_core::telemetry::prometheus_client::metrics::gauge::Gauge;
        let running = Gauge::<i64>::default();
        running.set(self.0.submitted.load(std::sync::atomic::Ordering::SeqCst) as i64);
        registry.register("vllm:num_requests_running", "Requests the fake has running", running);
    }
}

pub fn text_of(messages: &[tandem_core::chat::ChatMessage]) -> String {
    messages.iter().map(|m| format!("{}: {}\n", m.role, m.text())).collect()
}

impl ServedModel for Fake {
    fn info(&self) -> &BaseModelInfo {
        &self.info
    }
    fn has_capacity(&self) -> bool {
        self.capacity.load(Ordering::SeqCst)
    }
    fn tool_template(&self, _: &ChatRender) -> tandem_core::inference::ToolTemplate {
        tandem_core::inference::ToolTemplate { renders_tools: false, family: tandem_core::tool_calls::Family::Generic }
    }
    fn render_chat(&self, chat: &ChatRender) -> Result<Vec<u32>, InputError> {
        if chat.chat_template.is_some() {
            return Err(InputError::Template("the fake renders no request templates".into()));
        }
        self.tokenize(&text_of(&chat.messages), false)
    }
    fn tokenize(&self, text: &str, _: bool) -> Result<Vec<u32>, InputError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn detokenize(&self, tokens: &[u32], _: bool) -> Result<String, InputError> {
        match tokens.iter().find(|t| **t > 255) {
            Some(&token) => Err(InputError::OutOfVocabulary { token, vocab: 256 }),
            None => Ok(String::from_utf8_lossy(&tokens.iter().map(|t| *t as u8).collect::<Vec<_>>()).into_owned()),
        }
    }
    fn token_texts(&self, tokens: &[u32], skip: bool) -> Result<(Vec<String>, String), InputError> {
        let texts = tokens.iter().map(|t| self.detokenize(&[*t], skip)).collect::<Result<_, _>>()?;
        Ok((texts, String::new()))
    }
    fn token_text(&self, token: u32) -> String {
        self.detokenize(&[token], false).unwrap_or_default()
    }
    fn token_id_for_bytes(&self, bytes: &[u8]) -> Option<u32> {
        (bytes.len() == 1).then(|| u32::from(bytes[0]))
    }
    fn prepare(&self, request: GenerateRequest) -> Result<ValidRequest, SubmitError> {
        self.prepared.fetch_add(1, Ordering::SeqCst);
        if let Some(c) = &request.params.constraint {
            return Err(SubmitError::InvalidField {
                field: c.field.clone(),
                message: "the fake compiles nothing".into(),
            });
        }
        let adapter = match &request.adapter {
            Some(a) => {
                if let Some(gate) = self.load_gate.lock().unwrap().as_ref() {
                    // Bounded: were this on the runtime's only thread, the test fails instead of hanging.
                    gate.recv_timeout(std::time::Duration::from_secs(20)).map_err(|_| SubmitError::Stopped)?;
                }
                if !a.path.join("adapter_config.json").is_file() {
                    return Err(SubmitError::Invalid("this checkpoint's adapter cannot be loaded".into()));
                }
                Some(Arc::new(a.checkpoint_id.clone()) as Arc<dyn std::any::Any + Send + Sync>)
            }
            None => None,
        };
        Ok(ValidRequest::new(&self.info.id, request, adapter, None))
    }
    fn load_adapter(&self, a: &AdapterRef) -> Result<(), String> {
        // The fake serves any directory holding the two PEFT files whose config says `r`.
        let config = std::fs::read_to_string(a.path.join("adapter_config.json")).map_err(|e| e.to_string())?;
        let v: serde_json::Value = serde_json::from_str(&config).map_err(|e| format!("adapter_config.json: {e}"))?;
        v.get("r")
            .and_then(serde_json::Value::as_u64)
            .map(|_| ())
            .ok_or_else(|| "adapter_config.json: no rank `r`".into())
    }
    /// The fake "merges" by writing the format and the adapter's config (3 MB, so the body
    /// streams in several chunks); format `f16` stands for a base it cannot export.
    fn export_merged(
        &self,
        adapter_dir: &std::path::Path,
        out: &std::path::Path,
        format: &str,
    ) -> Result<(), tandem_core::inference::ExportError> {
        if format == "f16" {
            return Err(tandem_core::inference::ExportError::Unsupported("the fake has no f16".into()));
        }
        let config = std::fs::read(adapter_dir.join("adapter_config.json")).unwrap_or_default();
        let mut bytes = format!("GGUF {format} ").into_bytes();
        bytes.extend(config);
        bytes.resize(3 << 20, b'.');
        std::fs::write(out, bytes).map_err(|e| tandem_core::inference::ExportError::Failed(e.to_string()))
    }
    fn submit(&self, request: ValidRequest) -> Result<UnboundedReceiver<InferEvent>, SubmitError> {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        let (req, adapter, _) = request.into_parts();
        let text = String::from_utf8_lossy(&req.prompt.iter().map(|t| *t as u8).collect::<Vec<_>>()).into_owned();
        let line = text.lines().last().unwrap_or("");
        let last = line.split_once(": ").map_or(line, |(_, c)| c).to_string();
        let mut answer: String = last.chars().rev().collect();
        if let Some(a) = adapter {
            answer = format!("[{}]{answer}", a.downcast::<String>().unwrap());
        }
        let (tx, rx) = unbounded_channel();
        let _ = tx.send(InferEvent::Started { cached_tokens: 0 });
        if req.prompt_logprobs.is_some() {
            // Every prompt token after the first at logprob -1, as its own top candidate.
            let positions = req
                .prompt
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    (i > 0).then(|| {
                        vec![RankedLogprob { token_id: *t, logprob: -1.0, rank: 1, decoded: self.token_text(*t) }]
                    })
                })
                .collect();
            let _ = tx.send(InferEvent::PromptLogprobs(positions));
        }
        for choice in 0..req.n {
            let bytes = answer.as_bytes();
            let take = bytes.len().min(req.params.max_tokens);
            for b in &bytes[..take] {
                // Each answer token at logprob -0.5, with the byte after it as the runner-up.
                let top = |id: u32, logprob: f32| TopLogprob {
                    token_id: id,
                    token: ((id as u8) as char).to_string(),
                    bytes: vec![id as u8],
                    logprob,
                };
                let logprob = req.params.logprobs.map(|k| TokenLogprob {
                    token: top(u32::from(*b), -0.5),
                    top: if k > 0 {
                        vec![top(u32::from(*b), -0.5), top(u32::from(b.wrapping_add(1)), -2.0)]
                    } else {
                        Vec::new()
                    },
                });
                let ev = InferEvent::Token { choice, token_id: u32::from(*b), text: (*b as char).to_string(), logprob };
                let _ = tx.send(ev);
            }
            let reason = if take < bytes.len() { FinishReason::Length } else { FinishReason::Stop };
            let _ = tx.send(InferEvent::Finished { choice, reason, stop_reason: None, text: String::new() });
        }
        Ok(rx)
    }
}

pub async fn app_with(fake: &Arc<Fake>) -> TestApp {
    test_app_serving(Limits::default(), Some(Arc::new(FakeBackend(fake.clone())))).await
}
