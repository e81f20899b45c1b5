//! The model's tokenizer, built from GGUF metadata, and exact incremental detokenization.
//!
//! candle's GGUF tokenizer is wrong for SmolLM2 (it adds a prefix space and mangles text after
//! special tokens), so the tokenizer is assembled here as a Hugging Face `tokenizer.json` from the
//! metadata and loaded with the `tokenizers` crate: byte-level BPE from `tokenizer.ggml.tokens` and
//! `merges`, the pre-tokenizer that `tokenizer.ggml.pre` names (`pretok.rs`), and token types 3
//! (control: special) and 4 (user-defined: matched whole, decoded as text) as added tokens.
//!
//! Decoding does not go through `tokenizers`: every token's raw bytes are computed once (the
//! inverse of GPT-2's byte-to-character map), so text is produced from bytes and a multi-byte
//! character split across tokens is held back until complete, never emitted broken.

use serde_json::{json, Value};
use std::collections::HashMap;
use tandem_model::TokenizerMeta;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    #[error("tokenizer error: {0}")]
    Build(String),
}

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    token_bytes: Vec<Vec<u8>>,
    special: Vec<bool>,
    by_text: HashMap<String, u32>,
    /// Raw bytes -> id, first id wins (logprob entries carry a token's bytes).
    by_bytes: HashMap<Vec<u8>, u32>,
    /// The longest token's bytes (every tokenize call bounds its input by it).
    max_token_bytes: usize,
    pub eos_id: u32,
    /// Every token that ends generation as EOS does: `eos_id`, the file's end-of-turn token, and
    /// the turn end of a chat template tandem supplies (Gemma's `<end_of_turn>`), as vLLM
    /// stops on every id of a model's `generation_config.json` `eos_token_id`.
    end_ids: Vec<u32>,
    pub bos_id: Option<u32>,
    pub add_bos: bool,
}

/// GPT-2's byte-to-character map: printable bytes map to themselves, the rest to U+0100 onwards.
fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    table
}

/// A built tokenizer with each token's bytes and whether it is special.
pub(crate) type Built<T> = Result<(T, Vec<Vec<u8>>, Vec<bool>), TokenizerError>;

/// Byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`: SmolLM2, Qwen, Llama 3, DeepSeek):
/// the `tokenizer.json` spec, each token's raw bytes, and which tokens are special.
fn byte_level(meta: &TokenizerMeta) -> Built<Value> {
    let pre = crate::pretok::lookup(&meta.pre).ok_or_else(|| {
        TokenizerError::Unsupported(format!(
            "tokenizer.ggml.pre = {:?} is not a pre-tokenizer tandem knows (supported: {})",
            meta.pre,
            crate::pretok::supported().join(", ")
        ))
    })?;
    let splits: Vec<Value> = pre
        .splits
        .iter()
        .map(|re| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false}))
        .chain([json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})])
        .collect();
    // Control tokens (type 3) are special; user-defined ones (type 4, such as Qwen's `<tool_call>`)
    // are matched whole in text as well but are ordinary text when decoded, as a tokenizer.json's
    // non-special added tokens are (vLLM keeps them with `skip_special_tokens`).
    let ty = |i: usize| meta.token_types.get(i).copied();
    let is_special = |i: usize| ty(i) == Some(3);
    let is_added = |i: usize| matches!(ty(i), Some(3) | Some(4));
    let vocab: serde_json::Map<String, Value> =
        meta.tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let added: Vec<Value> =
        (0..meta.tokens.len()).filter(|i| is_added(*i)).map(|i| added_token(meta, i, is_special(i))).collect();
    let normalizer = if pre.nfc { json!({"type": "NFC"}) } else { Value::Null };
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": pre.ignore_merges, "vocab": vocab, "merges": meta.merges},
    });
    let table = byte_to_char();
    let mut inverse: HashMap<char, u8> = HashMap::new();
    for (b, c) in table.iter().enumerate() {
        inverse.insert(*c, b as u8);
    }
    let special: Vec<bool> = (0..meta.tokens.len()).map(is_special).collect();
    let token_bytes = meta
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            // An added token's bytes are its text; the others' go through GPT-2's byte map.
            if is_added(i) {
                t.as_bytes().to_vec()
            } else {
                t.chars().map(|c| inverse.get(&c).copied().unwrap_or(b'?')).collect()
            }
        })
        .collect();
    Ok((spec, token_bytes, special))
}

/// llama.cpp's default where a file does not say whether to put BOS first: yes for SentencePiece
/// vocabularies and the families whose pre-tokenizer says so (Llama 3's, Tekken's), else no.
fn default_add_bos(meta: &TokenizerMeta) -> bool {
    match (meta.model.as_str(), &meta.hf_json) {
        (_, Some(_)) => false,
        ("llama", None) => true,
        _ => crate::pretok::lookup(&meta.pre).is_some_and(|p| p.add_bos),
    }
}

/// A Hugging Face `tokenizer.json` as it is. Each id's raw bytes follow from its piece: through
/// GPT-2's byte map where the tokenizer is byte-level, else SentencePiece's conventions (`▁` is a
/// space, `<0xNN>` one byte).
fn hugging_face(json: &str) -> Built<tokenizers::Tokenizer> {
    let inner: tokenizers::Tokenizer =
        json.parse().map_err(|e: tokenizers::Error| TokenizerError::Build(e.to_string()))?;
    let spec: Value = serde_json::from_str(json).map_err(|e| TokenizerError::Build(e.to_string()))?;
    let byte_level = spec.to_string().contains(r#""type":"ByteLevel""#);
    let n = inner.get_vocab_size(true);
    let inverse: HashMap<char, u8> = byte_to_char().iter().enumerate().map(|(b, c)| (*c, b as u8)).collect();
    let specials: std::collections::HashSet<u32> =
        inner.get_added_tokens_decoder().iter().filter(|(_, t)| t.special).map(|(id, _)| *id).collect();
    let mut token_bytes = Vec::with_capacity(n);
    let mut special = Vec::with_capacity(n);
    for id in 0..n as u32 {
        let piece = inner.id_to_token(id).unwrap_or_default();
        let sp = specials.contains(&id);
        special.push(sp);
        token_bytes.push(if sp {
            piece.into_bytes()
        } else if byte_level {
            piece.chars().map(|c| inverse.get(&c).copied().unwrap_or(b'?')).collect()
        } else if let Some(b) = crate::spm::byte_piece(&piece) {
            vec![b]
        } else {
            piece.replace('\u{2581}', " ").into_bytes()
        });
    }
    Ok((inner, token_bytes, special))
}

/// A `tokenizer.json` added token: matched whole in the input before the model splits the rest.
pub(crate) fn added_token(meta: &TokenizerMeta, id: usize, special: bool) -> Value {
    json!({"id": id, "content": meta.tokens[id], "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": false, "special": special})
}

impl TextTokenizer {
    /// The tokenizer as a directory `transformers.AutoTokenizer.from_pretrained` loads with the
    /// same ids: `tokenizer.json` (the one tandem tokenizes with) and `tokenizer_config.json`
    /// (its special tokens, the chat template, the context).
    pub fn hf_files(&self, chat_template: Option<&str>, context_len: usize) -> Vec<(String, Vec<u8>)> {
        let mut config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": self.token_text(self.eos_id),
            "model_max_length": context_len,
            "add_bos_token": self.add_bos,
            "clean_up_tokenization_spaces": false,
        });
        if let Some(bos) = self.bos_id {
            config["bos_token"] = json!(self.token_text(bos));
        }
        if let Some(t) = chat_template {
            config["chat_template"] = json!(t);
        }
        vec![
            ("tokenizer.json".to_string(), self.inner.to_string(false).unwrap_or_default().into_bytes()),
            ("tokenizer_config.json".to_string(), config.to_string().into_bytes()),
        ]
    }

    pub fn from_meta(meta: &TokenizerMeta) -> Result<Self, TokenizerError> {
        let (inner, token_bytes, special) = match (meta.model.as_str(), &meta.hf_json) {
            (_, Some(json)) => hugging_face(json)?,
            ("gpt2" | "llama", None) => {
                let (spec, token_bytes, special) =
                    if meta.model == "gpt2" { byte_level(meta)? } else { crate::spm::sentencepiece(meta)? };
                let inner: tokenizers::Tokenizer =
                    spec.to_string().parse().map_err(|e: tokenizers::Error| TokenizerError::Build(e.to_string()))?;
                (inner, token_bytes, special)
            }
            (other, None) => {
                return Err(TokenizerError::Unsupported(format!(
                    "tokenizer.ggml.model = {other:?} (supported: gpt2 byte-level BPE, llama SentencePiece)"
                )))
            }
        };
        let eos_id = meta.eos_id.ok_or_else(|| TokenizerError::Unsupported("no tokenizer.ggml.eos_token_id".into()))?;
        let by_text = inner.get_vocab(true).into_iter().collect();
        let mut by_bytes = HashMap::with_capacity(token_bytes.len());
        for (i, b) in token_bytes.iter().enumerate() {
            by_bytes.entry(b.clone()).or_insert(i as u32);
        }
        let max_token_bytes = token_bytes.iter().map(Vec::len).max().unwrap_or(1).max(1);
        Ok(TextTokenizer {
            inner,
            max_token_bytes,
            token_bytes,
            special,
            by_text,
            by_bytes,
            eos_id,
            end_ids: {
                let mut ids = vec![eos_id];
                for id in meta.eot_id.iter().chain(&meta.extra_end_ids) {
                    if !ids.contains(id) {
                        ids.push(*id);
                    }
                }
                ids
            },
            bos_id: meta.bos_id,
            add_bos: meta.add_bos.unwrap_or_else(|| default_add_bos(meta)),
        })
    }

    /// The tokenizer as a Hugging Face `tokenizer.json`.
    pub fn tokenizer_json(&self) -> String {
        self.inner.to_string(false).unwrap_or_default()
    }

    /// Whether `id` ends generation (see `end_ids`).
    pub fn is_end(&self, id: u32) -> bool {
        self.end_ids.contains(&id)
    }

    pub fn end_ids(&self) -> &[u32] {
        &self.end_ids
    }

    /// Adds the token written `text` to the ids that end generation (when it is in the vocabulary).
    pub fn add_end_token(&mut self, text: &str) {
        if let Some(id) = self.token_id(text).filter(|id| !self.end_ids.contains(id)) {
            self.end_ids.push(id);
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The most bytes of text one token stands for.
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// Token ids of `text`; special tokens written in the text are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(|e| TokenizerError::Build(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// The raw bytes of one token (a special token's bytes are its text).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// One token as text, lossy (for logprob entries, as vLLM shows split characters).
    pub fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.token_bytes(id)).into_owned()
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.by_text.get(text).copied()
    }

    /// The token whose raw bytes these are.
    pub fn token_id_for_bytes(&self, bytes: &[u8]) -> Option<u32> {
        self.by_bytes.get(bytes).copied()
    }

    /// Whole-sequence decoding.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut d = IncrementalDecoder::default();
        let mut out = String::new();
        for id in ids {
            out.push_str(&d.push(self, *id, skip_special));
        }
        out.push_str(&d.flush());
        out
    }
}

/// Turns a stream of tokens into text, holding back bytes of an incomplete UTF-8 character.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    pending: Vec<u8>,
}

impl IncrementalDecoder {
    /// The text completed by this token (possibly empty).
    pub fn push(&mut self, tok: &TextTokenizer, id: u32, skip_special: bool) -> String {
        if skip_special && tok.is_special(id) {
            return String::new();
        }
        self.pending.extend_from_slice(tok.token_bytes(id));
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(), // incomplete tail: wait for more
            Err(_) => {
                // Invalid bytes can never complete: emit them replaced, as a lossy decode would.
                let text = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                return text;
            }
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        text
    }

    /// Whatever is left at the end of a sequence (an incomplete character becomes U+FFFD).
    pub fn flush(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}
