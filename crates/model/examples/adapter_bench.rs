//! Decode steps with many LoRA adapters in one batch, in process (issue 52, item 2): the cost the
//! adapters add to a step, without HTTP, sampling or scheduling around it, so that kernel variants
//! compare on a noisy VM. `bench/adapters.py` measures the same through the server.
//!
//! `cargo run --release -p tandem-model --example adapter_bench -- MODEL.gguf [STREAMS] [STEPS]`
//!
//! STREAMS (16) sequences each hold a 32-token prompt, then decode STEPS (24) one-token steps per
//! round on a thread team of `RAYON_NUM_THREADS` (as the engine runs). Rounds on 1, 4, 16 and 64
//! random r8 adapters (every projection) alternate with rounds on the base; stream i takes adapter
//! (round * STREAMS + i) mod k, so 64 rotate. Prints the median step time of each, the ratio of
//! throughputs, and the bytes of the adapters a step reads (their matrices, once each per step)
//! over the extra time: what a memory-bound adapter pass would cost at that bandwidth. Only the
//! public model API is used (`LoraAdapter::new` since session 53).

use std::time::{Duration, Instant};
use tandem_model::lora::{LoraAdapter, LoraLayer, LoraPair};
use tandem_model::{KvCache, Logits, SeqInput};

fn random(n: usize, seed: u64) -> Vec<f32> {
    tandem_model::testing::weights(n, seed).into_iter().map(|v| 0.04 * v).collect()
}

fn adapter(c: &tandem_model::LlamaConfig, rank: usize, seed: u64) -> LoraAdapter {
    let pair = |i: usize, o: usize, s: u64| Some(LoraPair::new(rank, random(rank * i, s), random(o * rank, s + 1)));
    let layers = (0..c.n_layer as u64)
        .map(|l| {
            let s = seed * 1000 + l * 20;
            LoraLayer {
                q: pair(c.hidden, c.q_dim(), s),
                k: pair(c.hidden, c.kv_dim(), s + 2),
                v: pair(c.hidden, c.kv_dim(), s + 4),
                o: pair(c.q_dim(), c.hidden, s + 6),
                gate: pair(c.hidden, c.ffn, s + 8),
                up: pair(c.hidden, c.ffn, s + 10),
                down: pair(c.ffn, c.hidden, s + 12),
            }
        })
        .collect();
    LoraAdapter::new(layers, None, 2.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: adapter_bench MODEL.gguf [STREAMS] [STEPS]");
    let arg = |i: usize, default: usize| args.get(i).and_then(|t| t.parse().ok()).unwrap_or(default);
    let (streams, steps) = (arg(2, 16), arg(3, 24));
    let loaded = tandem_model::load(std::path::Path::new(path)).unwrap();
    let (m, c) = (&loaded.model, loaded.model.config.clone());
    let adapters: Vec<LoraAdapter> = (0..64).map(|i| adapter(&c, 8, i + 1)).collect();
    let bytes_each = adapters[0].bytes();
    let threads = rayon::current_num_threads();
    let team = tandem_model::kernels::team::Team::new(threads, Duration::from_micros(100), "bench").unwrap();
    team.install(|| {
        let prompt: Vec<u32> = (0..32).map(|i| 100 + i * 37).collect();
        // One round: fresh caches with the prompt, then `steps` decode steps; the steps' times.
        let round = |pick: &dyn Fn(usize) -> Option<usize>| -> Vec<f64> {
            let mut caches: Vec<KvCache> = (0..streams).map(|_| KvCache::new(c.n_layer, c.kv_dim())).collect();
            let mut seqs: Vec<SeqInput> = caches
                .iter_mut()
                .enumerate()
                .map(|(i, cache)| SeqInput { tokens: &prompt, cache, adapter: pick(i).map(|j| &adapters[j]), logits: Logits::None })
                .collect();
            m.forward(&mut seqs).unwrap();
            let next = [7u32];
            let mut times = Vec::with_capacity(steps);
            for _ in 0..steps {
                let mut seqs: Vec<SeqInput> = caches
                    .iter_mut()
                    .enumerate()
                    .map(|(i, cache)| SeqInput {
                        tokens: &next,
                        cache,
                        adapter: pick(i).map(|j| &adapters[j]),
                        logits: Logits::Last,
                    })
                    .collect();
                let start = Instant::now();
                m.forward(&mut seqs).unwrap();
                times.push(start.elapsed().as_secs_f64());
            }
            times
        };
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "{streams} streams, {steps} decode steps a round, {threads} threads; an r8 adapter holds {:.1} MB",
            bytes_each as f64 / 1e6
        );
        round(&|_| None); // warm-up
        // `ADAPTERS=16` runs one count; `PROFILE=1` skips the base's rounds (for `perf record`;
        // `ADAPTERS=0` then profiles the base alone).
        let counts: Vec<usize> = match std::env::var("ADAPTERS") {
            Ok(k) => vec![k.parse().expect("ADAPTERS is a count")],
            Err(_) => vec![1, 4, 16, 64],
        };
        let profile = std::env::var_os("PROFILE").is_some();
        for k in counts {
            let (mut ours, mut base) = (Vec::new(), Vec::new());
            for r in 0..4 {
                // `ADAPTERS=0` (with `PROFILE=1`): the base alone, for comparing profiles.
                let pick = |i: usize| (k > 0).then(|| (r * streams + i) % k.max(1));
                ours.extend(round(&pick));
                base.extend(if profile { vec![f64::NAN] } else { round(&|_| None) });
            }
            let (a, b) = (median(ours), median(base));
            if profile {
                println!("{k:>3} adapters: step {:6.2} ms", a * 1e3);
                continue;
            }
            let distinct = k.min(streams);
            let mb = (distinct * bytes_each) as f64 / 1e6;
            // Over a step no slower than the base's (the base's rounds are noisy) there is no
            // extra time to divide by.
            let rate = if a > b { format!("{:5.1} GB/s", mb / 1e3 / (a - b)) } else { "no extra time".into() };
            println!(
                "{k:>3} adapters: step {:6.2} ms, base {:6.2} ms, throughput ratio {:.3}; a step reads {mb:6.1} MB of adapters, {rate} over the extra time",
                a * 1e3,
                b * 1e3,
                b / a,
            );
        }
    });
}
