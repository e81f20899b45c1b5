//! Every architecture's forward pass (Llama, Qwen2, Qwen3, Gemma 3) on a tiny random-weight GGUF
//! against a naive f32 forward written independently here from the architectures' definitions:
//! it reads the tensors as the file stores them (q/k rows in Hugging Face's halves order for
//! Qwen and Gemma, rotated as such), so the loader's row permutation, the biases, the per-head
//! norms, the post norms, GELU, the embedding scale, the sliding window and its RoPE base are all
//! checked against something that shares none of that code.

mod common;

use common::naive_logits;
use std::path::Path;
use tandem_model::testing::write_tiny_arch_gguf;
use tandem_model::{Arch, KvCache, Logits, SeqInput};

#[test]
fn every_architecture_matches_its_naive_forward_and_batches_exactly() {
    let dir = tempfile::tempdir().unwrap();
    // 13 tokens: past Gemma's tiny window of 5 at most positions.
    let tokens: Vec<u32> = vec![72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 256];
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
        let path = dir.path().join(format!("{}.gguf", arch.name()));
        write_tiny_arch_gguf(&path, arch);
        let loaded = tandem_model::load(&path).unwrap();
        let (m, c) = (&loaded.model, loaded.model.config.clone());
        assert_eq!(c.arch, arch);
        let reference = naive_logits(&path, &tokens);

        // Prefill in two chunks, then one decode step.
        let mut cache = KvCache::new(c.n_layer, c.kv_dim());
        let step = |toks: &[u32], cache: &mut KvCache, logits| {
            m.forward(&mut [SeqInput { tokens: toks, cache, adapter: None, logits }]).unwrap()
        };
        step(&tokens[..7], &mut cache, Logits::None);
        step(&tokens[7..12], &mut cache, Logits::None);
        let ours = step(&tokens[12..], &mut cache, Logits::Last)[(0, 0)].to_vec();

        let max_ref = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
        let max_diff = reference.iter().zip(&ours).fold(0f32, |m, (r, o)| m.max((r - o).abs()));
        let mean_ref = reference.iter().map(|v| v.abs()).sum::<f32>() / reference.len() as f32;
        let mean_diff = reference.iter().zip(&ours).map(|(r, o)| (r - o).abs()).sum::<f32>() / reference.len() as f32;
        eprintln!("{arch:?}: max |diff| {max_diff} of {max_ref}, mean {mean_diff} of {mean_ref}");
        // int8 activations move logits by a few percent; a wrong rotation, norm or window moves
        // them by their own size.
        assert!(max_diff < 0.08 * max_ref && mean_diff < 0.04 * mean_ref, "{arch:?} drifts from the reference");

        // The same prompt in a batch with another sequence: identical, bit for bit.
        let (mut c1, mut c2) = (KvCache::new(c.n_layer, c.kv_dim()), KvCache::new(c.n_layer, c.kv_dim()));
        let out = m
            .forward(&mut [
                SeqInput { tokens: &[256, 72, 105], cache: &mut c2, adapter: None, logits: Logits::Last },
                SeqInput { tokens: &tokens, cache: &mut c1, adapter: None, logits: Logits::Last },
            ])
            .unwrap();
        assert_eq!(out[(1, 0)], ours, "{arch:?}: batched output must equal unbatched output");
    }
}

/// Loading refuses what the kernels cannot run instead of panicking on it.
#[test]
fn unknown_architectures_and_broken_shapes_are_errors() {
    use candle_core::quantized::gguf_file::{self, Value};
    let dir = tempfile::tempdir().unwrap();
    let write = |arch: &str, heads: u32| {
        let path = dir.path().join(format!("{arch}-{heads}.gguf"));
        let meta = [
            ("general.architecture", Value::String(arch.into())),
            ("qwen3.block_count", Value::U32(1)),
            ("qwen3.embedding_length", Value::U32(64)),
            ("qwen3.feed_forward_length", Value::U32(64)),
            ("qwen3.attention.head_count", Value::U32(heads)),
            ("qwen3.attention.head_count_kv", Value::U32(3)),
            ("tokenizer.ggml.tokens", Value::Array(vec![Value::String("a".into()); 4])),
        ];
        let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
        gguf_file::write(&mut std::fs::File::create(&path).unwrap(), &refs, &[]).unwrap();
        path
    };
    let err = |p: &Path| tandem_model::load(p).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(&write("mamba", 4)).contains("architecture \"mamba\""), "{}", err(&write("mamba", 4)));
    // 4 query heads cannot share 3 key/value heads.
    assert!(err(&write("qwen3", 4)).contains("key/value heads"), "{}", err(&write("qwen3", 4)));
    assert!(err(&write("qwen3", 0)).contains("heads"));
}

/// The real Gemma 3 270M (`make model-gemma`), when present: the served forward against the
/// naive one on the same file, over seven prompts. Skipped, saying so, when the file is missing.
///
/// The served forward quantises activations to int8 per block of 32 (as llama.cpp's dot products
/// do), which Gemma's large, uneven activations feel: measured on 2026-11-25, the mean KL
/// divergence from the exact forward is 0.0042-0.0045 nats on every kernel tier, and a single
/// prompt's worst top-20 logprob moves between 0.08 and 0.32 with the order of float sums. So the
/// bounds are on the KL (a wrong kernel, rotation or norm gives KL well above 0.1) and the
/// likeliest token, not on one logprob.
#[test]
fn gemma3_270m_matches_its_naive_forward() {
    let path = std::env::var_os("TANDEM_TEST_GEMMA").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf")
    });
    if !path.is_file() {
        eprintln!("SKIPPED: {} is missing (make model-gemma)", path.display());
        return;
    }
    let loaded = tandem_model::load(&path).unwrap();
    let m = &loaded.model;
    // <bos>The capital of France is; then six prompts of random ordinary tokens.
    let mut prompts: Vec<Vec<u32>> = vec![vec![2, 818, 5279, 529, 7001, 563]];
    for s in 0..6u32 {
        prompts.push([&[2u32][..], &tandem_model::testing::token_ids(12, 12_345 + s * 7_919)].concat());
    }
    let lse = |v: &[f32]| {
        let m = v.iter().cloned().fold(f32::MIN, f32::max);
        m + v.iter().map(|x| (x - m).exp()).sum::<f32>().ln()
    };
    let mut kls = Vec::new();
    for (i, tokens) in prompts.iter().enumerate() {
        let reference = naive_logits(&path, tokens);
        let mut cache = KvCache::new(m.config.n_layer, m.config.kv_dim());
        let ours = m
            .forward(&mut [SeqInput { tokens, cache: &mut cache, adapter: None, logits: Logits::Last }])
            .unwrap()[(0, 0)]
            .to_vec();
        let (lr, lo) = (lse(&reference), lse(&ours));
        let kl: f64 = reference
            .iter()
            .zip(&ours)
            .map(|(r, o)| ((r - lr) as f64).exp() * ((r - lr) as f64 - (o - lo) as f64))
            .sum();
        let top_ref = (0..reference.len()).max_by(|a, b| reference[*a].total_cmp(&reference[*b])).unwrap();
        let top_ours = (0..ours.len()).max_by(|a, b| ours[*a].total_cmp(&ours[*b])).unwrap();
        eprintln!("prompt {i}: KL {kl:.5}, likeliest token {top_ref} (ours {top_ours})");
        if i == 0 {
            // " Paris" leads by a wide margin: it must stay first.
            assert_eq!(top_ref, top_ours);
        }
        assert!(kl < 0.05, "prompt {i}: KL {kl} from the exact forward");
        kls.push(kl);
    }
    let mean = kls.iter().sum::<f64>() / kls.len() as f64;
    assert!(mean < 0.015, "mean KL {mean} from the exact forward");
}

/// Llama 3.1+ GGUFs carry `rope_freqs.weight`, per-pair divisors of the RoPE frequencies: the
/// tiny Llama rewritten with one must match the reference that applies them, and differ from
/// the model without.
#[test]
fn rope_frequency_factors_of_a_gguf_are_applied() {
    use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
    let dir = tempfile::tempdir().unwrap();
    let (plain, scaled) = (dir.path().join("plain.gguf"), dir.path().join("scaled.gguf"));
    write_tiny_arch_gguf(&plain, Arch::Llama);
    let mut reader = std::io::BufReader::new(std::fs::File::open(&plain).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| (n.clone(), content.tensor(&mut reader, n, &candle_core::Device::Cpu).unwrap()))
        .collect();
    let hd = tandem_model::testing::HIDDEN / tandem_model::testing::HEADS;
    let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + i as f32).collect();
    let t = candle_core::Tensor::from_vec(factors, hd / 2, &candle_core::Device::Cpu).unwrap();
    tensors.push(("rope_freqs.weight".into(), QTensor::quantize(&t, GgmlDType::F32).unwrap()));
    let meta: Vec<(&str, &gguf_file::Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(&scaled).unwrap(), &meta, &refs).unwrap();

    let tokens: Vec<u32> = vec![72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 256];
    let last = |path: &Path| {
        let m = tandem_model::load(path).unwrap().model;
        let mut cache = KvCache::new(m.config.n_layer, m.config.kv_dim());
        m.forward(&mut [SeqInput { tokens: &tokens, cache: &mut cache, adapter: None, logits: Logits::Last }]).unwrap()
            [(0, 0)]
            .to_vec()
    };
    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let (ours, reference) = (last(&scaled), naive_logits(&scaled, &tokens));
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(diff(&ours, &reference) < 0.08 * scale, "{} of {scale}", diff(&ours, &reference));
    assert!(diff(&ours, &last(&plain)) > 0.1 * scale, "the factors changed nothing");
}
