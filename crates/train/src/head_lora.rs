//! The output head with an adapter on it (Tinker's `train_unembed`): `lp_i = log softmax(h_i E^T
//! + u_i B^T)[t_i]` with `u = scale · h A^T` computed before the op ([`LoraDown`], so A's gradient
//! and the rest of h's flow through it), `B (V, r)` the adapter's vocabulary-wide half.
//!
//! As [`crate::ops::HeadLogprob`], the (tokens x V) logits are never kept: each chunk of rows is
//! computed, reduced to its logprobs and entropies, and dropped; the backward recomputes each
//! chunk's softmax `p` and, with `G_i = g_i (onehot(t_i) - p_i)`, gives
//! `dh = G E`, `du = G B` and `dB = G^T u`, the last summed over the chunks (V x r).

use crate::fused::values;
use crate::ops::{nonzero_rows, with_values, HeadWeights, Through, HEAD_CHUNK};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Device, Layout, Shape, Tensor};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};
use tandem_model::kernels;
use tandem_model::kernels::sgemm::{sgemm, Operand};

type Res<T> = candle_core::Result<T>;

/// `(h (N, H), A (r, H)) -> u = scale · h A^T (N, r)`, each entry the adapter kernels' dot times the
/// scale, as the server computes a pair's first product (`as_served::lora_down`); the backward is
/// `dh = scale · g A`, `dA = scale · g^T h`.
pub struct LoraDown {
    pub scale: f64,
    /// On the adapter's bf16 values, as the server holds them (`as_served::stored`): with the
    /// served head; the exact head keeps f32 (finite-difference checks).
    pub as_stored: bool,
}

impl CustomOp2 for LoraDown {
    fn name(&self) -> &'static str {
        "lora-down"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Res<(CpuStorage, Shape)> {
        let (h, a) = (crate::fused::slice(s1, l1)?, crate::fused::slice(s2, l2)?);
        let ((n, hd), (r, ha)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        if ha != hd {
            return Err(candle_core::Error::Msg(format!("lora-down shapes: h {n}x{hd}, A {r}x{ha}")));
        }
        let scale = self.scale as f32;
        let mut u = vec![0f32; n * r];
        let a16 = self.as_stored.then(|| tandem_model::as_served::stored(a));
        u.par_chunks_mut(r.max(1) * 64).zip(h.par_chunks(hd.max(1) * 64)).for_each(|(u, h)| {
            u.copy_from_slice(&match &a16 {
                Some(a) => tandem_model::as_served::lora_down(a, r, h, scale),
                None => tandem_model::as_served::lora_down(a, r, h, scale),
            });
        });
        Ok((CpuStorage::F32(u), Shape::from((n, r))))
    }

    fn bwd(&self, h: &Tensor, a: &Tensor, _res: &Tensor, g: &Tensor) -> Res<(Option<Tensor>, Option<Tensor>)> {
        let stored;
        let a = if self.as_stored {
            let v = tandem_model::as_served::stored_values(&values(a)?);
            stored = Tensor::from_vec(v, a.dims2()?, &Device::Cpu)?;
            &stored
        } else {
            a
        };
        let dh = (g.matmul(a)? * self.scale)?;
        let da = (g.t()?.matmul(h)? * self.scale)?;
        Ok((Some(dh), Some(da)))
    }
}

/// A row's (entropy, logprob of its target).
type RowStats = (f32, f32);

/// `(h (N, H), u (N, r), B (V, r)) -> lp (N)`: the log-probability of `targets[i]` under the head
/// `E` plus the adapter's `u B^T`.
pub struct HeadLoraLogprob {
    pub head: HeadWeights,
    pub targets: Vec<u32>,
    /// Filled by the forward pass: the entropy of each row's distribution (nats).
    pub entropy: Arc<Mutex<Vec<f32>>>,
}

/// The operands' shapes: rows, hidden width, rank, vocabulary.
#[derive(Clone, Copy)]
struct Dims {
    n: usize,
    hd: usize,
    r: usize,
    v: usize,
}

impl HeadLoraLogprob {
    /// Rows `start..start + c`: their softmax (c x V) and, per row, (entropy, logprob of the
    /// target); `bt` is B as the forward reads it, made once per op call.
    fn softmax(
        &self,
        h: &[f32],
        u: &[f32],
        bt: &Bt,
        d: Dims,
        start: usize,
        c: usize,
    ) -> Res<(Vec<f32>, Vec<RowStats>)> {
        let mut logits = base_logits(&self.head, &h[start * d.hd..(start + c) * d.hd], c, d)?;
        // `u B^T` added rank by rank, as the server adds the pair (`as_served::lora_up`), so that
        // the logprobs are the sampler's to the bit.
        let rows = logits.par_chunks_exact_mut(d.v).zip(u[start * d.r..(start + c) * d.r].par_chunks_exact(d.r));
        match bt {
            Bt::Stored(bt) => rows.for_each(|(row, u)| tandem_model::as_served::lora_up(u, bt, &mut [row])),
            Bt::Exact(bt) => rows.for_each(|(row, u)| tandem_model::as_served::lora_up(u, bt, &mut [row])),
        }
        let targets = &self.targets[start..start + c];
        let stats = logits
            .par_chunks_exact_mut(d.v)
            .zip(targets.par_iter())
            .map(|(row, &t)| {
                let picked = row[t as usize];
                let (max, sum, weighted) = kernels::exp_normalize(row, 1.0);
                let lse = max + sum.ln();
                (lse - weighted / sum, picked - lse)
            })
            .collect();
        Ok((logits, stats))
    }

    fn dims(&self, l1: &Layout, l2: &Layout, l3: &Layout) -> Res<Dims> {
        let ((n, hd), (nu, r), (v, rb)) = (l1.shape().dims2()?, l2.shape().dims2()?, l3.shape().dims2()?);
        if nu != n || rb != r || self.targets.len() != n {
            return Err(candle_core::Error::Msg(format!(
                "head adapter shapes: h {n}x{hd}, u {nu}x{r}, B {v}x{rb}, {} targets",
                self.targets.len()
            )));
        }
        Ok(Dims { n, hd, r, v })
    }
}

/// B in tiles of outputs (`as_served::b_tiles`) as the forward adds it: in bf16 with the served head,
/// as the server holds an adapter (`as_served::stored`), in f32 with the exact one.
enum Bt {
    Stored(Vec<tandem_model::kernels::Bf16>),
    Exact(Vec<f32>),
}

impl Bt {
    fn new(head: &HeadWeights, b: &[f32], r: usize) -> Bt {
        let bt = tandem_model::as_served::b_tiles(b, r);
        match head {
            HeadWeights::Int8(_) => Bt::Stored(tandem_model::as_served::stored(&bt)),
            HeadWeights::F32(_) => Bt::Exact(bt),
        }
    }
}

/// `h (c, H) E^T` as (c, V) f32: the exact product, or the served int8 one.
fn base_logits(head: &HeadWeights, h: &[f32], c: usize, d: Dims) -> Res<Vec<f32>> {
    match head {
        HeadWeights::F32(e) => with_values(e, |e| {
            let mut out = vec![0f32; c * d.v];
            sgemm(&mut out, false, 1.0, Operand::new(h, c, d.hd), Operand::transposed(e, d.v, d.hd));
            out
        }),
        HeadWeights::Int8(int8) => Ok(crate::linear::quantized_product(&int8.e, h, c)),
    }
}

/// `E[t_i] - p_i E` for `c` rows of probabilities `p` (consumed), as `c` rows of H.
fn target_minus_expected(
    head: &HeadWeights,
    et: &Through,
    p: Vec<f32>,
    c: usize,
    targets: &[u32],
    d: Dims,
) -> Res<Vec<f32>> {
    match head {
        HeadWeights::F32(e) => with_values(e, |e| {
            let mut out = vec![0f32; c * d.hd];
            sgemm(&mut out, false, 1.0, Operand::new(&p, c, d.v), Operand::new(e, d.v, d.hd));
            for (row, &t) in out.chunks_exact_mut(d.hd).zip(targets) {
                for (o, w) in row.iter_mut().zip(&e[t as usize * d.hd..(t as usize + 1) * d.hd]) {
                    *o = w - *o;
                }
            }
            out
        }),
        HeadWeights::Int8(int8) => Ok(int8.target_minus_expected(et, p, c, targets)),
    }
}

impl CustomOp3 for HeadLoraLogprob {
    fn name(&self) -> &'static str {
        "head-lora-logprob"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Res<(CpuStorage, Shape)> {
        let d = self.dims(l1, l2, l3)?;
        let (h, u, b) = (crate::fused::slice(s1, l1)?, crate::fused::slice(s2, l2)?, crate::fused::slice(s3, l3)?);
        let (mut lps, mut entropy) = (Vec::with_capacity(d.n), Vec::with_capacity(d.n));
        let bt = Bt::new(&self.head, b, d.r);
        for start in (0..d.n).step_by(HEAD_CHUNK) {
            let c = HEAD_CHUNK.min(d.n - start);
            let (_, stats) = self.softmax(h, u, &bt, d, start, c)?;
            entropy.extend(stats.iter().map(|s| s.0));
            lps.extend(stats.iter().map(|s| s.1));
        }
        if let Ok(mut slot) = self.entropy.lock() {
            *slot = entropy;
        }
        Ok((CpuStorage::F32(lps), Shape::from(d.n)))
    }

    fn bwd(
        &self,
        h: &Tensor,
        u: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Res<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let ((n, hd), (_, r), (v, _)) = (h.dims2()?, u.dims2()?, b.dims2()?);
        let g = values(&grad_res.to_dtype(candle_core::DType::F32)?)?;
        if let Some(keep) = nonzero_rows(&g) {
            // Rows without a gradient skip their pass over the vocabulary: the same op over the
            // other rows, their gradients put back in place (zeros elsewhere; B's is a sum).
            let dev = Device::Cpu;
            if keep.is_empty() {
                let zeros = |shape: (usize, usize)| Tensor::zeros(shape, candle_core::DType::F32, &dev);
                return Ok((Some(zeros((n, hd))?), Some(zeros((n, r))?), Some(zeros((v, r))?)));
            }
            let idx = Tensor::from_slice(&keep, keep.len(), &dev)?;
            let sub = HeadLoraLogprob {
                head: self.head.clone(),
                targets: keep.iter().map(|&i| self.targets[i as usize]).collect(),
                entropy: Arc::new(Mutex::new(Vec::new())),
            };
            let grad = Tensor::from_vec(keep.iter().map(|&i| g[i as usize]).collect::<Vec<_>>(), keep.len(), &dev)?;
            let (dh, du, db) = sub.bwd(&h.index_select(&idx, 0)?, &u.index_select(&idx, 0)?, b, _res, &grad)?;
            let put = |d: Option<Tensor>, width: usize| -> Res<Option<Tensor>> {
                d.map(|d| Tensor::zeros((n, width), candle_core::DType::F32, &dev)?.index_add(&idx, &d, 0)).transpose()
            };
            return Ok((put(dh, hd)?, put(du, r)?, db));
        }
        let d = Dims { n, hd, r, v };
        let (hv, uv, mut bv) = (values(h)?, values(u)?, values(b)?);
        let (mut dh, mut du, mut db) = (vec![0f32; n * hd], vec![0f32; n * r], vec![0f32; v * r]);
        let bt = Bt::new(&self.head, &bv, r);
        let et = Through::new();
        if matches!(bt, Bt::Stored(_)) {
            // The forward's B: its gradients are those of the function computed (straight through
            // the rounding to the f32 weights).
            bv = tandem_model::as_served::stored_values(&bv);
        }
        for start in (0..n).step_by(HEAD_CHUNK) {
            let c = HEAD_CHUNK.min(n - start);
            let targets = &self.targets[start..start + c];
            let gs = &g[start..start + c];
            let (p, _) = self.softmax(&hv, &uv, &bt, d, start, c)?;
            // du_i = g_i (B[t_i] - p_i B)
            let mut pb = vec![0f32; c * r];
            sgemm(&mut pb, false, 1.0, Operand::new(&p, c, v), Operand::new(&bv, v, r));
            for (i, (&t, &gi)) in targets.iter().zip(gs).enumerate() {
                let row = &mut du[(start + i) * r..(start + i + 1) * r];
                for ((o, bt), e) in row.iter_mut().zip(&bv[t as usize * r..(t as usize + 1) * r]).zip(&pb[i * r..]) {
                    *o = gi * (bt - e);
                }
            }
            // dB = sum_i g_i (onehot(t_i) - p_i)^T u_i: the softmax part as one product with the
            // rows of u scaled by -g_i (c x r, not the c x V softmax), then each target's row.
            let uc = &uv[start * r..(start + c) * r];
            let scaled: Vec<f32> =
                uc.chunks_exact(r).zip(gs).flat_map(|(row, gi)| row.iter().map(move |x| -gi * x)).collect();
            sgemm(&mut db, true, 1.0, Operand::transposed(&p, c, v), Operand::new(&scaled, c, r));
            for (i, (&t, &gi)) in targets.iter().zip(gs).enumerate() {
                for (o, x) in db[t as usize * r..(t as usize + 1) * r].iter_mut().zip(&uc[i * r..(i + 1) * r]) {
                    *o += gi * x;
                }
            }
            // dh_i = g_i (E[t_i] - p_i E), last: it consumes the softmax.
            let rows = target_minus_expected(&self.head, &et, p, c, targets, d)?;
            for (i, gi) in gs.iter().enumerate() {
                for (o, x) in dh[(start + i) * hd..(start + i + 1) * hd].iter_mut().zip(&rows[i * hd..(i + 1) * hd]) {
                    *o = gi * x;
                }
            }
        }
        let dev = Device::Cpu;
        Ok((
            Some(Tensor::from_vec(dh, (n, hd), &dev)?),
            Some(Tensor::from_vec(du, (n, r), &dev)?),
            Some(Tensor::from_vec(db, (v, r), &dev)?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::Shared;
    use crate::ops::tests::{diff, randn};
    use crate::ops::HeadInt8;
    use candle_core::Var;
    use tandem_model::kernels::{Q8Matrix, Weights};

    /// The op's logprobs, entropies and gradients for x, A and B against the same computation in
    /// stock candle ops (whose backward is trusted), with an exact head and the int8 one.
    #[test]
    fn head_with_an_adapter_matches_stock_autograd() {
        let (n, hd, v, r, scale) = (67, 64, 70, 3, 2.0);
        let head = randn((v, hd), 1);
        let head_values = head.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let x = Var::from_tensor(&randn((n, hd), 2)).unwrap();
        let a = Var::from_tensor(&(randn((r, hd), 3) * 0.2).unwrap()).unwrap();
        let b = Var::from_tensor(&randn((v, r), 4)).unwrap();
        let targets: Vec<u32> = (0..n).map(|i| (i * 7 % v) as u32).collect();
        // Every third row without a gradient (a prompt position's): the backward skips them.
        let mask: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { 0.0 } else { 1.0 }).collect();
        let coef =
            randn((n, 1), 5).flatten_all().unwrap().mul(&Tensor::new(mask.as_slice(), &Device::Cpu).unwrap()).unwrap();

        let logits = x
            .matmul(&head.t().unwrap())
            .unwrap()
            .add(&(x.matmul(&a.t().unwrap()).unwrap().matmul(&b.t().unwrap()).unwrap() * scale).unwrap())
            .unwrap();
        let logp = candle_nn::ops::log_softmax(&logits, 1).unwrap();
        let ids = Tensor::from_slice(&targets, (n, 1), &Device::Cpu).unwrap();
        let lp_ref = logp.gather(&ids, 1).unwrap().flatten_all().unwrap();
        let g_ref = lp_ref.mul(&coef).unwrap().sum_all().unwrap().backward().unwrap();
        let ent_ref = logp.exp().unwrap().mul(&logp).unwrap().sum(1).unwrap().neg().unwrap();

        let int8 = HeadInt8 { e: Shared::Own(Arc::new(Weights::Q8(Q8Matrix::from_f32(&head_values, v, hd)))) };
        // Exact: float rounding only. Int8: the served head's rounding (a few percent).
        for (weights, tol) in [(HeadWeights::F32(head.clone()), 1e-3), (HeadWeights::Int8(int8), 0.05)] {
            let entropy = Arc::new(Mutex::new(Vec::new()));
            let u = (x.matmul(&a.t().unwrap()).unwrap() * scale).unwrap();
            let op = HeadLoraLogprob { head: weights, targets: targets.clone(), entropy: entropy.clone() };
            let lp = x.as_tensor().apply_op3(&u, b.as_tensor(), op).unwrap();
            let g = lp.mul(&coef).unwrap().sum_all().unwrap().backward().unwrap();
            let largest = |t: &Tensor| t.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff(&lp, &lp_ref) < tol * largest(&lp_ref), "logprobs differ by {}", diff(&lp, &lp_ref));
            for (name, var) in [("x", x.as_tensor()), ("A", a.as_tensor()), ("B", b.as_tensor())] {
                let (got, want) = (g.get(var).unwrap(), g_ref.get(var).unwrap());
                assert!(
                    diff(got, want) < tol * largest(want),
                    "d{name} differs by {} (largest {})",
                    diff(got, want),
                    largest(want)
                );
            }
            let ent = Tensor::new(entropy.lock().unwrap().as_slice(), &Device::Cpu).unwrap();
            assert!(diff(&ent, &ent_ref) < tol * largest(&ent_ref));
        }
    }
}
