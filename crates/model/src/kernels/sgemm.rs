//! A safe f32 matrix product over row-major slices for the trainer's thin products (the LoRA
//! factors, rank 8): the `gemm` crate (candle's own) with the operands read in place, transposed
//! through strides, so no operand is copied and the result lands where the caller wants it.
#![allow(unsafe_code)]

/// A row-major (rows, cols) operand, or the transpose of one (`t = true`: the slice holds the
/// (cols, rows) matrix row-major).
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub t: bool,
    /// The row stride of the row-major storage (its width; more for a block of columns).
    pub ld: usize,
}

impl<'a> Operand<'a> {
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Operand { data, rows, cols, t: false, ld: cols }
    }

    /// The transpose of the row-major (rows, cols) matrix in `data`.
    pub fn transposed(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Operand { data, rows: cols, cols: rows, t: true, ld: cols }
    }

    /// The (rows, cols) block of a row-major matrix `ld` wide whose first element is `data[0]`
    /// (a few columns of a wider matrix, read in place).
    pub fn columns(data: &'a [f32], rows: usize, cols: usize, ld: usize) -> Self {
        Operand { data, rows, cols, t: false, ld }
    }

    /// The transpose of [`Operand::columns`].
    pub fn columns_transposed(data: &'a [f32], rows: usize, cols: usize, ld: usize) -> Self {
        Operand { data, rows: cols, cols: rows, t: true, ld }
    }

    /// (row stride, column stride) of the operand as used.
    fn strides(&self) -> (isize, isize) {
        if self.t {
            (1, self.ld as isize)
        } else {
            (self.ld as isize, 1)
        }
    }

    /// Values of `data` the operand reaches (one past the last).
    fn span(&self) -> usize {
        let (r, c) = if self.t { (self.cols, self.rows) } else { (self.rows, self.cols) };
        if r == 0 || c == 0 {
            0
        } else {
            (r - 1) * self.ld + c
        }
    }
}

/// `out (m, n) = (accumulate ? out : 0) + alpha * a (m, k) b (k, n)`, on the current rayon pool
/// when the product is large enough to split.
pub fn sgemm(out: &mut [f32], accumulate: bool, alpha: f32, a: Operand, b: Operand) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions differ");
    let wide = |o: &Operand| o.ld >= if o.t { o.rows } else { o.cols };
    assert!(wide(&a) && wide(&b), "a row stride narrower than the row");
    assert!(a.data.len() >= a.span() && b.data.len() >= b.span() && out.len() >= m * n);
    let threads = rayon::current_num_threads();
    let parallelism =
        if m * n * k >= 1 << 20 && threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    let ((a_rs, a_cs), (b_rs, b_cs)) = (a.strides(), b.strides());
    // SAFETY: every element addressed lies inside the three slices (sizes asserted above, strides
    // from the shapes).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            alpha,
            false,
            false,
            false,
            parallelism,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_with_every_transpose_match_loops() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.91).cos()).collect();
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect(); // (k, m)
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect(); // (n, k)
        let want: Vec<f32> =
            (0..m * n).map(|i| (0..k).map(|j| a[(i / n) * k + j] * b[j * n + i % n]).sum::<f32>() * 2.0).collect();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let lhs = if ta { Operand::transposed(&at, k, m) } else { Operand::new(&a, m, k) };
            let rhs = if tb { Operand::transposed(&bt, n, k) } else { Operand::new(&b, k, n) };
            let mut out = vec![1.0f32; m * n];
            sgemm(&mut out, true, 2.0, lhs, rhs);
            for (o, w) in out.iter().zip(&want) {
                assert!((o - 1.0 - w).abs() < 1e-5, "{ta} {tb}: {o} vs {w}");
            }
            sgemm(&mut out, false, 2.0, lhs, rhs);
            for (o, w) in out.iter().zip(&want) {
                assert!((o - w).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn blocks_of_columns_read_in_place_match_their_copies() {
        // a (5, 3) and its transpose as columns 2..5 of a (5, 7) matrix.
        let (m, k, n, ld, at) = (5, 3, 4, 7, 2);
        let wide: Vec<f32> = (0..m * ld).map(|i| (i as f32 * 0.53).sin()).collect();
        let a: Vec<f32> = (0..m * k).map(|i| wide[(i / k) * ld + at + i % k]).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.29).cos()).collect();
        let (mut want, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
        sgemm(&mut want, false, 1.0, Operand::new(&a, m, k), Operand::new(&b, k, n));
        sgemm(&mut got, false, 1.0, Operand::columns(&wide[at..], m, k, ld), Operand::new(&b, k, n));
        assert_eq!(got, want);
        // (k, m) a^T times (m, n): the transposed block.
        let c: Vec<f32> = (0..m * n).map(|i| (i as f32 * 0.71).sin()).collect();
        let (mut want, mut got) = (vec![0f32; k * n], vec![0f32; k * n]);
        sgemm(&mut want, false, 1.0, Operand::transposed(&a, m, k), Operand::new(&c, m, n));
        sgemm(&mut got, false, 1.0, Operand::columns_transposed(&wide[at..], m, k, ld), Operand::new(&c, m, n));
        assert_eq!(got, want);
    }
}
