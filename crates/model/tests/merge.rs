//! A checkpoint merged into its base GGUF computes what the base with the adapter computes.

use tandem_model::merge::{merge_to_gguf, merged_weight, MergeFormat};
use tandem_model::peft::{self, AdapterConfig, Module, PairData};
use tandem_model::{load, testing, GgufFile, KvCache, Logits, LoraAdapter, SeqInput};

fn last_logits(model: &tandem_model::Llama, adapter: Option<&LoraAdapter>) -> Vec<f32> {
    let c = &model.config;
    let tokens: Vec<u32> = vec![256, 72, 105, 33, 10, 257, 256];
    let mut cache = KvCache::new(c.n_layer, c.kv_dim());
    model.forward(&mut [SeqInput { tokens: &tokens, cache: &mut cache, adapter, logits: Logits::Last }]).unwrap()
        [(0, 0)]
        .to_vec()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn a_merged_file_holds_w_plus_ba_and_computes_what_base_plus_adapter_computes() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.gguf");
    testing::write_tiny_gguf(&base);
    let loaded = load(&base).unwrap();
    let c = loaded.model.config.clone();
    let rank = 4;
    let pairs: Vec<[PairData; 7]> = (0..c.n_layer)
        .map(|l| {
            Module::ALL.map(|m| {
                let (din, dout) = m.dims(&c);
                let seed = (l * 7 + m as usize) as u64;
                PairData {
                    a: testing::weights(rank * din, 1000 + seed).iter().map(|w| w * 0.5).collect(),
                    b: testing::weights(dout * rank, 2000 + seed).iter().map(|w| w * 0.5).collect(),
                }
            })
        })
        .collect();
    let cfg = AdapterConfig { r: rank, lora_alpha: Some(8.0), use_rslora: false };
    let adapter_dir = dir.path().join("adapter");
    std::fs::create_dir(&adapter_dir).unwrap();
    for (name, bytes) in peft::write(&cfg, &pairs, None, &c, "tiny").unwrap() {
        std::fs::write(adapter_dir.join(name), bytes).unwrap();
    }

    // In f32: every projection is exactly W + 2 · B · A, the rest is as it was.
    let merged = dir.path().join("merged-f32.gguf");
    let report = merge_to_gguf(&base, &adapter_dir, &merged, MergeFormat::F32).unwrap();
    assert_eq!(report.merged, 7 * c.n_layer);
    let (mut b, mut m) = (GgufFile::open(&base).unwrap(), GgufFile::open(&merged).unwrap());
    for (module, name, out_dim) in [(1, "blk.1.attn_k.weight", c.kv_dim()), (6, "blk.0.ffn_down.weight", c.hidden)] {
        let (w, _) = b.tensor_f32(name).unwrap();
        let p = &pairs[if name.starts_with("blk.1") { 1 } else { 0 }][module];
        let want = merged_weight(&w, &p.a, &p.b, rank, 2.0, out_dim);
        let (got, _) = m.tensor_f32(name).unwrap();
        assert_eq!(got, want, "{name}");
        assert_eq!(m.tensor_raw(name).unwrap().0, candle_core::quantized::GgmlDType::F32);
    }
    assert_eq!(m.tensor_f32("blk.0.attn_norm.weight").unwrap(), b.tensor_f32("blk.0.attn_norm.weight").unwrap());
    assert_eq!(
        m.metadata().get("general.architecture").map(|v| v.to_string().unwrap().to_string()),
        Some("llama".into())
    );

    // Served: the merged file's logits are the base-with-adapter's, up to quantisation; the
    // adapter itself moves them far more than that.
    let adapter = LoraAdapter::load(&adapter_dir, &c).unwrap();
    let with_adapter = last_logits(&loaded.model, Some(&adapter));
    let base_only = last_logits(&loaded.model, None);
    let merged_model = load(&merged).unwrap();
    let from_merged = last_logits(&merged_model.model, None);
    let (gap, effect) = (max_diff(&from_merged, &with_adapter), max_diff(&base_only, &with_adapter));
    assert!(gap * 10.0 < effect, "merged differs by {gap}, the adapter's effect is {effect}");
    let argmax = |v: &[f32]| v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
    assert_eq!(argmax(&from_merged), argmax(&with_adapter));

    // In the base's types: each tensor keeps its type (Q4_1 projections quantised back).
    let same_types = dir.path().join("merged-base.gguf");
    merge_to_gguf(&base, &adapter_dir, &same_types, MergeFormat::Base).unwrap();
    let mut s = GgufFile::open(&same_types).unwrap();
    for name in ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_up.weight", "output_norm.weight"] {
        assert_eq!(s.tensor_raw(name).unwrap().0, b.tensor_raw(name).unwrap().0, "{name}");
    }
    let q4 = load(&same_types).unwrap();
    let from_q4 = last_logits(&q4.model, None);
    assert!(max_diff(&from_q4, &with_adapter) * 3.0 < effect, "Q4_1 merge drifts too far");

    // An adapter of another rank than its tensors (or any that does not fit) does not merge, and
    // nothing is left behind; nor may the merge overwrite its base.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::copy(adapter_dir.join("adapter_model.safetensors"), other.join("adapter_model.safetensors")).unwrap();
    std::fs::write(other.join("adapter_config.json"), r#"{"r": 2}"#).unwrap();
    let before: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(merge_to_gguf(&base, &other, &dir.path().join("x.gguf"), MergeFormat::F32).is_err());
    let after: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(after.len(), before.len(), "no temporary or partial file: {after:?}");
    let e = merge_to_gguf(&base, &adapter_dir, &base, MergeFormat::Base).unwrap_err().to_string();
    assert!(e.contains("base model itself"), "{e}");
    assert_eq!(std::fs::read(&base).unwrap().len(), std::fs::metadata(&base).unwrap().len() as usize);
}

/// Qwen and Gemma files keep q/k rows in Hugging Face's order, which loading permutes: the
/// merged q/k deltas must be written in the file's order for the merged file to compute what the
/// base with the adapter computes (a Llama-order delta would scramble every head's rotation).
#[test]
fn halves_order_architectures_merge_in_the_files_row_order() {
    for arch in [tandem_model::Arch::Qwen2, tandem_model::Arch::Qwen3, tandem_model::Arch::Gemma3] {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.gguf");
        testing::write_tiny_arch_gguf(&base, arch);
        let loaded = load(&base).unwrap();
        let c = loaded.model.config.clone();
        let rank = 4;
        // Only q and k adapted: what the row order decides.
        let pairs: Vec<[PairData; 7]> = (0..c.n_layer)
            .map(|l| {
                Module::ALL.map(|m| {
                    let (din, dout) = m.dims(&c);
                    let on = if m.rotary_rows() { 1.0 } else { 0.0 };
                    let seed = (l * 7 + m as usize) as u64;
                    PairData {
                        a: testing::weights(rank * din, 1000 + seed).iter().map(|w| w * 0.5).collect(),
                        b: testing::weights(dout * rank, 2000 + seed).iter().map(|w| w * on).collect(),
                    }
                })
            })
            .collect();
        let cfg = AdapterConfig { r: rank, lora_alpha: Some(8.0), use_rslora: false };
        let adapter_dir = dir.path().join("adapter");
        std::fs::create_dir(&adapter_dir).unwrap();
        for (name, bytes) in peft::write(&cfg, &pairs, None, &c, "tiny").unwrap() {
            std::fs::write(adapter_dir.join(name), bytes).unwrap();
        }
        let merged = dir.path().join("merged.gguf");
        merge_to_gguf(&base, &adapter_dir, &merged, MergeFormat::F32).unwrap();
        let adapter = LoraAdapter::load(&adapter_dir, &c).unwrap();
        let with_adapter = last_logits(&loaded.model, Some(&adapter));
        let base_only = last_logits(&loaded.model, None);
        let from_merged = last_logits(&load(&merged).unwrap().model, None);
        let (gap, effect) = (max_diff(&from_merged, &with_adapter), max_diff(&base_only, &with_adapter));
        eprintln!("{arch:?}: merged differs by {gap}, the adapter's effect is {effect}");
        // Correct: int8 requantisation noise (0.05-0.1 here); in Llama's row order: 0.8 (> effect).
        assert!(gap * 4.0 < effect, "{arch:?}: merged differs by {gap}, the adapter's effect is {effect}");
    }
}

/// An output-head pair (Tinker's `train_unembed`) on a tied base: served, it moves the logits;
/// merged, the file gets its own `output.weight` (the embedding plus the product, the embedding
/// kept as it was) and computes what the base with the adapter computes.
#[test]
fn an_output_head_pair_serves_and_merges_into_an_untied_head() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.gguf");
    testing::write_tiny_gguf(&base);
    let loaded = load(&base).unwrap();
    let c = loaded.model.config.clone();
    assert!(loaded.model.lm_head.is_none(), "the tiny model ties its head");
    let rank = 2;
    // Every projection's B is 0: only the head's pair does anything.
    let pairs: Vec<[PairData; 7]> = (0..c.n_layer)
        .map(|_| {
            Module::ALL.map(|m| {
                let (din, dout) = m.dims(&c);
                PairData { a: testing::weights(rank * din, 7), b: vec![0.0; dout * rank] }
            })
        })
        .collect();
    let (hin, hout) = peft::head_dims(&c);
    let head = PairData { a: testing::weights(rank * hin, 8), b: testing::weights(hout * rank, 9) };
    let cfg = AdapterConfig { r: rank, lora_alpha: Some(4.0), use_rslora: false };
    let adapter_dir = dir.path().join("adapter");
    std::fs::create_dir(&adapter_dir).unwrap();
    for (name, bytes) in peft::write(&cfg, &pairs, Some(&head), &c, "tiny").unwrap() {
        std::fs::write(adapter_dir.join(name), bytes).unwrap();
    }
    let adapter = LoraAdapter::load(&adapter_dir, &c).unwrap();
    let with_adapter = last_logits(&loaded.model, Some(&adapter));
    let base_only = last_logits(&loaded.model, None);
    let effect = max_diff(&base_only, &with_adapter);
    assert!(effect > 0.1, "the head's pair moved the logits by {effect}");

    let merged = dir.path().join("merged.gguf");
    let report = merge_to_gguf(&base, &adapter_dir, &merged, MergeFormat::F32).unwrap();
    assert_eq!(report.merged, 7 * c.n_layer + 1);
    let (mut b, mut m) = (GgufFile::open(&base).unwrap(), GgufFile::open(&merged).unwrap());
    let (embd, _) = b.tensor_f32("token_embd.weight").unwrap();
    assert_eq!(m.tensor_f32("token_embd.weight").unwrap().0, embd, "the embedding stays");
    let want = merged_weight(&embd, &head.a, &head.b, rank, 2.0, hout);
    assert_eq!(m.tensor_f32("output.weight").unwrap().0, want);
    let merged_model = load(&merged).unwrap();
    assert!(merged_model.model.lm_head.is_some(), "the merged file has its own head");
    let from_merged = last_logits(&merged_model.model, None);
    let gap = max_diff(&from_merged, &with_adapter);
    assert!(gap * 10.0 < effect, "merged differs by {gap}, the adapter's effect is {effect}");
}
