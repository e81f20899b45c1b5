//! AdamW whose state can be written out and read back.
//!
//! candle_nn's `AdamW` keeps its moments private, so a job's optimizer could not outlive the
//! thread that made it: a parked job (`held.rs`) and a saved training state (Tinker's
//! `save_weights` with optimizer) need them. This is the same update in the same order of
//! operations (PyTorch's AdamW with bias correction, decoupled weight decay), so a step is
//! bit-identical to candle's (`matches_candle_bit_for_bit`).

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

/// The optimizer's settings; `lr` may change between steps (schedules, per-step rates).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamParams {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// A parameter with its first and second moments.
struct Slot {
    var: Var,
    m: Var,
    v: Var,
}

pub struct AdamW {
    slots: Vec<Slot>,
    /// Steps taken: the bias corrections' exponent.
    step_t: usize,
    pub params: AdamParams,
}

impl AdamW {
    /// Fresh moments (zeros) for `vars`.
    pub fn new(vars: Vec<Var>, params: AdamParams) -> Result<Self> {
        let slots = vars
            .into_iter()
            .map(|var| {
                let zeros = || Var::zeros(var.shape(), var.dtype(), var.device());
                Ok(Slot { m: zeros()?, v: zeros()?, var })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AdamW { slots, step_t: 0, params })
    }

    /// Moments read back (`state`'s output), one `(m, v)` per var in the same order.
    pub fn restore(vars: Vec<Var>, moments: Vec<(Tensor, Tensor)>, step_t: usize, params: AdamParams) -> Result<Self> {
        if vars.len() != moments.len() {
            candle_core::bail!("{} optimizer moments for {} parameters", moments.len(), vars.len());
        }
        let mut slots = Vec::with_capacity(vars.len());
        for (var, (m, v)) in vars.into_iter().zip(moments) {
            if m.dims() != var.dims() || v.dims() != var.dims() {
                candle_core::bail!(
                    "optimizer moments of shape {:?} for a parameter of shape {:?}",
                    m.dims(),
                    var.dims()
                );
            }
            slots.push(Slot { var, m: Var::from_tensor(&m)?, v: Var::from_tensor(&v)? });
        }
        Ok(AdamW { slots, step_t, params })
    }

    pub fn step_t(&self) -> usize {
        self.step_t
    }

    /// The moments, one `(m, v)` per var in construction order.
    pub fn moments(&self) -> Vec<(Tensor, Tensor)> {
        self.slots.iter().map(|s| (s.m.as_tensor().clone(), s.v.as_tensor().clone())).collect()
    }

    pub fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr;
    }

    /// One update of every var that has a gradient in `grads`.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step_t += 1;
        let AdamParams { lr, beta1, beta2, eps, weight_decay } = self.params;
        let scale_m = 1f64 / (1f64 - beta1.powi(self.step_t as i32));
        let scale_v = 1f64 / (1f64 - beta2.powi(self.step_t as i32));
        for s in &self.slots {
            let Some(g) = grads.get(s.var.as_tensor()) else { continue };
            let next_m = ((s.m.as_tensor() * beta1)? + (g * (1.0 - beta1))?)?;
            let next_v = ((s.v.as_tensor() * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
            let m_hat = (&next_m * scale_m)?;
            let v_hat = (&next_v * scale_v)?;
            let decayed = (s.var.as_tensor() * (1f64 - lr * weight_decay))?;
            let update = (m_hat / (v_hat.sqrt()? + eps)?)?;
            let next = (decayed - (update * lr)?)?;
            s.m.set(&next_m)?;
            s.v.set(&next_v)?;
            s.var.set(&next)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use candle_nn::Optimizer;

    fn params(weight_decay: f64) -> AdamParams {
        AdamParams { lr: 0.1, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay }
    }

    /// One step by hand: m = 0.1 g, v = 0.01 g^2, m_hat = g, v_hat = g^2, so the update is
    /// lr * g / (|g| + eps) = lr * sign(g), after decaying theta by lr * wd.
    #[test]
    fn the_first_step_moves_each_weight_by_the_learning_rate() {
        let x = Var::from_vec(vec![1.0f32, -2.0, 0.5], 3, &Device::Cpu).unwrap();
        let loss =
            (x.as_tensor() * Tensor::new(&[3.0f32, -0.5, 0.0], &Device::Cpu).unwrap()).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let mut opt = AdamW::new(vec![x.clone()], params(0.5)).unwrap();
        opt.step(&grads).unwrap();
        let got: Vec<f32> = x.as_tensor().to_vec1().unwrap();
        // theta * (1 - 0.05) - 0.1 * sign(g); a zero gradient moves only by the decay.
        let want = [1.0 * 0.95 - 0.1, -2.0 * 0.95 + 0.1, 0.5 * 0.95];
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        assert_eq!(opt.step_t(), 1);
        let (m, v) = &opt.moments()[0];
        let m: Vec<f32> = m.to_vec1().unwrap();
        assert!((m[0] - 0.3).abs() < 1e-7 && (m[1] + 0.05).abs() < 1e-8 && m[2] == 0.0, "{m:?}");
        let v: Vec<f32> = v.to_vec1().unwrap();
        assert!((v[0] - 0.09).abs() < 1e-7 && (v[1] - 0.0025).abs() < 1e-8 && v[2] == 0.0, "{v:?}");
    }

    fn run(steps: usize, restore_at: Option<usize>) -> Vec<f32> {
        let dev = Device::Cpu;
        let mut x = Var::from_vec(vec![0.3f32, -1.2, 2.0, 0.7], (2, 2), &dev).unwrap();
        let mut opt = AdamW::new(vec![x.clone()], params(0.1)).unwrap();
        for i in 0..steps {
            if restore_at == Some(i) {
                // As a parked job: weights and moments are copied out, everything is dropped,
                // and training goes on with fresh vars made from the copies.
                let w = x.as_tensor().copy().unwrap();
                let moments = opt.moments().into_iter().map(|(m, v)| (m.copy().unwrap(), v.copy().unwrap())).collect();
                let (t, p) = (opt.step_t(), opt.params);
                drop(opt);
                x = Var::from_tensor(&w).unwrap();
                opt = AdamW::restore(vec![x.clone()], moments, t, p).unwrap();
            }
            let loss = x.as_tensor().sqr().unwrap().sum_all().unwrap();
            opt.step(&loss.backward().unwrap()).unwrap();
        }
        x.as_tensor().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn matches_candle_bit_for_bit_and_survives_a_restore() {
        let dev = Device::Cpu;
        let x = Var::from_vec(vec![0.3f32, -1.2, 2.0, 0.7], (2, 2), &dev).unwrap();
        let p = params(0.1);
        let cp = candle_nn::ParamsAdamW { lr: p.lr, beta1: p.beta1, beta2: p.beta2, eps: p.eps, weight_decay: 0.1 };
        let mut theirs = candle_nn::AdamW::new(vec![x.clone()], cp).unwrap();
        for _ in 0..5 {
            let loss = x.as_tensor().sqr().unwrap().sum_all().unwrap();
            theirs.step(&loss.backward().unwrap()).unwrap();
        }
        let want: Vec<f32> = x.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(run(5, None), want);
        assert_eq!(run(5, Some(3)), want);
    }

    #[test]
    fn moments_of_the_wrong_shape_are_refused() {
        let x = Var::zeros(3, candle_core::DType::F32, &Device::Cpu).unwrap();
        let bad = Tensor::zeros(2, candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(AdamW::restore(vec![x.clone()], vec![(bad.clone(), bad)], 1, params(0.0)).is_err());
        assert!(AdamW::restore(vec![x], vec![], 1, params(0.0)).is_err());
    }
}
