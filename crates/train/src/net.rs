//! The Llama forward pass for training, on candle tensors with autograd: the base weights are
//! dequantized to f32 and frozen (never candle variables); LoRA A/B matrices on q, k, v, o, gate,
//! up and down are the only variables. Each projection with its adapter is one [`LoraLinear`]
//! op, which never computes a base-weight gradient.
//!
//! Only ops with a correct backward are used (stack notes, pitfall 4): RMS norm, RoPE, the masked
//! softmax and SiLU are fused ops with written backward passes ([`crate::fused`]), and the output
//! head is [`HeadLogprob`]. Weights stay in the GGUF row layout of the inference model (q/k rows interleaved for RoPE); the adapter is
//! converted to PEFT's layout only when saved.

use crate::fused::{RmsNorm, Rope, SegmentAttention, SiluMul};
use crate::ops::{Frozen, HeadInt8, HeadLogprob, HeadWeights, LoraLinear};
use crate::pack::Row;
use candle_core::{DType, Device, Tensor, Var};
use std::sync::{Arc, Mutex};
use tandem_model::gguf::GgufFile;
use tandem_model::kernels::{Q8Matrix, Weights, QK};
use tandem_model::peft::{AdapterConfig, Module};
use tandem_model::LlamaConfig;

type Res<T> = candle_core::Result<T>;

struct BaseLayer {
    attn_norm: Arc<Vec<f32>>,
    ffn_norm: Arc<Vec<f32>>,
    /// q, k, v, o, gate, up, down as (out, in), in [`Module::ALL`] order.
    w: [Frozen; 7],
}

/// Where token rows come from: the f32 embedding, or a quantised matrix (dequantised per token).
enum Embedding {
    F32(Tensor),
    Quantized(Arc<Weights>),
}

/// The frozen base model.
pub struct Base {
    pub config: LlamaConfig,
    embed: Embedding,
    head: HeadWeights,
    layers: Vec<BaseLayer>,
    out_norm: Arc<Vec<f32>>,
    /// cos / sin of position p and pair i at [p * head_dim / 2 + i].
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Base {
    /// The base for training: the inference kernels for the frozen projections where the CPU
    /// has AVX-512 VNNI (see [`Frozen::Int8`]), f32 GEMMs elsewhere.
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        Self::load_with(path, tandem_model::kernels::has_avx512_vnni())
    }

    /// The base with f32 GEMMs everywhere (exact gradients, for finite-difference checks).
    pub fn load_exact(path: &std::path::Path) -> Result<Self, String> {
        Self::load_with(path, false)
    }

    fn load_with(path: &std::path::Path, int8: bool) -> Result<Self, String> {
        let mut f = GgufFile::open(path).map_err(|e| e.to_string())?;
        let config = f.llama_config().map_err(|e| e.to_string())?;
        let dev = Device::Cpu;
        let tied = !f.has_tensor("output.weight");
        // A second handle for the served (quantised) matrices, while `t` borrows the first.
        let mut f2 = GgufFile::open(path).map_err(|e| e.to_string())?;
        let mut t = |name: &str| -> Result<Tensor, String> {
            // Dims outermost first: weights are (out, in).
            let (data, dims) = f.tensor_f32(name).map_err(|e| e.to_string())?;
            Tensor::from_vec(data, dims, &dev).map_err(|e| e.to_string())
        };
        let embed = t("token_embd.weight")?;
        let head_name = if tied { "token_embd.weight" } else { "output.weight" };
        let head = if tied { embed.clone() } else { t(head_name)? };
        let (v, hd) = head.dims2().map_err(|e| e.to_string())?;
        let head = if int8 && hd % QK == 0 {
            // E^T with the vocabulary padded to whole blocks by zero columns.
            let vp = v.next_multiple_of(QK);
            let e32 = head.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|e| e.to_string())?;
            let mut et = vec![0f32; hd * vp];
            for (tok, row) in e32.chunks_exact(hd).enumerate() {
                for (k, x) in row.iter().enumerate() {
                    et[k * vp + tok] = *x;
                }
            }
            let et = Q8Matrix::from_f32(&et, hd, vp).lanes_only();
            let e = tandem_model::matrix(&mut f2, head_name, v, hd).map_err(|e| e.to_string())?.lanes_only();
            HeadWeights::Int8(HeadInt8 { e: Arc::new(e), et: Arc::new(Weights::Q8(et)) })
        } else {
            HeadWeights::F32(head)
        };
        // With the int8 head, token rows come from a quantised matrix too (the head itself when
        // tied): no f32 copy of the vocabulary is kept.
        let embed = match (&head, tied) {
            (HeadWeights::Int8(h), true) => Embedding::Quantized(h.e.clone()),
            (HeadWeights::Int8(_), false) => Embedding::Quantized(Arc::new(
                tandem_model::matrix(&mut f2, "token_embd.weight", v, hd).map_err(|e| e.to_string())?.lanes_only(),
            )),
            (HeadWeights::F32(_), _) => Embedding::F32(embed),
        };
        let mut layers = Vec::with_capacity(config.n_layer);
        for l in 0..config.n_layer {
            let p = format!("blk.{l}");
            let mut w = Vec::with_capacity(7);
            for name in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
                let name = format!("{p}.{name}.weight");
                let dense = t(&name)?;
                let (out, inp) = dense.dims2().map_err(|e| e.to_string())?;
                w.push(if int8 && out % QK == 0 && inp % QK == 0 {
                    let wt = dense.t().and_then(|t| t.contiguous()).and_then(|t| t.flatten_all()?.to_vec1::<f32>());
                    let wt = Q8Matrix::from_f32(&wt.map_err(|e| e.to_string())?, inp, out).lanes_only();
                    let served =
                        tandem_model::matrix(&mut f2, &name, out, inp).map_err(|e| e.to_string())?.lanes_only();
                    Frozen::Int8 { w: Arc::new(served), wt: Arc::new(Weights::Q8(wt)) }
                } else {
                    Frozen::F32(dense)
                });
            }
            let w: [Frozen; 7] = w.try_into().map_err(|_| "layer weights".to_string())?;
            layers.push(BaseLayer {
                attn_norm: vector(t(&format!("{p}.attn_norm.weight"))?)?,
                ffn_norm: vector(t(&format!("{p}.ffn_norm.weight"))?)?,
                w,
            });
        }
        let out_norm = vector(t("output_norm.weight")?)?;
        let (cos, sin) = rope_tables(&config);
        Ok(Base { config, embed, head, layers, out_norm, cos, sin })
    }

    /// (in, out) of projection `m` (index into [`Module::ALL`]).
    pub fn dims(&self, m: usize) -> (usize, usize) {
        Module::ALL[m].dims(&self.config)
    }
}

fn vector(t: Tensor) -> Result<Arc<Vec<f32>>, String> {
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map(Arc::new).map_err(|e| e.to_string())
}

fn rope_tables(c: &LlamaConfig) -> (Vec<f32>, Vec<f32>) {
    let half = c.head_dim / 2;
    let (mut cos, mut sin) = (Vec::with_capacity(c.context_len * half), Vec::with_capacity(c.context_len * half));
    for p in 0..c.context_len {
        for i in 0..half {
            let theta = p as f64 / (c.rope_base as f64).powf(2.0 * i as f64 / c.head_dim as f64);
            cos.push(theta.cos() as f32);
            sin.push(theta.sin() as f32);
        }
    }
    (cos, sin)
}

/// The trainable adapter: `A (r, in)` and `B (out, r)` per layer and module; delta = scale B A.
pub struct Lora {
    /// Rank, alpha and rsLoRA, as `adapter_config.json` holds them.
    pub config: AdapterConfig,
    /// [layer][module] -> (A, B), modules in [`Module::ALL`] order.
    pub pairs: Vec<[(Var, Var); 7]>,
}

impl Lora {
    pub fn rank(&self) -> usize {
        self.config.r
    }

    pub fn scale(&self) -> f64 {
        self.config.scale()
    }

    pub fn vars(&self) -> Vec<Var> {
        self.pairs.iter().flat_map(|l| l.iter().flat_map(|(a, b)| [a.clone(), b.clone()])).collect()
    }
}

/// `x W^T + scale (x A^T) B^T`.
fn linear(x: &Tensor, w: &Frozen, lora: &(Var, Var), scale: f64) -> Res<Tensor> {
    x.contiguous()?.apply_op3(lora.0.as_tensor(), lora.1.as_tensor(), LoraLinear { w: w.clone(), scale })
}

fn rms_norm(x: &Tensor, weight: &Arc<Vec<f32>>, eps: f32) -> Res<Tensor> {
    x.contiguous()?.apply_op1(RmsNorm { weight: weight.clone(), eps })
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
    let mut x = match &base.embed {
        Embedding::F32(e) => e.index_select(&ids, 0)?,
        Embedding::Quantized(e) => {
            let h = e.cols();
            let mut rows = vec![0f32; row.tokens.len() * h];
            for (out, &t) in rows.chunks_exact_mut(h).zip(&row.tokens) {
                e.dequantize_row(t as usize, out);
            }
            Tensor::from_vec(rows, (row.tokens.len(), h), &dev)?
        }
    };
    // Each segment's positions start at 0: the RoPE angles of every row token, once per row.
    let half = c.head_dim / 2;
    let (mut cos, mut sin) = (Vec::with_capacity(row.tokens.len() * half), Vec::with_capacity(row.tokens.len() * half));
    for &(_, len) in &row.segments {
        cos.extend_from_slice(&base.cos[..len * half]);
        sin.extend_from_slice(&base.sin[..len * half]);
    }
    let rope = Rope { cos: Arc::new(cos), sin: Arc::new(sin), head_dim: c.head_dim };
    let rotate = |x: Tensor| -> Res<Tensor> { x.contiguous()?.apply_op1(rope.clone()) };
    let scale = lora.scale();
    let eps = c.rms_eps;
    let attention = SegmentAttention {
        segments: Arc::new(row.segments.clone()),
        heads: tandem_model::kernels::causal::Heads {
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        },
    };
    for (layer, pairs) in base.layers.iter().zip(&lora.pairs) {
        let h = rms_norm(&x, &layer.attn_norm, eps)?;
        let q = rotate(linear(&h, &layer.w[0], &pairs[0], scale)?)?;
        let k = rotate(linear(&h, &layer.w[1], &pairs[1], scale)?)?;
        let v = linear(&h, &layer.w[2], &pairs[2], scale)?;
        let att = q.apply_op3(&k, &v.contiguous()?, attention.clone())?;
        x = x.add(&linear(&att, &layer.w[3], &pairs[3], scale)?)?;
        let h = rms_norm(&x, &layer.ffn_norm, eps)?;
        let g = linear(&h, &layer.w[4], &pairs[4], scale)?;
        let u = linear(&h, &layer.w[5], &pairs[5], scale)?;
        x = x.add(&linear(&g.contiguous()?.apply_op2(&u.contiguous()?, SiluMul)?, &layer.w[6], &pairs[6], scale)?)?;
    }
    let h = rms_norm(&x, &base.out_norm, eps)?;
    let from: Vec<u32> = row.targets.iter().map(|t| (t.pos - 1) as u32).collect();
    let targets: Vec<u32> = row.targets.iter().map(|t| row.tokens[t.pos]).collect();
    let rows = h.index_select(&Tensor::from_slice(&from, from.len(), &dev)?, 0)?;
    let entropy = Arc::new(Mutex::new(Vec::new()));
    let logprobs =
        rows.contiguous()?.apply_op1(HeadLogprob { head: base.head.clone(), targets, entropy: entropy.clone() })?;
    let entropy = entropy.lock().map(|e| e.clone()).unwrap_or_default();
    Ok(RowOutput { logprobs: logprobs.to_dtype(DType::F32)?, entropy })
}
