//! The trainer on the tiny random-weight GGUF of `tandem_model::testing`: the training forward
//! agrees with the inference model, the whole loss gradient agrees with finite differences, and
//! a job moves probability towards the advantaged completion and saves a loadable adapter.

use candle_core::{Tensor, Var};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use tandem_core::chat::ChatMessage;
use tandem_core::inference::InputError;
use tandem_core::sequences::{tokenize_groups, ChatTokenizer, ModelBounds, RlInputs, TrainedModel};
use tandem_core::sft::{AssistantTurns, LearningRate, SftConfig};
use tandem_core::train_config::{ImportanceSamplingLevel, KlPenalty, KlReference, KlSource, LossKind, TrainConfig};
use tandem_jobs::{ReferencePolicy, TrainError, TrainJob, TrainSink, TrainTask, Trainer};
use tandem_model::{Arch, KvCache, Logits, SeqInput};
use tandem_train::loss::{policy_loss, LossConfig, TokenInput};
use tandem_train::net::{forward, Base};
use tandem_train::pack::{Row, Target};
use tandem_train::{adapter, LoraTrainer, TrainBase};

fn tiny() -> (tempfile::TempDir, std::path::PathBuf) {
    tiny_arch(Arch::Llama)
}

fn tiny_arch(arch: Arch) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    tandem_model::testing::write_tiny_arch_gguf(&path, arch);
    (dir, path)
}

const ARCHS: [Arch; 4] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3];

/// A row of two segments, every token after the first of a segment trained.
fn row(a: &[u32], b: &[u32]) -> Row {
    let mut r = Row { tokens: a.iter().chain(b).copied().collect(), trajectories: 2, ..Row::default() };
    r.segments = vec![(0, a.len()), (a.len(), b.len())];
    for (seg, (start, len)) in r.segments.clone().into_iter().enumerate() {
        for pos in start + 1..start + len {
            let adv = if seg == 0 { 1.0 } else { -0.7 };
            r.targets.push(Target {
                pos,
                segment: seg,
                old_lp: -5.0 + 0.1 * pos as f64,
                original_lp: f64::NAN,
                ref_lp: f64::NAN,
                advantage: adv,
                weight: 1.0,
                token: None,
            });
        }
    }
    r
}

/// Sets every adapter's B to small seeded values (PEFT's init leaves it zero, so A would get no
/// gradient).
fn nonzero_b(lora: &tandem_train::net::Lora, seed: u64) {
    for layer in &lora.pairs {
        for (_, b) in layer {
            let shape = b.as_tensor().dims().to_vec();
            let n: usize = shape.iter().product();
            let v: Vec<f32> = tandem_model::testing::weights(n, seed).into_iter().map(|x| x * 0.2).collect();
            b.set(&Tensor::from_vec(v, shape, &candle_core::Device::Cpu).unwrap()).unwrap();
        }
    }
}

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().cloned().fold(f32::MIN, f32::max);
    let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
    x.iter().map(|v| v - lse).collect()
}

/// For every architecture: the inference model is checked against an independent forward in
/// `tandem_model`'s tests, the training forward against the inference model here.
#[test]
fn training_forward_agrees_with_the_inference_model() {
    for arch in ARCHS {
        training_forward_agrees_for(arch);
    }
}

fn training_forward_agrees_for(arch: Arch) {
    let (_dir, path) = tiny_arch(arch);
    let base = Base::load(&path).unwrap();
    let lora = adapter::init(&base, 1).unwrap();
    let (a, b): (Vec<u32>, Vec<u32>) = ((10..40).collect(), (50..62).collect());
    let r = row(&a, &b);
    let ours = forward(&base, &lora, &r).unwrap().logprobs.to_vec1::<f32>().unwrap();

    let model = tandem_model::load(&path).unwrap().model;
    let (mut k, mut diffs) = (0, Vec::new());
    for seq in [&a, &b] {
        let mut cache = KvCache::new(model.config.n_layer, model.config.kv_dim());
        let logits = model
            .forward(&mut [SeqInput { tokens: seq, cache: &mut cache, adapter: None, logits: Logits::All }])
            .unwrap();
        for i in 1..seq.len() {
            let lp = log_softmax(&logits[(0, i - 1)])[seq[i] as usize];
            diffs.push((lp - ours[k]).abs());
            // The inference kernels quantise activations to int8: a few hundredths at most.
            assert!((lp - ours[k]).abs() < 0.08, "{arch:?} token {i}: inference {lp}, training {}", ours[k]);
            k += 1;
        }
    }
    assert_eq!(k, ours.len());
    let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
    eprintln!(
        "{arch:?}: |inference - training| logprob mean {mean}, max {}",
        diffs.iter().cloned().fold(0f32, f32::max)
    );
    assert!(mean < 0.02, "{arch:?}: mean logprob difference {mean}");
}

#[test]
fn loss_gradient_through_the_model_matches_finite_differences() {
    for arch in ARCHS {
        loss_gradient_matches_finite_differences_for(arch);
    }
}

fn loss_gradient_matches_finite_differences_for(arch: Arch) {
    let (_dir, path) = tiny_arch(arch);
    let base = Base::load_exact(&path).unwrap();
    let lora = adapter::init(&base, 2).unwrap();
    // Non-zero B so that A gets gradients too.
    nonzero_b(&lora, 7);
    let r = row(&[3, 40, 41, 42, 43, 44], &[5, 60, 61, 62]);
    let cfg = LossConfig {
        kind: LossKind::Ppo,
        epsilon: 10.0,
        epsilon_high: 10.0,
        level: ImportanceSamplingLevel::Average,
        max_ratio: None,
        mask_prob_ratio: false,
        k2_tau: None,
        truncated_is: None,
        kl: None,
    };
    let loss_of = |lps: &[f32]| {
        let inputs: Vec<TokenInput> = r
            .targets
            .iter()
            .zip(lps)
            .map(|(t, lp)| TokenInput {
                new_lp: *lp as f64,
                old_lp: t.old_lp,
                original_lp: f64::NAN,
                advantage: t.advantage,
                weight: t.weight,
                segment: t.segment,
                ref_lp: f64::NAN,
            })
            .collect();
        policy_loss(&inputs, &cfg)
    };
    let out = forward(&base, &lora, &r).unwrap();
    let lps = out.logprobs.to_vec1::<f32>().unwrap();
    let g = Tensor::from_vec(
        loss_of(&lps).grad.iter().map(|x| *x as f32).collect::<Vec<_>>(),
        lps.len(),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let grads = out.logprobs.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();

    let probe = |var: &Var, idx: usize| -> (f64, f64) {
        let analytic = grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()[idx] as f64;
        let orig = var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let shape = var.as_tensor().dims().to_vec();
        let at = |delta: f32| {
            let mut v = orig.clone();
            v[idx] += delta;
            var.set(&Tensor::from_vec(v, shape.clone(), &candle_core::Device::Cpu).unwrap()).unwrap();
            let lps = forward(&base, &lora, &r).unwrap().logprobs.to_vec1::<f32>().unwrap();
            loss_of(&lps).loss
        };
        let h = 1e-2;
        let fd = (at(h) - at(-h)) / (2.0 * h as f64);
        var.set(&Tensor::from_vec(orig, shape, &candle_core::Device::Cpu).unwrap()).unwrap();
        (analytic, fd)
    };
    // A and B of q (RoPE), v, o and down, in both layers.
    for (layer, module, ab, idx) in
        [(0, 0, 0, 5), (0, 0, 1, 17), (1, 2, 1, 3), (0, 3, 0, 40), (1, 6, 1, 9), (1, 4, 0, 77)]
    {
        let pair = &lora.pairs[layer][module];
        let var = if ab == 0 { &pair.0 } else { &pair.1 };
        let (analytic, fd) = probe(var, idx);
        let tol = 2e-2 * fd.abs().max(analytic.abs()).max(1e-3);
        eprintln!("{arch:?} layer {layer} module {module} {ab}: autograd {analytic:.6} fd {fd:.6}");
        assert!(
            (analytic - fd).abs() < tol,
            "{arch:?} layer {layer} module {module} {ab}: autograd {analytic} vs fd {fd}"
        );
    }
}

/// The model record of a job on the tiny base.
fn tiny_model_record() -> tandem_core::records::ModelRecord {
    tandem_core::records::ModelRecord {
        id: uuid::Uuid::nil(),
        entity: "e".into(),
        project: "p".into(),
        name: "m".into(),
        base_model: "tiny".into(),
        run_id: "r".into(),
        created_at: 0,
    }
}

struct Bytes;
impl ChatTokenizer for Bytes {
    fn render(&self, _m: &[ChatMessage], _t: Option<&Value>, _g: bool) -> Result<Vec<u32>, InputError> {
        Err(InputError::Template("not used".into()))
    }
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, InputError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        (bytes.len() == 1).then(|| u32::from(bytes[0]))
    }
}

#[derive(Default)]
struct Sink {
    started: Option<u64>,
    steps: Vec<BTreeMap<String, f64>>,
    /// Parks the run's state here and reads it back at every boundary that can park.
    park: Option<std::path::PathBuf>,
    parks: usize,
}
impl TrainSink for Sink {
    fn started(&mut self, n: u64, _extra: Map<String, Value>) {
        self.started = Some(n);
    }
    fn gradient_step(&mut self, m: BTreeMap<String, f64>) {
        self.steps.push(m);
    }
    fn should_stop(&mut self) -> Option<TrainError> {
        None
    }
    fn boundary(&mut self, held: &mut dyn tandem_jobs::Park) -> Option<TrainError> {
        if let Some(path) = &self.park {
            held.park(path).unwrap();
            self.parks += 1;
            held.unpark().unwrap();
            assert!(!path.exists());
        }
        None
    }
}

impl Sink {
    fn parking(dir: &std::path::Path) -> Self {
        Sink { park: Some(dir.join("parked.safetensors")), ..Sink::default() }
    }
}

/// An RL job's config and KL reference, to vary a job in a test.
fn rl(job: &mut TrainJob) -> (&mut TrainConfig, &mut Option<ReferencePolicy>) {
    match &mut job.task {
        TrainTask::Rl { config, kl_reference, .. } => (config, kl_reference),
        TrainTask::Sft { .. } => panic!("not an RL job"),
    }
}

/// An RL job of the tiny base's model on raw trajectory groups.
fn rl_job(config: TrainConfig, groups: Value, kl_reference: Option<ReferencePolicy>) -> TrainJob {
    TrainJob {
        job_id: uuid::Uuid::now_v7(),
        model: tiny_model_record(),
        base_step: 0,
        base_checkpoint: None,
        task: TrainTask::Rl { config, inputs: RlInputs::Raw(groups), kl_reference },
    }
}

/// The adapter weights a job wrote.
fn adapter_weights(out: &tandem_jobs::TrainOutput) -> Vec<u8> {
    out.files.iter().find(|(n, _)| n == "adapter_model.safetensors").unwrap().1.clone()
}

/// Two updates agree: one Adam step of 1e-2 normalises each gradient entry, so where an entry
/// is tiny, float summation order shows up in the update; compare at 2% of the step.
fn assert_same_update(a: &[u8], b: &[u8], what: &str) {
    let load = |bytes: &[u8]| candle_core::safetensors::load_buffer(bytes, &candle_core::Device::Cpu).unwrap();
    let (a, b) = (load(a), load(b));
    for (k, ta) in &a {
        let d =
            ta.sub(&b[k]).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
        assert!(d < 2e-4, "{what}{k} differs by {d}");
    }
}

fn choice(prompt: &[u32], ids: &[u32], lp: f64) -> Value {
    json!({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": ""},
           "prompt_token_ids": prompt, "token_ids": ids,
           "logprobs": {"content": ids.iter().map(|i| json!({"token": format!("token_id:{i}"), "logprob": lp})).collect::<Vec<_>>()}})
}

#[test]
fn a_job_moves_probability_towards_the_rewarded_completion() {
    let (dir, path) = tiny();
    let trainer =
        LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path: path.clone(), tokenizer: Arc::new(Bytes) }]);
    let prompt: Vec<u32> = (20..30).collect();
    let (good, bad): (Vec<u32>, Vec<u32>) = (vec![70, 71, 72], vec![90, 91, 92]);
    let base = Base::load(&path).unwrap();
    let score = |lora: &tandem_train::net::Lora| {
        let mut r =
            Row { tokens: prompt.iter().chain(&good).chain(&prompt).chain(&bad).copied().collect(), ..Row::default() };
        r.segments = vec![(0, 13), (13, 13)];
        for pos in [10, 11, 12] {
            r.targets.push(Target {
                pos,
                segment: 0,
                old_lp: 0.0,
                original_lp: f64::NAN,
                ref_lp: f64::NAN,
                advantage: 0.0,
                weight: 0.0,
                token: None,
            });
        }
        for pos in [23, 24, 25] {
            r.targets.push(Target {
                pos,
                segment: 1,
                old_lp: 0.0,
                original_lp: f64::NAN,
                ref_lp: f64::NAN,
                advantage: 0.0,
                weight: 0.0,
                token: None,
            });
        }
        let lp = forward(&base, lora, &r).unwrap().logprobs.to_vec1::<f32>().unwrap();
        (lp[..3].iter().sum::<f32>(), lp[3..].iter().sum::<f32>())
    };
    let before = score(&adapter::init(&base, 3407).unwrap());
    let model = tiny_model_record();
    let groups = json!([{"trajectories": [
        {"reward": 1.0, "messages_and_choices": [{"role": "user", "content": "x"}, choice(&prompt, &good, -3.0)]},
        {"reward": 0.0, "messages_and_choices": [{"role": "user", "content": "x"}, choice(&prompt, &bad, -3.0)]},
    ]}]);
    let config = TrainConfig { learning_rate: 1e-2, ..TrainConfig::default() };
    let mut job = TrainJob {
        job_id: uuid::Uuid::now_v7(),
        model,
        base_step: 0,
        base_checkpoint: None,
        task: TrainTask::Rl { config, inputs: RlInputs::Raw(groups), kl_reference: None },
    };
    let mut sink = Sink::default();
    let out = trainer.train(&job, &mut sink).unwrap();
    assert_eq!(sink.started, Some(1));
    assert_eq!(sink.steps.len(), 1);
    for key in
        ["loss", "grad_norm", "learning_rate", "entropy", "num_trainable_tokens", "tokens_per_second", "step_seconds"]
    {
        assert!(sink.steps[0][key].is_finite(), "{key}");
    }
    assert!(sink.steps[0]["grad_norm"] > 0.0);
    // Save the checkpoint, load it back as the next job would, and as PEFT files.
    let ckpt = dir.path().join("step1");
    std::fs::create_dir_all(&ckpt).unwrap();
    for (name, bytes) in &out.files {
        std::fs::write(ckpt.join(name), bytes).unwrap();
    }
    let trained = adapter::load(&ckpt, &base, 0).unwrap();
    let after = score(&trained);
    assert!(after.0 > before.0, "rewarded completion: {} -> {}", before.0, after.0);
    assert!(after.1 < before.1, "unrewarded completion: {} -> {}", before.1, after.1);
    // The inference side reads the same adapter (PEFT layout, q/k rows converted back).
    let cfg = base.config.clone();
    tandem_model::LoraAdapter::load(&ckpt, &cfg).unwrap();

    // Continuing from the checkpoint: a second job starts where the first ended.
    job.base_checkpoint = Some(ckpt.clone());
    job.base_step = 1;
    let mut sink = Sink::default();
    let out2 = trainer.train(&job, &mut sink).unwrap();
    let ckpt2 = dir.path().join("step2");
    std::fs::create_dir_all(&ckpt2).unwrap();
    for (name, bytes) in &out2.files {
        std::fs::write(ckpt2.join(name), bytes).unwrap();
    }
    let again = score(&adapter::load(&ckpt2, &base, 0).unwrap());
    assert!(again.0 > after.0, "second job continues: {} -> {}", after.0, again.0);

    // A KL-penalised job from step 1 against the base model: the learner's logprobs (step 1)
    // minus the base's, averaged over the six trained tokens, is the reported kl_policy_ref.
    let kl = |reference| {
        let mut j = job.clone();
        j.base_checkpoint = Some(ckpt.clone());
        let (config, kl_reference) = rl(&mut j);
        config.kl_penalty =
            Some(KlPenalty { coef: 0.5, source: KlSource::CurrentLearner, reference: KlReference::Step(0) });
        *kl_reference = Some(reference);
        let mut sink = Sink::default();
        trainer.train(&j, &mut sink).unwrap();
        sink.steps[0]["kl_policy_ref"]
    };
    let want = ((after.0 - before.0) + (after.1 - before.1)) as f64 / 6.0;
    let got = kl(ReferencePolicy::Base);
    assert!((got - want).abs() < 1e-4, "kl_policy_ref {got} vs {want}");
    // Against the checkpoint it starts from, the penalty's mean is 0.
    let same = kl(ReferencePolicy::Checkpoint { step: 1, dir: ckpt.clone() });
    assert!(same.abs() < 1e-5, "{same}");
    assert!(!sink.steps[0].contains_key("kl_policy_ref"), "no penalty, no metric");
}

/// A row run in parts of a few tokens gives the same update as the row at once.
#[test]
fn parts_give_the_same_step_as_the_whole_row() {
    let (_dir, path) = tiny();
    let groups = json!([{"trajectories": [
        {"reward": 1.0, "messages_and_choices": [choice(&[20, 21, 22], &[70, 71], -3.0)]},
        {"reward": 0.2, "messages_and_choices": [choice(&[20, 21, 23], &[90, 91, 92], -2.0)]},
        {"reward": 0.0, "messages_and_choices": [choice(&[24, 21], &[95], -1.0)]},
    ]}]);
    let config = TrainConfig {
        learning_rate: 1e-2,
        importance_sampling_level: ImportanceSamplingLevel::Sequence,
        ..TrainConfig::default()
    };
    let job = rl_job(config, groups, None);
    let run = |part: usize, job: &TrainJob| {
        let t = LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path: path.clone(), tokenizer: Arc::new(Bytes) }])
            .with_part_tokens(part);
        let mut sink = Sink::default();
        let out = t.train(job, &mut sink).unwrap();
        let weights = adapter_weights(&out);
        let kl = sink.steps[0].get("kl_policy_ref").copied().unwrap_or(0.0);
        (weights, sink.steps[0]["loss"], sink.steps[0]["grad_norm"], kl)
    };
    let (whole, parts) = (run(1000, &job), run(4, &job));
    // With a KL penalty, a row in parts takes its mean KL term over the whole row (sampler
    // logprobs against the base's: not zero).
    let mut kl_job = job.clone();
    let (config, kl_reference) = rl(&mut kl_job);
    config.kl_penalty = Some(KlPenalty { coef: 2.0, source: KlSource::Sample, reference: KlReference::Step(0) });
    *kl_reference = Some(ReferencePolicy::Base);
    let (kl_whole, kl_parts) = (run(1000, &kl_job), run(4, &kl_job));
    assert!((kl_whole.1 - kl_parts.1).abs() < 1e-6, "{} vs {}", kl_whole.1, kl_parts.1);
    assert!((kl_whole.3 - kl_parts.3).abs() < 1e-6);
    assert!(kl_whole.3.abs() > 1e-3 && (kl_whole.1 - whole.1).abs() > 1e-6, "the penalty changes the loss");
    assert!(
        (whole.1 - parts.1).abs() < 1e-6 && (whole.2 - parts.2).abs() < 1e-5,
        "{:?} vs {:?}",
        (whole.1, whole.2),
        (parts.1, parts.2)
    );
    assert_same_update(&whole.0, &parts.0, "");
}

/// Prefix trees give the same step as every sequence whole: a group's prompt laid out once
/// with its completions as branches, a history whose shared first turn holds trained tokens of
/// two trajectories (with their own old logprobs and advantages), an additional history under
/// the same prompt, trees split across parts, every loss, sequence-level ratios and a KL
/// penalty from both sources: the same loss, gradient norm and update, while the step runs
/// fewer tokens. Exact (f32 products) to float precision; with the int8 products the server
/// trains with, to their rounding (a shared prefix row's gradient is rounded once as a sum,
/// not once per copy).
#[test]
fn prefix_trees_give_the_same_step_as_unshared_rows() {
    for exact in [true, false] {
        prefix_trees_give_the_same_step(exact);
    }
}

fn prefix_trees_give_the_same_step(exact: bool) {
    let (_dir, path) = tiny();
    let p: Vec<u32> = (20..34).collect();
    let q: Vec<u32> = (40..52).collect();
    let turn: Vec<u32> = vec![70, 71, 72];
    let q2: Vec<u32> = q.iter().chain(&turn).chain(&[53, 54]).copied().collect();
    let groups = json!([
        {"trajectories": [
            {"reward": 1.0, "messages_and_choices": [choice(&p, &[70, 71], -3.0)]},
            {"reward": 0.4, "messages_and_choices": [choice(&p, &[90, 91, 92], -2.0)]},
            {"reward": 0.0, "messages_and_choices": [choice(&p, &[95], -1.0)],
             "additional_histories": [{"messages_and_choices": [choice(&p, &[96, 97], -1.5)]}]},
        ]},
        {"trajectories": [
            {"reward": 1.0, "messages_and_choices": [choice(&q, &turn, -2.5), choice(&q2, &[80, 81], -2.0)]},
            {"reward": 0.0, "messages_and_choices": [choice(&q, &turn, -2.2), choice(&q2, &[82], -1.0)]},
        ]},
    ]);
    let run = |share: bool, part: usize, recompute: usize, config: &TrainConfig| {
        let t = LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path: path.clone(), tokenizer: Arc::new(Bytes) }])
            .with_part_tokens(part)
            .with_recompute_above(recompute)
            .with_prefix_sharing(share)
            .with_exact_base(exact);
        let reference = config.kl_penalty.as_ref().map(|_| ReferencePolicy::Base);
        let job = rl_job(config.clone(), groups.clone(), reference);
        let mut sink = Sink::default();
        let out = t.train(&job, &mut sink).unwrap();
        assert_eq!(sink.steps.len(), 1, "one row either way");
        (adapter_weights(&out), sink.steps.remove(0))
    };
    let kl = |source| Some(KlPenalty { coef: 0.7, source, reference: KlReference::Step(0) });
    // The scoring passes (old logprobs recomputed, the KL penalty's reference and learner
    // terms) run cut trees forward only; their values must match too.
    let configs = [
        (LossKind::Ppo, ImportanceSamplingLevel::Token, None, false),
        (LossKind::Cispo, ImportanceSamplingLevel::Sequence, None, true),
        (LossKind::Ppo, ImportanceSamplingLevel::Sequence, kl(KlSource::Sample), false),
        (LossKind::Cispo, ImportanceSamplingLevel::Average, kl(KlSource::CurrentLearner), true),
    ];
    for (loss, level, kl_penalty, precalculate_logprobs) in configs {
        let config = TrainConfig {
            learning_rate: 1e-2,
            loss,
            importance_sampling_level: level,
            kl_penalty: kl_penalty.clone(),
            precalculate_logprobs,
            ..TrainConfig::default()
        };
        // Parts of 12 cut each tree; recomputing every part and cut prefix in the backward (0)
        // or keeping their graphs (MAX) must give the same step. The unshared rows with graphs
        // kept are the reference for all.
        let (w_flat, flat) = run(false, 1000, usize::MAX, &config);
        for (share, part, recompute) in
            [(true, 1000, usize::MAX), (true, 12, usize::MAX), (true, 12, 0), (false, 12, 0), (true, 1000, 0)]
        {
            let (w_tree, tree) = run(share, part, recompute, &config);
            let what = format!(
                "{loss:?} {level:?} kl {} precalculate {precalculate_logprobs} shared {share} part {part} \
                 recompute {recompute} exact {exact}",
                kl_penalty.is_some()
            );
            // The forward is the same computation either way; the int8 products round a shared
            // prefix row's summed gradient once instead of each copy's: the norms differ by their
            // rounding (up to 1.7e-3 here, where int8 and f32 differ by up to 1.5e-3).
            for key in ["loss", "grad_norm", "entropy", "num_trainable_tokens", "kl_policy_ref", "mean_ratio"] {
                let tol = if key == "grad_norm" && !exact { 5e-3 } else { 1e-5 };
                let (a, b) = (tree.get(key).copied().unwrap_or(0.0), flat.get(key).copied().unwrap_or(0.0));
                assert!((a - b).abs() <= tol * b.abs().max(1e-3), "{what}: {key} {a} vs {b}");
            }
            assert!(tree["grad_norm"] > 0.0, "{what}: something trains");
            // 6 sequences of 16-19 tokens: the two prompts (14 and 12 tokens) once each, also
            // where a tree is cut into parts of 12 (a part per branch).
            if share {
                assert!(
                    tree["num_forward_tokens"] < flat["num_forward_tokens"] - 40.0,
                    "{what}: {} vs {} tokens",
                    tree["num_forward_tokens"],
                    flat["num_forward_tokens"]
                );
            }
            // Adam's first step is about lr x sign(g): entries whose gradient is near zero flip
            // with any rounding, so the update is compared on exact products only.
            if exact {
                assert_same_update(&w_tree, &w_flat, &format!("{what}: "));
            }
        }
    }
}

/// A job whose trajectories were tokenized at creation (what the api stores now) trains exactly
/// as the same job stored raw (what older servers stored, tokenized by the trainer), and the
/// tokenized form survives the store's JSON.
#[test]
fn stored_tokenized_inputs_train_like_raw_ones() {
    let (_dir, path) = tiny();
    let base = Base::load(&path).unwrap();
    let groups = json!([{"trajectories": [
        {"reward": 1.0, "messages_and_choices": [choice(&[20, 21, 22], &[70, 71], -1.0)]},
        {"messages_and_choices": [choice(&[20, 21, 23], &[90, 91, 92], -1.5)]},
    ]}]);
    let model = tiny_model_record();
    let trained = TrainedModel { entity: &model.entity, project: &model.project, name: &model.name };
    let bounds = ModelBounds { vocab: base.config.vocab, context: base.config.context_len };
    let tokenized = tokenize_groups(&groups, &Bytes, &trained, false, bounds).unwrap();
    let stored = RlInputs::from_stored(RlInputs::Tokenized(tokenized).to_stored()).unwrap();
    assert!(matches!(stored, RlInputs::Tokenized(_)));
    let trainer =
        LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path: path.clone(), tokenizer: Arc::new(Bytes) }]);
    let run = |inputs: RlInputs| {
        let task = TrainTask::Rl { config: TrainConfig::default(), inputs, kl_reference: None };
        let job =
            TrainJob { job_id: uuid::Uuid::now_v7(), model: model.clone(), base_step: 0, base_checkpoint: None, task };
        let mut sink = Sink::default();
        let out = trainer.train(&job, &mut sink).unwrap();
        (sink.steps[0]["loss"], out.files)
    };
    let (raw_loss, raw_files) = run(RlInputs::Raw(groups.clone()));
    let (tok_loss, tok_files) = run(stored);
    assert_eq!(raw_loss, tok_loss);
    assert_eq!(raw_files, tok_files);
}

/// With `precalculate_logprobs` the old logprobs are recomputed under the job's starting weights,
/// so the first step's ratios are exactly 1 whatever the sampler reported; without it they are not.
#[test]
fn precalculated_logprobs_start_the_ratio_at_one() {
    let (_dir, path) = tiny();
    let groups = json!([{"trajectories": [
        {"reward": 1.0, "messages_and_choices": [choice(&[20, 21, 22], &[70, 71], -1.0)]},
        {"reward": 0.0, "messages_and_choices": [choice(&[20, 21, 23], &[90, 91, 92], -1.0)]},
    ]}]);
    let run = |precalculate: bool, park: bool| {
        let job = TrainJob {
            job_id: uuid::Uuid::now_v7(),
            model: tiny_model_record(),
            base_step: 0,
            base_checkpoint: None,
            task: TrainTask::Rl {
                config: TrainConfig {
                    precalculate_logprobs: precalculate,
                    truncated_importance_sampling: Some(2.0),
                    ..TrainConfig::default()
                },
                inputs: RlInputs::Raw(groups.clone()),
                kl_reference: None,
            },
        };
        let t = LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path: path.clone(), tokenizer: Arc::new(Bytes) }]);
        let mut sink = if park { Sink::parking(_dir.path()) } else { Sink::default() };
        let out = t.train(&job, &mut sink).unwrap();
        (sink.steps[0]["mean_ratio"], out.files, sink.parks)
    };
    let (ratio, files, _) = run(true, false);
    assert!((ratio - 1.0).abs() < 1e-6);
    // Parked before each precalculated part and before the step: the same adapter, byte for byte.
    let (_, parked_files, parks) = run(true, true);
    assert!(parks >= 2 && parked_files == files, "{parks} parks");
    // The sampler's -1.0 is far from the tiny model's ~ln(1/258): ratios far below 1.
    assert!(run(false, false).0 < 0.5);
}

/// Training computes on threads at a lower CPU priority than inference's.
#[cfg(target_os = "linux")]
#[test]
fn training_threads_run_at_a_lower_priority() {
    let (_dir, path) = tiny();
    let t = LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path, tokenizer: Arc::new(Bytes) }]);
    let nice = t.on_training_threads(|| tandem_model::priority::of_this_thread().unwrap());
    assert_eq!(nice, tandem_train::trainer::TRAIN_NICE);
    assert_eq!(tandem_model::priority::of_this_thread().unwrap(), 0, "the caller keeps its priority");
}

/// Groups without reward variance train nothing: `training_started` with 0 sequences, no step,
/// and the adapter comes back unchanged (the worker still records a new step, as ART's backend).
#[test]
fn zero_variance_jobs_train_nothing() {
    let (dir, path) = tiny();
    let groups = json!([{"trajectories": [
        {"reward": 0.5, "messages_and_choices": [choice(&[20, 21], &[70, 71], -3.0)]},
        {"reward": 0.5, "messages_and_choices": [choice(&[20, 21], &[90], -3.0)]},
    ]}]);
    let job = TrainJob {
        job_id: uuid::Uuid::now_v7(),
        model: tiny_model_record(),
        base_step: 0,
        base_checkpoint: None,
        task: TrainTask::Rl { config: TrainConfig::default(), inputs: RlInputs::Raw(groups), kl_reference: None },
    };
    let t = LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path: path.clone(), tokenizer: Arc::new(Bytes) }]);
    let mut sink = Sink::default();
    let out = t.train(&job, &mut sink).unwrap();
    assert_eq!((sink.started, sink.steps.len()), (Some(0), 0));
    let ckpt = dir.path().join("zero");
    std::fs::create_dir_all(&ckpt).unwrap();
    for (name, bytes) in &out.files {
        std::fs::write(ckpt.join(name), bytes).unwrap();
    }
    let base = Base::load(&path).unwrap();
    let lora = adapter::load(&ckpt, &base, 0).unwrap();
    for layer in &lora.pairs {
        for (_, b) in layer {
            let max = b.as_tensor().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(max, 0.0, "B stays zero: the adapter equals the base model");
        }
    }
}

/// The int8 kernels for the frozen projections (the default with AVX-512 VNNI) give the exact
/// f32 path's logprobs within int8 rounding and gradients pointing the same way.
#[test]
fn int8_projections_track_the_exact_gradient() {
    let (_dir, path) = tiny();
    let exact = Base::load_exact(&path).unwrap();
    let fast = Base::load(&path).unwrap();
    let lora = adapter::init(&exact, 3).unwrap();
    nonzero_b(&lora, 11);
    let r = row(&(10..40).collect::<Vec<_>>(), &(50..70).collect::<Vec<_>>());
    let run = |base: &Base| {
        let out = forward(base, &lora, &r).unwrap();
        let lps = out.logprobs.to_vec1::<f32>().unwrap();
        // A fixed, uneven weighting of the logprobs as the "loss".
        let coef: Vec<f32> = (0..lps.len()).map(|i| if i % 3 == 0 { -1.0 } else { 0.5 }).collect();
        let coef = Tensor::from_vec(coef, lps.len(), &candle_core::Device::Cpu).unwrap();
        let grads = out.logprobs.mul(&coef).unwrap().sum_all().unwrap().backward().unwrap();
        let g: Vec<f32> = lora
            .vars()
            .iter()
            .flat_map(|v| grads.get(v.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect();
        (lps, g)
    };
    let ((lp_e, g_e), (lp_f, g_f)) = (run(&exact), run(&fast));
    // The int8 path computes the served logits (int8 activations through a 64-wide random
    // model, whose rounding is coarser than the real model's): within 0.1 of the exact ones.
    let worst = lp_e.iter().zip(&lp_f).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 0.1, "logprobs differ by up to {worst}");
    let dot: f64 = g_e.iter().zip(&g_f).map(|(a, b)| *a as f64 * *b as f64).sum();
    let norm = |g: &[f32]| g.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let cosine = dot / (norm(&g_e) * norm(&g_f));
    let rel = (norm(&g_f) / norm(&g_e) - 1.0).abs();
    eprintln!("logprobs within {worst}, gradient cosine {cosine:.5}, norm ratio off by {rel:.4}");
    assert!(cosine > 0.99 && rel < 0.05, "cosine {cosine}, norm off by {rel}");
}

/// A chat template over bytes: a user message is [1, content bytes..., 2], an assistant's
/// [3, content bytes..., 2], the generation prompt [3] (append-only, as SFT needs).
struct ByteChat;

impl ChatTokenizer for ByteChat {
    fn render(&self, messages: &[ChatMessage], _t: Option<&Value>, generation: bool) -> Result<Vec<u32>, InputError> {
        let mut out = Vec::new();
        for m in messages {
            out.push(if m.role == "assistant" { 3 } else { 1 });
            out.extend(m.text().bytes().map(u32::from));
            out.push(2);
        }
        if generation {
            out.push(3);
        }
        Ok(out)
    }
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, InputError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn token_id(&self, _bytes: &[u8]) -> Option<u32> {
        None
    }
}

/// An SFT job takes one step per batch, and a second job on the same conversations, continuing
/// from the first one's checkpoint, starts from a lower loss.
#[test]
fn sft_jobs_learn_the_conversations() {
    let (dir, path) = tiny();
    let trainer =
        LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path: path.clone(), tokenizer: Arc::new(ByteChat) }]);
    let rows: Vec<Value> = ["ab", "cd", "ef"]
        .iter()
        .map(|q| json!({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "yes yes"}]}))
        .collect();
    let config = SftConfig {
        batch_size: 2,
        learning_rate: LearningRate::PerBatch(vec![2e-2, 1e-2]),
        assistant_turns: AssistantTurns::All,
        target_training_step: None,
    };
    let mut job = TrainJob {
        job_id: uuid::Uuid::now_v7(),
        model: tiny_model_record(),
        base_step: 0,
        base_checkpoint: None,
        task: TrainTask::Sft { config: config.clone(), rows: rows.clone() },
    };
    let mut sink = Sink::default();
    let out = trainer.train(&job, &mut sink).unwrap();
    assert_eq!(sink.started, Some(2));
    assert_eq!(sink.steps.len(), 2);
    assert_eq!((sink.steps[0]["learning_rate"], sink.steps[1]["learning_rate"]), (2e-2, 1e-2));
    // "yes yes" and the closing 2: 8 trained tokens per conversation.
    assert_eq!((sink.steps[0]["num_trainable_tokens"], sink.steps[1]["num_trainable_tokens"]), (16.0, 8.0));
    let first_loss = sink.steps[0]["loss"];
    assert!(first_loss > 0.0 && sink.steps[0]["grad_norm"] > 0.0);
    let ckpt = dir.path().join("sft1");
    std::fs::create_dir_all(&ckpt).unwrap();
    for (name, bytes) in &out.files {
        std::fs::write(ckpt.join(name), bytes).unwrap();
    }
    job.base_checkpoint = Some(ckpt);
    job.base_step = 1;
    // Parked and read back before each of its steps, the job ends with the same adapter.
    let mut parking = Sink::parking(dir.path());
    let job0 = TrainJob { base_checkpoint: None, base_step: 0, ..job.clone() };
    assert_eq!(trainer.train(&job0, &mut parking).unwrap().files, out.files);
    assert_eq!(parking.parks, 2);
    let mut again = Sink::default();
    trainer.train(&job, &mut again).unwrap();
    assert!(again.steps[0]["loss"] < first_loss, "{} -> {}", first_loss, again.steps[0]["loss"]);

    // A list of rates shorter than the batches is refused, naming the count.
    job.task =
        TrainTask::Sft { config: SftConfig { learning_rate: LearningRate::PerBatch(vec![1e-3]), ..config }, rows };
    let e = trainer.train(&job, &mut Sink::default()).unwrap_err();
    assert!(e.to_string().contains("fewer rates than the 2 batches"), "{e}");
}
