//! Element-wise parts of the decoder block as single candle custom ops with written backward passes.
//!
//! Written out of stock candle ops, RMS norm, RoPE, the masked softmax and SiLU-times-up cost 5-10
//! ops each, every one a full pass over memory and a fresh allocation (on this VM fresh memory is
//! slow to touch, stack notes); the backward doubles that. Here each is one pass forward and one
//! backward over row slices, parallel over rows. The formulas (per row of n values, upstream
//! gradient g):
//!
//! - RMS norm `y = x r w`, `r = (mean(x^2) + eps)^-1/2`: `dx = r w g - x r^3 sum(x w g) / n`
//!   (the weight is frozen: no `dw`).
//! - RoPE on adjacent pairs `(a, b) -> (a c - b s, a s + b c)`: the backward rotates `g` by `-theta`.
//! - Causal attention per span (a sequence, or a prefix tree's prefix or branch): one op over the
//!   row (`SegmentAttention`), its math in `tandem_model::kernels::causal`.
//! - `act(a) * u` with `act(a) = a sig(z(a))` (SiLU: `z = a`; GELU tanh: `z = 2 sqrt(2/pi) (a +
//!   0.044715 a^3)`): `da = g u (sig + a sig (1 - sig) z')`, `du = g act(a)`.

use candle_core::{CpuStorage, CustomOp1, Device, Layout, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Arc;
use tandem_model::kernels::{self, causal};
use tandem_model::Activation;

type Res<T> = candle_core::Result<T>;

pub(crate) fn slice<'a>(storage: &'a CpuStorage, layout: &Layout) -> Res<&'a [f32]> {
    let data = storage.as_slice::<f32>()?;
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("fused op input must be contiguous".into()))?;
    Ok(&data[start..end])
}

pub(crate) fn values(t: &Tensor) -> Res<Vec<f32>> {
    t.contiguous()?.flatten_all()?.to_vec1::<f32>()
}

fn tensor(v: Vec<f32>, like: &Tensor) -> Res<Tensor> {
    Tensor::from_vec(v, like.shape(), &Device::Cpu)
}

/// RMS norm over the last dimension with a frozen weight.
pub struct RmsNorm {
    pub weight: Arc<Vec<f32>>,
    pub eps: f32,
}

impl RmsNorm {
    fn inv_rms(&self, row: &[f32]) -> f32 {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
        1.0 / (ms + self.eps).sqrt()
    }
}

impl CustomOp1 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Res<(CpuStorage, Shape)> {
        let x = slice(storage, layout)?;
        let n = self.weight.len();
        // The serving kernel, so that the values match the sampler's to the bit (`as_served`).
        let mut y = x.to_vec();
        y.par_chunks_mut(n).for_each(|y| kernels::rms_norm(y, &self.weight, self.eps));
        Ok((CpuStorage::F32(y), layout.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Res<Option<Tensor>> {
        let (x, g) = (values(arg)?, values(grad_res)?);
        let n = self.weight.len();
        let mut dx = vec![0f32; x.len()];
        dx.par_chunks_mut(n).zip(x.par_chunks(n).zip(g.par_chunks(n))).for_each(|(dx, (x, g))| {
            let r = self.inv_rms(x);
            let s: f32 = x.iter().zip(g).zip(self.weight.iter()).map(|((x, g), w)| x * w * g).sum();
            let c = r * r * r * s / n as f32;
            for (((d, x), g), w) in dx.iter_mut().zip(x).zip(g).zip(self.weight.iter()) {
                *d = r * w * g - x * c;
            }
        });
        Ok(Some(tensor(dx, arg)?))
    }
}

/// RoPE on adjacent pairs for a (T, heads * head_dim) matrix; `cos`/`sin` are (T, head_dim / 2).
#[derive(Clone)]
pub struct Rope {
    pub cos: Arc<Vec<f32>>,
    pub sin: Arc<Vec<f32>>,
    pub head_dim: usize,
}

impl Rope {
    /// Rotates every row by +theta (forward) or -theta (backward).
    fn rotate(&self, x: &[f32], width: usize, sign: f32) -> Vec<f32> {
        let half = self.head_dim / 2;
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(width).zip(x.par_chunks(width)).enumerate().for_each(|(t, (o, x))| {
            let (cos, sin) = (&self.cos[t * half..(t + 1) * half], &self.sin[t * half..(t + 1) * half]);
            for (oh, xh) in o.chunks_mut(self.head_dim).zip(x.chunks(self.head_dim)) {
                for i in 0..half {
                    let (a, b, c, s) = (xh[2 * i], xh[2 * i + 1], cos[i], sign * sin[i]);
                    oh[2 * i] = a * c - b * s;
                    oh[2 * i + 1] = a * s + b * c;
                }
            }
        });
        out
    }
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "rope"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Res<(CpuStorage, Shape)> {
        let x = slice(storage, layout)?;
        let width = layout.shape().dims()[1];
        Ok((CpuStorage::F32(self.rotate(x, width, 1.0)), layout.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Res<Option<Tensor>> {
        let g = values(grad_res)?;
        Ok(Some(tensor(self.rotate(&g, arg.dim(1)?, -1.0), arg)?))
    }
}

/// `act(a) * u` for the gate and up projections, read from their stacked product (no copies of
/// the halves): SiLU (Llama, Qwen) or GELU's tanh form (Gemma).
pub struct ActMul(pub Activation);

/// From `e = exp(-|z|)` (the kernels' polynomial, no libm call), stable for either sign.
fn sigmoid(z: f32) -> f32 {
    let e = tandem_model::kernels::exp_approx(-z.abs());
    if z >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

impl ActMul {
    /// `dz/da` of the sigmoid argument (see `kernels::act_mul`: both are `a sigmoid(z(a))`).
    fn dz(&self, a: f32) -> f32 {
        match self.0 {
            Activation::Silu => 1.0,
            Activation::GeluTanh => {
                let z = kernels::act_z(Activation::GeluTanh, a);
                // Past the clamp z is constant.
                if z.abs() >= 200.0 {
                    0.0
                } else {
                    2.0 * kernels::GELU_C * (1.0 + 3.0 * 0.044_715 * a * a)
                }
            }
        }
    }
}

impl CustomOp1 for ActMul {
    fn name(&self) -> &'static str {
        "act-mul"
    }

    /// `(T, 2F)` rows of gate then up, as the engine's stacked gate/up product gives them, to
    /// `(T, F)`.
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Res<(CpuStorage, Shape)> {
        let gu = slice(s1, l1)?;
        let (t, width) = l1.shape().dims2()?;
        if width % 2 != 0 {
            return Err(candle_core::Error::Msg(format!("act-mul needs gate and up halves, not {width} columns")));
        }
        let f = width / 2;
        // The serving kernel, row by row as the engine calls it (its vector and tail loops differ
        // in the last bit, so the split matters).
        let mut y = vec![0f32; t * f];
        y.par_chunks_mut(f.max(1)).zip(gu.par_chunks(width.max(1))).for_each(|(y, gu)| {
            y.copy_from_slice(&gu[..f]);
            kernels::act_mul(self.0, y, &gu[f..]);
        });
        Ok((CpuStorage::F32(y), Shape::from((t, f))))
    }

    /// `d(a s(z)) / da = s + a s (1 - s) dz/da`; `du = g act(a)`; the two halves of each row.
    fn bwd(&self, gu: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Res<Option<Tensor>> {
        let (guv, g) = (values(gu)?, values(grad_res)?);
        let f = gu.dims2()?.1 / 2;
        let mut dgu = vec![0f32; guv.len()];
        dgu.par_chunks_mut(2 * f).zip(guv.par_chunks(2 * f)).zip(g.par_chunks(f)).for_each(|((d, gu), g)| {
            let ((da, du), (a, u)) = (d.split_at_mut(f), gu.split_at(f));
            for i in 0..f {
                let s = sigmoid(kernels::act_z(self.0, a[i]));
                da[i] = g[i] * u[i] * (s + a[i] * s * (1.0 - s) * self.dz(a[i]));
                du[i] = g[i] * a[i] * s;
            }
        });
        Ok(Some(tensor(dgu, gu)?))
    }
}

#[cfg(test)]
mod tests;

/// The forward of [`SegmentAttention`] with `kv_as_cached`: each span as the server attends a
/// sequence of its context's rows then its own (`tandem_model::as_served`: the f16 cache, the
/// serving kernel and its head groups), so that the values are the sampler's to the bit.
fn served_attention(q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], spans: &[causal::Span], heads: causal::Heads) {
    let (qd, kvd) = (heads.n_head * heads.head_dim, heads.n_kv_head * heads.head_dim);
    for span in spans.iter().filter(|s| s.len > 0) {
        let n = span.offset() + span.len;
        let (mut ks, mut vs) = (Vec::with_capacity(n * kvd), Vec::with_capacity(n * kvd));
        for &(start, len) in span.context.iter().chain(std::iter::once(&(span.start, span.len))) {
            ks.extend_from_slice(&k[start * kvd..(start + len) * kvd]);
            vs.extend_from_slice(&v[start * kvd..(start + len) * kvd]);
        }
        let rows = span.start * qd..(span.start + span.len) * qd;
        tandem_model::as_served::attend_sequence(&heads, &q[rows.clone()], &ks, &vs, &mut out[rows]);
    }
}

/// Causal attention within each span of a packed row (a branch also over its prefix),
/// `(q (T, nh hd), k, v (T, nkv hd)) -> (T, nh hd)`, forward and backward in
/// `tandem_model::kernels::causal` (heads read in place through strides, no (heads, s, s)
/// tensors kept: the backward recomputes the probabilities).
/// With `kv_as_cached`, keys and values are rounded to f16 first, as the server caches them.
#[derive(Clone)]
pub struct SegmentAttention {
    /// Round keys and values as the server caches them (f16) before attending.
    pub kv_as_cached: bool,
    pub spans: Arc<Vec<causal::Span>>,
    pub heads: causal::Heads,
}

impl candle_core::CustomOp3 for SegmentAttention {
    fn name(&self) -> &'static str {
        "segment-attention"
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
        let (q, k, v) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let mut out = vec![0f32; q.len()];
        if self.kv_as_cached {
            served_attention(q, k, v, &mut out, &self.spans, self.heads);
        } else {
            causal::forward(q, k, v, &mut out, &self.spans, self.heads);
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Res<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (qv, gv) = (values(q)?, values(g)?);
        // The forward's rounded keys and values; their gradients pass to k and v unchanged
        // (straight through the rounding).
        let (mut kv, mut vv) = (values(k)?, values(v)?);
        if self.kv_as_cached {
            tandem_model::kv::round_as_cached(&mut kv);
            tandem_model::kv::round_as_cached(&mut vv);
        }
        let (mut dq, mut dk, mut dv) = (vec![0f32; qv.len()], vec![0f32; kv.len()], vec![0f32; vv.len()]);
        causal::backward(&qv, &kv, &vv, &gv, &mut dq, &mut dk, &mut dv, &self.spans, self.heads);
        Ok((Some(tensor(dq, q)?), Some(tensor(dk, k)?), Some(tensor(dv, v)?)))
    }
}
