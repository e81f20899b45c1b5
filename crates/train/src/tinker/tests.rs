use super::*;
use crate::session::tests::IdsOnly;
use crate::TrainBase;
use std::collections::BTreeMap;

fn trainer(dir: &std::path::Path) -> Arc<LoraTrainer> {
    let path = dir.join("tiny.gguf");
    tandem_model::testing::write_tiny_arch_gguf(&path, tandem_model::Arch::Llama);
    Arc::new(LoraTrainer::new(vec![TrainBase { id: "tiny".into(), path, tokenizer: Arc::new(IdsOnly) }]))
}

fn spec(seed: u64) -> LoraSpec {
    LoraSpec { rank: 4, seed: Some(seed), modules: Modules::ALL }
}

fn data() -> Vec<Datum> {
    let inputs = BTreeMap::from([("weights".to_string(), vec![1.0; 4])]);
    vec![Datum { tokens: vec![10, 20, 30, 40], targets: vec![20, 30, 40, 50], inputs }]
}

fn adam() -> AdamSettings {
    AdamSettings { learning_rate: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-12, weight_decay: 0.0, grad_clip_norm: 0.0 }
}

/// A training step, then the logprobs the model gives after it.
fn train_and_score(m: &TinkerModels, id: &str) -> Vec<Vec<f32>> {
    m.forward_backward(id, &data(), "cross_entropy", &[], true).unwrap();
    m.optim_step(id, adam()).unwrap();
    m.forward_backward(id, &data(), "cross_entropy", &[], false).unwrap().logprobs
}

#[test]
fn models_past_the_memory_budget_park_and_come_back_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let t = trainer(dir.path());
    let parked = dir.path().join("parked");
    std::fs::create_dir_all(&parked).unwrap();
    // The twin is never parked: what "bit for bit" is held to.
    let twin = TinkerModels::new(t.clone(), Arc::new(Turns::new(1)), 4);
    twin.create("e", "twin", "tiny", spec(7)).unwrap();
    let one = twin.memory().live_bytes;
    assert!(one > 0);
    // Room for one model and a half: a second one parks the first.
    let m = TinkerModels::new(t.clone(), Arc::new(Turns::new(1)), 4).with_memory(one * 3 / 2, parked.clone());
    m.create("e", "a", "tiny", spec(7)).unwrap();
    let first = train_and_score(&m, "a");
    assert_eq!(first, train_and_score(&twin, "twin"));
    m.create("f", "b", "tiny", spec(8)).unwrap();
    assert_eq!(m.memory(), HeldMemory { live_bytes: one, live: 1, parked: 1 }, "a parked for b");
    assert_eq!(std::fs::read_dir(&parked).unwrap().count(), 1, "a's file");
    train_and_score(&m, "b");
    // a comes back (b parks), with its adapter and its AdamW moments.
    assert_eq!(train_and_score(&m, "a"), train_and_score(&twin, "twin"));
    assert_eq!(m.memory(), HeldMemory { live_bytes: one, live: 1, parked: 1 }, "b parked for a");
    // Pending gradients are a step in progress: that model is not parked, the budget gives way.
    m.forward_backward("a", &data(), "cross_entropy", &[], true).unwrap();
    m.forward_backward("b", &data(), "cross_entropy", &[], false).unwrap();
    assert_eq!(m.memory().parked, 0, "both live: a holds gradients");
    assert!(m.memory().live_bytes > m.memory.budget);
    // Released models leave no file behind.
    m.release("a");
    m.release("b");
    assert_eq!(std::fs::read_dir(&parked).unwrap().count(), 0);
}
