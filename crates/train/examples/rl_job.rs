//! Times whole RL training jobs on the real model, with and without prefix sharing, alternating:
//! GROUP_COUNT groups of GROUP rollouts, each a PROMPT-token prompt (its own per group) and a
//! COMPLETION-token sampled reply with logprobs, rewards spread within each group, ART's
//! defaults (rows of up to 2048 tokens, one optimizer step per row, LoRA r8).
//! `cargo run --release -p tandem-train --example rl_job` (TANDEM_MODEL, GROUP_COUNT, GROUP, PROMPT,
//! COMPLETION, ROUNDS, PART; KL=1 adds a KL penalty against the base, which costs a reference
//! pass; RECOMPUTE=n recomputes the shared trainer's parts and cut prefixes longer than n tokens,
//! default half a part; the unshared trainer, the one before issue 34, keeps every graph).
//! Prints each job's wall time, steps and forward tokens, then one JSON line with the process's
//! peak RSS.
mod common;

use common::{env, groups, rl_job, Ids, Steps};
use std::collections::BTreeMap;
use std::sync::Arc;
use tandem_core::train_config::{KlPenalty, KlReference, KlSource, TrainConfig};
use tandem_jobs::{ReferencePolicy, Trainer};
use tandem_train::{LoraTrainer, TrainBase};

// The allocator the server runs the trainer with.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tandem_model::allocator::keep_freed_memory();
    tandem_train::run_candle_ops_inline();
    let path = std::env::var("TANDEM_MODEL").unwrap_or_else(|_| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let (count, group, prompt, completion, rounds) =
        (env("GROUP_COUNT", 1), env("GROUP", 8), env("PROMPT", 300), env("COMPLETION", 40), env("ROUNDS", 3));
    let groups = groups(count, group, prompt, completion);
    let kl = (env("KL", 0) == 1).then_some(KlPenalty {
        coef: 0.1,
        source: KlSource::Sample,
        reference: KlReference::Step(0),
    });
    let job = rl_job(
        groups,
        TrainConfig { learning_rate: 1e-5, kl_penalty: kl.clone(), ..TrainConfig::default() },
        kl.as_ref().map(|_| ReferencePolicy::Base),
    );
    // The trainer's part size (tokens through forward and backward at once).
    let part = env("PART", 512);
    let base = TrainBase { id: "base".into(), path: path.into(), tokenizer: Arc::new(Ids) };
    let recompute = std::env::var("RECOMPUTE").ok().and_then(|v| v.parse().ok()).unwrap_or(part / 2);
    let trainers = [
        // The trainer before issue 34: no prefix trees, every part's graph kept.
        (
            "unshared",
            LoraTrainer::new(vec![clone_base(&base)])
                .with_prefix_sharing(false)
                .with_part_tokens(part)
                .with_recompute_above(usize::MAX),
        ),
        ("shared", LoraTrainer::new(vec![clone_base(&base)]).with_part_tokens(part).with_recompute_above(recompute)),
    ];
    // ONLY=shared or ONLY=unshared runs one of them (for a profile).
    let only = std::env::var("ONLY").ok();
    let trainers: Vec<_> = trainers.into_iter().filter(|(n, _)| only.as_deref().is_none_or(|o| o == *n)).collect();
    // A first job per trainer loads its base (not timed).
    for (_, t) in &trainers {
        t.train(&job, &mut Steps::default()).unwrap();
    }
    let mut results: BTreeMap<&str, Vec<(f64, usize, f64)>> = BTreeMap::new();
    for round in 0..rounds {
        for (name, t) in &trainers {
            let mut steps = Steps::default();
            let start = std::time::Instant::now();
            t.train(&job, &mut steps).unwrap();
            let secs = start.elapsed().as_secs_f64();
            let tokens: f64 = steps.0.iter().map(|m| m["num_forward_tokens"]).sum();
            let step_secs: Vec<String> = steps.0.iter().map(|m| format!("{:.2}", m["step_seconds"])).collect();
            eprintln!(
                "round {round} {name}: {secs:.2} s, {} steps ({} s), {tokens} forward tokens",
                steps.0.len(),
                step_secs.join(", ")
            );
            results.entry(name).or_default().push((secs, steps.0.len(), tokens));
        }
    }
    let json: Vec<String> = results
        .iter()
        .map(|(name, r)| {
            let secs: Vec<f64> = r.iter().map(|x| x.0).collect();
            format!("\"{name}\": {{\"seconds\": {secs:?}, \"steps\": {}, \"forward_tokens\": {}}}", r[0].1, r[0].2)
        })
        .collect();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let peak_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    println!("{{{}, \"peak_rss_mb\": {:.0}}}", json.join(", "), peak_kb / 1024.0);
}

fn clone_base(b: &TrainBase) -> TrainBase {
    TrainBase { id: b.id.clone(), path: b.path.clone(), tokenizer: b.tokenizer.clone() }
}
