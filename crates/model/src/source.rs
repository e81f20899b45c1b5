//! Where a model's weights come from: a GGUF file or a Hugging Face checkpoint directory, asked
//! for tensors by their GGUF names either way (`hf` maps the names and conventions).

use crate::gguf::GgufFile;
use crate::hf::HfDir;
use crate::{LlamaConfig, ModelError, TokenizerMeta};
use candle_core::quantized::GgmlDType;
use std::path::Path;

pub enum WeightSource {
    Gguf(GgufFile),
    Hf(Box<HfDir>),
}

impl WeightSource {
    /// A directory is a Hugging Face checkpoint; a file is GGUF.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        if path.is_dir() {
            Ok(WeightSource::Hf(Box::new(HfDir::open(path)?)))
        } else {
            Ok(WeightSource::Gguf(GgufFile::open(path)?))
        }
    }

    pub fn llama_config(&mut self) -> Result<LlamaConfig, ModelError> {
        match self {
            WeightSource::Gguf(f) => {
                let mut c = f.llama_config()?;
                c.rope_freq_factors = f.rope_freq_factors(&c)?;
                Ok(c)
            }
            WeightSource::Hf(d) => Ok(d.config().clone()),
        }
    }

    pub fn tokenizer_meta(&self) -> Result<TokenizerMeta, ModelError> {
        match self {
            WeightSource::Gguf(f) => Ok(f.tokenizer_meta()),
            WeightSource::Hf(d) => d.tokenizer_meta(),
        }
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        match self {
            WeightSource::Gguf(f) => f.has_tensor(name),
            WeightSource::Hf(d) => d.has_tensor(name),
        }
    }

    /// A tensor dequantised to f32, with its dims (outermost first; weights are (out, in)).
    pub fn tensor_f32(&mut self, name: &str) -> Result<(Vec<f32>, Vec<usize>), ModelError> {
        match self {
            WeightSource::Gguf(f) => f.tensor_f32(name),
            WeightSource::Hf(d) => d.tensor_f32(name),
        }
    }

    /// A GGUF tensor's stored type (`None` for a safetensors directory, whose tensors are
    /// plain floats, or an unknown name).
    pub fn gguf_dtype(&self, name: &str) -> Option<GgmlDType> {
        match self {
            WeightSource::Gguf(f) => f.tensor_dtype(name),
            WeightSource::Hf(_) => None,
        }
    }

    /// A GGUF tensor's bytes as stored, for the formats the kernels use as they are.
    pub fn raw_bytes(&mut self, name: &str) -> Result<Option<Vec<u8>>, ModelError> {
        match self {
            WeightSource::Gguf(f) => Ok(Some(f.tensor_raw(name)?.1)),
            WeightSource::Hf(_) => Ok(None),
        }
    }
}
