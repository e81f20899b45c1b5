//! A checkpoint merged into its base model as one GGUF file (`tandem export --merged`), for the
//! tools that take a plain model (llama.cpp, Ollama): each projection the adapter holds becomes
//! `W + scale · B · A` (B's q and k rows are already in the GGUF's order, as `peft::read` gives
//! them); every other tensor and all the metadata are copied as stored. An output-head pair
//! (Tinker's `train_unembed`) merges into `output.weight`; a base whose head is tied to the
//! embedding gets its own `output.weight` (the embedding plus the product), the embedding kept.

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

/// The output head's tensor, and the embedding a tied head reads.
const OUTPUT: &str = "output.weight";
const EMBEDDING: &str = "token_embd.weight";

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
    // The product is summed apart (in f64) and added to each weight once: adding the rank terms
    // into the weight one by one would round at the weight's scale once per term, which for a
    // small update is most of it.
    let mut delta = vec![0f64; in_dim];
    for o in 0..out_dim {
        delta.iter_mut().for_each(|d| *d = 0.0);
        for (r, &bv) in b[o * rank..(o + 1) * rank].iter().enumerate() {
            let k = f64::from(scale) * f64::from(bv);
            for (d, &av) in delta.iter_mut().zip(&a[r * in_dim..(r + 1) * in_dim]) {
                *d += k * f64::from(av);
            }
        }
        for (x, d) in out[o * in_dim..(o + 1) * in_dim].iter_mut().zip(&delta) {
            *x = (f64::from(*x) + d) as f32;
        }
    }
    out
}

/// Writes `base` with the adapter of `adapter_dir` merged into `out`, through a new temporary
/// file beside it, renamed into place once whole. Weight matrices take `format`; 1-D tensors
/// (the norms) stay as stored. Refused: `out` naming the base itself, a base that declares an
/// alignment other than the 32 bytes the writer uses, an adapter with a projection the base does
/// not have.
pub fn merge_to_gguf(
    base: &Path,
    adapter_dir: &Path,
    out: &Path,
    format: MergeFormat,
) -> Result<MergeReport, ModelError> {
    let same = |a: &Path, b: &Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y);
    if same(base, out) {
        return Err(ModelError::Gguf(format!("{} is the base model itself; write the merge elsewhere", out.display())));
    }
    // The temporary file first: a target directory that cannot take it fails before the work.
    let parent = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp =
        tempfile::Builder::new().prefix(".tandem-merge-").suffix(".gguf").tempfile_in(parent).map_err(io(parent))?;
    let config = GgufFile::open(base)?.llama_config()?;
    let adapter = peft::read(adapter_dir, &config)?;
    let scale = adapter.config.scale() as f32;
    let mut pairs = HashMap::new();
    for (l, layer) in adapter.layers.iter().enumerate() {
        for (pair, module) in layer.iter().zip(Module::ALL) {
            if let Some(p) = pair {
                // `peft::read` gives q/k's B rows in the internal interleaved order, which is the
                // file's own for Llama; Qwen and Gemma files keep Hugging Face's (`crate::arch`).
                let b = if config.qk_halves && module.rotary_rows() {
                    let rows = p.b.len() / adapter.config.r;
                    crate::arch::pairs_to_halves(&p.b, rows / config.head_dim, config.head_dim, adapter.config.r)
                } else {
                    p.b.clone()
                };
                pairs.insert(gguf_name(l, module), ((&p.a, b), module.dims(&config)));
            }
        }
    }
    if let Some(p) = &adapter.head {
        pairs.insert(OUTPUT.to_string(), ((&p.a, p.b.clone()), peft::head_dims(&config)));
    }
    let mut reader = std::io::BufReader::new(std::fs::File::open(base).map_err(io(base))?);
    let content = gguf_file::Content::read(&mut reader).map_err(err)?;
    // A tied head takes the embedding's values (and its type) as its base.
    let untie = adapter.head.is_some() && !content.tensor_infos.contains_key(OUTPUT);
    match content.metadata.get("general.alignment").map(|v| v.to_u32()) {
        None | Some(Ok(32)) => {}
        other => {
            return Err(ModelError::Unsupported(format!(
                "the base declares general.alignment {other:?}; the merged file can only be written with 32"
            )))
        }
    }
    // In the base file's order, so the merged file reads the same way.
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort_by_key(|n| content.tensor_infos[*n].offset);
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len() + 1);
    let mut report = MergeReport { merged: 0, copied: 0 };
    let mut sources: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), n.as_str())).collect();
    if untie {
        sources.push((OUTPUT, EMBEDDING));
    }
    for (name, source) in sources {
        let q = content.tensor(&mut reader, source, &Device::Cpu).map_err(err)?;
        let dtype = if q.shape().rank() >= 2 { format.dtype(q.dtype()) } else { q.dtype() };
        let merge = pairs.get(name);
        let written = match merge {
            Some((pair, (in_dim, out_dim))) => {
                let t = q.dequantize(&Device::Cpu).map_err(err)?;
                let dims = t.dims().to_vec();
                if dims != [*out_dim, *in_dim] {
                    return Err(ModelError::Gguf(format!(
                        "{name}: shape {dims:?}, the adapter needs [{out_dim}, {in_dim}]"
                    )));
                }
                let w = t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(err)?;
                let m = merged_weight(&w, pair.0, &pair.1, adapter.config.r, scale, *out_dim);
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
        tensors.push((name.to_string(), written));
    }
    if report.merged != pairs.len() {
        let mut missing: Vec<&String> = pairs.keys().filter(|k| !content.tensor_infos.contains_key(*k)).collect();
        missing.sort();
        return Err(ModelError::Adapter(format!("the base has no tensor for the adapter's {missing:?}")));
    }
    let mut metadata: Vec<(String, Value)> = content.metadata.clone().into_iter().collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(ft) = format.file_type() {
        metadata.retain(|(k, _)| k != "general.file_type");
        metadata.push(("general.file_type".into(), Value::U32(ft)));
    }
    let mut f = std::io::BufWriter::new(tmp.as_file());
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).map_err(err)?;
    std::io::Write::flush(&mut f).map_err(io(tmp.path()))?;
    drop(f);
    tmp.as_file().sync_all().map_err(io(tmp.path()))?;
    // Dropped on any error above, the temporary file is removed; persisted, it becomes `out`.
    tmp.persist(out).map_err(|e| io(out)(e.error))?;
    std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(io(parent))?;
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
