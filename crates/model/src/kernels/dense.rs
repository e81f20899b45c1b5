//! f32 weights (`--quantize none`): matrices of a float GGUF or safetensors checkpoint kept as
//! they are, for accuracy over speed. Each output is one f32 dot product of a weight row with the
//! activation row before quantisation, in the same order whatever the batch, so batched results
//! equal unbatched ones bit for bit (a blocked GEMM would change its sums with the batch size).

use super::{dot, tiled, Q8Acts};

/// A row-major (rows, cols) f32 matrix.
#[derive(Debug, Clone)]
pub struct F32Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl F32Matrix {
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols);
        F32Matrix { rows, cols, data }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        out[..self.cols].copy_from_slice(self.row(r));
    }

    pub fn vstack(parts: &[F32Matrix]) -> F32Matrix {
        let cols = parts[0].cols;
        assert!(parts.iter().all(|p| p.cols == cols));
        let data: Vec<f32> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        F32Matrix { rows: data.len() / cols, cols, data }
    }
}

/// `out[t, n] = w[n] . x[t]` with the activations' f32 copy (`Q8Acts::keep_f32`).
pub fn matmul_f32(w: &F32Matrix, a: &Q8Acts, out: &mut [f32]) {
    let (n_out, t_rows) = (w.rows, a.rows());
    assert_eq!(w.cols, a.cols(), "inner dimensions differ");
    assert_eq!(out.len(), n_out * t_rows);
    let x = a.values().expect("f32 weights need the activations' f32 copy (Q8Acts::keep_f32)");
    tiled(n_out, t_rows, out, |cols| {
        for n in cols.n0..cols.n1 {
            for t in 0..t_rows {
                cols.put(n, t, [[dot(w.row(n), &x[t * w.cols..(t + 1) * w.cols])]]);
            }
        }
    });
}
