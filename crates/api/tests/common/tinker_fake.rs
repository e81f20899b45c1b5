//! A fake of the Tinker compute port: each model is one number (its "weight", moved by each
//! step's learning rate) and its pending gradient, so the Tinker routes run in Rust tests without candle. Its files carry the number,
//! so a state saved and loaded again, by any node, must give the same weight back. Also the calls
//! the Tinker route tests make: a POST under `/api/v1/`, and a call's answer through its future.

use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;
use tandem_core::tinker::{
    AdamSettings, Datum, Files, Forwarded, LoraSpec, Modules, StateInfo, TinkerError, TinkerTrainer, STATE_FILE,
};

#[derive(Clone)]
struct Model {
    base: String,
    rank: usize,
    modules: Modules,
    weight: f64,
    grad: f64,
}

#[derive(Default)]
pub struct FakeTrainer {
    models: Mutex<HashMap<String, Model>>,
}

impl FakeTrainer {
    /// A held model's weight.
    pub fn weight(&self, model_id: &str) -> Option<f64> {
        self.models.lock().unwrap().get(model_id).map(|m| m.weight)
    }

    fn with<R>(&self, id: &str, f: impl FnOnce(&mut Model) -> R) -> Result<R, TinkerError> {
        let mut models = self.models.lock().unwrap();
        let m = models.get_mut(id).ok_or_else(|| TinkerError::User(format!("model {id:?} is not held")))?;
        Ok(f(m))
    }

    fn read(dir: &std::path::Path) -> Result<Model, TinkerError> {
        let missing = |_| TinkerError::NotFound("no such saved state".into());
        let bytes: [u8; 8] = std::fs::read(dir.join(STATE_FILE)).map_err(missing)?.try_into().unwrap();
        let about: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("state.json")).map_err(missing)?).unwrap();
        Ok(Model {
            base: about["base_model"].as_str().unwrap().into(),
            rank: about["rank"].as_u64().unwrap() as usize,
            modules: Modules::ALL,
            weight: f64::from_le_bytes(bytes),
            grad: 0.0,
        })
    }
}

impl TinkerTrainer for FakeTrainer {
    fn create(&self, _entity: &str, model_id: &str, base_model: &str, lora: LoraSpec) -> Result<(), TinkerError> {
        let m = Model { base: base_model.into(), rank: lora.rank, modules: lora.modules, weight: 0.0, grad: 0.0 };
        self.models.lock().unwrap().insert(model_id.into(), m);
        Ok(())
    }

    fn forward_backward(
        &self,
        model_id: &str,
        data: &[Datum],
        _loss_fn: &str,
        _config: &[(String, f64)],
        backward: bool,
    ) -> Result<Forwarded, TinkerError> {
        self.with(model_id, |m| {
            let logprobs: Vec<Vec<f32>> =
                data.iter().map(|d| d.targets.iter().map(|_| -(1.0 + m.weight) as f32).collect()).collect();
            if backward {
                m.grad += data.len() as f64;
            }
            Forwarded { loss: logprobs.iter().flatten().map(|l| -f64::from(*l)).sum(), logprobs }
        })
    }

    fn optim_step(&self, model_id: &str, adam: AdamSettings) -> Result<f64, TinkerError> {
        // The fake has no loss: a step adds its learning rate, so tests set the weight they want.
        self.with(model_id, |m| {
            let norm = m.grad.abs();
            m.weight += adam.learning_rate;
            m.grad = 0.0;
            norm
        })
    }

    fn adapter_files(&self, model_id: &str) -> Result<Vec<(String, Vec<u8>)>, TinkerError> {
        self.with(model_id, |m| {
            vec![
                ("adapter_config.json".into(), json!({ "r": m.rank }).to_string().into_bytes()),
                ("adapter_model.safetensors".into(), m.weight.to_le_bytes().to_vec()),
            ]
        })
    }

    fn modules(&self, model_id: &str) -> Result<Modules, TinkerError> {
        self.with(model_id, |m| m.modules)
    }

    fn state_files(&self, model_id: &str) -> Result<(Files, StateInfo), TinkerError> {
        self.with(model_id, |m| {
            let about = json!({ "base_model": m.base, "rank": m.rank, "alpha": 32.0 });
            let files = vec![
                (STATE_FILE.to_string(), m.weight.to_le_bytes().to_vec()),
                ("state.json".to_string(), about.to_string().into_bytes()),
            ];
            (files, StateInfo { base_model: m.base.clone(), rank: m.rank, modules: m.modules })
        })
    }

    fn load_state(&self, _entity: &str, model_id: &str, dir: &std::path::Path, _opt: bool) -> Result<(), TinkerError> {
        let m = Self::read(dir)?;
        self.models.lock().unwrap().insert(model_id.into(), m);
        Ok(())
    }

    fn load_state_into(&self, model_id: &str, dir: &std::path::Path, _opt: bool) -> Result<(), TinkerError> {
        let saved = Self::read(dir)?;
        self.with(model_id, |m| m.weight = saved.weight)
    }

    fn external_files(&self, model_id: &str, recipients: &[String]) -> Result<Vec<(String, Vec<u8>)>, TinkerError> {
        if !recipients.is_empty() {
            return Err(TinkerError::User("the fake does not encrypt".into()));
        }
        self.adapter_files(model_id)
    }

    fn memory(&self) -> tandem_core::tinker::HeldMemory {
        let live = self.models.lock().unwrap().len();
        tandem_core::tinker::HeldMemory { live_bytes: 8 * live as u64, live, parked: 0 }
    }

    fn release(&self, model_id: &str) {
        self.models.lock().unwrap().remove(model_id);
    }
}

/// `POST /api/v1/{path}` with a JSON body.
pub async fn post(app: &super::TestApp, key: &str, path: &str, body: serde_json::Value) -> super::Reply {
    app.call("POST", &format!("/api/v1/{path}"), key, Some(body)).await
}

/// A submitted call's answer: its future's result once ready.
pub async fn answer(app: &super::TestApp, key: &str, submitted: &super::Reply) -> serde_json::Value {
    assert_eq!(submitted.status, 200, "{}", String::from_utf8_lossy(&submitted.bytes));
    let request_id = submitted.json()["request_id"].as_str().expect("a future").to_string();
    loop {
        let r = post(app, key, "retrieve_future", json!({ "request_id": request_id })).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.bytes));
        if r.json()["type"] != "try_again" {
            return r.json();
        }
    }
}
