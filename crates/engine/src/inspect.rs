//! What a model file is and whether tandem serves it, from its header alone (`tandem models
//! inspect`), and the same checks before a model's weights are loaded, so that a file tandem
//! cannot serve is refused in a second with one line, not after minutes of loading layers.

use crate::template::ChatTemplate;
use crate::tokenizer::TextTokenizer;
use crate::EngineError;
use std::collections::BTreeMap;
use std::path::Path;
use tandem_model::gguf::GgufFile;
use tandem_model::source::WeightSource;
use tandem_model::{LlamaConfig, TokenizerMeta};

/// Stored types the kernels multiply as they are; the others are converted at load.
const KEPT: &[&str] = &["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"];

/// The checks that need no weights: the file opens and is whole, the architecture and its shape
/// are supported, the tokenizer builds, the chat template compiles.
pub fn preflight(path: &Path) -> Result<Checked, EngineError> {
    let mut source = WeightSource::open(path)?;
    let config = source.llama_config()?;
    let meta = source.tokenizer_meta()?;
    let tokenizer = TextTokenizer::from_meta(&meta)?;
    if let Some(t) = meta.chat_template.as_deref() {
        ChatTemplate::new(t)?;
    }
    Ok(Checked { config, meta, tokenizer })
}

/// What [`preflight`] read and built, for its callers to use rather than build again (the
/// tokenizer of a large vocabulary is, after the weights, a model's largest allocation).
pub struct Checked {
    pub config: LlamaConfig,
    pub meta: TokenizerMeta,
    pub tokenizer: TextTokenizer,
}

/// A GGUF file described, a line a fact, and the verdict: `Ok` when tandem serves it, else why not.
pub struct Report {
    pub lines: Vec<(&'static str, String)>,
    pub verdict: Result<(), String>,
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn inspect(path: &Path) -> Report {
    let mut lines = Vec::new();
    if path.is_dir() {
        lines.push(("file", path.display().to_string()));
        let verdict = preflight(path).map(drop).map_err(|e| e.to_string());
        lines.push(("kind", "Hugging Face checkpoint directory".into()));
        return Report { lines, verdict };
    }
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    lines.push(("file", format!("{} ({} bytes)", path.display(), thousands(bytes))));
    let file = match GgufFile::open(path) {
        Ok(f) => f,
        Err(e) => return Report { lines, verdict: Err(e.to_string()) },
    };
    if let Some(name) = file.string("general.name") {
        lines.push(("name", name));
    }
    let arch = file.string("general.architecture").unwrap_or_else(|| "(none)".into());
    lines.push((
        "architecture",
        match file.llama_config() {
            Ok(c) => format!(
                "{arch}: {} layers, hidden {}, MLP {}, {} query heads and {} key/value heads of {}, \
                 context {}, RoPE base {}",
                c.n_layer, c.hidden, c.ffn, c.n_head, c.n_kv_head, c.head_dim, c.context_len, c.rope_base
            ),
            Err(_) => arch,
        },
    ));
    let meta = file.tokenizer_meta();
    let pre = if meta.pre.is_empty() { String::new() } else { format!(", pre-tokenizer {}", meta.pre) };
    let bos = meta.bos_id.map_or(String::new(), |b| {
        format!(
            ", BOS {b} ({})",
            match meta.add_bos {
                Some(true) => "added",
                Some(false) => "not added",
                None => "the family's default",
            }
        )
    });
    let eos = meta.eos_id.map_or(String::new(), |e| format!(", EOS {e}"));
    lines.push((
        "tokenizer",
        format!("{} tokens, tokenizer.ggml.model {}{pre}{bos}{eos}", thousands(meta.tokens.len() as u64), meta.model),
    ));
    lines.push((
        "chat template",
        match &meta.chat_template {
            Some(t) if t.contains("tools") => format!("in the file ({} chars; renders tools)", t.len()),
            Some(t) => format!("in the file ({} chars)", t.len()),
            None => "none in the file (tandem supplies one for Gemma 3; else chat needs a template)".into(),
        },
    ));
    let tensors = file.tensors();
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    for (_, dtype, _) in &tensors {
        // candle writes K-quants as `Q4K`; llama.cpp's names (`Q4_K`) are the ones users know.
        let name = format!("{dtype:?}");
        let name = match name.strip_suffix('K') {
            Some(stem) if !stem.ends_with('_') => format!("{stem}_K"),
            _ => name,
        };
        *by_type.entry(name).or_default() += 1;
    }
    let mut counts: Vec<(String, usize)> = by_type.into_iter().collect();
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    let list = |kept: bool| {
        counts
            .iter()
            .filter(|(t, _)| t != "F32" && KEPT.contains(&t.as_str()) == kept)
            .map(|(t, n)| format!("{t} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let f32s = counts.iter().find(|(t, _)| t == "F32").map_or(0, |c| c.1);
    let (kept, converted) = (list(true), list(false));
    lines.push((
        "tensors",
        format!(
            "{}: kept as stored {}; converted at load (--quantize) {}; F32 {f32s}",
            tensors.len(),
            if kept.is_empty() { "none".into() } else { kept },
            if converted.is_empty() { "none".into() } else { converted },
        ),
    ));
    Report { lines, verdict: preflight(path).map(drop).map_err(|e| e.to_string()) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_groups_digits() {
        assert_eq!(super::thousands(0), "0");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(491400064), "491,400,064");
    }
}
