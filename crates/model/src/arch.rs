//! The architectures tandem serves and trains, and what each one changes in the Llama block.
//!
//! Llama, Qwen2/2.5, Qwen3 and Gemma 3 are one decoder with a handful of switches, so the
//! forward pass is written once (`llama.rs` for serving, `train::net` for training) and each
//! architecture is a row of switches read here from its GGUF metadata (under the architecture's
//! own key prefix, e.g. `qwen3.block_count`). What each adds:
//!
//! | | Llama | Qwen2 | Qwen3 | Gemma 3 |
//! |---|---|---|---|---|
//! | q/k/v bias | | yes | | |
//! | q/k RMS norm per head, before RoPE | | | yes | yes |
//! | norms on the attention and MLP outputs | | | | yes |
//! | MLP activation | SiLU | SiLU | SiLU | GELU (tanh) |
//! | embedding rows times sqrt(hidden) | | | | yes |
//! | sliding-window layers | | | | 5 of every 6, own RoPE base |
//! | q/k rows in the file | interleaved pairs | halves | halves | halves |
//!
//! **Rotary layout.** llama.cpp's converter permutes Llama's q/k rows so that RoPE rotates
//! adjacent pairs; Qwen and Gemma files keep Hugging Face's order (each head's first half pairs
//! with its second half, "NEOX" RoPE). Loading permutes those rows (and q/k biases and norm
//! weights) into the interleaved order once, so one RoPE kernel serves every architecture and the
//! attention scores, being dot products over the same permutation of q and k, are unchanged. The
//! internal layout is therefore always "Hugging Face rows, interleaved", the one LoRA adapters are
//! converted to and from (`lora::hf_to_gguf_rows`), whatever the file held.
//!
//! **Gemma 3 norms.** Hugging Face's Gemma multiplies by `1 + w`; llama.cpp's converter stores
//! `1 + w` in the GGUF, so every norm here is the plain `x * w`.

use crate::ModelError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
}

impl Arch {
    /// The `model_type` of a Hugging Face `config.json` for this architecture (Gemma 3's text-only
    /// model, as the 270M and 1B ship).
    pub fn hf_model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3_text",
        }
    }

    /// The `general.architecture` value, also the metadata key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
        }
    }

    pub fn parse(name: &str) -> Result<Arch, ModelError> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "gemma3" => Ok(Arch::Gemma3),
            other => {
                Err(ModelError::Unsupported(format!("architecture {other:?} (supported: llama, qwen2, qwen3, gemma3)")))
            }
        }
    }

    /// Whether the file keeps q/k rows in Hugging Face's halves order (permuted at load).
    pub fn halves_rope(self) -> bool {
        self != Arch::Llama
    }

    pub fn qkv_bias(self) -> bool {
        self == Arch::Qwen2
    }

    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Gemma3)
    }

    pub fn post_norms(self) -> bool {
        self == Arch::Gemma3
    }

    pub fn activation(self) -> Activation {
        match self {
            Arch::Gemma3 => Activation::GeluTanh,
            _ => Activation::Silu,
        }
    }
}

/// The gate's activation in the gated MLP `down(act(gate x) * up x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

/// Sliding-window attention: which layers use it, how far they see, and their RoPE base.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    /// A query at position p sees keys at positions > p - window (itself included).
    pub window: usize,
    /// Every `period`-th layer (the last of each period) is global, the others slide.
    pub period: usize,
    /// RoPE base of the sliding layers (Gemma 3: 10,000; its global layers use the file's base).
    pub rope_base: f32,
}

impl SlidingWindow {
    /// Gemma 3's pattern: five sliding layers, then a global one (what llama.cpp hard-codes for
    /// `gemma3` and Hugging Face's `layer_types` spell out).
    pub fn gemma3(window: usize) -> Self {
        SlidingWindow { window, period: 6, rope_base: 10_000.0 }
    }

    pub fn slides(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.period)
    }

    /// The first position a query at `pos` attends to.
    pub fn first_visible(&self, pos: usize) -> usize {
        (pos + 1).saturating_sub(self.window)
    }
}

/// A permutation of the rows of a (heads * head_dim, row_len) matrix from Hugging Face's rotary
/// layout (per head: first halves, then second halves) to interleaved pairs; generic so that it
/// moves f32 rows and raw quantised rows alike (`row_len` elements per row).
pub fn halves_to_pairs<T: Copy + Default>(m: &[T], heads: usize, head_dim: usize, row_len: usize) -> Vec<T> {
    let half = head_dim / 2;
    let mut out = vec![T::default(); m.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + j * half + i;
                let dst = h * head_dim + i * 2 + j;
                out[dst * row_len..(dst + 1) * row_len].copy_from_slice(&m[src * row_len..(src + 1) * row_len]);
            }
        }
    }
    out
}

/// The inverse of [`halves_to_pairs`].
pub fn pairs_to_halves<T: Copy + Default>(m: &[T], heads: usize, head_dim: usize, row_len: usize) -> Vec<T> {
    let half = head_dim / 2;
    let mut out = vec![T::default(); m.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + i * 2 + j;
                let dst = h * head_dim + j * half + i;
                out[dst * row_len..(dst + 1) * row_len].copy_from_slice(&m[src * row_len..(src + 1) * row_len]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_slides_five_layers_of_six() {
        let w = SlidingWindow::gemma3(512);
        let slides: Vec<bool> = (0..12).map(|l| w.slides(l)).collect();
        assert_eq!(slides, [true, true, true, true, true, false, true, true, true, true, true, false]);
        // Position 511 still sees position 0; 512 no longer does.
        assert_eq!(w.first_visible(511), 0);
        assert_eq!(w.first_visible(512), 1);
        assert_eq!(w.first_visible(3), 0);
    }

    #[test]
    fn halves_become_adjacent_pairs_and_back() {
        // One head of dim 4, one value per row: [a0 a1 | b0 b1] -> [a0 b0 a1 b1].
        let m = [10, 11, 20, 21];
        let p = halves_to_pairs(&m, 1, 4, 1);
        assert_eq!(p, [10, 20, 11, 21]);
        assert_eq!(pairs_to_halves(&p, 1, 4, 1), m);
        // Two heads, rows of two bytes.
        let m: Vec<u8> = (0..16).collect();
        assert_eq!(pairs_to_halves(&halves_to_pairs(&m, 2, 4, 2), 2, 4, 2), m);
    }
}
