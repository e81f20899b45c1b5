//! tandem's model code, synchronous and request-agnostic: GGUF loading, CPU kernels, the forward
//! pass of the Llama family (Llama, Qwen2, Qwen3, Gemma 3: `arch`) over a ragged batch with
//! per-sequence KV caches, and per-sequence LoRA.
//!
//! candle reads the GGUF file and dequantises its tensors; the forward pass runs on our own
//! kernels (`kernels`), because candle's quantised matmul reads the weights once per token and so
//! does not get cheaper with batching (measured in `docs/benchmarks.md`).

pub mod allocator;
pub mod arch;
pub mod as_served;
pub mod gguf;
pub mod hf;
pub mod kernels;
pub mod kv;
pub mod llama;
pub mod lora;
pub mod merge;
pub mod peft;
pub mod priority;
pub mod source;
pub mod testing;

pub use arch::{Activation, Arch, SlidingWindow};
pub use gguf::{GgufFile, TokenizerMeta};
pub use kv::{KvCache, KV_VALUE_BYTES};
pub use llama::{Layer, LayerExtra, Llama, LlamaConfig, Logits, SeqInput, StepLogits};
pub use lora::LoraAdapter;
pub use source::WeightSource;

use candle_core::quantized::GgmlDType;
use kernels::{BlockFormat, BlockMatrix, Q4Matrix, Q8Matrix, Weights};
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

/// How matrices are kept that are not already in a format the kernels use as stored (Q4_1, the
/// K-quants, Q4_0, Q5_0, Q5_1; `--quantize`): int8 blocks of 32 with an f32 scale (the default),
/// Q4_1, Q4_K (Q5_0 for rows that are not a multiple of 256 long, as llama.cpp's Q4_K_M does), or
/// none: float tensors (F32, F16, BF16, safetensors) stay f32, the others int8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quantize {
    #[default]
    Q8_0,
    Q4_1,
    Q4K,
    None,
}

impl Quantize {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "q8_0" => Some(Quantize::Q8_0),
            "q4_1" => Some(Quantize::Q4_1),
            "q4_k" => Some(Quantize::Q4K),
            "none" => Some(Quantize::None),
            _ => None,
        }
    }
}

/// [`load_model`] with the default quantisation.
pub fn load(path: &Path) -> Result<LoadedModel, ModelError> {
    load_model(path, Quantize::default())
}

/// Loads a model of any architecture in `arch`, from a GGUF file or a Hugging Face checkpoint
/// directory, with every matrix in the kernels' layouts.
pub fn load_model(path: &Path, quantize: Quantize) -> Result<LoadedModel, ModelError> {
    let mut file = WeightSource::open(path)?;
    let config = file.llama_config()?;
    let tokenizer = file.tokenizer_meta()?;
    let file = &mut Loader { source: &mut file, quantize };
    let (h, f, qd, kvd) = (config.hidden, config.ffn, config.q_dim(), config.kv_dim());
    // Only the lane-packed copies are kept where the CPU has VNNI (rows are read from them).
    let embed = matrix(file, "token_embd.weight", config.vocab, h)?.lanes_only();
    // The output head (when not tied) next: the vocabulary's matrices are a model's largest, and
    // each holds its file bytes beside its packed copy while it loads. Loaded first, that
    // transient sits below the final size; loaded last, it sat on top of every layer (issue 31:
    // +280 MB on Qwen2.5 0.5B's Q8_0 head). Their temporaries go back before the layers load.
    let lm_head = if file.source.has_tensor("output.weight") {
        Some(matrix(file, "output.weight", config.vocab, h)?.lanes_only())
    } else {
        None
    };
    crate::allocator::release_freed_memory();
    let mut layers = Vec::with_capacity(config.n_layer);
    for i in 0..config.n_layer {
        let p = format!("blk.{i}");
        let mut m =
            |name: &str, rows: usize, cols: usize| layer_matrix(file, &config, &format!("{p}.{name}"), rows, cols);
        let qkv =
            Weights::vstack(vec![m("attn_q.weight", qd, h)?, m("attn_k.weight", kvd, h)?, m("attn_v.weight", kvd, h)?])
                .lanes_only();
        let o = m("attn_output.weight", h, qd)?.lanes_only();
        let gate_up = Weights::vstack(vec![m("ffn_gate.weight", f, h)?, m("ffn_up.weight", f, h)?]).lanes_only();
        let down = m("ffn_down.weight", h, f)?.lanes_only();
        let mut v = |name: &str, len: usize| layer_vector(file.source, &config, &format!("{p}.{name}"), len);
        let arch = config.arch;
        let extra = LayerExtra {
            qkv_bias: if arch.qkv_bias() {
                Some([v("attn_q.bias", qd)?, v("attn_k.bias", kvd)?, v("attn_v.bias", kvd)?].concat())
            } else {
                None
            },
            q_norm: arch.qk_norm().then(|| v("attn_q_norm.weight", config.head_dim)).transpose()?,
            k_norm: arch.qk_norm().then(|| v("attn_k_norm.weight", config.head_dim)).transpose()?,
            post_attn_norm: arch.post_norms().then(|| v("post_attention_norm.weight", h)).transpose()?,
            post_ffn_norm: arch.post_norms().then(|| v("post_ffw_norm.weight", h)).transpose()?,
        };
        layers.push(Layer {
            attn_norm: v("attn_norm.weight", h)?,
            qkv,
            o,
            ffn_norm: v("ffn_norm.weight", h)?,
            gate_up,
            down,
            extra,
        });
    }
    let out_norm = vector(file.source, "output_norm.weight", h)?;
    let model = Llama::new(config, embed, layers, out_norm, lm_head);
    Ok(LoadedModel { model, tokenizer })
}

/// How the rows of a layer tensor must be permuted into the interleaved rotary order
/// (`crate::arch`): `Some((heads, head_dim))` for q and k tensors of a file in the halves order.
pub fn rotary_permutation(config: &LlamaConfig, name: &str) -> Option<(usize, usize)> {
    if !config.qk_halves {
        return None;
    }
    // "blk.{layer}.{tensor}"
    let tensor = name.strip_prefix("blk.").and_then(|r| r.split_once('.')).map(|(_, t)| t)?;
    let hd = config.head_dim;
    match tensor {
        "attn_q.weight" | "attn_q.bias" => Some((config.n_head, hd)),
        "attn_k.weight" | "attn_k.bias" => Some((config.n_kv_head, hd)),
        "attn_q_norm.weight" | "attn_k_norm.weight" => Some((1, hd)),
        _ => None,
    }
}

/// A weight source and how to keep its matrices.
pub struct Loader<'a> {
    pub source: &'a mut WeightSource,
    pub quantize: Quantize,
}

/// A layer's weight matrix in the internal row order.
pub fn layer_matrix(
    file: &mut Loader<'_>,
    config: &LlamaConfig,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Weights, ModelError> {
    let permute = rotary_permutation(config, name);
    matrix_permuted(file, name, rows, cols, permute)
}

/// A layer's 1-D tensor (norm weight, bias) in the internal order.
pub fn layer_vector(
    file: &mut WeightSource,
    config: &LlamaConfig,
    name: &str,
    len: usize,
) -> Result<Vec<f32>, ModelError> {
    let data = vector(file, name, len)?;
    Ok(match rotary_permutation(config, name) {
        Some((heads, hd)) if heads * hd == len => arch::halves_to_pairs(&data, heads, hd, 1),
        Some((heads, hd)) => {
            return Err(ModelError::Gguf(format!("{name} has {len} values, not {heads} heads of {hd}")));
        }
        None => data,
    })
}

/// A layer tensor dequantised to f32 in the internal row order, with its dims (out, in); what
/// the trainer reads.
pub fn layer_f32(
    file: &mut WeightSource,
    config: &LlamaConfig,
    name: &str,
) -> Result<(Vec<f32>, Vec<usize>), ModelError> {
    let (data, dims) = file.tensor_f32(name)?;
    Ok(match rotary_permutation(config, name) {
        Some((heads, hd)) => {
            let rows = dims.first().copied().unwrap_or(0);
            if rows != heads * hd {
                return Err(ModelError::Gguf(format!("{name} has shape {dims:?}, not {heads} heads of {hd} rows")));
            }
            (arch::halves_to_pairs(&data, heads, hd, data.len() / rows), dims)
        }
        None => (data, dims),
    })
}

/// A weight matrix: tensors in a format the kernels use stay as stored, anything else is
/// quantised as `file` says.
pub fn matrix(file: &mut Loader<'_>, name: &str, rows: usize, cols: usize) -> Result<Weights, ModelError> {
    matrix_permuted(file, name, rows, cols, None)
}

fn matrix_permuted(
    file: &mut Loader<'_>,
    name: &str,
    rows: usize,
    cols: usize,
    permute: Option<(usize, usize)>,
) -> Result<Weights, ModelError> {
    if let Some((heads, hd)) = permute {
        if heads * hd != rows {
            return Err(ModelError::Gguf(format!("{name}: {rows} rows are not {heads} heads of {hd}")));
        }
    }
    let stored = file.source.gguf_dtype(name);
    let native = match stored {
        Some(GgmlDType::Q4_1) => cols.is_multiple_of(kernels::QK),
        // Q8_0 is int8 already, unless a smaller `--quantize` was asked for.
        Some(GgmlDType::Q8_0) => {
            cols.is_multiple_of(kernels::QK) && matches!(file.quantize, Quantize::Q8_0 | Quantize::None)
        }
        Some(t) => BlockFormat::of(t).is_some_and(|f| f.fits(cols)),
        None => false,
    };
    if let (true, Some(dtype)) = (native, stored) {
        if let Some(raw) = file.source.raw_bytes(name)? {
            // Whole rows of blocks move as bytes.
            let raw = match permute {
                Some((heads, hd)) if raw.len().is_multiple_of(rows) => {
                    arch::halves_to_pairs(&raw, heads, hd, raw.len() / rows)
                }
                _ => raw,
            };
            return stored_matrix(name, dtype, raw, rows, cols);
        }
    }
    let (data, dims) = file.source.tensor_f32(name)?;
    if dims.iter().product::<usize>() != rows * cols {
        return Err(ModelError::Gguf(format!("{name} has shape {dims:?}, expected ({rows}, {cols})")));
    }
    if !cols.is_multiple_of(kernels::QK) {
        return Err(ModelError::Unsupported(format!("{name}: {cols} columns is not a multiple of {}", kernels::QK)));
    }
    let data = match permute {
        Some((heads, hd)) => arch::halves_to_pairs(&data, heads, hd, cols),
        None => data,
    };
    let float = matches!(stored, None | Some(GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16));
    let dtype = match file.quantize {
        Quantize::None if float => return Ok(Weights::F32(kernels::F32Matrix::new(data, rows, cols))),
        Quantize::Q8_0 | Quantize::None => return Ok(Weights::Q8(Q8Matrix::from_f32(&data, rows, cols))),
        Quantize::Q4_1 => GgmlDType::Q4_1,
        Quantize::Q4K if BlockFormat::Q4K.fits(cols) => GgmlDType::Q4K,
        Quantize::Q4K => GgmlDType::Q5_0,
    };
    let raw = candle_core::Tensor::from_vec(data, (rows, cols), &candle_core::Device::Cpu)
        .and_then(|t| candle_core::quantized::QTensor::quantize(&t, dtype))
        .and_then(|q| q.data().map(|d| d.into_owned()))
        .map_err(|e| ModelError::Gguf(format!("{name} as {dtype:?}: {e}")))?;
    stored_matrix(name, dtype, raw, rows, cols)
}

/// A matrix from blocks of a format the kernels use as stored.
fn stored_matrix(name: &str, dtype: GgmlDType, raw: Vec<u8>, rows: usize, cols: usize) -> Result<Weights, ModelError> {
    let len = raw.len();
    let m = match BlockFormat::of(dtype) {
        Some(format) => BlockMatrix::from_raw(format, raw, rows, cols).map(Weights::Block),
        None if dtype == GgmlDType::Q8_0 => Q8Matrix::from_q8_0_bytes(raw, rows, cols).map(Weights::Q8),
        None => Q4Matrix::from_q4_1_bytes(&raw, rows, cols).map(Weights::Q4),
    };
    m.ok_or_else(|| ModelError::Gguf(format!("{name}: {len} bytes do not make a ({rows}, {cols}) {dtype:?} matrix")))
}

fn vector(file: &mut WeightSource, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let (data, _) = file.tensor_f32(name)?;
    if data.len() != len {
        return Err(ModelError::Gguf(format!("{name} has {} values, expected {len}", data.len())));
    }
    Ok(data)
}
