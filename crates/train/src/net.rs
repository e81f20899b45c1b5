//! The decoder forward pass for training (Llama, Qwen2, Qwen3, Gemma 3: `tandem_model::arch`), on
//! candle tensors with autograd: the base weights are the engine's own matrices, shared and frozen
//! (never candle variables; f32 copies only for the exact base of finite-difference tests); LoRA
//! A/B matrices on q, k, v, o, gate, up and down are the only variables. Each stacked product
//! (q/k/v, o, gate/up, down, as the engine computes them) with its adapters is one [`LoraLinear`]
//! op, which never computes a base-weight gradient.
//!
//! Only ops with a correct backward are used (stack notes, pitfall 4): RMS norms (also per head
//! and on block outputs), RoPE, the masked softmax (with Gemma's sliding window) and the gated
//! activation are fused ops with written backward passes ([`crate::fused`]), biases are candle's
//! broadcast add, and the output head is [`HeadLogprob`]. Weights are in the inference model's
//! internal row layout (q/k rows interleaved for RoPE, whatever the file held); the adapter is
//! converted to PEFT's layout only when saved.

use crate::fused::{ActMul, RmsNorm, Rope, SegmentAttention};
use crate::head_lora::HeadLoraLogprob;
use crate::linear::{Frozen, LoraLinear, Shared, Which};
use crate::ops::{HeadInt8, HeadLogprob, HeadWeights};
use crate::pack::Row;
use candle_core::{DType, Device, Tensor, Var};
use std::sync::{Arc, Mutex};
use tandem_model::kernels::causal::Span;
use tandem_model::llama::RopeTable;
use tandem_model::peft::{AdapterConfig, Module};
use tandem_model::{Llama, LlamaConfig, Quantize, WeightSource};

type Res<T> = candle_core::Result<T>;

struct BaseLayer {
    attn_norm: Arc<Vec<f32>>,
    ffn_norm: Arc<Vec<f32>>,
    /// q, k, v stacked; o; gate, up stacked; down: each (out, in), as the engine holds them.
    qkv: Frozen,
    o: Frozen,
    gate_up: Frozen,
    down: Frozen,
    /// Qwen2: the q, k, v biases as one (1, out) row, in `qkv`'s order.
    bias: Option<Tensor>,
    /// Qwen3, Gemma 3: per-head RMS norm weights of q and k.
    qk_norm: Option<NormPair>,
    /// Gemma 3: norms of the attention's and the MLP's outputs.
    post_norms: Option<NormPair>,
}

/// Two norm weight vectors (q and k, or attention and MLP outputs).
type NormPair = (Arc<Vec<f32>>, Arc<Vec<f32>>);

/// Where token rows come from: the f32 embedding, or a quantised matrix (dequantised per token).
enum Embedding {
    F32(Tensor),
    Quantized(Shared),
}

/// The frozen base model.
pub struct Base {
    pub config: LlamaConfig,
    embed: Embedding,
    head: HeadWeights,
    layers: Vec<BaseLayer>,
    out_norm: Arc<Vec<f32>>,
    /// The outputs of the projections stacked in `qkv`, `o`, `gate_up` and `down`.
    parts: [Arc<[usize]>; 4],
    /// RoPE tables of the global base and, where it differs, of the sliding layers' base.
    rope: RopeTable,
    rope_swa: Option<RopeTable>,
    /// Attention reads keys and values rounded as the server's cache holds them (f16), so that
    /// the learner's logprobs match the sampler's; off for the exact base, whose finite-difference
    /// checks a rounding step would break.
    kv_as_cached: bool,
}

impl Base {
    /// The base for training: the frozen projections, the head and the attention through the
    /// serving kernels on every CPU tier (see [`Frozen::Served`] and `tandem_model::as_served`),
    /// so that the forward's logprobs are the sampler's to the bit. Loads the file as the server
    /// does; a server hands the trainer its own model instead ([`Base::shared`]).
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        Self::load_served(path, Quantize::default())
    }

    /// [`Base::load`] for a server run with `--quantize q`: the matrices in the formats that
    /// server keeps them in (`tandem_model::load_model` with the same `q`).
    pub fn load_served(path: &std::path::Path, q: Quantize) -> Result<Self, String> {
        let model = tandem_model::load_model(path, q).map_err(|e| e.to_string())?.model;
        Self::shared(Arc::new(model))
    }

    /// The base on the engine's own model: every matrix is read where the engine holds it (one
    /// copy of the weights for serving and training); only norm weights and biases, a few KB a
    /// layer, are copied.
    pub fn shared(model: Arc<Llama>) -> Result<Self, String> {
        let config = model.config.clone();
        let matrix =
            |which: Which| Shared::of(&model, which).ok_or_else(|| format!("the served model has no {which:?}"));
        let dev = Device::Cpu;
        let mut layers = Vec::with_capacity(model.layers.len());
        for (l, layer) in model.layers.iter().enumerate() {
            let x = &layer.extra;
            let pair = |a: &Option<Vec<f32>>, b: &Option<Vec<f32>>| match (a, b) {
                (Some(a), Some(b)) => Some((Arc::new(a.clone()), Arc::new(b.clone()))),
                _ => None,
            };
            let bias = match &x.qkv_bias {
                Some(b) => Some(Tensor::from_slice(b, (1, b.len()), &dev).map_err(|e| e.to_string())?),
                None => None,
            };
            layers.push(BaseLayer {
                attn_norm: Arc::new(layer.attn_norm.clone()),
                ffn_norm: Arc::new(layer.ffn_norm.clone()),
                qkv: Frozen::Served(matrix(Which::Qkv(l))?),
                o: Frozen::Served(matrix(Which::O(l))?),
                gate_up: Frozen::Served(matrix(Which::GateUp(l))?),
                down: Frozen::Served(matrix(Which::Down(l))?),
                bias,
                qk_norm: pair(&x.q_norm, &x.k_norm),
                post_norms: pair(&x.post_attn_norm, &x.post_ffn_norm),
            });
        }
        let embed = Embedding::Quantized(matrix(Which::Embed)?);
        let head = HeadWeights::Int8(HeadInt8 { e: matrix(Which::Head)? });
        let out_norm = Arc::new(model.out_norm.clone());
        Ok(Self::assemble(config, embed, head, layers, out_norm, true))
    }

    /// The base with f32 GEMMs everywhere (exact gradients, for finite-difference checks).
    pub fn load_exact(path: &std::path::Path) -> Result<Self, String> {
        let mut f = WeightSource::open(path).map_err(|e| e.to_string())?;
        let config = f.llama_config().map_err(|e| e.to_string())?;
        let dev = Device::Cpu;
        let tied = !f.has_tensor("output.weight");
        let mut t = |name: &str| -> Result<Tensor, String> {
            // Dims outermost first: weights are (out, in); q/k rows in the internal order.
            let (data, dims) = tandem_model::layer_f32(&mut f, &config, name).map_err(|e| e.to_string())?;
            Tensor::from_vec(data, dims, &dev).map_err(|e| e.to_string())
        };
        let embed = t("token_embd.weight")?;
        let head = if tied { embed.clone() } else { t("output.weight")? };
        let mut layers = Vec::with_capacity(config.n_layer);
        for l in 0..config.n_layer {
            let p = format!("blk.{l}");
            let mut stack = |names: &[&str]| -> Result<Frozen, String> {
                let parts = names.iter().map(|n| t(&format!("{p}.{n}.weight"))).collect::<Result<Vec<_>, _>>()?;
                Tensor::cat(&parts, 0).map(Frozen::F32).map_err(|e| e.to_string())
            };
            let (qkv, o) = (stack(&["attn_q", "attn_k", "attn_v"])?, stack(&["attn_output"])?);
            let (gate_up, down) = (stack(&["ffn_gate", "ffn_up"])?, stack(&["ffn_down"])?);
            let arch = config.arch;
            let mut v = |name: &str| t(&format!("{p}.{name}")).and_then(vector);
            let bias = if arch.qkv_bias() {
                let b = [v("attn_q.bias")?, v("attn_k.bias")?, v("attn_v.bias")?].map(|b| b.to_vec()).concat();
                Some(Tensor::from_vec(b.clone(), (1, b.len()), &dev).map_err(|e| e.to_string())?)
            } else {
                None
            };
            let qk_norm =
                if arch.qk_norm() { Some((v("attn_q_norm.weight")?, v("attn_k_norm.weight")?)) } else { None };
            let post_norms = if arch.post_norms() {
                Some((v("post_attention_norm.weight")?, v("post_ffw_norm.weight")?))
            } else {
                None
            };
            layers.push(BaseLayer {
                attn_norm: v("attn_norm.weight")?,
                ffn_norm: v("ffn_norm.weight")?,
                qkv,
                o,
                gate_up,
                down,
                bias,
                qk_norm,
                post_norms,
            });
        }
        let out_norm = vector(t("output_norm.weight")?)?;
        Ok(Self::assemble(config, Embedding::F32(embed), HeadWeights::F32(head), layers, out_norm, false))
    }

    fn assemble(
        config: LlamaConfig,
        embed: Embedding,
        head: HeadWeights,
        layers: Vec<BaseLayer>,
        out_norm: Arc<Vec<f32>>,
        served: bool,
    ) -> Self {
        let (h, f, qd, kvd) = (config.hidden, config.ffn, config.q_dim(), config.kv_dim());
        let parts = [vec![qd, kvd, kvd].into(), vec![h].into(), vec![f, f].into(), vec![h].into()];
        let (rope, rope_swa) = (RopeTable::global(&config), RopeTable::sliding(&config));
        Base { config, embed, head, layers, out_norm, parts, rope, rope_swa, kv_as_cached: served }
    }

    /// (in, out) of projection `m` (index into [`Module::ALL`]).
    pub fn dims(&self, m: usize) -> (usize, usize) {
        Module::ALL[m].dims(&self.config)
    }
}

fn vector(t: Tensor) -> Result<Arc<Vec<f32>>, String> {
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map(Arc::new).map_err(|e| e.to_string())
}

/// The trainable adapter: `A (r, in)` and `B (out, r)` per layer and module; delta = scale B A.
pub struct Lora {
    /// Rank, alpha and rsLoRA, as `adapter_config.json` holds them.
    pub config: AdapterConfig,
    /// [layer][module] -> (A, B), modules in [`Module::ALL`] order.
    pub pairs: Vec<[(Var, Var); 7]>,
    /// The output head's (A (r, hidden), B (vocab, r)), when it trains (Tinker's
    /// `train_unembed`).
    pub head: Option<(Var, Var)>,
}

impl Lora {
    pub fn rank(&self) -> usize {
        self.config.r
    }

    pub fn scale(&self) -> f64 {
        self.config.scale()
    }

    /// Every variable: the layers' pairs in order, then the head's (last, so the optimizer
    /// moments of states saved without one keep their indices).
    pub fn vars(&self) -> Vec<Var> {
        let layers = self.pairs.iter().flat_map(|l| l.iter().flat_map(|(a, b)| [a.clone(), b.clone()]));
        layers.chain(self.head.iter().flat_map(|(a, b)| [a.clone(), b.clone()])).collect()
    }
}

/// `x W^T + scale (x A_i^T) B_i^T` in each stacked projection's columns (`parts`).
fn linear(x: &Tensor, w: &Frozen, pairs: &[&(Tensor, Tensor)], parts: &Arc<[usize]>, scale: f64) -> Res<Tensor> {
    let (a, b) = match pairs {
        [(a, b)] => (a.clone(), b.clone()),
        _ => (
            Tensor::cat(&pairs.iter().map(|p| &p.0).collect::<Vec<_>>(), 0)?,
            Tensor::cat(&pairs.iter().map(|p| &p.1).collect::<Vec<_>>(), 0)?,
        ),
    };
    x.contiguous()?.apply_op3(&a, &b, LoraLinear { w: w.clone(), parts: parts.clone(), scale })
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

/// A tree's prefix as its branches read it, computed once for several parts: every layer's
/// keys (after RoPE) and values of the prefix rows, and the final hidden state of its last row
/// (which predicts each branch's first token). [`forward_prefix`] captures it;
/// [`forward_branches`] reads it as rows `0..p` of its part.
pub struct Prefix {
    pub kv: Vec<(Tensor, Tensor)>,
    pub last: Tensor,
}

/// The forward pass over a packed row, for a backward pass to follow.
pub fn forward(base: &Base, lora: &Lora, row: &Row) -> Res<RowOutput> {
    forward_pass(base, lora, row, true, None, false).map(|(out, _)| out)
}

/// The forward pass over a packed row when only its logprobs are wanted (reference and
/// learner logprobs, Tinker's `forward`): the head skips what only a backward would use.
pub fn score(base: &Base, lora: &Lora, row: &Row) -> Res<RowOutput> {
    forward_pass(base, lora, row, false, None, false).map(|(out, _)| out)
}

/// The forward pass over a row that is one tree's prefix (one span), also giving what its
/// branches read ([`Prefix`], in the graph); `grad`: a backward pass follows.
pub fn forward_prefix(base: &Base, lora: &Lora, row: &Row, grad: bool) -> Res<(RowOutput, Prefix)> {
    let (out, prefix) = forward_pass(base, lora, row, grad, None, true)?;
    Ok((out, prefix.expect("captured")))
}

/// The forward pass over a part whose span 0 is a tree's prefix, computed before: rows `0..p`
/// come from `prefix` (leaf variables, so the backward gives their gradients) and only the
/// branches run. Its targets must all lie in the branches; `grad`: a backward pass follows.
pub fn forward_branches(base: &Base, lora: &Lora, row: &Row, prefix: &Prefix, grad: bool) -> Res<RowOutput> {
    forward_pass(base, lora, row, grad, Some(prefix), false).map(|(out, _)| out)
}

fn forward_pass(
    base: &Base,
    lora: &Lora,
    row: &Row,
    grad: bool,
    given: Option<&Prefix>,
    capture: bool,
) -> Res<(RowOutput, Option<Prefix>)> {
    let pass = Pass::new(base, lora, row, grad, given)?;
    let mut x = pass.embed()?;
    let mut captured = Vec::new();
    for li in 0..base.layers.len() {
        let (next, k, v) = pass.layer(li, &x)?;
        if capture {
            captured.push((k, v));
        }
        x = next;
    }
    let (out, last) = pass.head(&x, grad)?;
    Ok((out, capture.then(|| Prefix { kv: captured, last })))
}

/// One pass over a row, layer by layer: what every layer reads (the rows' RoPE angles, the
/// attention spans, a given prefix) made once. [`forward_pass`] runs its layers in order;
/// [`crate::recompute`] runs them again one at a time from saved inputs.
pub(crate) struct Pass<'a> {
    base: &'a Base,
    row: &'a Row,
    /// The adapter's A and B per layer and module: the variables themselves when a backward
    /// follows, detached copies (same storage) when not, so that no graph is built and each
    /// activation is freed as soon as the next op has read it.
    pairs: Vec<[(Tensor, Tensor); 7]>,
    /// The output head's pair, the same way.
    head_pair: Option<(Tensor, Tensor)>,
    scale: f64,
    given: Option<&'a Prefix>,
    /// Rows before `p` are a given prefix's (not computed here).
    p: usize,
    rope: Rope,
    rope_swa: Option<Rope>,
    spans: Arc<Vec<Span>>,
    /// A given prefix's query rows (the attention reads none of them), made once.
    no_queries: Tensor,
}

impl<'a> Pass<'a> {
    pub(crate) fn new(base: &'a Base, lora: &Lora, row: &'a Row, grad: bool, given: Option<&'a Prefix>) -> Res<Self> {
        let c = &base.config;
        let p = if given.is_some() { row.segments[0].1 } else { 0 };
        let n = row.tokens.len() - p;
        // Each sequence's positions start at 0 (a branch's continue after its prefix): the RoPE
        // angles of every computed row, once per row and table (Gemma's sliding layers have
        // their own base).
        let half = c.head_dim / 2;
        let computed: Vec<usize> = (0..row.segments.len()).filter(|&seg| row.segments[seg].0 >= p).collect();
        let row_rope = |table: &RopeTable| {
            let (mut cos, mut sin) = (Vec::with_capacity(n * half), Vec::with_capacity(n * half));
            for &seg in &computed {
                let (o, len) = (row.offset(seg), row.segments[seg].1);
                cos.extend_from_slice(&table.cos[o * half..(o + len) * half]);
                sin.extend_from_slice(&table.sin[o * half..(o + len) * half]);
            }
            Rope { cos: Arc::new(cos), sin: Arc::new(sin), head_dim: c.head_dim }
        };
        let take = |(a, b): &(Var, Var)| {
            if grad {
                (a.as_tensor().clone(), b.as_tensor().clone())
            } else {
                (a.as_tensor().detach(), b.as_tensor().detach())
            }
        };
        let pairs = lora.pairs.iter().map(|layer| layer.each_ref().map(take)).collect();
        Ok(Pass {
            base,
            row,
            pairs,
            head_pair: lora.head.as_ref().map(take),
            scale: lora.scale(),
            given,
            p,
            rope: row_rope(&base.rope),
            rope_swa: base.rope_swa.as_ref().map(row_rope),
            // Attention runs over all the row's rows (a given prefix's as keys only).
            spans: Arc::new(row.spans().into_iter().filter(|s| s.start >= p).collect()),
            no_queries: Tensor::zeros((p, c.n_head * c.head_dim), DType::F32, &Device::Cpu)?,
        })
    }

    /// The computed rows' token embeddings (the first layer's input).
    pub(crate) fn embed(&self) -> Res<Tensor> {
        let tokens = &self.row.tokens[self.p..];
        let dev = Device::Cpu;
        let x = match &self.base.embed {
            Embedding::F32(e) => e.index_select(&Tensor::from_slice(tokens, tokens.len(), &dev)?, 0)?,
            Embedding::Quantized(e) => {
                let h = e.cols();
                let mut rows = vec![0f32; tokens.len() * h];
                for (out, &t) in rows.chunks_exact_mut(h).zip(tokens) {
                    e.dequantize_row(t as usize, out);
                }
                Tensor::from_vec(rows, (tokens.len(), h), &dev)?
            }
        };
        match self.base.config.embed_scale {
            Some(s) => x.affine(s as f64, 0.0),
            None => Ok(x),
        }
    }

    /// Layer `li` on its input `x`: its output and the layer's keys (after RoPE) and values.
    pub(crate) fn layer(&self, li: usize, x: &Tensor) -> Res<(Tensor, Tensor, Tensor)> {
        let (c, layer, pairs) = (&self.base.config, &self.base.layers[li], &self.pairs[li]);
        let (scale, eps) = (self.scale, c.rms_eps);
        let window = c.window(li);
        let rope = match (&self.rope_swa, window) {
            (Some(r), Some(_)) => r,
            _ => &self.rope,
        };
        let rotate = |x: Tensor| -> Res<Tensor> { x.contiguous()?.apply_op1(rope.clone()) };
        let attention = SegmentAttention {
            kv_as_cached: self.base.kv_as_cached,
            spans: self.spans.clone(),
            heads: tandem_model::kernels::causal::Heads {
                n_head: c.n_head,
                n_kv_head: c.n_kv_head,
                head_dim: c.head_dim,
                scale: c.attn_scale,
                window: window.map(|w| w.window),
            },
        };
        let h = rms_norm(x, &layer.attn_norm, eps)?;
        let parts = &self.base.parts;
        let mut qkv = linear(&h, &layer.qkv, &[&pairs[0], &pairs[1], &pairs[2]], &parts[0], scale)?;
        drop(h);
        if let Some(bias) = &layer.bias {
            qkv = qkv.broadcast_add(bias)?;
        }
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let (mut q, mut k, v) = (qkv.narrow(1, 0, qd)?, qkv.narrow(1, qd, kvd)?, qkv.narrow(1, qd + kvd, kvd)?);
        drop(qkv);
        if let Some((qn, kn)) = &layer.qk_norm {
            // The norm's weight is one head long: the op normalises each head on its own.
            (q, k) = (rms_norm(&q, qn, eps)?, rms_norm(&k, kn, eps)?);
        }
        let (q, k, v) = (rotate(q)?, rotate(k)?, v.contiguous()?);
        let att = match self.given {
            Some(prefix) => {
                let (pk, pv) = &prefix.kv[li];
                let q = Tensor::cat(&[&self.no_queries, &q], 0)?;
                let (k, v) = (Tensor::cat(&[pk, &k], 0)?, Tensor::cat(&[pv, &v], 0)?);
                q.apply_op3(&k, &v, attention)?.narrow(0, self.p, x.dim(0)?)?
            }
            None => q.apply_op3(&k, &v, attention)?,
        };
        drop(q);
        let mut o = linear(&att, &layer.o, &[&pairs[3]], &parts[1], scale)?;
        drop(att);
        if let Some((post, _)) = &layer.post_norms {
            o = rms_norm(&o, post, eps)?;
        }
        let x = x.add(&o)?;
        drop(o);
        let h = rms_norm(&x, &layer.ffn_norm, eps)?;
        let gate_up = linear(&h, &layer.gate_up, &[&pairs[4], &pairs[5]], &parts[2], scale)?;
        drop(h);
        let act = gate_up.apply_op1(ActMul(c.arch.activation()))?;
        drop(gate_up);
        let mut d = linear(&act, &layer.down, &[&pairs[6]], &parts[3], scale)?;
        drop(act);
        if let Some((_, post)) = &layer.post_norms {
            d = rms_norm(&d, post, eps)?;
        }
        Ok((x.add(&d)?, k, v))
    }

    /// The last layer's output `x` to the targets' logprobs (and entropies), with the final
    /// hidden state of the last computed row (what a tree's branches read of their prefix);
    /// `grad`: a backward pass through the head follows.
    pub(crate) fn head(&self, x: &Tensor, grad: bool) -> Res<(RowOutput, Tensor)> {
        let dev = Device::Cpu;
        let row = self.row;
        let mut h = rms_norm(x, &self.base.out_norm, self.base.config.rms_eps)?;
        let last = h.narrow(0, h.dim(0)? - 1, 1)?;
        // Row index i of the part is row i - p of `h`; with a given prefix, its last row is put
        // before them (every target is in a branch, so none reads further back).
        let mut first = self.p;
        if let Some(prefix) = self.given {
            h = Tensor::cat(&[&prefix.last, &h], 0)?;
            first = self.p - 1;
        }
        if row.targets.is_empty() {
            let none = Tensor::zeros(0, DType::F32, &dev)?;
            return Ok((RowOutput { logprobs: none, entropy: Vec::new() }, last));
        }
        let from: Vec<u32> = row.targets.iter().map(|t| (row.source(t) - first) as u32).collect();
        let targets: Vec<u32> = row.targets.iter().map(|t| t.token_in(row)).collect();
        // Targets that read the same row and name the same token (the prompt positions of a
        // Tinker group's datums, which share the prompt's rows) are one logprob: computed once
        // and handed to each (index_select's backward sums their gradients).
        let (firsts, inverse) = distinct_pairs(&from, &targets);
        let (from, targets): (Vec<u32>, Vec<u32>) = firsts.iter().map(|&i| (from[i], targets[i])).unzip();
        let rows = h.index_select(&Tensor::from_slice(&from, from.len(), &dev)?, 0)?;
        let entropy = Arc::new(Mutex::new(Vec::new()));
        let grad_rows = grad.then(|| Arc::new(Mutex::new(Vec::new())));
        let logprobs = match &self.head_pair {
            None => {
                // A row is untrained when each target it stands for has weight 0: a Tinker
                // target whose weight or advantage is 0, which gets no gradient. (A job's
                // sequence-level ratio can give a weight-0 token one: the backward checks.)
                let mut untrained = vec![true; targets.len()];
                for (k, t) in row.targets.iter().enumerate() {
                    untrained[inverse.as_ref().map_or(k, |inv| inv[k] as usize)] &= t.weight == 0.0;
                }
                let head = HeadLogprob {
                    head: self.base.head.clone(),
                    targets,
                    entropy: entropy.clone(),
                    grad_rows,
                    untrained,
                };
                rows.contiguous()?.apply_op1(head)?
            }
            Some((a, b)) => {
                // u = scale · h A^T through autograd, so A's gradient and h's share of it flow.
                let u = rows.contiguous()?.apply_op2(
                    a,
                    crate::head_lora::LoraDown {
                        scale: self.scale,
                        as_stored: matches!(self.base.head, HeadWeights::Int8(_)),
                    },
                )?;
                let head = HeadLoraLogprob { head: self.base.head.clone(), targets, entropy: entropy.clone() };
                rows.contiguous()?.apply_op3(&u, b, head)?
            }
        };
        let mut entropy = entropy.lock().map(|e| e.clone()).unwrap_or_default();
        let mut logprobs = logprobs.to_dtype(DType::F32)?;
        if let Some(inverse) = inverse {
            entropy = inverse.iter().map(|&k| entropy.get(k as usize).copied().unwrap_or(f32::NAN)).collect();
            logprobs = logprobs.index_select(&Tensor::from_slice(&inverse, inverse.len(), &dev)?, 0)?;
        }
        Ok((RowOutput { logprobs, entropy }, last))
    }
}

/// The first index of each distinct `(row, token)` pair, in order, and, when some pair repeats,
/// each index's position among those firsts (`None`: every pair is distinct).
fn distinct_pairs(rows: &[u32], tokens: &[u32]) -> (Vec<usize>, Option<Vec<u32>>) {
    let mut seen = std::collections::HashMap::with_capacity(rows.len());
    let mut firsts = Vec::with_capacity(rows.len());
    let inverse: Vec<u32> = rows
        .iter()
        .zip(tokens)
        .enumerate()
        .map(|(i, pair)| {
            *seen.entry(pair).or_insert_with(|| {
                firsts.push(i);
                (firsts.len() - 1) as u32
            })
        })
        .collect();
    let repeats = firsts.len() < rows.len();
    (firsts, repeats.then_some(inverse))
}

#[cfg(test)]
mod tests {
    use super::distinct_pairs;

    #[test]
    fn repeated_row_token_pairs_are_computed_once() {
        // Rows 0 and 1 read by two datums with the same tokens, row 1 once with another token.
        let (firsts, inverse) = distinct_pairs(&[0, 1, 2, 0, 1, 1], &[5, 6, 7, 5, 6, 9]);
        assert_eq!(firsts, vec![0, 1, 2, 5]);
        assert_eq!(inverse, Some(vec![0, 1, 2, 0, 1, 3]));
        let (firsts, inverse) = distinct_pairs(&[0, 1, 1], &[5, 6, 7]);
        assert_eq!((firsts, inverse), (vec![0, 1, 2], None));
    }
}
