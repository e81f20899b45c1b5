//! Causal self-attention over the packed segments of a training row, forward and backward, on
//! plain slices.
//!
//! Layout and why it is fast: q is (T, nh * hd) and k, v are (T, nkv * hd), row-major, as the
//! projections write them; every head reads its columns in place through the GEMM's strides (no
//! per-head copies, no (heads, s, s) tensors, no key/value expansion for grouped heads). A
//! (segment, head) pair is one task with one s x s scratch; scores are computed in row blocks
//! that stop at the diagonal, so the masked upper triangle is never multiplied in the forward.
//! The backward recomputes the probabilities instead of keeping them (they would be
//! s x s x heads x layers floats), and runs one task per (segment, kv head) so that the heads
//! sharing a key/value head accumulate into its gradient without races.
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

/// Causal softmax probabilities of one head of one segment into `p` (s x s, row-major; zero
/// above the diagonal and, with a window, before it).
///
/// Safety: `q` and `k` point at the head's first element in the segment, rows `q_rs` / `k_rs`
/// apart, with `s` rows of `hd` values each.
unsafe fn probabilities(
    p: &mut [f32],
    s: usize,
    hd: usize,
    (scale, window): (f32, Option<usize>),
    q: (*const f32, usize),
    k: (*const f32, usize),
) {
    for r0 in (0..s).step_by(ROWS) {
        let r1 = (r0 + ROWS).min(s);
        // SAFETY: rows r0..r1 of q, rows 0..r1 of k (caller), and of p (s x s).
        unsafe {
            mm(
                (r1 - r0, r1, hd),
                (p.as_mut_ptr().add(r0 * s), s, 1),
                false,
                (q.0.add(r0 * q.1), q.1, 1),
                // k^T: element (d, j) is k[j][d].
                (k.0, 1, k.1),
            );
        }
        for i in r0..r1 {
            let row = &mut p[i * s..(i + 1) * s];
            let lo = window.map_or(0, |w| (i + 1).saturating_sub(w));
            super::exp_normalize(&mut row[lo..=i], scale);
            row[..lo].iter_mut().for_each(|x| *x = 0.0);
            row[i + 1..].iter_mut().for_each(|x| *x = 0.0);
        }
    }
}

/// `out` (T, nh * hd) = causal attention of each segment of `q`, `k`, `v`.
pub fn forward(q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], segments: &[(usize, usize)], h: Heads) {
    let (nh, nkv, hd) = (h.n_head, h.n_kv_head, h.head_dim);
    let (q_rs, kv_rs) = (nh * hd, nkv * hd);
    check(q, k, v, out.len(), segments, h);
    let group = nh / nkv;
    let dst = SharedOut::new(out);
    let tasks: Vec<((usize, usize), usize)> =
        segments.iter().flat_map(|&seg| (0..nh).map(move |head| (seg, head))).collect();
    tasks.into_par_iter().for_each_init(Vec::new, |p, ((start, s), head)| {
        p.resize(s * s, 0.0);
        let g = head / group;
        // SAFETY: `check` bounded every segment by T; this task writes only rows start..start+s,
        // columns head*hd..(head+1)*hd of `out`, which no other task writes.
        unsafe {
            let qh = q.as_ptr().add(start * q_rs + head * hd);
            let kg = k.as_ptr().add(start * kv_rs + g * hd);
            let vg = v.as_ptr().add(start * kv_rs + g * hd);
            probabilities(p, s, hd, (h.scale, h.window), (qh, q_rs), (kg, kv_rs));
            for r0 in (0..s).step_by(ROWS) {
                let r1 = (r0 + ROWS).min(s);
                mm(
                    (r1 - r0, hd, r1),
                    (dst.ptr().add((start + r0) * q_rs + head * hd), q_rs, 1),
                    false,
                    (p.as_ptr().add(r0 * s), s, 1),
                    (vg, kv_rs, 1),
                );
            }
        }
    });
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
    segments: &[(usize, usize)],
    h: Heads,
) {
    let (nh, nkv, hd) = (h.n_head, h.n_kv_head, h.head_dim);
    let (q_rs, kv_rs) = (nh * hd, nkv * hd);
    check(q, k, v, dout.len(), segments, h);
    assert!(dq.len() == q.len() && dk.len() == k.len() && dv.len() == v.len());
    let group = nh / nkv;
    // Every task writes only its own (segment rows, head columns) of these.
    let (dq_p, dk_p, dv_p) = (SharedOut::new(dq), SharedOut::new(dk), SharedOut::new(dv));
    let tasks: Vec<((usize, usize), usize)> =
        segments.iter().flat_map(|&seg| (0..nkv).map(move |g| (seg, g))).collect();
    tasks.into_par_iter().for_each_init(
        || (Vec::new(), Vec::new()),
        |(p, dp), ((start, s), g)| {
            p.resize(s * s, 0.0);
            dp.resize(s * s, 0.0);
            // SAFETY: segments are bounded by T (`check`); this task writes rows start..start+s of
            // dq in the columns of the heads of kv head g, and of dk, dv in g's columns: no other
            // task writes them.
            unsafe {
                let kg = k.as_ptr().add(start * kv_rs + g * hd);
                let vg = v.as_ptr().add(start * kv_rs + g * hd);
                let dkg = dk_p.ptr().add(start * kv_rs + g * hd);
                let dvg = dv_p.ptr().add(start * kv_rs + g * hd);
                for (i, head) in (g * group..(g + 1) * group).enumerate() {
                    let qh = q.as_ptr().add(start * q_rs + head * hd);
                    let doh = dout.as_ptr().add(start * q_rs + head * hd);
                    probabilities(p, s, hd, (h.scale, h.window), (qh, q_rs), (kg, kv_rs));
                    // Every product below skips the zero triangle: row block r0..r1 of a
                    // (query i, key j) matrix only has keys j < r1, and key block c0..c1 only
                    // queries i >= c0.
                    for b0 in (0..s).step_by(ROWS) {
                        let b1 = (b0 + ROWS).min(s);
                        // dV_g[j] += sum_{i >= j} P[i][j] dO_h[i] (P^T element (j, i) is p[i][j]).
                        mm(
                            (b1 - b0, hd, s - b0),
                            (dvg.add(b0 * kv_rs), kv_rs, 1),
                            i > 0,
                            (p.as_ptr().add(b0 * s + b0), 1, s),
                            (doh.add(b0 * q_rs), q_rs, 1),
                        );
                        // dP[i][j] = dO_h[i] . V_g[j] for j <= i.
                        mm(
                            (b1 - b0, b1, hd),
                            (dp.as_mut_ptr().add(b0 * s), s, 1),
                            false,
                            (doh.add(b0 * q_rs), q_rs, 1),
                            (vg, 1, kv_rs),
                        );
                    }
                    // dS = scale * P (dP - rowsum(P dP)).
                    for r in 0..s {
                        let (pr, dr) = (&p[r * s..r * s + r + 1], &mut dp[r * s..(r + 1) * s]);
                        let dot: f32 = pr.iter().zip(dr.iter()).map(|(a, b)| a * b).sum();
                        for (d, pv) in dr.iter_mut().zip(pr) {
                            *d = h.scale * pv * (*d - dot);
                        }
                        dr[r + 1..].iter_mut().for_each(|x| *x = 0.0);
                    }
                    let dqh = dq_p.ptr().add(start * q_rs + head * hd);
                    for b0 in (0..s).step_by(ROWS) {
                        let b1 = (b0 + ROWS).min(s);
                        // dQ_h[i] = sum_{j <= i} dS[i][j] K_g[j].
                        mm(
                            (b1 - b0, hd, b1),
                            (dqh.add(b0 * q_rs), q_rs, 1),
                            false,
                            (dp.as_ptr().add(b0 * s), s, 1),
                            (kg, kv_rs, 1),
                        );
                        // dK_g[j] += sum_{i >= j} dS[i][j] Q_h[i].
                        mm(
                            (b1 - b0, hd, s - b0),
                            (dkg.add(b0 * kv_rs), kv_rs, 1),
                            i > 0,
                            (dp.as_ptr().add(b0 * s + b0), 1, s),
                            (qh.add(b0 * q_rs), q_rs, 1),
                        );
                    }
                }
            }
        },
    );
}

fn check(q: &[f32], k: &[f32], v: &[f32], out_len: usize, segments: &[(usize, usize)], h: Heads) {
    let (nh, nkv, hd) = (h.n_head, h.n_kv_head, h.head_dim);
    assert!(nkv > 0 && nh % nkv == 0 && hd > 0);
    let t = q.len() / (nh * hd);
    assert!(q.len() == t * nh * hd && out_len == q.len() && k.len() == t * nkv * hd && v.len() == k.len());
    assert!(segments.iter().all(|&(start, s)| s > 0 && start + s <= t));
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
        segments: &[(usize, usize)],
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
        for &(start, s) in segments {
            for head in 0..nh {
                let gk = head / group;
                for i in 0..s {
                    let lo = h.window.map_or(0, |w| (i + 1).saturating_sub(w));
                    let scores: Vec<f64> = (lo..=i)
                        .map(|j| {
                            (0..hd)
                                .map(|d| q[qa(start + i, head, d)] as f64 * k[ka(start + j, gk, d)] as f64)
                                .sum::<f64>()
                                * h.scale as f64
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    // p[j] for every j <= i, zero before the window.
                    let p: Vec<f64> = (0..=i).map(|j| if j < lo { 0.0 } else { e[j - lo] / sum }).collect();
                    for d in 0..hd {
                        out[qa(start + i, head, d)] = (0..=i).map(|j| p[j] * v[ka(start + j, gk, d)] as f64).sum();
                    }
                    // Backward of this row.
                    let gr: Vec<f64> = (0..hd).map(|d| g[qa(start + i, head, d)] as f64).collect();
                    let dp: Vec<f64> =
                        (0..=i).map(|j| (0..hd).map(|d| gr[d] * v[ka(start + j, gk, d)] as f64).sum()).collect();
                    let dot: f64 = (0..=i).map(|j| p[j] * dp[j]).sum();
                    for j in 0..=i {
                        let ds = p[j] * (dp[j] - dot) * h.scale as f64;
                        for d in 0..hd {
                            dv[ka(start + j, gk, d)] += p[j] * gr[d];
                            dq[qa(start + i, head, d)] += ds * k[ka(start + j, gk, d)] as f64;
                            dk[ka(start + j, gk, d)] += ds * q[qa(start + i, head, d)] as f64;
                        }
                    }
                }
            }
        }
        (out, dq, dk, dv)
    }

    #[test]
    fn forward_and_backward_match_plain_loops() {
        for window in [None, Some(1), Some(7), Some(65)] {
            forward_and_backward_match_plain_loops_with(window);
        }
    }

    fn forward_and_backward_match_plain_loops_with(window: Option<usize>) {
        let h = Heads { n_head: 4, n_kv_head: 2, head_dim: 8, scale: 0.35, window };
        // A short segment and one longer than a block of rows.
        let segments = [(0, 5), (5, 70)];
        let t = 75;
        let (q, k, v, g) = (values(t * 32, 1), values(t * 16, 2), values(t * 16, 3), values(t * 32, 4));
        let (want, dq_w, dk_w, dv_w) = reference(&q, &k, &v, &g, &segments, h);
        let mut out = vec![f32::NAN; t * 32];
        forward(&q, &k, &v, &mut out, &segments, h);
        let (mut dq, mut dk, mut dv) = (vec![f32::NAN; t * 32], vec![f32::NAN; t * 16], vec![f32::NAN; t * 16]);
        backward(&q, &k, &v, &g, &mut dq, &mut dk, &mut dv, &segments, h);
        for (name, got, want) in [("out", &out, &want), ("dq", &dq, &dq_w), ("dk", &dk, &dk_w), ("dv", &dv, &dv_w)] {
            for (i, (a, b)) in got.iter().zip(want.iter()).enumerate() {
                assert!((*a as f64 - b).abs() < 1e-4 * b.abs().max(1.0), "{window:?} {name}[{i}]: {a} vs {b}");
            }
        }
    }
}
