//! What the real-vocabulary tests share: the repository's root, JSON files read with a hint of
//! how to get them, and a `tokenizer.json` turned into the GGUF vocabulary llama.cpp would write.

use serde_json::Value;
use std::path::{Path, PathBuf};
use tandem_model::TokenizerMeta;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn read_json(path: &Path, hint: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e} ({hint})", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A GGUF-style vocabulary from a `tokenizer.json`, as llama.cpp's converter writes one: every id
/// up to the largest, added tokens typed control (special) or user-defined, gaps as unused pads.
pub fn gguf_meta(tokenizer_json: &Value, pre: &str) -> TokenizerMeta {
    let model = &tokenizer_json["model"];
    let mut pieces: Vec<(usize, String, i32)> = model["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(t, id)| (id.as_u64().unwrap() as usize, t.clone(), 1))
        .collect();
    for a in tokenizer_json["added_tokens"].as_array().unwrap() {
        let id = a["id"].as_u64().unwrap() as usize;
        pieces.retain(|p| p.0 != id);
        let ty = if a["special"].as_bool().unwrap() { 3 } else { 4 };
        pieces.push((id, a["content"].as_str().unwrap().to_string(), ty));
    }
    let n = pieces.iter().map(|p| p.0).max().unwrap() + 1;
    let mut tokens: Vec<String> = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut token_types = vec![5; n];
    for (id, text, ty) in pieces {
        tokens[id] = text;
        token_types[id] = ty;
    }
    let merges = model["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(pair) => format!("{} {}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap()),
            other => panic!("merge {other}"),
        })
        .collect();
    TokenizerMeta {
        model: "gpt2".into(),
        pre: pre.into(),
        tokens,
        token_types,
        merges,
        eos_id: Some(0),
        ..Default::default()
    }
}
