//! AVX2 + FMA versions of the kernels. The safe functions at the top take the `Avx2Fma` token
//! (the features were detected) and assert the slice lengths the `unsafe` kernels below rely on,
//! once per call; the kernels' `# Safety` sections say what that is.
#![allow(unsafe_code)]

use super::adapter::Widen;
use super::cpu::Avx2Fma;
use super::QK;
use crate::arch::Activation;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One int8 weight row times one activation row (blocks of [`QK`], one scale each).
#[inline]
pub(crate) fn dot_q8(avx2: Avx2Fma, wq: &[i8], ws: &[f32], aq: &[i8], as_: &[f32]) -> f32 {
    assert!(wq.len() == ws.len() * QK && aq.len() == wq.len() && as_.len() == ws.len());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the token proves AVX2 and FMA; the lengths are asserted above.
    return unsafe { dot_q8_avx2(avx2, wq, ws, aq, as_) };
    #[cfg(not(target_arch = "x86_64"))]
    return {
        let _ = avx2;
        super::q8::dot_q8_scalar(wq, ws, aq, as_)
    };
}

/// Four int8 weight rows times one activation row.
#[inline]
pub(crate) fn dot_q8x4(avx2: Avx2Fma, w: [&[i8]; 4], ws: [&[f32]; 4], aq: &[i8], as_: &[f32]) -> [f32; 4] {
    let blocks = as_.len();
    assert!(aq.len() == blocks * QK && (0..4).all(|r| w[r].len() == aq.len() && ws[r].len() == blocks));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the token proves AVX2 and FMA; the lengths are asserted above.
    return unsafe { dot_q8x4_avx2(avx2, w, ws, aq, as_) };
    #[cfg(not(target_arch = "x86_64"))]
    return {
        let _ = avx2;
        std::array::from_fn(|r| super::q8::dot_q8_scalar(w[r], ws[r], aq, as_))
    };
}

/// `R` Q4_1 weight rows (nibbles, scales, minimums) times `C` activation rows (quants,
/// scales, and `ws`: each block's scale times its quants' sum, what a minimum multiplies): each
/// block's nibbles are unpacked once for all `C` activation rows. Every (row, activation)
/// result is computed the same way whatever `R` and `C` are, so a batch equals its rows one at
/// a time.
#[inline]
pub(crate) fn q4_tile<const R: usize, const C: usize>(
    avx2: Avx2Fma,
    w: [(&[u8], &[f32], &[f32]); R],
    aq: [&[i8]; C],
    as_: [&[f32]; C],
    ws: [&[f32]; C],
) -> [[f32; C]; R] {
    let blocks = as_[0].len();
    assert!((0..C).all(|c| aq[c].len() == blocks * QK && as_[c].len() == blocks && ws[c].len() == blocks));
    assert!((0..R).all(|r| w[r].0.len() == blocks * QK / 2 && w[r].1.len() == blocks && w[r].2.len() == blocks));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the token proves AVX2 and FMA; the lengths are asserted above.
    return unsafe { q4_tile_avx2::<R, C>(avx2, w, aq, as_, ws) };
    #[cfg(not(target_arch = "x86_64"))]
    return {
        let _ = avx2;
        std::array::from_fn(|r| {
            std::array::from_fn(|c| {
                let bias: f32 = w[r].2.iter().zip(ws[c]).map(|(m, s)| m * s).sum();
                let sums = vec![0i32; blocks];
                super::q4::dot_q4_scalar(w[r].0, w[r].1, w[r].2, aq[c], as_[c], &sums) + bias
            })
        })
    };
}

/// `sum(a[i] * b[i])`, vectorised to 256 bits.
#[inline]
pub(crate) fn dot_f32(avx2: Avx2Fma, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the token proves AVX2 and FMA; the body is safe code on any slices.
    return unsafe { dot_f32_avx2(avx2, a, b) };
    #[cfg(not(target_arch = "x86_64"))]
    return {
        let _ = avx2;
        super::dot_generic(a, b)
    };
}

/// [`super::dots`] compiled for AVX2 (each entry `adapter::dots_generic`'s fused arithmetic).
#[inline]
pub(crate) fn dots<W: Widen>(avx2: Avx2Fma, a: &[W], rank: usize, xs: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the token proves AVX2 and FMA; the body is safe code on any slices.
    unsafe {
        dots_avx2(avx2, a, rank, xs, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = avx2;
        super::adapter::dots_generic(a, rank, xs, out)
    }
}

/// `gate <- act(gate) * up`, vectorised to 256 bits.
#[inline]
pub(crate) fn act_mul(avx2: Avx2Fma, act: Activation, gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the token proves AVX2 and FMA; the body is safe code on any slices.
    unsafe {
        act_mul_avx2(avx2, act, gate, up)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = avx2;
        super::act_mul_generic(act, gate, up)
    }
}

/// One weight row times one activation row, 32 int8 pairs per step.
///
/// `maddubs` multiplies unsigned by signed bytes, so the weight's sign is moved onto the
/// activation (`sign_epi8`) and its absolute value used; values never reach -128, so the absolute
/// value fits. Pairs of i16 products are then widened to i32 (`madd` with ones), converted to f32
/// and accumulated with the block's combined scale, lane-wise; the 8 lanes are summed at the end.
///
/// # Safety
/// `wq` and `aq` hold at least `ws.len() * 32` bytes and `as_` at least `ws.len()` scales.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_avx2(_: Avx2Fma, wq: &[i8], ws: &[f32], aq: &[i8], as_: &[f32]) -> f32 {
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for b in 0..ws.len() {
        // SAFETY: each block is 32 bytes inside the slices (len = blocks * 32).
        let w = unsafe { _mm256_loadu_si256(wq.as_ptr().add(b * 32) as *const __m256i) };
        let a = unsafe { _mm256_loadu_si256(aq.as_ptr().add(b * 32) as *const __m256i) };
        let w_abs = _mm256_sign_epi8(w, w);
        let a_signed = _mm256_sign_epi8(a, w);
        let pairs = _mm256_maddubs_epi16(w_abs, a_signed);
        let sums = _mm256_madd_epi16(pairs, ones);
        let scale = _mm256_set1_ps(ws[b] * as_[b]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc);
    }
    hsum(acc)
}

/// Four weight rows times one activation row: four independent accumulator chains hide the FMA
/// latency that a single dot product waits on, and the activation block is loaded once for all
/// four. Each row's result is computed exactly as [`dot_q8_avx2`] computes it.
///
/// # Safety
/// `aq` and each `w[r]` hold at least `as_.len() * 32` bytes, each `ws[r]` at least `as_.len()`
/// scales.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8x4_avx2(_: Avx2Fma, w: [&[i8]; 4], ws: [&[f32]; 4], aq: &[i8], as_: &[f32]) -> [f32; 4] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..as_.len() {
        // SAFETY: each block is 32 bytes inside the slices (len = blocks * 32).
        let a = unsafe { _mm256_loadu_si256(aq.as_ptr().add(b * 32) as *const __m256i) };
        for r in 0..4 {
            let wv = unsafe { _mm256_loadu_si256(w[r].as_ptr().add(b * 32) as *const __m256i) };
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(a, wv));
            let sums = _mm256_madd_epi16(pairs, ones);
            let scale = _mm256_set1_ps(ws[r][b] * as_[b]);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[r]);
        }
    }
    [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
}

/// R Q4_1 weight rows times C activation rows. Nibbles are unsigned, so `maddubs` takes them
/// directly (no sign trick); a block's nibbles are unpacked once and used for every activation
/// row. The minimums' term is a dot product of a row's minimums with an activation row's `ws`,
/// eight blocks a vector (it was a call per output, a tenth of a decode step).
///
/// # Safety
/// With `blocks = as_[0].len()`: each `aq[c]` holds at least `blocks * 32` bytes, `as_[c]` and
/// `ws[c]` `blocks` entries; each `w[r].0` at least `blocks * 16` bytes, `w[r].1` and `w[r].2`
/// `blocks` entries.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // one block index into several arrays
unsafe fn q4_tile_avx2<const R: usize, const C: usize>(
    _: Avx2Fma,
    w: [(&[u8], &[f32], &[f32]); R],
    aq: [&[i8]; C],
    as_: [&[f32]; C],
    ws: [&[f32]; C],
) -> [[f32; C]; R] {
    let ones = _mm256_set1_epi16(1);
    let mask = _mm_set1_epi8(0x0F);
    let blocks = as_[0].len();
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for b in 0..blocks {
        // SAFETY: 32 activation bytes and 16 nibble bytes per block lie inside the slices.
        let a: [__m256i; C] =
            std::array::from_fn(|c| unsafe { _mm256_loadu_si256(aq[c].as_ptr().add(b * 32) as *const __m256i) });
        for r in 0..R {
            let raw = unsafe { _mm_loadu_si128(w[r].0.as_ptr().add(b * 16) as *const __m128i) };
            let nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
            for c in 0..C {
                let sums32 = _mm256_madd_epi16(_mm256_maddubs_epi16(nib, a[c]), ones);
                let scale = _mm256_set1_ps(w[r].1[b] * as_[c][b]);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums32), scale, acc[r][c]);
            }
        }
    }
    let split = blocks / 8 * 8;
    std::array::from_fn(|r| {
        std::array::from_fn(|c| {
            let mut bias = _mm256_setzero_ps();
            for b in (0..split).step_by(8) {
                // SAFETY: blocks b..b + 8 lie inside both slices.
                let (m, s) =
                    unsafe { (_mm256_loadu_ps(w[r].2.as_ptr().add(b)), _mm256_loadu_ps(ws[c].as_ptr().add(b))) };
                bias = _mm256_fmadd_ps(m, s, bias);
            }
            let tail: f32 = (split..blocks).map(|b| w[r].2[b] * ws[c][b]).sum();
            hsum(acc[r][c]) + (hsum(bias) + tail)
        })
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// The generic f32 dot product, compiled with AVX2/FMA enabled so that it vectorises to 256 bits.
///
/// # Safety
/// None beyond the target features (the body is safe code).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_avx2(_: Avx2Fma, a: &[f32], b: &[f32]) -> f32 {
    super::dot_generic(a, b)
}

/// [`super::adapter::dots_generic`] compiled with AVX2/FMA enabled so that it vectorises.
///
/// # Safety
/// None beyond the target features (the body is safe code).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<W: Widen>(_: Avx2Fma, a: &[W], rank: usize, xs: &[f32], out: &mut [f32]) {
    super::adapter::dots_generic(a, rank, xs, out)
}

/// [`super::act_mul_generic`] compiled with AVX2/FMA enabled so that it vectorises.
///
/// # Safety
/// None beyond the target features (the body is safe code).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn act_mul_avx2(_: Avx2Fma, act: Activation, gate: &mut [f32], up: &[f32]) {
    super::act_mul_generic(act, gate, up)
}
