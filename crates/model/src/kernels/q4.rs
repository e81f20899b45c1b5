//! Q4_1 weights kept as the GGUF stores them: blocks of 32 four-bit values `q` with an f32 scale
//! `d` and minimum `m` (value = d * q + m). Half the bytes of int8 weights, which is what a
//! memory-bound decode step pays for.
//!
//! Dot with int8 activations (scale `s`, quants `a`, block sum `S`):
//! `sum_i (d q_i + m) s a_i = d s (sum_i q_i a_i) + m s S`.

use super::cpu::Avx2Fma;
use super::{simd, Cols, Q8Acts, QK};

/// Bytes of one GGUF Q4_1 block: f16 d, f16 m, 16 bytes of nibbles.
const BLOCK_BYTES: usize = 20;

#[derive(Debug, Clone)]
pub struct Q4Matrix {
    rows: usize,
    cols: usize,
    /// 16 bytes per block: low nibbles are values 0..16, high nibbles 16..32.
    nibbles: Vec<u8>,
    d: Vec<f32>,
    m: Vec<f32>,
    /// The same weights in groups of 16 rows for the AVX-512 VNNI kernel, on CPUs that have it.
    #[cfg(target_arch = "x86_64")]
    pub(crate) lanes: Option<std::sync::Arc<super::lanes::Packed>>,
}

impl Q4Matrix {
    /// From the raw bytes of a GGUF Q4_1 tensor of shape (rows, cols).
    pub fn from_q4_1_bytes(raw: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let blocks = rows * cols / QK;
        if !cols.is_multiple_of(QK) || raw.len() != blocks * BLOCK_BYTES {
            return None;
        }
        let mut out = Q4Matrix {
            rows,
            cols,
            nibbles: Vec::with_capacity(blocks * 16),
            d: Vec::with_capacity(blocks),
            m: Vec::with_capacity(blocks),
            #[cfg(target_arch = "x86_64")]
            lanes: None,
        };
        for b in raw.chunks_exact(BLOCK_BYTES) {
            out.d.push(half::f16::from_le_bytes([b[0], b[1]]).to_f32());
            out.m.push(half::f16::from_le_bytes([b[2], b[3]]).to_f32());
            out.nibbles.extend_from_slice(&b[4..20]);
        }
        Some(out.packed())
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Nibbles, scales and minimums of one row.
    #[inline]
    pub fn row(&self, r: usize) -> (&[u8], &[f32], &[f32]) {
        assert!(!self.nibbles.is_empty(), "rows of a lanes-only matrix");
        let bpr = self.cols / QK;
        (
            &self.nibbles[r * bpr * 16..(r + 1) * bpr * 16],
            &self.d[r * bpr..(r + 1) * bpr],
            &self.m[r * bpr..(r + 1) * bpr],
        )
    }

    /// Row `r` onward as raw pointers for the AVX-512 kernel.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(crate) fn rows_from(&self, r: usize) -> super::avx512::WeightRows {
        assert!(r < self.rows);
        let bpr = self.cols / QK;
        super::avx512::WeightRows {
            q: self.nibbles[r * bpr * 16..].as_ptr(),
            d: self.d[r * bpr..].as_ptr(),
            m: self.m[r * bpr..].as_ptr(),
        }
    }

    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let (true, Some(lanes)) = (self.nibbles.is_empty(), &self.lanes) {
            return lanes.dequantize_row(r, out);
        }
        let (q, d, m) = self.row(r);
        for b in 0..d.len() {
            for j in 0..16 {
                let byte = q[b * 16 + j];
                out[b * QK + j] = (byte & 0x0F) as f32 * d[b] + m[b];
                out[b * QK + j + 16] = (byte >> 4) as f32 * d[b] + m[b];
            }
        }
    }

    /// Bytes held, the lane-packed copy included.
    pub fn bytes(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        let lanes = self.lanes.as_ref().map_or(0, |p| p.bytes());
        #[cfg(not(target_arch = "x86_64"))]
        let lanes = 0;
        self.nibbles.len() + (self.d.len() + self.m.len()) * 4 + lanes
    }

    pub fn vstack(parts: &[Q4Matrix]) -> Q4Matrix {
        assert!(parts.iter().all(|p| !p.nibbles.is_empty()), "stacking needs the row-major copies");
        let cols = parts[0].cols;
        assert!(parts.iter().all(|p| p.cols == cols));
        let mut out = Q4Matrix {
            rows: 0,
            cols,
            nibbles: Vec::new(),
            d: Vec::new(),
            m: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            lanes: None,
        };
        for p in parts {
            out.rows += p.rows;
            out.nibbles.extend_from_slice(&p.nibbles);
            out.d.extend_from_slice(&p.d);
            out.m.extend_from_slice(&p.m);
        }
        out.packed()
    }

    /// With the lane-packed copy when the CPU has AVX2 (the VNNI and AVX2 lane kernels read it).
    fn packed(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        if super::has_avx2() {
            self.lanes = Some(std::sync::Arc::new(super::lanes::Packed::from_q4(&self)));
        }
        self
    }

    /// Keeps only the lane-packed copy when there is one (the VNNI kernel never reads rows; row
    /// dequantisation then reads the groups): the weights' memory once instead of twice.
    /// [`Q4Matrix::row`] must not be called afterwards.
    pub fn lanes_only(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        if self.lanes.is_some() {
            (self.nibbles, self.d, self.m) = (Vec::new(), Vec::new(), Vec::new());
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
}

/// The Q4_1 matmul with AVX2: tiles of four weight rows by two activation rows, each block's
/// nibbles unpacked once for both (a row at a time unpacked them again for every activation
/// row, and added the minimums' term in scalar code: most of a prefill on CPUs without
/// AVX-512). The minimums' term of each output is one dot product of the row's minimums with
/// the activation row's block scales times block sums (`min_weights`).
pub(super) fn matmul_avx2(avx2: Avx2Fma, w: &Q4Matrix, a: &Q8Acts, out: &mut [f32]) {
    let t_rows = a.rows();
    let ws = min_weights(a);
    super::tiled(w.rows(), t_rows, out, |cols| {
        let mut n = cols.n0;
        while n < cols.n1 {
            if n + 4 <= cols.n1 {
                let mut t = 0;
                while t + 2 <= t_rows {
                    tile::<4, 2>(avx2, w, a, &ws, n, t, &cols);
                    t += 2;
                }
                if t < t_rows {
                    tile::<4, 1>(avx2, w, a, &ws, n, t, &cols);
                }
                n += 4;
            } else {
                for t in 0..t_rows {
                    tile::<1, 1>(avx2, w, a, &ws, n, t, &cols);
                }
                n += 1;
            }
        }
    });
}

/// Each activation row's block scales times its block sums, the rows one after another: what a
/// row's minimums are multiplied with.
pub(super) fn min_weights(a: &Q8Acts) -> Vec<f32> {
    (0..a.rows())
        .flat_map(|t| {
            let (_, scales) = a.row(t);
            scales.iter().zip(a.sums(t)).map(|(s, n)| s * *n as f32)
        })
        .collect()
}

/// Weight rows `n..n + R` times activation rows `t..t + C`, minimums included, into `cols`.
#[inline(always)]
fn tile<const R: usize, const C: usize>(
    avx2: Avx2Fma,
    w: &Q4Matrix,
    a: &Q8Acts,
    ws: &[f32],
    n: usize,
    t: usize,
    cols: &Cols,
) {
    let blocks = w.cols / QK;
    let acts: [(&[i8], &[f32]); C] = std::array::from_fn(|c| a.row(t + c));
    let v = simd::q4_tile::<R, C>(
        avx2,
        std::array::from_fn(|r| w.row(n + r)),
        acts.map(|x| x.0),
        acts.map(|x| x.1),
        std::array::from_fn(|c| &ws[(t + c) * blocks..(t + c + 1) * blocks]),
    );
    cols.put(n, t, v);
}

/// One weight row times one activation row as [`matmul_avx2`] computes it, bit for bit.
pub(super) fn dot_row_avx2(avx2: Avx2Fma, w: &Q4Matrix, n: usize, aq: &[i8], as_: &[f32], sums: &[i32]) -> f32 {
    let ws: Vec<f32> = as_.iter().zip(sums).map(|(s, n)| s * *n as f32).collect();
    simd::q4_tile::<1, 1>(avx2, [w.row(n)], [aq], [as_], [&ws])[0][0]
}

/// The reference dot product of one Q4_1 row and one activation row.
pub(crate) fn dot_q4_scalar(q: &[u8], d: &[f32], m: &[f32], aq: &[i8], as_: &[f32], sums: &[i32]) -> f32 {
    let mut acc = 0f32;
    let mut bias = 0f32;
    for b in 0..d.len() {
        let mut isum = 0i32;
        for j in 0..16 {
            let byte = q[b * 16 + j];
            isum += (byte & 0x0F) as i32 * aq[b * QK + j] as i32 + (byte >> 4) as i32 * aq[b * QK + j + 16] as i32;
        }
        acc += isum as f32 * (d[b] * as_[b]);
        bias += m[b] * as_[b] * sums[b] as f32;
    }
    acc + bias
}
