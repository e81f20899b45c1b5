//! AVX-512 VNNI version of the Q4_1 matmul. Every function here must only be called after
//! `has_avx512_vnni()` returned true.
//!
//! Layout and why it is fast: a step covers two Q4_1 blocks (64 weights). Their 32 stored bytes
//! are split into low and high nibbles with one `and` and one shift, and the four 128-bit lanes
//! reordered so that the 64 unsigned values line up with the 64 activation bytes of the same two
//! blocks. One `vpdpbusd` then multiplies all 64 pairs and sums them in fours into 16 i32 lanes
//! (lanes 0..8 belong to the first block, 8..16 to the second), replacing the AVX2 path's
//! `maddubs` + `madd` and working on twice the width. The unpacked weights are kept in registers
//! for a tile of up to four activation rows, so prefill and batched decode unpack each weight
//! block once per four tokens instead of once per token.
//!
//! The per-block minimum `m` of Q4_1 contributes `m * s_a * sum(a)` per block; it is summed
//! after the main loop, sixteen blocks per instruction, instead of inside it, which keeps the
//! main loop to the four instructions per tile entry that matter.
//!
//! Each (weight row, activation row) result goes through the same instruction sequence whatever
//! the tile shape, so batched results equal unbatched ones bit for bit.
#![allow(unsafe_code)]
// Index loops over small register arrays read closer to the math than iterator chains.
#![allow(clippy::needless_range_loop)]

use super::cpu::Avx512Vnni;
use std::arch::x86_64::*;

/// Lane `i` of a two-float pair expanded to 16 lanes: element 0 in lanes 0..8, element 1 in 8..16.
#[inline(always)]
pub(crate) unsafe fn expand_pair(p: *const f32) -> __m512 {
    // SAFETY (caller): two floats readable at p.
    let two = unsafe { _mm_castpd_ps(_mm_load_sd(p as *const f64)) };
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(two))
}

/// A tile's first weight row as raw pointers (quants or nibbles, scales, minimums); the rows after
/// it follow at `blocks` blocks per row. Built by the caller after checking the tile's bounds, so
/// the kernels need no per-row slices (building them cost ~13% of prefill).
#[derive(Clone, Copy)]
pub(crate) struct WeightRows {
    pub q: *const u8,
    pub d: *const f32,
    pub m: *const f32,
}

/// A tile's first activation row as raw pointers (quants, scales, scaled sums, sums), rows
/// following at `blocks` blocks per row.
#[derive(Clone, Copy)]
pub(crate) struct ActRows {
    pub a: *const i8,
    pub s: *const f32,
    pub ss: *const f32,
    pub sums: *const i32,
}

/// `R` Q4_1 weight rows times `C` activation rows of `blocks` blocks each (an even count).
///
/// # Safety
/// `blocks` is even, and from `w` there are `R` weight rows readable (`blocks * 16` nibble bytes,
/// `blocks` scales and minimums each), from `a` `C` activation rows (`blocks * 32` quants,
/// `blocks` scales, scaled sums and sums each). The token proves the CPU features. The safe
/// caller (`kernels::Q4Tile`) asserts all of it.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn q4_tile<const R: usize, const C: usize>(
    _: Avx512Vnni,
    w: WeightRows,
    a: ActRows,
    blocks: usize,
) -> [[f32; C]; R] {
    let mask = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // SAFETY (whole body): every offset stays inside the R weight rows (blocks * 16 nibble bytes,
    // blocks scales and minimums each) and C activation rows (blocks * 32 quants, blocks scales).
    unsafe {
        for p in 0..blocks / 2 {
            let mut wv = [_mm512_setzero_si512(); R];
            let mut dv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let raw = _mm256_loadu_si256(w.q.add(r * blocks * 16 + p * 32) as *const __m256i);
                let lo = _mm256_and_si256(raw, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                // [lo0 lo1 hi0 hi1] -> [lo0 hi0 lo1 hi1]: each block's 32 values in order.
                let cat = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                wv[r] = _mm512_shuffle_i64x2(cat, cat, 0b11_01_10_00);
                dv[r] = expand_pair(w.d.add(r * blocks + 2 * p));
            }
            for c in 0..C {
                let av = _mm512_loadu_si512(a.a.add(c * blocks * 32 + p * 64) as *const __m512i);
                let sv = expand_pair(a.s.add(c * blocks + 2 * p));
                for r in 0..R {
                    let isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[r], av);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dv[r], sv), acc[r][c]);
                }
            }
        }
        // The minimum's term, `sum_b m[b] * ss[b]`, sixteen blocks per step into the same lanes.
        let mut b = 0;
        while b < blocks {
            let k = (blocks - b).min(16);
            let mask: __mmask16 = if k == 16 { 0xFFFF } else { (1u16 << k) - 1 };
            let mut mv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                mv[r] = _mm512_maskz_loadu_ps(mask, w.m.add(r * blocks + b));
            }
            for c in 0..C {
                let sv = _mm512_maskz_loadu_ps(mask, a.ss.add(c * blocks + b));
                for r in 0..R {
                    acc[r][c] = _mm512_fmadd_ps(mv[r], sv, acc[r][c]);
                }
            }
            b += 16;
        }
    }
    reduce(&acc)
}

/// `R` int8 weight rows times `C` activation rows of `blocks` blocks each (an even count); `w.m`
/// is not read.
///
/// `vpdpbusd` wants one unsigned operand, so the weights are read as `w + 128` (flipping the top
/// bit turns an i8 into that u8) and the extra `128 * sum(a)` of each block is taken out exactly,
/// in integers, by starting the block's first lane at `-128 * sum(a)` instead of zero.
///
/// # Safety
/// As [`q4_tile`], with `blocks * 32` quants per weight row.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn q8_tile<const R: usize, const C: usize>(
    _: Avx512Vnni,
    w: WeightRows,
    a: ActRows,
    blocks: usize,
) -> [[f32; C]; R] {
    let flip = _mm512_set1_epi8(-128);
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // SAFETY (whole body): every offset stays inside the R weight rows and C activation rows.
    unsafe {
        for p in 0..blocks / 2 {
            let mut wv = [_mm512_setzero_si512(); R];
            let mut dv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                wv[r] = _mm512_xor_si512(_mm512_loadu_si512(w.q.add(r * blocks * 32 + p * 64) as *const __m512i), flip);
                dv[r] = expand_pair(w.d.add(r * blocks + 2 * p));
            }
            for c in 0..C {
                let av = _mm512_loadu_si512(a.a.add(c * blocks * 32 + p * 64) as *const __m512i);
                let sv = expand_pair(a.s.add(c * blocks + 2 * p));
                let two = _mm_loadl_epi64(a.sums.add(c * blocks + 2 * p) as *const __m128i);
                // Lanes 0 and 8 get -128 * the two blocks' sums, every other lane zero.
                let start = _mm512_maskz_permutexvar_epi32(0x0101, idx, _mm512_castsi128_si512(two));
                let start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(start, 7));
                for r in 0..R {
                    let isum = _mm512_dpbusd_epi32(start, wv[r], av);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dv[r], sv), acc[r][c]);
                }
            }
        }
    }
    reduce(&acc)
}

/// Every accumulator's lanes summed (a loop, not a closure, so that it is inlined into the
/// kernel).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn reduce<const R: usize, const C: usize>(acc: &[[__m512; C]; R]) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
    out
}
