//! A training session: a LoRA adapter and its optimizer held between calls, gradients summed
//! over `forward_backward` calls until `optim_step` (the Tinker training model, issue 33).
//! It is the one way anything trains: the `/v1/preview` RL and SFT jobs are short programs over
//! a session too (rows laid out and each one [`Session::run`] then [`Session::step`]), so the
//! forward and backward, gradient accumulation, clipping, AdamW and parking are this module's.
//!
//! Each datum is one sequence whose position `i` predicts `targets[i]`; the targets must be the
//! input shifted by one (the next token at every position, as every SDK recipe builds them),
//! so a datum is the row `tokens ++ [last target]` with one trained token per position. Its
//! loss is [`crate::token_loss`]'s, summed over tokens and datums, and its gradient goes
//! through the network as in the job trainer (`sum(g * new_lp)`).

use crate::adamw::AdamParams;
use crate::held::{Held, Live};
use crate::net::{Base, Lora};
use crate::pack::{lay_out, split, Row, Target};
use crate::token_loss::{check_inputs, datum_loss, trains, DatumInputs, TokenLoss};
use crate::trainer::{accumulate, check_memory, clip, ensure_finite_weights, failed, INIT_SEED};
use crate::tree::{run_parts, GradOf, PartResult};
use crate::{adapter, LoraTrainer};
use candle_core::backprop::GradStore;
use candle_core::Var;
use std::sync::Arc;
use tandem_core::tinker::{Datum, Modules};
use tandem_jobs::TrainError;
use tandem_model::allocator::KeepFreed;
use tandem_model::peft::AdapterConfig;

/// The optimizer's settings before the first `optim_step`, which brings the call's own (these
/// are Tinker's defaults; they only size the moments).
const UNSET: AdamParams = AdamParams { lr: 0.0, beta1: 0.9, beta2: 0.95, eps: 1e-12, weight_decay: 0.0 };

/// One `optim_step`: AdamW's settings for this step, and global-norm clipping (0: none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    pub params: AdamParams,
    pub grad_clip_norm: f64,
}

/// What `forward_backward` (or `forward`) gives: each datum's target logprobs and the loss.
#[derive(Debug, Clone, PartialEq)]
pub struct Forwarded {
    pub logprobs: Vec<Vec<f32>>,
    pub loss: f64,
}

pub struct Session {
    base: Arc<Base>,
    /// The served base model's id, as the adapter's files name it.
    base_id: String,
    held: Held,
    /// Gradients summed since the last `optim_step`.
    grads: Option<GradStore>,
    /// The projections it trains (the others get no gradient and no step).
    modules: Modules,
    /// Freed activations stay with the allocator for a minute while a session lives: each step
    /// would fault its gigabytes in afresh otherwise (`tandem_model::allocator`).
    _keep: KeepFreed,
}

impl Session {
    /// A fresh adapter of `rank` with scale `alpha / rank` on the base model `base_id`.
    pub fn create(
        trainer: &LoraTrainer,
        base_id: &str,
        rank: usize,
        alpha: f64,
        seed: Option<u64>,
    ) -> Result<Self, TrainError> {
        if !(1..=256).contains(&rank) {
            return Err(TrainError::Invalid(format!("lora rank {rank}: expected 1 to 256")));
        }
        let (base, _) = trainer.base(base_id)?;
        let config = AdapterConfig { r: rank, lora_alpha: Some(alpha), use_rslora: false };
        let lora = adapter::init_with(&base, config, seed.unwrap_or(INIT_SEED)).map_err(failed)?;
        Session::over(base, base_id, lora, UNSET)
    }

    /// A session over an adapter a job loaded or initialised, with AdamW `params` (a job's
    /// constant settings; each [`Session::step`] may change the learning rate).
    pub fn over(base: Arc<Base>, base_id: &str, lora: Lora, params: AdamParams) -> Result<Self, TrainError> {
        let held = Held::new(lora, params).map_err(failed)?;
        Ok(Session {
            base,
            base_id: base_id.to_string(),
            held,
            grads: None,
            modules: Modules::ALL,
            _keep: KeepFreed::begin(),
        })
    }

    /// The adapter and optimizer, for a job to park between steps (`TrainSink::boundary`) while
    /// other entities' work has the trainer's memory. Never with gradients pending.
    pub fn held_mut(&mut self) -> &mut Held {
        debug_assert!(self.grads.is_none(), "parked with gradients pending");
        &mut self.held
    }

    /// Bytes the adapter, its AdamW moments and the pending gradients hold in memory (0 while
    /// parked): what a held Tinker model costs the trainer's memory budget.
    pub fn live_bytes(&mut self) -> u64 {
        let Ok(live) = self.held.live() else { return 0 };
        let params: usize = live.lora.vars().iter().map(|v| v.elem_count()).sum();
        // f32 weights and two f32 moments, and a gradient of each while one is pending.
        params as u64 * 4 * (3 + u64::from(self.grads.is_some()))
    }

    /// Parks the adapter and moments in a file at `path` (a Tinker model another's call needs the
    /// memory of); false, nothing done, while gradients are pending (a step in progress).
    pub fn park(&mut self, path: &std::path::Path) -> Result<bool, TrainError> {
        if self.grads.is_some() || self.held.is_parked() {
            return Ok(false);
        }
        tandem_jobs::Park::park(&mut self.held, path).map_err(TrainError::Failed)?;
        Ok(true)
    }

    /// Reads a parked adapter and moments back (nothing to do when live).
    pub fn unpark(&mut self) -> Result<(), TrainError> {
        tandem_jobs::Park::unpark(&mut self.held).map_err(TrainError::Failed)
    }

    pub fn is_parked(&self) -> bool {
        self.held.is_parked()
    }

    /// The live adapter (a job's scoring passes and KL terms run it forward).
    pub fn lora(&mut self) -> Result<&Lora, TrainError> {
        Ok(&self.held.live()?.lora)
    }

    /// Runs laid-out `parts` forward and, with `backward`, adds their gradients (of the modules
    /// it trains) to the pending ones; `grad_of` gives each part's loss gradient per target
    /// and what the caller keeps of it.
    pub fn run<T: Send, F>(
        &mut self,
        trainer: &LoraTrainer,
        parts: &[Row],
        backward: bool,
        grad_of: &mut F,
    ) -> Result<Vec<PartResult<T>>, TrainError>
    where
        F: FnMut(usize, &[f32]) -> Result<(Vec<f64>, T), TrainError> + Send,
    {
        let base = &self.base;
        let Live { lora, .. } = self.held.live()?;
        let mut grads = GradStore::default();
        let results = trainer.on_training_threads(|| {
            let grad_of: &mut GradOf<'_, T> = grad_of;
            run_parts(base, lora, parts, backward, trainer.recompute_above(), &mut grads, grad_of)
        })?;
        if backward {
            let vars = Session::vars_of(lora, self.modules);
            accumulate(self.grads.get_or_insert_with(GradStore::default), &grads, &vars)?;
        }
        Ok(results)
    }

    /// Drops the pending gradients (a call whose loss was not finite).
    pub fn drop_gradients(&mut self) {
        self.grads = None;
    }

    /// Clips the pending gradients to a global norm of `max_norm` (infinite: no clipping),
    /// lets `check` refuse the norm before anything moves, then takes one AdamW step with
    /// `params` and clears them. The norm before clipping; 0 when nothing is pending (nothing
    /// moves, as in PyTorch).
    pub fn step(
        &mut self,
        trainer: &LoraTrainer,
        params: AdamParams,
        max_norm: f64,
        check: impl FnOnce(f64) -> Result<(), TrainError>,
    ) -> Result<f64, TrainError> {
        let Some(mut grads) = self.grads.take() else { return Ok(0.0) };
        let modules = self.modules;
        let Live { lora, opt } = self.held.live()?;
        let vars = Session::vars_of(lora, modules);
        let norm = trainer.on_training_threads(|| clip(&mut grads, &vars, max_norm)).map_err(failed)?;
        check(norm)?;
        opt.params = params;
        trainer.on_training_threads(|| opt.step(&grads)).map_err(failed)?;
        Ok(norm)
    }

    /// What it trains.
    pub fn modules(&self) -> Modules {
        self.modules
    }

    /// Trains only `modules` (before any step: a fresh session); with `unembed`, the output head
    /// gets a fresh pair (seeded by `seed`) and its AdamW moments.
    pub fn training(mut self, modules: Modules, seed: Option<u64>) -> Result<Self, TrainError> {
        if !modules.any() {
            return Err(TrainError::Invalid(
                "train_attn, train_mlp and train_unembed are all false: nothing would train".into(),
            ));
        }
        if modules.unembed {
            let live = self.held.live()?;
            if live.lora.head.is_none() {
                let params = live.opt.params;
                let mut lora = self.held.take_lora().ok_or_else(|| TrainError::Failed("no adapter".into()))?;
                lora.head =
                    Some(adapter::fresh_head(&self.base, lora.rank(), seed.unwrap_or(INIT_SEED)).map_err(failed)?);
                self.held = Held::new(lora, params).map_err(failed)?;
            }
        }
        self.modules = modules;
        Ok(self)
    }

    /// The adapter's vars of what `m` trains.
    fn vars_of(lora: &Lora, m: Modules) -> Vec<Var> {
        let pairs = lora.pairs.iter().flat_map(|l| l.iter().enumerate().filter(move |(i, _)| m.trains(*i)));
        let head = lora.head.iter().filter(|_| m.unembed);
        pairs.map(|(_, p)| p).chain(head).flat_map(|(a, b)| [a.clone(), b.clone()]).collect()
    }

    /// No gradient is pending (a session is never parked, but the tests read what a refused
    /// call left behind through this).
    #[cfg(test)]
    fn can_park(&self) -> bool {
        self.grads.is_none()
    }

    /// Runs `data` forward (and, with `backward`, adds its gradients to the pending ones). The
    /// datums are laid out as one row, those that share a prefix (a group's prompt) as prefix
    /// trees, and run in parts of up to the trainer's part size (a longer datum is a part of its
    /// own; a tree's prefix runs once): each datum's logprobs and loss are what it gives alone.
    pub fn forward_backward(
        &mut self,
        trainer: &LoraTrainer,
        data: &[Datum],
        loss: TokenLoss,
        backward: bool,
    ) -> Result<Forwarded, TrainError> {
        self.forward_backward_sliced(trainer, data, loss, backward, &mut || {})
    }

    /// [`Self::forward_backward`] in slices at part boundaries (a part is a micro-batch; the
    /// parts of one cut tree stay together), calling `between` after each slice but the last:
    /// the trainer's turn passes there, so another entity's call waits one slice, not this whole
    /// call. Gradients join the pending ones only once every slice has run.
    pub fn forward_backward_sliced(
        &mut self,
        trainer: &LoraTrainer,
        data: &[Datum],
        loss: TokenLoss,
        backward: bool,
        between: &mut dyn FnMut(),
    ) -> Result<Forwarded, TrainError> {
        let datums: Vec<(Vec<u32>, DatumInputs)> =
            data.iter().enumerate().map(|(i, d)| self.datum(i, d, loss)).collect::<Result<_, _>>()?;
        let seqs: Vec<&[u32]> = datums.iter().map(|(t, _)| t.as_slice()).collect();
        // Position i of datum d scores `targets[i]`; where that is not the next input token, the
        // target names its token (the row holds the inputs and the last target).
        let (rows, placements) = lay_out(&seqs, usize::MAX, trainer.share_prefixes)
            .map_err(|i| TrainError::Failed(format!("datum {i} does not fit a row")))?;
        let mut row = rows.into_iter().next().unwrap_or_default();
        // Each datum's targets, one per position after the first, its own segment: parts keep
        // a segment's targets together and in order, so a part's targets are whole datums.
        // A target whose inputs make its gradient zero has weight 0: the head computes its
        // logprob and skips its backward.
        for ((p, (tokens, inputs)), d) in placements.iter().zip(&datums).zip(data) {
            row.targets.extend(p.index[1..].iter().enumerate().map(|(i, &pos)| Target {
                token: (d.targets[i] != tokens[i + 1]).then_some(d.targets[i]),
                pos,
                segment: p.segment,
                old_lp: f64::NAN,
                original_lp: f64::NAN,
                ref_lp: f64::NAN,
                advantage: 0.0,
                weight: if trains(loss, inputs, i) { 1.0 } else { 0.0 },
            }));
        }
        let parts = split(&row, trainer.part_tokens);
        check_memory(&self.base, parts.iter())?;
        // Parts hold whole datums, in order: the datums of each part and their target ranges.
        let mut owned: Vec<Vec<(usize, std::ops::Range<usize>)>> = Vec::with_capacity(parts.len());
        let mut d = 0;
        for part in &parts {
            let (mut list, mut at) = (Vec::new(), 0);
            while at < part.targets.len() {
                let n = datums[d].0.len() - 1;
                list.push((d, at..at + n));
                (at, d) = (at + n, d + 1);
            }
            owned.push(list);
        }
        let datum_losses = |k: usize, lps: &[f32]| {
            let mut g = vec![0.0; lps.len()];
            let mut each = Vec::with_capacity(owned[k].len());
            for (d, range) in &owned[k] {
                let new_lp: Vec<f64> = lps[range.clone()].iter().map(|x| f64::from(*x)).collect();
                let l = datum_loss(loss, &new_lp, &datums[*d].1);
                g[range.clone()].copy_from_slice(&l.grad);
                each.push((*d, l.loss, lps[range.clone()].to_vec()));
            }
            Ok((g, each))
        };
        // The call's gradients gather apart from the pending ones and join them once every slice
        // has run: a call that fails part way leaves nothing.
        let before = self.grads.take();
        let mut results = Vec::with_capacity(parts.len());
        for (i, slice) in slices(&parts).into_iter().enumerate() {
            if i > 0 {
                between();
            }
            let offset = slice.start;
            let mut of_slice = |k: usize, lps: &[f32]| datum_losses(offset + k, lps);
            match self.run(trainer, &parts[slice], backward, &mut of_slice) {
                Ok(r) => results.extend(r),
                Err(e) => {
                    self.grads = before;
                    return Err(e);
                }
            }
        }
        if let Some(mut pending) = before {
            if let Some(call) = self.grads.take() {
                let vars = Session::vars_of(&self.held.live()?.lora, self.modules);
                accumulate(&mut pending, &call, &vars)?;
            }
            self.grads = Some(pending);
        }
        let (mut logprobs, mut total) = (vec![Vec::new(); datums.len()], 0.0);
        for (d, l, lp) in results.into_iter().flat_map(|r| r.extra) {
            total += l;
            logprobs[d] = lp;
        }
        if !total.is_finite() {
            // Nothing of this call is kept: a NaN gradient would poison every later step.
            self.drop_gradients();
            return Err(TrainError::Invalid(format!(
                "the loss is {total}; this call's and the pending gradients were dropped"
            )));
        }
        Ok(Forwarded { logprobs, loss: total })
    }

    /// One AdamW step on the gradients summed since the last one; the global gradient norm
    /// before clipping (0 when no gradient is pending: nothing moves, as in PyTorch).
    pub fn optim_step(&mut self, trainer: &LoraTrainer, step: AdamStep) -> Result<f64, TrainError> {
        let p = step.params;
        let valid = p.lr.is_finite()
            && p.lr >= 0.0
            && (0.0..1.0).contains(&p.beta1)
            && (0.0..1.0).contains(&p.beta2)
            && p.eps.is_finite()
            && p.eps > 0.0
            && p.weight_decay.is_finite()
            && p.weight_decay >= 0.0
            && step.grad_clip_norm.is_finite()
            && step.grad_clip_norm >= 0.0;
        if !valid {
            return Err(TrainError::Invalid(format!(
                "adam_params {p:?} with grad_clip_norm {}: expected learning_rate >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, grad_clip_norm >= 0",
                step.grad_clip_norm
            )));
        }
        let max = if step.grad_clip_norm > 0.0 { step.grad_clip_norm } else { f64::INFINITY };
        self.step(trainer, p, max, |norm| match norm.is_finite() {
            true => Ok(()),
            false => Err(TrainError::Invalid(format!("the gradient norm is {norm}; no step was taken"))),
        })
    }

    /// Writes the training state (adapter, moments, step) to `path` and its description beside
    /// it (`path` with `.json`: base model, rank, alpha).
    pub fn save_state(&mut self, path: &std::path::Path) -> Result<(), TrainError> {
        let lora = &self.held.live()?.lora;
        let about = serde_json::json!({
            "base_model": self.base_id, "rank": lora.config.r, "alpha": lora.config.lora_alpha,
            "train_attn": self.modules.attn, "train_mlp": self.modules.mlp,
            "train_unembed": self.modules.unembed,
        });
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| TrainError::Failed(format!("saving the state: {e}")))?;
        }
        self.held.save(path).map_err(TrainError::Failed)?;
        std::fs::write(path.with_extension("json"), about.to_string())
            .map_err(|e| TrainError::Failed(format!("saving the state: {e}")))
    }

    /// A session from a state [`Session::save_state`] wrote; `with_optimizer: false` starts
    /// fresh moments (the adapter only).
    pub fn load_state(trainer: &LoraTrainer, path: &std::path::Path, with_optimizer: bool) -> Result<Self, TrainError> {
        let (base_id, rank, alpha) =
            state_info(path).ok_or_else(|| TrainError::Invalid("no such saved state".into()))?;
        let (base, _) = trainer.base(&base_id)?;
        let config = AdapterConfig { r: rank, lora_alpha: Some(alpha), use_rslora: false };
        let mut held = Held::load(path, config, UNSET).map_err(TrainError::Failed)?;
        if !with_optimizer {
            let lora = held.take_lora().ok_or_else(|| TrainError::Failed("the saved state is empty".into()))?;
            held = Held::new(lora, UNSET).map_err(failed)?;
        }
        if held.live()?.lora.pairs.len() != base.config.n_layer {
            return Err(TrainError::Invalid(format!("the saved state does not fit {base_id}")));
        }
        Ok(Session { base, base_id, held, grads: None, modules: state_modules(path), _keep: KeepFreed::begin() })
    }

    /// Replaces this session's adapter (and moments, or fresh ones) with a saved state of the
    /// same base model and rank: Tinker's `load_state` into an existing model. Pending gradients
    /// are dropped with the adapter they were taken of.
    pub fn load_into(
        &mut self,
        trainer: &LoraTrainer,
        path: &std::path::Path,
        with_optimizer: bool,
    ) -> Result<(), TrainError> {
        let rank = self.held.live()?.lora.config.r;
        let (base_id, saved_rank, _) =
            state_info(path).ok_or_else(|| TrainError::Invalid("no such saved state".into()))?;
        if base_id != self.base_id || saved_rank != rank {
            return Err(TrainError::Invalid(format!(
                "the state was saved from {base_id} at rank {saved_rank}; this model is {} at rank {rank}: create a training client from the state instead",
                self.base_id
            )));
        }
        *self = Session::load_state(trainer, path, with_optimizer)?;
        Ok(())
    }

    /// The adapter as PEFT files, as a job's checkpoint holds them.
    pub fn adapter_files(&mut self) -> Result<Vec<(String, Vec<u8>)>, TrainError> {
        let lora = &self.held.live()?.lora;
        ensure_finite_weights(&lora.vars())?;
        adapter::save(lora, &self.base, &self.base_id).map_err(TrainError::Failed)
    }

    /// A datum as a sequence: its tokens and last target (each position after the first is
    /// trained), with its loss inputs.
    fn datum(&self, index: usize, d: &Datum, loss: TokenLoss) -> Result<(Vec<u32>, DatumInputs), TrainError> {
        let bad = |e: String| TrainError::Invalid(format!("datum {index}: {e}"));
        let n = d.tokens.len();
        if n == 0 || d.targets.len() != n {
            return Err(bad(format!("{} targets for {n} input tokens", d.targets.len())));
        }
        let c = &self.base.config;
        if let Some(t) = d.tokens.iter().chain(&d.targets).find(|t| **t as usize >= c.vocab) {
            return Err(bad(format!("token id {t} is outside the vocabulary of {}", c.vocab)));
        }
        if n + 1 > c.context_len {
            return Err(bad(format!(
                "{} tokens with the last target, more than the context of {}",
                n + 1,
                c.context_len
            )));
        }
        let inputs = DatumInputs::from_map(&d.inputs);
        check_inputs(loss, n, &inputs).map_err(bad)?;
        let mut tokens = d.tokens.clone();
        tokens.push(d.targets[n - 1]);
        Ok((tokens, inputs))
    }
}

/// The ranges of `parts` that run as one slice: each part alone, the parts cut from one tree
/// (they share its prefix's pass) together.
fn slices(parts: &[Row]) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        match out.last_mut() {
            Some(last) if p.shared_prefix.is_some() && parts[last.end - 1].shared_prefix == p.shared_prefix => {
                last.end = i + 1
            }
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// A saved state's base model, rank and alpha, from the description beside it.
/// What a saved state trains (states saved before the choice was kept: every projection, no
/// head).
pub fn state_modules(path: &std::path::Path) -> Modules {
    let about: Option<serde_json::Value> =
        std::fs::read(path.with_extension("json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let flag = |k: &str, before: bool| about.as_ref().and_then(|a| a[k].as_bool()).unwrap_or(before);
    Modules { attn: flag("train_attn", true), mlp: flag("train_mlp", true), unembed: flag("train_unembed", false) }
}

pub fn state_info(path: &std::path::Path) -> Option<(String, usize, f64)> {
    let about: serde_json::Value = serde_json::from_slice(&std::fs::read(path.with_extension("json")).ok()?).ok()?;
    Some((about["base_model"].as_str()?.to_string(), about["rank"].as_u64()? as usize, about["alpha"].as_f64()?))
}

#[cfg(test)]
pub(crate) mod tests;
