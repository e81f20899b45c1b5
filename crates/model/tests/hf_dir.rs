//! Hugging Face checkpoint directories: each tiny GGUF of `testing` is converted to what
//! Hugging Face's `save_pretrained` writes (`testing::write_hf_dir`: its tensor names, q/k rows in
//! the halves order for every architecture, Gemma's norms as `w` with `1 + w` applied, bf16 or f16
//! weights in two shards with an index, `config.json`), then loaded from the directory: it must
//! compute what the GGUF computes.

mod common;

use std::path::Path;
use tandem_model::testing::{write_tiny_hf_dir, HfDtype};
use tandem_model::{Arch, KvCache, Logits, SeqInput};

fn logits(m: &tandem_model::Llama, tokens: &[u32]) -> Vec<f32> {
    let mut cache = KvCache::new(m.config.n_layer, m.config.kv_dim());
    m.forward(&mut [SeqInput { tokens, cache: &mut cache, adapter: None, logits: Logits::Last }]).unwrap()[(0, 0)]
        .to_vec()
}

#[test]
fn a_checkpoint_directory_computes_what_its_gguf_computes() {
    let tokens: Vec<u32> = vec![72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 256];
    let cases = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3]
        .into_iter()
        .flat_map(|arch| [(arch, HfDtype::Bf16), (arch, HfDtype::F16)]);
    for (arch, dtype) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let (gguf, dir) = write_tiny_hf_dir(tmp.path(), arch, dtype);

        let from_gguf = tandem_model::load(&gguf).unwrap();
        let from_dir = tandem_model::load(&dir).unwrap();
        let (a, b) = (&from_gguf.model.config, &from_dir.model.config);
        assert_eq!(
            (a.arch, a.n_layer, a.head_dim, a.sliding, a.embed_scale),
            (b.arch, b.n_layer, b.head_dim, b.sliding, b.embed_scale)
        );
        let (want, got) = (logits(&from_gguf.model, &tokens), logits(&from_dir.model, &tokens));
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = want.iter().zip(&got).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        eprintln!("{arch:?} {dtype:?}: max |diff| {diff} of {scale}");
        // bf16 weights requantised to int8 against Q4_1 / Q5_0 kept as stored: small; a wrong
        // row order, name or norm convention moves logits by their own size.
        assert!(diff < 0.05 * scale, "{arch:?} {dtype:?}: the directory computes something else ({diff} of {scale})");

        // `--quantize none`: the directory's bf16 weights kept as f32 and multiplied with f32
        // activations, against the exact forward of the GGUF (whose values the bf16 copies
        // round): far closer than any int8 path, and batched exactly like the others.
        let exact = common::naive_logits(&gguf, &tokens);
        let dense = tandem_model::load_model(&dir, tandem_model::Quantize::None).unwrap();
        assert!(matches!(dense.model.layers[0].gate_up, tandem_model::kernels::Weights::F32(_)));
        let f32_logits = logits(&dense.model, &tokens);
        let max_diff = |v: &[f32]| exact.iter().zip(v).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        let (dense_diff, int8_diff) = (max_diff(&f32_logits), max_diff(&got));
        eprintln!("{arch:?} {dtype:?}: f32 weights differ from the exact forward by {dense_diff}, int8 by {int8_diff}");
        assert!(dense_diff < 0.01 * scale && dense_diff < int8_diff, "{arch:?} {dtype:?}: f32 weights drift");
        let mut c1 = KvCache::new(dense.model.config.n_layer, dense.model.config.kv_dim());
        let mut c2 = KvCache::new(dense.model.config.n_layer, dense.model.config.kv_dim());
        let batched = dense
            .model
            .forward(&mut [
                SeqInput { tokens: &[256, 72], cache: &mut c1, adapter: None, logits: Logits::Last },
                SeqInput { tokens: &tokens, cache: &mut c2, adapter: None, logits: Logits::Last },
            ])
            .unwrap();
        assert_eq!(batched[(1, 0)], f32_logits, "{arch:?} {dtype:?}: batched f32 output must equal unbatched");

        let meta = &from_dir.tokenizer;
        assert_eq!((meta.eos_id, meta.bos_id, meta.add_bos), (Some(257), Some(256), Some(false)));
        assert_eq!(meta.extra_end_ids, [257, 3]);
        assert!(meta.hf_json.is_some());
    }
}

#[test]
fn hostile_directories_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, dir) = write_tiny_hf_dir(tmp.path(), Arch::Qwen3, HfDtype::Bf16);
    let err = |d: &Path| tandem_model::load(d).err().map(|e| e.to_string()).unwrap_or_default();
    // A shard named outside the directory.
    let index = dir.join("model.safetensors.index.json");
    let good = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, good.replace("model-00001-of-00002.safetensors", "../x.safetensors")).unwrap();
    assert!(err(&dir).contains("leaves the directory"), "{}", err(&dir));
    std::fs::write(&index, &good).unwrap();
    // A truncated shard.
    let shard = dir.join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 10]).unwrap();
    assert!(!err(&dir).is_empty());
    std::fs::write(&shard, &bytes).unwrap();
    // Unknown architecture, unsupported RoPE scaling.
    let config = dir.join("config.json");
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, good.replace("Qwen3ForCausalLM", "MambaForCausalLM")).unwrap();
    assert!(err(&dir).contains("MambaForCausalLM"), "{}", err(&dir));
    std::fs::write(&config, good.replace(r#""rope_scaling":null"#, r#""rope_scaling":{"type":"yarn","factor":4.0}"#))
        .unwrap();
    assert!(err(&dir).contains("rope_scaling"), "{}", err(&dir));
    std::fs::write(&config, &good).unwrap();
    assert!(tandem_model::load(&dir).is_ok());
}
