//! The engine on the real bundled model: tokenizer facts, and greedy answers that only a
//! correct forward pass produces.

use std::path::PathBuf;
use tandem_core::inference::{
    ChatRender, FinishReason, GenerateRequest, InferEvent, InferenceBackend, ModelHandle, SamplingParams,
};
use tandem_engine::{Engine, EngineConfig};

fn model_path() -> PathBuf {
    let path = std::env::var_os("TANDEM_TEST_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    assert!(path.is_file(), "{} is missing: run `make model`", path.display());
    path
}

fn engine() -> ModelHandle {
    let mut e = Engine::new();
    e.add_path("smol", &model_path(), Default::default(), EngineConfig::default()).unwrap();
    e.models()[0].clone()
}

fn chat(user: &str) -> ChatRender {
    ChatRender {
        messages: vec![tandem_core::chat::ChatMessage::text_message("user", user)],
        add_generation_prompt: true,
        ..Default::default()
    }
}

async fn generate(e: &ModelHandle, prompt: Vec<u32>, params: SamplingParams) -> (Vec<u32>, String, FinishReason) {
    let req = GenerateRequest {
        request_id: "t".into(),
        adapter: None,
        prompt,
        n: 1,
        params,
        priority: 0,
        tenant: "a".into(),
        cache_salt: None,
        prompt_logprobs: None,
        prompt_scoring: None,
        beam_step: false,
    };
    let mut rx = e.submit(e.prepare(req).unwrap()).unwrap();
    let (mut ids, mut text) = (Vec::new(), String::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            InferEvent::Token { token_id, text: t, .. } => {
                ids.push(token_id);
                text.push_str(&t);
            }
            InferEvent::Finished { reason, text: t, .. } => {
                text.push_str(&t);
                return (ids, text, reason);
            }
            InferEvent::Started { .. } | InferEvent::PromptLogprobs(_) | InferEvent::PromptScores(_) => {}
            InferEvent::Error(e) => panic!("{e}"),
        }
    }
    panic!("stream ended without Finished")
}

#[test]
fn tokenizer_matches_the_model() {
    let e = engine();
    assert_eq!(e.tokenize("<|im_start|>user\n", false).unwrap()[0], 1);
    assert_eq!(e.tokenize("<|im_end|>", false).unwrap(), vec![2]);
    // Digits are split one by one; no prefix space is added.
    let ids = e.tokenize("2024", false).unwrap();
    assert_eq!(ids.len(), 4);
    let hello = e.tokenize("Hello", false).unwrap();
    assert_eq!(hello.len(), 1);
    assert_eq!(e.token_text(hello[0]), "Hello");
    for s in
        ["Hello, world!", "naïve café 日本語 🎉", "  two  spaces\n\nand tabs\t", "<|im_start|>assistant\nHi<|im_end|>"]
    {
        let ids = e.tokenize(s, false).unwrap();
        assert_eq!(e.detokenize(&ids, false).unwrap(), s);
    }
    let prompt = e.render_chat(&chat("Hi")).unwrap();
    assert_eq!(
        e.detokenize(&prompt, false).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_answers_are_sensible() {
    let e = engine();
    let greedy = SamplingParams { temperature: 0.0, max_tokens: 24, ..Default::default() };
    let prompt = e.tokenize("The capital of France is", false).unwrap();
    let (ids, text, reason) = generate(&e, prompt.clone(), greedy.clone()).await;
    assert!(text.starts_with(" Paris"), "{text:?}");
    assert_eq!((ids.len(), reason), (24, FinishReason::Length));
    // Greedy decoding is deterministic.
    let (ids2, _, _) = generate(&e, prompt, greedy).await;
    assert_eq!(ids, ids2);
}
