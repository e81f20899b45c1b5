//! The Llama architecture: config, weights, and a forward pass over a ragged batch.
//!
//! A batch is a list of sequences, each contributing some new tokens (a prefill chunk or one
//! decode token) at positions that continue its own KV cache. All tokens of the batch are packed
//! into one (T, hidden) matrix for the linear layers, so each weight is read once per step for the
//! whole batch; attention runs per token against its own sequence's cache.

use crate::arch::{Activation, Arch, SlidingWindow};
use crate::kernels::team::{for_each_chunk_mut, for_each_segment_mut};
use crate::kernels::{self, Q8Acts, Weights};
use crate::kv::KvCache;
use crate::lora::LoraAdapter;
use crate::ModelError;

/// Most rows one LoRA task takes (rows on one adapter beyond it make another task, so that a long
/// prompt's rows still spread over the cores).
const LORA_ROWS: usize = 16;

/// Shape of a Llama-family model (Llama, Qwen2, Qwen3, Gemma 3: `crate::arch`), read from GGUF
/// metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub arch: Arch,
    pub n_layer: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    pub vocab: usize,
    pub context_len: usize,
    /// Multiplier of the attention scores.
    pub attn_scale: f32,
    /// Multiplier of embedding rows (Gemma 3: sqrt(hidden)).
    pub embed_scale: Option<f32>,
    pub sliding: Option<SlidingWindow>,
    /// Whether the source keeps q/k rows in Hugging Face's halves order (every architecture's
    /// safetensors, and GGUF files of all but Llama), permuted at load (`crate::arch`).
    pub qk_halves: bool,
    /// Per-pair divisors of the RoPE frequencies (Llama 3.1+'s `llama3` scaling: GGUF
    /// `rope_freqs.weight`, or computed from a Hugging Face `rope_scaling`).
    pub rope_freq_factors: Option<Vec<f32>>,
}

impl LlamaConfig {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// The sliding window of `layer`, if it has one.
    pub fn window(&self, layer: usize) -> Option<SlidingWindow> {
        self.sliding.filter(|w| w.slides(layer))
    }

    /// The RoPE base of `layer`.
    pub fn rope_base_of(&self, layer: usize) -> f32 {
        self.window(layer).map_or(self.rope_base, |w| w.rope_base)
    }

    /// A plain Llama of this shape (tests build configs field by field from it).
    pub fn llama(n_layer: usize, hidden: usize, ffn: usize, n_head: usize, n_kv_head: usize, vocab: usize) -> Self {
        let head_dim = hidden / n_head;
        LlamaConfig {
            arch: Arch::Llama,
            n_layer,
            hidden,
            ffn,
            n_head,
            n_kv_head,
            head_dim,
            rope_base: 10_000.0,
            rms_eps: 1e-5,
            vocab,
            context_len: 2048,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            embed_scale: None,
            sliding: None,
            qk_halves: false,
            rope_freq_factors: None,
        }
    }

    /// Refuses shapes the kernels cannot run (a hostile file must not panic the loader).
    pub fn check(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Unsupported(m));
        if self.n_layer == 0 || self.hidden == 0 || self.ffn == 0 || self.vocab == 0 || self.context_len == 0 {
            return bad(format!("empty dimension in {self:?}"));
        }
        if self.n_head == 0 || self.n_kv_head == 0 || !self.n_head.is_multiple_of(self.n_kv_head) {
            return bad(format!("{} query heads cannot share {} key/value heads", self.n_head, self.n_kv_head));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!("head dimension {} is not even", self.head_dim));
        }
        if self.context_len > 1 << 20 || self.n_layer > 1024 || self.head_dim > 1024 {
            return bad(format!("implausible shape {self:?}"));
        }
        Ok(())
    }
}

/// One transformer block. q/k/v and gate/up are fused into one matrix each; q/k rows (and
/// their biases and norm weights) are in the interleaved rotary order (`crate::arch`).
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub qkv: Weights,
    pub o: Weights,
    pub ffn_norm: Vec<f32>,
    pub gate_up: Weights,
    pub down: Weights,
    /// The optional parts some architectures add (`crate::arch`'s table).
    pub extra: LayerExtra,
}

/// What Qwen and Gemma add to a Llama block; all `None` for Llama.
#[derive(Default)]
pub struct LayerExtra {
    /// Qwen2: biases of q, k and v, in `qkv`'s row order.
    pub qkv_bias: Option<Vec<f32>>,
    /// Qwen3, Gemma 3: RMS norm weights (head_dim) applied to every head of q, and of k.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Gemma 3: RMS norms of the attention's and the MLP's outputs, before the residual add.
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
}

pub struct Llama {
    pub config: LlamaConfig,
    pub embed: Weights,
    pub layers: Vec<Layer>,
    pub out_norm: Vec<f32>,
    /// `None` when the output head is tied to the embedding.
    pub lm_head: Option<Weights>,
    /// RoPE tables of the global base, and of the sliding layers' base where it differs.
    rope: RopeTable,
    rope_swa: Option<RopeTable>,
    /// Some matrix is f32 (`--quantize none`): matmuls need the activations in f32 too.
    f32_acts: bool,
    /// Whether any weight takes activations quantised per 256 values too (`Q8Acts::k_quants`).
    k_acts: bool,
}

/// cos / sin of position p and pair i at `[p * head_dim / 2 + i]`.
pub struct RopeTable {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// The table of the model's global layers (its frequency factors apply there).
    pub fn global(c: &LlamaConfig) -> Self {
        Self::new(c.rope_base, c.head_dim, c.context_len, c.rope_freq_factors.as_deref())
    }

    /// The table of its sliding layers, where their base differs.
    pub fn sliding(c: &LlamaConfig) -> Option<Self> {
        c.sliding
            .filter(|w| w.rope_base != c.rope_base)
            .map(|w| Self::new(w.rope_base, c.head_dim, c.context_len, None))
    }

    /// Pair i of position p turns by `p * base^(-2i / head_dim) / factors[i]`.
    pub fn new(base: f32, head_dim: usize, positions: usize, factors: Option<&[f32]>) -> Self {
        let half = head_dim / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(positions * half), Vec::with_capacity(positions * half));
        for pos in 0..positions {
            for i in 0..half {
                let factor = factors.and_then(|f| f.get(i)).map_or(1.0, |f| *f as f64);
                let inv_freq = 1.0 / (base as f64).powf(2.0 * i as f64 / head_dim as f64) / factor;
                let (s, c) = (pos as f64 * inv_freq).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        RopeTable { cos, sin }
    }
}

/// Which logits a sequence wants from this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    /// Only after its last new token (decode, or the end of a prefill).
    Last,
    /// After every new token (prompt logprobs).
    All,
}

/// The logit rows one step returns: one (rows, vocab) matrix in which each sequence's rows are
/// consecutive, in input order. One allocation, handed out as row views: 16 decode rows over
/// Qwen's 151,936 tokens are 9.7 MB, which a copy per row had held twice at the step's peak.
#[derive(Debug)]
pub struct StepLogits {
    data: Vec<f32>,
    vocab: usize,
    /// Per sequence: its first row and how many it has.
    spans: Vec<(usize, usize)>,
}

impl StepLogits {
    /// Sequence `seq`'s rows, in token order.
    pub fn rows(&self, seq: usize) -> std::slice::ChunksExact<'_, f32> {
        let (first, n) = self.spans[seq];
        self.data[first * self.vocab..(first + n) * self.vocab].chunks_exact(self.vocab.max(1))
    }

    /// Sequence `seq`'s last row (after its last new token), if it asked for any.
    pub fn last(&self, seq: usize) -> Option<&[f32]> {
        self.rows(seq).next_back()
    }
}

/// `logits[(seq, i)]`: row `i` of sequence `seq`.
impl std::ops::Index<(usize, usize)> for StepLogits {
    type Output = [f32];
    fn index(&self, (seq, i): (usize, usize)) -> &[f32] {
        let n = self.spans[seq].1;
        self.rows(seq).nth(i).unwrap_or_else(|| panic!("sequence {seq} has {n} logit rows, not {}", i + 1))
    }
}

/// One sequence's part of a batch.
pub struct SeqInput<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
    pub adapter: Option<&'a LoraAdapter>,
    pub logits: Logits,
}

/// Where each packed row comes from.
#[derive(Clone, Copy)]
struct RowInfo {
    seq: usize,
    pos: usize,
}

/// Buffers of one step, reused by every layer instead of allocated (and zeroed) six times per
/// layer: the activations' quantised copy, the normed input, and three outputs (q/k/v, attention,
/// projection in the attention block; gate/up, hidden, down in the FFN block).
#[derive(Default)]
struct Scratch {
    acts: Q8Acts,
    xn: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl Llama {
    pub fn new(
        config: LlamaConfig,
        embed: Weights,
        layers: Vec<Layer>,
        out_norm: Vec<f32>,
        lm_head: Option<Weights>,
    ) -> Self {
        let (rope, rope_swa) = (RopeTable::global(&config), RopeTable::sliding(&config));
        let f32_acts = lm_head.as_ref().is_some_and(Weights::needs_f32_acts)
            || embed.needs_f32_acts()
            || layers.iter().any(|l| [&l.qkv, &l.o, &l.gate_up, &l.down].into_iter().any(Weights::needs_f32_acts));
        let k_acts = lm_head.as_ref().is_some_and(Weights::wants_k_acts)
            || embed.wants_k_acts()
            || layers.iter().any(|l| [&l.qkv, &l.o, &l.gate_up, &l.down].into_iter().any(Weights::wants_k_acts));
        Llama { config, embed, layers, out_norm, lm_head, rope, rope_swa, f32_acts, k_acts }
    }

    fn rope_of(&self, layer: usize) -> &RopeTable {
        match (&self.rope_swa, self.config.window(layer)) {
            (Some(t), Some(_)) => t,
            _ => &self.rope,
        }
    }

    pub fn weight_bytes(&self) -> usize {
        let l: usize =
            self.layers.iter().map(|l| l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes()).sum();
        l + self.embed.bytes() + self.lm_head.as_ref().map_or(0, Weights::bytes)
    }

    /// Runs one step. Returns, per sequence, its requested logits rows (vocab floats each).
    pub fn forward(&self, seqs: &mut [SeqInput<'_>]) -> Result<StepLogits, ModelError> {
        let c = &self.config;
        let mut rows = Vec::new();
        for (s, seq) in seqs.iter().enumerate() {
            let start = seq.cache.len();
            if start + seq.tokens.len() > c.context_len {
                return Err(ModelError::ContextOverflow { needed: start + seq.tokens.len(), limit: c.context_len });
            }
            if let Some(&bad) = seq.tokens.iter().find(|t| **t as usize >= c.vocab) {
                return Err(ModelError::TokenOutOfRange(bad));
            }
            rows.extend((0..seq.tokens.len()).map(|i| RowInfo { seq: s, pos: start + i }));
        }
        let t_rows = rows.len();
        let h = c.hidden;
        let mut x = vec![0f32; t_rows * h];
        let tokens: Vec<u32> = seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        for (row, tok) in x.chunks_exact_mut(h).zip(&tokens) {
            self.embed.dequantize_row(*tok as usize, row);
            if let Some(scale) = c.embed_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        let mut s = Scratch::default();
        s.acts.keep_f32 = self.f32_acts;
        s.acts.k_quants = self.k_acts;
        for (li, layer) in self.layers.iter().enumerate() {
            self.attention_block(li, layer, seqs, &rows, &mut x, &mut s);
            self.ffn_block(li, layer, seqs, &rows, &mut x, &mut s);
        }
        for seq in seqs.iter_mut() {
            seq.cache.commit(seq.tokens.len());
        }
        Ok(self.logits(seqs, &rows, &x, &mut s.acts))
    }

    /// RMS-normalised copy of the residual stream into `xn`, also quantised into `acts` for the
    /// next matmul.
    fn normed(&self, x: &[f32], weight: &[f32], xn: &mut Vec<f32>, acts: &mut Q8Acts) {
        let h = self.config.hidden;
        xn.clear();
        xn.extend_from_slice(x);
        for_each_chunk_mut(xn, h, |_, r| kernels::rms_norm(r, weight, self.config.rms_eps));
        acts.quantize(xn, x.len() / h, h);
    }

    fn attention_block(
        &self,
        li: usize,
        layer: &Layer,
        seqs: &mut [SeqInput<'_>],
        rows: &[RowInfo],
        x: &mut [f32],
        s: &mut Scratch,
    ) {
        let c = &self.config;
        let (h, qd, kvd, hd) = (c.hidden, c.q_dim(), c.kv_dim(), c.head_dim);
        let t_rows = rows.len();
        let Scratch { acts, xn, a: qkv, b: attn, c: proj } = s;
        self.normed(x, &layer.attn_norm, xn, acts);
        let width = qd + 2 * kvd;
        // Every output below is written whole by its kernel: resizing, not zeroing, is enough.
        qkv.resize(t_rows * width, 0.0);
        kernels::matmul(&layer.qkv, acts, qkv);
        self.apply_lora(seqs, rows, xn, h, qkv, width, |a| {
            [(a.layer(li).q.as_ref(), 0), (a.layer(li).k.as_ref(), qd), (a.layer(li).v.as_ref(), qd + kvd)]
        });
        // Biases and per-head norms (Qwen, Gemma), RoPE on q and k, then append k and v to each
        // sequence's cache.
        let half = hd / 2;
        let (ex, rope, eps) = (&layer.extra, self.rope_of(li), c.rms_eps);
        for_each_chunk_mut(qkv, width, |t, r| {
            let info = &rows[t];
            if let Some(b) = &ex.qkv_bias {
                r.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
            if let (Some(qn), Some(kn)) = (&ex.q_norm, &ex.k_norm) {
                r[..qd].chunks_exact_mut(hd).for_each(|head| kernels::rms_norm(head, qn, eps));
                r[qd..qd + kvd].chunks_exact_mut(hd).for_each(|head| kernels::rms_norm(head, kn, eps));
            }
            let (cos, sin) = (&rope.cos[info.pos * half..][..half], &rope.sin[info.pos * half..][..half]);
            kernels::rope_inplace(&mut r[..qd + kvd], hd, cos, sin);
        });
        for (r, info) in qkv.chunks_exact(width).zip(rows) {
            seqs[info.seq].cache.write(li, info.pos, &r[qd..qd + kvd], &r[qd + kvd..]);
        }
        // Causal attention: each packed row's query heads in groups that share a kv head (at
        // most MAX_GROUP, so each key and value vector is loaded once per group, not once per
        // head), every (row, group) a task of its own. Rows are independent once caches hold k/v;
        // splitting a row by its groups lets one token deep in a long context (a decode step,
        // a one-token prefill chunk) use every core, where a task per row left all but one idle.
        // The split depends only on the model, so a row's result is the same in any batch.
        let geometry = kernels::causal::Heads {
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: hd,
            scale: c.attn_scale,
            window: c.window(li).map(|w| w.window),
        };
        let caches: Vec<&KvCache> = seqs.iter().map(|s| &*s.cache).collect();
        // Each task's query heads h0..h1, as bounds within a row of attention output.
        let heads = crate::as_served::tasks(&geometry);
        let bounds: Vec<usize> = std::iter::once(0).chain(heads.iter().map(|&(_, _, h1)| h1 * hd)).collect();
        attn.resize(t_rows * qd, 0.0);
        for_each_segment_mut(attn, qd, &bounds, |t, j, out| {
            let info = &rows[t];
            let q_row = &qkv[t * width..t * width + qd];
            crate::as_served::attend_task(&geometry, caches[info.seq], li, q_row, info.pos, heads[j], out);
        });
        acts.quantize(attn, t_rows, qd);
        proj.resize(t_rows * h, 0.0);
        kernels::matmul(&layer.o, acts, proj);
        self.apply_lora(seqs, rows, attn, qd, proj, h, |a| [(a.layer(li).o.as_ref(), 0), (None, 0), (None, 0)]);
        self.add_residual(x, proj, ex.post_attn_norm.as_deref());
    }

    fn ffn_block(
        &self,
        li: usize,
        layer: &Layer,
        seqs: &mut [SeqInput<'_>],
        rows: &[RowInfo],
        x: &mut [f32],
        s: &mut Scratch,
    ) {
        let c = &self.config;
        let (h, f) = (c.hidden, c.ffn);
        let t_rows = rows.len();
        let Scratch { acts, xn, a: gu, b: hidden, c: down } = s;
        self.normed(x, &layer.ffn_norm, xn, acts);
        gu.resize(t_rows * 2 * f, 0.0);
        kernels::matmul(&layer.gate_up, acts, gu);
        self.apply_lora(seqs, rows, xn, h, gu, 2 * f, |a| {
            [(a.layer(li).gate.as_ref(), 0), (a.layer(li).up.as_ref(), f), (None, 0)]
        });
        hidden.resize(t_rows * f, 0.0);
        let act = c.arch.activation();
        for_each_chunk_mut(hidden, f, |t, out| {
            let r = &gu[t * 2 * f..(t + 1) * 2 * f];
            out.copy_from_slice(&r[..f]);
            match act {
                Activation::Silu => kernels::silu_mul(out, &r[f..]),
                Activation::GeluTanh => kernels::gelu_mul(out, &r[f..]),
            }
        });
        acts.quantize(hidden, t_rows, f);
        down.resize(t_rows * h, 0.0);
        kernels::matmul(&layer.down, acts, down);
        self.apply_lora(seqs, rows, hidden, f, down, h, |a| [(a.layer(li).down.as_ref(), 0), (None, 0), (None, 0)]);
        self.add_residual(x, down, layer.extra.post_ffn_norm.as_deref());
    }

    /// `x += y`, with `y` RMS-normalised first where the architecture norms block outputs.
    fn add_residual(&self, x: &mut [f32], y: &mut [f32], post_norm: Option<&[f32]>) {
        let h = self.config.hidden;
        if let Some(w) = post_norm {
            for_each_chunk_mut(y, h, |_, r| kernels::rms_norm(r, w, self.config.rms_eps));
        }
        for (xi, yi) in x.iter_mut().zip(y.iter()) {
            *xi += yi;
        }
    }

    /// Adds each sequence's LoRA deltas `scale * B (A x)` to its rows of `out`. `pick` names up to
    /// three (adapter matrix, column offset) pairs for this projection.
    ///
    /// Rows on one adapter (a prompt's rows, or streams of one checkpoint) are taken together, up
    /// to [`LORA_ROWS`] a task and no more than the adapted rows over the threads: the task reads
    /// the adapter's A and B once for all of them (tiled dots, then each B tile added to every
    /// row's outputs kept in registers), where a task per row read them once a row; rows of
    /// different adapters are different tasks of the same pass. Each row's numbers are those of
    /// `as_served::lora_row` on it alone, which is what the trainer computes.
    #[allow(clippy::too_many_arguments)]
    fn apply_lora<'a>(
        &self,
        seqs: &[SeqInput<'a>],
        rows: &[RowInfo],
        input: &[f32],
        in_dim: usize,
        out: &mut [f32],
        out_dim: usize,
        pick: impl Fn(&'a LoraAdapter) -> [(Option<&'a crate::lora::LoraPair>, usize); 3] + Sync,
    ) {
        if seqs.iter().all(|s| s.adapter.is_none()) {
            return;
        }
        // Each group's adapter, and the rows it takes. A group holds at most its share of the
        // adapted rows over the threads, so that streams of one checkpoint still spread.
        let adapted = rows.iter().filter(|info| seqs[info.seq].adapter.is_some()).count();
        let most = LORA_ROWS.min(adapted.div_ceil(kernels::team::threads()).max(1));
        let (mut adapters, mut members): (Vec<&'a LoraAdapter>, Vec<Vec<usize>>) = (Vec::new(), Vec::new());
        for (t, info) in rows.iter().enumerate() {
            let Some(adapter) = seqs[info.seq].adapter else { continue };
            let open = adapters.iter().zip(&members).rposition(|(a, ts)| std::ptr::eq(*a, adapter) && ts.len() < most);
            match open {
                Some(g) => members[g].push(t),
                None => {
                    adapters.push(adapter);
                    members.push(vec![t]);
                }
            }
        }
        kernels::team::for_each_group_mut(&mut out[..rows.len() * out_dim], out_dim, &members, |g, outs| {
            let adapter = adapters[g];
            // The group's input rows: borrowed where they are consecutive (a prompt, or streams
            // of one checkpoint side by side), else gathered.
            let group = &members[g];
            let consecutive = group.windows(2).all(|w| w[1] == w[0] + 1);
            let mut gathered = Vec::new();
            let xs: &[f32] = if consecutive {
                &input[group[0] * in_dim..(group[group.len() - 1] + 1) * in_dim]
            } else {
                gathered.reserve_exact(group.len() * in_dim);
                for &t in group {
                    gathered.extend_from_slice(&input[t * in_dim..(t + 1) * in_dim]);
                }
                &gathered
            };
            for (pair, offset) in pick(adapter) {
                let Some(pair) = pair else { continue };
                let n = pair.out_dim();
                let ax = crate::as_served::lora_down(pair.a(), pair.rank, xs, adapter.scale);
                let mut parts: Vec<&mut [f32]> = outs.iter_mut().map(|row| &mut row[offset..offset + n]).collect();
                crate::as_served::lora_up(&ax, pair.b_tiles(), &mut parts);
            }
        });
    }

    fn logits(&self, seqs: &[SeqInput<'_>], rows: &[RowInfo], x: &[f32], acts: &mut Q8Acts) -> StepLogits {
        let c = &self.config;
        let h = c.hidden;
        let mut wanted = Vec::new(); // (seq, packed row)
        let mut spans = vec![(0, 0); seqs.len()];
        for (t, info) in rows.iter().enumerate() {
            let seq = &seqs[info.seq];
            let last = rows.get(t + 1).is_none_or(|n| n.seq != info.seq);
            if seq.logits == Logits::All || (seq.logits == Logits::Last && last) {
                // Rows come sequence by sequence, so each one's wanted rows are consecutive.
                let span = &mut spans[info.seq];
                if span.1 == 0 {
                    span.0 = wanted.len();
                }
                span.1 += 1;
                wanted.push((info.seq, t));
            }
        }
        if wanted.is_empty() {
            return StepLogits { data: Vec::new(), vocab: c.vocab, spans };
        }
        let mut xs = Vec::with_capacity(wanted.len() * h);
        for (_, t) in &wanted {
            xs.extend_from_slice(&x[t * h..(t + 1) * h]);
        }
        for_each_chunk_mut(&mut xs, h, |_, r| kernels::rms_norm(r, &self.out_norm, c.rms_eps));
        acts.quantize(&xs, wanted.len(), h);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0f32; wanted.len() * c.vocab];
        kernels::matmul(head, acts, &mut logits);
        // An adapter's output-head pair adds to its rows' logits (on the normed f32 rows).
        if wanted.iter().any(|(s, _)| seqs[*s].adapter.is_some_and(|a| a.head.is_some())) {
            for_each_chunk_mut(&mut logits, c.vocab, |i, row| {
                if let Some(adapter) = seqs[wanted[i].0].adapter {
                    if let Some(pair) = &adapter.head {
                        pair.apply(&xs[i * h..(i + 1) * h], row, adapter.scale);
                    }
                }
            });
        }
        StepLogits { data: logits, vocab: c.vocab, spans }
    }
}

#[cfg(test)]
mod tests {
    use super::StepLogits;

    #[test]
    fn step_logits_hand_each_sequence_its_own_rows() {
        // Three sequences over a vocabulary of 2: the first wants two rows, the second none, the
        // third one.
        let data = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let l = StepLogits { data, vocab: 2, spans: vec![(0, 2), (0, 0), (2, 1)] };
        assert_eq!(l.rows(0).collect::<Vec<_>>(), [[1.0, 2.0], [3.0, 4.0]]);
        assert_eq!(l.rows(1).len(), 0);
        assert_eq!(l.last(1), None);
        assert_eq!(l.last(0), Some(&[3.0, 4.0][..]));
        assert_eq!(&l[(2, 0)], [5.0, 6.0]);
    }

    #[test]
    #[should_panic(expected = "has 0 logit rows")]
    fn a_row_a_sequence_did_not_ask_for_is_refused() {
        let l = StepLogits { data: vec![1.0, 2.0], vocab: 2, spans: vec![(0, 1), (0, 0)] };
        let _ = &l[(1, 0)];
    }
}
