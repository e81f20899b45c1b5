//! Causal attention of one query head over a sequence's cached keys and values.
//!
//! Keys are cached in tiles of [`KEY_TILE`] positions, transposed: within a tile, a head's
//! dimension `d` holds the 16 positions' values side by side (`tile[d * 16 + p]`). A query's 16
//! scores of a tile are then 16 lanes of one vector, each dimension one broadcast-and-FMA, with no
//! horizontal sum per position (the row-major layout needs a 64-float dot product and a reduction
//! for every position, which made attention a third of prefill time). Values stay row-major:
//! the output is a sum of whole value rows weighted by the softmax, four vectors per position.
//! Both are f16 (see `KvCache`), widened to f32 as they are loaded; the arithmetic is f32.
#![allow(unsafe_code)]

use super::cpu::{cpu, Avx2Fma, Avx512F};
use super::exp_normalize;
use half::f16;
use std::ops::Range;

/// Positions per key tile.
pub const KEY_TILE: usize = 16;

/// One kv head's cached keys and values, in two segments: a shared, read-only prefix of
/// `shared_tiles` whole tiles, then the sequence's own positions (see `KvCache`). In each segment
/// `keys` starts at the head's part of tile 0, and tile `j` is `tile_stride` values further;
/// `values` starts at the head's first value, consecutive positions `stride` values apart.
#[derive(Clone, Copy)]
pub struct HeadKv<'a> {
    pub keys: [&'a [f16]; 2],
    pub values: [&'a [f16]; 2],
    pub shared_tiles: usize,
    pub tile_stride: usize,
    pub stride: usize,
}

impl<'a> HeadKv<'a> {
    /// Keys of tile `j` (of the whole sequence), from its start.
    #[inline(always)]
    fn tile(&self, j: usize) -> &'a [f16] {
        if j < self.shared_tiles {
            &self.keys[0][j * self.tile_stride..]
        } else {
            &self.keys[1][(j - self.shared_tiles) * self.tile_stride..]
        }
    }

    /// The value rows of positions `first..n_ctx`, split at the segment boundary: (rows from the
    /// first visible one, count) for each segment.
    #[inline(always)]
    fn value_segments(&self, first: usize, n_ctx: usize) -> [(&'a [f16], usize); 2] {
        let shared = (self.shared_tiles * KEY_TILE).min(n_ctx);
        let (skip0, skip1) = (first.min(shared), first.saturating_sub(shared));
        [
            (&self.values[0][(skip0 * self.stride).min(self.values[0].len())..], shared - skip0),
            (&self.values[1][(skip1 * self.stride).min(self.values[1].len())..], n_ctx - shared - skip1),
        ]
    }
}

/// Attention of one query head over `positions` of `kv` (`0..n` causal; a later start for a
/// sliding window). `scores` holds at least `positions.end` rounded up to [`KEY_TILE`] floats of
/// scratch; `out` (head_dim, as `q`) receives the weighted sum of values. Panics when a buffer is
/// shorter than that or the range is empty (what the SIMD kernels rely on is checked here, once
/// per call). Scores are computed from the tile holding `positions.start`; only the range enters
/// the softmax.
#[inline]
pub fn attend(q: &[f32], kv: HeadKv<'_>, positions: Range<usize>, scale: f32, scores: &mut [f32], out: &mut [f32]) {
    let (first, n_ctx) = (positions.start, positions.end);
    assert!(first < n_ctx, "empty attention range");
    let hd = q.len();
    let tiles = n_ctx.div_ceil(KEY_TILE);
    assert!(scores.len() >= tiles * KEY_TILE && out.len() == hd);
    // Every key tile read holds the head's `hd * KEY_TILE` values. Within a segment a later tile's
    // slice is shorter, so the last tile of each segment is the one to check.
    let shared = kv.shared_tiles.min(tiles);
    assert!(shared == 0 || kv.tile(shared - 1).len() >= hd * KEY_TILE, "shared key tiles too short");
    assert!(tiles == shared || kv.tile(tiles - 1).len() >= hd * KEY_TILE, "key tiles too short");
    let features = cpu();
    #[cfg(target_arch = "x86_64")]
    if let Some(avx512) = features.avx512f.filter(|_| matches!(hd, 64 | 128 | 256)) {
        // SAFETY: the token proves AVX-512F; `hd` is 4, 8 or 16 vectors, and the lengths the
        // kernel reads are asserted above.
        unsafe {
            match hd {
                64 => avx512::attend::<4>(avx512, q, kv, first, n_ctx, scale, scores, out),
                128 => avx512::attend::<8>(avx512, q, kv, first, n_ctx, scale, scores, out),
                _ => avx512::attend::<16>(avx512, q, kv, first, n_ctx, scale, scores, out),
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(avx2) = features.avx2 {
        // SAFETY: the token proves AVX2, FMA and F16C; `hd` is 8, 16 or 32 vectors, and the
        // lengths the kernel reads are asserted above. Other head sizes take the generic code
        // compiled for AVX2 (its body is safe code).
        unsafe {
            match hd {
                64 => avx2::attend_group::<1, 4, 8>(avx2, q, kv, first, n_ctx, scale, scores, out),
                128 => avx2::attend_group::<1, 4, 16>(avx2, q, kv, first, n_ctx, scale, scores, out),
                256 => avx2::attend_group::<1, 4, 32>(avx2, q, kv, first, n_ctx, scale, scores, out),
                _ => attend_avx2(avx2, q, kv, first..n_ctx, scale, scores, out),
            }
        }
        return;
    }
    attend_generic(q, kv, first..n_ctx, scale, scores, out)
}

/// Most query heads a grouped call takes (the kernel keeps `heads x 4` output vectors in
/// registers).
pub const MAX_GROUP: usize = 4;

/// [`attend`] for up to [`MAX_GROUP`] query heads that share one kv head (grouped-query
/// attention), over the same positions: each key and value vector is loaded once for all of
/// them instead of once per head, which is what long prompts' attention is bound by (81% of a
/// 4,096-token prefill was the one-head kernel, reloading the same tiles for each head of a
/// group). `qs` holds the `heads` queries one after another (as the heads of a group lie in a
/// row of q) and `outs` receives their outputs likewise; `scores` holds `heads` times the
/// scratch [`attend`] needs. Results equal [`attend`]'s per head up to float reassociation.
pub fn attend_group(
    qs: &[f32],
    heads: usize,
    kv: HeadKv<'_>,
    positions: Range<usize>,
    scale: f32,
    scores: &mut [f32],
    outs: &mut [f32],
) {
    assert!((1..=MAX_GROUP).contains(&heads), "{heads} heads in a group");
    assert!(
        qs.len().is_multiple_of(heads) && outs.len() == qs.len(),
        "{} query and {} output values",
        qs.len(),
        outs.len()
    );
    let (first, n_ctx) = (positions.start, positions.end);
    assert!(first < n_ctx, "empty attention range");
    let hd = qs.len() / heads;
    let tiles = n_ctx.div_ceil(KEY_TILE);
    let span = tiles * KEY_TILE;
    assert!(scores.len() >= heads * span, "scores scratch too short");
    let shared = kv.shared_tiles.min(tiles);
    assert!(shared == 0 || kv.tile(shared - 1).len() >= hd * KEY_TILE, "shared key tiles too short");
    assert!(tiles == shared || kv.tile(tiles - 1).len() >= hd * KEY_TILE, "key tiles too short");
    #[cfg(target_arch = "x86_64")]
    if let Some(avx512) = cpu().avx512f.filter(|_| matches!(hd, 64 | 128 | 256)) {
        macro_rules! go {
            ($r:literal) => {
                // SAFETY: the token proves AVX-512F; `hd` is 4, 8 or 16 vectors; the lengths the
                // kernel reads are asserted above.
                unsafe {
                    match hd {
                        64 => avx512::attend_group::<$r, 4>(avx512, qs, kv, first, n_ctx, scale, scores, outs),
                        128 => avx512::attend_group::<$r, 8>(avx512, qs, kv, first, n_ctx, scale, scores, outs),
                        _ => avx512::attend_group::<$r, 16>(avx512, qs, kv, first, n_ctx, scale, scores, outs),
                    }
                }
            };
        }
        match heads {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            _ => go!(4),
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(avx2) = cpu().avx2.filter(|_| matches!(hd, 64 | 128 | 256)) {
        // Fewer heads, more accumulator chains each: 8 to 16 FMAs in flight.
        macro_rules! go {
            ($r:literal, $u:literal) => {
                // SAFETY: the token proves AVX2, FMA and F16C; the lengths the kernel reads are
                // asserted above.
                unsafe {
                    match hd {
                        64 => avx2::attend_group::<$r, $u, 8>(avx2, qs, kv, first, n_ctx, scale, scores, outs),
                        128 => avx2::attend_group::<$r, $u, 16>(avx2, qs, kv, first, n_ctx, scale, scores, outs),
                        _ => avx2::attend_group::<$r, $u, 32>(avx2, qs, kv, first, n_ctx, scale, scores, outs),
                    }
                }
            };
        }
        match heads {
            1 => go!(1, 4),
            2 => go!(2, 2),
            3 => go!(3, 1),
            _ => go!(4, 1),
        }
        return;
    }
    for (i, (q, out)) in qs.chunks_exact(hd).zip(outs.chunks_exact_mut(hd)).enumerate() {
        attend(q, kv, positions.clone(), scale, &mut scores[i * span..(i + 1) * span], out);
    }
}

/// The plain version (any head dimension), also the reference the SIMD one is tested against.
#[inline(always)]
pub(crate) fn attend_generic(
    q: &[f32],
    kv: HeadKv<'_>,
    positions: Range<usize>,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let (first, n_ctx) = (positions.start, positions.end);
    let hd = q.len();
    for j in first / KEY_TILE..n_ctx.div_ceil(KEY_TILE) {
        let tile = &kv.tile(j)[..hd * KEY_TILE];
        let mut acc = [0f32; KEY_TILE];
        for (d, qd) in q.iter().enumerate() {
            for (a, k) in acc.iter_mut().zip(&tile[d * KEY_TILE..(d + 1) * KEY_TILE]) {
                *a += qd * k.to_f32();
            }
        }
        for (s, a) in scores[j * KEY_TILE..(j + 1) * KEY_TILE].iter_mut().zip(acc) {
            *s = a * scale;
        }
    }
    exp_normalize(&mut scores[first..n_ctx], 1.0);
    out.fill(0.0);
    let mut s = scores[first..n_ctx].iter();
    for (values, count) in kv.value_segments(first, n_ctx) {
        for (p, s) in s.by_ref().take(count).enumerate() {
            let w = *s;
            for (o, x) in out.iter_mut().zip(&values[p * kv.stride..p * kv.stride + hd]) {
                *o += w * x.to_f32();
            }
        }
    }
}

/// [`attend_generic`] compiled with AVX2 and FMA enabled.
///
/// # Safety
/// None beyond the target features (the body is safe code).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2(
    _: Avx2Fma,
    q: &[f32],
    kv: HeadKv<'_>,
    positions: Range<usize>,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    attend_generic(q, kv, positions, scale, scores, out)
}

/// The AVX2 kernels (with F16C, which every AVX2 CPU has and the token checks): the AVX-512
/// ones' layout in vectors of eight. Without them the AVX2 path was the generic code compiled
/// for AVX2, converting each f16 on its own: half of a 1,000-token prefill on a CPU without
/// AVX-512.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{exp_normalize, f16, Avx2Fma, HeadKv, KEY_TILE};
    use std::arch::x86_64::*;

    /// Eight f16 values from `p`, widened to f32.
    ///
    /// # Safety
    /// `p` points at eight readable f16 values; the CPU has F16C.
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }

    /// `R` query heads sharing one kv head (`qs`: their queries one after another, each `8 V`
    /// long) over positions `first..n_ctx`; `scores` holds `R` spans of the tiles' length, and
    /// `outs` receives the heads' outputs one after another. Each key is loaded once for all
    /// heads; each head's scores use `U` interleaved accumulator chains per half tile (more for
    /// fewer heads, so that enough FMAs are in flight).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the token); the caller asserted that every key tile read
    /// holds `8 V * KEY_TILE` values, `scores` `R` times the tiles' length and `qs` and `outs`
    /// `R * 8 V` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // one index into several arrays
    pub(super) unsafe fn attend_group<const R: usize, const U: usize, const V: usize>(
        _: Avx2Fma,
        qs: &[f32],
        kv: HeadKv<'_>,
        first: usize,
        n_ctx: usize,
        scale: f32,
        scores: &mut [f32],
        outs: &mut [f32],
    ) {
        let hd = 8 * V;
        let tiles = n_ctx.div_ceil(KEY_TILE);
        let span = tiles * KEY_TILE;
        let sc = _mm256_set1_ps(scale);
        for j in first / KEY_TILE..tiles {
            let t = kv.tile(j)[..hd * KEY_TILE].as_ptr();
            let mut lo = [[_mm256_setzero_ps(); U]; R];
            let mut hi = [[_mm256_setzero_ps(); U]; R];
            for d in (0..hd).step_by(U) {
                for u in 0..U {
                    // SAFETY: dimension d + u < hd of the tile's hd * KEY_TILE values.
                    let (k0, k1) = unsafe { (load8(t.add((d + u) * KEY_TILE)), load8(t.add((d + u) * KEY_TILE + 8))) };
                    for r in 0..R {
                        let qd = _mm256_set1_ps(qs[r * hd + d + u]);
                        lo[r][u] = _mm256_fmadd_ps(qd, k0, lo[r][u]);
                        hi[r][u] = _mm256_fmadd_ps(qd, k1, hi[r][u]);
                    }
                }
            }
            for r in 0..R {
                let (mut l, mut h) = (lo[r][0], hi[r][0]);
                for u in 1..U {
                    (l, h) = (_mm256_add_ps(l, lo[r][u]), _mm256_add_ps(h, hi[r][u]));
                }
                let row = &mut scores[r * span + j * KEY_TILE..r * span + (j + 1) * KEY_TILE];
                // SAFETY: the slice holds the tile's 16 scores.
                unsafe {
                    _mm256_storeu_ps(row.as_mut_ptr(), _mm256_mul_ps(l, sc));
                    _mm256_storeu_ps(row.as_mut_ptr().add(8), _mm256_mul_ps(h, sc));
                }
            }
        }
        for r in 0..R {
            let weights = &mut scores[r * span + first..r * span + n_ctx];
            exp_normalize(weights, 1.0);
            let out = &mut outs[r * hd..(r + 1) * hd];
            // Eight vectors (64 dimensions) of the output at a time: eight FMA chains, in
            // registers.
            for c0 in (0..V).step_by(8) {
                let mut acc = [_mm256_setzero_ps(); 8];
                let mut w = weights.iter();
                for (values, count) in kv.value_segments(first, n_ctx) {
                    for (p, w) in w.by_ref().take(count).enumerate() {
                        let wv = _mm256_set1_ps(*w);
                        let row = values[p * kv.stride + c0 * 8..p * kv.stride + c0 * 8 + 64].as_ptr();
                        for (v, a) in acc.iter_mut().enumerate() {
                            // SAFETY: 64 values from `row` lie in the slice above.
                            *a = _mm256_fmadd_ps(wv, unsafe { load8(row.add(8 * v)) }, *a);
                        }
                    }
                }
                let dst = &mut out[c0 * 8..c0 * 8 + 64];
                for (v, a) in acc.iter().enumerate() {
                    // SAFETY: eight floats at 8 v of the 64-float slice.
                    unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(8 * v), *a) };
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{exp_normalize, f16, Avx512F, HeadKv, KEY_TILE};
    use std::arch::x86_64::*;

    /// 16 f16 values from `p` widened to f32.
    ///
    /// # Safety
    /// `p` points at 16 readable f16 values.
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> __m512 {
        // SAFETY: the caller's; `vcvtph2ps` on 512 bits is AVX-512F.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }

    /// Head dimension `16 * V`. Scores: two tiles at a time, each dimension's products split over
    /// four accumulators per tile, so eight independent FMA chains keep both FMA ports busy.
    /// Output: `V` accumulators held in registers across all positions.
    ///
    /// # Safety
    /// `q` and `out` hold `16 * V` floats, `scores` at least `n_ctx` rounded up to whole tiles,
    /// every key tile of `kv` below `n_ctx` at least `16 * V * KEY_TILE` values (`attend`
    /// asserts all three), and `first < n_ctx`. Value rows are sliced with bounds checks.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attend<const V: usize>(
        _: Avx512F,
        q: &[f32],
        kv: HeadKv<'_>,
        first: usize,
        n_ctx: usize,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let hd = 16 * V;
        let tiles = n_ctx.div_ceil(KEY_TILE);
        let sc = _mm512_set1_ps(scale);
        let mut j = first / KEY_TILE;
        while j < tiles {
            let two = j + 1 < tiles;
            let t0 = kv.tile(j).as_ptr();
            let t1 = if two { kv.tile(j + 1).as_ptr() } else { t0 };
            let mut a0 = [_mm512_setzero_ps(); 4];
            let mut a1 = [_mm512_setzero_ps(); 4];
            for d in (0..hd).step_by(4) {
                for u in 0..4 {
                    let qd = _mm512_set1_ps(q[d + u]);
                    // SAFETY: a tile holds hd * 16 values for this head.
                    unsafe {
                        a0[u] = _mm512_fmadd_ps(qd, load16(t0.add((d + u) * KEY_TILE)), a0[u]);
                        if two {
                            a1[u] = _mm512_fmadd_ps(qd, load16(t1.add((d + u) * KEY_TILE)), a1[u]);
                        }
                    }
                }
            }
            let s0 = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a0[0], a0[1]), _mm512_add_ps(a0[2], a0[3])), sc);
            // SAFETY: scores holds n_ctx rounded up to whole tiles.
            unsafe { _mm512_storeu_ps(scores.as_mut_ptr().add(j * KEY_TILE), s0) };
            if two {
                let s1 = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a1[0], a1[1]), _mm512_add_ps(a1[2], a1[3])), sc);
                unsafe { _mm512_storeu_ps(scores.as_mut_ptr().add((j + 1) * KEY_TILE), s1) };
            }
            j += if two { 2 } else { 1 };
        }
        exp_normalize(&mut scores[first..n_ctx], 1.0);
        let mut acc = [_mm512_setzero_ps(); V];
        let mut s = scores[first..n_ctx].iter();
        for (values, count) in kv.value_segments(first, n_ctx) {
            for (p, s) in s.by_ref().take(count).enumerate() {
                let w = _mm512_set1_ps(*s);
                let row = values[p * kv.stride..p * kv.stride + hd].as_ptr();
                for (v, a) in acc.iter_mut().enumerate() {
                    // SAFETY: the value row holds hd = 16 * V values.
                    *a = _mm512_fmadd_ps(w, unsafe { load16(row.add(16 * v)) }, *a);
                }
            }
        }
        for (v, a) in acc.iter().enumerate() {
            // SAFETY: out holds hd floats.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * v), *a) };
        }
    }

    /// `R` query heads of dimension `16 * V` sharing one kv head. Scores: two tiles at a time,
    /// each key vector loaded once and multiplied into all `R` heads' accumulators (`2R`
    /// independent FMA chains). Output: `R x V` accumulators in registers; each value row is
    /// loaded once for all heads.
    ///
    /// # Safety
    /// As [`attend`], for every head: `qs` and `outs` hold `R * 16 * V` floats, `scores` at
    /// least `R` times `n_ctx` rounded up to whole tiles (`attend_group` asserts all of it), and
    /// `first < n_ctx`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // one index into several arrays
    pub(super) unsafe fn attend_group<const R: usize, const V: usize>(
        _: Avx512F,
        qs: &[f32],
        kv: HeadKv<'_>,
        first: usize,
        n_ctx: usize,
        scale: f32,
        scores: &mut [f32],
        outs: &mut [f32],
    ) {
        let hd = 16 * V;
        let tiles = n_ctx.div_ceil(KEY_TILE);
        let span = tiles * KEY_TILE;
        let sc = _mm512_set1_ps(scale);
        let q: [&[f32]; R] = std::array::from_fn(|r| &qs[r * hd..(r + 1) * hd]);
        let mut j = first / KEY_TILE;
        while j < tiles {
            let two = j + 1 < tiles;
            let t0 = kv.tile(j).as_ptr();
            let t1 = if two { kv.tile(j + 1).as_ptr() } else { t0 };
            let mut a0 = [_mm512_setzero_ps(); R];
            let mut a1 = [_mm512_setzero_ps(); R];
            for d in 0..hd {
                // SAFETY: a tile holds hd * 16 values for this head.
                let (k0, k1) = unsafe { (load16(t0.add(d * KEY_TILE)), load16(t1.add(d * KEY_TILE))) };
                for r in 0..R {
                    let qd = _mm512_set1_ps(q[r][d]);
                    a0[r] = _mm512_fmadd_ps(qd, k0, a0[r]);
                    a1[r] = _mm512_fmadd_ps(qd, k1, a1[r]);
                }
            }
            for r in 0..R {
                let row = scores[r * span..].as_mut_ptr();
                // SAFETY: each head's scores hold `span` floats (tiles j and j + 1 < tiles).
                unsafe {
                    _mm512_storeu_ps(row.add(j * KEY_TILE), _mm512_mul_ps(a0[r], sc));
                    if two {
                        _mm512_storeu_ps(row.add((j + 1) * KEY_TILE), _mm512_mul_ps(a1[r], sc));
                    }
                }
            }
            j += if two { 2 } else { 1 };
        }
        for r in 0..R {
            exp_normalize(&mut scores[r * span + first..r * span + n_ctx], 1.0);
        }
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let mut p_all = first;
        for (values, count) in kv.value_segments(first, n_ctx) {
            for p in 0..count {
                let w: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(scores[r * span + p_all]));
                let row = values[p * kv.stride..p * kv.stride + hd].as_ptr();
                for v in 0..V {
                    // SAFETY: the value row holds hd = 16 * V values.
                    let x = unsafe { load16(row.add(16 * v)) };
                    for r in 0..R {
                        acc[r][v] = _mm512_fmadd_ps(w[r], x, acc[r][v]);
                    }
                }
                p_all += 1;
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let out = &mut outs[r * hd..(r + 1) * hd];
            for (v, a) in acc.iter().enumerate() {
                // SAFETY: out holds hd floats.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * v), *a) };
            }
        }
    }
}
