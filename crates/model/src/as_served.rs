//! The serving forward's arithmetic, for the trainer: pieces of [`crate::Llama::forward`] that
//! take plain rows, so that a training forward computes what the sampler computed, bit for bit
//! (issue 52: importance ratios of exactly 1 on the policy that sampled). Int8 activations make
//! the forward chaotic at the last bit: a single float reassociated before a quantisation can
//! flip an activation's rounding, and on SmolLM2 such flips alone moved logprobs by 0.1 nats a
//! token. So the trainer does not compute "the same maths": it calls these functions, which
//! call the kernels in the engine's order, and the engine's own step calls them too where a piece
//! is shared (attention's task split, a LoRA pair's row update).

use crate::kernels::causal::Heads;
use crate::kernels::{self, Bf16, Widen, MAX_GROUP};
use crate::KvCache;
use rayon::prelude::*;

/// The engine's attention tasks of one row: (kv head, first query head, end query head), at most
/// [`MAX_GROUP`] query heads sharing one kv head each. The split fixes which heads a kernel call
/// computes together, and with it the float order: it depends only on the model.
pub fn tasks(g: &Heads) -> Vec<(usize, usize, usize)> {
    let group = g.n_head / g.n_kv_head;
    let per = group.min(MAX_GROUP);
    (0..g.n_kv_head)
        .flat_map(|kv| {
            (kv * group..(kv + 1) * group).step_by(per).map(move |h0| (kv, h0, (h0 + per).min((kv + 1) * group)))
        })
        .collect()
}

/// One query row's attention over `cache` (layer 0 of it holds positions `0..=pos`), its task
/// `(kv, h0, h1)` written to `out` (the heads' `(h1 - h0) * head_dim` values): what the engine's
/// step computes for a row at `pos`.
pub fn attend_task(
    g: &Heads,
    cache: &KvCache,
    layer: usize,
    q_row: &[f32],
    pos: usize,
    (kv, h0, h1): (usize, usize, usize),
    out: &mut [f32],
) {
    let hd = g.head_dim;
    let n_ctx = pos + 1;
    let first = g.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let mut scores = vec![0f32; (h1 - h0) * n_ctx.next_multiple_of(kernels::KEY_TILE)];
    kernels::attend_group(
        &q_row[h0 * hd..h1 * hd],
        h1 - h0,
        cache.head(layer, kv, hd),
        first..n_ctx,
        g.scale,
        &mut scores,
        out,
    );
}

/// Causal attention of a sequence's last `queries` rows as the engine computes it: `k` and `v`
/// hold every position of the sequence (`(n, kv_dim)`, row-major: context first), `q` the query
/// rows (`(queries, n_head * head_dim)`), the last `queries` positions; `out` receives
/// `(queries, n_head * head_dim)`. Keys and values are rounded to the cache's f16 on the way in.
pub fn attend_sequence(g: &Heads, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
    let (qd, kvd) = (g.n_head * g.head_dim, g.n_kv_head * g.head_dim);
    let n = k.len() / kvd;
    let queries = q.len() / qd;
    assert!(queries <= n && v.len() == k.len() && out.len() == q.len(), "attention shapes");
    let mut cache = KvCache::new(1, kvd);
    for (pos, (kr, vr)) in k.chunks_exact(kvd).zip(v.chunks_exact(kvd)).enumerate() {
        cache.write(0, pos, kr, vr);
    }
    cache.commit(n);
    let tasks = tasks(g);
    let hd = g.head_dim;
    out.par_chunks_mut(qd).zip(q.par_chunks(qd)).enumerate().for_each(|(i, (out_row, q_row))| {
        let pos = n - queries + i;
        for &(kv, h0, h1) in &tasks {
            attend_task(g, &cache, 0, q_row, pos, (kv, h0, h1), &mut out_row[h0 * hd..h1 * hd]);
        }
    });
}

/// `out += scale * B (A x)` for one row, in the engine's order: each rank's `scale * (a_r . x)`
/// (the adapter kernels' dot, fused multiply-adds), then B's column of each rank added across the
/// row, ranks in order, one fused multiply-add each. `a` is
/// `(rank, in)` row-major, `b` B in [`b_tiles`]' layout; served adapters hold them in bf16
/// ([`stored`]), the trainer's exact path in f32.
pub fn lora_row<W: Widen>(a: &[W], b: &[W], rank: usize, x: &[f32], out: &mut [f32], scale: f32) {
    let ax = lora_down(a, rank, x, scale);
    lora_up(&ax, b, &mut [out]);
}

/// The first half of [`lora_row`]: `scale * (a_r . x)` for each rank `r`, for each row of `xs`
/// (`(rows, rank)`, row-major): each entry the kernels' dot, whatever the number of rows.
pub fn lora_down<W: Widen>(a: &[W], rank: usize, xs: &[f32], scale: f32) -> Vec<f32> {
    let mut out = vec![0f32; xs.len() / (a.len() / rank) * rank];
    kernels::dots(a, rank, xs, &mut out);
    out.iter_mut().for_each(|v| *v *= scale);
    out
}

/// `B (out, rank)` (PEFT's layout) in tiles of outputs, the layout [`lora_row`] and [`lora_up`]
/// read (`kernels::adapter::b_tiles`).
pub fn b_tiles(b: &[f32], rank: usize) -> Vec<f32> {
    kernels::adapter::b_tiles(b, rank)
}

/// The second half of [`lora_row`], for rows of one adapter: `outs[i] += ax_ir * B[:, r]` for
/// each rank in order (`ax` is `(rows, rank)`, `b` in [`b_tiles`]' layout). Each row's numbers
/// are the same whether it goes alone or with others.
pub fn lora_up<W: Widen>(ax: &[f32], b: &[W], outs: &mut [&mut [f32]]) {
    kernels::add_ranks(ax, b, outs);
}

/// An adapter matrix as the server holds it: bf16, rounded to nearest even (half the bytes a
/// step reads with many adapters; `kernels::adapter`). The trainer rounds its f32 adapter with
/// this before the served path's products, so both compute on the same values.
pub fn stored(m: &[f32]) -> Vec<Bf16> {
    Bf16::round_all(m)
}

/// The values [`stored`] keeps, as f32: what the trainer's backward differentiates through, so
/// that its gradients are those of the function its forward computed (straight through the
/// rounding for the f32 master weights the optimizer updates).
pub fn stored_values(m: &[f32]) -> Vec<f32> {
    m.iter().map(|&x| Bf16::from_f32(x).to_f32()).collect()
}

/// The log of a logits row's softmax normaliser, `max + ln sum_j exp(l_j - max)`, so that a
/// logprob is `l_t - log_normalizer`: through the kernels' [`kernels::exp_normalize`], the pass
/// the trainer's head takes over the same row for its probabilities and entropy.
pub fn log_normalizer(logits: &[f32]) -> f32 {
    let mut row = logits.to_vec();
    let (max, sum, _) = kernels::exp_normalize(&mut row, 1.0);
    max + sum.ln()
}
