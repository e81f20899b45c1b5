//! The output head's candle op with a written backward pass, where the stock ops cost too much
//! (the projections' is `crate::linear::LoraLinear`):
//!
//! - [`HeadLogprob`]: the tied output head, log-softmax and gather in one op, over row chunks:
//!   `lp_i = h_i . E[t_i] - logsumexp(h_i E^T)`. The (tokens x 49,152) logits are never kept;
//!   the backward recomputes each chunk's softmax: `dh_i = g_i (E[t_i] - softmax_i E)`. The
//!   forward also records each row's entropy (a logged metric that needs no gradient).

use crate::linear::Shared;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use std::sync::{Arc, Mutex};
use tandem_model::kernels;

/// Rows of the head processed at once: 64 x 49,152 f32 logits = 12 MB per chunk.
pub(crate) const HEAD_CHUNK: usize = 64;

fn input_tensor(storage: &CpuStorage, layout: &Layout) -> candle_core::Result<Tensor> {
    Tensor::from_slice(crate::fused::slice(storage, layout)?, layout.shape(), &Device::Cpu)
}

/// `f` on the f32 values of `t` in place (a copy only if `t` is not contiguous).
pub(crate) fn with_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(cpu) => Ok(f(crate::fused::slice(cpu, layout)?)),
        _ => Err(candle_core::Error::Msg("the trainer runs on the CPU".into())),
    }
}

/// `h (N, H) -> lp (N)`: log-probability of `targets[i]` under the head `E (V, H)`.
pub struct HeadLogprob {
    pub head: HeadWeights,
    pub targets: Vec<u32>,
    /// Filled by the forward pass: the entropy of each row's distribution (nats).
    pub entropy: Arc<Mutex<Vec<f32>>>,
    /// `Some` when a backward pass follows (training): the int8 forward also keeps each row's
    /// `E[t_i] - softmax_i E` (N x H floats), the part of `dh_i` that does not depend on the
    /// loss, so that the backward is `g_i` times it rather than a second pass over the whole
    /// vocabulary (the head is a third of a Qwen2.5 0.5B step's products). `None` for scoring
    /// passes, which would pay for the product and never use it.
    pub grad_rows: Option<Arc<Mutex<Vec<f32>>>>,
    /// Rows whose loss gradient is zero by construction (a zero weight or advantage; empty:
    /// none known): the forward keeps no factor for them (zeros). Should one get a gradient
    /// after all, the backward recomputes instead of trusting the kept factor.
    pub untrained: Vec<bool>,
}

/// The output head `E (V, H)`: f32 (exact), or the inference kernels' formats for the two big
/// products where the CPU has AVX-512 VNNI.
#[derive(Clone)]
pub enum HeadWeights {
    F32(Tensor),
    Int8(HeadInt8),
}

/// The head's transposed copy for one op call, made when first needed.
pub(crate) type Through = std::sync::OnceLock<kernels::Transposed>;

/// The head in the inference kernels' formats: `e` as served (the logits are the server's; the
/// engine's own matrix, shared), and `softmax E` of the backward through the same blocks
/// (`kernels::matmul_through`).
#[derive(Clone)]
pub struct HeadInt8 {
    pub e: Shared,
}

impl HeadInt8 {
    /// For rows `rows` of `h` (H wide): each row's logits turned in place into its softmax, and
    /// (logsumexp, entropy, logprob of the target) per row. The exponentials use the kernels'
    /// polynomial (a libm `expf` over 49,152 logits per row was ~4% of a step).
    fn softmax_rows(&self, h: &[f32], rows: usize, targets: &[u32]) -> (Vec<f32>, Vec<(f32, f32, f32)>) {
        use rayon::prelude::*;
        let v = self.e.rows();
        let mut logits = crate::linear::quantized_product(&self.e, h, rows);
        let stats = logits
            .par_chunks_exact_mut(v)
            .zip(targets.par_iter())
            .map(|(row, &t)| {
                let picked = row[t as usize];
                let (max, sum, weighted) = kernels::exp_normalize(row, 1.0);
                let lse = max + sum.ln();
                (lse, lse - weighted / sum, picked - lse)
            })
            .collect();
        (logits, stats)
    }

    /// [`HeadInt8::target_minus_expected`] for the rows `keep` of the softmax rows `p` (one per
    /// target), zeros for the others: untrained rows skip the product.
    fn factor_of_rows(&self, et: &Through, p: Vec<f32>, targets: &[u32], keep: &[usize]) -> Vec<f32> {
        let (c, hd, v) = (targets.len(), self.e.cols(), self.e.rows());
        if keep.len() == c {
            return self.target_minus_expected(et, p, c, targets);
        }
        let mut out = vec![0f32; c * hd];
        if keep.is_empty() {
            return out;
        }
        let kept: Vec<f32> = keep.iter().flat_map(|&i| p[i * v..(i + 1) * v].iter().copied()).collect();
        drop(p);
        let kept_targets: Vec<u32> = keep.iter().map(|&i| targets[i]).collect();
        let rows = self.target_minus_expected(et, kept, keep.len(), &kept_targets);
        for (row, &i) in rows.chunks_exact(hd).zip(keep) {
            out[i * hd..(i + 1) * hd].copy_from_slice(row);
        }
        out
    }

    /// `E[t_i] - p_i E` for `c` rows of probabilities `p` (each V long, consumed), as `c` rows
    /// of H: the loss-independent factor of the head's input gradient. `p E` goes through the
    /// served head's transposed int8 copy in `et`, made on first use and kept for the op's call
    /// (its chunks share it), not beyond.
    pub(crate) fn target_minus_expected(&self, et: &Through, p: Vec<f32>, c: usize, targets: &[u32]) -> Vec<f32> {
        let hd = self.e.cols();
        let mut out = et.get_or_init(|| kernels::Transposed::of(&self.e)).product(&p, c);
        drop(p);
        let mut row = vec![0f32; hd];
        for (i, o) in out.chunks_exact_mut(hd).enumerate() {
            self.e.dequantize_row(targets[i] as usize, &mut row);
            for (o, r) in o.iter_mut().zip(&row) {
                *o = r - *o;
            }
        }
        out
    }
}

/// The indices of the rows whose loss gradient is not zero, when some are zero (`None` when
/// every row has one). Such a row's input gradient is zero and it adds nothing to an adapter's,
/// so the head's backward skips its pass over the vocabulary: a Tinker datum has a target at
/// every position, and its prompt's carry advantage (or weight) 0.
pub(crate) fn nonzero_rows(g: &[f32]) -> Option<Vec<u32>> {
    let keep: Vec<u32> = (0..g.len() as u32).filter(|&i| g[i as usize] != 0.0).collect();
    (keep.len() < g.len()).then_some(keep)
}

impl HeadLogprob {
    /// (logits (c, V), their softmax, their logsumexp (c, 1)) for rows `start..start + c` of `h`.
    fn chunk(&self, h: &Tensor, start: usize, c: usize) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let logits = h.narrow(0, start, c)?.matmul(&self.f32_head()?.t()?)?;
        let max = logits.max_keepdim(1)?;
        let e = logits.broadcast_sub(&max)?.exp()?;
        let sum = e.sum_keepdim(1)?;
        let lse = max.add(&sum.log()?)?;
        Ok((logits, e.broadcast_div(&sum)?, lse))
    }

    fn target_rows(&self, start: usize, c: usize) -> candle_core::Result<Tensor> {
        let ids = Tensor::from_slice(&self.targets[start..start + c], c, &Device::Cpu)?;
        self.f32_head()?.index_select(&ids, 0)
    }

    fn f32_head(&self) -> candle_core::Result<&Tensor> {
        match &self.head {
            HeadWeights::F32(e) => Ok(e),
            HeadWeights::Int8(_) => Err(candle_core::Error::Msg("the f32 head path on an int8 head".into())),
        }
    }
}

impl CustomOp1 for HeadLogprob {
    fn name(&self) -> &'static str {
        "head-logprob"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        if let HeadWeights::Int8(int8) = &self.head {
            let h = crate::fused::slice(storage, layout)?;
            let n = layout.shape().dims()[0];
            let hd = int8.e.cols();
            let (mut lps, mut entropy) = (Vec::with_capacity(n), Vec::with_capacity(n));
            let mut grad_rows = Vec::with_capacity(if self.grad_rows.is_some() { n * hd } else { 0 });
            let et = Through::new();
            for start in (0..n).step_by(HEAD_CHUNK) {
                let c = HEAD_CHUNK.min(n - start);
                let targets = &self.targets[start..start + c];
                let (p, stats) = int8.softmax_rows(&h[start * hd..], c, targets);
                lps.extend(stats.iter().map(|s| s.2));
                entropy.extend(stats.iter().map(|s| s.1));
                if self.grad_rows.is_some() {
                    let keep: Vec<usize> =
                        (0..c).filter(|&i| !self.untrained.get(start + i).copied().unwrap_or(false)).collect();
                    grad_rows.extend(int8.factor_of_rows(&et, p, targets, &keep));
                }
            }
            if let Ok(mut slot) = self.entropy.lock() {
                *slot = entropy;
            }
            if let Some(Ok(mut slot)) = self.grad_rows.as_ref().map(|s| s.lock()) {
                *slot = grad_rows;
            }
            return Ok((CpuStorage::F32(lps), Shape::from(n)));
        }
        let h = input_tensor(storage, layout)?;
        let n = h.dim(0)?;
        let mut lps = Vec::with_capacity(n);
        let mut entropy = Vec::with_capacity(n);
        for start in (0..n).step_by(HEAD_CHUNK) {
            let c = HEAD_CHUNK.min(n - start);
            let (logits, p, lse) = self.chunk(&h, start, c)?;
            let picked =
                logits.gather(&Tensor::from_slice(&self.targets[start..start + c], (c, 1), &Device::Cpu)?, 1)?;
            lps.extend(picked.sub(&lse)?.flatten_all()?.to_vec1::<f32>()?);
            // H = lse - sum(p * logits)
            let mean_logit = p.mul(&logits)?.sum_keepdim(1)?;
            entropy.extend(lse.sub(&mean_logit)?.flatten_all()?.to_vec1::<f32>()?);
        }
        if let Ok(mut slot) = self.entropy.lock() {
            *slot = entropy;
        }
        Ok((CpuStorage::F32(lps), Shape::from(n)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let h = arg.detach();
        let n = h.dim(0)?;
        let g = grad_res.to_dtype(DType::F32)?;
        let gv = g.flatten_all()?.to_vec1::<f32>()?;
        let mut kept_factor = self.grad_rows.as_ref().is_some_and(|s| s.lock().is_ok_and(|s| !s.is_empty()));
        if kept_factor && self.untrained.iter().zip(&gv).any(|(u, g)| *u && *g != 0.0) {
            // A row kept without its factor has a gradient: recompute rather than trust it.
            if let Some(Ok(mut slot)) = self.grad_rows.as_ref().map(|s| s.lock()) {
                slot.clear();
            }
            kept_factor = false;
        }
        if !kept_factor {
            // Rows without a gradient skip their pass over the vocabulary: the same op over the
            // other rows, its gradient put back in place (zeros elsewhere).
            if let Some(keep) = nonzero_rows(&gv) {
                let hd = h.dim(1)?;
                let zeros = Tensor::zeros((n, hd), DType::F32, &Device::Cpu)?;
                if keep.is_empty() {
                    return Ok(Some(zeros));
                }
                let idx = Tensor::from_slice(&keep, keep.len(), &Device::Cpu)?;
                let sub = HeadLogprob {
                    head: self.head.clone(),
                    targets: keep.iter().map(|&i| self.targets[i as usize]).collect(),
                    entropy: Arc::new(Mutex::new(Vec::new())),
                    grad_rows: None,
                    untrained: Vec::new(),
                };
                let dh = sub.bwd(&h.index_select(&idx, 0)?, _res, &g.index_select(&idx, 0)?)?;
                return dh.map(|dh| zeros.index_add(&idx, &dh, 0)).transpose();
            }
        }
        if let HeadWeights::Int8(int8) = &self.head {
            // dh_i = g_i (E[t_i] - softmax_i E): the factor kept by the forward, or the softmax
            // recomputed (cheap in int8) rather than kept (N x V floats).
            let hd = int8.e.cols();
            let kept = self.grad_rows.as_ref().and_then(|s| s.lock().ok().map(|mut s| std::mem::take(&mut *s)));
            let rows = match kept {
                Some(rows) if rows.len() == n * hd => rows,
                _ => {
                    let hv = h.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
                    let mut rows = Vec::with_capacity(n * hd);
                    let et = Through::new();
                    for start in (0..n).step_by(HEAD_CHUNK) {
                        let c = HEAD_CHUNK.min(n - start);
                        let targets = &self.targets[start..start + c];
                        let (p, _) = int8.softmax_rows(&hv[start * hd..], c, targets);
                        rows.extend(int8.target_minus_expected(&et, p, c, targets));
                    }
                    rows
                }
            };
            let dh: Vec<f32> = rows.chunks_exact(hd).zip(&gv).flat_map(|(r, g)| r.iter().map(move |x| g * x)).collect();
            return Ok(Some(Tensor::from_vec(dh, (n, hd), &Device::Cpu)?));
        }
        let mut parts = Vec::new();
        for start in (0..n).step_by(HEAD_CHUNK) {
            let c = HEAD_CHUNK.min(n - start);
            let (_, p, _) = self.chunk(&h, start, c)?;
            let expected = p.matmul(self.f32_head()?)?;
            let dh =
                self.target_rows(start, c)?.sub(&expected)?.broadcast_mul(&g.narrow(0, start, c)?.unsqueeze(1)?)?;
            parts.push(dh);
        }
        Ok(Some(Tensor::cat(&parts, 0)?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::Var;

    pub(crate) fn randn(shape: (usize, usize), seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let v: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.random_range(-1.0..1.0)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    /// The largest absolute difference between two tensors.
    pub(crate) fn diff(a: &Tensor, b: &Tensor) -> f32 {
        a.sub(b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    }

    /// 0 at every third row, 1 elsewhere: loss coefficients with rows that get no gradient.
    fn skip_every_third(n: usize) -> Tensor {
        let mask: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { 0.0 } else { 1.0 }).collect();
        Tensor::from_vec(mask, n, &Device::Cpu).unwrap()
    }

    /// Both ops against the same computation in stock candle ops (whose backward is trusted).
    #[test]
    fn custom_ops_match_stock_autograd() {
        let w = randn((5, 3), 1);
        let head = randn((70, 5), 2);
        // 67 rows: more than one HEAD_CHUNK.
        let x = Var::from_tensor(&randn((67, 3), 3)).unwrap();
        let targets: Vec<u32> = (0..67).map(|i| (i * 7 % 70) as u32).collect();
        // Every third row without a gradient (a prompt position's): the backward skips them.
        let coef = randn((67, 1), 4).flatten_all().unwrap().mul(&skip_every_third(67)).unwrap();

        let entropy = Arc::new(Mutex::new(Vec::new()));
        let h = x.matmul(&w.t().unwrap()).unwrap();
        let lp = h
            .apply_op1(HeadLogprob {
                head: HeadWeights::F32(head.clone()),
                targets: targets.clone(),
                entropy: entropy.clone(),
                grad_rows: None,
                untrained: Vec::new(),
            })
            .unwrap();
        let ours = lp.mul(&coef).unwrap().sum_all().unwrap();
        let g_ours = ours.backward().unwrap().get(&x).unwrap().clone();

        let h = x.matmul(&w.t().unwrap()).unwrap();
        let logits = h.matmul(&head.t().unwrap()).unwrap();
        let logp = candle_nn::ops::log_softmax(&logits, 1).unwrap();
        let ids = Tensor::from_slice(&targets, (67, 1), &Device::Cpu).unwrap();
        let lp_ref = logp.gather(&ids, 1).unwrap().flatten_all().unwrap();
        let stock = lp_ref.mul(&coef).unwrap().sum_all().unwrap();
        let g_stock = stock.backward().unwrap().get(&x).unwrap().clone();

        let diff =
            |a: &Tensor, b: &Tensor| a.sub(b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff(&lp, &lp_ref) < 1e-4);
        assert!(diff(&g_ours, &g_stock) < 1e-4, "gradient differs by {}", diff(&g_ours, &g_stock));
        let p = logp.exp().unwrap();
        let ent_ref = p.mul(&logp).unwrap().sum(1).unwrap().neg().unwrap().to_vec1::<f32>().unwrap();
        for (a, b) in entropy.lock().unwrap().iter().zip(ent_ref) {
            assert!((a - b).abs() < 1e-4);
        }
    }

    /// The int8 head's backward from the factor its forward kept equals the recomputing one bit
    /// for bit, and is what the backward used (the slot is emptied).
    #[test]
    fn int8_head_keeps_its_gradient_factor_exactly() {
        let (v, hd, n) = (70, 64, 67);
        let head = randn((v, hd), 8).flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let int8 =
            HeadInt8 { e: Shared::Own(Arc::new(kernels::Weights::Q8(kernels::Q8Matrix::from_f32(&head, v, hd)))) };
        let x = Var::from_tensor(&randn((n, hd), 9)).unwrap();
        let targets: Vec<u32> = (0..n).map(|i| (i * 11 % v) as u32).collect();
        // The recomputing backward skips the rows without a gradient; the kept factor has them all.
        let coef = randn((n, 1), 10).flatten_all().unwrap().mul(&skip_every_third(n)).unwrap();
        let run = |grad_rows: Option<Arc<Mutex<Vec<f32>>>>, untrained: Vec<bool>, coef: &Tensor| {
            let op = HeadLogprob {
                head: HeadWeights::Int8(int8.clone()),
                targets: targets.clone(),
                entropy: Arc::new(Mutex::new(Vec::new())),
                grad_rows,
                untrained,
            };
            let lp = x.apply_op1(op).unwrap();
            let g = lp.mul(coef).unwrap().sum_all().unwrap().backward().unwrap();
            (lp.to_vec1::<f32>().unwrap(), g.get(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap())
        };
        let slot = Arc::new(Mutex::new(Vec::new()));
        let (lp_kept, g_kept) = run(Some(slot.clone()), Vec::new(), &coef);
        let (lp_again, g_again) = run(None, Vec::new(), &coef);
        assert_eq!(lp_kept, lp_again);
        assert_eq!(g_kept, g_again);
        assert!(slot.lock().unwrap().is_empty(), "the backward took the kept factor");
        // Rows marked untrained (those with coefficient 0) keep no factor: the same gradient.
        let untrained: Vec<bool> = (0..n).map(|i| i % 3 == 0).collect();
        let (_, g_marked) = run(Some(slot.clone()), untrained.clone(), &coef);
        assert_eq!(g_marked, g_again);
        // Marked wrongly (a marked row has a gradient): recomputed, still the same gradient.
        let all = randn((n, 1), 11).flatten_all().unwrap();
        assert_eq!(run(Some(slot.clone()), untrained, &all).1, run(None, Vec::new(), &all).1);
        // And both are the head's gradient, up to int8 rounding.
        let h = Tensor::from_vec(head.clone(), (v, hd), &Device::Cpu).unwrap();
        let logp = candle_nn::ops::log_softmax(&x.matmul(&h.t().unwrap()).unwrap(), 1).unwrap();
        let ids = Tensor::from_slice(&targets, (n, 1), &Device::Cpu).unwrap();
        let exact = logp.gather(&ids, 1).unwrap().flatten_all().unwrap().mul(&coef).unwrap().sum_all().unwrap();
        let g_exact = exact.backward().unwrap().get(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let scale = g_exact.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = g_kept.iter().zip(&g_exact).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst < 0.05 * scale, "int8 gradient off by {worst} (largest {scale})");
    }
}
