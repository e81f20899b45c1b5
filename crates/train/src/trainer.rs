//! [`LoraTrainer`]: one training job from trajectory groups to adapter files.
//!
//! Take the job's token sequences (tokenized when the job was created), compute group advantages,
//! pack rows, then per row: forward,
//! policy loss and its per-token gradient ([`crate::loss`]), backward through the surrogate
//! `sum(g * new_lp)`, gradient clipping, one AdamW step. The job continues from the model's
//! latest checkpoint, or from a fresh adapter (equal to the base model).

use crate::adamw::AdamParams;
use crate::advantage::group_advantages;
use crate::loss::{behaviour_kl, kl_mean, policy_loss_part, LossConfig, LossOutput, TokenInput};
use crate::net::{Base, Lora};
use crate::pack::{mem_available, pack, part_memory_bytes, row_length, split, Row, TrajectoryInput};
use crate::session::Session;
use crate::tree::{score_parts, units, PartResult};
use crate::{adapter, TrainTokenizer};
use candle_core::backprop::GradStore;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tandem_core::sequences::{fits_model, tokenize_groups, ModelBounds, RlInputs, TrainedModel};
use tandem_core::train_config::{KlSource, TrainConfig};
use tandem_jobs::{ReferencePolicy, TrainError, TrainJob, TrainOutput, TrainSink, TrainTask, Trainer};
use tandem_model::{Llama, Quantize};

/// Most tokens run through forward and backward at once (a row's parts are accumulated): bounds
/// the activation memory of a step. `make bench-rl` (rows of ~2,048 tokens): parts of 1,024
/// peaked at 1,886 MB serving + training, parts of 512 at 1,273 MB, in the same time (9.5-10.1 s
/// for the job, within this VM's noise): the GEMMs are as efficient at 512 rows.
const PART_TOKENS: usize = 512;

/// ART's optimizer settings (contract §3).
pub(crate) const BETAS: (f64, f64) = (0.9, 0.99);
const WEIGHT_DECAY: f64 = 0.1;
const MAX_GRAD_NORM: f64 = 0.1;
/// The seed of a fresh adapter's A matrices (ART's `random_state`).
pub(crate) const INIT_SEED: u64 = 3407;

/// One base model the trainer can train: its GGUF and its tokenizer/template.
pub struct TrainBase {
    pub id: String,
    pub path: PathBuf,
    pub tokenizer: Arc<dyn TrainTokenizer>,
}

/// Trains LoRA adapters for the served base models. The frozen base is the engine's own model
/// when one was handed over ([`LoraTrainer::with_served`]), else loaded on first use and kept.
pub struct LoraTrainer {
    bases: Vec<TrainBase>,
    /// The engine's models by base id: the trainer reads their matrices in place.
    served: BTreeMap<String, Arc<Llama>>,
    loaded: Mutex<BTreeMap<String, Arc<Base>>>,
    pub(crate) part_tokens: usize,
    /// A part, or a cut tree's prefix, longer than this many tokens is recomputed layer by
    /// layer in its backward instead of keeping its graph ([`crate::recompute`]); `None`: half
    /// a part.
    recompute_tokens: Option<usize>,
    /// Lay sequences that share a prefix out as prefix trees ([`crate::pack::lay_out`]); off
    /// only to measure and test against the unshared rows.
    pub(crate) share_prefixes: bool,
    /// Load bases with f32 products everywhere ([`Base::load_exact`]): for tests that compare
    /// two computations to float precision (the int8 products round each call's activations
    /// and gradients, so sums taken in another order differ by their rounding).
    exact: bool,
    /// The server's `--quantize`: the frozen products load the matrices in the formats the
    /// engine serves them in, so that agreement holds under any setting.
    quantize: Quantize,
    pool: rayon::ThreadPool,
}

/// The niceness of training threads. Inference and training share the machine's cores; at equal
/// priority a job slowed single-stream decoding to 0.31x, at nice 10 to 0.52x, at nice 19 to
/// 0.86x (measured with bench/training_interference.py): the kernel's scheduler then gives the
/// engine's threads the CPU whenever they want it, and training everything else.
pub const TRAIN_NICE: i32 = 19;

/// The trainer's compute threads (candle's GEMMs and parallel ops run on the current rayon pool).
fn training_pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("tandem-train-{i}"))
        .start_handler(|_| lower_priority())
        .build()
        .unwrap_or_else(|_| rayon::ThreadPoolBuilder::new().build().expect("a thread pool"))
}

fn lower_priority() {
    if let Err(e) = tandem_model::priority::set_this_thread(TRAIN_NICE) {
        tracing::warn!(error = %e, "could not lower the priority of a training thread");
    }
}

impl LoraTrainer {
    pub fn new(bases: Vec<TrainBase>) -> Self {
        LoraTrainer {
            bases,
            served: BTreeMap::new(),
            loaded: Mutex::new(BTreeMap::new()),
            part_tokens: PART_TOKENS,
            recompute_tokens: None,
            share_prefixes: true,
            exact: false,
            quantize: Quantize::default(),
            pool: training_pool(),
        }
    }

    /// Hands the memory freed by a job back to the system, from every training thread as well
    /// as this one: the allocator keeps a thread's freed pages with that thread (for a minute,
    /// `tandem_model::allocator`), so collecting on the calling thread alone left most of a
    /// job's activations in the process (measured: a server's RSS between RL jobs rose from
    /// ~700 MB to ~1,200 MB over three runs).
    pub fn release_freed_memory(&self) {
        self.pool.broadcast(|_| tandem_model::allocator::release_freed_memory());
        tandem_model::allocator::release_freed_memory();
    }

    /// Runs `f` on the trainer's low-priority threads.
    pub fn on_training_threads<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Processes rows in parts of at most `n` tokens (tests use tiny parts).
    pub fn with_part_tokens(mut self, n: usize) -> Self {
        self.part_tokens = n.max(1);
        self
    }

    /// Recomputes a part or a cut tree's prefix longer than `n` tokens in its backward (tests
    /// use 0 to take that path everywhere, `usize::MAX` to never take it).
    pub fn with_recompute_above(mut self, n: usize) -> Self {
        self.recompute_tokens = Some(n);
        self
    }

    /// How long a part or a cut tree's prefix may be before its activations are recomputed
    /// rather than kept: by default half a part (measured on SmolLM2: a job at ~1/2-1/5 of the
    /// memory, ~20% slower; docs/benchmarks.md, session 26).
    pub(crate) fn recompute_above(&self) -> usize {
        self.recompute_tokens.unwrap_or(self.part_tokens / 2)
    }

    /// Trains shared prefixes once (the default) or once per sequence.
    pub fn with_prefix_sharing(mut self, share: bool) -> Self {
        self.share_prefixes = share;
        self
    }

    /// Trains base `id` on `model`, the engine's own copy of it: no second copy of the weights,
    /// and the forward computes on the very matrices the sampler reads (issue 52).
    pub fn with_served(mut self, id: &str, model: Arc<Llama>) -> Self {
        self.served.insert(id.to_string(), model);
        self
    }

    /// Loads bases in the formats a server run with `--quantize q` serves them in.
    pub fn with_quantize(mut self, q: Quantize) -> Self {
        self.quantize = q;
        self
    }

    /// Trains on f32 products everywhere (slower; exact gradients).
    pub fn with_exact_base(mut self, exact: bool) -> Self {
        self.exact = exact;
        self
    }

    pub(crate) fn base(&self, id: &str) -> Result<(Arc<Base>, &TrainBase), TrainError> {
        let tb = self
            .bases
            .iter()
            .find(|b| b.id == id)
            .ok_or_else(|| TrainError::Invalid(format!("base model {id:?} is not served by this server")))?;
        let mut loaded = self.loaded.lock().map_err(|_| TrainError::Failed("trainer state poisoned".into()))?;
        if let Some(b) = loaded.get(id) {
            return Ok((b.clone(), tb));
        }
        let b = match self.served.get(id) {
            _ if self.exact => Base::load_exact(&tb.path),
            Some(model) => Base::shared(model.clone()),
            None => Base::load_served(&tb.path, self.quantize),
        };
        let b = Arc::new(b.map_err(|e| TrainError::Failed(format!("loading the base model: {e}")))?);
        loaded.insert(id.to_string(), b.clone());
        Ok((b, tb))
    }
}

/// The job's trajectories with their group advantages. Inputs stored raw (a job from before
/// tokenization at creation) are tokenized here with the base's tokenizer, as they were then.
fn prepare(
    job: &TrainJob,
    config: &TrainConfig,
    inputs: &RlInputs,
    tok: &dyn TrainTokenizer,
    bounds: ModelBounds,
) -> Result<(Vec<TrajectoryInput>, Map<String, Value>), TrainError> {
    let tokenized;
    let groups = match inputs {
        RlInputs::Tokenized(t) => t,
        RlInputs::Raw(raw) => {
            let model = TrainedModel { entity: &job.model.entity, project: &job.model.project, name: &job.model.name };
            tokenized = tokenize_groups(raw, tok, &model, config.allow_training_without_logprobs, bounds).map_err(
                |errors| TrainError::Invalid(errors.into_iter().map(|e| e.message).collect::<Vec<_>>().join("; ")),
            )?;
            &tokenized
        }
    };
    let mut out = Vec::new();
    let (mut n_traj, mut trainable_groups) = (0usize, 0usize);
    for group in &groups.groups {
        let rewards: Vec<f64> = group.trajectories.iter().map(|t| t.reward).collect();
        let adv = group_advantages(&rewards, config.scale_rewards);
        n_traj += rewards.len();
        if adv.iter().any(|a| *a != 0.0) {
            trainable_groups += 1;
        }
        for (traj, a) in group.trajectories.iter().zip(adv) {
            out.push(TrajectoryInput { advantage: a, sequences: traj.sequences.clone() });
        }
    }
    let mut extra = Map::new();
    extra.insert("num_groups".into(), json!(groups.groups.len()));
    extra.insert("num_groups_trainable".into(), json!(trainable_groups));
    extra.insert("num_trajectories".into(), json!(n_traj));
    Ok((out, extra))
}

pub(crate) fn failed(e: candle_core::Error) -> TrainError {
    TrainError::Failed(e.to_string())
}

/// Adds a part's gradients into the row's (a row's gradient is the sum of its parts').
pub(crate) fn accumulate(grads: &mut GradStore, part: &GradStore, vars: &[candle_core::Var]) -> Result<(), TrainError> {
    for v in vars {
        if let Some(g) = part.get(v.as_tensor()) {
            let sum = match grads.remove(v.as_tensor()) {
                Some(sum) => sum.add(g).map_err(failed)?,
                None => g.clone(),
            };
            grads.insert(v.as_tensor(), sum);
        }
    }
    Ok(())
}

/// Scales the gradients so their global L2 norm is at most `max` (PyTorch's
/// `clip_grad_norm_`); returns the norm before clipping.
pub fn clip(grads: &mut GradStore, vars: &[candle_core::Var], max: f64) -> Result<f64, candle_core::Error> {
    let mut sq = 0.0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
    }
    let norm = sq.sqrt();
    let coef = max / (norm + 1e-6);
    if coef < 1.0 {
        for v in vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(v.as_tensor(), (g * coef)?);
            }
        }
    }
    Ok(norm)
}

/// Stops a job whose numbers stopped being finite (a learning rate too large for its data, a
/// loss that overflowed) before the optimizer applies them: such a checkpoint would serve NaN.
/// The job ends with `training_failed` and no checkpoint is written.
pub(crate) fn ensure_finite(step: usize, values: &[(&str, f64)]) -> Result<(), TrainError> {
    match values.iter().find(|(_, v)| !v.is_finite()) {
        Some((name, v)) => Err(TrainError::Failed(format!(
            "training diverged: {name} is {v} at gradient step {}; no checkpoint was written (try a lower \
             learning rate)",
            step + 1
        ))),
        None => Ok(()),
    }
}

/// The adapter about to be saved holds only finite numbers (a sum is NaN or infinite otherwise).
pub(crate) fn ensure_finite_weights(vars: &[candle_core::Var]) -> Result<(), TrainError> {
    for v in vars {
        let sum = v.as_tensor().sum_all().and_then(|s| s.to_scalar::<f32>()).map_err(failed)?;
        if !sum.is_finite() {
            return Err(TrainError::Failed(
                "training diverged: the trained adapter's weights are not finite; no checkpoint was written \
                 (try a lower learning rate)"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// Refuses a job whose largest part would need more memory than the system has available (a
/// job killed for memory would take the server with it, and be retried at every restart).
pub(crate) fn check_memory<'a>(base: &Base, parts: impl Iterator<Item = &'a Row>) -> Result<(), TrainError> {
    let c = &base.config;
    let Some((need, part)) = parts
        .map(|p| (part_memory_bytes(p, c.n_layer, c.hidden, c.ffn, rayon::current_num_threads()), p))
        .max_by_key(|(n, _)| *n)
    else {
        return Ok(());
    };
    let Some(available) = std::fs::read_to_string("/proc/meminfo").ok().as_deref().and_then(mem_available) else {
        return Ok(());
    };
    if need > available {
        let longest = (0..part.segments.len()).map(|s| part.offset(s) + part.segments[s].1).max().unwrap_or(0);
        let gb = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(TrainError::Invalid(format!(
            "training this job needs about {:.1} GiB at once (a part of {} tokens, its longest sequence {} tokens) and {:.1} GiB are available; send shorter sequences",
            gb(need),
            part.tokens.len(),
            longest,
            gb(available)
        )));
    }
    Ok(())
}

/// A part's trained tokens as the loss sees them, with their new logprobs.
fn token_inputs(part: &Row, new_lp: &[f32]) -> Vec<TokenInput> {
    part.targets
        .iter()
        .zip(new_lp)
        .map(|(t, lp)| TokenInput {
            new_lp: *lp as f64,
            old_lp: t.old_lp,
            original_lp: t.original_lp,
            advantage: t.advantage,
            weight: t.weight,
            segment: t.segment,
            ref_lp: t.ref_lp,
        })
        .collect()
}

/// What a part's loss gave, beside its gradient.
struct PartLoss {
    loss: LossOutput,
    /// The KL penalty's row mean used.
    kl: Option<f64>,
    /// Sum and count of the k3 estimate of KL(sampler || learner) over tokens with logprobs.
    behaviour_kl: (f64, usize),
}

/// The mean KL term of a row of several parts, before its step: the learner's logprobs are
/// computed first where the source needs them (a row of one part gets them from its forward).
fn row_kl_mean(base: &Base, lora: &Lora, parts: &[Row], cfg: &LossConfig) -> Result<Option<f64>, TrainError> {
    let Some((_, source)) = cfg.kl else { return Ok(None) };
    if parts.len() < 2 {
        return Ok(None);
    }
    // The sampler's logprobs are the source where they are known: no learner pass unless one
    // is missing (it would be a whole forward per step, for nothing).
    let targets = || parts.iter().flat_map(|p| &p.targets);
    if matches!(source, KlSource::Sample) && targets().all(|t| t.old_lp.is_finite()) {
        let all: Vec<TokenInput> =
            parts.iter().flat_map(|p| token_inputs(p, &vec![f32::NAN; p.targets.len()])).collect();
        return Ok(Some(kl_mean(&all, source)));
    }
    let mut all = Vec::new();
    for (part, lps) in parts.iter().zip(score_parts(base, lora, parts)?) {
        all.extend(token_inputs(part, &lps));
    }
    Ok(Some(kl_mean(&all, source)))
}

/// Fills every target's `ref_lp` with the reference policy's logprob (the KL penalty).
fn reference_logprobs(
    base: &Base,
    reference: &ReferencePolicy,
    parts: &mut [Vec<Row>],
    pool: &LoraTrainer,
    sink: &mut dyn TrainSink,
) -> Result<(), TrainError> {
    let lora = match reference {
        ReferencePolicy::Base => adapter::init(base, INIT_SEED).map_err(failed)?,
        ReferencePolicy::Checkpoint { dir, .. } => adapter::load(dir, base, INIT_SEED).map_err(TrainError::Failed)?,
    };
    for row in parts.iter_mut() {
        for unit in units(row) {
            if let Some(stop) = sink.should_stop() {
                return Err(stop);
            }
            let unit = &mut row[unit];
            let lps = pool.on_training_threads(|| score_parts(base, &lora, unit))?;
            for (part, lps) in unit.iter_mut().zip(lps) {
                for (t, lp) in part.targets.iter_mut().zip(lps) {
                    t.ref_lp = f64::from(lp);
                }
            }
        }
    }
    Ok(())
}

/// A row's metrics, summed over its parts.
#[derive(Default)]
struct StepTotals {
    loss: f64,
    kl_policy_ref: Option<f64>,
    behaviour_kl: (f64, usize),
    clip_low: f64,
    clip_high: f64,
    ratio: f64,
    entropy: f64,
    tokens: usize,
}

impl StepTotals {
    fn add(&mut self, r: &PartResult<PartLoss>) {
        let (p, entropy, tokens) = (&r.extra, &r.entropy, r.tokens);
        let l = &p.loss;
        let n = l.grad.len() as f64;
        self.kl_policy_ref = p.kl.or(self.kl_policy_ref);
        self.behaviour_kl.0 += p.behaviour_kl.0;
        self.behaviour_kl.1 += p.behaviour_kl.1;
        self.loss += l.loss;
        self.clip_low += l.clip_low * n;
        self.clip_high += l.clip_high * n;
        self.ratio += l.mean_ratio * n;
        self.entropy += entropy.iter().map(|e| *e as f64).sum::<f64>();
        self.tokens += tokens;
    }

    fn metrics(&self, trained: usize, grad_norm: f64, lr: f64, secs: f64) -> BTreeMap<String, f64> {
        let n = trained.max(1) as f64;
        let mut m = BTreeMap::from([
            ("loss".to_string(), self.loss),
            ("policy_loss".to_string(), self.loss),
            ("grad_norm".to_string(), grad_norm),
            ("learning_rate".to_string(), lr),
            ("entropy".to_string(), self.entropy / n),
            ("num_trainable_tokens".to_string(), trained as f64),
            ("clip_fraction_low".to_string(), self.clip_low / n),
            ("clip_fraction_high".to_string(), self.clip_high / n),
            ("clip_fraction".to_string(), (self.clip_low + self.clip_high) / n),
            ("mean_ratio".to_string(), if trained == 0 { 1.0 } else { self.ratio / n }),
            ("tokens_per_second".to_string(), self.tokens as f64 / secs.max(1e-9)),
            // Tokens the step's forward ran (a shared prefix once per part).
            ("num_forward_tokens".to_string(), self.tokens as f64),
            ("step_seconds".to_string(), secs),
        ]);
        if self.behaviour_kl.1 > 0 {
            m.insert("kl_div".to_string(), self.behaviour_kl.0 / self.behaviour_kl.1 as f64);
        }
        if let Some(kl) = self.kl_policy_ref {
            m.insert("kl_policy_ref".to_string(), kl);
        }
        m
    }
}

impl Trainer for LoraTrainer {
    fn train(&self, job: &TrainJob, sink: &mut dyn TrainSink) -> Result<TrainOutput, TrainError> {
        let result = match &job.task {
            TrainTask::Rl { config, inputs, kl_reference } => {
                self.train_rl(job, config, inputs, kl_reference.as_ref(), sink)
            }
            TrainTask::Sft { config, rows } => crate::sft::train_sft(self, job, config, rows, sink),
        };
        // The job's activations are freed: hand them back now, not a purge delay from now.
        self.release_freed_memory();
        result
    }
}

impl LoraTrainer {
    fn train_rl(
        &self,
        job: &TrainJob,
        config: &TrainConfig,
        inputs: &RlInputs,
        kl_reference: Option<&ReferencePolicy>,
        sink: &mut dyn TrainSink,
    ) -> Result<TrainOutput, TrainError> {
        let (base, tb) = self.base(&job.model.base_model)?;
        let bounds = ModelBounds { vocab: base.config.vocab, context: base.config.context_len };
        let (trajs, mut extra) = prepare(job, config, inputs, tb.tokenizer.as_ref(), bounds)?;
        // Checked when the job was tokenized too; stored inputs are the store's to keep, and the
        // trainer must never index past the embeddings or positions whatever they hold.
        for (i, t) in trajs.iter().enumerate() {
            fits_model(&t.sequences, base.config.vocab, base.config.context_len, &format!("trajectory {i}"))
                .map_err(TrainError::Invalid)?;
        }
        let longest = trajs.iter().flat_map(|t| t.sequences.iter().map(|s| s.tokens.len())).max().unwrap_or(0);
        let row_len = row_length(longest, config.packed_sequence_length, base.config.context_len);
        let rows = pack(&trajs, row_len, config.advantage_balance, self.share_prefixes).map_err(TrainError::Invalid)?;
        let lora = match &job.base_checkpoint {
            Some(dir) => adapter::load(dir, &base, INIT_SEED).map_err(TrainError::Failed)?,
            None => adapter::init(&base, INIT_SEED).map_err(failed)?,
        };
        let params = AdamParams {
            lr: config.learning_rate,
            beta1: BETAS.0,
            beta2: BETAS.1,
            eps: 1e-8,
            weight_decay: WEIGHT_DECAY,
        };
        // The job is a program over a training session: the adapter and optimizer live in it
        // between steps, or parked in a file while other entities' jobs have the trainer's
        // memory (`held.rs`).
        let mut session = Session::over(base.clone(), &job.model.base_model, lora, params)?;
        let trainable: usize = rows.iter().map(|r| r.targets.len()).sum();
        extra.insert("num_trainable_tokens".into(), json!(trainable));
        // Rows are processed in parts of whole sequences so that memory is bounded by the part
        // (the loss of a row is the sum of its parts' shares, see `loss::policy_loss_part`).
        let mut parts: Vec<Vec<Row>> = rows.iter().map(|r| split(r, self.part_tokens)).collect();
        check_memory(&base, parts.iter().flatten())?;
        sink.started(rows.len() as u64, extra);
        // With precalculate_logprobs the ratio is taken against the weights at the start of this
        // job; the sampler's logprobs stay as the originals for truncated importance sampling.
        if config.precalculate_logprobs {
            for row in parts.iter_mut() {
                for unit in units(row) {
                    // Long preparations have step boundaries too: another entity's job may run.
                    if let Some(stop) = sink.boundary(session.held_mut()) {
                        return Err(stop);
                    }
                    let lora = session.lora()?;
                    let unit = &mut row[unit];
                    let lps = self.on_training_threads(|| score_parts(&base, lora, unit))?;
                    for (part, lps) in unit.iter_mut().zip(lps) {
                        for (t, lp) in part.targets.iter_mut().zip(lps) {
                            t.original_lp = t.old_lp;
                            t.old_lp = f64::from(lp);
                        }
                    }
                }
            }
        }

        if let Some(reference) = kl_reference {
            reference_logprobs(&base, reference, &mut parts, self, sink)?;
        }

        let loss_cfg = LossConfig::from_train(config);
        let mut summary: BTreeMap<String, f64> = BTreeMap::new();
        let n_rows = rows.len();
        for (step_index, (row, parts)) in rows.iter().zip(&parts).enumerate() {
            if let Some(stop) = sink.boundary(session.held_mut()) {
                return Err(stop);
            }
            // Nothing of the state outlives the step: a parked job's memory is free.
            let started = Instant::now();
            let row_targets = row.targets.len();
            let mut step = StepTotals::default();
            let lora = session.lora()?;
            let row_kl = self.on_training_threads(|| row_kl_mean(&base, lora, parts, &loss_cfg))?;
            // Each part's loss share: a row of one part takes the KL term's mean from its own
            // forward.
            let mut part_loss = |k: usize, lps: &[f32]| {
                let inputs = token_inputs(&parts[k], lps);
                let kl = loss_cfg.kl.map(|(_, source)| row_kl.unwrap_or_else(|| kl_mean(&inputs, source)));
                let loss = policy_loss_part(&inputs, &loss_cfg, row_targets, kl.unwrap_or(0.0));
                Ok((loss.grad.clone(), PartLoss { loss, kl, behaviour_kl: behaviour_kl(&inputs) }))
            };
            // The row's gradient: the sum of its parts'.
            let results = session.run(self, parts, true, &mut part_loss)?;
            for r in &results {
                step.add(r);
            }
            let lr = config.learning_rate
                * (row.trajectories.max(1) as f64).powf(config.num_trajectories_learning_rate_multiplier_power);
            let grad_norm = session.step(self, AdamParams { lr, ..params }, MAX_GRAD_NORM, |norm| {
                ensure_finite(step_index, &[("the gradient norm", norm), ("the learning rate", lr)])
            })?;
            let secs = started.elapsed().as_secs_f64();
            let metrics = step.metrics(row_targets, grad_norm, lr, secs);
            for (k, v) in &metrics {
                *summary.entry(k.clone()).or_default() += v / n_rows as f64;
            }
            sink.gradient_step(metrics);
        }
        let files = session.adapter_files()?;
        summary.insert("num_gradient_steps".into(), n_rows as f64);
        Ok(TrainOutput { files, metrics: summary })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_finite_number_stops_the_job_and_names_itself() {
        assert!(ensure_finite(0, &[("the loss", 1.5), ("the learning rate", 1e-3)]).is_ok());
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let Err(TrainError::Failed(m)) = ensure_finite(2, &[("the loss", 1.0), ("the learning rate", bad)]) else {
                panic!("{bad} passed")
            };
            assert!(m.contains("the learning rate") && m.contains("gradient step 3"), "{m}");
        }
        let dev = candle_core::Device::Cpu;
        let ok = candle_core::Var::from_vec(vec![1f32, -2.0], 2, &dev).unwrap();
        assert!(ensure_finite_weights(std::slice::from_ref(&ok)).is_ok());
        let nan = candle_core::Var::from_vec(vec![1f32, f32::NAN], 2, &dev).unwrap();
        assert!(matches!(ensure_finite_weights(&[ok, nan]), Err(TrainError::Failed(_))));
    }
}
