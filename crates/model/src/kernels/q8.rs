//! Q8 storage: rows of blocks of [`QK`] signed bytes, each block with an f32 scale.
//!
//! Values are quantised symmetrically to [-127, 127] (never -128, so that the SIMD kernel may
//! take absolute values in 8 bits).

/// Values per block.
pub const QK: usize = 32;

/// A quantised (rows, cols) weight matrix; `cols` is a multiple of [`QK`].
#[derive(Debug, Clone)]
pub struct Q8Matrix {
    rows: usize,
    cols: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
    /// The same weights in groups of 16 rows for the AVX-512 VNNI kernel, on CPUs that have it.
    #[cfg(target_arch = "x86_64")]
    pub(crate) lanes: Option<std::sync::Arc<super::lanes::Packed>>,
}

impl Q8Matrix {
    /// Quantises a row-major f32 matrix.
    pub fn from_f32(data: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols);
        assert_eq!(cols % QK, 0, "columns must be a multiple of {QK}");
        let mut quants = vec![0i8; rows * cols];
        let mut scales = vec![0f32; rows * cols / QK];
        quantize_into(data, &mut quants, &mut scales);
        Self::from_parts(quants, scales, rows, cols)
    }

    /// From the raw bytes of a GGUF Q8_0 tensor of shape (rows, cols): its blocks are already
    /// int8 with one scale, so they are taken as they are (no f32 copy of the matrix, which for
    /// Gemma 3's 262,144-token embedding was 671 MB at load, and no requantisation). A -128
    /// (never written by ggml's quantiser) becomes -127, the range the kernels assume. `raw` is
    /// dropped before the lane-packed copy is built, so that loading holds two copies of the
    /// matrix at a time, not three (the vocabulary's matrix sets a model's peak at load).
    pub fn from_q8_0_bytes(raw: Vec<u8>, rows: usize, cols: usize) -> Option<Self> {
        const BLOCK_BYTES: usize = 34;
        let blocks = rows * cols / QK;
        if !cols.is_multiple_of(QK) || raw.len() != blocks * BLOCK_BYTES {
            return None;
        }
        let mut quants = Vec::with_capacity(rows * cols);
        let mut scales = Vec::with_capacity(blocks);
        for b in raw.chunks_exact(BLOCK_BYTES) {
            scales.push(half::f16::from_le_bytes([b[0], b[1]]).to_f32());
            quants.extend(b[2..].iter().map(|q| (*q as i8).max(-127)));
        }
        drop(raw);
        Some(Self::from_parts(quants, scales, rows, cols))
    }

    /// From int8 quants (in [-127, 127]) and their block scales, with the lane-packed copy where
    /// the CPU has AVX2.
    pub(crate) fn from_parts(quants: Vec<i8>, scales: Vec<f32>, rows: usize, cols: usize) -> Self {
        assert!(quants.len() == rows * cols && scales.len() * QK == quants.len() && cols.is_multiple_of(QK));
        Q8Matrix {
            rows,
            cols,
            quants,
            scales,
            #[cfg(target_arch = "x86_64")]
            lanes: None,
        }
        .packed()
    }

    /// A matrix held only as lane-packed groups (built straight into them).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn from_lanes(packed: super::lanes::Packed, rows: usize, cols: usize) -> Self {
        assert!(packed.rows == rows && packed.blocks * QK == cols);
        Q8Matrix { rows, cols, quants: Vec::new(), scales: Vec::new(), lanes: Some(std::sync::Arc::new(packed)) }
    }

    /// With the lane-packed copy when the CPU has AVX2 (the VNNI and AVX2 lane kernels read it).
    fn packed(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        if super::has_avx2() {
            self.lanes = Some(std::sync::Arc::new(super::lanes::Packed::from_q8(&self)));
        }
        self
    }

    /// Keeps only the lane-packed copy when there is one, as [`super::Q4Matrix::lanes_only`].
    pub fn lanes_only(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        if self.lanes.is_some() {
            (self.quants, self.scales) = (Vec::new(), Vec::new());
        }
        self
    }

    /// Without the lane-packed copy (tests of the other kernels).
    #[doc(hidden)]
    pub fn without_lanes(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            self.lanes = None;
        }
        self
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Quants and scales of one row.
    #[inline]
    pub fn row(&self, r: usize) -> (&[i8], &[f32]) {
        assert!(!self.quants.is_empty(), "rows of a lanes-only matrix");
        let bpr = self.cols / QK;
        (&self.quants[r * self.cols..(r + 1) * self.cols], &self.scales[r * bpr..(r + 1) * bpr])
    }

    /// Row `r` onward as raw pointers for the AVX-512 kernel (no minimums: `m` is dangling).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(crate) fn rows_from(&self, r: usize) -> super::avx512::WeightRows {
        assert!(r < self.rows);
        let bpr = self.cols / QK;
        super::avx512::WeightRows {
            q: self.quants[r * self.cols..].as_ptr() as *const u8,
            d: self.scales[r * bpr..].as_ptr(),
            m: std::ptr::null(),
        }
    }

    /// One row back in f32 (for embedding lookups).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let (true, Some(lanes)) = (self.quants.is_empty(), &self.lanes) {
            return lanes.dequantize_row(r, out);
        }
        let (q, s) = self.row(r);
        for (b, scale) in s.iter().enumerate() {
            for i in 0..QK {
                out[b * QK + i] = q[b * QK + i] as f32 * scale;
            }
        }
    }

    /// Bytes of weight data, for reporting.
    pub fn bytes(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        let lanes = self.lanes.as_ref().map_or(0, |p| p.bytes());
        #[cfg(not(target_arch = "x86_64"))]
        let lanes = 0;
        self.quants.len() + self.scales.len() * 4 + lanes
    }

    /// Stacks matrices with equal `cols` vertically (to fuse q/k/v or gate/up into one matmul).
    pub fn vstack(parts: &[Q8Matrix]) -> Q8Matrix {
        assert!(parts.iter().all(|p| !p.quants.is_empty()), "stacking needs the row-major copies");
        let cols = parts[0].cols;
        assert!(parts.iter().all(|p| p.cols == cols));
        let mut out = Q8Matrix {
            rows: 0,
            cols,
            quants: Vec::new(),
            scales: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            lanes: None,
        };
        for p in parts {
            out.rows += p.rows;
            out.quants.extend_from_slice(&p.quants);
            out.scales.extend_from_slice(&p.scales);
        }
        out.packed()
    }
}

/// One row's input and outputs as `quantize` zips them: values, quants, scales, sums, scaled sums,
/// scaled sums per 16.
type RowParts<'a> = (((((&'a [f32], &'a mut [i8]), &'a mut [f32]), &'a mut [i32]), &'a mut [f32]), &'a mut [f32]);

/// Activations quantised per row and block, reused across every weight row of one matmul.
#[derive(Debug, Clone, Default)]
pub struct Q8Acts {
    rows: usize,
    cols: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
    /// Sum of each block's quants (Q4_1 weights need it for their per-block minimum).
    sums: Vec<i32>,
    /// The same sums times the block's scale, in f32 (what the AVX-512 Q4_1 kernel uses).
    scaled_sums: Vec<f32>,
    /// Per half block (16 values), the sum of the quants times the block's scale: the minimum's
    /// term of the block formats, whose sub-blocks are 16 values (`blocks`).
    scaled_sums16: Vec<f32>,
    /// Whether `quantize` also keeps the f32 input (for f32 weights, `--quantize none`).
    pub keep_f32: bool,
    values: Vec<f32>,
    /// Whether `quantize` also quantises per 256 values (`KActs`), for K-quant weights' lane
    /// kernel; rows whose length is not a multiple of 256 are not (no K-quant weight takes them).
    pub k_quants: bool,
    k: super::KActs,
}

impl Q8Acts {
    /// Quantises (rows, cols) activations, reusing this buffer's allocation. Rows are split over
    /// the thread pool when there are enough of them (prefill): done on one thread, quantising
    /// took ~5% of a 16-stream decode profile while the other thread waited.
    pub fn quantize(&mut self, data: &[f32], rows: usize, cols: usize) {
        assert_eq!(data.len(), rows * cols);
        assert_eq!(cols % QK, 0);
        self.rows = rows;
        self.cols = cols;
        let bpr = cols / QK;
        self.quants.resize(rows * cols, 0);
        self.scales.resize(rows * bpr, 0.0);
        self.sums.resize(rows * bpr, 0);
        self.scaled_sums.resize(rows * bpr, 0.0);
        self.scaled_sums16.resize(rows * bpr * 2, 0.0);
        self.values.clear();
        if self.keep_f32 {
            self.values.extend_from_slice(data);
        }
        if self.k_quants && cols.is_multiple_of(super::blocks::QK_K) {
            self.k.quantize(data, rows, cols);
        } else {
            self.k.quantize(&[], 0, 0);
        }
        #[cfg(target_arch = "x86_64")]
        let (simd, avx2) = (super::has_avx512_vnni(), super::cpu::cpu().avx2);
        let row = |(((((x, q), s), sum), ss), ss16): RowParts<'_>| {
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: AVX-512 F/BW were detected; the slices are one row's, sized by `quantize`.
                unsafe { quantize_row_avx512(x, q, BlockSums { s, sums: sum, ss, ss16 }) };
                return;
            } else if let Some(avx2) = avx2 {
                super::quantize_avx2::q8_row(avx2, x, q, BlockSums { s, sums: sum, ss, ss16 });
                return;
            }
            let mut out = BlockSums { s, sums: sum, ss, ss16 };
            out.check(x, q);
            quantize_into(x, q, out.s);
            for b in 0..out.s.len() {
                let half = |h: usize| q[b * QK + 16 * h..b * QK + 16 * h + 16].iter().map(|q| *q as i32).sum::<i32>();
                out.put(b, out.s[b], half(0), half(1));
            }
        };
        // Below this many values a rayon split costs more than it saves.
        const PARALLEL_MIN: usize = 32 * 1024;
        if rows > 1 && rows * cols >= PARALLEL_MIN {
            use super::team::Disjoint;
            let (q, s) = (Disjoint::new(&mut self.quants), Disjoint::new(&mut self.scales));
            let (sum, ss) = (Disjoint::new(&mut self.sums), Disjoint::new(&mut self.scaled_sums));
            let ss16 = Disjoint::new(&mut self.scaled_sums16);
            // SAFETY: task r takes row r of each buffer, so no two tasks' slices overlap.
            super::team::for_each(rows, |r| unsafe {
                row((
                    (
                        (
                            ((&data[r * cols..(r + 1) * cols], q.slice(r * cols, cols)), s.slice(r * bpr, bpr)),
                            sum.slice(r * bpr, bpr),
                        ),
                        ss.slice(r * bpr, bpr),
                    ),
                    ss16.slice(2 * r * bpr, 2 * bpr),
                ))
            });
        } else {
            data.chunks_exact(cols)
                .zip(self.quants.chunks_exact_mut(cols))
                .zip(self.scales.chunks_exact_mut(bpr))
                .zip(self.sums.chunks_exact_mut(bpr))
                .zip(self.scaled_sums.chunks_exact_mut(bpr))
                .zip(self.scaled_sums16.chunks_exact_mut(2 * bpr))
                .for_each(row);
        }
    }

    /// Row `r` onward as raw pointers for the AVX-512 kernels.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(crate) fn rows_from(&self, r: usize) -> super::avx512::ActRows {
        assert!(r < self.rows);
        let bpr = self.cols / QK;
        super::avx512::ActRows {
            a: self.quants[r * self.cols..].as_ptr(),
            s: self.scales[r * bpr..].as_ptr(),
            ss: self.scaled_sums[r * bpr..].as_ptr(),
            sums: self.sums[r * bpr..].as_ptr(),
        }
    }

    /// Every row's quants, scales, block sums and scaled sums, row after row (the lane kernels
    /// index them directly).
    pub(crate) fn quants(&self) -> &[i8] {
        &self.quants
    }

    pub(crate) fn scales(&self) -> &[f32] {
        &self.scales
    }

    pub(crate) fn all_sums(&self) -> &[i32] {
        &self.sums
    }

    pub(crate) fn all_scaled_sums(&self) -> &[f32] {
        &self.scaled_sums
    }

    /// The per-256 quantisation of the last `quantize`, when `k_quants` was set and the rows
    /// are whole super-blocks.
    pub fn k(&self) -> Option<&super::KActs> {
        (self.k.rows() == self.rows && self.k.cols() == self.cols && self.rows > 0).then_some(&self.k)
    }

    /// The f32 input of the last `quantize`, when `keep_f32` was set.
    pub fn values(&self) -> Option<&[f32]> {
        (self.keep_f32 && self.values.len() == self.rows * self.cols).then_some(&self.values[..])
    }

    pub(crate) fn all_scaled_sums16(&self) -> &[f32] {
        &self.scaled_sums16
    }

    /// Per half block (16 values) sums times scales of one row.
    #[inline]
    pub fn scaled_sums16(&self, r: usize) -> &[f32] {
        let halves = self.cols / 16;
        &self.scaled_sums16[r * halves..(r + 1) * halves]
    }

    /// Per-block sums times scales of one row.
    #[inline]
    pub fn scaled_sums(&self, r: usize) -> &[f32] {
        let bpr = self.cols / QK;
        &self.scaled_sums[r * bpr..(r + 1) * bpr]
    }

    /// Per-block sums of one row.
    #[inline]
    pub fn sums(&self, r: usize) -> &[i32] {
        let bpr = self.cols / QK;
        &self.sums[r * bpr..(r + 1) * bpr]
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    #[inline]
    pub fn row(&self, r: usize) -> (&[i8], &[f32]) {
        let bpr = self.cols / QK;
        (&self.quants[r * self.cols..(r + 1) * self.cols], &self.scales[r * bpr..(r + 1) * bpr])
    }
}

pub(crate) fn quantize_into(data: &[f32], quants: &mut [i8], scales: &mut [f32]) {
    for ((block, q), s) in data.chunks_exact(QK).zip(quants.chunks_exact_mut(QK)).zip(scales.iter_mut()) {
        let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (qi, x) in q.iter_mut().zip(block) {
            // Round half away from zero without a libm call (f32::round is not inlined), so the
            // loop vectorises; |x * inv| <= 127 by construction.
            let v = x * inv;
            *qi = (v + 0.5f32.copysign(v)) as i32 as i8;
        }
        *s = d;
    }
}

/// [`quantize_into`] plus the block sums, 32 values per two registers, with the same float
/// operations in the same order (max of magnitudes, `amax / 127`, `x * (1 / d)`, add
/// `copysign(0.5, v)`, truncate), so the quants equal the scalar path's bit for bit. Done in
/// scalar code it was ~5% of a batched decode step and ~7% of a training step.
///
/// Safety: AVX-512 F/BW present (the lengths are checked).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_row_avx512(x: &[f32], q: &mut [i8], mut out: BlockSums<'_>) {
    use std::arch::x86_64::*;
    let blocks = out.check(x, q);
    let half = _mm512_set1_epi32(0.5f32.to_bits() as i32);
    let sign = _mm512_set1_epi32(i32::MIN);
    for b in 0..blocks {
        // SAFETY: 32 floats and 32 bytes at block b are in bounds (asserted above).
        unsafe {
            let p = x.as_ptr().add(b * QK);
            let (v0, v1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let d = amax / 127.0;
            let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
            let (r0, r1) = (_mm512_mul_ps(v0, inv), _mm512_mul_ps(v1, inv));
            // copysign(0.5, r): the sign bit of r on 0.5.
            let h0 = _mm512_or_si512(half, _mm512_and_si512(_mm512_castps_si512(r0), sign));
            let h1 = _mm512_or_si512(half, _mm512_and_si512(_mm512_castps_si512(r1), sign));
            let i0 = _mm512_cvttps_epi32(_mm512_add_ps(r0, _mm512_castsi512_ps(h0)));
            let i1 = _mm512_cvttps_epi32(_mm512_add_ps(r1, _mm512_castsi512_ps(h1)));
            let dst = q.as_mut_ptr().add(b * QK) as *mut __m128i;
            _mm_storeu_si128(dst, _mm512_cvtepi32_epi8(i0));
            _mm_storeu_si128(dst.add(1), _mm512_cvtepi32_epi8(i1));
            out.put(b, d, _mm512_reduce_add_epi32(i0), _mm512_reduce_add_epi32(i1));
        }
    }
}

/// One activation row's per-block outputs beside its quants: the scales, the block sums, and the
/// sums times the scale per block and per half block. Every quantiser row (scalar, AVX2,
/// AVX-512) writes them through [`BlockSums::put`], so the bookkeeping is written once.
pub(super) struct BlockSums<'a> {
    pub s: &'a mut [f32],
    pub sums: &'a mut [i32],
    pub ss: &'a mut [f32],
    pub ss16: &'a mut [f32],
}

impl BlockSums<'_> {
    /// The row's block count (`s.len()`); panics unless `x`, `q` and the other slices hold
    /// that many blocks, which the SIMD rows' unchecked reads and writes rely on.
    pub(super) fn check(&self, x: &[f32], q: &[i8]) -> usize {
        let blocks = self.s.len();
        assert!(
            x.len() >= blocks * QK
                && q.len() >= blocks * QK
                && self.sums.len() >= blocks
                && self.ss.len() >= blocks
                && self.ss16.len() >= 2 * blocks
        );
        blocks
    }

    /// Block `b`'s scale `d` and the sums of its first and second 16 quants.
    #[inline]
    pub(super) fn put(&mut self, b: usize, d: f32, h0: i32, h1: i32) {
        let sum = h0 + h1;
        self.s[b] = d;
        self.sums[b] = sum;
        self.ss[b] = sum as f32 * d;
        self.ss16[2 * b] = h0 as f32 * d;
        self.ss16[2 * b + 1] = h1 as f32 * d;
    }
}

/// The reference dot product of one weight row and one activation row.
pub(crate) fn dot_q8_scalar(wq: &[i8], ws: &[f32], aq: &[i8], as_: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, (w_scale, a_scale)) in ws.iter().zip(as_).enumerate() {
        let mut isum = 0i32;
        for i in b * QK..(b + 1) * QK {
            isum += wq[i] as i32 * aq[i] as i32;
        }
        acc += isum as f32 * (w_scale * a_scale);
    }
    acc
}
