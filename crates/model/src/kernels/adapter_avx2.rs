//! The LoRA adapters' two products (`adapter`) written with AVX2 intrinsics.
//!
//! Why not the generic loops compiled for AVX2, as `add_ranks` was until session 53: rustc 1.95
//! kept its tile of sixteen outputs in arrays on the stack and called `<[T; N]>::map` out of line
//! for each rank's widened B values, so the second product ran at ~2 GMAC/s a thread for one row
//! and ~5 for eight (~90% of an adapter pass; `perf annotate`: stores and reloads of the
//! accumulators at every rank). Here the accumulators are registers by construction. The
//! arithmetic is the generic kernels', operation for operation, so the bits are.
//!
//! Both products read their matrix a line ahead of use, [`PREFETCH_AHEAD`] bytes on. A matrix is
//! short (3-25 KB for r8) and read once a step, from memory when many adapters share a batch; the
//! hardware's prefetchers barely start on such a stream before it ends, so one thread read
//! adapters at ~9 GB/s against ~30 GB/s of plain loads. An adapter's matrices lie in one buffer
//! in the order the forward pass reads them (`lora::LoraAdapter::new`), so asking past the end of
//! one matrix fetches the start of the next.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register arrays indexed as in the math

use super::adapter::{add_rest, for_rank_blocks, put, tiles, Bf16, RankBlocks, Widen, UP_COLS};
use super::cpu::Avx2Fma;
use super::lanes_avx2::{prefetch, PREFETCH_AHEAD};
use std::arch::x86_64::*;

/// An element type B can hold, read eight at a time as f32 (bf16 widened exactly).
pub(super) trait Lanes8: Widen {
    /// # Safety
    /// AVX2 is available and eight elements from `p` are readable.
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Lanes8 for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's.
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl Lanes8 for Bf16 {
    #[inline(always)]
    unsafe fn load8(p: *const Bf16) -> __m256 {
        // SAFETY: the caller's; a bf16 is an f32's upper half, so a shift widens it exactly.
        unsafe {
            let raw = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
        }
    }
}

/// `out[t * rank + r] = dot(a_r, x_t)` on bf16 `a`: each entry `adapter::dots_generic`'s
/// arithmetic (eight lanes of fused multiply-adds, the tail, the fixed lane sum), with eight
/// weights widened per instruction, in tiles of up to two rows by four ranks.
pub(super) fn dots_bf16(avx2: Avx2Fma, a: &[Bf16], rank: usize, xs: &[f32], out: &mut [f32]) {
    let n = a.len() / rank.max(1);
    assert!(a.len() == rank * n && n > 0 && xs.len().is_multiple_of(n) && out.len() == xs.len() / n * rank);
    // SAFETY: the token proves AVX2; the lengths are asserted above.
    unsafe { dots_bf16_avx2(avx2, a, rank, xs, out) }
}

/// [`dots_bf16`]'s tiles of up to two rows by four ranks.
///
/// # Safety
/// `a` holds `rank` rows of `n = a.len() / rank > 0` values, `xs` whole rows of `n`, and `out`
/// `rank` values a row of `xs` (asserted by [`dots_bf16`]).
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_bf16_avx2(_: Avx2Fma, a: &[Bf16], rank: usize, xs: &[f32], out: &mut [f32]) {
    let n = a.len() / rank;
    for (t, r, two, four) in tiles(xs.len() / n, rank) {
        // SAFETY: rows t..t+R of xs and r..r+C of a exist (the tiles' bounds), as the callee needs.
        unsafe {
            match (two, four) {
                (true, true) => put(out, rank, t, r, bf16_tile::<2, 4>(a, n, xs, t, r)),
                (false, true) => put(out, rank, t, r, bf16_tile::<1, 4>(a, n, xs, t, r)),
                (true, false) => put(out, rank, t, r, bf16_tile::<2, 1>(a, n, xs, t, r)),
                (false, false) => put(out, rank, t, r, bf16_tile::<1, 1>(a, n, xs, t, r)),
            }
        }
    }
}

/// The dots of rows `t..t+R` of `xs` by rows `r..r+C` of `a` (each `n` long), as
/// `super::dot_tile` computes them when fused: lane `l` of an accumulator takes `w * x` of
/// positions `8c + l` in order, one fused multiply-add each, the tail after, then the lanes in
/// one fixed order.
///
/// # Safety
/// AVX2 is available; rows `t..t+R` of `xs` and `r..r+C` of `a` exist.
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_tile<const R: usize, const C: usize>(
    a: &[Bf16],
    n: usize,
    xs: &[f32],
    t: usize,
    r: usize,
) -> [[f32; C]; R] {
    let chunks = n / 8;
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let (ap, xp) = (a.as_ptr(), xs.as_ptr());
    // Ranks r..r+C are one stretch of `a`, 2Cn bytes over n/8 chunks: a four-rank tile asks for
    // one line a chunk, PREFETCH_AHEAD on (past the last rank, B's start, which comes next).
    let ahead = (ap as *const u8).wrapping_add(r * n * 2 + PREFETCH_AHEAD);
    for c in 0..chunks {
        if C == 4 {
            prefetch(ahead.wrapping_add(c * 64), 64);
        }
        // SAFETY: position 8c + 7 < n, inside row r + j of `a` and row t + i of `xs`.
        let w: [__m256; C] = std::array::from_fn(|j| unsafe { Bf16::load8(ap.add((r + j) * n + c * 8)) });
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as above.
            let x = unsafe { _mm256_loadu_ps(xp.add((t + i) * n + c * 8)) };
            for (acc, w) in acc.iter_mut().zip(&w) {
                *acc = _mm256_fmadd_ps(*w, x, *acc);
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for i in 0..R {
        for j in 0..C {
            let mut s = 0f32;
            for k in chunks * 8..n {
                s = a[(r + j) * n + k].to_f32().mul_add(xs[(t + i) * n + k], s);
            }
            let mut l = [0f32; 8];
            // SAFETY: `l` holds eight floats.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc[i][j]) };
            out[i][j] = (l[0] + l[4]) + (l[1] + l[5]) + (l[2] + l[6]) + (l[3] + l[7]) + s;
        }
    }
    out
}

/// `adapter::add_ranks_generic`'s products and order: for each row `i` and output `o`, the ranks
/// in order, `o = fma(ax[i, r], b[o, r], o)`, over
/// `adapter::for_rank_blocks`' blocks, B in `adapter::b_tiles`' layout.
pub(super) fn add_ranks<L: Lanes8>(avx2: Avx2Fma, ax: &[f32], b: &[L], outs: &mut [&mut [f32]]) {
    let rows = outs.len();
    let rank = ax.len() / rows.max(1);
    let n = outs.first().map_or(0, |o| o.len());
    assert!(rows > 0 && rank > 0 && ax.len() == rows * rank && b.len() == rank * n);
    assert!(outs.iter().all(|o| o.len() == n));
    // SAFETY: the token proves AVX2; the lengths are asserted above, and the walk gives `block`
    // tiles `c..c+TC <= n / UP_COLS` of B and rows `t..t+TR <= rows` of `ax` and `outs`.
    unsafe { add_ranks_avx2(Avx2Blocks { _avx2: avx2, ax, rank, b, outs }) }
    add_rest(ax, b, outs);
}

#[target_feature(enable = "avx2,fma")]
unsafe fn add_ranks_avx2<L: Lanes8>(mut k: Avx2Blocks<'_, '_, '_, L>) {
    let (rows, tiles) = (k.outs.len(), k.outs[0].len() / UP_COLS);
    for_rank_blocks(rows, tiles, &mut k);
}

/// The AVX2 blocks: each row's sixteen-wide tile of outputs in two registers across all the
/// ranks, loaded and stored once. Holding the token, they exist only where AVX2 does.
struct Avx2Blocks<'a, 'b, 'o, L> {
    _avx2: Avx2Fma,
    ax: &'a [f32],
    rank: usize,
    b: &'a [L],
    outs: &'b mut [&'o mut [f32]],
}

impl<L: Lanes8> RankBlocks for Avx2Blocks<'_, '_, '_, L> {
    /// Asks for the strip PREFETCH_AHEAD on, once for all the rows (they read this one from L1).
    #[inline(always)]
    fn strip(&mut self, c0: usize, end: usize) {
        let span = self.rank * UP_COLS;
        let strip = self.b.as_ptr().wrapping_add(c0 * span) as *const u8;
        prefetch(strip.wrapping_add(PREFETCH_AHEAD), (end - c0) * span * std::mem::size_of::<L>());
    }

    #[inline(always)]
    unsafe fn block<const TR: usize, const TC: usize>(&mut self, t: usize, c: usize) {
        let (ax, rank) = (self.ax, self.rank);
        let span = rank * UP_COLS;
        let o: [*mut f32; TR] = std::array::from_fn(|i| self.outs[t + i].as_mut_ptr());
        let mut acc = [[_mm256_setzero_ps(); 8]; TR];
        // SAFETY (every access below): AVX2 is available (the token); tiles c..c+TC hold
        // UP_COLS outputs of each row and span elements of B; rows t..t+TR hold `rank` entries
        // of `ax`.
        unsafe {
            for i in 0..TR {
                for j in 0..TC {
                    let p = o[i].add((c + j) * UP_COLS);
                    acc[i][2 * j] = _mm256_loadu_ps(p);
                    acc[i][2 * j + 1] = _mm256_loadu_ps(p.add(8));
                }
            }
            let bp = self.b.as_ptr().add(c * span);
            let ap = ax.as_ptr().add(t * rank);
            for r in 0..rank {
                let a: [__m256; TR] = std::array::from_fn(|i| _mm256_broadcast_ss(&*ap.add(i * rank + r)));
                for j in 0..TC {
                    let row = bp.add(j * span + r * UP_COLS);
                    let (lo, hi) = (L::load8(row), L::load8(row.add(8)));
                    for i in 0..TR {
                        acc[i][2 * j] = _mm256_fmadd_ps(a[i], lo, acc[i][2 * j]);
                        acc[i][2 * j + 1] = _mm256_fmadd_ps(a[i], hi, acc[i][2 * j + 1]);
                    }
                }
            }
            for i in 0..TR {
                for j in 0..TC {
                    let p = o[i].add((c + j) * UP_COLS);
                    _mm256_storeu_ps(p, acc[i][2 * j]);
                    _mm256_storeu_ps(p.add(8), acc[i][2 * j + 1]);
                }
            }
        }
    }
}
