//! Prints the model's top next tokens for a raw text prompt: `cargo run --release -p tandem-engine --example probe -- "text"`.
use tandem_engine::tokenizer::TextTokenizer;
use tandem_model::{KvCache, Logits, SeqInput};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = std::env::var("TANDEM_MODEL").unwrap_or_else(|_| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let loaded = tandem_model::load(std::path::Path::new(&path)).unwrap();
    let tok = TextTokenizer::from_meta(&loaded.tokenizer).unwrap();
    let ids = tok.encode(&args[1]).unwrap();
    println!("{} tokens: {:?}", ids.len(), ids);
    let c = &loaded.model.config;
    let mut cache = KvCache::new(c.n_layer, c.kv_dim());
    let t = std::time::Instant::now();
    let out = loaded
        .model
        .forward(&mut [SeqInput { tokens: &ids, cache: &mut cache, adapter: None, logits: Logits::Last }])
        .unwrap();
    println!("prefill {:?}", t.elapsed());
    let logits = &out[(0, 0)];
    let lse = tandem_engine::sampler::log_normalizer(logits);
    for id in tandem_engine::sampler::top_k_ids(logits, 8) {
        println!("{:>6} {:>8.3} {:?}", id, logits[id as usize] - lse, tok.token_text(id));
    }
}
