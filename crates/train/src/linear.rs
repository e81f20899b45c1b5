//! The frozen projections with their adapters: [`LoraLinear`], `y = x W^T + s (x A^T) B^T` for
//! a frozen `W`, as one candle op whose backward returns only `dx`, `dA`, `dB` (candle's matmul
//! backward would also compute `dW`, a full extra GEMM and a weight-sized buffer per layer, for a
//! tensor never updated: stack notes, pitfall 5).
//!
//! On the served path `W` is the engine's own matrix ([`Shared`]): q, k, v stacked in one, gate
//! and up in another, in the formats the server holds them, read in place by the trainer (no
//! second copy of the weights) through the inference kernels both ways: `x W^T` as the server
//! computes it, `dy W` through `kernels::matmul_through` on the same blocks.

use candle_core::{CpuStorage, Device, Layout, Shape, Tensor};
use std::sync::Arc;
use tandem_model::kernels::sgemm::{sgemm, Operand};
use tandem_model::kernels::{self, Q8Acts, Weights};
use tandem_model::Llama;

/// Which of a served model's matrices a [`Shared`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Qkv(usize),
    O(usize),
    GateUp(usize),
    Down(usize),
    Embed,
    /// The output head: the embedding when tied.
    Head,
}

/// A weight matrix the trainer reads but never changes: one of the engine's (shared, not
/// copied), or one of its own (tests, a matrix no model holds).
#[derive(Clone)]
pub enum Shared {
    Model(Arc<Llama>, Which),
    Own(Arc<Weights>),
}

impl Shared {
    /// `which` of `model`; `None` when the model has no such layer.
    pub fn of(model: &Arc<Llama>, which: Which) -> Option<Self> {
        let layer = match which {
            Which::Qkv(l) | Which::O(l) | Which::GateUp(l) | Which::Down(l) => Some(l),
            Which::Embed | Which::Head => None,
        };
        layer.is_none_or(|l| l < model.layers.len()).then(|| Shared::Model(model.clone(), which))
    }
}

impl std::ops::Deref for Shared {
    type Target = Weights;

    fn deref(&self) -> &Weights {
        match self {
            Shared::Own(w) => w,
            // Layer indices were checked in `Shared::of`, and a model's layers never change.
            Shared::Model(m, which) => match *which {
                Which::Qkv(l) => &m.layers[l].qkv,
                Which::O(l) => &m.layers[l].o,
                Which::GateUp(l) => &m.layers[l].gate_up,
                Which::Down(l) => &m.layers[l].down,
                Which::Embed => &m.embed,
                Which::Head => m.lm_head.as_ref().unwrap_or(&m.embed),
            },
        }
    }
}

/// A frozen weight `W (out, in)` and how its two products are computed.
#[derive(Clone)]
pub enum Frozen {
    /// f32 GEMMs both ways (exact; what finite-difference tests need).
    F32(Tensor),
    /// The inference kernels both ways on the served matrix: `x W^T` on int8 activations (the
    /// numbers the server computes), `dy W` on int8-quantised `dy` (`kernels::matmul_through`).
    /// With AVX-512 VNNI these run at ~90 GMAC/s a thread against ~30 for the f32 GEMM; the
    /// price is int8 rounding of activations and output gradients (a relative error of ~0.4%
    /// per block of 32 values), as in quantised training.
    Served(Shared),
}

impl Frozen {
    /// `x (T, in) -> x W^T (T, out)`.
    fn forward(&self, x: &[f32], t: usize) -> candle_core::Result<Vec<f32>> {
        match self {
            Frozen::F32(w) => {
                let (out, inp) = w.dims2()?;
                let mut y = vec![0f32; t * out];
                crate::ops::with_values(w, |w| {
                    sgemm(&mut y, false, 1.0, Operand::new(x, t, inp), Operand::transposed(w, out, inp))
                })?;
                Ok(y)
            }
            Frozen::Served(w) => Ok(quantized_product(w, x, t)),
        }
    }

    /// `dy (T, out) -> dy W (T, in)`.
    fn backward(&self, dy: &[f32], t: usize) -> candle_core::Result<Vec<f32>> {
        match self {
            Frozen::F32(w) => {
                let (out, inp) = w.dims2()?;
                let mut dx = vec![0f32; t * inp];
                crate::ops::with_values(w, |w| {
                    sgemm(&mut dx, false, 1.0, Operand::new(dy, t, out), Operand::new(w, out, inp))
                })?;
                Ok(dx)
            }
            Frozen::Served(w) => Ok(kernels::matmul_through(w, dy, t)),
        }
    }
}

/// The f32 values behind a contiguous tensor's storage guard.
fn cpu_slice<'a>((storage, layout): &'a (candle_core::StorageRef<'_>, &Layout)) -> candle_core::Result<&'a [f32]> {
    match &**storage {
        candle_core::Storage::Cpu(cpu) => crate::fused::slice(cpu, layout),
        _ => Err(candle_core::Error::Msg("the trainer runs on the CPU".into())),
    }
}

/// `x (T, k) -> x M^T (T, n)` for an (n, k) matrix in the inference kernels' formats.
pub(crate) fn quantized_product(m: &Weights, x: &[f32], t: usize) -> Vec<f32> {
    let mut acts = Q8Acts::default();
    acts.k_quants = m.wants_k_acts();
    acts.keep_f32 = m.needs_f32_acts();
    acts.quantize(&x[..t * m.cols()], t, m.cols());
    let mut out = vec![0f32; t * m.rows()];
    kernels::matmul(m, &acts, &mut out);
    out
}

/// `(x (T, in), A (P r, in), B (sum out_i, r)) -> (T, sum out_i)`: the projections stacked in a
/// frozen `W` (q, k, v; gate, up; or one), each with its own pair (A's rows `i r..(i+1) r`, B's
/// rows of output `i`): `x W^T` plus, in each part's columns, `scale (x A_i^T) B_i^T`. The
/// backward computes `dx = dy W + scale sum_i (dy_i B_i) A_i`, `dA_i = scale (dy_i B_i)^T x`,
/// `dB_i = scale dy_i^T (x A_i^T)` (exactly with [`Frozen::F32`]; `dy W` in int8 with
/// [`Frozen::Served`]).
pub struct LoraLinear {
    pub w: Frozen,
    /// The outputs of each stacked projection, in order.
    pub parts: Arc<[usize]>,
    pub scale: f64,
}

impl LoraLinear {
    /// Each part's first column, its width and its first row of A.
    fn spans(&self, r: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let mut off = 0;
        self.parts.iter().enumerate().map(move |(i, &n)| {
            off += n;
            (off - n, n, i * r)
        })
    }

    fn check(
        &self,
        (t, inp): (usize, usize),
        (ra, ia): (usize, usize),
        (ob, r): (usize, usize),
    ) -> candle_core::Result<()> {
        let total: usize = self.parts.iter().sum();
        if ia != inp || ra != r * self.parts.len() || ob != total {
            return Err(candle_core::Error::Msg(format!(
                "lora-linear: x ({t}, {inp}), A ({ra}, {ia}), B ({ob}, {r}) for parts {:?}",
                self.parts
            )));
        }
        Ok(())
    }
}

impl candle_core::CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "lora-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, a, b) = (crate::fused::slice(s1, l1)?, crate::fused::slice(s2, l2)?, crate::fused::slice(s3, l3)?);
        let ((t, inp), (ra, ia), (total, r)) = (l1.shape().dims2()?, l2.shape().dims2()?, l3.shape().dims2()?);
        self.check((t, inp), (ra, ia), (total, r))?;
        let mut y = self.w.forward(x, t)?;
        let scale = self.scale as f32;
        if matches!(self.w, Frozen::Served(_)) {
            // As the server adds an adapter: on its bf16 values (`as_served::stored`), row by row
            // in its order (`as_served::lora_row`), so that the values are the sampler's to the bit.
            use rayon::prelude::*;
            use tandem_model::as_served::{b_tiles, lora_down, lora_up, stored};
            let a = stored(a);
            let parts: Vec<_> = self
                .spans(r)
                .map(|(col, n, row)| (col, n, row, stored(&b_tiles(&b[col * r..(col + n) * r], r))))
                .collect();
            // Blocks of rows, each block's products in one tiled pass (the same entries).
            y.par_chunks_mut(total * 64).zip(x.par_chunks(inp * 64)).for_each(|(y, x)| {
                for (col, n, row, bt) in &parts {
                    let ax = lora_down(&a[row * inp..(row + r) * inp], r, x, scale);
                    let mut outs: Vec<&mut [f32]> = y.chunks_exact_mut(total).map(|y| &mut y[*col..col + n]).collect();
                    lora_up(&ax, bt, &mut outs);
                }
            });
        } else {
            for (col, n, row) in self.spans(r) {
                let mut xa = vec![0f32; t * r];
                let a = &a[row * inp..(row + r) * inp];
                sgemm(&mut xa, false, 1.0, Operand::new(x, t, inp), Operand::transposed(a, r, inp));
                let mut delta = vec![0f32; t * n];
                sgemm(
                    &mut delta,
                    false,
                    scale,
                    Operand::new(&xa, t, r),
                    Operand::transposed(&b[col * r..(col + n) * r], n, r),
                );
                for (y, d) in y.chunks_exact_mut(total).zip(delta.chunks_exact(n)) {
                    y[col..col + n].iter_mut().zip(d).for_each(|(y, d)| *y += d);
                }
            }
        }
        Ok((CpuStorage::F32(y), Shape::from((t, total))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        gy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let ((t, inp), (ra, _), (total, r)) = (x.dims2()?, a.dims2()?, b.dims2()?);
        let scale = self.scale as f32;
        // The operands in place (no copies of x and dy, a layer's largest buffers).
        let (x, a, b, gy) = (x.contiguous()?, a.contiguous()?, b.contiguous()?, gy.contiguous()?);
        let (xs, as_, bs, gs) =
            (x.storage_and_layout(), a.storage_and_layout(), b.storage_and_layout(), gy.storage_and_layout());
        let (x, a, b, gy) = (cpu_slice(&xs)?, cpu_slice(&as_)?, cpu_slice(&bs)?, cpu_slice(&gs)?);
        // The served path's forward computed on the adapter's bf16 values: differentiate that
        // function (the gradient passes straight through the rounding to the f32 weights).
        let rounded = matches!(self.w, Frozen::Served(_))
            .then(|| (tandem_model::as_served::stored_values(a), tandem_model::as_served::stored_values(b)));
        let (a, b) = rounded.as_ref().map_or((a, b), |(a, b)| (&a[..], &b[..]));
        let mut dx = self.w.backward(gy, t)?;
        let (mut da, mut db) = (vec![0f32; ra * inp], vec![0f32; total * r]);
        for (col, n, row) in self.spans(r) {
            // This part's columns of dy, read in place.
            let (gy_part, gy_part_t) =
                (Operand::columns(&gy[col..], t, n, total), Operand::columns_transposed(&gy[col..], t, n, total));
            let (a, b) = (&a[row * inp..(row + r) * inp], &b[col * r..(col + n) * r]);
            let mut gyb = vec![0f32; t * r];
            sgemm(&mut gyb, false, scale, gy_part, Operand::new(b, n, r));
            sgemm(&mut dx, true, 1.0, Operand::new(&gyb, t, r), Operand::new(a, r, inp));
            let da = &mut da[row * inp..(row + r) * inp];
            sgemm(da, false, 1.0, Operand::transposed(&gyb, t, r), Operand::new(x, t, inp));
            let mut xa = vec![0f32; t * r];
            sgemm(&mut xa, false, 1.0, Operand::new(x, t, inp), Operand::transposed(a, r, inp));
            sgemm(&mut db[col * r..(col + n) * r], false, scale, gy_part_t, Operand::new(&xa, t, r));
        }
        let dev = Device::Cpu;
        Ok((
            Some(Tensor::from_vec(dx, (t, inp), &dev)?),
            Some(Tensor::from_vec(da, (ra, inp), &dev)?),
            Some(Tensor::from_vec(db, (total, r), &dev)?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::{diff, randn};
    use candle_core::Var;
    use tandem_model::kernels::Q8Matrix;

    fn largest(a: &Tensor) -> f32 {
        a.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    }

    /// Three projections stacked in one op (q, k, v's case) against each one's `x W_i^T + s (x
    /// A_i^T) B_i^T` in stock candle ops (whose backward is trusted), for x, A and B: exactly
    /// with f32 products, and within the int8 roundings on the served path (whose adapter is
    /// rounded to bf16 as the server stores it).
    #[test]
    fn stacked_projections_match_stock_autograd() {
        let (t, inp, r, scale) = (37, 64, 3, 2.0);
        let parts: Arc<[usize]> = vec![32, 64, 32].into();
        let total = 128;
        let w = randn((total, inp), 1);
        let x = Var::from_tensor(&randn((t, inp), 2)).unwrap();
        let a = Var::from_tensor(&(randn((3 * r, inp), 3) * 0.2).unwrap()).unwrap();
        let b = Var::from_tensor(&randn((total, r), 4)).unwrap();
        let g = randn((t, total), 5);
        let w_values = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let q8 = Weights::Q8(Q8Matrix::from_f32(&w_values, total, inp));
        let served = Frozen::Served(Shared::Own(Arc::new(q8.clone())));
        let mut dequantized = vec![0f32; total * inp];
        for (i, row) in dequantized.chunks_exact_mut(inp).enumerate() {
            q8.dequantize_row(i, row);
        }
        let w_served = Tensor::from_vec(dequantized, (total, inp), &Device::Cpu).unwrap();
        let bf16 = |v: &Var| {
            let rounded = tandem_model::as_served::stored_values(&crate::fused::values(v.as_tensor()).unwrap());
            let values = Tensor::from_vec(rounded, v.dims(), &Device::Cpu).unwrap();
            // The rounding's gradient passes straight through: v + (rounded - v) detached.
            v.as_tensor().add(&values.sub(v.as_tensor()).unwrap().detach()).unwrap()
        };
        for (frozen, w_ref, as_stored, tol) in
            [(Frozen::F32(w.clone()), &w, false, 1e-4), (served, &w_served, true, 0.03)]
        {
            let op = LoraLinear { w: frozen, parts: parts.clone(), scale };
            let ours = x.apply_op3(a.as_tensor(), b.as_tensor(), op).unwrap();
            let grads = ours.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
            let (ar, br) =
                if as_stored { (bf16(&a), bf16(&b)) } else { (a.as_tensor().clone(), b.as_tensor().clone()) };
            let mut cols = Vec::new();
            let mut off = 0;
            for (i, &n) in parts.iter().enumerate() {
                let (ai, bi) = (ar.narrow(0, i * r, r).unwrap(), br.narrow(0, off, n).unwrap());
                let delta = x.matmul(&ai.t().unwrap()).unwrap().matmul(&bi.t().unwrap()).unwrap();
                cols.push((delta * scale).unwrap());
                off += n;
            }
            let stock = x.matmul(&w_ref.t().unwrap()).unwrap().add(&Tensor::cat(&cols, 1).unwrap()).unwrap();
            let want = stock.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
            assert!(diff(&ours, &stock) <= tol * largest(&stock), "values differ by {}", diff(&ours, &stock));
            for v in [x.as_tensor(), a.as_tensor(), b.as_tensor()] {
                let (got, want) = (grads.get(v).unwrap(), want.get(v).unwrap());
                assert!(diff(got, want) <= tol * largest(want).max(1.0), "gradient differs by {}", diff(got, want));
            }
        }
    }

    #[test]
    fn mismatched_parts_are_an_error_not_a_panic() {
        let x = randn((4, 64), 1);
        let (a, b) = (randn((2, 64), 2), randn((96, 2), 3));
        let op = LoraLinear { w: Frozen::F32(randn((96, 64), 4)), parts: vec![32, 32, 32].into(), scale: 1.0 };
        assert!(x.apply_op3(&a, &b, op).is_err());
    }
}
