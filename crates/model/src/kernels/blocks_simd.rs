//! The AVX2 and AVX-512 VNNI tiers of the block formats' matmul (`blocks`), for a tile of `R`
//! weight rows by `C` activation rows.
//!
//! Each unit of the `R` rows is unpacked once (`blocks::unpack`, inlined here so that its loops
//! are vectorised with the tier's instructions) into unsigned values and per-lane scales, then
//! multiplied with every activation row of the tile. The integer products land in i32 lanes of
//! four values each (`vpdpbusd` directly; `vpmaddubsw` + `vpmaddwd` on AVX2), which is exactly
//! the granularity of `Unpacked::lane_scale`, so a sub-block's scale is applied per lane with one
//! multiply and one FMA and no horizontal sum happens before the end of the row. The minimums are
//! one FMA of sixteen sub-blocks per unit against `Q8Acts::scaled_sums16`.
//!
//! Each (weight row, activation row) result goes through the same instruction sequence whatever
//! the tile shape, so batched results equal unbatched ones bit for bit.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register arrays indexed as in the math

use super::blocks::{unpack, BlockMatrix, Unpacked};
use super::cpu::{Avx2Fma, Avx512Vnni};
use super::q8::QK;
use super::Q8Acts;
use std::arch::x86_64::*;

/// The VNNI tier: 64 values per `vpdpbusd`.
///
/// # Safety
/// Weight rows `n..n+R` and activation rows `t..t+C` exist and `w.cols() == a.cols()`; the
/// token proves the CPU features. The safe caller (`kernels::BlockTile`) asserts it.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn tile_vnni<const R: usize, const C: usize>(
    _: Avx512Vnni,
    w: &BlockMatrix,
    a: &Q8Acts,
    n: usize,
    t: usize,
) -> [[f32; C]; R] {
    let (format, uv, k) = (w.format(), w.format().unit_values(), w.cols());
    let (blocks, halves) = (k / QK, k / 16);
    let subs = uv / 16;
    let min_mask: __mmask16 = if subs >= 16 { 0xFFFF } else { (1u16 << subs) - 1 };
    let mut up: [Unpacked; R] = std::array::from_fn(|_| Unpacked::default());
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let (aq, scales, ss16) = (a.quants().as_ptr(), a.scales().as_ptr(), a.all_scaled_sums16().as_ptr());
    // SAFETY (whole body): activation row t + c < a.rows() has k quants, k / 32 scales and k / 16
    // scaled sums, and every offset below stays inside them (v0 + 64 <= k); the unpacked buffers
    // hold 256 values, 64 lane scales and 16 minimums, of which the first uv, uv / 4 and uv / 16
    // are read.
    unsafe {
        for u in 0..w.units() {
            for r in 0..R {
                unpack(format, w.unit(n + r, u), &mut up[r]);
            }
            for c in 0..C {
                let row = t + c;
                for ch in 0..uv / 64 {
                    let v0 = u * uv + 64 * ch;
                    let av = _mm512_loadu_si512(aq.add(row * k + v0) as *const __m512i);
                    let sv = super::avx512::expand_pair(scales.add(row * blocks + v0 / QK));
                    for r in 0..R {
                        let qv = _mm512_loadu_si512(up[r].q.as_ptr().add(64 * ch) as *const __m512i);
                        let isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qv, av);
                        let ws = _mm512_loadu_ps(up[r].lane_scale.as_ptr().add(16 * ch));
                        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(ws, sv), acc[r][c]);
                    }
                }
                let sums = _mm512_maskz_loadu_ps(min_mask, ss16.add(row * halves + u * subs));
                for r in 0..R {
                    let mv = _mm512_maskz_loadu_ps(min_mask, up[r].min.as_ptr());
                    acc[r][c] = _mm512_fmadd_ps(mv, sums, acc[r][c]);
                }
            }
        }
    }
    super::avx512::reduce(&acc)
}

/// The AVX2 tier: 32 values per `vpmaddubsw` (pairs of u8 x i8 into i16: at most 63 * 127 * 2,
/// so it never saturates) and `vpmaddwd` with ones (into i32 lanes of four values).
///
/// # Safety
/// As [`tile_vnni`], with the AVX2 and FMA token.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tile_avx2<const R: usize, const C: usize>(
    _: Avx2Fma,
    w: &BlockMatrix,
    a: &Q8Acts,
    n: usize,
    t: usize,
) -> [[f32; C]; R] {
    let (format, uv, k) = (w.format(), w.format().unit_values(), w.cols());
    let (blocks, halves) = (k / QK, k / 16);
    let subs = uv / 16;
    let ones = _mm256_set1_epi16(1);
    let mut up: [Unpacked; R] = std::array::from_fn(|_| Unpacked::default());
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let (aq, scales, ss16) = (a.quants().as_ptr(), a.scales().as_ptr(), a.all_scaled_sums16().as_ptr());
    // SAFETY (whole body): as in tile_vnni, with 32 values per step (v0 + 32 <= k) and the
    // minimums four at a time (subs is 4 or 16).
    unsafe {
        for u in 0..w.units() {
            for r in 0..R {
                unpack(format, w.unit(n + r, u), &mut up[r]);
            }
            for c in 0..C {
                let row = t + c;
                for ch in 0..uv / 32 {
                    let v0 = u * uv + 32 * ch;
                    let av = _mm256_loadu_si256(aq.add(row * k + v0) as *const __m256i);
                    let sv = _mm256_set1_ps(*scales.add(row * blocks + v0 / QK));
                    for r in 0..R {
                        let qv = _mm256_loadu_si256(up[r].q.as_ptr().add(32 * ch) as *const __m256i);
                        let isum = _mm256_madd_epi16(_mm256_maddubs_epi16(qv, av), ones);
                        let ws = _mm256_loadu_ps(up[r].lane_scale.as_ptr().add(8 * ch));
                        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(ws, sv), acc[r][c]);
                    }
                }
                for q in 0..subs / 4 {
                    let sums = _mm256_zextps128_ps256(_mm_loadu_ps(ss16.add(row * halves + u * subs + 4 * q)));
                    for r in 0..R {
                        let mv = _mm256_zextps128_ps256(_mm_loadu_ps(up[r].min.as_ptr().add(4 * q)));
                        acc[r][c] = _mm256_fmadd_ps(mv, sums, acc[r][c]);
                    }
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = super::simd::hsum(acc[r][c]);
        }
    }
    out
}
