//! A training run's state between its steps: the adapter and its optimizer, in memory or parked
//! in a file.
//!
//! A worker holds at most `--max-training-runs` runs in memory; a run of another entity beyond
//! them gets its turn by parking one that waits (the worker calls [`Park::park`] at the run's
//! step boundary and [`Park::unpark`] when its turn comes back). Parking writes the adapter's
//! A and B, the AdamW moments and the step count to one safetensors file and drops them, so a
//! parked run holds only its packed rows. The same state, written with [`Held::save`], is a
//! training state to resume from.

use crate::adamw::{AdamParams, AdamW};
use crate::net::Lora;
use candle_core::{DType, Device, Tensor, Var};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tandem_jobs::{Park, TrainError};
use tandem_model::peft::AdapterConfig;

/// The adapter and optimizer in memory.
pub struct Live {
    pub lora: Lora,
    pub opt: AdamW,
}

pub struct Held {
    config: AdapterConfig,
    params: AdamParams,
    live: Option<Live>,
    /// Where the state is while parked.
    parked: Option<PathBuf>,
}

impl Held {
    /// A run starting from `lora` with fresh optimizer moments.
    pub fn new(lora: Lora, params: AdamParams) -> candle_core::Result<Self> {
        let opt = AdamW::new(lora.vars(), params)?;
        Ok(Held { config: lora.config.clone(), params, live: Some(Live { lora, opt }), parked: None })
    }

    /// The adapter and optimizer; an error while parked (a trainer bug: it computes only
    /// between `unpark` and the next `park`).
    pub fn live(&mut self) -> Result<&mut Live, TrainError> {
        self.live.as_mut().ok_or_else(|| TrainError::Failed("the run's training state is parked".into()))
    }

    /// Writes the whole state to `path` (one safetensors file).
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let live = self.live.as_ref().ok_or("the run's training state is parked")?;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for (l, layer) in live.lora.pairs.iter().enumerate() {
            for (m, (a, b)) in layer.iter().enumerate() {
                tensors.insert(format!("lora.{l}.{m}.a"), a.as_tensor().clone());
                tensors.insert(format!("lora.{l}.{m}.b"), b.as_tensor().clone());
            }
        }
        if let Some((a, b)) = &live.lora.head {
            tensors.insert("lora.head.a".into(), a.as_tensor().clone());
            tensors.insert("lora.head.b".into(), b.as_tensor().clone());
        }
        for (i, (m, v)) in live.opt.moments().into_iter().enumerate() {
            tensors.insert(format!("adam.{i}.m"), m);
            tensors.insert(format!("adam.{i}.v"), v);
        }
        let step = Tensor::new(&[live.opt.step_t() as u32], &Device::Cpu).map_err(|e| e.to_string())?;
        tensors.insert("adam.step".into(), step);
        candle_core::safetensors::save(&tensors, path).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Reads a state [`Held::save`] wrote: the adapter has `config`'s rank and scale.
    pub fn load(path: &Path, config: AdapterConfig, params: AdamParams) -> Result<Self, String> {
        let mut t = candle_core::safetensors::load(path, &Device::Cpu)
            .map_err(|e| format!("reading the training state {}: {e}", path.display()))?;
        let take = |t: &mut HashMap<String, Tensor>, name: &str| {
            t.remove(name).ok_or_else(|| format!("the training state has no {name}"))
        };
        let step: Vec<u32> = take(&mut t, "adam.step")?.to_vec1().map_err(|e| e.to_string())?;
        let step_t = *step.first().ok_or("the training state's step is empty")? as usize;
        let var = |t: Tensor| -> Result<Var, String> {
            if t.dtype() != DType::F32 || t.rank() != 2 {
                return Err(format!("the training state holds a {:?} tensor of shape {:?}", t.dtype(), t.dims()));
            }
            Var::from_tensor(&t).map_err(|e| e.to_string())
        };
        // Layers until the first one the file lacks.
        let mut pairs = Vec::new();
        while t.contains_key(&format!("lora.{}.0.a", pairs.len())) {
            let l = pairs.len();
            let layer = (0..7)
                .map(|m| {
                    Ok((
                        var(take(&mut t, &format!("lora.{l}.{m}.a"))?)?,
                        var(take(&mut t, &format!("lora.{l}.{m}.b"))?)?,
                    ))
                })
                .collect::<Result<Vec<_>, String>>()?;
            pairs.push(<[(Var, Var); 7]>::try_from(layer).map_err(|_| "an adapter layer needs seven pairs")?);
        }
        let head = match (t.remove("lora.head.a"), t.remove("lora.head.b")) {
            (Some(a), Some(b)) => Some((var(a)?, var(b)?)),
            (None, None) => None,
            _ => return Err("the training state holds half of the output head's pair".into()),
        };
        let lora = Lora { config: config.clone(), pairs, head };
        let vars = lora.vars();
        let moments = (0..vars.len())
            .map(|i| Ok((take(&mut t, &format!("adam.{i}.m"))?, take(&mut t, &format!("adam.{i}.v"))?)))
            .collect::<Result<Vec<_>, String>>()?;
        let opt = AdamW::restore(vars, moments, step_t, params).map_err(|e| e.to_string())?;
        Ok(Held { config, params, live: Some(Live { lora, opt }), parked: None })
    }

    /// The adapter alone (the optimizer's moments dropped).
    pub fn take_lora(&mut self) -> Option<Lora> {
        self.live.take().map(|l| l.lora)
    }

    pub fn is_parked(&self) -> bool {
        self.live.is_none()
    }
}

impl Park for Held {
    fn park(&mut self, path: &Path) -> Result<(), String> {
        if self.live.is_none() {
            return Ok(());
        }
        if let Err(e) = self.save(path) {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        // The run's learning rate may have changed since it started: keep the current one.
        if let Some(live) = self.live.take() {
            self.params = live.opt.params;
        }
        self.parked = Some(path.to_path_buf());
        Ok(())
    }

    fn unpark(&mut self) -> Result<(), String> {
        let Some(path) = self.parked.take() else { return Ok(()) };
        let back = Held::load(&path, self.config.clone(), self.params);
        let _ = std::fs::remove_file(&path);
        self.live = Some(back?.live.take().ok_or("the training state read back empty")?);
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // A run that ends while parked (shutdown, cancellation) leaves no file behind.
        if let Some(path) = self.parked.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(seed: f32, din: usize, dout: usize) -> (Var, Var) {
        let a: Vec<f32> = (0..2 * din).map(|i| seed + i as f32 * 0.01).collect();
        let b: Vec<f32> = (0..dout * 2).map(|i| seed - i as f32 * 0.02).collect();
        (
            Var::from_tensor(&Tensor::from_vec(a, (2, din), &Device::Cpu).unwrap()).unwrap(),
            Var::from_tensor(&Tensor::from_vec(b, (dout, 2), &Device::Cpu).unwrap()).unwrap(),
        )
    }

    fn held() -> Held {
        let layer = |s: f32| -> [(Var, Var); 7] { std::array::from_fn(|m| pair(s + m as f32, 3, 4 + m)) };
        let lora = Lora {
            config: AdapterConfig { r: 2, lora_alpha: Some(4.0), use_rslora: false },
            pairs: vec![layer(0.0), layer(10.0)],
            // The output head's pair parks with the rest.
            head: Some(pair(20.0, 3, 9)),
        };
        let params = AdamParams { lr: 0.01, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 };
        Held::new(lora, params).unwrap()
    }

    /// A loss over every parameter, so each gets a gradient.
    fn step(h: &mut Held) {
        let live = h.live().unwrap();
        let mut loss = Tensor::new(0f32, &Device::Cpu).unwrap();
        for v in live.lora.vars() {
            loss = (loss + v.as_tensor().sqr().unwrap().sum_all().unwrap()).unwrap();
        }
        live.opt.step(&loss.backward().unwrap()).unwrap();
    }

    fn values(h: &mut Held) -> Vec<Vec<f32>> {
        let live = h.live().unwrap();
        let mut out: Vec<Vec<f32>> =
            live.lora.vars().iter().map(|v| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap()).collect();
        for (m, v) in live.opt.moments() {
            out.push(m.flatten_all().unwrap().to_vec1().unwrap());
            out.push(v.flatten_all().unwrap().to_vec1().unwrap());
        }
        out.push(vec![live.opt.step_t() as f32, live.opt.params.lr as f32]);
        out
    }

    #[test]
    fn a_parked_run_continues_exactly_as_one_that_stayed_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (mut stayed, mut parked) = (held(), held());
        for i in 0..4 {
            step(&mut stayed);
            step(&mut parked);
            if i == 1 {
                parked.live().unwrap().opt.set_learning_rate(0.02);
                stayed.live().unwrap().opt.set_learning_rate(0.02);
            }
            let path = dir.path().join("run.safetensors");
            parked.park(&path).unwrap();
            assert!(parked.is_parked() && path.exists());
            assert!(parked.live().is_err(), "a parked run cannot compute");
            parked.unpark().unwrap();
            assert!(!path.exists(), "the file goes once read back");
        }
        assert_eq!(values(&mut parked), values(&mut stayed));
    }

    #[test]
    fn a_run_dropped_while_parked_removes_its_file_and_a_bad_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.safetensors");
        let mut h = held();
        h.park(&path).unwrap();
        drop(h);
        assert!(!path.exists());

        std::fs::write(&path, b"not a safetensors file").unwrap();
        let config = AdapterConfig { r: 2, lora_alpha: Some(4.0), use_rslora: false };
        let params = AdamParams { lr: 0.01, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.0 };
        assert!(Held::load(&path, config, params).is_err());
        // A directory that cannot be written: parking fails and the state stays in memory.
        let mut h = held();
        assert!(h.park(&dir.path().join("missing/run.safetensors")).is_err());
        assert!(!h.is_parked());
    }
}
