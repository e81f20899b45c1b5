//! Hugging Face checkpoint directories: `config.json`, `*.safetensors` (one file, or shards
//! with `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json` and
//! `generation_config.json`, read as if they were a GGUF file: tensors are asked for by their
//! GGUF names (`blk.3.attn_q.weight`) and come back in the GGUF's conventions, so the loaders
//! need nothing else:
//!
//! - q/k rows stay in Hugging Face's halves order, which is what `LlamaConfig::qk_halves` tells
//!   the loader to permute (for every architecture, Llama included: only llama.cpp's converter
//!   interleaves them);
//! - Gemma's norms are stored as `w` and applied as `1 + w`: `1` is added here, as llama.cpp's
//!   converter does, so every norm is the plain `x * w`.
//!
//! Safetensors files are read tensor by tensor (the header, then a seek per tensor), never whole:
//! the `safetensors` crate's reader wants the whole file in memory or an unsafe memory map.
//! f32, f16 and bf16 are read; the matrices are quantised at load like a GGUF's (`--quantize`).

use crate::arch::{Arch, SlidingWindow};
use crate::{LlamaConfig, ModelError, TokenizerMeta};
use serde_json::Value;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

fn err(path: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::Gguf(format!("{}: {e}", path.display()))
}

/// Where one tensor's bytes are.
#[derive(Debug, Clone)]
struct TensorAt {
    file: usize,
    dtype: String,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: u64,
    len: u64,
}

/// An open checkpoint directory.
pub struct HfDir {
    dir: PathBuf,
    files: Vec<PathBuf>,
    tensors: HashMap<String, TensorAt>,
    /// `model.` or, for Gemma 3's multimodal checkpoints, `language_model.model.`.
    prefix: String,
    config: LlamaConfig,
    tied: bool,
}

/// The largest safetensors header read (the format's own bound is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| err(path, e))?;
    serde_json::from_str(&text).map_err(|e| err(path, e))
}

/// The tensors of one safetensors file, by name.
fn read_header(path: &Path, index: usize, out: &mut HashMap<String, TensorAt>) -> Result<(), ModelError> {
    let mut f = File::open(path).map_err(|e| err(path, e))?;
    let size = f.metadata().map_err(|e| err(path, e))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|e| err(path, e))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || 8 + n > size {
        return Err(err(path, format!("safetensors header of {n} bytes in a file of {size}")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|e| err(path, e))?;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&header).map_err(|e| err(path, e))?;
    let data_start = 8 + n;
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let bad = || err(path, format!("tensor {name}: malformed entry"));
        let dtype = info.get("dtype").and_then(Value::as_str).ok_or_else(bad)?.to_string();
        let shape: Vec<usize> = info
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(bad)?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        let offsets = info.get("data_offsets").and_then(Value::as_array).ok_or_else(bad)?;
        let (start, end) = match (offsets.first().and_then(Value::as_u64), offsets.get(1).and_then(Value::as_u64)) {
            (Some(s), Some(e)) if s <= e && data_start + e <= size => (s, e),
            _ => return Err(bad()),
        };
        let elem = match dtype.as_str() {
            "F32" => 4,
            "F16" | "BF16" => 2,
            _ => 0, // other types are refused when read, not when listed
        };
        let numel = shape.iter().try_fold(1usize, |a, d| a.checked_mul(*d)).ok_or_else(bad)?;
        if elem != 0 && (numel as u64).checked_mul(elem) != Some(end - start) {
            return Err(err(path, format!("tensor {name}: {} bytes for shape {shape:?}", end - start)));
        }
        out.insert(name, TensorAt { file: index, dtype, shape, start: data_start + start, len: end - start });
    }
    Ok(())
}

impl HfDir {
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let mut config_json = read_json(&dir.join("config.json"))?;
        // Gemma 3's multimodal checkpoints keep the language model's shape under `text_config`.
        if let Some(text) = config_json.get("text_config").cloned() {
            config_json = text;
        }
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.is_file() {
            let map = read_json(&index)?;
            let mut names: Vec<String> = map
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| err(&index, "no weight_map"))?
                .values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            names.sort();
            names.dedup();
            // Shard names come from the file: they must stay inside the directory.
            if names.iter().any(|n| n.contains('/') || n.contains('\\') || n.starts_with('.')) {
                return Err(err(&index, "a shard name leaves the directory"));
            }
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut tensors = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            read_header(f, i, &mut tensors)?;
        }
        let prefix = ["model.", "language_model.model.", "model.language_model."]
            .into_iter()
            .find(|p| tensors.contains_key(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| err(dir, "no embed_tokens.weight under model. or language_model.model."))?
            .to_string();
        let tied = !tensors.contains_key("lm_head.weight")
            || config_json.get("tie_word_embeddings").and_then(Value::as_bool) == Some(true);
        let config = config_from_json(&config_json).map_err(|e| err(&dir.join("config.json"), e))?;
        Ok(HfDir { dir: dir.to_path_buf(), files, tensors, prefix, config, tied })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The Hugging Face name of a GGUF tensor name, if the architecture has it.
    fn hf_name(&self, gguf: &str) -> Option<String> {
        let p = &self.prefix;
        match gguf {
            "token_embd.weight" => return Some(format!("{p}embed_tokens.weight")),
            "output_norm.weight" => return Some(format!("{p}norm.weight")),
            "output.weight" => return (!self.tied).then(|| "lm_head.weight".to_string()),
            _ => {}
        }
        let rest = gguf.strip_prefix("blk.")?;
        let (layer, tensor) = rest.split_once('.')?;
        let gemma = self.config.arch == Arch::Gemma3;
        let (module, suffix) = tensor.rsplit_once('.')?;
        let hf = match module {
            "attn_norm" => "input_layernorm",
            "attn_q" => "self_attn.q_proj",
            "attn_k" => "self_attn.k_proj",
            "attn_v" => "self_attn.v_proj",
            "attn_output" => "self_attn.o_proj",
            "attn_q_norm" => "self_attn.q_norm",
            "attn_k_norm" => "self_attn.k_norm",
            // Llama and Qwen name the MLP's input norm after the attention; Gemma has a norm on
            // each side of each block.
            "ffn_norm" if gemma => "pre_feedforward_layernorm",
            "ffn_norm" => "post_attention_layernorm",
            "post_attention_norm" if gemma => "post_attention_layernorm",
            "post_ffw_norm" if gemma => "post_feedforward_layernorm",
            "ffn_gate" => "mlp.gate_proj",
            "ffn_up" => "mlp.up_proj",
            "ffn_down" => "mlp.down_proj",
            _ => return None,
        };
        Some(format!("{p}layers.{layer}.{hf}.{suffix}"))
    }

    pub fn has_tensor(&self, gguf: &str) -> bool {
        self.hf_name(gguf).is_some_and(|n| self.tensors.contains_key(&n))
    }

    /// A tensor by its GGUF name, as f32 with its dims (outermost first).
    pub fn tensor_f32(&mut self, gguf: &str) -> Result<(Vec<f32>, Vec<usize>), ModelError> {
        let name = self.hf_name(gguf).ok_or_else(|| ModelError::Gguf(format!("{gguf}: no such tensor")))?;
        let at = self.tensors.get(&name).ok_or_else(|| ModelError::Gguf(format!("{name} is missing")))?.clone();
        let path = &self.files[at.file];
        let mut f = File::open(path).map_err(|e| err(path, e))?;
        f.seek(SeekFrom::Start(at.start)).map_err(|e| err(path, e))?;
        let mut bytes = vec![0u8; at.len as usize];
        f.read_exact(&mut bytes).map_err(|e| err(path, e))?;
        let mut data: Vec<f32> = match at.dtype.as_str() {
            "F32" => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            "F16" => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            "BF16" => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            other => return Err(ModelError::Unsupported(format!("{name}: dtype {other} (f32, f16, bf16 are read)"))),
        };
        if self.config.arch == Arch::Gemma3 && gguf.ends_with("norm.weight") {
            data.iter_mut().for_each(|w| *w += 1.0);
        }
        Ok((data, at.shape))
    }

    /// What the tokenizer needs: `tokenizer.json` as it is, the chat template and special tokens
    /// of `tokenizer_config.json`, and the end-of-generation ids of `generation_config.json`.
    pub fn tokenizer_meta(&self) -> Result<TokenizerMeta, ModelError> {
        let json_path = self.dir.join("tokenizer.json");
        let json = std::fs::read_to_string(&json_path).map_err(|e| err(&json_path, e))?;
        let tok: Value = serde_json::from_str(&json).map_err(|e| err(&json_path, e))?;
        let tc_path = self.dir.join("tokenizer_config.json");
        let tc = if tc_path.is_file() { read_json(&tc_path)? } else { Value::Null };
        let gc_path = self.dir.join("generation_config.json");
        let gc = if gc_path.is_file() { read_json(&gc_path)? } else { Value::Null };
        // Token text -> id, from the model's vocabulary and the added tokens.
        let mut ids: HashMap<String, u32> = HashMap::new();
        if let Some(vocab) = tok.pointer("/model/vocab").and_then(Value::as_object) {
            ids.extend(vocab.iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64()? as u32))));
        }
        for added in tok.get("added_tokens").and_then(Value::as_array).into_iter().flatten() {
            if let (Some(c), Some(id)) =
                (added.get("content").and_then(Value::as_str), added.get("id").and_then(Value::as_u64))
            {
                ids.insert(c.to_string(), id as u32);
            }
        }
        // tokenizer_config names special tokens as strings or as {"content": ...} objects.
        let named = |key: &str| -> Option<u32> {
            let v = tc.get(key)?;
            let text = v.as_str().or_else(|| v.get("content").and_then(Value::as_str))?;
            ids.get(text).copied()
        };
        let gen_ids: Vec<u32> = match gc.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a.iter().filter_map(|n| n.as_u64().map(|n| n as u32)).collect(),
            _ => Vec::new(),
        };
        let eos_id = named("eos_token").or_else(|| gen_ids.first().copied());
        let bos_id = named("bos_token").or_else(|| gc.get("bos_token_id").and_then(Value::as_u64).map(|b| b as u32));
        let chat_template = match tc.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: the default one.
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .map(str::to_string),
            _ => None,
        }
        .or_else(|| std::fs::read_to_string(self.dir.join("chat_template.jinja")).ok());
        Ok(TokenizerMeta {
            model: "huggingface".into(),
            tokens: Vec::new(),
            bos_id,
            eos_id,
            extra_end_ids: gen_ids,
            add_bos: Some(tc.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false)),
            chat_template,
            hf_json: Some(json),
            ..TokenizerMeta::default()
        })
    }
}

fn config_from_json(c: &Value) -> Result<LlamaConfig, String> {
    let arch_name = c
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .or_else(|| c.get("model_type").and_then(Value::as_str))
        .unwrap_or_default();
    let arch = match arch_name {
        "LlamaForCausalLM" | "llama" => Arch::Llama,
        "Qwen2ForCausalLM" | "qwen2" => Arch::Qwen2,
        "Qwen3ForCausalLM" | "qwen3" => Arch::Qwen3,
        "Gemma3ForCausalLM" | "Gemma3ForConditionalGeneration" | "gemma3" | "gemma3_text" => Arch::Gemma3,
        other => return Err(format!("architecture {other:?} (supported: Llama, Qwen2, Qwen3, Gemma 3)")),
    };
    let num = |k: &str| c.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let float = |k: &str| c.get(k).and_then(Value::as_f64).map(|v| v as f32);
    let need = |k: &str| num(k).ok_or_else(|| format!("config.json has no {k}"));
    let (hidden, n_head) = (need("hidden_size")?, need("num_attention_heads")?);
    let head_dim = num("head_dim").unwrap_or(hidden / n_head.max(1));
    let rope_base = float("rope_theta").unwrap_or(10_000.0);
    let rope_freq_factors = match c.get("rope_scaling").filter(|v| !v.is_null()) {
        None => None,
        Some(s) if s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str) == Some("llama3") => {
            let f = |k: &str| s.get(k).and_then(Value::as_f64).ok_or_else(|| format!("rope_scaling has no {k}"));
            let scaling = Llama3Scaling {
                factor: f("factor")?,
                low_freq_factor: f("low_freq_factor")?,
                high_freq_factor: f("high_freq_factor")?,
                original_context: f("original_max_position_embeddings")?,
            };
            Some(scaling.factors(rope_base as f64, head_dim))
        }
        Some(other) => return Err(format!("rope_scaling {other} is not supported (only llama3)")),
    };
    let sliding = match (arch, num("sliding_window")) {
        (Arch::Gemma3, Some(w)) if w > 0 => {
            let mut s = SlidingWindow::gemma3(w);
            if let Some(base) = float("rope_local_base_freq") {
                s.rope_base = base;
            }
            if let Some(types) = c.get("layer_types").and_then(Value::as_array) {
                // Only the 5-then-1 pattern is implemented: a file that says otherwise is refused.
                let slides: Vec<bool> = types.iter().map(|t| t.as_str() == Some("sliding_attention")).collect();
                if slides.iter().enumerate().any(|(l, s)| *s != SlidingWindow::gemma3(w).slides(l)) {
                    return Err("layer_types other than five sliding layers then a global one".into());
                }
            }
            Some(s)
        }
        _ => None,
    };
    let attn_scale = match (arch, float("query_pre_attn_scalar")) {
        (Arch::Gemma3, Some(s)) if s > 0.0 => 1.0 / s.sqrt(),
        _ => 1.0 / (head_dim as f32).sqrt(),
    };
    let config = LlamaConfig {
        arch,
        n_layer: need("num_hidden_layers")?,
        hidden,
        ffn: need("intermediate_size")?,
        n_head,
        n_kv_head: num("num_key_value_heads").unwrap_or(n_head),
        head_dim,
        rope_base,
        rms_eps: float("rms_norm_eps").unwrap_or(1e-6),
        vocab: need("vocab_size")?,
        context_len: num("max_position_embeddings").unwrap_or(2048),
        attn_scale,
        embed_scale: (arch == Arch::Gemma3).then(|| (hidden as f32).sqrt()),
        sliding,
        qk_halves: true,
        rope_freq_factors,
    };
    config.check().map_err(|e| e.to_string())?;
    Ok(config)
}

/// Llama 3.1's RoPE scaling: long wavelengths slowed by `factor`, short ones kept, a smooth
/// blend between (Meta's formula, as Hugging Face's `rope_type: llama3` computes it).
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_context: f64,
}

impl Llama3Scaling {
    /// Per-pair divisors of the frequencies (what llama.cpp's converter stores as `rope_freqs`).
    pub fn factors(&self, base: f64, head_dim: usize) -> Vec<f32> {
        let (low_wavelen, high_wavelen) =
            (self.original_context / self.low_freq_factor, self.original_context / self.high_freq_factor);
        (0..head_dim / 2)
            .map(|i| {
                let inv_freq = 1.0 / base.powf(2.0 * i as f64 / head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
                let scaled = if wavelen < high_wavelen {
                    inv_freq
                } else if wavelen > low_wavelen {
                    inv_freq / self.factor
                } else {
                    let smooth = (self.original_context / wavelen - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    (1.0 - smooth) * inv_freq / self.factor + smooth * inv_freq
                };
                (inv_freq / scaled) as f32
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama 3.2's numbers (factor 32, low 1, high 4, original 8192, base 500,000, head 64): the
    /// fastest pairs keep their frequency, the slowest are divided by 32, one in between blends.
    #[test]
    fn llama3_scaling_by_hand() {
        let s = Llama3Scaling { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192.0 };
        let f = s.factors(500_000.0, 64);
        assert_eq!(f.len(), 32);
        assert_eq!(f[0], 1.0); // wavelength 2 pi < 2048
        assert!((f[31] - 32.0).abs() < 1e-5); // wavelength ~ 2.1e6 > 8192
                                              // Pair 16: inv_freq = 500000^-0.5 = 1.4142e-3, wavelength 4442.9 (between 2048 and 8192):
                                              // smooth = (8192 / 4442.9 - 1) / 3 = 0.28128; scaled = (0.71872 / 32 + 0.28128) inv_freq,
                                              // so the divisor is 1 / 0.30374 = 3.2923.
        assert!((f[16] - 3.2923).abs() < 1e-3, "{}", f[16]);
    }
}
