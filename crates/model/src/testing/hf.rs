//! A GGUF (a tiny one of `testing`, or a real file) rewritten as what Hugging Face's
//! `save_pretrained` writes: its tensor names, q/k rows in the halves order, Gemma's norms stored
//! as `w` (the model applies `1 + w`), the weights as bf16 or f16 in two shards with an index,
//! `config.json` and the tokenizer files.
//! Spelled out here independently of the loader (`crate::hf`), so a test of one against the other
//! catches a wrong name, row order or norm convention.

use crate::arch::pairs_to_halves;
use crate::{Arch, GgufFile};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The Hugging Face name of a GGUF tensor.
fn hf_name(arch: Arch, gguf: &str) -> String {
    let fixed = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
    ];
    if let Some((_, hf)) = fixed.iter().find(|(g, _)| *g == gguf) {
        return hf.to_string();
    }
    let rest = gguf.strip_prefix("blk.").expect("a layer tensor");
    let (layer, tensor) = rest.split_once('.').expect("blk.N.name");
    let (module, suffix) = tensor.rsplit_once('.').expect("name.suffix");
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

/// The two types checkpoints are saved in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfDtype {
    Bf16,
    F16,
}

impl HfDtype {
    fn bytes(self, v: &[f32]) -> Vec<u8> {
        match self {
            HfDtype::Bf16 => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
            HfDtype::F16 => v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
        }
    }

    fn safetensors(self) -> safetensors::Dtype {
        match self {
            HfDtype::Bf16 => safetensors::Dtype::BF16,
            HfDtype::F16 => safetensors::Dtype::F16,
        }
    }
}

/// Writes the Hugging Face form of the GGUF `gguf` into the directory `dir`, its weights as
/// `dtype` (dequantised from the file's blocks, then rounded). The tokenizer files hold a
/// placeholder word-level vocabulary of the model's size: the model crate reads them only as JSON.
pub fn write_hf_dir(gguf: &Path, dir: &Path, dtype: HfDtype) {
    let mut f = GgufFile::open(gguf).unwrap();
    let c = f.llama_config().unwrap();
    let arch = c.arch;
    let hd = c.head_dim;
    let mut names: Vec<String> = vec!["token_embd.weight".into(), "output_norm.weight".into()];
    let tied = !f.has_tensor("output.weight");
    if !tied {
        names.push("output.weight".into());
    }
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
    // Per shard: (name, bytes, shape).
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
        shards[i % 2].push((hf_name(arch, name), dtype.bytes(&data), dims));
    }
    let mut weight_map = serde_json::Map::new();
    for (s, shard) in shards.iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", s + 1);
        let views: Vec<(String, safetensors::tensor::TensorView)> = shard
            .iter()
            .map(|(n, b, d)| {
                (n.clone(), safetensors::tensor::TensorView::new(dtype.safetensors(), d.clone(), b).unwrap())
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
        "architectures": [hf_arch], "hidden_size": c.hidden, "intermediate_size": c.ffn,
        "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim, "rms_norm_eps": c.rms_eps, "vocab_size": c.vocab,
        "max_position_embeddings": c.context_len, "tie_word_embeddings": tied, "rope_scaling": null,
        "rope_theta": c.rope_base,
        "torch_dtype": if dtype == HfDtype::F16 { "float16" } else { "bfloat16" },
    });
    if let Some(w) = c.sliding {
        config["sliding_window"] = w.window.into();
        config["rope_local_base_freq"] = w.rope_base.into();
    }
    if arch == Arch::Gemma3 {
        // attn_scale = query_pre_attn_scalar^-1/2.
        config["query_pre_attn_scalar"] = (1.0 / (c.attn_scale * c.attn_scale)).round().into();
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

/// The tiny model of `arch` written into `root` twice: as `tiny.gguf` and, from it, as the
/// directory `hf` in `dtype`. Returns both paths.
pub fn write_tiny_hf_dir(root: &Path, arch: Arch, dtype: HfDtype) -> (PathBuf, PathBuf) {
    let (gguf, dir) = (root.join("tiny.gguf"), root.join("hf"));
    super::write_tiny_arch_gguf(&gguf, arch);
    std::fs::create_dir(&dir).unwrap();
    write_hf_dir(&gguf, &dir, dtype);
    (gguf, dir)
}
