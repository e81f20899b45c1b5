//! Activations quantised per super-block of 256 values, as llama.cpp's Q8_K, for the K-quant
//! weights' lane kernel (`blocks_lanes::ktile`).
//!
//! Why a second quantisation: with one activation scale per 32 values, every 32-value block of a
//! K-quant weight row needs its own float epilogue per weight group and activation row (convert,
//! multiply, two FMAs), a third of the tile's time at Qwen2.5-1.5B's shapes. With one scale per
//! 256 values the sub-blocks' integer sums are scaled by the weights' integer sub-block codes and
//! added in integers, and the float work runs once per super-block.
//!
//! Per row and super-block this keeps: the quants (`x / d` rounded, `d = max|x| / 127`), `d`,
//! the eight 32-value sums of the quants as i16 pairs (the minimum's term of Q4_K/Q5_K, one
//! `vpdpwssd` per two sub-blocks), and per 16 values `-32 * sum` (Q6_K's offset, the start of its
//! integer sums) and `-sum` as an i16 (the same offset for the AVX2 tile's `vpmaddwd`).

use super::blocks::QK_K;

#[derive(Debug, Clone, Default)]
pub struct KActs {
    rows: usize,
    cols: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
    /// Per (row, super-block), 4 words: sums of sub-blocks `2p` (low half) and `2p + 1` (high).
    pairs: Vec<i32>,
    /// Per (row, 16 values): `-32 * sum of the quants`.
    q6_start: Vec<i32>,
    /// Per (row, 16 values): `-sum of the quants` (|sum| <= 16 * 127: an i16), so that a 32-bit
    /// load at an even index is a 32-value block's two offsets as one i16 pair.
    q6_neg: Vec<i16>,
}

impl KActs {
    /// Quantises (rows, cols) activations (`cols` a multiple of 256), rows split over the thread
    /// pool as `Q8Acts::quantize` splits them.
    pub fn quantize(&mut self, data: &[f32], rows: usize, cols: usize) {
        assert!(data.len() == rows * cols && cols.is_multiple_of(QK_K));
        let supers = cols / QK_K;
        self.rows = rows;
        self.cols = cols;
        self.quants.resize(rows * cols, 0);
        self.scales.resize(rows * supers, 0.0);
        self.pairs.resize(rows * supers * 4, 0);
        self.q6_start.resize(rows * cols / 16, 0);
        self.q6_neg.resize(rows * cols / 16, 0);
        use super::team::Disjoint;
        let (q, s) = (Disjoint::new(&mut self.quants), Disjoint::new(&mut self.scales));
        let (p, q6) = (Disjoint::new(&mut self.pairs), Disjoint::new(&mut self.q6_start));
        let q6n = Disjoint::new(&mut self.q6_neg);
        #[cfg(target_arch = "x86_64")]
        let (simd, avx2) = (super::has_avx512_vnni(), super::cpu::cpu().avx2);
        let row = |r: usize| {
            // SAFETY: task r takes row r of each buffer, so no two tasks' slices overlap.
            let (q, s, p, q6, q6n) = unsafe {
                (
                    q.slice(r * cols, cols),
                    s.slice(r * supers, supers),
                    p.slice(r * supers * 4, supers * 4),
                    q6.slice(r * cols / 16, cols / 16),
                    q6n.slice(r * cols / 16, cols / 16),
                )
            };
            let x = &data[r * cols..(r + 1) * cols];
            #[cfg(target_arch = "x86_64")]
            let done = if simd {
                // SAFETY: AVX-512 F/BW were detected; the slices are one row's, sized above.
                unsafe { quantize_row_avx512(x, q, s, p, q6) };
                true
            } else if let Some(avx2) = avx2 {
                super::quantize_avx2::k_row(avx2, x, q, s, p, q6);
                true
            } else {
                false
            };
            #[cfg(not(target_arch = "x86_64"))]
            let done = false;
            if !done {
                quantize_row(x, q, s, p, q6);
            }
            for (n, start) in q6n.iter_mut().zip(q6.iter()) {
                // `-32 * sum` is exact, so the shift is `-sum` exactly.
                *n = (start >> 5) as i16;
            }
        };
        // Below this many values a split costs more than it saves (as for `Q8Acts`).
        if rows > 1 && rows * cols >= 32 * 1024 {
            super::team::for_each(rows, row);
        } else {
            (0..rows).for_each(row);
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Every row's quants, row after row.
    pub(crate) fn quants(&self) -> &[i8] {
        &self.quants
    }

    /// Per (row, super-block): the scale.
    pub(crate) fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Per (row, super-block): four words of two i16 sub-block sums (see [`KActs`]).
    pub(crate) fn pairs(&self) -> &[i32] {
        &self.pairs
    }

    /// Per (row, 16 values): `-32 * sum`.
    pub(crate) fn q6_start(&self) -> &[i32] {
        &self.q6_start
    }

    /// Per (row, 16 values): `-sum` as an i16.
    pub(crate) fn q6_neg(&self) -> &[i16] {
        &self.q6_neg
    }

    /// One row's quants and super-block scales (for the reference products in tests).
    pub fn row(&self, r: usize) -> (&[i8], &[f32]) {
        let supers = self.cols / QK_K;
        (&self.quants[r * self.cols..(r + 1) * self.cols], &self.scales[r * supers..(r + 1) * supers])
    }
}

/// One row: the rounding of `q8::quantize_into` (half away from zero, written so that it
/// vectorises) over 256 values per scale.
fn quantize_row(x: &[f32], q: &mut [i8], s: &mut [f32], pairs: &mut [i32], q6: &mut [i32]) {
    for (sb, ((x, q), d_out)) in x.chunks_exact(QK_K).zip(q.chunks_exact_mut(QK_K)).zip(s.iter_mut()).enumerate() {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (qi, v) in q.iter_mut().zip(x) {
            let v = v * inv;
            *qi = (v + 0.5f32.copysign(v)) as i32 as i8;
        }
        *d_out = d;
        let mut sum16 = [0i32; 16];
        for (s, h) in sum16.iter_mut().zip(q.chunks_exact(16)) {
            *s = h.iter().map(|&v| v as i32).sum();
        }
        sums(&sum16, &mut pairs[sb * 4..sb * 4 + 4], &mut q6[sb * 16..sb * 16 + 16]);
    }
}

/// A super-block's `-32 * sum` per 16 values and its 32-value sums as i16 pairs.
pub(super) fn sums(sum16: &[i32], pairs: &mut [i32], q6: &mut [i32]) {
    for (q6, s) in q6.iter_mut().zip(sum16) {
        *q6 = -32 * s;
    }
    for (p, pair) in pairs.iter_mut().enumerate() {
        // |sum of 32 quants| <= 32 * 127: an i16.
        let (lo, hi) = (sum16[4 * p] + sum16[4 * p + 1], sum16[4 * p + 2] + sum16[4 * p + 3]);
        *pair = (lo as i16 as u16 as u32 | (hi as i16 as u16 as u32) << 16) as i32;
    }
}

/// [`quantize_row`] with the same float operations in the same order, 16 values per register,
/// so the quants are equal bit for bit. In scalar code it was ~3% of a 16-stream decode of the
/// 1.5B model, on the leader thread while the helper waited.
///
/// Safety: AVX-512 F/BW present; `x` and `q` hold `s.len()` super-blocks, `pairs` 4 and `q6`
/// 16 words per super-block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_row_avx512(x: &[f32], q: &mut [i8], s: &mut [f32], pairs: &mut [i32], q6: &mut [i32]) {
    use std::arch::x86_64::*;
    let supers = s.len();
    assert!(
        x.len() >= supers * QK_K && q.len() >= supers * QK_K && pairs.len() >= 4 * supers && q6.len() >= 16 * supers
    );
    let half = _mm512_set1_epi32(0.5f32.to_bits() as i32);
    let sign = _mm512_set1_epi32(i32::MIN);
    for sb in 0..supers {
        // SAFETY: 256 floats and 256 bytes at super-block sb are in bounds (asserted above).
        unsafe {
            let p = x.as_ptr().add(sb * QK_K);
            let mut m = _mm512_setzero_ps();
            for i in 0..16 {
                m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(p.add(16 * i))));
            }
            let d = _mm512_reduce_max_ps(m) / 127.0;
            let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
            let mut sum16 = [0i32; 16];
            for (i, sum) in sum16.iter_mut().enumerate() {
                let r = _mm512_mul_ps(_mm512_loadu_ps(p.add(16 * i)), inv);
                // copysign(0.5, r): the sign bit of r on 0.5.
                let h = _mm512_or_si512(half, _mm512_and_si512(_mm512_castps_si512(r), sign));
                let v = _mm512_cvttps_epi32(_mm512_add_ps(r, _mm512_castsi512_ps(h)));
                _mm_storeu_si128(q.as_mut_ptr().add(sb * QK_K + 16 * i) as *mut __m128i, _mm512_cvtepi32_epi8(v));
                *sum = _mm512_reduce_add_epi32(v);
            }
            s[sb] = d;
            sums(&sum16, &mut pairs[sb * 4..sb * 4 + 4], &mut q6[sb * 16..sb * 16 + 16]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_scale_per_super_block_and_its_sums() {
        // The first super-block's largest magnitude is 127 (d = 1, values exact); the second is
        // all zeros (d = 0, quants 0).
        let mut x = vec![0f32; 512];
        for (i, v) in x.iter_mut().enumerate().take(256) {
            *v = if i % 2 == 0 { 127.0 } else { -0.5 * (i % 7) as f32 };
        }
        let mut k = KActs::default();
        k.quantize(&x, 1, 512);
        let (q, s) = k.row(0);
        assert_eq!((s[0], s[1]), (1.0, 0.0));
        assert_eq!(q[0], 127);
        // -1.5 and -0.5: half away from zero.
        assert_eq!((q[3], q[1]), (-2, -1));
        assert!(q[256..].iter().all(|&v| v == 0));
        let sum = |a: usize, n: usize| q[a..a + n].iter().map(|&v| v as i32).sum::<i32>();
        assert_eq!(k.q6_start()[1], -32 * sum(16, 16));
        assert_eq!((k.q6_neg()[1] as i32, k.q6_neg()[2] as i32), (-sum(16, 16), -sum(32, 16)));
        let p = k.pairs()[1];
        assert_eq!(((p & 0xFFFF) as i16 as i32, p >> 16), (sum(64, 32), sum(96, 32)));
        assert_eq!(k.pairs()[4..], [0; 4]);
    }

    #[test]
    fn simd_equals_scalar() {
        let cols = 768;
        let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0 + (i % 3) as f32 * 0.5).collect();
        let mut k = KActs::default();
        k.quantize(&x, 1, cols);
        let (mut q, mut s, mut p, mut q6) = (vec![0i8; cols], vec![0f32; 3], vec![0i32; 12], vec![0i32; 48]);
        quantize_row(&x, &mut q, &mut s, &mut p, &mut q6);
        assert_eq!((k.row(0).0, k.row(0).1, k.pairs(), k.q6_start()), (&q[..], &s[..], &p[..], &q6[..]));
        // The AVX2 row too where the CPU has it (the call above took AVX-512 where present).
        #[cfg(target_arch = "x86_64")]
        if let Some(avx2) = crate::kernels::cpu::cpu().avx2 {
            let (mut q2, mut s2, mut p2, mut q62) = (vec![0i8; cols], vec![0f32; 3], vec![0i32; 12], vec![0i32; 48]);
            crate::kernels::quantize_avx2::k_row(avx2, &x, &mut q2, &mut s2, &mut p2, &mut q62);
            assert_eq!((q2, s2, p2, q62), (q, s, p, q6));
        }
    }
}
