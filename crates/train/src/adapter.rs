//! LoRA adapters as PEFT writes them: `adapter_config.json` + `adapter_model.safetensors`, with
//! tensors `base_model.model.model.layers.{i}.{module}.lora_{A,B}.weight`. In memory, q/k rows
//! follow the GGUF (interleaved RoPE) layout of the base weights; on disk, Hugging Face's.

use crate::net::{Base, Lora, MODULES};
use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;
use tandem_model::lora::{gguf_to_hf_rows, hf_to_gguf_rows};

/// ART's adapter: rank 8, alpha 16.
pub const RANK: usize = 8;
pub const ALPHA: f64 = 16.0;

fn key(layer: usize, module: &str, ab: &str) -> String {
    format!("base_model.model.model.layers.{layer}.{module}.lora_{ab}.weight")
}

/// Whether projection `m` has RoPE-permuted rows (q and k).
fn permuted(m: usize) -> bool {
    m < 2
}

/// A fresh adapter as PEFT initialises one: A ~ U(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform with
/// a = sqrt(5)), B = 0, so it starts equal to the base model. Seeded: the same every time.
pub fn init(base: &Base, seed: u64) -> candle_core::Result<Lora> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut pairs = Vec::with_capacity(base.config.n_layer);
    for _ in 0..base.config.n_layer {
        let mut layer = Vec::with_capacity(7);
        for m in 0..7 {
            let (din, dout) = base.dims(m);
            let bound = 1.0 / (din as f32).sqrt();
            let a: Vec<f32> = (0..RANK * din).map(|_| rng.random_range(-bound..bound)).collect();
            let a = Var::from_tensor(&Tensor::from_vec(a, (RANK, din), &Device::Cpu)?)?;
            let b = Var::from_tensor(&Tensor::zeros((dout, RANK), candle_core::DType::F32, &Device::Cpu)?)?;
            layer.push((a, b));
        }
        pairs.push(layer.try_into().map_err(|_| candle_core::Error::Msg("adapter layer".into()))?);
    }
    Ok(Lora { rank: RANK, alpha: ALPHA, pairs })
}

/// Loads an adapter directory written by [`save`] (or PEFT) to continue training from it.
pub fn load(dir: &Path, base: &Base) -> Result<Lora, String> {
    let cfg: serde_json::Value = std::fs::read_to_string(dir.join("adapter_config.json"))
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        .map_err(|e| format!("adapter_config.json of the latest checkpoint: {e}"))?;
    let rank = cfg["r"].as_u64().ok_or("the latest checkpoint's adapter_config.json has no r")? as usize;
    let alpha = cfg["lora_alpha"].as_f64().unwrap_or(rank as f64);
    let tensors = candle_core::safetensors::load(dir.join("adapter_model.safetensors"), &Device::Cpu)
        .map_err(|e| format!("adapter_model.safetensors of the latest checkpoint: {e}"))?;
    let c = &base.config;
    let mut pairs = Vec::with_capacity(c.n_layer);
    for l in 0..c.n_layer {
        let mut layer = Vec::with_capacity(7);
        for (m, module) in MODULES.iter().enumerate() {
            let (din, dout) = base.dims(m);
            let get = |ab: &str, rows: usize, cols: usize| -> Result<Vec<f32>, String> {
                let k = key(l, module, ab);
                let t = tensors.get(&k).ok_or_else(|| format!("the latest checkpoint has no {k}"))?;
                let v = t
                    .to_dtype(candle_core::DType::F32)
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| format!("{k}: {e}"))?;
                if v.len() != rows * cols {
                    return Err(format!("{k} has {} values, expected {rows} x {cols}", v.len()));
                }
                Ok(v)
            };
            let a = get("A", rank, din)?;
            let mut b = get("B", dout, rank)?;
            if permuted(m) {
                b = hf_to_gguf_rows(&b, dout / c.head_dim, c.head_dim, rank);
            }
            let var = |v: Vec<f32>, shape: (usize, usize)| {
                Tensor::from_vec(v, shape, &Device::Cpu).and_then(|t| Var::from_tensor(&t)).map_err(|e| e.to_string())
            };
            layer.push((var(a, (rank, din))?, var(b, (dout, rank))?));
        }
        pairs.push(layer.try_into().map_err(|_| "adapter layer".to_string())?);
    }
    Ok(Lora { rank, alpha, pairs })
}

/// The adapter's files: `(name, bytes)` for `adapter_config.json` and `adapter_model.safetensors`.
pub fn save(lora: &Lora, base: &Base, base_model: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let c = &base.config;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (l, layer) in lora.pairs.iter().enumerate() {
        for (m, (a, b)) in layer.iter().enumerate() {
            let (_, dout) = base.dims(m);
            let mut bv = b.as_tensor().flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|e| e.to_string())?;
            if permuted(m) {
                bv = gguf_to_hf_rows(&bv, dout / c.head_dim, c.head_dim, lora.rank);
            }
            let bt = Tensor::from_vec(bv, (dout, lora.rank), &Device::Cpu).map_err(|e| e.to_string())?;
            tensors.insert(key(l, MODULES[m], "A"), a.as_tensor().clone());
            tensors.insert(key(l, MODULES[m], "B"), bt);
        }
    }
    let weights = safetensors::serialize(tensors, None).map_err(|e| format!("serialising the adapter: {e}"))?;
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "inference_mode": true,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    });
    let config = serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?;
    Ok(vec![("adapter_config.json".into(), config), ("adapter_model.safetensors".into(), weights)])
}
