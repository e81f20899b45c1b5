//! The activation quantisers' rows with AVX2 (`Q8Acts` per 32 values, `KActs` per 256), the
//! twins of the AVX-512 rows beside the scalar ones in `q8.rs` and `q8k.rs`.
//!
//! Why: on AVX2-only CPUs the activations were quantised in scalar code, ~5% of a 16-stream
//! decode step of Qwen2.5-Coder 1.5B on Zen 3 (`perf`: `Q8Acts::quantize` 2.9%, `q8k` 2.3%),
//! on the leader thread while the helper waited. The float operations are the scalar path's in
//! its order (max of magnitudes, `amax / 127`, `x * (1 / d)`, add `copysign(0.5, v)`, truncate),
//! and the sums are integers, so the quants, scales and sums are equal bit for bit.
#![allow(unsafe_code)]

use super::cpu::Avx2Fma;
use super::q8::{BlockSums, QK};
use std::arch::x86_64::*;

const QK_K: usize = super::blocks::QK_K;

/// One row per 32 values: quants, scales, block sums, and the sums times the scale per block
/// and per half block, written through [`BlockSums`] as the scalar and AVX-512 rows write them.
pub(super) fn q8_row(avx2: Avx2Fma, x: &[f32], q: &mut [i8], mut out: BlockSums<'_>) {
    let blocks = out.check(x, q);
    for b in 0..blocks {
        // SAFETY: the token proves AVX2; 32 floats and 32 bytes at block b are in bounds
        // (asserted above).
        let (d, h0, h1) = unsafe { block(avx2, x.as_ptr().add(b * QK), 1, q.as_mut_ptr().add(b * QK)) };
        out.put(b, d, h0[0], h1[0]);
    }
}

/// One row per 256 values: quants, scales and the sums per 16 values that `q8k::sums` turns
/// into pairs and Q6_K's offsets, as `q8k::quantize_row_avx512` does.
pub(super) fn k_row(avx2: Avx2Fma, x: &[f32], q: &mut [i8], s: &mut [f32], pairs: &mut [i32], q6: &mut [i32]) {
    let supers = s.len();
    assert!(
        x.len() >= supers * QK_K && q.len() >= supers * QK_K && pairs.len() >= 4 * supers && q6.len() >= 16 * supers
    );
    for sb in 0..supers {
        // SAFETY: the token proves AVX2; 256 floats and 256 bytes at super-block sb are in
        // bounds (asserted above).
        let (d, even, odd) = unsafe { block(avx2, x.as_ptr().add(sb * QK_K), 8, q.as_mut_ptr().add(sb * QK_K)) };
        let mut sum16 = [0i32; 16];
        for i in 0..8 {
            sum16[2 * i] = even[i];
            sum16[2 * i + 1] = odd[i];
        }
        s[sb] = d;
        super::q8k::sums(&sum16, &mut pairs[sb * 4..sb * 4 + 4], &mut q6[sb * 16..sb * 16 + 16]);
    }
}

/// Quantises `32 * UNITS` floats at `x` with one scale into `q`; returns the scale and each
/// 32-value unit's sums of its first and second 16 quants.
///
/// # Safety
/// `32 * units` floats at `x` and bytes at `q` exist; `units <= 8`.
#[target_feature(enable = "avx2")]
unsafe fn block(_: Avx2Fma, x: *const f32, units: usize, q: *mut i8) -> (f32, [i32; 8], [i32; 8]) {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let half = _mm256_set1_epi32(0.5f32.to_bits() as i32);
    let sign = _mm256_set1_epi32(i32::MIN);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let (mut first, mut second) = ([0i32; 8], [0i32; 8]);
    // SAFETY (whole body): every read is one of the 32 * units floats, every write one of the
    // 32 * units bytes (the caller's promise).
    unsafe {
        let mut m = _mm256_setzero_ps();
        for i in 0..4 * units {
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x.add(8 * i)), abs));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        for u in 0..units {
            let mut v = [_mm256_setzero_si256(); 4];
            for (j, v) in v.iter_mut().enumerate() {
                let r = _mm256_mul_ps(_mm256_loadu_ps(x.add(32 * u + 8 * j)), inv);
                // copysign(0.5, r): the sign bit of r on 0.5.
                let h = _mm256_or_si256(half, _mm256_and_si256(_mm256_castps_si256(r), sign));
                *v = _mm256_cvttps_epi32(_mm256_add_ps(r, _mm256_castsi256_ps(h)));
            }
            // |v| <= 127, so the saturating packs are plain narrowings; they interleave the
            // 128-bit halves, which the permute puts back in order.
            let bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256(q.add(32 * u) as *mut __m256i, _mm256_permutevar8x32_epi32(bytes, order));
            // Lane l: [a0+a1, a2+a3, b0+b1, b2+b3], then [A_l, B_l, ..]; the halves' lanes added.
            let pairs = _mm256_hadd_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
            let quads = _mm256_hadd_epi32(pairs, pairs);
            let both = _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
            first[u] = _mm_cvtsi128_si32(both);
            second[u] = _mm_extract_epi32(both, 1);
        }
        (d, first, second)
    }
}
