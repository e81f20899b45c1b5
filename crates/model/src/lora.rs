//! LoRA adapters in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`), applied
//! per token on top of the quantised base weights: `y += scale * B (A x)`.
//!
//! PEFT adapters are trained against Hugging Face's weight layout, in which the rows of q and k
//! are ordered differently from GGUF's (llama.cpp's converter permutes them for its rotary
//! embedding). Loading permutes the rows of `lora_B` for q and k the same way, so an adapter
//! trained on the Hugging Face model works here and the reverse holds for adapters we save.

use crate::{LlamaConfig, ModelError};
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

    /// Loads a PEFT adapter directory for a model of shape `config` (`crate::peft` reads it;
    /// modules the file lacks stay unadapted).
    pub fn load(dir: &Path, config: &LlamaConfig) -> Result<Self, ModelError> {
        let peft = crate::peft::read(dir, config)?;
        let rank = peft.config.r;
        let layers = peft
            .layers
            .into_iter()
            .map(|layer| {
                let [q, k, v, o, gate, up, down] =
                    layer.map(|p| p.map(|p| LoraPair { rank, in_dim: p.a.len() / rank, a: p.a, b: p.b }));
                LoraLayer { q, k, v, o, gate, up, down }
            })
            .collect();
        Ok(LoraAdapter { layers, scale: peft.config.scale() as f32 })
    }
}

/// Reorders the rows of a (heads * head_dim, cols) matrix from Hugging Face's rotary layout
/// (per head: first halves, then second halves) to GGUF's (per head: interleaved pairs).
pub fn hf_to_gguf_rows(m: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    crate::arch::halves_to_pairs(m, heads, head_dim, cols)
}

/// The inverse of [`hf_to_gguf_rows`], for saving adapters in PEFT's layout.
pub fn gguf_to_hf_rows(m: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    crate::arch::pairs_to_halves(m, heads, head_dim, cols)
}
