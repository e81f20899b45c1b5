//! The chat route against a fake served model: the request path from body to engine and back
//! (one validation, one submit) without the real engine, so each rule is checked in milliseconds.
//!
//! The fake's tokens are bytes; its "template" writes `role: content\n` per message; it answers
//! with the last message reversed (with `[checkpoint-id]` first when an adapter is loaded).

mod common;

use common::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tandem_api::Limits;
use tandem_core::inference::{
    BaseModelInfo, ChatRender, FinishReason, GenerateRequest, InferEvent, InferenceBackend, InputError, ModelHandle,
    ServedModel, SubmitError, ValidRequest,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

const CONTEXT: usize = 96;
const EOS: u32 = 256;

struct Fake {
    info: BaseModelInfo,
    capacity: AtomicBool,
    /// While set, loading an adapter waits for a message on it (a slow safetensors read).
    load_gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    prepared: AtomicUsize,
    submitted: AtomicUsize,
}

impl Fake {
    fn new() -> Arc<Self> {
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

struct FakeBackend(Arc<Fake>);

impl InferenceBackend for FakeBackend {
    fn models(&self) -> Vec<ModelHandle> {
        vec![self.0.clone() as ModelHandle]
    }
    fn forget_adapter(&self, _: &str) {}
    fn healthy(&self) -> bool {
        true
    }
    fn metrics_text(&self) -> String {
        String::new()
    }
}

fn text_of(messages: &[tandem_core::chat::ChatMessage]) -> String {
    messages.iter().map(|m| format!("{}: {}\n", m.role, m.text())).collect()
}

impl ServedModel for Fake {
    fn info(&self) -> &BaseModelInfo {
        &self.info
    }
    fn has_capacity(&self) -> bool {
        self.capacity.load(Ordering::SeqCst)
    }
    fn renders_tools(&self, _: &ChatRender) -> bool {
        false
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
    fn submit(&self, request: ValidRequest) -> Result<UnboundedReceiver<InferEvent>, SubmitError> {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        let (req, adapter, _) = request.into_parts();
        let text = String::from_utf8_lossy(&req.prompt.iter().map(|t| *t as u8).collect::<Vec<_>>()).into_owned();
        let last = text.lines().last().unwrap_or("").split_once(": ").map_or("", |(_, c)| c).to_string();
        let mut answer: String = last.chars().rev().collect();
        if let Some(a) = adapter {
            answer = format!("[{}]{answer}", a.downcast::<String>().unwrap());
        }
        let (tx, rx) = unbounded_channel();
        let _ = tx.send(InferEvent::Started { cached_tokens: 0 });
        for choice in 0..req.n {
            let bytes = answer.as_bytes();
            let take = bytes.len().min(req.params.max_tokens);
            for b in &bytes[..take] {
                let ev = InferEvent::Token {
                    choice,
                    token_id: u32::from(*b),
                    text: (*b as char).to_string(),
                    logprob: None,
                };
                let _ = tx.send(ev);
            }
            let reason = if take < bytes.len() { FinishReason::Length } else { FinishReason::Stop };
            let _ = tx.send(InferEvent::Finished { choice, reason, stop_reason: None, text: String::new() });
        }
        Ok(rx)
    }
}

async fn app_with(fake: &Arc<Fake>) -> TestApp {
    test_app_serving(Limits::default(), Some(Arc::new(FakeBackend(fake.clone())))).await
}

fn chat(content: &str) -> Value {
    json!({"model": BASE, "messages": [{"role": "user", "content": content}]})
}

#[tokio::test]
async fn a_chat_is_validated_once_and_submitted_once() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let r = app.ok("POST", "/v1/chat/completions", KEY_A, Some(chat("hello"))).await;
    assert_eq!(r["choices"][0]["message"]["content"], "olleh");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert_eq!(r["model"], BASE);
    // "user: hello\n" is 12 byte tokens.
    assert_eq!((r["usage"]["prompt_tokens"].as_u64(), r["usage"]["completion_tokens"].as_u64()), (Some(12), Some(5)));
    assert_eq!((fake.prepared.load(Ordering::SeqCst), fake.submitted.load(Ordering::SeqCst)), (1, 1));

    // Two choices, the output cut by max_completion_tokens.
    let body = json!({"messages": [{"role": "user", "content": "abcdef"}], "n": 2, "max_completion_tokens": 3,
        "temperature": 0.7});
    let r = app.ok("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    let contents: Vec<&Value> = r["choices"].as_array().unwrap().iter().map(|c| &c["message"]["content"]).collect();
    assert_eq!(contents, [&json!("fed"), &json!("fed")]);
    assert_eq!(r["choices"][1]["finish_reason"], "length");

    // Streamed: role chunk, a delta per token, the finish, [DONE].
    let mut body = chat("ab");
    body["stream"] = json!(true);
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.bytes).unwrap();
    let deltas: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(deltas, "ba");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
}

#[tokio::test]
async fn the_model_half_of_validation_names_the_field() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    let error = |r: Reply| (r.status.as_u16(), r.json()["error"]["param"].as_str().map(str::to_string));
    // The prompt must leave room in the context.
    let long = "x".repeat(CONTEXT);
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(chat(&long))).await;
    assert_eq!(error(r), (400, Some("messages".into())));
    // Asking for more than the whole context is an error, not a clamp.
    let mut body = chat("hi");
    body["max_completion_tokens"] = json!(CONTEXT + 1);
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(error(r), (400, Some("max_completion_tokens".into())));
    // Token ids beyond the vocabulary.
    for (field, value) in [("logit_bias", json!({"300": 1.0})), ("stop_token_ids", json!([257]))] {
        let mut body = chat("hi");
        body[field] = value;
        let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
        assert_eq!(error(r), (400, Some(field.into())), "{field}");
    }
    // The template's failure, and the engine's refusal of a constraint, are 400s naming the field.
    let mut body = chat("hi");
    body["chat_template"] = json!("{{ nope }}");
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(error(r), (400, Some("messages".into())));
    let mut body = chat("hi");
    body["structured_outputs"] = json!({"regex": "a+"});
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(error(r), (400, Some("structured_outputs".into())));
    // Nothing refused above reached the queue.
    assert_eq!(fake.submitted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_full_engine_is_a_503_before_the_body_is_read() {
    let fake = Fake::new();
    let app = app_with(&fake).await;
    fake.capacity.store(false, Ordering::SeqCst);
    let r = app.raw("POST", "/v1/chat/completions", Some(KEY_A), Some(b"{not json".to_vec())).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers.get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    fake.capacity.store(true, Ordering::SeqCst);
    let r = app.raw("POST", "/v1/chat/completions", Some(KEY_A), Some(b"{not json".to_vec())).await;
    assert_eq!(r.status, 400);
}

/// A checkpoint's adapter is loaded by `prepare` on a blocking thread: while one load is stuck,
/// this single-threaded runtime goes on answering other requests; the answer then comes from the
/// adapter. Another entity's model, or a checkpoint without files, never reaches the queue.
#[tokio::test(flavor = "current_thread")]
async fn adapters_load_off_the_async_worker() {
    let fake = Fake::new();
    let app = Arc::new(app_with(&fake).await);
    let m = app.create_model(KEY_A, "agent").await;
    let model_id: uuid::Uuid = m["id"].as_str().unwrap().parse().unwrap();
    let path = add_checkpoint(&app, model_id, 3).await;
    let checkpoint = app.ok("GET", &format!("/v1/preview/models/{model_id}/checkpoints"), KEY_A, None).await;
    let checkpoint_id = checkpoint["data"][0]["id"].as_str().unwrap().to_string();

    let (release, gate) = std::sync::mpsc::channel();
    *fake.load_gate.lock().unwrap() = Some(gate);
    let name = "wandb-artifact:///a/proj/agent:step3";
    let pending = tokio::spawn({
        let app = app.clone();
        async move {
            let body = json!({"model": name, "messages": [{"role": "user", "content": "abc"}]});
            app.ok("POST", "/v1/chat/completions", KEY_A, Some(body)).await
        }
    });
    // Let the chat reach its load, then ask for something else.
    while fake.prepared.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let models = tokio::time::timeout(std::time::Duration::from_secs(10), app.ok("GET", "/v1/models", KEY_A, None))
        .await
        .expect("the runtime answered while an adapter loaded");
    assert!(models["data"].as_array().unwrap().iter().any(|m| m["id"] == name));
    assert!(!pending.is_finished());
    release.send(()).unwrap();
    let r = pending.await.unwrap();
    assert_eq!(r["choices"][0]["message"]["content"], format!("[{checkpoint_id}]cba"));
    assert_eq!(r["model"], name);
    *fake.load_gate.lock().unwrap() = None;

    let submitted = fake.submitted.load(Ordering::SeqCst);
    let body = json!({"model": name, "messages": [{"role": "user", "content": "abc"}]});
    let r = app.call("POST", "/v1/chat/completions", KEY_B, Some(body)).await;
    assert_eq!(r.status, 404, "another entity's model");
    std::fs::remove_file(app.checkpoints.resolve(&path).unwrap().join("adapter_config.json")).unwrap();
    let body = json!({"model": name, "messages": [{"role": "user", "content": "abc"}]});
    let r = app.call("POST", "/v1/chat/completions", KEY_A, Some(body)).await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.bytes));
    assert_eq!(fake.submitted.load(Ordering::SeqCst), submitted, "refused requests are never queued");
}
