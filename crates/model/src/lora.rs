//! LoRA adapters in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`), applied
//! per token on top of the quantised base weights: `y += scale * B (A x)`.
//!
//! PEFT adapters are trained against Hugging Face's weight layout, in which the rows of q and k
//! are ordered differently from GGUF's (llama.cpp's converter permutes them for its rotary
//! embedding). Loading permutes the rows of `lora_B` for q and k the same way, so an adapter
//! trained on the Hugging Face model works here and the reverse holds for adapters we save.

use crate::{LlamaConfig, ModelError};
use candle_core::Device;
use std::path::Path;

/// One adapted projection: `a` is (r, in), `b` is (out, r), both row-major f32.
#[derive(Debug, Clone)]
pub struct LoraPair {
    pub rank: usize,
    pub in_dim: usize,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
}

impl LoraPair {
    pub fn out_dim(&self) -> usize {
        self.b.len() / self.rank
    }

    /// `out += scale * B (A x)`.
    pub fn apply(&self, x: &[f32], out: &mut [f32], scale: f32) {
        let mut ax = vec![0f32; self.rank];
        for (r, v) in ax.iter_mut().enumerate() {
            *v = crate::kernels::dot(&self.a[r * self.in_dim..(r + 1) * self.in_dim], x) * scale;
        }
        for (o, brow) in out.iter_mut().zip(self.b.chunks_exact(self.rank)) {
            *o += crate::kernels::dot(brow, &ax);
        }
    }
}

/// The adapted projections of one layer.
#[derive(Debug, Clone, Default)]
pub struct LoraLayer {
    pub q: Option<LoraPair>,
    pub k: Option<LoraPair>,
    pub v: Option<LoraPair>,
    pub o: Option<LoraPair>,
    pub gate: Option<LoraPair>,
    pub up: Option<LoraPair>,
    pub down: Option<LoraPair>,
}

#[derive(Debug, Clone)]
pub struct LoraAdapter {
    pub layers: Vec<LoraLayer>,
    /// `alpha / r` (or `alpha / sqrt(r)` with rsLoRA).
    pub scale: f32,
}

impl LoraAdapter {
    pub fn layer(&self, i: usize) -> &LoraLayer {
        &self.layers[i]
    }

    /// Loads a PEFT adapter directory for a model of shape `config`.
    pub fn load(dir: &Path, config: &LlamaConfig) -> Result<Self, ModelError> {
        let bad = |m: String| ModelError::Adapter(format!("{}: {m}", dir.display()));
        let cfg_text = std::fs::read_to_string(dir.join("adapter_config.json"))
            .map_err(|e| bad(format!("adapter_config.json: {e}")))?;
        let cfg: serde_json::Value =
            serde_json::from_str(&cfg_text).map_err(|e| bad(format!("adapter_config.json: {e}")))?;
        let rank = cfg["r"].as_u64().ok_or_else(|| bad("adapter_config.json has no integer r".into()))? as usize;
        let alpha = cfg["lora_alpha"].as_f64().unwrap_or(rank as f64) as f32;
        let scale =
            if cfg["use_rslora"].as_bool() == Some(true) { alpha / (rank as f32).sqrt() } else { alpha / rank as f32 };
        let tensors = candle_core::safetensors::load(dir.join("adapter_model.safetensors"), &Device::Cpu)
            .map_err(|e| bad(format!("adapter_model.safetensors: {e}")))?;
        let get = |name: &str| -> Result<Option<Vec<f32>>, ModelError> {
            match tensors.get(name) {
                None => Ok(None),
                Some(t) => t
                    .to_dtype(candle_core::DType::F32)
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1::<f32>())
                    .map(Some)
                    .map_err(|e| bad(format!("{name}: {e}"))),
            }
        };
        let mut layers = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let mut layer = LoraLayer::default();
            let projections: [(&str, usize, usize, &mut Option<LoraPair>, bool); 7] = [
                ("self_attn.q_proj", config.hidden, config.q_dim(), &mut layer.q, true),
                ("self_attn.k_proj", config.hidden, config.kv_dim(), &mut layer.k, true),
                ("self_attn.v_proj", config.hidden, config.kv_dim(), &mut layer.v, false),
                ("self_attn.o_proj", config.q_dim(), config.hidden, &mut layer.o, false),
                ("mlp.gate_proj", config.hidden, config.ffn, &mut layer.gate, false),
                ("mlp.up_proj", config.hidden, config.ffn, &mut layer.up, false),
                ("mlp.down_proj", config.ffn, config.hidden, &mut layer.down, false),
            ];
            for (module, in_dim, out_dim, slot, permute) in projections {
                let prefix = format!("base_model.model.model.layers.{i}.{module}");
                let (Some(a), Some(mut b)) =
                    (get(&format!("{prefix}.lora_A.weight"))?, get(&format!("{prefix}.lora_B.weight"))?)
                else {
                    continue;
                };
                if a.len() != rank * in_dim || b.len() != out_dim * rank {
                    return Err(bad(format!("{prefix}: shapes do not match rank {rank} and the model")));
                }
                if permute {
                    b = hf_to_gguf_rows(&b, out_dim / config.head_dim, config.head_dim, rank);
                }
                *slot = Some(LoraPair { rank, in_dim, a, b });
            }
            layers.push(layer);
        }
        Ok(LoraAdapter { layers, scale })
    }
}

/// Reorders the rows of a (heads * head_dim, cols) matrix from Hugging Face's rotary layout
/// (per head: first halves, then second halves) to GGUF's (per head: interleaved pairs).
pub fn hf_to_gguf_rows(m: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0f32; m.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + j * half + i;
                let dst = h * head_dim + i * 2 + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&m[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// The inverse of [`hf_to_gguf_rows`], for saving adapters in PEFT's layout.
pub fn gguf_to_hf_rows(m: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0f32; m.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + i * 2 + j;
                let dst = h * head_dim + j * half + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&m[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}
