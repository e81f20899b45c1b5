//! The engine on a tiny random-weight Llama written as GGUF by the test itself (2 layers, hidden
//! 64, byte-level vocabulary): batching, LoRA and cancellation, fast and without the real model.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tandem_core::inference::{AdapterRef, GenerateRequest, InferEvent, InferenceBackend, SamplingParams};
use tandem_engine::{Engine, EngineConfig};

const HIDDEN: usize = 64;
const FFN: usize = 128;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 2;

/// Deterministic weights in [-0.5, 0.5).
fn weights(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// GPT-2's printable form of each byte, so that the byte-level tokenizer maps bytes 1:1.
fn byte_tokens() -> Vec<String> {
    let mut next = 256u32;
    (0..256u32)
        .map(|b| {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
            let c = if printable {
                char::from_u32(b).unwrap()
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c
            };
            c.to_string()
        })
        .collect()
}

fn write_tiny_gguf(path: &Path) {
    let mut tokens = byte_tokens();
    tokens.push("<|im_start|>".into());
    tokens.push("<|im_end|>".into());
    let vocab = tokens.len(); // 258
    let mut types = vec![Value::I32(1); 256];
    types.extend([Value::I32(3), Value::I32(3)]);
    let template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(LAYERS as u32)),
        ("llama.embedding_length", Value::U32(HIDDEN as u32)),
        ("llama.feed_forward_length", Value::U32(FFN as u32)),
        ("llama.attention.head_count", Value::U32(HEADS as u32)),
        ("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.context_length", Value::U32(8192)),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("default".into())),
        ("tokenizer.ggml.tokens", Value::Array(tokens.into_iter().map(Value::String).collect())),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.merges", Value::Array(Vec::new())),
        ("tokenizer.ggml.eos_token_id", Value::U32(257)),
        ("tokenizer.chat_template", Value::String(template.into())),
    ];
    let head_dim = HIDDEN / HEADS;
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut seed = 0;
    let mut add = |name: String, rows: usize, cols: usize, dtype: GgmlDType, scale: f32| {
        seed += 1;
        let data: Vec<f32> = weights(rows * cols, seed).into_iter().map(|w| w * scale).collect();
        let shape: Vec<usize> = if rows == 1 { vec![cols] } else { vec![rows, cols] };
        let t = Tensor::from_vec(data, shape, &Device::Cpu).unwrap();
        tensors.push((name, QTensor::quantize(&t, dtype).unwrap()));
    };
    add("token_embd.weight".into(), vocab, HIDDEN, GgmlDType::Q8_0, 1.0);
    for l in 0..LAYERS {
        add(format!("blk.{l}.attn_norm.weight"), 1, HIDDEN, GgmlDType::F32, 2.0);
        add(format!("blk.{l}.attn_q.weight"), HEADS * head_dim, HIDDEN, GgmlDType::Q4_1, 0.5);
        add(format!("blk.{l}.attn_k.weight"), KV_HEADS * head_dim, HIDDEN, GgmlDType::Q4_1, 0.5);
        add(format!("blk.{l}.attn_v.weight"), KV_HEADS * head_dim, HIDDEN, GgmlDType::Q4_1, 0.5);
        add(format!("blk.{l}.attn_output.weight"), HIDDEN, HEADS * head_dim, GgmlDType::Q4_1, 0.5);
        add(format!("blk.{l}.ffn_norm.weight"), 1, HIDDEN, GgmlDType::F32, 2.0);
        add(format!("blk.{l}.ffn_gate.weight"), FFN, HIDDEN, GgmlDType::Q4_1, 0.5);
        add(format!("blk.{l}.ffn_up.weight"), FFN, HIDDEN, GgmlDType::Q4_1, 0.5);
        add(format!("blk.{l}.ffn_down.weight"), HIDDEN, FFN, GgmlDType::Q4_1, 0.5);
    }
    add("output_norm.weight".into(), 1, HIDDEN, GgmlDType::F32, 2.0);
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
}

/// A PEFT adapter on q and down of every layer, with `b_value` in every B entry (0 = no-op).
fn write_adapter(dir: &Path, b_value: f32) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("adapter_config.json"),
        r#"{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "down_proj"]}"#,
    )
    .unwrap();
    let mut t = HashMap::new();
    for l in 0..LAYERS {
        for (module, in_dim, out_dim) in [("self_attn.q_proj", HIDDEN, HIDDEN), ("mlp.down_proj", FFN, HIDDEN)] {
            let p = format!("base_model.model.model.layers.{l}.{module}");
            t.insert(
                format!("{p}.lora_A.weight"),
                Tensor::from_vec(weights(8 * in_dim, l as u64 + 99), (8, in_dim), &Device::Cpu).unwrap(),
            );
            t.insert(
                format!("{p}.lora_B.weight"),
                Tensor::from_vec(vec![b_value; out_dim * 8], (out_dim, 8), &Device::Cpu).unwrap(),
            );
        }
    }
    candle_core::safetensors::save(&t, dir.join("adapter_model.safetensors")).unwrap();
}

fn request(prompt: &[u32], max_tokens: usize, adapter: Option<AdapterRef>) -> GenerateRequest {
    let params = SamplingParams { temperature: 0.0, max_tokens, ignore_eos: true, ..Default::default() };
    GenerateRequest {
        request_id: "t".into(),
        base: 0,
        adapter,
        prompt: prompt.to_vec(),
        n: 1,
        params,
        priority: 0,
        cache_salt: None,
        prompt_logprobs: None,
    }
}

async fn tokens(mut rx: tokio::sync::mpsc::UnboundedReceiver<InferEvent>) -> Vec<u32> {
    let mut out = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            InferEvent::Token { token_id, .. } => out.push(token_id),
            InferEvent::Finished { .. } => return out,
            InferEvent::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    panic!("no Finished event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_lora_and_cancellation_on_a_tiny_model() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let mut engine = Engine::new();
    engine.add_gguf("tiny", &gguf, EngineConfig::default()).unwrap();
    let e = &engine;
    let prompt = e.tokenize(0, "hello tiny model", false).unwrap();
    assert_eq!(prompt.len(), 16, "one token per byte");

    // Alone, then batched with other sequences of other lengths: the same tokens.
    let alone = tokens(e.submit(request(&prompt, 12, None)).unwrap()).await;
    let others: Vec<_> = (0..3).map(|i| e.submit(request(&prompt[..5 + i * 3], 20, None)).unwrap()).collect();
    let together = e.submit(request(&prompt, 12, None)).unwrap();
    let batched = tokens(together).await;
    for o in others {
        tokens(o).await;
    }
    assert_eq!(alone.len(), 12);
    assert_eq!(batched, alone, "batched output must equal unbatched output");

    // A zero-initialised adapter changes nothing; a non-zero one changes the output.
    write_adapter(&dir.path().join("zero"), 0.0);
    write_adapter(&dir.path().join("trained"), 0.5);
    let zero = AdapterRef { checkpoint_id: "zero".into(), path: dir.path().join("zero") };
    let trained = AdapterRef { checkpoint_id: "trained".into(), path: dir.path().join("trained") };
    assert_eq!(tokens(e.submit(request(&prompt, 12, Some(zero))).unwrap()).await, alone);
    let with_lora = tokens(e.submit(request(&prompt, 12, Some(trained))).unwrap()).await;
    assert_ne!(with_lora, alone, "a trained adapter must change greedy output");

    // A dropped receiver frees its sequence within a step or two.
    let mut rx = e.submit(request(&prompt, 8000, None)).unwrap();
    while !matches!(rx.recv().await, Some(InferEvent::Token { .. })) {}
    drop(rx);
    let deadline = Instant::now() + Duration::from_secs(10);
    // The gauge may still read 0 from before this request ran, so wait for the abort as well.
    let freed = |m: String| {
        m.contains("tandem:num_requests_running{model_name=\"tiny\"} 0") && m.contains("finished_reason=\"abort\"} 1")
    };
    while !freed(e.metrics_text()) {
        assert!(Instant::now() < deadline, "the cancelled sequence is still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
