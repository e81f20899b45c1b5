//! A checkpoint merged into its base model as one GGUF file (`tandem export --merged`), for the
//! tools that take a plain model (llama.cpp, Ollama): each projection the adapter holds becomes
//! `W + scale · B · A` (B's q and k rows are already in the GGUF's order, as `peft::read` gives
//! them); every other tensor and all the metadata are copied as stored.

use crate::peft::{self, Module};
use crate::{GgufFile, ModelError};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// The type the merged file's weight matrices take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeFormat {
    /// Each tensor keeps its type in the base file (a merged projection is quantised back to it).
    Base,
    F32,
    F16,
    Q8_0,
}

impl MergeFormat {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "base" => Some(MergeFormat::Base),
            "f32" => Some(MergeFormat::F32),
            "f16" => Some(MergeFormat::F16),
            "q8_0" => Some(MergeFormat::Q8_0),
            _ => None,
        }
    }

    /// GGUF's `general.file_type` for a whole-file type (llama.cpp's `LLAMA_FTYPE_*`).
    fn file_type(self) -> Option<u32> {
        match self {
            MergeFormat::Base => None,
            MergeFormat::F32 => Some(0),
            MergeFormat::F16 => Some(1),
            MergeFormat::Q8_0 => Some(7),
        }
    }

    fn dtype(self, stored: GgmlDType) -> GgmlDType {
        match self {
            MergeFormat::Base => stored,
            MergeFormat::F32 => GgmlDType::F32,
            MergeFormat::F16 => GgmlDType::F16,
            MergeFormat::Q8_0 => GgmlDType::Q8_0,
        }
    }
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeReport {
    /// Projections that took the adapter's product.
    pub merged: usize,
    /// Tensors written otherwise (as stored, or converted to the chosen type).
    pub copied: usize,
}

/// The GGUF name of a layer's projection.
fn gguf_name(layer: usize, module: Module) -> String {
    let short = match module {
        Module::Q => "attn_q",
        Module::K => "attn_k",
        Module::V => "attn_v",
        Module::O => "attn_output",
        Module::Gate => "ffn_gate",
        Module::Up => "ffn_up",
        Module::Down => "ffn_down",
    };
    format!("blk.{layer}.{short}.weight")
}

fn err(e: candle_core::Error) -> ModelError {
    ModelError::Gguf(e.to_string())
}

fn io(what: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |e| ModelError::Gguf(format!("{}: {e}", what.display()))
}

/// `w + scale · b · a`, row-major: `w` is (out, in), `b` (out, r), `a` (r, in).
pub fn merged_weight(w: &[f32], a: &[f32], b: &[f32], rank: usize, scale: f32, out_dim: usize) -> Vec<f32> {
    let in_dim = a.len() / rank.max(1);
    let mut out = w.to_vec();
    for o in 0..out_dim {
        let row = &mut out[o * in_dim..(o + 1) * in_dim];
        for (r, &bv) in b[o * rank..(o + 1) * rank].iter().enumerate() {
            let k = scale * bv;
            for (x, &av) in row.iter_mut().zip(&a[r * in_dim..(r + 1) * in_dim]) {
                *x += k * av;
            }
        }
    }
    out
}

/// Writes `base` with the adapter of `adapter_dir` merged into `out` (through a temporary file
/// beside it, renamed into place once whole). Weight matrices take `format` (1-D tensors, the
/// norms, stay as stored).
pub fn merge_to_gguf(base: &Path, adapter_dir: &Path, out: &Path, format: MergeFormat) -> Result<MergeReport, ModelError> {
    let config = GgufFile::open(base)?.llama_config()?;
    let adapter = peft::read(adapter_dir, &config)?;
    let scale = adapter.config.scale() as f32;
    let mut pairs = HashMap::new();
    for (l, layer) in adapter.layers.iter().enumerate() {
        for (pair, module) in layer.iter().zip(Module::ALL) {
            if let Some(p) = pair {
                pairs.insert(gguf_name(l, module), (p, module.dims(&config).1));
            }
        }
    }
    let mut reader = std::io::BufReader::new(std::fs::File::open(base).map_err(io(base))?);
    let content = gguf_file::Content::read(&mut reader).map_err(err)?;
    // In the base file's order, so the merged file reads the same way.
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort_by_key(|n| content.tensor_infos[*n].offset);
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    let mut report = MergeReport { merged: 0, copied: 0 };
    for name in names {
        let q = content.tensor(&mut reader, name, &Device::Cpu).map_err(err)?;
        let dtype = if q.shape().rank() >= 2 { format.dtype(q.dtype()) } else { q.dtype() };
        let written = match pairs.get(name.as_str()) {
            Some((pair, out_dim)) => {
                let t = q.dequantize(&Device::Cpu).map_err(err)?;
                let dims = t.dims().to_vec();
                let w = t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(err)?;
                if w.len() != out_dim * (pair.a.len() / adapter.config.r) {
                    return Err(ModelError::Gguf(format!("{name}: shape {dims:?} does not match the adapter")));
                }
                let m = merged_weight(&w, &pair.a, &pair.b, adapter.config.r, scale, *out_dim);
                report.merged += 1;
                let t = Tensor::from_vec(m, dims, &Device::Cpu).map_err(err)?;
                QTensor::quantize(&t, dtype).map_err(|e| ModelError::Gguf(format!("{name} as {dtype:?}: {e}")))?
            }
            None if dtype == q.dtype() => {
                report.copied += 1;
                q
            }
            None => {
                report.copied += 1;
                let t = q.dequantize(&Device::Cpu).map_err(err)?;
                QTensor::quantize(&t, dtype).map_err(|e| ModelError::Gguf(format!("{name} as {dtype:?}: {e}")))?
            }
        };
        tensors.push((name.clone(), written));
    }
    if report.merged == 0 {
        return Err(ModelError::Adapter("the adapter holds no projection of this model to merge".into()));
    }
    let mut metadata: Vec<(String, Value)> = content.metadata.clone().into_iter().collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(ft) = format.file_type() {
        metadata.retain(|(k, _)| k != "general.file_type");
        metadata.push(("general.file_type".into(), Value::U32(ft)));
    }
    let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
    let written = (|| -> Result<(), ModelError> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io(&tmp))?);
        let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        gguf_file::write(&mut f, &meta_refs, &tensor_refs).map_err(err)?;
        let f = f.into_inner().map_err(|e| io(&tmp)(e.into_error()))?;
        f.sync_all().map_err(io(&tmp))?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).map_err(io(out))?;
    // The rename itself is durable once the directory is.
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_product_is_added_row_by_row() {
        // w (2, 3); a (1, 3) = [1, 2, 3]; b (2, 1) = [1, -1]; scale 2.
        let w = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let m = merged_weight(&w, &[1.0, 2.0, 3.0], &[1.0, -1.0], 1, 2.0, 2);
        assert_eq!(m, [2.0, 4.0, 7.0, -1.0, -3.0, -5.0]);
        // Rank 2 sums both terms: a = [[1, 0], [0, 1]], b = [[1, 2]] (1, 2), w = [0, 0].
        let m = merged_weight(&[0.0, 0.0], &[1.0, 0.0, 0.0, 1.0], &[1.0, 2.0], 2, 1.0, 1);
        assert_eq!(m, [1.0, 2.0]);
    }

    #[test]
    fn formats_parse_by_name() {
        assert_eq!(MergeFormat::parse("q8_0"), Some(MergeFormat::Q8_0));
        assert_eq!(MergeFormat::parse("base"), Some(MergeFormat::Base));
        assert_eq!(MergeFormat::parse("q4_k"), None);
    }
}
