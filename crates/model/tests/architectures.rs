//! Every architecture's forward pass (Llama, Qwen2, Qwen3, Gemma 3) on a tiny random-weight GGUF
//! against a naive f32 forward written independently here from the architectures' definitions:
//! it reads the tensors as the file stores them (q/k rows in Hugging Face's halves order for
//! Qwen and Gemma, rotated as such), so the loader's row permutation, the biases, the per-head
//! norms, the post norms, GELU, the embedding scale, the sliding window and its RoPE base are all
//! checked against something that shares none of that code.

use std::path::Path;
use tandem_model::testing::write_tiny_arch_gguf;
use tandem_model::{Arch, GgufFile, KvCache, Logits, SeqInput};

fn matvec(w: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    let cols = x.len();
    (0..rows).map(|r| w[r * cols..(r + 1) * cols].iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

fn rms(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    x.iter().zip(w).map(|(v, g)| v / (ms + eps).sqrt() * g).collect()
}

/// Rotates each head of `v`: Llama's files pair (2i, 2i+1), the others (i, i + half); a file's
/// `rope_freqs` divide the frequencies.
fn rope(v: &mut [f32], hd: usize, pos: usize, base: f32, adjacent: bool, freqs: Option<&[f32]>) {
    for head in v.chunks_mut(hd) {
        for i in 0..hd / 2 {
            let factor = freqs.map_or(1.0, |f| f[i] as f64);
            let theta = pos as f64 / (base as f64).powf(2.0 * i as f64 / hd as f64) / factor;
            let (s, c) = (theta.sin() as f32, theta.cos() as f32);
            let (ia, ib) = if adjacent { (2 * i, 2 * i + 1) } else { (i, i + hd / 2) };
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * c - b * s;
            head[ib] = a * s + b * c;
        }
    }
}

fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// Logits after the last of `tokens`, the slow, obvious way.
fn naive_logits(path: &Path, tokens: &[u32]) -> Vec<f32> {
    let mut f = GgufFile::open(path).unwrap();
    let c = f.llama_config().unwrap();
    let arch = c.arch;
    let gemma = arch == Arch::Gemma3;
    let window = f.metadata().get("gemma3.attention.sliding_window").map(|v| v.to_u32().unwrap() as usize);
    let (hd, nh, nkv, h) = (c.head_dim, c.n_head, c.n_kv_head, c.hidden);
    let mut t = |name: &str| f.tensor_f32(name).ok().map(|t| t.0);
    let embed = t("token_embd.weight").unwrap();
    let freqs = t("rope_freqs.weight");
    let embed_scale = if gemma { (h as f32).sqrt() } else { 1.0 };
    let mut xs: Vec<Vec<f32>> = tokens
        .iter()
        .map(|id| embed[*id as usize * h..(*id as usize + 1) * h].iter().map(|v| v * embed_scale).collect())
        .collect();
    for l in 0..c.n_layer {
        let p = |n: &str| format!("blk.{l}.{n}");
        let mut w = |n: &str| t(&p(n)).unwrap();
        let (wq, wk, wv, wo) = (w("attn_q.weight"), w("attn_k.weight"), w("attn_v.weight"), w("attn_output.weight"));
        let (an, fnw) = (w("attn_norm.weight"), w("ffn_norm.weight"));
        let (wg, wu, wd) = (w("ffn_gate.weight"), w("ffn_up.weight"), w("ffn_down.weight"));
        let (bq, bk, bv) = (t(&p("attn_q.bias")), t(&p("attn_k.bias")), t(&p("attn_v.bias")));
        let (qn, kn) = (t(&p("attn_q_norm.weight")), t(&p("attn_k_norm.weight")));
        let (pa, pf) = (t(&p("post_attention_norm.weight")), t(&p("post_ffw_norm.weight")));
        assert_eq!(bq.is_some(), arch == Arch::Qwen2, "layer {l}: biases");
        assert_eq!(qn.is_some(), matches!(arch, Arch::Qwen3 | Arch::Gemma3), "layer {l}: q/k norms");
        assert_eq!(pa.is_some(), gemma, "layer {l}: post norms");
        // Gemma 3: five sliding layers with RoPE base 10,000, then a global one.
        let sliding = gemma && (l + 1) % 6 != 0;
        let layer_freqs = if sliding { None } else { freqs.as_deref() };
        let base = if sliding { 10_000.0 } else { c.rope_base };
        let add = |v: &mut Vec<f32>, b: &Option<Vec<f32>>| {
            if let Some(b) = b {
                v.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        };
        let head_norm = |v: &mut Vec<f32>, w: &Option<Vec<f32>>| {
            if let Some(w) = w {
                *v = v.chunks(hd).flat_map(|head| rms(head, w, c.rms_eps)).collect();
            }
        };
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, x) in xs.iter().enumerate() {
            let n = rms(x, &an, c.rms_eps);
            let (mut q, mut k, mut v) =
                (matvec(&wq, &n, nh * hd), matvec(&wk, &n, nkv * hd), matvec(&wv, &n, nkv * hd));
            add(&mut q, &bq);
            add(&mut k, &bk);
            add(&mut v, &bv);
            head_norm(&mut q, &qn);
            head_norm(&mut k, &kn);
            rope(&mut q, hd, pos, base, arch == Arch::Llama, layer_freqs);
            rope(&mut k, hd, pos, base, arch == Arch::Llama, layer_freqs);
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for pos in 0..xs.len() {
            let first = if sliding { (pos + 1).saturating_sub(window.unwrap()) } else { 0 };
            let mut att = vec![0f32; nh * hd];
            for head in 0..nh {
                let kh = head / (nh / nkv);
                let q = &qs[pos][head * hd..(head + 1) * hd];
                let scores: Vec<f32> = (first..=pos)
                    .map(|j| {
                        q.iter().zip(&ks[j][kh * hd..(kh + 1) * hd]).map(|(a, b)| a * b).sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f32::MIN, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    for d in 0..hd {
                        att[head * hd + d] += w / z * vs[first + j][kh * hd + d];
                    }
                }
            }
            let mut o = matvec(&wo, &att, h);
            if let Some(pa) = &pa {
                o = rms(&o, pa, c.rms_eps);
            }
            xs[pos].iter_mut().zip(o).for_each(|(x, o)| *x += o);
            let n = rms(&xs[pos], &fnw, c.rms_eps);
            let (g, u) = (matvec(&wg, &n, c.ffn), matvec(&wu, &n, c.ffn));
            let hid: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| if gemma { gelu_tanh(*g) * u } else { g / (1.0 + (-g).exp()) * u })
                .collect();
            let mut d = matvec(&wd, &hid, h);
            if let Some(pf) = &pf {
                d = rms(&d, pf, c.rms_eps);
            }
            xs[pos].iter_mut().zip(d).for_each(|(x, d)| *x += d);
        }
    }
    let head = t("output.weight").unwrap_or(embed);
    let n = rms(xs.last().unwrap(), &t("output_norm.weight").unwrap(), c.rms_eps);
    matvec(&head, &n, c.vocab)
}

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
        let ours = step(&tokens[12..], &mut cache, Logits::Last)[0][0].clone();

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
        assert_eq!(out[1][0], ours, "{arch:?}: batched output must equal unbatched output");
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
/// naive one on the same file. Skipped, saying so, when the file is missing.
#[test]
fn gemma3_270m_matches_its_naive_forward() {
    let path = std::env::var_os("TANDEM_TEST_GEMMA").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf")
    });
    if !path.is_file() {
        eprintln!("SKIPPED: {} is missing (make model-gemma)", path.display());
        return;
    }
    // <bos>The capital of France is
    let tokens: Vec<u32> = vec![2, 818, 5279, 529, 7001, 563];
    let reference = naive_logits(&path, &tokens);
    let loaded = tandem_model::load(&path).unwrap();
    let m = &loaded.model;
    let mut cache = KvCache::new(m.config.n_layer, m.config.kv_dim());
    let ours = m
        .forward(&mut [SeqInput { tokens: &tokens, cache: &mut cache, adapter: None, logits: Logits::Last }])
        .unwrap()[0][0]
        .clone();
    let lse = |v: &[f32]| {
        let m = v.iter().cloned().fold(f32::MIN, f32::max);
        m + v.iter().map(|x| (x - m).exp()).sum::<f32>().ln()
    };
    let (lr, lo) = (lse(&reference), lse(&ours));
    let mut top: Vec<usize> = (0..reference.len()).collect();
    top.sort_by(|a, b| reference[*b].total_cmp(&reference[*a]));
    for &t in &top[..5] {
        eprintln!("token {t}: reference logprob {:.3}, ours {:.3}", reference[t] - lr, ours[t] - lo);
    }
    let worst = top[..20].iter().map(|&t| ((reference[t] - lr) - (ours[t] - lo)).abs()).fold(0f32, f32::max);
    assert_eq!(top[0], (0..ours.len()).max_by(|a, b| ours[*a].total_cmp(&ours[*b])).unwrap());
    assert!(worst < 0.15, "the 20 likeliest tokens' logprobs differ by up to {worst}");
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
            [0][0]
            .clone()
    };
    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let (ours, reference) = (last(&scaled), naive_logits(&scaled, &tokens));
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(diff(&ours, &reference) < 0.08 * scale, "{} of {scale}", diff(&ours, &reference));
    assert!(diff(&ours, &last(&plain)) > 0.1 * scale, "the factors changed nothing");
}
