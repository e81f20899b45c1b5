//! The Llama forward pass for training, on candle tensors with autograd: the base weights are
//! dequantized to f32 and frozen (never candle variables; their matmuls go through
//! [`FrozenLinear`]), LoRA A/B matrices on q, k, v, o, gate, up and down are the only variables.
//!
//! Only ops with a correct backward are used (stack notes, pitfall 4): RMS norm, softmax and RoPE
//! are written out of elementary ops, and the output head is [`HeadLogprob`]. Weights stay in the
//! GGUF row layout of the inference model (q/k rows interleaved for RoPE); the adapter is
//! converted to PEFT's layout only when saved.

use crate::ops::{FrozenLinear, HeadLogprob};
use crate::pack::Row;
use candle_core::{DType, Device, Tensor, Var, D};
use std::sync::{Arc, Mutex};
use tandem_model::gguf::GgufFile;
use tandem_model::LlamaConfig;

type Res<T> = candle_core::Result<T>;

/// The seven adapted projections, in PEFT's module names.
pub const MODULES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

struct BaseLayer {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    /// q, k, v, o, gate, up, down as (out, in), in [`MODULES`] order.
    w: [Tensor; 7],
}

/// The frozen base model in f32.
pub struct Base {
    pub config: LlamaConfig,
    embed: Tensor,
    head: Tensor,
    layers: Vec<BaseLayer>,
    out_norm: Tensor,
    /// cos / sin of position p and pair i at [p, i] (context x head_dim / 2).
    cos: Tensor,
    sin: Tensor,
}

impl Base {
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let mut f = GgufFile::open(path).map_err(|e| e.to_string())?;
        let config = f.llama_config().map_err(|e| e.to_string())?;
        let dev = Device::Cpu;
        let tied = !f.has_tensor("output.weight");
        let mut t = |name: &str| -> Result<Tensor, String> {
            // Dims outermost first: weights are (out, in).
            let (data, dims) = f.tensor_f32(name).map_err(|e| e.to_string())?;
            Tensor::from_vec(data, dims, &dev).map_err(|e| e.to_string())
        };
        let embed = t("token_embd.weight")?;
        let head = if tied { embed.clone() } else { t("output.weight")? };
        let mut layers = Vec::with_capacity(config.n_layer);
        for l in 0..config.n_layer {
            let p = format!("blk.{l}");
            let mut w = Vec::with_capacity(7);
            for name in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
                w.push(t(&format!("{p}.{name}.weight"))?);
            }
            let w: [Tensor; 7] = w.try_into().map_err(|_| "layer weights".to_string())?;
            layers.push(BaseLayer {
                attn_norm: t(&format!("{p}.attn_norm.weight"))?,
                ffn_norm: t(&format!("{p}.ffn_norm.weight"))?,
                w,
            });
        }
        let out_norm = t("output_norm.weight")?;
        let (cos, sin) = rope_tables(&config).map_err(|e| e.to_string())?;
        Ok(Base { config, embed, head, layers, out_norm, cos, sin })
    }

    /// (in, out) of projection `m` (index into [`MODULES`]).
    pub fn dims(&self, m: usize) -> (usize, usize) {
        let c = &self.config;
        match m {
            0 => (c.hidden, c.q_dim()),
            1 | 2 => (c.hidden, c.kv_dim()),
            3 => (c.q_dim(), c.hidden),
            4 | 5 => (c.hidden, c.ffn),
            _ => (c.ffn, c.hidden),
        }
    }
}

fn rope_tables(c: &LlamaConfig) -> Res<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    let (mut cos, mut sin) = (Vec::with_capacity(c.context_len * half), Vec::with_capacity(c.context_len * half));
    for p in 0..c.context_len {
        for i in 0..half {
            let theta = p as f64 / (c.rope_base as f64).powf(2.0 * i as f64 / c.head_dim as f64);
            cos.push(theta.cos() as f32);
            sin.push(theta.sin() as f32);
        }
    }
    let dev = Device::Cpu;
    Ok((Tensor::from_vec(cos, (c.context_len, half), &dev)?, Tensor::from_vec(sin, (c.context_len, half), &dev)?))
}

/// The trainable adapter: `A (r, in)` and `B (out, r)` per layer and module; delta = scale B A.
pub struct Lora {
    pub rank: usize,
    pub alpha: f64,
    /// [layer][module] -> (A, B)
    pub pairs: Vec<[(Var, Var); 7]>,
}

impl Lora {
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    pub fn vars(&self) -> Vec<Var> {
        self.pairs.iter().flat_map(|l| l.iter().flat_map(|(a, b)| [a.clone(), b.clone()])).collect()
    }
}

/// `x W^T + scale (x A^T) B^T`.
fn linear(x: &Tensor, w: &Tensor, lora: &(Var, Var), scale: f64) -> Res<Tensor> {
    let base = x.apply_op1(FrozenLinear { w: w.clone() })?;
    let delta = x.matmul(&lora.0.as_tensor().t()?)?.matmul(&lora.1.as_tensor().t()?)?;
    base.add(&(delta * scale)?)
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Res<Tensor> {
    let r = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&r)?.broadcast_mul(w)
}

/// RoPE on adjacent pairs (GGUF layout): x (T, heads * hd), cos/sin (T, hd / 2).
fn rope(x: &Tensor, heads: usize, hd: usize, cos: &Tensor, sin: &Tensor) -> Res<Tensor> {
    let t = x.dim(0)?;
    let x = x.reshape((t, heads, hd / 2, 2))?;
    let (x0, x1) = (x.narrow(3, 0, 1)?, x.narrow(3, 1, 1)?);
    let cos = cos.reshape((t, 1, hd / 2, 1))?;
    let sin = sin.reshape((t, 1, hd / 2, 1))?;
    let o0 = x0.broadcast_mul(&cos)?.sub(&x1.broadcast_mul(&sin)?)?;
    let o1 = x0.broadcast_mul(&sin)?.add(&x1.broadcast_mul(&cos)?)?;
    Tensor::cat(&[o0, o1], 3)?.reshape((t, heads * hd))
}

/// Causal attention within one segment: q (s, nh * hd), k / v (s, nkv * hd) -> (s, nh * hd).
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, c: &LlamaConfig) -> Res<Tensor> {
    let (s, nh, nkv, hd) = (q.dim(0)?, c.n_head, c.n_kv_head, c.head_dim);
    let group = nh / nkv;
    let q = q.reshape((s, nh, hd))?.transpose(0, 1)?.contiguous()?;
    // Each KV head serves `group` consecutive query heads.
    let expand = |x: &Tensor| -> Res<Tensor> {
        x.reshape((s, nkv, hd))?.transpose(0, 1)?.unsqueeze(1)?.broadcast_as((nkv, group, s, hd))?.reshape((nh, s, hd))
    };
    let (k, v) = (expand(k)?, expand(v)?);
    let scores = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
    let mask: Vec<f32> = (0..s * s).map(|i| if i % s > i / s { f32::NEG_INFINITY } else { 0.0 }).collect();
    let mask = Tensor::from_vec(mask, (s, s), q.device())?;
    let scores = scores.broadcast_add(&mask)?;
    let max = scores.max_keepdim(D::Minus1)?.detach();
    let e = scores.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v)?.transpose(0, 1)?.reshape((s, nh * hd))
}

/// What one forward over a row gives: the new logprob of each target (autograd-tracked) and
/// the entropy at each target's position.
pub struct RowOutput {
    pub logprobs: Tensor,
    pub entropy: Vec<f32>,
}

/// The forward pass over a packed row.
pub fn forward(base: &Base, lora: &Lora, row: &Row) -> Res<RowOutput> {
    let c = &base.config;
    let dev = Device::Cpu;
    let ids = Tensor::from_slice(&row.tokens, row.tokens.len(), &dev)?;
    let mut x = base.embed.index_select(&ids, 0)?;
    let positions: Vec<u32> = row.segments.iter().flat_map(|(_, len)| 0..*len as u32).collect();
    let pos = Tensor::from_slice(&positions, positions.len(), &dev)?;
    let (cos, sin) = (base.cos.index_select(&pos, 0)?, base.sin.index_select(&pos, 0)?);
    let scale = lora.scale();
    let eps = c.rms_eps as f64;
    for (layer, pairs) in base.layers.iter().zip(&lora.pairs) {
        let h = rms_norm(&x, &layer.attn_norm, eps)?;
        let q = rope(&linear(&h, &layer.w[0], &pairs[0], scale)?, c.n_head, c.head_dim, &cos, &sin)?;
        let k = rope(&linear(&h, &layer.w[1], &pairs[1], scale)?, c.n_kv_head, c.head_dim, &cos, &sin)?;
        let v = linear(&h, &layer.w[2], &pairs[2], scale)?;
        let mut parts = Vec::with_capacity(row.segments.len());
        for &(start, len) in &row.segments {
            parts.push(attend(&q.narrow(0, start, len)?, &k.narrow(0, start, len)?, &v.narrow(0, start, len)?, c)?);
        }
        let att = Tensor::cat(&parts, 0)?;
        x = x.add(&linear(&att, &layer.w[3], &pairs[3], scale)?)?;
        let h = rms_norm(&x, &layer.ffn_norm, eps)?;
        let g = linear(&h, &layer.w[4], &pairs[4], scale)?;
        let u = linear(&h, &layer.w[5], &pairs[5], scale)?;
        x = x.add(&linear(&g.silu()?.mul(&u)?, &layer.w[6], &pairs[6], scale)?)?;
    }
    let h = rms_norm(&x, &base.out_norm, eps)?;
    let from: Vec<u32> = row.targets.iter().map(|t| (t.pos - 1) as u32).collect();
    let targets: Vec<u32> = row.targets.iter().map(|t| row.tokens[t.pos]).collect();
    let rows = h.index_select(&Tensor::from_slice(&from, from.len(), &dev)?, 0)?;
    let entropy = Arc::new(Mutex::new(Vec::new()));
    let logprobs = rows.apply_op1(HeadLogprob { head: base.head.clone(), targets, entropy: entropy.clone() })?;
    let entropy = entropy.lock().map(|e| e.clone()).unwrap_or_default();
    Ok(RowOutput { logprobs: logprobs.to_dtype(DType::F32)?, entropy })
}
