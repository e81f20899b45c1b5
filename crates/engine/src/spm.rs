//! SentencePiece BPE vocabularies from GGUF (`tokenizer.ggml.model = llama`: Gemma, Llama 2,
//! Mistral), as a Hugging Face `tokenizer.json` spec.
//!
//! The GGUF holds pieces with scores and types but no merge list. SentencePiece's BPE merges, at
//! each step, the adjacent pair whose joined piece scores highest; a BPE with merges ranked by
//! the joined piece's score does the same, so the merges are derived from the vocabulary: every
//! split of a normal piece into two normal pieces is a merge, ranked by the piece's score (ties
//! by the halves' ids), as Hugging Face's converter derives them from a `.model` file.
//!
//! Text: spaces become U+2581 (`▁`), with one put before the text only when the file asks
//! (`add_space_prefix`; Gemma's does not). Characters without a piece fall back to their UTF-8
//! bytes as `<0xNN>` pieces (type 6). Control pieces (type 3, e.g. `<start_of_turn>`) are special
//! tokens; user-defined pieces (type 4: Gemma's runs of newlines and tabs, HTML tags) are matched
//! whole in the text, as SentencePiece does, but are ordinary text when decoded.

use crate::tokenizer::{added_token, TokenizerError};
use serde_json::{json, Value};
use std::collections::HashMap;
use tandem_model::TokenizerMeta;

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

/// The spec, each token's raw bytes, and which tokens are special.
pub(crate) fn sentencepiece(meta: &TokenizerMeta) -> crate::tokenizer::Built<Value> {
    let n = meta.tokens.len();
    if meta.token_types.len() != n || meta.scores.len() != n {
        return Err(TokenizerError::Unsupported(format!(
            "SentencePiece vocabulary of {n} pieces with {} types and {} scores",
            meta.token_types.len(),
            meta.scores.len()
        )));
    }
    let ty = |i: usize| meta.token_types[i];
    let mut token_bytes = Vec::with_capacity(n);
    for (i, piece) in meta.tokens.iter().enumerate() {
        token_bytes.push(match ty(i) {
            BYTE => vec![byte_piece(piece)
                .ok_or_else(|| TokenizerError::Unsupported(format!("byte piece {i} is {piece:?}, not <0xNN>")))?],
            _ => piece.replace('\u{2581}', " ").into_bytes(),
        });
    }
    let special: Vec<bool> = (0..n).map(|i| ty(i) == CONTROL).collect();
    let added: Vec<Value> = (0..n)
        .filter(|i| matches!(ty(*i), CONTROL | USER_DEFINED))
        .map(|i| added_token(meta, i, ty(i) == CONTROL))
        .collect();
    let vocab: serde_json::Map<String, Value> =
        meta.tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let normalizer = if meta.add_space_prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, replace]})
    } else {
        replace
    };
    let unk = meta.unk_id.and_then(|u| meta.tokens.get(u as usize)).cloned();
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                  "vocab": vocab, "merges": merges(meta)},
    });
    Ok((spec, token_bytes, special))
}

/// `<0x0A>` -> 10.
pub(crate) fn byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// Merges as `[left, right]` pairs, highest-scoring joined piece first.
fn merges(meta: &TokenizerMeta) -> Vec<[String; 2]> {
    let normal: HashMap<&str, usize> = meta
        .tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| meta.token_types[*i] == NORMAL)
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    // (score of the joined piece, left id, right id)
    let mut found: Vec<(f32, usize, usize)> = Vec::new();
    for (piece, &id) in &normal {
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&li), Some(&ri)) = (normal.get(l), normal.get(r)) {
                found.push((meta.scores[id], li, ri));
            }
        }
    }
    found.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    found.into_iter().map(|(_, l, r)| [meta.tokens[l].clone(), meta.tokens[r].clone()]).collect()
}

#[cfg(test)]
mod tests {
    use crate::tokenizer::TextTokenizer;
    use tandem_model::TokenizerMeta;

    /// A hand-made SentencePiece vocabulary: specials, bytes, characters and merged pieces whose
    /// scores make "▁he" + "llo" the route to "▁hello" only when "▁hello" is in the vocabulary.
    fn meta(add_space_prefix: bool) -> TokenizerMeta {
        let mut tokens: Vec<String> =
            ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n\n"].map(String::from).to_vec();
        let mut types = vec![3, 3, 3, 3, 3, 3, 4];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        let pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "llo", "▁hello", "or", "▁w", "▁wor"];
        for p in pieces {
            tokens.push(p.into());
            types.push(1);
        }
        let scores = (0..tokens.len()).map(|i| if types[i] == 1 { -(i as f32) } else { 0.0 }).collect();
        TokenizerMeta {
            model: "llama".into(),
            tokens,
            token_types: types,
            scores,
            bos_id: Some(2),
            eos_id: Some(1),
            unk_id: Some(3),
            add_bos: Some(true),
            add_space_prefix,
            ..TokenizerMeta::default()
        }
    }

    fn pieces(tok: &TextTokenizer, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|i| tok.token_text(*i)).collect()
    }

    #[test]
    fn pieces_merge_by_score_and_unknown_characters_fall_back_to_bytes() {
        let tok = TextTokenizer::from_meta(&meta(false)).unwrap();
        let ids = tok.encode("hello world").unwrap();
        // No prefix space: "hello" starts without "▁"; " world" is "▁wor" + "l" + "d".
        assert_eq!(pieces(&tok, &ids), ["h", "e", "llo", " wor", "l", "d"]);
        assert_eq!(tok.decode(&ids, false), "hello world");
        let ids = tok.encode(" hello").unwrap();
        assert_eq!(pieces(&tok, &ids), [" hello"]);
        // "é" has no piece: its two UTF-8 bytes; decoded back whole.
        let ids = tok.encode("hé").unwrap();
        assert_eq!(ids.len(), 3);
        assert_eq!(tok.decode(&ids, false), "hé");
        // Control pieces in the text are special tokens; user-defined ones are text.
        let ids = tok.encode("<start_of_turn>hello\n\nhe<end_of_turn>").unwrap();
        assert_eq!(ids[0], 4);
        assert_eq!(ids[ids.len() - 1], 5);
        assert!(ids.contains(&6));
        assert_eq!(tok.decode(&ids, true), "hello\n\nhe");
    }

    #[test]
    fn a_space_prefix_is_added_when_the_file_asks() {
        let tok = TextTokenizer::from_meta(&meta(true)).unwrap();
        let ids = tok.encode("hello").unwrap();
        assert_eq!(pieces(&tok, &ids), [" hello"]);
    }

    /// The same vocabularies as Hugging Face `tokenizer.json` files (what a checkpoint directory
    /// holds): the same ids and the same bytes per id, for SentencePiece and for byte-level BPE.
    #[test]
    fn tokenizer_json_files_encode_and_decode_as_the_gguf_vocabularies_do() {
        let byte_level = {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            tandem_model::testing::write_tiny_gguf(&path);
            tandem_model::GgufFile::open(&path).unwrap().tokenizer_meta()
        };
        for meta in [meta(false), byte_level] {
            let from_gguf = TextTokenizer::from_meta(&meta).unwrap();
            let json = from_gguf.tokenizer_json();
            let hf = TokenizerMeta {
                model: "huggingface".into(),
                eos_id: meta.eos_id,
                extra_end_ids: vec![5],
                hf_json: Some(json),
                ..TokenizerMeta::default()
            };
            let from_json = TextTokenizer::from_meta(&hf).unwrap();
            assert_eq!(from_json.vocab_size(), from_gguf.vocab_size());
            for text in ["hello world", " hello hé", "<start_of_turn>hello\n\nhe<end_of_turn>", "<|im_start|>x ü"] {
                let ids = from_gguf.encode(text).unwrap();
                assert_eq!(from_json.encode(text).unwrap(), ids, "{text:?}");
                for skip in [false, true] {
                    assert_eq!(from_json.decode(&ids, skip), from_gguf.decode(&ids, skip), "{text:?}");
                }
            }
            assert!(from_json.is_end(meta.eos_id.unwrap()) && from_json.is_end(5));
        }
    }

    #[test]
    fn mismatched_scores_are_refused() {
        let mut m = meta(false);
        m.scores.pop();
        assert!(TextTokenizer::from_meta(&m).is_err());
    }
}
