//! Times single-sequence decode on the model: `cargo run --release -p tandem-engine --example decode_bench`.
use tandem_model::{KvCache, Logits, SeqInput};

fn main() {
    // As the engine does: run on a worker of the pool the kernels use.
    rayon::ThreadPoolBuilder::new().build().unwrap().install(run)
}

fn run() {
    let path = std::env::var("TANDEM_MODEL").unwrap_or_else(|_| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let batch: usize = std::env::var("BATCH").ok().and_then(|b| b.parse().ok()).unwrap_or(1);
    let loaded = tandem_model::load(std::path::Path::new(&path)).unwrap();
    let m = &loaded.model;
    let c = &m.config;
    let mut caches: Vec<KvCache> = (0..batch).map(|_| KvCache::new(c.n_layer, c.kv_dim())).collect();
    let prompt: Vec<u32> = (100..132).collect();
    for cache in caches.iter_mut() {
        m.forward(&mut [SeqInput { tokens: &prompt, cache, adapter: None, logits: Logits::Last }]).unwrap();
    }
    let steps = if std::env::var_os("PREFILL_ONLY").is_some() { 0 } else { 64 };
    let t = std::time::Instant::now();
    let tok = [200u32];
    for _ in 0..steps {
        let mut inputs: Vec<SeqInput> = caches
            .iter_mut()
            .map(|cache| SeqInput { tokens: &tok, cache, adapter: None, logits: Logits::Last })
            .collect();
        m.forward(&mut inputs).unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    if steps > 0 {
        println!(
            "batch {batch}: {:.1} ms/step, {:.1} tok/s aggregate",
            secs * 1000.0 / steps as f64,
            (steps * batch) as f64 / secs
        );
    }
    let long: Vec<u32> = (0..512).map(|i| 100 + (i % 1000) as u32).collect();
    let mut cache = KvCache::new(c.n_layer, c.kv_dim());
    let reps = if steps == 0 { 5 } else { 1 };
    // CHUNK=n prefills the prompt n tokens a forward pass, as the engine's steps do when their
    // planned time is capped (each pass reads the weights again).
    let chunk: usize = std::env::var("CHUNK").ok().and_then(|b| b.parse().ok()).unwrap_or(512).max(1);
    let t = std::time::Instant::now();
    for _ in 0..reps {
        cache.truncate(0);
        for part in long.chunks(chunk) {
            m.forward(&mut [SeqInput { tokens: part, cache: &mut cache, adapter: None, logits: Logits::Last }])
                .unwrap();
        }
    }
    println!("prefill 512 in chunks of {chunk}: {:.1} tok/s", reps as f64 * 512.0 / t.elapsed().as_secs_f64());
}
