//! One SFT job: conversations in, a LoRA checkpoint out, as ART's local backend trains them.
//!
//! Rows are taken in order in batches of `batch_size`; a conversation longer than the model's
//! context is dropped (counted), a batch with nothing to train is skipped. Each batch is one
//! optimizer step on the mean cross-entropy of its trained tokens, with the batch's learning
//! rate (one for all, or the next of the list), AdamW without weight decay and gradients clipped
//! to norm 1.0 (ART's SFT settings). The job continues from the model's latest checkpoint. Like
//! the RL job, it is a program over a [`Session`]: each batch one `run` and one `step`.

use crate::adamw::AdamParams;
use crate::adapter;
use crate::loss::sft_loss_part;
use crate::pack::{lay_out, split, Row, Target};
use crate::session::Session;
use crate::trainer::{check_memory, ensure_finite, failed, LoraTrainer, BETAS, INIT_SEED};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::Instant;
use tandem_core::sequences::Sequence;
use tandem_core::sft::{sft_batches, SftConfig};
use tandem_jobs::{TrainError, TrainJob, TrainOutput, TrainSink};

const SFT_MAX_GRAD_NORM: f64 = 1.0;

/// One batch as one row, every trained token a target; conversations that share a prefix (a
/// system prompt, a history) share it as a prefix tree when `share`.
fn batch_row(seqs: &[Sequence], conversations: usize, share: bool) -> Row {
    let tokens: Vec<&[u32]> = seqs.iter().map(|s| s.tokens.as_slice()).collect();
    let (rows, placements) = lay_out(&tokens, usize::MAX, share).expect("no length bound");
    let mut row = rows.into_iter().next().unwrap_or_default();
    row.trajectories = conversations;
    for (s, p) in seqs.iter().zip(&placements) {
        // Position 0 has nothing to be predicted from.
        for (i, _) in s.trained.iter().enumerate().skip(1).filter(|(_, t)| **t) {
            row.targets.push(Target {
                pos: p.index[i],
                segment: p.segment,
                old_lp: f64::NAN,
                original_lp: f64::NAN,
                ref_lp: f64::NAN,
                advantage: 1.0,
                weight: 1.0,
                token: None,
            });
        }
    }
    row
}

pub(crate) fn train_sft(
    trainer: &LoraTrainer,
    job: &TrainJob,
    config: &SftConfig,
    rows: &[Value],
    sink: &mut dyn TrainSink,
) -> Result<TrainOutput, TrainError> {
    let (base, tb) = trainer.base(&job.model.base_model)?;
    let (batches, dropped) =
        sft_batches(rows, config, tb.tokenizer.as_ref(), base.config.context_len).map_err(TrainError::Invalid)?;
    let batches: Vec<Row> = batches.iter().map(|b| batch_row(b, b.len(), trainer.share_prefixes)).collect();
    let rates: Vec<f64> =
        (0..batches.len()).map(|i| config.learning_rate.at(i)).collect::<Option<_>>().ok_or_else(|| {
            TrainError::Invalid(format!("learning_rate lists fewer rates than the {} batches", batches.len()))
        })?;
    let parts: Vec<Vec<Row>> = batches.iter().map(|r| split(r, trainer.part_tokens)).collect();
    check_memory(&base, parts.iter().flatten())?;
    let trainable: usize = batches.iter().map(|r| r.targets.len()).sum();
    let mut extra = Map::new();
    extra.insert("num_trajectories".into(), json!(rows.len()));
    extra.insert("num_dropped_trajectories".into(), json!(dropped));
    extra.insert("num_trainable_tokens".into(), json!(trainable));
    sink.started(batches.len() as u64, extra);

    let lora = match &job.base_checkpoint {
        Some(dir) => adapter::load(dir, &base, INIT_SEED).map_err(TrainError::Failed)?,
        None => adapter::init(&base, INIT_SEED).map_err(failed)?,
    };
    let params = AdamParams {
        lr: rates.first().copied().unwrap_or(0.0),
        beta1: BETAS.0,
        beta2: BETAS.1,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    // A program over a training session; between steps the adapter and optimizer may be
    // parked for another entity's job.
    let mut session = Session::over(base.clone(), &job.model.base_model, lora, params)?;
    let mut summary: BTreeMap<String, f64> = BTreeMap::new();
    for (step, ((row, parts), lr)) in batches.iter().zip(&parts).zip(&rates).enumerate() {
        if let Some(stop) = sink.boundary(session.held_mut()) {
            return Err(stop);
        }
        let started = Instant::now();
        let n = row.targets.len();
        // Each part's share of the batch's mean cross-entropy.
        let mut part_loss = |_: usize, lps: &[f32]| {
            let lp: Vec<f64> = lps.iter().map(|x| f64::from(*x)).collect();
            let (loss, grad) = sft_loss_part(&lp, n);
            Ok((grad, loss))
        };
        let results = session.run(trainer, parts, true, &mut part_loss)?;
        let loss: f64 = results.iter().map(|r| r.extra).sum();
        let grad_norm = session.step(trainer, AdamParams { lr: *lr, ..params }, SFT_MAX_GRAD_NORM, |norm| {
            ensure_finite(step, &[("the loss", loss), ("the gradient norm", norm)])
        })?;
        let secs = started.elapsed().as_secs_f64();
        let metrics = BTreeMap::from([
            ("loss".to_string(), loss),
            ("learning_rate".to_string(), *lr),
            ("grad_norm".to_string(), grad_norm),
            ("num_trajectories".to_string(), row.trajectories as f64),
            ("num_tokens".to_string(), row.tokens.len() as f64),
            ("num_trainable_tokens".to_string(), n as f64),
            ("tokens_per_second".to_string(), row.tokens.len() as f64 / secs.max(1e-9)),
            ("step_seconds".to_string(), secs),
        ]);
        for (k, v) in &metrics {
            *summary.entry(format!("sft/{k}")).or_default() += v / batches.len() as f64;
        }
        sink.gradient_step(metrics);
    }
    let files = session.adapter_files()?;
    summary.insert("sft/num_gradient_steps".into(), batches.len() as f64);
    Ok(TrainOutput { files, metrics: summary })
}
