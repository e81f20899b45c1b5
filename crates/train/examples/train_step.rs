//! Times training steps on the real model: forward + backward + AdamW over ROWS sequences of LEN
//! tokens (default 4 x 256) packed in one row, LoRA r8 on every projection.
//! `cargo run --release -p tandem-train --example train_step` (TANDEM_MODEL, ROWS, LEN, STEPS).
use candle_core::Tensor;

// The allocator the server runs the trainer with.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use tandem_train::adamw::{AdamParams, AdamW};
use tandem_train::net::{forward, Base};
use tandem_train::pack::{Row, Target};

fn env(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    tandem_model::allocator::keep_freed_memory();
    tandem_train::run_candle_ops_inline();
    let path = std::env::var("TANDEM_MODEL").unwrap_or_else(|_| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let (rows, len, steps) = (env("ROWS", 4), env("LEN", 256), env("STEPS", 3));
    let t = std::time::Instant::now();
    let base = Base::load(std::path::Path::new(&path)).unwrap();
    eprintln!("base loaded in {:.1} s", t.elapsed().as_secs_f64());
    let lora = tandem_train::adapter::init(&base, 3407).unwrap();
    let mut row = Row { trajectories: rows, ..Row::default() };
    for s in 0..rows {
        let start = row.tokens.len();
        row.tokens.extend((0..len).map(|i| (100 + (i * 7 + s * 13) % 20000) as u32));
        row.segments.push((start, len));
        for pos in start + len / 2..start + len {
            row.targets.push(Target {
                pos,
                segment: s,
                old_lp: f64::NAN,
                original_lp: f64::NAN,
                ref_lp: f64::NAN,
                advantage: 1.0,
                weight: 1.0,
                token: None,
            });
        }
    }
    let vars = lora.vars();
    let mut opt =
        AdamW::new(vars.clone(), AdamParams { lr: 1e-5, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 })
            .unwrap();
    let mut times = Vec::new();
    for step in 0..steps {
        let t = std::time::Instant::now();
        let out = forward(&base, &lora, &row).unwrap();
        let fwd = t.elapsed().as_secs_f64();
        let g = Tensor::ones(out.logprobs.dims(), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        let grads = out.logprobs.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
        let bwd = t.elapsed().as_secs_f64() - fwd;
        let mut grads = grads;
        tandem_train::trainer::clip(&mut grads, &vars, 0.1).unwrap();
        opt.step(&grads).unwrap();
        eprintln!("step {step}: {:.2} s (forward {fwd:.2}, backward {bwd:.2})", t.elapsed().as_secs_f64());
        times.push(t.elapsed().as_secs_f64());
    }
    // One JSON line for bench/run-training.sh.
    println!("{{\"step_seconds\": {times:?}}}");
}
