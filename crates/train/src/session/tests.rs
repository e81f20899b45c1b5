use super::*;
use crate::TrainBase;
use std::collections::BTreeMap;
use tandem_core::chat::ChatMessage;
use tandem_core::inference::InputError;
use tandem_core::sequences::ChatTokenizer;

/// Sessions take token ids: no text is ever tokenized here.
pub(crate) struct IdsOnly;
impl ChatTokenizer for IdsOnly {
    fn render(&self, _: &[ChatMessage], _: Option<&serde_json::Value>, _: bool) -> Result<Vec<u32>, InputError> {
        Err(InputError::Template("sessions take token ids".into()))
    }
    fn tokenize(&self, _: &str) -> Result<Vec<u32>, InputError> {
        Err(InputError::Template("sessions take token ids".into()))
    }
    fn token_id(&self, _: &[u8]) -> Option<u32> {
        None
    }
}

fn trainer() -> (tempfile::TempDir, LoraTrainer) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    tandem_model::testing::write_tiny_arch_gguf(&path, tandem_model::Arch::Llama);
    (dir, LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path, tokenizer: Arc::new(IdsOnly) }]))
}

fn datum(tokens: &[u32], next: u32, key: &str, values: Vec<f64>) -> Datum {
    let mut targets = tokens[1..].to_vec();
    targets.push(next);
    let mut inputs = BTreeMap::from([(key.to_string(), values)]);
    if key == "advantages" {
        inputs.insert("logprobs".into(), vec![0.0; tokens.len()]);
    }
    Datum { tokens: tokens.to_vec(), targets, inputs }
}

fn step() -> AdamStep {
    AdamStep {
        params: AdamParams { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-12, weight_decay: 0.0 },
        grad_clip_norm: 0.0,
    }
}

fn weights(s: &mut Session) -> Vec<f32> {
    let vars = s.held.live().unwrap().lora.vars();
    vars.iter().flat_map(|v| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect()
}

#[test]
fn cross_entropy_steps_raise_the_weighted_targets_logprob() {
    let (_dir, t) = trainer();
    let mut s = Session::create(&t, "tiny", 4, 32.0, Some(1)).unwrap();
    let d = datum(&[10, 20, 30, 40], 50, "weights", vec![0.0, 1.0, 1.0, 1.0]);
    let before = s.forward_backward(&t, std::slice::from_ref(&d), TokenLoss::CrossEntropy, false).unwrap();
    assert_eq!(before.logprobs[0].len(), 4);
    // The loss is -sum(w * lp) over the weighted targets.
    let want: f64 = -before.logprobs[0][1..].iter().map(|x| f64::from(*x)).sum::<f64>();
    assert!((before.loss - want).abs() < 1e-4, "{} vs {want}", before.loss);
    assert!(s.can_park(), "a forward alone leaves no gradient");
    for _ in 0..5 {
        s.forward_backward(&t, std::slice::from_ref(&d), TokenLoss::CrossEntropy, true).unwrap();
        assert!(!s.can_park());
        assert!(s.optim_step(&t, step()).unwrap() > 0.0);
    }
    let after = s.forward_backward(&t, &[d], TokenLoss::CrossEntropy, false).unwrap();
    assert!(after.loss < before.loss - 0.1, "{} -> {}", before.loss, after.loss);
    // The unweighted first target is trained by nothing but moves with the shared weights.
    assert!(s.optim_step(&t, step()).unwrap() == 0.0, "no gradient pending: nothing moves");
}

/// `train_attn: false` (or `train_mlp: false`): only the other projections move; the frozen
/// ones keep their fresh pair (B = 0), and a saved state keeps the choice.
#[test]
fn only_the_chosen_modules_train() {
    let (dir, t) = trainer();
    let pairs = |s: &mut Session| {
        let lora = &s.held.live().unwrap().lora;
        let flat = |v: &Var| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        lora.pairs.iter().map(|l| l.iter().map(|(a, b)| (flat(a), flat(b))).collect::<Vec<_>>()).collect::<Vec<_>>()
    };
    let head = |s: &mut Session| {
        let lora = &s.held.live().unwrap().lora;
        let flat = |v: &Var| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        lora.head.as_ref().map(|(a, b)| (flat(a), flat(b)))
    };
    let d = datum(&[10, 20, 30, 40], 50, "weights", vec![1.0; 4]);
    let plain = Session::create(&t, "tiny", 4, 32.0, Some(2)).unwrap().forward_backward(
        &t,
        std::slice::from_ref(&d),
        TokenLoss::CrossEntropy,
        false,
    );
    for modules in [
        Modules { attn: false, mlp: true, unembed: false },
        Modules { attn: true, mlp: false, unembed: true },
        Modules { attn: false, mlp: false, unembed: true },
    ] {
        let mut s = Session::create(&t, "tiny", 4, 32.0, Some(2)).unwrap().training(modules, Some(2)).unwrap();
        let (before, head_before) = (pairs(&mut s), head(&mut s));
        assert_eq!(head_before.is_some(), modules.unembed);
        // A fresh head pair (B = 0) changes nothing until trained.
        let fresh = s.forward_backward(&t, std::slice::from_ref(&d), TokenLoss::CrossEntropy, false).unwrap();
        // (Up to the rounding of another product's summation order.)
        let plain = plain.as_ref().unwrap();
        assert!((fresh.loss - plain.loss).abs() < 1e-4, "{} vs {}", fresh.loss, plain.loss);
        for _ in 0..2 {
            s.forward_backward(&t, std::slice::from_ref(&d), TokenLoss::CrossEntropy, true).unwrap();
            assert!(s.optim_step(&t, step()).unwrap() > 0.0);
        }
        let after = pairs(&mut s);
        let trained = s.forward_backward(&t, std::slice::from_ref(&d), TokenLoss::CrossEntropy, false).unwrap();
        assert!(trained.loss < fresh.loss, "{modules:?}: {} -> {}", fresh.loss, trained.loss);
        let head_after = head(&mut s);
        if let (Some(b), Some(a)) = (&head_before, &head_after) {
            assert!(b.0 != a.0 && b.1 != a.1, "the head's pair trains");
        }
        // The served files carry the head's pair exactly when it trains.
        let files = s.adapter_files().unwrap();
        let config = &files.iter().find(|(n, _)| n == "adapter_config.json").unwrap().1;
        assert_eq!(String::from_utf8_lossy(config).contains("lm_head"), modules.unembed);
        for (layer, (b, a)) in before.iter().zip(&after).enumerate() {
            for m in 0..7 {
                let moved = b[m] != a[m];
                assert_eq!(moved, modules.trains(m), "layer {layer} module {m} with {modules:?}");
                if !modules.trains(m) {
                    assert!(a[m].1.iter().all(|x| *x == 0.0), "a frozen B stays 0");
                }
            }
        }
        let path = dir.path().join(format!("state-{}-{}.safetensors", modules.attn, modules.mlp));
        s.save_state(&path).unwrap();
        assert_eq!(state_modules(&path), modules);
        let mut loaded = Session::load_state(&t, &path, true).unwrap();
        assert_eq!(loaded.modules, modules);
        loaded.forward_backward(&t, std::slice::from_ref(&d), TokenLoss::CrossEntropy, true).unwrap();
        loaded.optim_step(&t, step()).unwrap();
        let next = pairs(&mut loaded);
        for m in (0..7).filter(|m| !modules.trains(*m)) {
            assert_eq!(next[0][m], before[0][m], "module {m} stays frozen after loading");
        }
        assert_eq!(head(&mut loaded).is_some(), modules.unembed, "the head's pair is saved with the state");
    }
    let nothing = Modules { attn: false, mlp: false, unembed: false };
    assert!(Session::create(&t, "tiny", 4, 32.0, None).unwrap().training(nothing, None).is_err());
}

/// Gradients summed over two calls equal one call over both datums; and importance sampling
/// at ratio 1 has cross-entropy's gradient with the advantages as weights.
#[test]
fn gradients_accumulate_across_calls_and_losses_agree_where_they_should() {
    let (_dir, t) = trainer();
    let a = datum(&[3, 4, 5], 6, "weights", vec![1.0, 0.5, -0.25]);
    let b = datum(&[7, 8], 9, "weights", vec![2.0, 1.0]);
    let run = |calls: Vec<Vec<Datum>>| {
        let mut s = Session::create(&t, "tiny", 4, 32.0, Some(7)).unwrap();
        for data in calls {
            s.forward_backward(&t, &data, TokenLoss::CrossEntropy, true).unwrap();
        }
        let norm = s.optim_step(&t, step()).unwrap();
        (norm, weights(&mut s))
    };
    let (n1, w1) = run(vec![vec![a.clone()], vec![b.clone()]]);
    let (n2, w2) = run(vec![vec![a.clone(), b.clone()]]);
    // One call packs both datums in one row: the same numbers up to summation order.
    assert!((n1 - n2).abs() < 1e-6 * n1.max(1.0), "{n1} vs {n2}");
    let d = w1.iter().zip(&w2).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(d < 1e-5, "weights differ by {d}");

    // The sampler's logprobs equal the learner's: ratio 1, d/dlp(-r A) = -A, as CE with w = A.
    let mut s = Session::create(&t, "tiny", 4, 32.0, Some(7)).unwrap();
    let lp = s.forward_backward(&t, std::slice::from_ref(&a), TokenLoss::CrossEntropy, false).unwrap().logprobs;
    let mut is = datum(&[3, 4, 5], 6, "advantages", vec![1.0, 0.5, -0.25]);
    is.inputs.insert("logprobs".into(), lp[0].iter().map(|x| f64::from(*x)).collect());
    s.forward_backward(&t, &[is], TokenLoss::ImportanceSampling, true).unwrap();
    let n3 = s.optim_step(&t, step()).unwrap();
    let (n4, _) = run(vec![vec![a.clone()]]);
    assert!((n3 - n4).abs() < 1e-5 * n4, "{n3} vs {n4}");
}

/// A GRPO group's datums share their prompt: laid out as a prefix tree (also over several
/// rows), each datum's logprobs, the loss and the step are what the datums give alone.
#[test]
fn datums_sharing_a_prompt_train_as_they_do_alone() {
    let prompt: Vec<u32> = (10..24).collect();
    let group: Vec<Datum> = [vec![30, 31, 32], vec![40], vec![50, 51], vec![30, 31, 60]]
        .iter()
        .enumerate()
        .map(|(k, completion)| {
            let tokens: Vec<u32> = prompt.iter().chain(completion).copied().collect();
            let n = tokens.len();
            // Advantages on the completion's targets only, as the cookbook builds them.
            let adv: Vec<f64> =
                (0..n).map(|i| if i + 1 >= prompt.len() { 0.5 - 0.3 * k as f64 } else { 0.0 }).collect();
            let mut d = datum(&tokens, 70 + k as u32, "advantages", adv);
            d.inputs.insert("logprobs".into(), (0..n).map(|i| -1.0 - 0.01 * i as f64).collect());
            d
        })
        .collect();
    for part in [512, 24] {
        let run = |share: bool| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            tandem_model::testing::write_tiny_arch_gguf(&path, tandem_model::Arch::Qwen2);
            // f32 products: the int8 ones round a shared prefix's summed gradient once
            // (tests/tiny.rs measures that).
            let t = LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path, tokenizer: Arc::new(IdsOnly) }])
                .with_part_tokens(part)
                .with_prefix_sharing(share)
                .with_exact_base(true);
            let mut s = Session::create(&t, "tiny", 4, 32.0, Some(3)).unwrap();
            let f = s.forward_backward(&t, &group, TokenLoss::ImportanceSampling, true).unwrap();
            let norm = s.optim_step(&t, step()).unwrap();
            (f, norm, weights(&mut s))
        };
        let ((tree, n_tree, w_tree), (flat, n_flat, w_flat)) = (run(true), run(false));
        // The loss sums terms of both signs (advantages +0.5 to -0.4): compare it absolutely.
        assert!((tree.loss - flat.loss).abs() < 1e-4, "{} vs {}", tree.loss, flat.loss);
        assert!((n_tree - n_flat).abs() < 1e-5 * n_flat, "{n_tree} vs {n_flat}");
        for (a, b) in tree.logprobs.iter().flatten().zip(flat.logprobs.iter().flatten()) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        assert_eq!(tree.logprobs.iter().map(Vec::len).collect::<Vec<_>>(), vec![17, 15, 16, 17]);
        let d = w_tree.iter().zip(&w_flat).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d < 2e-4, "part {part}: weights differ by {d}");
    }
}

#[test]
fn bad_datums_and_settings_are_refused_and_keep_nothing() {
    let (_dir, t) = trainer();
    let mut s = Session::create(&t, "tiny", 4, 32.0, None).unwrap();
    let ce = TokenLoss::CrossEntropy;
    let cases = [
        (datum(&[1, 2], 100_000, "weights", vec![1.0; 2]), "outside the vocabulary"),
        (datum(&[1, 2], 3, "weights", vec![1.0]), "1 values for 2"),
        (datum(&[1, 2], 3, "advantages", vec![1.0; 2]), "weights"),
    ];
    for (d, want) in cases {
        let e = s.forward_backward(&t, &[d], ce, true).unwrap_err().to_string();
        assert!(e.contains(want), "{e:?} lacks {want:?}");
    }
    assert!(s.can_park(), "a refused call leaves no gradient");
    let mut bad = step();
    bad.params.beta2 = 1.0;
    assert!(s.optim_step(&t, bad).is_err());
    assert!(Session::create(&t, "tiny", 0, 32.0, None).is_err());
    assert!(Session::create(&t, "other", 4, 32.0, None).is_err());
}

/// A call cut into slices at part boundaries (the trainer's turn passes between them) gives
/// the logprobs, loss and gradients of the same call run at once; a call that fails part
/// way leaves the pending gradients as they were.
#[test]
fn a_sliced_call_is_the_call() {
    let data: Vec<Datum> =
        (0..4u32).map(|k| datum(&[3 + k, 4 + k, 5 + k, 6 + k], 7, "weights", vec![1.0, 0.5, -0.25, 1.0])).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    tandem_model::testing::write_tiny_arch_gguf(&path, tandem_model::Arch::Llama);
    let with_parts = |part: usize| {
        LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path: path.clone(), tokenizer: Arc::new(IdsOnly) }])
            .with_part_tokens(part)
            .with_exact_base(true)
    };
    let run = |t: &LoraTrainer| {
        let mut s = Session::create(t, "tiny", 4, 32.0, Some(7)).unwrap();
        // Something pending before the call, which a sliced call must keep and add to.
        s.forward_backward(t, &data[..1], TokenLoss::CrossEntropy, true).unwrap();
        let mut slices = 0;
        let f = s.forward_backward_sliced(t, &data, TokenLoss::CrossEntropy, true, &mut || slices += 1).unwrap();
        let norm = s.optim_step(t, step()).unwrap();
        (f, norm, weights(&mut s), slices)
    };
    let (whole, n1, w1, one) = run(&with_parts(512));
    let t = with_parts(5);
    let (cut, n2, w2, slices) = run(&t);
    assert_eq!((one, slices), (0, 3), "one part; four datums of 5 tokens, a part each");
    assert!((whole.loss - cut.loss).abs() < 1e-5, "{} vs {}", whole.loss, cut.loss);
    for (a, b) in whole.logprobs.iter().flatten().zip(cut.logprobs.iter().flatten()) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    assert!((n1 - n2).abs() < 1e-5 * n1, "{n1} vs {n2}");
    let d = w1.iter().zip(&w2).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(d < 1e-5, "weights differ by {d}");

    // A refused call (a target past the vocabulary, found before any slice runs) leaves what
    // was pending.
    let mut s = Session::create(&t, "tiny", 4, 32.0, Some(7)).unwrap();
    s.forward_backward(&t, &data[..1], TokenLoss::CrossEntropy, true).unwrap();
    let mut bad = data.clone();
    bad[3].targets[3] = 1_000_000;
    assert!(s.forward_backward_sliced(&t, &bad, TokenLoss::CrossEntropy, true, &mut || {}).is_err());
    let kept = s.optim_step(&t, step()).unwrap();
    let mut fresh = Session::create(&t, "tiny", 4, 32.0, Some(7)).unwrap();
    fresh.forward_backward(&t, &data[..1], TokenLoss::CrossEntropy, true).unwrap();
    assert_eq!(kept, fresh.optim_step(&t, step()).unwrap());
}

/// Position i scores whatever `target_tokens[i]` names, as Tinker does, not only the next
/// input token (issue 50: tinker-cookbook's rl_loop puts token 0 at prompt positions).
#[test]
fn any_target_token_is_scored_at_its_position() {
    let (_dir, t) = trainer();
    let mut s = Session::create(&t, "tiny", 4, 32.0, Some(3)).unwrap();
    let ce = TokenLoss::CrossEntropy;
    let mut named = datum(&[1, 2, 3], 4, "weights", vec![1.0; 3]);
    named.targets[0] = 9;
    let shifted = datum(&[1, 2, 3], 4, "weights", vec![1.0; 3]);
    let nine_next = datum(&[1, 9], 5, "weights", vec![1.0; 2]);
    let got = s.forward_backward(&t, &[named, shifted, nine_next], ce, false).unwrap().logprobs;
    assert_eq!(got[0][0], got[2][0], "position 0 scores token 9 after token 1");
    assert_ne!(got[0][0], got[1][0]);
    assert_eq!(got[0][1..], got[1][1..], "the later positions are the shifted inputs'");
    // And it trains: the named target's logprob rises with a step on it alone.
    let mut only = datum(&[1, 2, 3], 4, "weights", vec![1.0, 0.0, 0.0]);
    only.targets[0] = 9;
    let before = s.forward_backward(&t, std::slice::from_ref(&only), ce, true).unwrap().logprobs[0][0];
    s.optim_step(&t, step()).unwrap();
    let after = s.forward_backward(&t, &[only], ce, false).unwrap().logprobs[0][0];
    assert!(after > before, "{before} -> {after}");
}
