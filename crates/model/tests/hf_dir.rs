//! Hugging Face checkpoint directories: each tiny GGUF of `testing` is converted here to what
//! Hugging Face's `save_pretrained` writes (its tensor names, q/k rows in the halves order for
//! every architecture, Gemma's norms as `w` with `1 + w` applied, bf16 weights in two shards
//! with an index, `config.json`), then loaded from the directory: it must compute what the GGUF
//! computes.

mod common;

use std::collections::HashMap;
use std::path::Path;
use tandem_model::arch::pairs_to_halves;
use tandem_model::testing::{
    tiny_head_dim, tiny_layers, write_tiny_arch_gguf, FFN, HEADS, HIDDEN, KV_HEADS, TINY_WINDOW,
};
use tandem_model::{Arch, GgufFile, KvCache, Logits, SeqInput};

/// The Hugging Face name of a GGUF tensor, spelled out independently of `tandem_model::hf`.
fn hf_name(arch: Arch, gguf: &str) -> String {
    let fixed = [("token_embd.weight", "model.embed_tokens.weight"), ("output_norm.weight", "model.norm.weight")];
    if let Some((_, hf)) = fixed.iter().find(|(g, _)| *g == gguf) {
        return hf.to_string();
    }
    let rest = gguf.strip_prefix("blk.").unwrap();
    let (layer, tensor) = rest.split_once('.').unwrap();
    let (module, suffix) = tensor.rsplit_once('.').unwrap();
    let gemma = arch == Arch::Gemma3;
    let hf = match module {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" => "post_attention_layernorm",
        "post_ffw_norm" => "post_feedforward_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        other => panic!("unmapped {other}"),
    };
    format!("model.layers.{layer}.{hf}.{suffix}")
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect()
}

/// Writes the Hugging Face form of the tiny GGUF of `arch` into `dir`.
fn write_hf(gguf: &Path, dir: &Path, arch: Arch) {
    let mut f = GgufFile::open(gguf).unwrap();
    let c = f.llama_config().unwrap();
    let hd = c.head_dim;
    let mut names: Vec<String> = Vec::new();
    names.push("token_embd.weight".into());
    names.push("output_norm.weight".into());
    for l in 0..c.n_layer {
        for t in [
            "attn_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "ffn_norm.weight",
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down.weight",
            "attn_q.bias",
            "attn_k.bias",
            "attn_v.bias",
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "post_attention_norm.weight",
            "post_ffw_norm.weight",
        ] {
            let name = format!("blk.{l}.{t}");
            if f.has_tensor(&name) {
                names.push(name);
            }
        }
    }
    // Per shard: (name, bf16 bytes, shape).
    type Shard = Vec<(String, Vec<u8>, Vec<usize>)>;
    let mut shards: [Shard; 2] = [Vec::new(), Vec::new()];
    for (i, name) in names.iter().enumerate() {
        let (mut data, dims) = f.tensor_f32(name).unwrap();
        // llama.cpp interleaved Llama's q/k rows; Hugging Face keeps halves.
        if arch == Arch::Llama && (name.contains("attn_q.") || name.contains("attn_k.")) {
            let heads = dims[0] / hd;
            data = pairs_to_halves(&data, heads, hd, data.len() / dims[0]);
        }
        if arch == Arch::Gemma3 && name.ends_with("norm.weight") {
            data.iter_mut().for_each(|w| *w -= 1.0);
        }
        shards[i % 2].push((hf_name(arch, name), bf16_bytes(&data), dims));
    }
    let mut weight_map = serde_json::Map::new();
    for (s, shard) in shards.iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", s + 1);
        let views: Vec<(String, safetensors::tensor::TensorView)> = shard
            .iter()
            .map(|(n, b, d)| {
                (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, d.clone(), b).unwrap())
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for (n, _, _) in shard {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    let hf_arch = match arch {
        Arch::Llama => "LlamaForCausalLM",
        Arch::Qwen2 => "Qwen2ForCausalLM",
        Arch::Qwen3 => "Qwen3ForCausalLM",
        Arch::Gemma3 => "Gemma3ForCausalLM",
    };
    let mut config = serde_json::json!({
        "architectures": [hf_arch], "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": tiny_layers(arch), "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": tiny_head_dim(arch), "rms_norm_eps": 1e-5, "vocab_size": c.vocab,
        "max_position_embeddings": 8192, "tie_word_embeddings": true, "rope_scaling": null,
        "rope_theta": if arch == Arch::Gemma3 { 1_000_000.0 } else { 10_000.0 },
    });
    if arch == Arch::Gemma3 {
        config["sliding_window"] = TINY_WINDOW.into();
        config["rope_local_base_freq"] = 10_000.0.into();
        config["query_pre_attn_scalar"] = tiny_head_dim(arch).into();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    // The model crate reads tokenizer.json only as JSON (the engine builds the tokenizer).
    let vocab: HashMap<String, usize> = (0..c.vocab).map(|i| (format!("t{i}"), i)).collect();
    std::fs::write(
        dir.join("tokenizer.json"),
        serde_json::json!({"model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}, "added_tokens": []})
            .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": "t257", "bos_token": "t256", "add_bos_token": false}"#,
    )
    .unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [257, 3]}"#).unwrap();
}

fn logits(m: &tandem_model::Llama, tokens: &[u32]) -> Vec<f32> {
    let mut cache = KvCache::new(m.config.n_layer, m.config.kv_dim());
    m.forward(&mut [SeqInput { tokens, cache: &mut cache, adapter: None, logits: Logits::Last }]).unwrap()[(0, 0)]
        .to_vec()
}

#[test]
fn a_checkpoint_directory_computes_what_its_gguf_computes() {
    let tokens: Vec<u32> = vec![72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 256];
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
        let tmp = tempfile::tempdir().unwrap();
        let gguf = tmp.path().join("tiny.gguf");
        write_tiny_arch_gguf(&gguf, arch);
        let dir = tmp.path().join("hf");
        std::fs::create_dir(&dir).unwrap();
        write_hf(&gguf, &dir, arch);

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
        eprintln!("{arch:?}: max |diff| {diff} of {scale}");
        // bf16 weights requantised to int8 against Q4_1 / Q5_0 kept as stored: small; a wrong
        // row order, name or norm convention moves logits by their own size.
        assert!(diff < 0.05 * scale, "{arch:?}: the directory computes something else ({diff} of {scale})");

        // `--quantize none`: the directory's bf16 weights kept as f32 and multiplied with f32
        // activations, against the exact forward of the GGUF (whose values the bf16 copies
        // round): far closer than any int8 path, and batched exactly like the others.
        let exact = common::naive_logits(&gguf, &tokens);
        let dense = tandem_model::load_model(&dir, tandem_model::Quantize::None).unwrap();
        assert!(matches!(dense.model.layers[0].gate_up, tandem_model::kernels::Weights::F32(_)));
        let f32_logits = logits(&dense.model, &tokens);
        let max_diff = |v: &[f32]| exact.iter().zip(v).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        let (dense_diff, int8_diff) = (max_diff(&f32_logits), max_diff(&got));
        eprintln!("{arch:?}: f32 weights differ from the exact forward by {dense_diff}, int8 by {int8_diff}");
        assert!(dense_diff < 0.01 * scale && dense_diff < int8_diff, "{arch:?}: f32 weights drift");
        let mut c1 = KvCache::new(dense.model.config.n_layer, dense.model.config.kv_dim());
        let mut c2 = KvCache::new(dense.model.config.n_layer, dense.model.config.kv_dim());
        let batched = dense
            .model
            .forward(&mut [
                SeqInput { tokens: &[256, 72], cache: &mut c1, adapter: None, logits: Logits::Last },
                SeqInput { tokens: &tokens, cache: &mut c2, adapter: None, logits: Logits::Last },
            ])
            .unwrap();
        assert_eq!(batched[(1, 0)], f32_logits, "{arch:?}: batched f32 output must equal unbatched");

        let meta = &from_dir.tokenizer;
        assert_eq!((meta.eos_id, meta.bos_id, meta.add_bos), (Some(257), Some(256), Some(false)));
        assert_eq!(meta.extra_end_ids, [257, 3]);
        assert!(meta.hf_json.is_some());
    }
}

#[test]
fn hostile_directories_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("tiny.gguf");
    write_tiny_arch_gguf(&gguf, Arch::Qwen3);
    let dir = tmp.path().join("hf");
    std::fs::create_dir(&dir).unwrap();
    write_hf(&gguf, &dir, Arch::Qwen3);
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
