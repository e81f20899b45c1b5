//! Causal self-attention over the packed spans of a training row, forward and backward, on
//! plain slices.
//!
//! Layout and why it is fast: q is (T, nh * hd) and k, v are (T, nkv * hd), row-major, as the
//! projections write them; every head reads its columns in place through the GEMM's strides (no
//! per-head copies, no (heads, s, s) tensors, no key/value expansion for grouped heads). A
//! (span, head) pair is one task with one s x (o + s) scratch; scores are computed in row blocks
//! that stop at the diagonal, so the masked upper triangle is never multiplied in the forward.
//! The backward recomputes the probabilities instead of keeping them (they would be
//! s x s x heads x layers floats), and runs one task per (span, kv head) so that the heads
//! sharing a key/value head accumulate into its gradient without races.
//!
//! Prefix trees: a span may attend, before its own rows, to a context (the shared prefix of a
//! group's sequences, laid out once in the row; see [`Span`]). Such a span reads its keys and
//! values gathered into scratch, and what it adds to the context's key and value gradients is
//! returned from its task and summed in after the parallel section, since every branch of a tree
//! adds to the same prefix rows.
//!
//! Scores are `scale * q . k`; softmax uses the kernels' polynomial `exp` (relative error below
//! 2e-6).
#![allow(unsafe_code)]

use super::cpu::SharedOut;
use rayon::prelude::*;

/// Attention geometry.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// A sliding window (Gemma 3's local layers): query i sees keys j with i - window < j <= i.
    /// Its probabilities are zero outside, so the backward needs nothing else.
    pub window: Option<usize>,
}

/// Rows of a packed training row that attend causally to themselves and, before that, to every
/// row of their context: the shared prefix of a prefix tree, laid out once elsewhere in the row
/// (a span without context is a plain causal segment). Query `i` of a span with `o` context rows
/// sees the context and its own rows `0..=i`, at position `o + i`; a sliding window counts in
/// those positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    /// (start, length) of the context's rows, outermost first.
    pub context: Vec<(usize, usize)>,
}

impl Span {
    pub fn plain(start: usize, len: usize) -> Self {
        Span { start, len, context: Vec::new() }
    }

    /// How many context rows precede the span's own (its first row's position).
    pub fn offset(&self) -> usize {
        self.context.iter().map(|(_, l)| l).sum()
    }
}

/// Rows of scores computed per block (the diagonal bounds each block's columns).
const ROWS: usize = 64;

/// `dst = (read ? dst : 0) + lhs * rhs` for m x k and k x n operands given by (row, column)
/// strides, on this thread.
///
/// Safety: every addressed element of the three operands is in bounds.
#[allow(clippy::too_many_arguments)]
unsafe fn mm(
    (m, n, k): (usize, usize, usize),
    dst: (*mut f32, usize, usize),
    read: bool,
    lhs: (*const f32, usize, usize),
    rhs: (*const f32, usize, usize),
) {
    // SAFETY (caller): in bounds.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.0,
            dst.2 as isize,
            dst.1 as isize,
            read,
            lhs.0,
            lhs.2 as isize,
            lhs.1 as isize,
            rhs.0,
            rhs.2 as isize,
            rhs.1 as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Softmax probabilities of one head of one span into `p` (s x (o + s), row-major): query `i`
/// over keys `0..=o + i` (zero after, and, with a window, before it).
///
/// Safety: `q` points at the head's first element in the span, rows `q.1` apart, `s` rows of
/// `hd` values; `k` at the first of `o + s` key rows, `k.1` apart.
unsafe fn probabilities(
    p: &mut [f32],
    (s, o): (usize, usize),
    hd: usize,
    (scale, window): (f32, Option<usize>),
    q: (*const f32, usize),
    k: (*const f32, usize),
) {
    let w = o + s;
    for r0 in (0..s).step_by(ROWS) {
        let r1 = (r0 + ROWS).min(s);
        // SAFETY: rows r0..r1 of q, rows 0..o + r1 of k (caller), and of p (s x w).
        unsafe {
            mm(
                (r1 - r0, o + r1, hd),
                (p.as_mut_ptr().add(r0 * w), w, 1),
                false,
                (q.0.add(r0 * q.1), q.1, 1),
                // k^T: element (d, j) is k[j][d].
                (k.0, 1, k.1),
            );
        }
        for i in r0..r1 {
            let row = &mut p[i * w..(i + 1) * w];
            let last = o + i;
            let lo = window.map_or(0, |win| (last + 1).saturating_sub(win));
            super::exp_normalize(&mut row[lo..=last], scale);
            row[..lo].iter_mut().for_each(|x| *x = 0.0);
            row[last + 1..].iter_mut().for_each(|x| *x = 0.0);
        }
    }
}

/// Kv head `g`'s columns of the rows of `ranges`, one after another, into `buf` (rows of `hd`).
fn gather(x: &[f32], (kv_rs, g, hd): (usize, usize, usize), ranges: &[(usize, usize)], buf: &mut Vec<f32>) {
    buf.clear();
    for &(start, len) in ranges {
        for r in start..start + len {
            buf.extend_from_slice(&x[r * kv_rs + g * hd..r * kv_rs + (g + 1) * hd]);
        }
    }
}

/// A span's context and own rows, in the order its keys are read.
fn key_ranges(span: &Span) -> Vec<(usize, usize)> {
    span.context.iter().copied().chain(std::iter::once((span.start, span.len))).collect()
}

/// Kv head `g`'s keys and values as a span reads them, and their row stride: in place for a
/// plain segment, gathered into `kb` and `vb` (context rows first) for a span with context.
fn keys_and_values(
    k: &[f32],
    v: &[f32],
    span: &Span,
    (kv_rs, g, hd): (usize, usize, usize),
    kb: &mut Vec<f32>,
    vb: &mut Vec<f32>,
) -> (*const f32, *const f32, usize) {
    if span.context.is_empty() {
        let at = span.start * kv_rs + g * hd;
        return (k[at..].as_ptr(), v[at..].as_ptr(), kv_rs);
    }
    let ranges = key_ranges(span);
    gather(k, (kv_rs, g, hd), &ranges, kb);
    gather(v, (kv_rs, g, hd), &ranges, vb);
    (kb.as_ptr(), vb.as_ptr(), hd)
}

/// `out` (T, nh * hd) = attention of each span of `q`, `k`, `v`.
pub fn forward(q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], spans: &[Span], h: Heads) {
    let (nh, nkv, hd) = (h.n_head, h.n_kv_head, h.head_dim);
    let (q_rs, kv_rs) = (nh * hd, nkv * hd);
    check(q, k, v, out.len(), spans, h);
    let group = nh / nkv;
    let dst = SharedOut::new(out);
    let tasks: Vec<(usize, usize)> = (0..spans.len()).flat_map(|si| (0..nh).map(move |head| (si, head))).collect();
    tasks.into_par_iter().for_each_init(
        || (Vec::new(), Vec::new(), Vec::new()),
        |(p, kb, vb), (si, head)| {
            let span = &spans[si];
            let (start, s, o) = (span.start, span.len, span.offset());
            let w = o + s;
            p.resize(s * w, 0.0);
            let g = head / group;
            // A span with context reads its keys and values gathered (context, then its own
            // rows); a plain segment reads them in place.
            let (kg, vg, k_rs) = keys_and_values(k, v, span, (kv_rs, g, hd), kb, vb);
            // SAFETY: `check` bounded every span and context by T; this task writes only rows
            // start..start+s, columns head*hd..(head+1)*hd of `out`, which no other task writes
            // (spans' own rows are disjoint).
            unsafe {
                let qh = q.as_ptr().add(start * q_rs + head * hd);
                probabilities(p, (s, o), hd, (h.scale, h.window), (qh, q_rs), (kg, k_rs));
                for r0 in (0..s).step_by(ROWS) {
                    let r1 = (r0 + ROWS).min(s);
                    mm(
                        (r1 - r0, hd, o + r1),
                        (dst.ptr().add((start + r0) * q_rs + head * hd), q_rs, 1),
                        false,
                        (p.as_ptr().add(r0 * w), w, 1),
                        (vg, k_rs, 1),
                    );
                }
            }
        },
    );
}

/// What a span with context adds to its context rows' key and value gradients (kv head `g`):
/// summed in after the parallel section, since every branch of a tree adds to the same prefix.
struct ContextGrads {
    g: usize,
    context: Vec<(usize, usize)>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// Gradients of [`forward`]: `dq` (T, nh * hd), `dk` and `dv` (T, nkv * hd), all overwritten.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    spans: &[Span],
    h: Heads,
) {
    let (nh, nkv, hd) = (h.n_head, h.n_kv_head, h.head_dim);
    let (q_rs, kv_rs) = (nh * hd, nkv * hd);
    check(q, k, v, dout.len(), spans, h);
    assert!(dq.len() == q.len() && dk.len() == k.len() && dv.len() == v.len());
    let group = nh / nkv;
    // Every task writes only its own (span rows, head columns) of these.
    let (dq_p, dk_p, dv_p) = (SharedOut::new(dq), SharedOut::new(dk), SharedOut::new(dv));
    let tasks: Vec<(usize, usize)> = (0..spans.len()).flat_map(|si| (0..nkv).map(move |g| (si, g))).collect();
    let context_grads: Vec<ContextGrads> = tasks
        .into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new(), [Vec::new(), Vec::new(), Vec::new(), Vec::new()]),
            |(p, dp, [kb, vb, dkb, dvb]), (si, g)| {
                let span = &spans[si];
                let (start, s, o) = (span.start, span.len, span.offset());
                let w = o + s;
                p.resize(s * w, 0.0);
                dp.resize(s * w, 0.0);
                // The gradients of the keys and values likewise: in place, or in scratch.
                let (kg, vg, k_rs) = keys_and_values(k, v, span, (kv_rs, g, hd), kb, vb);
                let (dkg, dvg) = if o == 0 {
                    // SAFETY: rows start.. of kv head g's columns, in bounds (`check`).
                    unsafe { (dk_p.ptr().add(start * kv_rs + g * hd), dv_p.ptr().add(start * kv_rs + g * hd)) }
                } else {
                    dkb.resize(w * hd, 0.0);
                    dvb.resize(w * hd, 0.0);
                    (dkb.as_mut_ptr(), dvb.as_mut_ptr())
                };
                // SAFETY: spans and contexts are bounded by T (`check`); this task writes rows
                // start..start+s of dq in the columns of the heads of kv head g, and of dk, dv in
                // g's columns (directly, or from its scratch below): no other task writes them.
                unsafe {
                    for (i, head) in (g * group..(g + 1) * group).enumerate() {
                        let qh = q.as_ptr().add(start * q_rs + head * hd);
                        let doh = dout.as_ptr().add(start * q_rs + head * hd);
                        probabilities(p, (s, o), hd, (h.scale, h.window), (qh, q_rs), (kg, k_rs));
                        // Row block r0..r1 sees only keys j < o + r1, and key block b0..b1 is
                        // seen only by queries i >= b0 - o: every product below skips the zeros.
                        for r0 in (0..s).step_by(ROWS) {
                            let r1 = (r0 + ROWS).min(s);
                            // dP[i][j] = dO_h[i] . V_g[j] for j <= o + i.
                            mm(
                                (r1 - r0, o + r1, hd),
                                (dp.as_mut_ptr().add(r0 * w), w, 1),
                                false,
                                (doh.add(r0 * q_rs), q_rs, 1),
                                (vg, 1, k_rs),
                            );
                        }
                        // dS = scale * P (dP - rowsum(P dP)).
                        for r in 0..s {
                            let (pr, dr) = (&p[r * w..r * w + o + r + 1], &mut dp[r * w..(r + 1) * w]);
                            let dot: f32 = pr.iter().zip(dr.iter()).map(|(a, b)| a * b).sum();
                            for (d, pv) in dr.iter_mut().zip(pr) {
                                *d = h.scale * pv * (*d - dot);
                            }
                            dr[o + r + 1..].iter_mut().for_each(|x| *x = 0.0);
                        }
                        let dqh = dq_p.ptr().add(start * q_rs + head * hd);
                        for r0 in (0..s).step_by(ROWS) {
                            let r1 = (r0 + ROWS).min(s);
                            // dQ_h[i] = sum_{j <= o + i} dS[i][j] K_g[j].
                            mm(
                                (r1 - r0, hd, o + r1),
                                (dqh.add(r0 * q_rs), q_rs, 1),
                                false,
                                (dp.as_ptr().add(r0 * w), w, 1),
                                (kg, k_rs, 1),
                            );
                        }
                        for b0 in (0..w).step_by(ROWS) {
                            let (b1, i0) = ((b0 + ROWS).min(w), b0.saturating_sub(o));
                            // dV_g[j] += sum_i P[i][j] dO_h[i] (P^T element (j, i) is p[i][j]).
                            mm(
                                (b1 - b0, hd, s - i0),
                                (dvg.add(b0 * k_rs), k_rs, 1),
                                i > 0,
                                (p.as_ptr().add(i0 * w + b0), 1, w),
                                (doh.add(i0 * q_rs), q_rs, 1),
                            );
                            // dK_g[j] += sum_i dS[i][j] Q_h[i].
                            mm(
                                (b1 - b0, hd, s - i0),
                                (dkg.add(b0 * k_rs), k_rs, 1),
                                i > 0,
                                (dp.as_ptr().add(i0 * w + b0), 1, w),
                                (qh.add(i0 * q_rs), q_rs, 1),
                            );
                        }
                    }
                    if o == 0 {
                        return None;
                    }
                    // The span's own rows are this task's; the context's are summed below.
                    for r in 0..s {
                        let (src, dst) = ((o + r) * hd, (start + r) * kv_rs + g * hd);
                        std::ptr::copy_nonoverlapping(dkb.as_ptr().add(src), dk_p.ptr().add(dst), hd);
                        std::ptr::copy_nonoverlapping(dvb.as_ptr().add(src), dv_p.ptr().add(dst), hd);
                    }
                }
                Some(ContextGrads {
                    g,
                    context: span.context.clone(),
                    dk: dkb[..o * hd].to_vec(),
                    dv: dvb[..o * hd].to_vec(),
                })
            },
        )
        .flatten()
        .collect();
    // Every row of a context is some span's own row, written above: add the branches' shares.
    for c in context_grads {
        let rows = c.context.iter().flat_map(|&(start, len)| start..start + len);
        for (n, r) in rows.enumerate() {
            let (src, dst) = (n * hd..(n + 1) * hd, r * kv_rs + c.g * hd..r * kv_rs + (c.g + 1) * hd);
            dk[dst.clone()].iter_mut().zip(&c.dk[src.clone()]).for_each(|(d, s)| *d += s);
            dv[dst].iter_mut().zip(&c.dv[src]).for_each(|(d, s)| *d += s);
        }
    }
}

fn check(q: &[f32], k: &[f32], v: &[f32], out_len: usize, spans: &[Span], h: Heads) {
    let (nh, nkv, hd) = (h.n_head, h.n_kv_head, h.head_dim);
    assert!(nkv > 0 && nh % nkv == 0 && hd > 0);
    let t = q.len() / (nh * hd);
    assert!(q.len() == t * nh * hd && out_len == q.len() && k.len() == t * nkv * hd && v.len() == k.len());
    assert!(spans.iter().all(|sp| sp.len > 0 && sp.start + sp.len <= t));
    assert!(spans.iter().flat_map(|sp| &sp.context).all(|&(start, len)| start + len <= t));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::testing::weights(n, seed).into_iter().map(|x| 2.0 * x).collect()
    }

    /// Plain loops in f64: (out, and the gradients of sum(out * g)).
    #[allow(clippy::type_complexity)]
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        spans: &[Span],
        h: Heads,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let (nh, nkv, hd) = (h.n_head, h.n_kv_head, h.head_dim);
        let group = nh / nkv;
        let (mut out, mut dq, mut dk, mut dv) =
            (vec![0f64; q.len()], vec![0f64; q.len()], vec![0f64; k.len()], vec![0f64; v.len()]);
        let (qa, ka) = (
            |t: usize, head: usize, d: usize| t * nh * hd + head * hd + d,
            |t: usize, g: usize, d: usize| t * nkv * hd + g * hd + d,
        );
        for span in spans {
            // The rows of the keys query i may read, in position order.
            let keys: Vec<usize> = key_ranges(span).into_iter().flat_map(|(s, l)| s..s + l).collect();
            let o = span.offset();
            for head in 0..nh {
                let gk = head / group;
                for i in 0..span.len {
                    let row = span.start + i;
                    let last = o + i;
                    let lo = h.window.map_or(0, |w| (last + 1).saturating_sub(w));
                    let scores: Vec<f64> = (lo..=last)
                        .map(|j| {
                            (0..hd).map(|d| q[qa(row, head, d)] as f64 * k[ka(keys[j], gk, d)] as f64).sum::<f64>()
                                * h.scale as f64
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    // p[j] for every j <= last, zero before the window.
                    let p: Vec<f64> = (0..=last).map(|j| if j < lo { 0.0 } else { e[j - lo] / sum }).collect();
                    for d in 0..hd {
                        out[qa(row, head, d)] = (0..=last).map(|j| p[j] * v[ka(keys[j], gk, d)] as f64).sum();
                    }
                    // Backward of this row.
                    let gr: Vec<f64> = (0..hd).map(|d| g[qa(row, head, d)] as f64).collect();
                    let dp: Vec<f64> =
                        (0..=last).map(|j| (0..hd).map(|d| gr[d] * v[ka(keys[j], gk, d)] as f64).sum()).collect();
                    let dot: f64 = (0..=last).map(|j| p[j] * dp[j]).sum();
                    for j in 0..=last {
                        let ds = p[j] * (dp[j] - dot) * h.scale as f64;
                        for d in 0..hd {
                            dv[ka(keys[j], gk, d)] += p[j] * gr[d];
                            dq[qa(row, head, d)] += ds * k[ka(keys[j], gk, d)] as f64;
                            dk[ka(keys[j], gk, d)] += ds * q[qa(row, head, d)] as f64;
                        }
                    }
                }
            }
        }
        (out, dq, dk, dv)
    }

    #[test]
    fn forward_and_backward_match_plain_loops() {
        // A short segment and one longer than a block of rows.
        let plain = vec![Span::plain(0, 5), Span::plain(5, 70)];
        // A prefix tree: a 70-row prefix (longer than a block) with three branches, one longer
        // than a block, and a chain (a branch of a branch's context), beside a plain segment.
        let tree = vec![
            Span::plain(0, 3),
            Span::plain(3, 70),
            Span { start: 73, len: 4, context: vec![(3, 70)] },
            Span { start: 77, len: 66, context: vec![(3, 70)] },
            Span { start: 143, len: 1, context: vec![(3, 70)] },
            Span { start: 144, len: 6, context: vec![(3, 70), (73, 4)] },
        ];
        for spans in [plain, tree] {
            for window in [None, Some(1), Some(7), Some(65)] {
                forward_and_backward_match_plain_loops_with(&spans, window);
            }
        }
    }

    fn forward_and_backward_match_plain_loops_with(spans: &[Span], window: Option<usize>) {
        let h = Heads { n_head: 4, n_kv_head: 2, head_dim: 8, scale: 0.35, window };
        let t = spans.iter().map(|s| s.start + s.len).max().unwrap();
        let (q, k, v, g) = (values(t * 32, 1), values(t * 16, 2), values(t * 16, 3), values(t * 32, 4));
        let (want, dq_w, dk_w, dv_w) = reference(&q, &k, &v, &g, spans, h);
        let mut out = vec![f32::NAN; t * 32];
        forward(&q, &k, &v, &mut out, spans, h);
        let (mut dq, mut dk, mut dv) = (vec![f32::NAN; t * 32], vec![f32::NAN; t * 16], vec![f32::NAN; t * 16]);
        backward(&q, &k, &v, &g, &mut dq, &mut dk, &mut dv, spans, h);
        for (name, got, want) in [("out", &out, &want), ("dq", &dq, &dq_w), ("dk", &dk, &dk_w), ("dv", &dv, &dv_w)] {
            for (i, (a, b)) in got.iter().zip(want.iter()).enumerate() {
                assert!((*a as f64 - b).abs() < 1e-4 * b.abs().max(1.0), "{window:?} {name}[{i}]: {a} vs {b}");
            }
        }
    }
}
