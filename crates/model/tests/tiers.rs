//! Every kernel tier (`TANDEM_CPU=avx512|avxvnni|avx2|scalar`) computes the same model: the tier is fixed
//! per process, so this test runs its own binary once per tier (the ignored `tier_child` below)
//! and compares each tier's logits with the naive f32 forward and with the other tiers', on the
//! bundled model (Q4_1) and, where fetched, Gemma 3 270M (K-quants, Q5_0, Q6_K, Q8_0).

mod common;

use common::naive_logits;
use std::path::{Path, PathBuf};
use tandem_model::testing::{model_file, token_ids};
use tandem_model::{KvCache, Logits, SeqInput};

fn models() -> Vec<PathBuf> {
    let smol = model_file("TANDEM_TEST_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf").expect("run `make model`");
    match model_file("TANDEM_TEST_GEMMA", "gemma-3-270m-q4_k_m.gguf") {
        Some(gemma) => vec![smol, gemma],
        None => {
            eprintln!("SKIPPED for Gemma: its file is missing (make model-gemma)");
            vec![smol]
        }
    }
}

/// A prompt that starts with the model's own "The capital of France is" (read from its
/// tokenizer-free id lists: these are the ids in each vocabulary), then ordinary tokens.
fn prompts(path: &Path) -> Vec<Vec<u32>> {
    let gemma = path.to_string_lossy().contains("gemma");
    let capital = if gemma { vec![2, 818, 5279, 529, 7001, 563] } else { vec![504, 3575, 282, 4649, 314] };
    let bos: &[u32] = if gemma { &[2] } else { &[] };
    vec![capital, [bos, &token_ids(40, 2_463_534_242)].concat()]
}

/// The last logits of each prompt, prefilled in two chunks and the final token decoded alone
/// (the prefill and the one-row kernels both run).
fn logits(path: &Path) -> Vec<Vec<f32>> {
    let loaded = tandem_model::load(path).unwrap();
    let m = &loaded.model;
    prompts(path)
        .iter()
        .map(|tokens| {
            let mut cache = KvCache::new(m.config.n_layer, m.config.kv_dim());
            let (head, last) = tokens.split_at(tokens.len() - 1);
            let half = head.len() / 2;
            for chunk in [&head[..half], &head[half..]] {
                m.forward(&mut [SeqInput { tokens: chunk, cache: &mut cache, adapter: None, logits: Logits::None }])
                    .unwrap();
            }
            m.forward(&mut [SeqInput { tokens: last, cache: &mut cache, adapter: None, logits: Logits::Last }]).unwrap()
                [(0, 0)]
                .to_vec()
        })
        .collect()
}

/// Run by [`every_tier_computes_the_same_model`] in a process of its own with `TANDEM_CPU` set:
/// writes the tier it ran at and its logits to `TANDEM_TIER_OUT`.
#[test]
#[ignore = "a child of every_tier_computes_the_same_model"]
fn tier_child() {
    let out = PathBuf::from(std::env::var_os("TANDEM_TIER_OUT").expect("run by every_tier_computes_the_same_model"));
    let mut text = format!("{}\n", tandem_model::kernels::cpu::cpu().name());
    for path in models() {
        for row in logits(&path) {
            text += &row.iter().map(|v| v.to_bits().to_string()).collect::<Vec<_>>().join(" ");
            text += "\n";
        }
    }
    std::fs::write(out, text).unwrap();
}

fn kl(reference: &[f32], other: &[f32]) -> f64 {
    let lse = |v: &[f32]| {
        let m = v.iter().cloned().fold(f32::MIN, f32::max) as f64;
        m + v.iter().map(|x| (*x as f64 - m).exp()).sum::<f64>().ln()
    };
    let (lr, lo) = (lse(reference), lse(other));
    reference.iter().zip(other).map(|(r, o)| (*r as f64 - lr).exp() * ((*r as f64 - lr) - (*o as f64 - lo))).sum()
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).max_by(|a, b| v[*a].total_cmp(&v[*b])).unwrap()
}

#[test]
fn every_tier_computes_the_same_model() {
    let detected = tandem_model::kernels::cpu::cpu();
    let dir = std::env::temp_dir().join(format!("tandem-tiers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut runs = Vec::new();
    for tier in ["avx512", "avxvnni", "avx2", "scalar"] {
        let out = dir.join(tier);
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["tier_child", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
            .env("TANDEM_CPU", tier)
            .env("TANDEM_TIER_OUT", &out)
            .status()
            .unwrap();
        assert!(status.success(), "the {tier} child failed");
        let text = std::fs::read_to_string(&out).unwrap();
        let mut lines = text.lines();
        let ran = lines.next().unwrap().to_string();
        let rows: Vec<Vec<f32>> =
            lines.map(|l| l.split(' ').map(|b| f32::from_bits(b.parse().unwrap())).collect()).collect();
        // The tier asked for, or the highest below it that the CPU has.
        let expected = tandem_model::kernels::cpu::Tier::parse(tier).map(|t| detected.capped(t).name()).unwrap();
        assert_eq!(ran, expected, "TANDEM_CPU={tier} ran at the wrong tier");
        runs.push((tier, ran, rows));
    }
    std::fs::remove_dir_all(&dir).ok();
    let references: Vec<Vec<f32>> =
        models().iter().flat_map(|p| prompts(p).into_iter().map(|t| naive_logits(p, &t)).collect::<Vec<_>>()).collect();
    for (tier, ran, rows) in &runs {
        assert_eq!(rows.len(), references.len());
        for (i, (row, reference)) in rows.iter().zip(&references).enumerate() {
            let d = kl(reference, row);
            eprintln!("{tier} ({ran}) prompt {i}: KL {d:.5} from the exact forward");
            // The int8 activations' rounding moves each tier a little, differently (see
            // reference.rs); a wrong kernel moves it by orders of magnitude more.
            assert!(d < 0.05, "{tier}: prompt {i} is KL {d} from the exact forward");
            if i % 2 == 0 {
                // "The capital of France is": Paris leads by far on both models.
                assert_eq!(argmax(row), argmax(reference), "{tier}: prompt {i}'s likeliest token");
            }
        }
    }
    // Tiers against each other: as close as each is to the exact forward.
    for (tier, _, rows) in &runs[1..] {
        for (i, (row, top)) in rows.iter().zip(&runs[0].2).enumerate() {
            let d = kl(top, row);
            eprintln!("{tier} against {}: prompt {i}: KL {d:.5}", runs[0].0);
            assert!(d < 0.05, "{tier} against {}: prompt {i} is KL {d} apart", runs[0].0);
        }
    }
}
