//! `dy W`: the product through a matrix's rows, the backward of `x W^T` for a frozen `W`, on
//! the very blocks the server holds, so that the trainer keeps no transposed copy of the
//! weights it shares with the engine.
//!
//! `W (rows, cols)` is stored in blocks along its columns, and `dy W` sums along its rows, so no
//! stored block lines up with the sum. The matrix is read back a few rows at a time (on AVX2 and
//! VNNI CPUs 32 rows, a tile that stays in cache, written straight into the lane kernels' groups;
//! elsewhere a bounded f32 panel), transposed and quantised to int8 blocks of 32 along its rows,
//! then multiplied by `dy`, quantised in the same blocks, through the int8 kernels. Building the copy
//! costs a few passes over the weights where the product costs `T` multiply-adds per weight; it
//! lives for one call (a layer's largest is tens of MB on a 1.5B model; the head's, built once per
//! head op for its chunks, the vocabulary's size in bytes). The numbers are those of the int8
//! copy of `W^T` the trainer used to keep: one rounding of the weights and one of `dy` per block.

use super::q8::quantize_into;
use super::{matmul_q8, Q8Acts, Q8Matrix, Weights, QK};
use rayon::prelude::*;

/// Weights dequantised at a time while transposing without the lane kernels (4 MB of f32).
const PANEL_VALUES: usize = 1 << 20;

/// Transposed rows quantised per task.
const ROWS_PER_TASK: usize = 16;

/// `dy (t, w.rows()) -> dy W (t, w.cols())`, row-major; the transposed copy lives for this call.
pub fn matmul_through(w: &Weights, dy: &[f32], t: usize) -> Vec<f32> {
    Transposed::of(w).product(dy, t)
}

/// `W^T` as int8 blocks of 32 along `W`'s rows, its rows padded with zeros to whole pairs of blocks
/// (the VNNI tile kernel takes an even block count): for a caller that multiplies through one
/// matrix several times in a row (the head, chunk by chunk), made once and dropped after.
pub struct Transposed {
    m: Q8Matrix,
    rows: usize,
}

impl Transposed {
    pub fn of(w: &Weights) -> Self {
        let (rows, cols) = (w.rows(), w.cols());
        let padded = rows.next_multiple_of(2 * QK);
        // Where the lane kernels run, the blocks go straight into their groups.
        #[cfg(target_arch = "x86_64")]
        if super::has_avx2() {
            let m = Q8Matrix::from_lanes(super::lanes::Packed::transposed(w), cols, padded);
            return Transposed { m, rows };
        }
        Self::row_major(w)
    }

    /// [`Transposed::of`] without the lane kernels: panels of whole pairs of blocks of rows,
    /// dequantised, then transposed a few rows per task and quantised row-major.
    fn row_major(w: &Weights) -> Self {
        let (rows, cols) = (w.rows(), w.cols());
        let padded = rows.next_multiple_of(2 * QK);
        let panel = ((PANEL_VALUES / cols.max(1)) / (2 * QK) * (2 * QK)).clamp(2 * QK, padded.max(2 * QK));
        let mut quants = vec![0i8; cols * padded];
        let mut scales = vec![0f32; cols * padded / QK];
        let mut dense = Vec::new();
        for p0 in (0..padded).step_by(panel) {
            let n = panel.min(padded - p0);
            let real = n.min(rows.saturating_sub(p0));
            dense.clear();
            dense.resize(n * cols, 0f32);
            dense[..real * cols].par_chunks_mut(QK * cols).enumerate().for_each(|(c, chunk)| {
                for (i, row) in chunk.chunks_exact_mut(cols).enumerate() {
                    w.dequantize_row(p0 + c * QK + i, row);
                }
            });
            let dense = &dense;
            let (per_q, per_s) = (ROWS_PER_TASK * padded, ROWS_PER_TASK * padded / QK);
            quants.par_chunks_mut(per_q).zip(scales.par_chunks_mut(per_s)).enumerate().for_each(|(task, (q, s))| {
                let (k0, kn) = (task * ROWS_PER_TASK, q.len() / padded);
                let mut local = vec![0f32; kn * n];
                for (i, row) in dense.chunks_exact(cols).enumerate() {
                    for (j, x) in row[k0..k0 + kn].iter().enumerate() {
                        local[j * n + i] = *x;
                    }
                }
                for (j, values) in local.chunks_exact(n).enumerate() {
                    let at = j * padded + p0;
                    quantize_into(values, &mut q[at..at + n], &mut s[at / QK..(at + n) / QK]);
                }
            });
        }
        Transposed { m: Q8Matrix::from_parts(quants, scales, cols, padded), rows }
    }

    /// `dy (t, rows) -> dy W (t, cols)`, row-major.
    pub fn product(&self, dy: &[f32], t: usize) -> Vec<f32> {
        let (rows, padded, cols) = (self.rows, self.m.cols(), self.m.rows());
        assert_eq!(dy.len(), t * rows, "dy must be (t, rows)");
        let mut dx = vec![0f32; t * cols];
        if t == 0 || cols == 0 {
            return dx;
        }
        let mut acts = Q8Acts::default();
        if padded == rows {
            acts.quantize(dy, t, rows);
        } else {
            let mut wide = vec![0f32; t * padded];
            for (w, d) in wide.chunks_exact_mut(padded).zip(dy.chunks_exact(rows.max(1))) {
                w[..rows].copy_from_slice(d);
            }
            acts.quantize(&wide, t, padded);
        }
        matmul_q8(&self.m, &acts, &mut dx);
        dx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::values;
    use crate::kernels::{BlockFormat, BlockMatrix, F32Matrix, Q4Matrix};

    /// `dy W` in f64 from the matrix's own dequantised rows, and the same sum over magnitudes
    /// (which bounds the rounding error).
    fn reference(w: &Weights, dy: &[f32], t: usize) -> (Vec<f64>, Vec<f64>) {
        let (rows, cols) = (w.rows(), w.cols());
        let mut row = vec![0f32; cols];
        let (mut out, mut mag) = (vec![0f64; t * cols], vec![0f64; t * cols]);
        for r in 0..rows {
            w.dequantize_row(r, &mut row);
            for i in 0..t {
                let g = dy[i * rows + r] as f64;
                let span = i * cols..(i + 1) * cols;
                for ((o, m), x) in out[span.clone()].iter_mut().zip(&mut mag[span]).zip(&row) {
                    *o += g * *x as f64;
                    *m += g.abs() * x.abs() as f64;
                }
            }
        }
        (out, mag)
    }

    fn check(w: &Weights, t: usize) {
        let dy = values(t * w.rows(), 7);
        // Both ways of making the copy: into lane groups (where the CPU has them) and row-major.
        let row_major = Transposed::row_major(w).product(&dy, t);
        check_against(w, &dy, t, &row_major);
        check_against(w, &dy, t, &matmul_through(w, &dy, t));
    }

    fn check_against(w: &Weights, dy: &[f32], t: usize, got: &[f32]) {
        // Two int8 roundings per product (~0.4% each on a block's largest value), summed over
        // the rows: measured against the sum of magnitudes.
        let (want, mag) = reference(w, dy, t);
        for (k, ((g, w), m)) in got.iter().zip(&want).zip(&mag).enumerate() {
            assert!((*g as f64 - w).abs() <= 0.01 * m + 1e-6, "entry {k}: {g} against {w} (magnitude {m})");
        }
    }

    #[test]
    fn products_through_the_rows_match_f64_for_every_format() {
        // Rows not a multiple of the blocks (padding), several panels (1 << 20 / 64 = 16,384 rows
        // a panel), and one transposed task's tail.
        for (rows, cols, t) in [(96, 64, 3), (40, 96, 1), (16_500, 64, 2)] {
            let data = values(rows * cols, rows as u32);
            check(&Weights::Q8(Q8Matrix::from_f32(&data, rows, cols)), t);
            check(&Weights::Q8(Q8Matrix::from_f32(&data, rows, cols).lanes_only()), t);
            check(&Weights::F32(F32Matrix::new(data.clone(), rows, cols)), t);
            let q4 = candle_blocks(&data, rows, cols, candle_core::quantized::GgmlDType::Q4_1);
            check(&Weights::Q4(Q4Matrix::from_q4_1_bytes(&q4, rows, cols).unwrap().lanes_only()), t);
        }
        // K-quants (256 columns a block).
        let (rows, cols) = (70, 256);
        let data = values(rows * cols, 3);
        for dtype in [candle_core::quantized::GgmlDType::Q4K, candle_core::quantized::GgmlDType::Q6K] {
            let raw = candle_blocks(&data, rows, cols, dtype);
            let m = BlockMatrix::from_raw(BlockFormat::of(dtype).unwrap(), raw, rows, cols).unwrap();
            check(&Weights::Block(m.lanes_only()), 5);
        }
    }

    #[test]
    fn zero_rows_or_tokens_give_zeros() {
        let w = Weights::Q8(Q8Matrix::from_f32(&values(64 * 32, 1), 64, 32));
        assert!(matmul_through(&w, &[], 0).is_empty());
        assert_eq!(matmul_through(&w, &vec![0f32; 2 * 64], 2), vec![0f32; 2 * 32]);
    }

    fn candle_blocks(data: &[f32], rows: usize, cols: usize, dtype: candle_core::quantized::GgmlDType) -> Vec<u8> {
        let t = candle_core::Tensor::from_vec(data.to_vec(), (rows, cols), &candle_core::Device::Cpu).unwrap();
        candle_core::quantized::QTensor::quantize(&t, dtype).unwrap().data().unwrap().into_owned()
    }
}
