//! Tiny random-weight models (hidden 64, byte-level vocabulary of 258 with ChatML specials) of
//! each architecture, written as GGUF, for tests of the model, the engine and the trainer that
//! must not need a real model. Deterministic: the same file every time. Also where the tests that
//! do use the real files find them, and the ordinary token ids they prompt them with.

use crate::Arch;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::path::{Path, PathBuf};

mod hf;
pub use hf::{write_hf_dir, write_tiny_hf_dir, HfDtype};

pub const HIDDEN: usize = 64;
pub const FFN: usize = 128;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const LAYERS: usize = 2;

/// Deterministic weights in [-0.5, 0.5).
pub fn weights(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// A real model file `make model*` fetched into the repository's `models/` (or the path the
/// variable `env` names), `None` when it is not there.
pub fn model_file(env: &str, name: &str) -> Option<PathBuf> {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name));
    path.is_file().then_some(path)
}

/// `n` ordinary token ids (300 to 20,299, in every test model's vocabulary) from a xorshift
/// seeded with `seed`.
pub fn token_ids(n: usize, seed: u32) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            300 + x % 20_000
        })
        .collect()
}

/// GPT-2's printable form of each byte, so that the byte-level tokenizer maps bytes 1:1.
pub fn byte_tokens() -> Vec<String> {
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

/// Writes the tiny Llama to `path`.
pub fn write_tiny_gguf(path: &Path) {
    write_tiny_arch_gguf(path, Arch::Llama)
}

/// Layers of the tiny model of `arch`: Gemma 3's has one global layer after five sliding ones.
pub fn tiny_layers(arch: Arch) -> usize {
    if arch == Arch::Gemma3 {
        6
    } else {
        LAYERS
    }
}

/// The tiny model's head dimension: Qwen3 and Gemma 3 heads are wider than hidden / heads, as
/// in the real models (q is then wider than the residual stream).
pub fn tiny_head_dim(arch: Arch) -> usize {
    if arch.qk_norm() {
        32
    } else {
        HIDDEN / HEADS
    }
}

/// Gemma 3's tiny sliding window: short, so a few tokens already reach past it.
pub const TINY_WINDOW: u32 = 5;

/// Writes a tiny random model of `arch` with every tensor the architecture has, in a mix of
/// storage types (below).
pub fn write_tiny_arch_gguf(path: &Path, arch: Arch) {
    let mut tokens = byte_tokens();
    tokens.push("<|im_start|>".into());
    tokens.push("<|im_end|>".into());
    let vocab = tokens.len(); // 258
    let mut types = vec![Value::I32(1); 256];
    types.extend([Value::I32(3), Value::I32(3)]);
    let template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let (layers, head_dim) = (tiny_layers(arch), tiny_head_dim(arch));
    let key = |k: &str| format!("{}.{k}", arch.name());
    let mut arch_meta: Vec<(String, Value)> = vec![
        (key("block_count"), Value::U32(layers as u32)),
        (key("embedding_length"), Value::U32(HIDDEN as u32)),
        (key("feed_forward_length"), Value::U32(FFN as u32)),
        (key("attention.head_count"), Value::U32(HEADS as u32)),
        (key("attention.head_count_kv"), Value::U32(KV_HEADS as u32)),
        (key("rope.freq_base"), Value::F32(if arch == Arch::Gemma3 { 1_000_000.0 } else { 10000.0 })),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (key("context_length"), Value::U32(8192)),
    ];
    if arch != Arch::Llama {
        arch_meta.push((key("attention.key_length"), Value::U32(head_dim as u32)));
        arch_meta.push((key("attention.value_length"), Value::U32(head_dim as u32)));
    }
    if arch == Arch::Gemma3 {
        arch_meta.push((key("attention.sliding_window"), Value::U32(TINY_WINDOW)));
    }
    let mut meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String(arch.name().into())),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", Value::Array(tokens.into_iter().map(Value::String).collect())),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.merges", Value::Array(Vec::new())),
        ("tokenizer.ggml.eos_token_id", Value::U32(257)),
        ("tokenizer.chat_template", Value::String(template.into())),
    ];
    meta.extend(arch_meta.iter().map(|(k, v)| (k.as_str(), v.clone())));
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
    // Storage types per architecture, so that every path of the loader and the kernels runs:
    // Q4_1 and the block formats as stored (their raw rows permuted for the halves order), Q8_0
    // dequantised (the f32 permutation), mixed q/k/v fused as int8 and same-format ones natively.
    use GgmlDType::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
    let [q_t, k_t, v_t, gate_up_t, down_t] = match arch {
        Arch::Llama => [Q4_1, Q4_1, Q4_1, Q4_1, Q4_1],
        Arch::Qwen2 => [Q4_1, Q8_0, Q4_1, Q5_0, Q4_0],
        Arch::Qwen3 => [Q5_1, Q5_1, Q5_1, Q4_1, Q4_1],
        Arch::Gemma3 => [Q5_0, Q5_0, Q5_0, Q4_0, Q5_1],
    };
    for l in 0..layers {
        add(format!("blk.{l}.attn_norm.weight"), 1, HIDDEN, GgmlDType::F32, 2.0);
        add(format!("blk.{l}.attn_q.weight"), HEADS * head_dim, HIDDEN, q_t, 0.5);
        add(format!("blk.{l}.attn_k.weight"), KV_HEADS * head_dim, HIDDEN, k_t, 0.5);
        add(format!("blk.{l}.attn_v.weight"), KV_HEADS * head_dim, HIDDEN, v_t, 0.5);
        add(format!("blk.{l}.attn_output.weight"), HIDDEN, HEADS * head_dim, GgmlDType::Q4_1, 0.5);
        add(format!("blk.{l}.ffn_norm.weight"), 1, HIDDEN, GgmlDType::F32, 2.0);
        add(format!("blk.{l}.ffn_gate.weight"), FFN, HIDDEN, gate_up_t, 0.5);
        add(format!("blk.{l}.ffn_up.weight"), FFN, HIDDEN, gate_up_t, 0.5);
        add(format!("blk.{l}.ffn_down.weight"), HIDDEN, FFN, down_t, 0.5);
        if arch.qkv_bias() {
            add(format!("blk.{l}.attn_q.bias"), 1, HEADS * head_dim, GgmlDType::F32, 1.0);
            add(format!("blk.{l}.attn_k.bias"), 1, KV_HEADS * head_dim, GgmlDType::F32, 1.0);
            add(format!("blk.{l}.attn_v.bias"), 1, KV_HEADS * head_dim, GgmlDType::F32, 1.0);
        }
        if arch.qk_norm() {
            add(format!("blk.{l}.attn_q_norm.weight"), 1, head_dim, GgmlDType::F32, 2.0);
            add(format!("blk.{l}.attn_k_norm.weight"), 1, head_dim, GgmlDType::F32, 2.0);
        }
        if arch.post_norms() {
            add(format!("blk.{l}.post_attention_norm.weight"), 1, HIDDEN, GgmlDType::F32, 2.0);
            add(format!("blk.{l}.post_ffw_norm.weight"), 1, HIDDEN, GgmlDType::F32, 2.0);
        }
    }
    add("output_norm.weight".into(), 1, HIDDEN, GgmlDType::F32, 2.0);
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
}
