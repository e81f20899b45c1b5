//! tandem's model code, synchronous and request-agnostic: GGUF loading, CPU kernels, the Llama
//! forward pass over a ragged batch with per-sequence KV caches, and per-sequence LoRA.
//!
//! candle reads the GGUF file and dequantises its tensors; the forward pass runs on our own
//! kernels (`kernels`), because candle's quantised matmul reads the weights once per token and so
//! does not get cheaper with batching (measured in `docs/benchmarks.md`).

pub mod gguf;
pub mod kernels;
pub mod kv;
pub mod llama;
pub mod lora;
pub mod merge;
pub mod peft;
pub mod testing;

pub use gguf::{GgufFile, TokenizerMeta};
pub use kv::KvCache;
pub use llama::{Layer, Llama, LlamaConfig, Logits, SeqInput};
pub use lora::LoraAdapter;

use kernels::{Q4Matrix, Q8Matrix, Weights};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read GGUF: {0}")]
    Gguf(String),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("cannot load LoRA adapter: {0}")]
    Adapter(String),
    #[error("sequence needs {needed} positions but the model's context is {limit}")]
    ContextOverflow { needed: usize, limit: usize },
    #[error("token id {0} is outside the vocabulary")]
    TokenOutOfRange(u32),
}

/// A loaded model file: the network and what the tokenizer needs.
pub struct LoadedModel {
    pub model: Llama,
    pub tokenizer: TokenizerMeta,
}

/// Loads a Llama GGUF, requantising every matrix to the kernels' Q8 layout.
pub fn load_gguf(path: &Path) -> Result<LoadedModel, ModelError> {
    let mut file = GgufFile::open(path)?;
    let config = file.llama_config()?;
    let tokenizer = file.tokenizer_meta();
    let (h, f, qd, kvd) = (config.hidden, config.ffn, config.q_dim(), config.kv_dim());
    // Only the lane-packed copies are kept where the CPU has VNNI (rows are read from them).
    let embed = matrix(&mut file, "token_embd.weight", config.vocab, h)?.lanes_only();
    let mut layers = Vec::with_capacity(config.n_layer);
    for i in 0..config.n_layer {
        let p = format!("blk.{i}");
        let qkv = Weights::vstack(vec![
            matrix(&mut file, &format!("{p}.attn_q.weight"), qd, h)?,
            matrix(&mut file, &format!("{p}.attn_k.weight"), kvd, h)?,
            matrix(&mut file, &format!("{p}.attn_v.weight"), kvd, h)?,
        ])
        .lanes_only();
        let o = matrix(&mut file, &format!("{p}.attn_output.weight"), h, qd)?.lanes_only();
        let gate_up = Weights::vstack(vec![
            matrix(&mut file, &format!("{p}.ffn_gate.weight"), f, h)?,
            matrix(&mut file, &format!("{p}.ffn_up.weight"), f, h)?,
        ])
        .lanes_only();
        let down = matrix(&mut file, &format!("{p}.ffn_down.weight"), h, f)?.lanes_only();
        layers.push(Layer {
            attn_norm: vector(&mut file, &format!("{p}.attn_norm.weight"), h)?,
            qkv,
            o,
            ffn_norm: vector(&mut file, &format!("{p}.ffn_norm.weight"), h)?,
            gate_up,
            down,
        });
    }
    let out_norm = vector(&mut file, "output_norm.weight", h)?;
    let lm_head = if file.has_tensor("output.weight") {
        Some(matrix(&mut file, "output.weight", config.vocab, h)?.lanes_only())
    } else {
        None
    };
    Ok(LoadedModel { model: Llama::new(config, embed, layers, out_norm, lm_head), tokenizer })
}

/// A weight matrix: Q4_1 tensors stay as stored, anything else becomes int8 blocks.
pub fn matrix(file: &mut GgufFile, name: &str, rows: usize, cols: usize) -> Result<Weights, ModelError> {
    if cols.is_multiple_of(kernels::QK) {
        let (dtype, raw) = file.tensor_raw(name)?;
        if dtype == candle_core::quantized::GgmlDType::Q4_1 {
            return Q4Matrix::from_q4_1_bytes(&raw, rows, cols).map(Weights::Q4).ok_or_else(|| {
                ModelError::Gguf(format!("{name}: {} bytes do not make a ({rows}, {cols}) Q4_1 matrix", raw.len()))
            });
        }
    }
    let (data, dims) = file.tensor_f32(name)?;
    if dims.iter().product::<usize>() != rows * cols {
        return Err(ModelError::Gguf(format!("{name} has shape {dims:?}, expected ({rows}, {cols})")));
    }
    if !cols.is_multiple_of(kernels::QK) {
        return Err(ModelError::Unsupported(format!("{name}: {cols} columns is not a multiple of {}", kernels::QK)));
    }
    Ok(Weights::Q8(Q8Matrix::from_f32(&data, rows, cols)))
}

fn vector(file: &mut GgufFile, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let (data, _) = file.tensor_f32(name)?;
    if data.len() != len {
        return Err(ModelError::Gguf(format!("{name} has {} values, expected {len}", data.len())));
    }
    Ok(data)
}
