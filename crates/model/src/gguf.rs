//! Reading a GGUF file: metadata once into typed values, tensors dequantised by candle.

use crate::arch::{Arch, SlidingWindow};
use crate::{LlamaConfig, ModelError};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::Device;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// What the tokenizer and chat template need from the file's metadata.
#[derive(Debug, Clone, Default)]
pub struct TokenizerMeta {
    /// `tokenizer.ggml.model`, e.g. `gpt2` (byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`, e.g. `smollm`.
    pub pre: String,
    pub tokens: Vec<String>,
    /// GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`: an end-of-turn token that also ends generation.
    pub eot_id: Option<u32>,
    /// SentencePiece piece scores (`tokenizer.ggml.scores`): higher merges first.
    pub scores: Vec<f32>,
    /// SentencePiece: whether a space is put before the text (`tokenizer.ggml.add_space_prefix`).
    pub add_space_prefix: bool,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// Whether a BOS is put before a prompt; `None` when the file does not say, and the
    /// tokenizer family's default applies (llama.cpp's: yes for SentencePiece and Llama 3).
    pub add_bos: Option<bool>,
    pub chat_template: Option<String>,
    /// Further ids that end generation (a Hugging Face `generation_config.json`'s `eos_token_id`).
    pub extra_end_ids: Vec<u32>,
    /// A Hugging Face `tokenizer.json`, used as it is (`model` is then `huggingface`).
    pub hf_json: Option<String>,
}

/// A tensor's size in the file by its header. Saturating: a hostile header's sizes must not
/// wrap into a small, "whole" file.
fn stored_bytes(t: &candle_core::quantized::gguf_file::TensorInfo) -> u64 {
    let blocks = (t.shape.elem_count() / t.ggml_dtype.block_size().max(1)) as u64;
    blocks.saturating_mul(t.ggml_dtype.type_size() as u64)
}

/// An open GGUF file with its parsed header.
pub struct GgufFile {
    content: Content,
    reader: BufReader<File>,
}

/// candle's errors carry the backtrace captured when `RUST_BACKTRACE` is set in their text; an
/// operator gets the message's first line only.
fn err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Gguf(first_line(&e))
}

fn first_line(e: &impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let file = File::open(path).map_err(|e| ModelError::Gguf(format!("{}: {e}", path.display())))?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(err)?;
        let file = GgufFile { content, reader };
        // A truncated download is refused at once, not after minutes of loading layers.
        let needed = file.data_end();
        if len < needed {
            return Err(ModelError::Gguf(format!(
                "{}: truncated: the file has {len} bytes, its tensors end at byte {needed}",
                path.display()
            )));
        }
        Ok(file)
    }

    /// Where the last tensor's data ends, by the header.
    pub fn data_end(&self) -> u64 {
        let c = &self.content;
        c.tensor_infos
            .values()
            .map(|t| c.tensor_data_offset.saturating_add(t.offset).saturating_add(stored_bytes(t)))
            .max()
            .unwrap_or(c.tensor_data_offset)
    }

    /// Every tensor's name, stored type and dims, sorted by name.
    pub fn tensors(&self) -> Vec<(String, candle_core::quantized::GgmlDType, Vec<usize>)> {
        let mut all: Vec<_> =
            self.content.tensor_infos.iter().map(|(n, t)| (n.clone(), t.ggml_dtype, t.shape.dims().to_vec())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    fn get(&self, key: &str) -> Result<&Value, ModelError> {
        self.content.metadata.get(key).ok_or_else(|| ModelError::Gguf(format!("metadata key {key} is missing")))
    }

    fn u32(&self, key: &str) -> Result<u32, ModelError> {
        self.get(key)?.to_u32().map_err(err)
    }

    fn opt_u32(&self, key: &str) -> Option<u32> {
        self.content.metadata.get(key).and_then(|v| v.to_u32().ok())
    }

    fn f32(&self, key: &str) -> Result<f32, ModelError> {
        self.get(key)?.to_f32().map_err(err)
    }

    pub fn string(&self, key: &str) -> Option<String> {
        self.content.metadata.get(key).and_then(|v| v.to_string().ok()).cloned()
    }

    fn strings(&self, key: &str) -> Vec<String> {
        match self.content.metadata.get(key) {
            Some(Value::Array(items)) => items.iter().filter_map(|v| v.to_string().ok().cloned()).collect(),
            _ => Vec::new(),
        }
    }

    /// The model's shape, read once, under the architecture's own key prefix.
    pub fn llama_config(&self) -> Result<LlamaConfig, ModelError> {
        let arch = Arch::parse(&self.string("general.architecture").unwrap_or_default())?;
        let key = |k: &str| format!("{}.{k}", arch.name());
        let hidden = self.u32(&key("embedding_length"))? as usize;
        let n_head = self.u32(&key("attention.head_count"))? as usize;
        // Qwen3 and Gemma 3 heads are wider than hidden / heads: key_length says so.
        let head_dim = self
            .opt_u32(&key("attention.key_length"))
            .or_else(|| self.opt_u32(&key("rope.dimension_count")))
            .map_or(hidden / n_head.max(1), |d| d as usize);
        if let Some(v) = self.opt_u32(&key("attention.value_length")) {
            if v as usize != head_dim {
                return Err(ModelError::Unsupported(format!("value heads of {v} with key heads of {head_dim}")));
            }
        }
        let vocab = match self.content.metadata.get("tokenizer.ggml.tokens") {
            Some(Value::Array(t)) => t.len(),
            _ => self.u32(&key("vocab_size"))? as usize,
        };
        // Llama 3.1's scaling comes as `rope_freqs.weight` (applied); the others would be
        // served wrong, so they are refused.
        if let Some(kind) = self.string(&key("rope.scaling.type")).filter(|k| k != "none") {
            return Err(ModelError::Unsupported(format!("RoPE scaling {kind:?} (only Llama 3's rope_freqs)")));
        }
        let sliding = match (arch, self.opt_u32(&key("attention.sliding_window"))) {
            (Arch::Gemma3, Some(w)) if w > 0 => Some(SlidingWindow::gemma3(w as usize)),
            _ => None,
        };
        let config = LlamaConfig {
            arch,
            n_layer: self.u32(&key("block_count"))? as usize,
            hidden,
            ffn: self.u32(&key("feed_forward_length"))? as usize,
            n_head,
            n_kv_head: self.opt_u32(&key("attention.head_count_kv")).map_or(n_head, |v| v as usize),
            head_dim,
            rope_base: self.f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            rms_eps: self.f32(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            vocab,
            context_len: self.opt_u32(&key("context_length")).unwrap_or(2048) as usize,
            // Gemma 3 scales scores by query_pre_attn_scalar^-1/2, which is head_dim for every
            // size but 27B (llama.cpp: `f_attention_scale`); the others by head_dim^-1/2.
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            embed_scale: (arch == Arch::Gemma3).then(|| (hidden as f32).sqrt()),
            sliding,
            qk_halves: arch.halves_rope(),
            rope_freq_factors: None,
        };
        config.check()?;
        Ok(config)
    }

    /// `rope_freqs.weight` (Llama 3.1+), checked against the config; `None` when absent.
    pub fn rope_freq_factors(&mut self, c: &LlamaConfig) -> Result<Option<Vec<f32>>, ModelError> {
        if !self.has_tensor("rope_freqs.weight") {
            return Ok(None);
        }
        let (f, _) = self.tensor_f32("rope_freqs.weight")?;
        if f.len() != c.head_dim / 2 || f.iter().any(|x| !x.is_finite() || *x <= 0.0) {
            return Err(ModelError::Gguf(format!(
                "rope_freqs.weight: {} values, not {} positive ones",
                f.len(),
                c.head_dim / 2
            )));
        }
        Ok(Some(f))
    }

    pub fn tokenizer_meta(&self) -> TokenizerMeta {
        let token_types = match self.content.metadata.get("tokenizer.ggml.token_type") {
            Some(Value::Array(t)) => t.iter().map(|v| v.to_i32().unwrap_or(1)).collect(),
            _ => Vec::new(),
        };
        TokenizerMeta {
            model: self.string("tokenizer.ggml.model").unwrap_or_default(),
            pre: self.string("tokenizer.ggml.pre").unwrap_or_default(),
            tokens: self.strings("tokenizer.ggml.tokens"),
            token_types,
            merges: self.strings("tokenizer.ggml.merges"),
            bos_id: self.opt_u32("tokenizer.ggml.bos_token_id"),
            eos_id: self.opt_u32("tokenizer.ggml.eos_token_id"),
            eot_id: self.opt_u32("tokenizer.ggml.eot_token_id"),
            scores: match self.content.metadata.get("tokenizer.ggml.scores") {
                Some(Value::Array(s)) => s.iter().map(|v| v.to_f32().unwrap_or(0.0)).collect(),
                _ => Vec::new(),
            },
            // SentencePiece's own default is to add it; Gemma's files say false.
            add_space_prefix: !matches!(
                self.content.metadata.get("tokenizer.ggml.add_space_prefix"),
                Some(Value::Bool(false))
            ),
            unk_id: self.opt_u32("tokenizer.ggml.unknown_token_id"),
            pad_id: self.opt_u32("tokenizer.ggml.padding_token_id"),
            add_bos: match self.content.metadata.get("tokenizer.ggml.add_bos_token") {
                Some(Value::Bool(b)) => Some(*b),
                _ => None,
            },
            chat_template: self.string("tokenizer.chat_template"),
            extra_end_ids: Vec::new(),
            hf_json: None,
        }
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// A tensor's stored type, `None` for an unknown name.
    pub fn tensor_dtype(&self, name: &str) -> Option<candle_core::quantized::GgmlDType> {
        self.content.tensor_infos.get(name).map(|t| t.ggml_dtype)
    }

    /// A tensor's GGML type and raw bytes, as stored: read straight into one buffer (through
    /// candle's `QTensor` the bytes were held twice while loading, which set a model's peak
    /// memory: the vocabulary's matrix is the largest tensor of most models).
    pub fn tensor_raw(&mut self, name: &str) -> Result<(candle_core::quantized::GgmlDType, Vec<u8>), ModelError> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| ModelError::Gguf(format!("{name}: no such tensor in the file")))?;
        let dtype = info.ggml_dtype;
        let (elems, block) = (info.shape.elem_count(), dtype.block_size().max(1));
        if !elems.is_multiple_of(block) {
            return Err(ModelError::Gguf(format!("{name}: {elems} values are not whole blocks of {dtype:?}")));
        }
        // `open` checked that every tensor's bytes lie inside the file.
        let at = self.content.tensor_data_offset.saturating_add(info.offset);
        let mut data = vec![0u8; stored_bytes(info) as usize];
        self.reader
            .seek(SeekFrom::Start(at))
            .and_then(|_| self.reader.read_exact(&mut data))
            .map_err(|e| ModelError::Gguf(format!("{name}: {e}")))?;
        Ok((dtype, data))
    }

    /// A tensor dequantised to f32, with its dims (outermost first; weights are (out, in)).
    pub fn tensor_f32(&mut self, name: &str) -> Result<(Vec<f32>, Vec<usize>), ModelError> {
        let q = self
            .content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| ModelError::Gguf(format!("{name}: {}", first_line(&e))))?;
        let t = q.dequantize(&Device::Cpu).map_err(err)?;
        let dims = t.dims().to_vec();
        let data = t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(err)?;
        Ok((data, dims))
    }
}
