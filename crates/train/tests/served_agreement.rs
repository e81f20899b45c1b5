//! The trainer's forward computes what the server computes, bit for bit (issue 52): the same
//! adapter scored by the training forward and by the serving model (`tandem_model::Llama`,
//! prefill or one token a step) gives identical logprobs, on the bundled model (Q4_1) and, where
//! fetched, Gemma 3 270M and Qwen2.5-Coder 0.5B (K-quants, Q5_0, Q6_K, Q8_0, and stacks of mixed
//! formats the server keeps in int8). Int8 activations make anything less than identical
//! arithmetic drift by 0.05-0.3 nats a token on these models (docs/training.md).

use candle_core::Tensor;
use std::path::{Path, PathBuf};
use tandem_model::lora::LoraAdapter;
use tandem_model::testing::{model_file, token_ids};
use tandem_model::{KvCache, Logits, Quantize, SeqInput};
use tandem_train::net::{forward, Base};
use tandem_train::pack::{Row, Target};

fn models() -> Vec<PathBuf> {
    let mut out = vec![model_file("TANDEM_TEST_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf").expect("run `make model`")];
    for (env, name) in [
        ("TANDEM_TEST_GEMMA", "gemma-3-270m-q4_k_m.gguf"),
        ("TANDEM_TEST_QWEN", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    ] {
        match model_file(env, name) {
            Some(path) => out.push(path),
            None => eprintln!("SKIPPED: {name} is missing"),
        }
    }
    out
}

/// Two sequences packed in one row, every position after each one's first a target.
fn row(a: &[u32], b: &[u32]) -> Row {
    let mut r = Row { tokens: a.iter().chain(b).copied().collect(), trajectories: 2, ..Row::default() };
    r.segments = vec![(0, a.len()), (a.len(), b.len())];
    for (seg, (start, len)) in r.segments.clone().into_iter().enumerate() {
        for pos in start + 1..start + len {
            r.targets.push(Target {
                pos,
                segment: seg,
                old_lp: -1.0,
                original_lp: f64::NAN,
                ref_lp: f64::NAN,
                advantage: 1.0,
                weight: 1.0,
                token: None,
            });
        }
    }
    r
}

#[test]
fn the_trainer_scores_an_adapter_as_the_server_does_to_the_bit() {
    for path in models() {
        check(&path, Quantize::default());
    }
}

/// Under every `--quantize`: the tiny model stores its matrices in a mix of types (f32, f16,
/// Q8_0, ...) that each setting turns into other formats (f32 under `none`), and the bundled
/// model's non-Q4_1 tensors become Q4_1 under `q4_1`. The trainer loads what the server loads.
#[test]
fn agreement_holds_under_every_quantize_setting() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny.gguf");
    tandem_model::testing::write_tiny_gguf(&tiny);
    for q in [Quantize::Q8_0, Quantize::Q4_1, Quantize::Q4K, Quantize::None] {
        check(&tiny, q);
    }
    let bundled = model_file("TANDEM_TEST_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf").expect("run `make model`");
    check(&bundled, Quantize::Q4_1);
}

/// Hugging Face checkpoint directories (bf16 and f16 safetensors) of every architecture, under
/// every `--quantize`: the loader turns the half-precision weights into the served formats (int8
/// by default, f32 under `none`), and the trainer must read those, not the file's values.
#[test]
fn agreement_holds_on_checkpoint_directories() {
    use tandem_model::testing::{write_hf_dir, write_tiny_hf_dir, HfDtype};
    use tandem_model::Arch;
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
        for dtype in [HfDtype::Bf16, HfDtype::F16] {
            let tmp = tempfile::tempdir().unwrap();
            let (_, dir) = write_tiny_hf_dir(tmp.path(), arch, dtype);
            for q in [Quantize::default(), Quantize::Q4_1, Quantize::Q4K, Quantize::None] {
                eprintln!("{arch:?} {dtype:?}");
                check(&dir, q);
            }
        }
    }
    // A real model's directory: Qwen2.5-Coder 0.5B's weights (dequantised from its GGUF) as bf16
    // safetensors, served under the default `--quantize` (int8 rows).
    match model_file("TANDEM_TEST_QWEN", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") {
        Some(qwen) => {
            let tmp = tempfile::tempdir().unwrap();
            write_hf_dir(&qwen, tmp.path(), HfDtype::Bf16);
            check(tmp.path(), Quantize::default());
        }
        None => eprintln!("SKIPPED: the Qwen2.5-Coder 0.5B directory (its GGUF is missing)"),
    }
}

/// An adapter with every pair and the head's, scored by the training forward of a base loaded
/// for a server run with `--quantize q`, and by that server's model (prefill, then one token a
/// step): the same floats.
fn check(path: &Path, q: Quantize) {
    {
        let base = Base::load_served(path, q).unwrap();
        let mut lora = tandem_train::adapter::init(&base, 3).unwrap();
        // An output-head pair too (Tinker's `train_unembed`, on by default).
        lora.head = Some(tandem_train::adapter::fresh_head(&base, lora.rank(), 4).unwrap());
        let (_, head_b) = lora.head.as_ref().unwrap();
        let n = head_b.as_tensor().elem_count();
        let v: Vec<f32> = tandem_model::testing::weights(n, 99).into_iter().map(|x| x * 0.05).collect();
        head_b.set(&Tensor::from_vec(v, head_b.as_tensor().dims(), &candle_core::Device::Cpu).unwrap()).unwrap();
        // A trained-looking adapter: B non-zero, so every projection's LoRA term counts.
        for (i, layer) in lora.pairs.iter().enumerate() {
            for (j, (_, b)) in layer.iter().enumerate() {
                let shape = b.as_tensor().dims().to_vec();
                let n: usize = shape.iter().product();
                let v: Vec<f32> =
                    tandem_model::testing::weights(n, (i * 7 + j) as u64).into_iter().map(|x| x * 0.05).collect();
                b.set(&Tensor::from_vec(v, shape, &candle_core::Device::Cpu).unwrap()).unwrap();
            }
        }
        let model = tandem_model::load_model(path, q).unwrap().model;
        let vocab = model.config.vocab as u32;
        let ids = |n, seed| token_ids(n, seed).into_iter().map(|t| t % vocab).collect::<Vec<u32>>();
        let (a, b) = (ids(37, 11), ids(21, 5));
        let ours = forward(&base, &lora, &row(&a, &b)).unwrap().logprobs.to_vec1::<f32>().unwrap();

        // The adapter as the server loads it: saved in PEFT's format, read back.
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in tandem_train::adapter::save(&lora, &base, "test").unwrap() {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let adapter = LoraAdapter::load(dir.path(), &model.config).unwrap();
        let (mut served, mut k) = (Vec::new(), 0);
        for (s, seq) in [&a, &b].into_iter().enumerate() {
            let mut cache = KvCache::new(model.config.n_layer, model.config.kv_dim());
            // The first sequence in one prefill, the second one token a step (as sampled).
            let steps: Vec<&[u32]> = if s == 0 { vec![&seq[..]] } else { seq.chunks(1).collect() };
            let mut pos = 0;
            for step in steps {
                let logits = model
                    .forward(&mut [SeqInput {
                        tokens: step,
                        cache: &mut cache,
                        adapter: Some(&adapter),
                        logits: Logits::All,
                    }])
                    .unwrap();
                for i in 0..step.len() {
                    if let Some(&next) = seq.get(pos + i + 1) {
                        let row = &logits[(0, i)];
                        served.push(row[next as usize] - tandem_model::as_served::log_normalizer(row));
                        k += 1;
                    }
                }
                pos += step.len();
            }
        }
        assert_eq!(k, ours.len());
        let diffs: Vec<f32> = ours.iter().zip(&served).map(|(o, s)| (o - s).abs()).collect();
        let (mean, max) = (diffs.iter().sum::<f32>() / k as f32, diffs.iter().cloned().fold(0f32, f32::max));
        eprintln!("{} ({q:?}): |trainer - server| mean {mean:e}, max {max:e} over {k} tokens", path.display());
        assert_eq!(ours, served, "{} ({q:?}): the trainer's logprobs are not the server's", path.display());
    }
}
