//! The inference port: what the api hands the engine, and the events it gets back.
//!
//! The backend lists its served models as [`ModelHandle`]s. The api resolves a request to one
//! handle, builds a [`GenerateRequest`] with it (every default resolved, the prompt rendered and
//! tokenized through the handle), and has the handle [`ServedModel::prepare`] it into a
//! [`ValidRequest`] (limits checked, constraint compiled, adapter loaded: blocking work, done off
//! the async workers). [`ServedModel::submit`] then only queues it; the engine streams
//! [`InferEvent`]s on a channel, and dropping the receiver cancels the request.

use std::any::Any;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// Sampling and stopping, with vLLM's defaults resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Below 1e-5 means greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// 0 means off.
    pub top_k: usize,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    /// Added to the logits, clamped to [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Token sequences whose last token is banned after the rest was generated.
    pub bad_words: Vec<Vec<u32>>,
    pub seed: Option<u64>,
    pub max_tokens: usize,
    pub min_tokens: usize,
    pub ignore_eos: bool,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub include_stop_str_in_output: bool,
    /// Number of top logprobs per token, or `None` for no logprobs.
    pub logprobs: Option<usize>,
    pub skip_special_tokens: bool,
    /// Built-in logits processors, applied after the other masks (see `LogitsProcessor`).
    pub processors: Vec<LogitsProcessor>,
    /// Structured output: every generated token keeps the text inside this constraint.
    pub constraint: Option<Constraint>,
}

/// A structured-output constraint (`structured_outputs`, `response_format` or a `guided_*` alias),
/// as data; the engine compiles it with llguidance and answers an invalid one with
/// `SubmitError::InvalidField`.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    pub kind: ConstraintKind,
    /// JSON without free whitespace between tokens (vLLM's `disable_any_whitespace`).
    pub disable_any_whitespace: bool,
    /// Objects that do not say otherwise get `additionalProperties: false`.
    pub disable_additional_properties: bool,
    /// The regex JSON whitespace must match, instead of the default.
    pub whitespace_pattern: Option<String>,
    /// The request field it came from, named in errors (`structured_outputs`, `response_format`, ...).
    pub field: String,
    /// With a reasoning parser: the reasoning block (free text) comes first and the constraint
    /// holds for what follows, as vLLM starts the grammar after reasoning ends.
    pub after_reasoning: Option<ReasoningParser>,
}

/// How reasoning appears in the output (the server's `--reasoning-parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// `think` (vLLM's qwen3 rule): output that opens with `<think>` reasons up to `</think>`;
    /// other output is all content.
    Think,
    /// `deepseek_r1`: the output starts inside the reasoning (the template opened `<think>`, so
    /// the tag is optional) and reasons up to `</think>`; without it, all of it is reasoning.
    DeepSeekR1,
}

impl ReasoningParser {
    /// The parser a `--reasoning-parser` value names (`none` is no parser).
    pub fn from_name(name: &str) -> Result<Option<Self>, String> {
        match name {
            "none" => Ok(None),
            "think" | "qwen3" => Ok(Some(Self::Think)),
            "deepseek_r1" => Ok(Some(Self::DeepSeekR1)),
            other => Err(format!(
                "--reasoning-parser must be `think` (alias `qwen3`), `deepseek_r1` or `none`, not {other:?}"
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintKind {
    /// A JSON schema.
    Json(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// The whole output matches this regular expression (Rust `regex` syntax).
    Regex(String),
    /// The output is exactly one of these strings.
    Choice(Vec<String>),
    /// A context-free grammar in llguidance's Lark dialect.
    Grammar(String),
    /// A structural tag (vLLM's `structures`/`triggers` or xgrammar's `format` tree).
    StructuralTag(serde_json::Value),
}

/// What a chat template does with tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolTemplate {
    /// It renders `tools` into the prompt (otherwise they are described in a system message).
    pub renders_tools: bool,
    /// The call syntax the template shows (the generic one when it shows none).
    pub family: crate::tool_calls::Family,
}

/// The built-in logits processors a request may name in `logits_processors`. Code is never
/// loaded: an unknown name is a 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogitsProcessor {
    /// `no_repeat_ngram` `{n}`: bans any token that would repeat an n-gram already present in
    /// the prompt and output (as Hugging Face's `no_repeat_ngram_size`).
    NoRepeatNgram { n: usize },
    /// `suppress_tokens` `{token_ids}`: these tokens are never sampled.
    SuppressTokens { token_ids: Vec<u32> },
}

impl LogitsProcessor {
    /// Names accepted in `logits_processors`.
    pub const NAMES: [&'static str; 2] = ["no_repeat_ngram", "suppress_tokens"];
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
            bad_words: Vec::new(),
            seed: None,
            max_tokens: 16,
            min_tokens: 0,
            ignore_eos: false,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            include_stop_str_in_output: false,
            logprobs: None,
            skip_special_tokens: true,
            processors: Vec::new(),
            constraint: None,
        }
    }
}

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature < 1e-5
    }
}

/// A LoRA adapter to run the request with, identified by its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdapterRef {
    /// Unique per checkpoint (a re-created step gets a new id), so caches never mix them up.
    pub checkpoint_id: String,
    /// The name requests give it in `model` (vLLM's LoRA name): what `vllm:lora_requests_info`
    /// lists, so that a router can send a request to the node already running its adapter.
    pub name: String,
    /// The entity whose adapter it is (the adapter cache shares its budget between entities).
    pub owner: String,
    pub path: std::path::PathBuf,
    /// For an adapter loaded at run time (`/v1/load_lora_adapter`): the `--lora-root` its files
    /// must resolve under, checked with the size caps below at every read (a cached copy may be
    /// dropped and read again later). `None` for tandem's own checkpoints.
    pub confined_to: Option<std::path::PathBuf>,
}

/// An adapter as the engine reports it running or waiting (`vllm:lora_requests_info`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LoraTag {
    /// [`AdapterRef::name`].
    pub name: String,
    /// The entity that asked, which is the adapter's owner (a checkpoint, like an adapter loaded
    /// at run time, is served only to its own entity): the only one whose key is shown the name.
    pub owner: String,
}

/// One engine's adapters in use, as vLLM's `vllm:lora_requests_info` reports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoraActivity {
    /// Adapters of the running sequences, sorted, once each.
    pub running: Vec<Arc<LoraTag>>,
    /// Adapters of the requests waiting (and of preempted sequences), sorted, once each.
    pub waiting: Vec<Arc<LoraTag>>,
    /// Adapters one batch can hold: every sequence may have its own, so the batch size.
    pub max_lora: usize,
    /// When the engine loop last went round, in seconds since the Unix epoch (vLLM's value).
    pub updated_unix: f64,
}

/// Largest `adapter_model.safetensors` a runtime adapter may have (a rank-64 adapter of every
/// projection of an 8B model is about 700 MB).
pub const MAX_RUNTIME_ADAPTER_BYTES: u64 = 1 << 30;
/// Largest `adapter_config.json` a runtime adapter may have.
pub const MAX_RUNTIME_ADAPTER_CONFIG_BYTES: u64 = 1 << 20;

/// A generation request with every default resolved, before the engine prepared it.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub request_id: String,
    pub adapter: Option<AdapterRef>,
    pub prompt: Vec<u32>,
    /// Number of choices; choice i samples with seed + i.
    pub n: usize,
    pub params: SamplingParams,
    /// Lower runs first; ties by arrival.
    pub priority: i64,
    /// Who asked (the API key's entity). Scopes the prefix cache, so that no tenant can observe
    /// another's prompts through `cached_tokens` or timing, and shares admission fairly.
    pub tenant: String,
    pub cache_salt: Option<String>,
    /// Top-k logprobs at every prompt position (non-streaming only); disables prefix-cache reuse.
    pub prompt_logprobs: Option<usize>,
    /// Scores beyond the prompt logprobs, computed in the same prefill (Tinker's target prompt
    /// logprobs and alternative prompt tokens); needs `prompt_logprobs` set.
    pub prompt_scoring: Option<Box<PromptScoring>>,
    /// One step of a beam search: the search was admitted once, as one request, so its per-step
    /// requests take no place in the engine's queue (and are never refused for a full one).
    pub beam_step: bool,
}

/// What to score at every prompt position after the first besides the prompt token itself.
/// Row `i` is prompt position `i + 1` (scored from the positions before it).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptScoring {
    /// Token ids whose raw logprobs to return, per row (an empty row asks for nothing); as many
    /// rows as the prompt has positions after the first.
    pub targets: Vec<Vec<u32>>,
    /// Independent draws per row from the next-token distribution at `temperature` (0: the most
    /// likely token each time), returned with their raw logprobs.
    pub alt_k: usize,
    pub temperature: f32,
}

impl PromptScoring {
    /// Entries the answer holds for a prompt of `prompt_len` tokens (for the response bound).
    pub fn cells(&self, prompt_len: usize) -> usize {
        let targets = self.targets.iter().fold(0usize, |n, r| n.saturating_add(r.len()));
        targets.saturating_add(self.alt_k.saturating_mul(prompt_len.saturating_sub(1)))
    }
}

/// The scores a [`PromptScoring`] asked for, row for row.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptScores {
    pub targets: Vec<Vec<f32>>,
    /// `alt_k` (token id, raw logprob) draws per row; empty when none were asked for.
    pub alt: Vec<Vec<(u32, f32)>>,
}

/// One token's candidate at a prompt position: id, raw logprob, rank (1 = most likely) and text.
#[derive(Debug, Clone, PartialEq)]
pub struct RankedLogprob {
    pub token_id: u32,
    pub logprob: f32,
    pub rank: usize,
    pub decoded: String,
}

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What matched when a choice stopped: a stop string or a stop token id (null for EOS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    Text(String),
    Token(u32),
}

/// One alternative of a logprob entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    pub token_id: u32,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// The raw-model logprob of a generated token and, first among `top`, itself.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: TopLogprob,
    pub top: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum InferEvent {
    /// The prompt was admitted: how many of its tokens came from the prefix cache.
    Started { cached_tokens: usize },
    /// One generated token of a choice, with the text it completed (possibly empty while a
    /// multi-byte character or a possible stop string is held back).
    Token { choice: usize, token_id: u32, text: String, logprob: Option<TokenLogprob> },
    /// A choice ended; `text` is whatever held-back text belongs to it.
    Finished { choice: usize, reason: FinishReason, stop_reason: Option<StopReason>, text: String },
    /// Per prompt position: `None` for the first, else the actual token followed by the top-k.
    PromptLogprobs(Vec<Option<Vec<RankedLogprob>>>),
    /// The request's [`PromptScoring`], answered once the prompt is in (before `PromptLogprobs`).
    PromptScores(PromptScores),
    /// The request failed after it was accepted.
    Error(String),
}

/// A base model as the backend serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseModelInfo {
    pub id: String,
    pub path: String,
    pub context_len: usize,
    pub vocab_size: usize,
    /// The end-of-sequence token (beam search ends a hypothesis on it).
    pub eos_token_id: u32,
}

/// Why a request could not be accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("the server is at capacity; retry shortly")]
    Overloaded,
    /// The model cannot run it (an adapter that does not load; the message is safe to show).
    #[error("{0}")]
    Invalid(String),
    /// A request field the engine found invalid (a constraint that does not compile, more
    /// choices than fit): a 400 naming the field.
    #[error("{message}")]
    InvalidField { field: String, message: String },
    #[error("the inference engine has stopped")]
    Stopped,
}

/// Why a served model could not render, tokenize or detokenize an input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InputError {
    /// The chat template failed or is missing; the message says where.
    #[error("{0}")]
    Template(String),
    /// Longer than any prompt the context can hold: refused before the tokenizer sees it.
    #[error(
        "the text is {bytes} bytes long: more than the model's context of {context} tokens can hold (at most {limit} bytes)"
    )]
    TooLong { bytes: usize, context: usize, limit: usize },
    #[error("token id {token} is out of vocabulary (size {vocab})")]
    OutOfVocabulary { token: u32, vocab: usize },
    /// The tokenizer itself refused the text.
    #[error("{0}")]
    Tokenizer(String),
}

/// Everything a chat render needs (the template inputs of the request).
#[derive(Debug, Clone, Default)]
pub struct ChatRender {
    pub messages: Vec<crate::chat::ChatMessage>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub tools: Option<serde_json::Value>,
    pub documents: Option<serde_json::Value>,
    pub reasoning_effort: Option<String>,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// A per-request template, replacing the model's.
    pub chat_template: Option<String>,
    pub add_special_tokens: bool,
    /// The entity asking: request templates render in a shared jail, and no one entity may hold
    /// all of its places.
    pub tenant: String,
}

/// A request the engine prepared and will queue as it is: its limits checked, its constraint
/// compiled and its adapter loaded. Only [`ServedModel::prepare`] makes one with a constraint or
/// an adapter; what the engine prepared is opaque here.
pub struct ValidRequest {
    request: GenerateRequest,
    /// The served model that prepared it; another refuses to run it.
    model: String,
    adapter: Option<Arc<dyn Any + Send + Sync>>,
    constraint: Option<Box<dyn Any + Send>>,
}

impl ValidRequest {
    /// For engines: the request and what preparing it produced.
    pub fn new(
        model: &str,
        request: GenerateRequest,
        adapter: Option<Arc<dyn Any + Send + Sync>>,
        constraint: Option<Box<dyn Any + Send>>,
    ) -> Self {
        ValidRequest { request, model: model.to_string(), adapter, constraint }
    }

    pub fn request(&self) -> &GenerateRequest {
        &self.request
    }

    /// The id of the served model that prepared it.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// For engines: the request, the loaded adapter and the compiled constraint.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(self) -> (GenerateRequest, Option<Arc<dyn Any + Send + Sync>>, Option<Box<dyn Any + Send>>) {
        (self.request, self.adapter, self.constraint)
    }

    /// One step of a beam search built on this request: the same model and adapter, a longer
    /// prompt, greedy single-token sampling without a constraint (a search has none). It takes
    /// no queue place: the search was admitted once.
    pub fn beam_step(&self, request_id: String, prompt: Vec<u32>, params: SamplingParams) -> ValidRequest {
        let request = GenerateRequest {
            request_id,
            prompt,
            n: 1,
            params: SamplingParams { constraint: None, ..params },
            prompt_logprobs: None,
            prompt_scoring: None,
            beam_step: true,
            ..self.request.clone()
        };
        ValidRequest { request, model: self.model.clone(), adapter: self.adapter.clone(), constraint: None }
    }
}

impl std::fmt::Debug for ValidRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidRequest")
            .field("model", &self.model)
            .field("request", &self.request)
            .field("adapter_loaded", &self.adapter.is_some())
            .field("constraint_compiled", &self.constraint.is_some())
            .finish()
    }
}

/// One served base model: its template, tokenizer and limits, and the queue of its engine.
/// Rendering, tokenizing and `prepare` are blocking (CPU work, file reads): call them off the
/// async workers.
pub trait ServedModel: Send + Sync + 'static {
    /// The tokenizer as files a Hugging Face client loads with the same ids (`tokenizer.json`,
    /// `tokenizer_config.json`); none where the model cannot say.
    fn tokenizer_files(&self) -> Vec<(String, Vec<u8>)> {
        Vec::new()
    }
    fn info(&self) -> &BaseModelInfo;
    /// Whether a request would be queued now; checked before any rendering.
    fn has_capacity(&self) -> bool;
    /// The adapters its engine is running and holding in its queue.
    fn lora_activity(&self) -> LoraActivity {
        LoraActivity::default()
    }
    /// What the chat template (the request's or the model's) does with tools: whether it
    /// renders them, and the call syntax it shows the model.
    fn tool_template(&self, chat: &ChatRender) -> ToolTemplate;
    /// Renders and tokenizes a chat.
    fn render_chat(&self, chat: &ChatRender) -> Result<Vec<u32>, InputError>;
    fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, InputError>;
    fn detokenize(&self, tokens: &[u32], skip_special_tokens: bool) -> Result<String, InputError>;
    /// Each token's text as a stream shows it (a character split across tokens appears with
    /// its last token), and the text held back at the end; linear in the number of tokens.
    fn token_texts(&self, tokens: &[u32], skip_special_tokens: bool) -> Result<(Vec<String>, String), InputError>;
    fn token_text(&self, token: u32) -> String;
    /// The token whose raw bytes these are (logprob entries carry them).
    fn token_id_for_bytes(&self, bytes: &[u8]) -> Option<u32>;
    /// The engine's half of validation: the request fits the engine (choices, KV positions), its
    /// constraint compiles (a 400 naming the field otherwise) and its adapter is loaded.
    fn prepare(&self, request: GenerateRequest) -> Result<ValidRequest, SubmitError>;
    /// Loads an adapter now and keeps it cached (`/v1/load_lora_adapter`; blocking). The error
    /// says why it does not fit this model, naming files relative to the adapter's directory.
    fn load_adapter(&self, adapter: &AdapterRef) -> Result<(), String>;
    /// Queues a prepared request. Never blocks.
    fn submit(&self, request: ValidRequest) -> Result<UnboundedReceiver<InferEvent>, SubmitError>;
    /// Writes this base model with the adapter of `adapter_dir` merged into `out`, a GGUF file
    /// whose weight matrices take `format` ([`MERGE_FORMATS`]). Blocking, and long: seconds per
    /// hundred MB of model.
    fn export_merged(&self, adapter_dir: &Path, out: &Path, format: &str) -> Result<(), ExportError> {
        let _ = (adapter_dir, out, format);
        Err(ExportError::Unsupported("this model cannot be exported merged".into()))
    }
}

/// The `format` values of a merged export: `base` (each tensor keeps its type), `f32`, `f16`,
/// `q8_0`.
pub const MERGE_FORMATS: [&str; 4] = ["base", "f32", "f16", "q8_0"];

/// Why a merged export failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// The request cannot be met for this model (its base is not a GGUF file, the adapter does
    /// not fit it): a 409.
    #[error("{0}")]
    Unsupported(String),
    /// Reading or writing failed: a 500.
    #[error("{0}")]
    Failed(String),
}

/// A served model as handlers hold it.
pub type ModelHandle = Arc<dyn ServedModel>;

/// The engine, as the api sees it: its served models, and what concerns all of them.
pub trait InferenceBackend: Send + Sync + 'static {
    /// The served base models, the default first.
    fn models(&self) -> Vec<ModelHandle>;
    /// Drops any cached copy of a checkpoint's adapter (after deletion).
    fn forget_adapter(&self, checkpoint_id: &str);
    /// Whether the engine loop is alive and making progress.
    fn healthy(&self) -> bool;
    /// Adds the engine's metric families (vLLM's names) to the server's registry, once.
    fn register_metrics(&self, registry: &mut crate::telemetry::prometheus_client::registry::Registry);
}

pub type SharedBackend = Arc<dyn InferenceBackend>;
