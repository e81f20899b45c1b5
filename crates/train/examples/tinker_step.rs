//! One RL step through a Tinker session against the same step as a `/v1/preview` job, on the real
//! model, alternating, the shape of `make bench-rl-tinker`'s steps: GROUP_COUNT groups of GROUP
//! rollouts, a PROMPT-token prompt per group and COMPLETION sampled tokens, LoRA r8.
//! The job trains the completions only (its trajectories mark them); a Tinker datum has a target
//! at every position (the SDK returns a logprob for each), the prompt's with advantage 0, and
//! with UNEMBED=1 (the SDK's default `train_unembed`) the output head's pair trains too.
//! `cargo run --release -p tandem-train --example tinker_step` (TANDEM_MODEL, GROUP_COUNT, GROUP,
//! PROMPT, COMPLETION, ROUNDS, UNEMBED). Prints each step's seconds, then one JSON line.
mod common;

use common::{env, groups, rl_job, Ids, Steps};
use std::collections::BTreeMap;
use std::sync::Arc;
use tandem_core::tinker::{Datum, Modules};
use tandem_core::train_config::TrainConfig;
use tandem_jobs::Trainer;
use tandem_train::adamw::AdamParams;
use tandem_train::session::{AdamStep, Session};
use tandem_train::token_loss::TokenLoss;
use tandem_train::{LoraTrainer, TrainBase};

// The allocator the server runs the trainer with.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

fn main() {
    tandem_model::allocator::keep_freed_memory();
    tandem_train::run_candle_ops_inline();
    let path = std::env::var("TANDEM_MODEL").unwrap_or_else(|_| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let (count, group, prompt, completion, rounds) =
        (env("GROUP_COUNT", 4), env("GROUP", 8), env("PROMPT", 45), env("COMPLETION", 16), env("ROUNDS", 3));
    let unembed = env("UNEMBED", 1) == 1;
    let groups = groups(count, group, prompt, completion);
    // The Tinker datums: ART's advantages (reward minus the group's mean over its deviation) on
    // the sampled tokens, 0 on the prompt's; the sampler's logprobs alongside.
    let data: Vec<Datum> = groups
        .iter()
        .flat_map(|g| {
            let g = &g.trajectories;
            let mean = g.iter().map(|t| t.reward).sum::<f64>() / g.len() as f64;
            let sd = (g.iter().map(|t| (t.reward - mean).powi(2)).sum::<f64>() / g.len() as f64).sqrt();
            g.iter().map(move |t| {
                let (tokens, r) = (&t.sequences[0].tokens, t.reward);
                let n = tokens.len() - 1;
                let adv = (0..n).map(|i| if i + 1 >= prompt { (r - mean) / sd } else { 0.0 }).collect();
                let lp = (0..n).map(|i| if i + 1 >= prompt { -2.0 } else { 0.0 }).collect();
                Datum {
                    tokens: tokens[..n].to_vec(),
                    targets: tokens[1..].to_vec(),
                    inputs: BTreeMap::from([("advantages".to_string(), adv), ("logprobs".to_string(), lp)]),
                }
            })
        })
        .collect();

    let trainer = LoraTrainer::new(vec![TrainBase { id: "base".into(), path: path.into(), tokenizer: Arc::new(Ids) }]);
    let modules = Modules { attn: true, mlp: true, unembed };
    let mut session = trainer
        .on_training_threads(|| Session::create(&trainer, "base", 8, 16.0, Some(1))?.training(modules, Some(1)))
        .unwrap();
    let step = AdamStep {
        params: AdamParams { lr: 1e-5, beta1: 0.9, beta2: 0.95, eps: 1e-12, weight_decay: 0.0 },
        grad_clip_norm: 0.0,
    };
    // The job path trains the sampled tokens only (its trajectories mark them).
    let job = rl_job(groups, TrainConfig { learning_rate: 1e-5, ..TrainConfig::default() }, None);
    // Untimed: the base's load and the first allocations.
    trainer.train(&job, &mut Steps::default()).unwrap();
    let (mut job_secs, mut tinker_secs, mut fb_secs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let t = std::time::Instant::now();
        trainer.train(&job, &mut Steps::default()).unwrap();
        job_secs.push(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        trainer
            .on_training_threads(|| {
                session.forward_backward(&trainer, &data, TokenLoss::ImportanceSampling, true)?;
                fb_secs.push(t.elapsed().as_secs_f64());
                session.optim_step(&trainer, step)
            })
            .unwrap();
        tinker_secs.push(t.elapsed().as_secs_f64());
        eprintln!(
            "round {round}: job {:.2} s, tinker {:.2} s (forward_backward {:.2} s)",
            job_secs[round], tinker_secs[round], fb_secs[round]
        );
    }
    let (j, t) = (median(job_secs), median(tinker_secs));
    println!(
        "{{\"unembed\": {unembed}, \"job_seconds\": {j:.3}, \"tinker_seconds\": {t:.3}, \"forward_backward_seconds\": {:.3}, \"ratio\": {:.3}}}",
        median(fb_secs),
        t / j
    );
}
