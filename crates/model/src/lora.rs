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
use std::sync::Arc;

/// One adapted projection: A (r, in), row-major, then B (out, r) in tiles of outputs
/// (`as_served::b_tiles`), so that `B (A x)` is r `axpy`s over each tile of the output row, kept
/// in registers, rather than `out` dot products of length r. Both in bf16 (`as_served::stored`):
/// with many adapters in a batch, decode is bound by the bytes of A and B each step reads.
///
/// The two lie one after the other in a buffer that [`LoraAdapter::new`] shares between all of
/// an adapter's pairs, in the order a forward pass reads them: the kernels ask for the bytes past
/// the end of what they read (`kernels::adapter_avx2`), and those are then the next matrix's.
#[derive(Debug, Clone)]
pub struct LoraPair {
    pub rank: usize,
    pub in_dim: usize,
    out_dim: usize,
    data: Arc<[Bf16]>,
    /// Where A starts in `data`; B follows it.
    at: usize,
}

impl LoraPair {
    /// From `a` (r, in) and `b` (out, r), both row-major f32 as PEFT stores them (`peft::read`
    /// has checked that r >= 1), rounded to bf16.
    pub fn new(rank: usize, a: Vec<f32>, b: Vec<f32>) -> Self {
        let (in_dim, out_dim) = (a.len() / rank, b.len() / rank);
        let mut data = crate::as_served::stored(&a);
        data.extend(crate::as_served::stored(&crate::as_served::b_tiles(&b, rank)));
        LoraPair { rank, in_dim, out_dim, data: data.into(), at: 0 }
    }

    /// A, (r, in) row-major.
    pub fn a(&self) -> &[Bf16] {
        &self.data[self.at..self.at + self.rank * self.in_dim]
    }

    /// B in tiles of outputs (`as_served::b_tiles`).
    pub fn b_tiles(&self) -> &[Bf16] {
        let b = self.at + self.rank * self.in_dim;
        &self.data[b..b + self.rank * self.out_dim]
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// The bytes of A and B.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Bf16>() * self.rank * (self.in_dim + self.out_dim)
    }

    /// `out += scale * B (A x)`.
    pub fn apply(&self, x: &[f32], out: &mut [f32], scale: f32) {
        crate::as_served::lora_row(self.a(), self.b_tiles(), self.rank, x, out, scale);
    }

    /// Appends A then B to `into`; returns where A starts there.
    fn copy_into(&self, into: &mut Vec<Bf16>) -> usize {
        let at = into.len();
        into.extend_from_slice(self.a());
        into.extend_from_slice(self.b_tiles());
        at
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

impl LoraLayer {
    /// The pairs present, in the order the forward pass applies them.
    pub fn pairs(&self) -> impl Iterator<Item = &LoraPair> {
        [&self.q, &self.k, &self.v, &self.o, &self.gate, &self.up, &self.down].into_iter().flatten()
    }
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
    /// The adapter with all its matrices moved into one buffer, layer by layer in the order the
    /// forward pass reads them (q, k, v, o, gate, up, down, then the head's pair), each pair's A
    /// then B. A forward pass then reads an adapter as a few long runs rather than hundreds of
    /// separately allocated 3-25 KB matrices (see [`LoraPair`]). The values are the pairs'.
    pub fn new(layers: Vec<LoraLayer>, head: Option<LoraPair>, scale: f32) -> Self {
        let all = || layers.iter().flat_map(LoraLayer::pairs).chain(head.as_ref());
        let mut data = Vec::with_capacity(all().map(|p| p.bytes() / std::mem::size_of::<Bf16>()).sum());
        let starts: Vec<usize> = all().map(|p| p.copy_into(&mut data)).collect();
        let data: Arc<[Bf16]> = data.into();
        let mut placed = all().zip(starts).map(|(p, at)| LoraPair {
            rank: p.rank,
            in_dim: p.in_dim,
            out_dim: p.out_dim,
            data: data.clone(),
            at,
        });
        let mut place = |p: &Option<LoraPair>| p.as_ref().map(|_| placed.next().expect("one placed pair each"));
        let layers = layers
            .iter()
            .map(|l| LoraLayer {
                q: place(&l.q),
                k: place(&l.k),
                v: place(&l.v),
                o: place(&l.o),
                gate: place(&l.gate),
                up: place(&l.up),
                down: place(&l.down),
            })
            .collect();
        let head = place(&head);
        LoraAdapter { layers, head, scale }
    }

    pub fn layer(&self, i: usize) -> &LoraLayer {
        &self.layers[i]
    }

    /// Memory held by the matrices (what the engine's adapter cache budgets).
    pub fn bytes(&self) -> usize {
        self.layers.iter().flat_map(LoraLayer::pairs).chain(self.head.as_ref()).map(LoraPair::bytes).sum()
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
        Ok(LoraAdapter::new(layers, head, peft.config.scale() as f32))
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
    use super::{LoraAdapter, LoraLayer, LoraPair};

    #[test]
    fn an_adapter_holds_its_pairs_in_one_buffer_in_the_order_they_are_read() {
        let pair = |i: usize, o: usize, s: f32| {
            let a: Vec<f32> = (0..2 * i).map(|x| s + x as f32).collect();
            LoraPair::new(2, a, (0..2 * o).map(|x| -s - x as f32).collect())
        };
        let layer = |s: f32| LoraLayer {
            q: Some(pair(3, 4, s)),
            k: None,
            v: Some(pair(3, 2, s + 100.0)),
            down: Some(pair(5, 3, s + 200.0)),
            ..LoraLayer::default()
        };
        let (layers, head) = (vec![layer(0.0), layer(1000.0)], Some(pair(3, 7, 5000.0)));
        let loose = LoraAdapter { layers: layers.clone(), head: head.clone(), scale: 0.5 };
        let packed = LoraAdapter::new(layers, head, 0.5);
        assert_eq!(packed.bytes(), loose.bytes());
        assert!(packed.layer(1).k.is_none() && packed.layer(1).gate.is_none());
        let pairs = |a: &LoraAdapter| -> Vec<LoraPair> {
            a.layers.iter().flat_map(LoraLayer::pairs).chain(a.head.as_ref()).cloned().collect()
        };
        let (mut end, mut count) = (None, 0);
        for (p, q) in pairs(&packed).iter().zip(&pairs(&loose)) {
            assert_eq!(
                (p.a(), p.b_tiles(), p.rank, p.in_dim, p.out_dim()),
                (q.a(), q.b_tiles(), q.rank, q.in_dim, q.out_dim())
            );
            // A follows the previous pair's B, and B follows A, in memory.
            if let Some(end) = end {
                assert_eq!(p.a().as_ptr(), end);
            }
            assert_eq!(p.b_tiles().as_ptr(), p.a().as_ptr_range().end);
            end = Some(p.b_tiles().as_ptr_range().end);
            count += 1;
        }
        assert_eq!(count, 7);
    }

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
