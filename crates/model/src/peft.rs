//! PEFT LoRA adapters on disk: the one reader and writer of `adapter_config.json` and
//! `adapter_model.safetensors` (tensors `base_model.model.model.layers.{i}.{module}.lora_{A,B}.weight`),
//! used by serving (`lora::LoraAdapter`) and by training (`tandem_train::adapter`), so both read
//! the same files the same way.
//!
//! On disk the rows of q and k follow Hugging Face's rotary layout, the one PEFT trains against;
//! in memory they follow the GGUF's (llama.cpp's converter permutes them), so reading permutes
//! `lora_B` of q and k one way and writing the other way. A module missing from the file reads as
//! `None` (PEFT adapters often target only some projections); `use_rslora` sets the scale.
//! The output head (`lm_head`, Tinker's `train_unembed`) may carry a pair too: (r, hidden) and
//! (vocab, r), added to the logits.

use crate::lora::{gguf_to_hf_rows, hf_to_gguf_rows};
use crate::{LlamaConfig, ModelError};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// The seven projections of a Llama layer an adapter may target, in PEFT's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Module {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Module {
    pub const ALL: [Module; 7] = [Module::Q, Module::K, Module::V, Module::O, Module::Gate, Module::Up, Module::Down];

    /// The module's path under a layer, as PEFT names its tensors.
    pub fn path(self) -> &'static str {
        match self {
            Module::Q => "self_attn.q_proj",
            Module::K => "self_attn.k_proj",
            Module::V => "self_attn.v_proj",
            Module::O => "self_attn.o_proj",
            Module::Gate => "mlp.gate_proj",
            Module::Up => "mlp.up_proj",
            Module::Down => "mlp.down_proj",
        }
    }

    /// The name in `target_modules`.
    pub fn target(self) -> &'static str {
        self.path().rsplit('.').next().unwrap_or_default()
    }

    /// (in, out) of the projection in a model of shape `c`.
    pub fn dims(self, c: &LlamaConfig) -> (usize, usize) {
        match self {
            Module::Q => (c.hidden, c.q_dim()),
            Module::K | Module::V => (c.hidden, c.kv_dim()),
            Module::O => (c.q_dim(), c.hidden),
            Module::Gate | Module::Up => (c.hidden, c.ffn),
            Module::Down => (c.ffn, c.hidden),
        }
    }

    /// Whether its output rows are in rotary order (q and k), permuted between the layouts.
    pub fn rotary_rows(self) -> bool {
        matches!(self, Module::Q | Module::K)
    }
}

/// `lora_alpha` when a config leaves it out, as PEFT's `LoraConfig` does.
pub const PEFT_DEFAULT_ALPHA: f64 = 8.0;

/// The fields of `adapter_config.json` tandem reads and writes (PEFT's names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterConfig {
    pub r: usize,
    /// PEFT's default (`LoraConfig.lora_alpha`) is 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_alpha: Option<f64>,
    #[serde(default)]
    pub use_rslora: bool,
}

impl AdapterConfig {
    /// The factor on `B (A x)`: `alpha / r`, or `alpha / sqrt(r)` with rsLoRA.
    pub fn scale(&self) -> f64 {
        let alpha = self.lora_alpha.unwrap_or(PEFT_DEFAULT_ALPHA);
        if self.use_rslora {
            alpha / (self.r as f64).sqrt()
        } else {
            alpha / self.r as f64
        }
    }
}

/// One projection's matrices, row-major f32: `a` is (r, in), `b` is (out, r), rows of `b` in the
/// GGUF layout.
#[derive(Debug, Clone, PartialEq)]
pub struct PairData {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
}

/// An adapter as stored: its config and, per layer, each module's pair if the file has it, and
/// the output head's.
#[derive(Debug, Clone)]
pub struct PeftAdapter {
    pub config: AdapterConfig,
    pub layers: Vec<[Option<PairData>; 7]>,
    pub head: Option<PairData>,
}

fn tensor_name(layer: usize, module: Module, ab: &str) -> String {
    format!("base_model.model.model.layers.{layer}.{}.lora_{ab}.weight", module.path())
}

/// The output head's tensors, as PEFT names them for a causal LM (`target_modules` `lm_head`).
fn head_name(ab: &str) -> String {
    format!("base_model.model.lm_head.lora_{ab}.weight")
}

/// (in, out) of the output head: the hidden state to the vocabulary.
pub fn head_dims(c: &LlamaConfig) -> (usize, usize) {
    (c.hidden, c.vocab)
}

/// Largest |scale| (`lora_alpha / r`, or `/ sqrt(r)` with rsLoRA) accepted.
pub const MAX_SCALE: f64 = 1e4;

/// Highest rank read (vLLM's `--max-lora-rank` tops out at 512).
pub const MAX_RANK: usize = 512;

/// Reads a PEFT adapter directory for a model of shape `c`. Errors name the directory's files
/// (server paths: log them, do not send them).
pub fn read(dir: &Path, c: &LlamaConfig) -> Result<PeftAdapter, ModelError> {
    let bad = |m: String| ModelError::Adapter(format!("{}: {m}", dir.display()));
    let text = std::fs::read_to_string(dir.join("adapter_config.json"))
        .map_err(|e| bad(format!("adapter_config.json: {e}")))?;
    let config: AdapterConfig = serde_json::from_str(&text).map_err(|e| bad(format!("adapter_config.json: {e}")))?;
    // PEFT settings that would change what the tensors mean, which tandem does not apply: refused
    // rather than served at the wrong scale or shape.
    let raw: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if let Some(kind) = raw.get("peft_type").and_then(serde_json::Value::as_str).filter(|k| *k != "LORA") {
        return Err(bad(format!("adapter_config.json: peft_type {kind:?}; tandem serves LORA adapters")));
    }
    if raw.get("use_dora").and_then(serde_json::Value::as_bool) == Some(true) {
        return Err(bad("adapter_config.json: use_dora is true; tandem serves plain LoRA, not DoRA".into()));
    }
    for key in ["alpha_pattern", "rank_pattern"] {
        if raw.get(key).and_then(serde_json::Value::as_object).is_some_and(|o| !o.is_empty()) {
            return Err(bad(format!(
                "adapter_config.json: {key} is not supported (one rank and alpha for every module)"
            )));
        }
    }
    if config.r == 0 || config.r > MAX_RANK {
        return Err(bad(format!("adapter_config.json: r must be between 1 and {MAX_RANK}, got {}", config.r)));
    }
    // A scale past this turns any non-zero product into infinities in f32.
    if !config.scale().is_finite() || config.scale().abs() > MAX_SCALE {
        return Err(bad(format!(
            "adapter_config.json: lora_alpha gives a scale of {}, outside ±{MAX_SCALE}",
            config.scale()
        )));
    }
    let rank = config.r;
    let tensors = candle_core::safetensors::load(dir.join("adapter_model.safetensors"), &Device::Cpu)
        .map_err(|e| bad(format!("adapter_model.safetensors: {e}")))?;
    // Every tensor must have a place in this model, with exactly its shape: a tensor tandem
    // would ignore (an embedding's LoRA, a layer past the last, a transposed matrix) would make
    // it serve something other than what was trained.
    let mut expected: HashMap<String, [usize; 2]> = HashMap::new();
    for l in 0..c.n_layer {
        for module in Module::ALL {
            let (din, dout) = module.dims(c);
            expected.insert(tensor_name(l, module, "A"), [rank, din]);
            expected.insert(tensor_name(l, module, "B"), [dout, rank]);
        }
    }
    let (hin, hout) = head_dims(c);
    expected.insert(head_name("A"), [rank, hin]);
    expected.insert(head_name("B"), [hout, rank]);
    let mut unknown: Vec<&String> = tensors.keys().filter(|k| !expected.contains_key(*k)).collect();
    if !unknown.is_empty() {
        unknown.sort();
        let shown: Vec<&str> = unknown.iter().take(3).map(|k| k.as_str()).collect();
        return Err(bad(format!(
            "adapter_model.safetensors: {} tensors have no place in this model (such as {}); tandem applies LoRA \
             to the seven projections of each layer and the output head",
            unknown.len(),
            shown.join(", ")
        )));
    }
    for (name, t) in &tensors {
        let want = expected[name];
        if t.dims() != want {
            return Err(bad(format!("{name}: shape {:?}, but rank {rank} and this model need {want:?}", t.dims())));
        }
    }
    let get = |name: &str| -> Result<Option<Vec<f32>>, ModelError> {
        match tensors.get(name) {
            None => Ok(None),
            Some(t) => {
                let v = t
                    .to_dtype(candle_core::DType::F32)
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| bad(format!("{name}: {e}")))?;
                // NaN or infinite weights would make every answer of this adapter NaN.
                if !v.iter().all(|x| x.is_finite()) {
                    return Err(bad(format!("{name} holds values that are not finite numbers")));
                }
                Ok(Some(v))
            }
        }
    };
    let mut layers = Vec::with_capacity(c.n_layer);
    for l in 0..c.n_layer {
        let mut layer: [Option<PairData>; 7] = Default::default();
        for (slot, module) in layer.iter_mut().zip(Module::ALL) {
            let (a_name, b_name) = (tensor_name(l, module, "A"), tensor_name(l, module, "B"));
            let (a, mut b) = match (get(&a_name)?, get(&b_name)?) {
                (Some(a), Some(b)) => (a, b),
                (None, None) => continue,
                (Some(_), None) => return Err(bad(format!("{a_name} has no lora_B to go with it"))),
                (None, Some(_)) => return Err(bad(format!("{b_name} has no lora_A to go with it"))),
            };
            let (din, dout) = module.dims(c);
            // The rank is bounded, so these products cannot overflow.
            if a.len() != rank * din || b.len() != dout * rank {
                return Err(bad(format!("layer {l} {}: shapes do not match rank {rank} and the model", module.path())));
            }
            if module.rotary_rows() {
                b = hf_to_gguf_rows(&b, dout / c.head_dim, c.head_dim, rank);
            }
            *slot = Some(PairData { a, b });
        }
        layers.push(layer);
    }
    let head = match (get(&head_name("A"))?, get(&head_name("B"))?) {
        (Some(a), Some(b)) => Some(PairData { a, b }),
        (None, None) => None,
        _ => return Err(bad("lm_head has only one of lora_A and lora_B".into())),
    };
    Ok(PeftAdapter { config, layers, head })
}

/// The two files of an adapter whose every layer holds all seven pairs (GGUF row layout), and
/// the output head's pair if it has one, as `(name, bytes)`: what PEFT and vLLM load.
pub fn write(
    config: &AdapterConfig,
    layers: &[[PairData; 7]],
    head: Option<&PairData>,
    c: &LlamaConfig,
    base_model: &str,
) -> Result<Vec<(String, Vec<u8>)>, ModelError> {
    let rank = config.r;
    let err = |e: candle_core::Error| ModelError::Adapter(format!("serialising the adapter: {e}"));
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (l, layer) in layers.iter().enumerate() {
        for (pair, module) in layer.iter().zip(Module::ALL) {
            let (din, dout) = module.dims(c);
            let b = if module.rotary_rows() {
                gguf_to_hf_rows(&pair.b, dout / c.head_dim, c.head_dim, rank)
            } else {
                pair.b.clone()
            };
            tensors.insert(
                tensor_name(l, module, "A"),
                Tensor::from_vec(pair.a.clone(), (rank, din), &Device::Cpu).map_err(err)?,
            );
            tensors.insert(tensor_name(l, module, "B"), Tensor::from_vec(b, (dout, rank), &Device::Cpu).map_err(err)?);
        }
    }
    let mut targets: Vec<&str> = Module::ALL.map(Module::target).to_vec();
    if let Some(pair) = head {
        let (hin, hout) = head_dims(c);
        tensors.insert(head_name("A"), Tensor::from_vec(pair.a.clone(), (rank, hin), &Device::Cpu).map_err(err)?);
        tensors.insert(head_name("B"), Tensor::from_vec(pair.b.clone(), (hout, rank), &Device::Cpu).map_err(err)?);
        targets.push("lm_head");
    }
    let weights = safetensors::serialize(tensors, None)
        .map_err(|e| ModelError::Adapter(format!("serialising the adapter: {e}")))?;
    let json = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": config.lora_alpha.unwrap_or(PEFT_DEFAULT_ALPHA),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": config.use_rslora,
        "inference_mode": true,
        "target_modules": targets,
    });
    let json = serde_json::to_vec_pretty(&json).map_err(|e| ModelError::Adapter(e.to_string()))?;
    Ok(vec![("adapter_config.json".into(), json), ("adapter_model.safetensors".into(), weights)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LlamaConfig {
        LlamaConfig { context_len: 64, ..LlamaConfig::llama(2, 16, 24, 4, 2, 32) }
    }

    #[test]
    fn written_adapters_read_back_identically_and_partial_ones_read_as_none() {
        let c = config();
        let pairs: Vec<[PairData; 7]> = (0..c.n_layer)
            .map(|l| {
                Module::ALL.map(|m| {
                    let (din, dout) = m.dims(&c);
                    let a = (0..4 * din).map(|i| (i + l) as f32 * 0.01).collect();
                    let b = (0..dout * 4).map(|i| (i as f32 - 7.0) * 0.02).collect();
                    PairData { a, b }
                })
            })
            .collect();
        let cfg = AdapterConfig { r: 4, lora_alpha: Some(16.0), use_rslora: true };
        let dir = tempfile::tempdir().unwrap();
        let (hin, hout) = head_dims(&c);
        let head = PairData {
            a: (0..4 * hin).map(|i| i as f32 * 0.03).collect(),
            b: (0..hout * 4).map(|i| 1.0 - i as f32 * 0.01).collect(),
        };
        for (name, bytes) in write(&cfg, &pairs, None, &c, "base").unwrap() {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        assert!(read(dir.path(), &c).unwrap().head.is_none());
        for (name, bytes) in write(&cfg, &pairs, Some(&head), &c, "base").unwrap() {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("adapter_config.json")).unwrap()).unwrap();
        assert_eq!(config["target_modules"].as_array().unwrap().last().unwrap(), "lm_head");
        let back = read(dir.path(), &c).unwrap();
        assert_eq!(back.head.as_ref(), Some(&head), "the output head's pair, as written");
        assert_eq!(back.config, cfg);
        assert_eq!(back.config.scale(), 8.0, "rsLoRA: 16 / sqrt(4)");
        for (l, layer) in back.layers.iter().enumerate() {
            for (m, pair) in layer.iter().enumerate() {
                assert_eq!(pair.as_ref(), Some(&pairs[l][m]), "layer {l} module {m}");
            }
        }
        // On disk, q's B rows are in Hugging Face's order: not the in-memory bytes.
        let t = candle_core::safetensors::load(dir.path().join("adapter_model.safetensors"), &Device::Cpu).unwrap();
        let q_b: Vec<f32> = t[&tensor_name(0, Module::Q, "B")].flatten_all().unwrap().to_vec1().unwrap();
        assert_ne!(q_b, pairs[0][0].b);
        // Only q and v in the file (a PEFT adapter targeting two modules): the others are None.
        let mut some: HashMap<String, Tensor> = HashMap::new();
        for l in 0..c.n_layer {
            for m in [Module::Q, Module::V] {
                for ab in ["A", "B"] {
                    some.insert(tensor_name(l, m, ab), t[&tensor_name(l, m, ab)].clone());
                }
            }
        }
        std::fs::write(dir.path().join("adapter_model.safetensors"), safetensors::serialize(some, None).unwrap())
            .unwrap();
        std::fs::write(dir.path().join("adapter_config.json"), r#"{"r": 4, "lora_alpha": 8}"#).unwrap();
        let partial = read(dir.path(), &c).unwrap();
        assert_eq!(partial.config.scale(), 2.0);
        for layer in &partial.layers {
            let present: Vec<bool> = layer.iter().map(Option::is_some).collect();
            assert_eq!(present, [true, false, true, false, false, false, false]);
        }
    }

    #[test]
    fn tensors_without_a_place_or_with_the_wrong_shape_are_refused() {
        let c = config();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("adapter_config.json"), r#"{"r": 2}"#).unwrap();
        let zeros = |r: usize, k: usize| Tensor::zeros((r, k), candle_core::DType::F32, &Device::Cpu).unwrap();
        let (din, dout) = Module::V.dims(&c);
        let try_with = |tensors: Vec<(String, Tensor)>| {
            let map: HashMap<String, Tensor> = tensors.into_iter().collect();
            std::fs::write(dir.path().join("adapter_model.safetensors"), safetensors::serialize(map, None).unwrap())
                .unwrap();
            read(dir.path(), &c).map(|_| ()).map_err(|e| e.to_string())
        };
        let a = |l| tensor_name(l, Module::V, "A");
        let b = |l| tensor_name(l, Module::V, "B");
        assert!(try_with(vec![(a(0), zeros(2, din)), (b(0), zeros(dout, 2))]).is_ok());
        // A layer past the last one, and an embedding's LoRA.
        let e = try_with(vec![(a(0), zeros(2, din)), (b(0), zeros(dout, 2)), (a(2), zeros(2, din))]).unwrap_err();
        assert!(e.contains("1 tensors have no place") && e.contains("layers.2."), "{e}");
        let e = try_with(vec![("base_model.model.model.embed_tokens.lora_A.weight".into(), zeros(2, 32))]).unwrap_err();
        assert!(e.contains("embed_tokens"), "{e}");
        // Transposed (same number of values), and half a pair.
        let e = try_with(vec![(a(0), zeros(din, 2)), (b(0), zeros(dout, 2))]).unwrap_err();
        assert!(e.contains("shape [16, 2]"), "{e}");
        let e = try_with(vec![(a(1), zeros(2, din))]).unwrap_err();
        assert!(e.contains("has no lora_B"), "{e}");
        // The output head: its shape, and both halves.
        let (hin, hout) = head_dims(&c);
        assert!(try_with(vec![(head_name("A"), zeros(2, hin)), (head_name("B"), zeros(hout, 2))]).is_ok());
        let e = try_with(vec![(head_name("A"), zeros(2, hin)), (head_name("B"), zeros(hout + 1, 2))]).unwrap_err();
        assert!(e.contains("lm_head") && e.contains("shape"), "{e}");
        let e = try_with(vec![(head_name("A"), zeros(2, hin))]).unwrap_err();
        assert!(e.contains("lm_head has only one"), "{e}");
        let nan = Tensor::full(f32::NAN, (dout, 2), &Device::Cpu).unwrap();
        let e = try_with(vec![(a(0), zeros(2, din)), (b(0), nan)]).unwrap_err();
        assert!(e.contains("not finite"), "{e}");
    }

    #[test]
    fn peft_settings_tandem_does_not_apply_are_refused() {
        let c = config();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("adapter_model.safetensors"),
            safetensors::serialize(HashMap::<String, Tensor>::new(), None).unwrap(),
        )
        .unwrap();
        let with = |cfg: &str| {
            std::fs::write(dir.path().join("adapter_config.json"), cfg).unwrap();
            read(dir.path(), &c).map(|a| a.config.scale()).map_err(|e| e.to_string())
        };
        assert_eq!(with(r#"{"r": 4}"#), Ok(2.0), "PEFT's default alpha is 8");
        assert!(with(r#"{"r": 4, "lora_alpha": 1e300}"#).unwrap_err().contains("scale"));
        assert_eq!(with(r#"{"r": 4, "peft_type": "LORA", "use_dora": false, "alpha_pattern": {}}"#), Ok(2.0));
        for (cfg, says) in [
            (r#"{"r": 4, "peft_type": "IA3"}"#, "peft_type"),
            (r#"{"r": 4, "use_dora": true}"#, "DoRA"),
            (r#"{"r": 4, "alpha_pattern": {"q_proj": 32}}"#, "alpha_pattern"),
            (r#"{"r": 4, "rank_pattern": {"q_proj": 2}}"#, "rank_pattern"),
        ] {
            let e = with(cfg).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
