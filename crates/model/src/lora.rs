//! LoRA adapters in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`), applied
//! per token on top of the quantised base weights: `y += scale * B (A x)`.
//!
//! PEFT adapters are trained against Hugging Face's weight layout, in which the rows of q and k
//! are ordered differently from GGUF's (llama.cpp's converter permutes them for its rotary
//! embedding). Loading permutes the rows of `lora_B` for q and k the same way, so an adapter
//! trained on the Hugging Face model works here and the reverse holds for adapters we save.

use crate::kernels::Bf16;
use crate::{LlamaConfig, ModelError};
use std::path::Path;

/// One adapted projection: `a` is (r, in), row-major, and B (out, r) is kept in tiles of outputs
/// (`as_served::b_tiles`), so that `B (A x)` is r `axpy`s over each tile of the output row, kept
/// in registers, rather than `out` dot products of length r. Both in bf16 (`as_served::stored`):
/// with many adapters in a batch, decode is bound by the bytes of A and B each step reads.
#[derive(Debug, Clone)]
pub struct LoraPair {
    pub rank: usize,
    pub in_dim: usize,
    pub a: Vec<Bf16>,
    b: Vec<Bf16>,
}

impl LoraPair {
    /// From `a` (r, in) and `b` (out, r), both row-major f32 as PEFT stores them (`peft::read`
    /// has checked that r >= 1), rounded to bf16.
    pub fn new(rank: usize, a: Vec<f32>, b: Vec<f32>) -> Self {
        let b = crate::as_served::stored(&crate::as_served::b_tiles(&b, rank));
        LoraPair { rank, in_dim: a.len() / rank, a: crate::as_served::stored(&a), b }
    }

    /// B in tiles of outputs (`as_served::b_tiles`).
    pub fn b_tiles(&self) -> &[Bf16] {
        &self.b
    }

    pub fn out_dim(&self) -> usize {
        self.b.len() / self.rank
    }

    /// `out += scale * B (A x)`.
    pub fn apply(&self, x: &[f32], out: &mut [f32], scale: f32) {
        crate::as_served::lora_row(&self.a, &self.b, self.rank, x, out, scale);
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
    /// The output head's pair (Tinker's `train_unembed`): added to the logits.
    pub head: Option<LoraPair>,
    /// `alpha / r` (or `alpha / sqrt(r)` with rsLoRA).
    pub scale: f32,
}

impl LoraAdapter {
    pub fn layer(&self, i: usize) -> &LoraLayer {
        &self.layers[i]
    }

    /// Memory held by the matrices (what the engine's adapter cache budgets).
    pub fn bytes(&self) -> usize {
        let pair =
            |p: &Option<LoraPair>| p.as_ref().map_or(0, |p| std::mem::size_of::<Bf16>() * (p.a.len() + p.b.len()));
        let layers: usize = self
            .layers
            .iter()
            .map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down].into_iter().map(pair).sum::<usize>())
            .sum();
        layers + pair(&self.head)
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
                let [q, k, v, o, gate, up, down] = layer.map(|p| p.map(|p| LoraPair::new(rank, p.a, p.b)));
                LoraLayer { q, k, v, o, gate, up, down }
            })
            .collect();
        let head = peft.head.map(|p| LoraPair::new(rank, p.a, p.b));
        Ok(LoraAdapter { layers, head, scale: peft.config.scale() as f32 })
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

#[cfg(test)]
mod tests {
    use super::LoraPair;

    #[test]
    fn apply_adds_scaled_b_of_a_x() {
        // A (2 x 3), B (2 x 2): A x = [1*1 + 2*0 + 3*-1, 0*1 + 1*0 + 1*-1] = [-2, -1];
        // scale 0.5 -> [-1, -0.5]; B [-1, -0.5] = [1*-1 + 2*-0.5, 3*-1 + 4*-0.5] = [-2, -5].
        let pair = LoraPair::new(2, vec![1.0, 2.0, 3.0, 0.0, 1.0, 1.0], vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!((pair.in_dim, pair.out_dim()), (3, 2));
        let mut out = vec![10.0, 20.0];
        pair.apply(&[1.0, 0.0, -1.0], &mut out, 0.5);
        assert_eq!(out, [8.0, 15.0]);
    }
}
