//! The engine on a tiny random-weight Llama written as GGUF by the test itself
//! (`tandem_model::testing`): batching, LoRA and cancellation, fast and without the real model.

use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tandem_core::inference::{
    AdapterRef, GenerateRequest, InferEvent, InferenceBackend, ModelHandle, PromptScoring, SamplingParams, SubmitError,
};
use tandem_engine::{Engine, EngineConfig};

/// The engine's series as `GET /metrics` encodes them.
fn metrics_text(engine: &Engine) -> String {
    use tandem_core::telemetry::prometheus_client::{encoding::text::encode, registry::Registry};
    let mut registry = Registry::default();
    engine.register_metrics(&mut registry);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    text
}

use tandem_model::testing::{weights, write_tiny_gguf, FFN, HIDDEN, LAYERS};

/// A PEFT adapter on q and down of every layer, with `b_value` in every B entry (0 = no-op).
fn write_adapter(dir: &Path, b_value: f32) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("adapter_config.json"),
        r#"{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "down_proj"]}"#,
    )
    .unwrap();
    let mut t = HashMap::new();
    for l in 0..LAYERS {
        for (module, in_dim, out_dim) in [("self_attn.q_proj", HIDDEN, HIDDEN), ("mlp.down_proj", FFN, HIDDEN)] {
            let p = format!("base_model.model.model.layers.{l}.{module}");
            t.insert(
                format!("{p}.lora_A.weight"),
                Tensor::from_vec(weights(8 * in_dim, l as u64 + 99), (8, in_dim), &Device::Cpu).unwrap(),
            );
            t.insert(
                format!("{p}.lora_B.weight"),
                Tensor::from_vec(vec![b_value; out_dim * 8], (out_dim, 8), &Device::Cpu).unwrap(),
            );
        }
    }
    candle_core::safetensors::save(&t, dir.join("adapter_model.safetensors")).unwrap();
}

fn request(prompt: &[u32], max_tokens: usize, adapter: Option<AdapterRef>) -> GenerateRequest {
    let params = SamplingParams { temperature: 0.0, max_tokens, ignore_eos: true, ..Default::default() };
    GenerateRequest {
        request_id: "t".into(),
        adapter,
        prompt: prompt.to_vec(),
        n: 1,
        params,
        priority: 0,
        tenant: "a".into(),
        cache_salt: None,
        prompt_logprobs: None,
        prompt_scoring: None,
        beam_step: false,
    }
}

/// Prepares and queues a request, as the api does (there on a blocking thread).
fn submit(
    m: &ModelHandle,
    req: GenerateRequest,
) -> Result<tokio::sync::mpsc::UnboundedReceiver<InferEvent>, SubmitError> {
    m.submit(m.prepare(req)?)
}

async fn tokens(mut rx: tokio::sync::mpsc::UnboundedReceiver<InferEvent>) -> Vec<u32> {
    let mut out = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            InferEvent::Token { token_id, .. } => out.push(token_id),
            InferEvent::Finished { .. } => return out,
            InferEvent::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    panic!("no Finished event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_lora_and_cancellation_on_a_tiny_model() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let mut engine = Engine::new();
    engine.add_path("tiny", &gguf, Default::default(), EngineConfig::default()).unwrap();
    let e = &engine.models()[0];
    let prompt = e.tokenize("hello tiny model", false).unwrap();
    assert_eq!(prompt.len(), 16, "one token per byte");

    // Alone, then batched with other sequences of other lengths: the same tokens.
    let alone = tokens(submit(e, request(&prompt, 12, None)).unwrap()).await;
    let others: Vec<_> = (0..3).map(|i| submit(e, request(&prompt[..5 + i * 3], 20, None)).unwrap()).collect();
    let together = submit(e, request(&prompt, 12, None)).unwrap();
    let batched = tokens(together).await;
    for o in others {
        tokens(o).await;
    }
    assert_eq!(alone.len(), 12);
    assert_eq!(batched, alone, "batched output must equal unbatched output");

    // A zero-initialised adapter changes nothing; a non-zero one changes the output.
    write_adapter(&dir.path().join("zero"), 0.0);
    write_adapter(&dir.path().join("trained"), 0.5);
    let zero = AdapterRef {
        checkpoint_id: "zero".into(),
        name: "zero".into(),
        owner: "e".into(),
        path: dir.path().join("zero"),
        confined_to: None,
    };
    let trained = AdapterRef {
        checkpoint_id: "trained".into(),
        name: "trained".into(),
        owner: "e".into(),
        path: dir.path().join("trained"),
        confined_to: None,
    };
    assert_eq!(tokens(submit(e, request(&prompt, 12, Some(zero))).unwrap()).await, alone);
    let with_lora = tokens(submit(e, request(&prompt, 12, Some(trained.clone()))).unwrap()).await;
    assert_ne!(with_lora, alone, "a trained adapter must change greedy output");

    // While it runs, the adapter is listed by its name and owner (`vllm:lora_requests_info`),
    // once however many sequences use it; once it ends, no longer. `cache_config_info` gives the
    // KV capacity in positions.
    let held: Vec<_> = (0..2).map(|_| submit(e, request(&prompt, 8000, Some(trained.clone()))).unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let running = loop {
        let a = e.lora_activity();
        if !a.running.is_empty() {
            break a;
        }
        assert!(Instant::now() < deadline, "the adapter's sequences never showed as running");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let names: Vec<(&str, &str)> = running.running.iter().map(|t| (t.name.as_str(), t.owner.as_str())).collect();
    assert_eq!(names, [("trained", "a")]);
    assert_eq!(running.max_lora, EngineConfig::default().max_seqs);
    assert!(running.updated_unix > 1.7e9, "{}", running.updated_unix);
    drop(held);
    while !e.lora_activity().running.is_empty() {
        assert!(Instant::now() < deadline, "the cancelled adapter sequences are still listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(metrics_text(&engine).contains("vllm:cache_config_info{engine=\"0\",block_size=\"1\","));

    // A dropped receiver frees its sequence within a step or two.
    let mut rx = submit(e, request(&prompt, 8000, None)).unwrap();
    while !matches!(rx.recv().await, Some(InferEvent::Token { .. })) {}
    drop(rx);
    let deadline = Instant::now() + Duration::from_secs(10);
    // The gauge may still read 0 from before this request ran, so wait for the abort as well
    // (the third: the two adapter sequences above were aborted too).
    let freed = |m: String| {
        m.contains("vllm:num_requests_running{model_name=\"tiny\",engine=\"0\"} 0")
            && m.contains("finished_reason=\"abort\"} 3")
    };
    while !freed(metrics_text(&engine)) {
        assert!(Instant::now() < deadline, "the cancelled sequence is still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With room for one sequence, a higher-priority request preempts the running one, finishes
/// first, and the preempted one then continues exactly where it stopped (recomputed cache,
/// same greedy tokens as an uninterrupted run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_preempts_and_the_preempted_sequence_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let mut engine = Engine::new();
    engine
        .add_path("tiny", &gguf, Default::default(), EngineConfig { max_seqs: 1, ..EngineConfig::default() })
        .unwrap();
    let e = &engine.models()[0];
    let prompt = e.tokenize("hello tiny model", false).unwrap();
    let uninterrupted = tokens(submit(e, request(&prompt, 300, None)).unwrap()).await;

    let low = GenerateRequest { priority: 5, ..request(&prompt, 300, None) };
    let mut low_rx = submit(e, low).unwrap();
    let mut low_tokens = Vec::new();
    while low_tokens.is_empty() {
        if let Some(InferEvent::Token { token_id, .. }) = low_rx.recv().await {
            low_tokens.push(token_id);
        }
    }
    let high = GenerateRequest { priority: 0, ..request(&prompt[..6], 10, None) };
    let high_rx = submit(e, high).unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = order.clone();
    let high_task = tokio::spawn(async move {
        let t = tokens(high_rx).await;
        o.lock().unwrap().push("high");
        t
    });
    let o = order.clone();
    let low_task = tokio::spawn(async move {
        let rest = tokens(low_rx).await;
        o.lock().unwrap().push("low");
        rest
    });
    assert_eq!(high_task.await.unwrap().len(), 10);
    low_tokens.extend(low_task.await.unwrap());
    assert_eq!(*order.lock().unwrap(), ["high", "low"], "the higher priority finished first");
    assert_eq!(low_tokens, uninterrupted, "the preempted sequence resumed exactly");
    assert!(metrics_text(&engine).contains("vllm:num_preemptions_total{model_name=\"tiny\",engine=\"0\"} 1"));
}

/// (cached prompt tokens, generated tokens) of a request.
async fn cached_and_tokens(mut rx: tokio::sync::mpsc::UnboundedReceiver<InferEvent>) -> (usize, Vec<u32>) {
    let mut cached = None;
    let mut out = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            InferEvent::Started { cached_tokens } => cached = Some(cached_tokens),
            InferEvent::Token { token_id, .. } => out.push(token_id),
            InferEvent::Finished { .. } => return (cached.expect("Started first"), out),
            InferEvent::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    panic!("no Finished event")
}

/// The prefix cache works at token granularity, isolates salts, and a hit computes the same
/// tokens as a miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_hits_reuse_every_shared_token_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let mut engine = Engine::new();
    engine.add_path("tiny", &gguf, Default::default(), EngineConfig::default()).unwrap();
    let e = &engine.models()[0];
    let prompt = e.tokenize("a shared prompt of some length", false).unwrap();
    let salted = |p: &[u32], salt: &str| GenerateRequest { cache_salt: Some(salt.into()), ..request(p, 10, None) };

    let (first_cached, first) = cached_and_tokens(submit(e, request(&prompt, 10, None)).unwrap()).await;
    assert_eq!(first_cached, 0);
    // The same prompt again: all but the last token (whose logits are needed) come from cache.
    let (again_cached, again) = cached_and_tokens(submit(e, request(&prompt, 10, None)).unwrap()).await;
    assert_eq!((again_cached, &again), (prompt.len() - 1, &first));
    // Another entity shares nothing, even with the exact same prompt (no cross-tenant oracle).
    let other_tenant = GenerateRequest { tenant: "b".into(), ..request(&prompt, 10, None) };
    let (tenant_cached, for_b) = cached_and_tokens(submit(e, other_tenant).unwrap()).await;
    assert_eq!((tenant_cached, &for_b), (0, &first));
    // Another salt shares nothing, and computes the same output from scratch.
    let (salt_cached, with_salt) = cached_and_tokens(submit(e, salted(&prompt, "s1")).unwrap()).await;
    assert_eq!((salt_cached, &with_salt), (0, &first));
    // A prompt sharing 11 tokens (not a multiple of any block size) reuses exactly those.
    let mut fork = prompt[..11].to_vec();
    fork.extend(e.tokenize(" then it differs", false).unwrap());
    let (fork_cached, fork_out) = cached_and_tokens(submit(e, request(&fork, 10, None)).unwrap()).await;
    let (_, fork_fresh) = cached_and_tokens(submit(e, salted(&fork, "s2")).unwrap()).await;
    assert_eq!((fork_cached, &fork_out), (11, &fork_fresh));
}

/// The queue bound is taken at submission; a beam search's per-step requests take no place (the
/// search was admitted once, as one request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beam_steps_take_no_queue_place() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let mut engine = Engine::new();
    engine
        .add_path("tiny", &gguf, Default::default(), EngineConfig { max_waiting: 0, ..EngineConfig::default() })
        .unwrap();
    let m = &engine.models()[0];
    let prompt = [1, 2, 3];
    assert!(!m.has_capacity());
    assert!(matches!(submit(m, request(&prompt, 2, None)), Err(SubmitError::Overloaded)));
    let step = GenerateRequest { beam_step: true, ..request(&prompt, 2, None) };
    assert_eq!(tokens(submit(m, step).unwrap()).await.len(), 2);
}

/// The `n` choices of a request share its prompt's KV copy-on-write: four choices of a
/// 3,000-token prompt start within a budget of 8,192 positions that four copies (12,004) would
/// overflow, nothing is preempted, and every greedy choice equals the same prompt run alone
/// (their attention reads the shared tiles, then their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choices_share_the_prompt_kv() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let mut engine = Engine::new();
    // The smallest budget: one full context (8,192 positions on the tiny model).
    engine
        .add_path("tiny", &gguf, Default::default(), EngineConfig { kv_cache_bytes: 1, ..EngineConfig::default() })
        .unwrap();
    let m = &engine.models()[0];
    let prompt: Vec<u32> = (0..3000).map(|i| 1 + (i * 7 % 50) as u32).collect();
    let alone =
        tokens(submit(m, GenerateRequest { cache_salt: Some("alone".into()), ..request(&prompt, 6, None) }).unwrap())
            .await;
    assert_eq!(alone.len(), 6);
    let mut rx = submit(m, GenerateRequest { n: 4, ..request(&prompt, 6, None) }).unwrap();
    let mut per_choice = vec![Vec::new(); 4];
    let mut finished = 0;
    while let Some(ev) = rx.recv().await {
        match ev {
            InferEvent::Token { choice, token_id, .. } => per_choice[choice].push(token_id),
            InferEvent::Finished { .. } => finished += 1,
            InferEvent::Error(e) => panic!("{e}"),
            _ => {}
        }
        if finished == 4 {
            break;
        }
    }
    for (c, got) in per_choice.iter().enumerate() {
        assert_eq!(got, &alone, "choice {c}");
    }
    let metrics = metrics_text(&engine);
    assert!(metrics.contains("vllm:num_preemptions_total{model_name=\"tiny\",engine=\"0\"} 0"), "{metrics}");
}

/// `prepare` (what the api calls on a blocking thread before submitting) loads the adapter and
/// caches it; a load that fails is not cached, so the checkpoint loads once its files are there;
/// loads of one checkpoint hold up no other; `submit` itself never reads a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_load_before_submit_and_failures_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let mut engine = Engine::new();
    engine.add_path("tiny", &gguf, Default::default(), EngineConfig::default()).unwrap();
    let m = engine.models()[0].clone();
    let prompt = [1, 2, 3, 4];
    let late = AdapterRef {
        checkpoint_id: "late".into(),
        name: "late".into(),
        owner: "e".into(),
        path: dir.path().join("late"),
        confined_to: None,
    };
    let err = m.prepare(request(&prompt, 4, Some(late.clone()))).unwrap_err();
    assert!(matches!(err, SubmitError::Invalid(_)), "no files yet: {err:?}");
    write_adapter(&dir.path().join("late"), 0.5);
    let prepared = m.prepare(request(&prompt, 4, Some(late.clone()))).unwrap();
    // Loaded: removing the files changes nothing for the prepared request or later ones.
    std::fs::remove_dir_all(dir.path().join("late")).unwrap();
    let with = tokens(m.submit(prepared).unwrap()).await;
    assert_eq!(tokens(submit(&m, request(&prompt, 4, Some(late))).unwrap()).await, with);
    assert_ne!(tokens(submit(&m, request(&prompt, 4, None)).unwrap()).await, with, "the adapter changes the output");
    // Many checkpoints loading at once, from several threads, all succeed.
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let path = dir.path().join(format!("c{i}"));
            write_adapter(&path, 0.1 * i as f32);
            let (m, prompt) = (m.clone(), prompt.to_vec());
            let adapter = AdapterRef {
                checkpoint_id: format!("c{i}"),
                name: format!("c{i}"),
                owner: "e".into(),
                path,
                confined_to: None,
            };
            std::thread::spawn(move || m.prepare(request(&prompt, 4, Some(adapter))).map(|_| ()))
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    // A request prepared by another served model is refused, not run.
    let mut two = Engine::new();
    two.add_path("other", &gguf, Default::default(), EngineConfig::default()).unwrap();
    let foreign = two.models()[0].prepare(request(&prompt, 4, None)).unwrap();
    assert!(matches!(m.submit(foreign), Err(SubmitError::Invalid(_))));
}

/// One unlabelled series' value in the metrics text.
fn metric(text: &str, name: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}: {text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The adapter cache holds loaded adapters within its byte budget (`--adapter-cache-mib`): with
/// room for both, two checkpoints used in turn are each read from disk once; with room for less
/// than one, the one in use stays and the other goes, so each turn reads again, and the bytes
/// held are one adapter's (`tandem:lora_adapter_loads_total`, `tandem:lora_adapter_cache_bytes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adapter_cache_is_bounded_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let refs: Vec<AdapterRef> = (0..2)
        .map(|i| {
            let path = dir.path().join(format!("a{i}"));
            write_adapter(&path, 0.1 * (i + 1) as f32);
            AdapterRef {
                checkpoint_id: format!("a{i}"),
                name: format!("a{i}"),
                owner: "e".into(),
                path,
                confined_to: None,
            }
        })
        .collect();
    let mut held_one = 0.0;
    for (budget, reads) in [(None, 2.0), (Some(1), 6.0)] {
        let mut engine = Engine::new();
        engine.add_path("tiny", &gguf, Default::default(), EngineConfig::default()).unwrap();
        if let Some(bytes) = budget {
            engine.set_adapter_cache_bytes(bytes);
        }
        let m = engine.models()[0].clone();
        for turn in 0..6 {
            let adapter = refs[turn % 2].clone();
            tokens(submit(&m, request(&[1, 2, 3], 2, Some(adapter))).unwrap()).await;
            if turn == 0 {
                held_one = metric(&metrics_text(&engine), "tandem:lora_adapter_cache_bytes");
            }
        }
        let text = metrics_text(&engine);
        assert_eq!(metric(&text, "tandem:lora_adapter_loads_total"), reads, "budget {budget:?}");
        let held = metric(&text, "tandem:lora_adapter_cache_bytes");
        assert!(held_one > 0.0);
        assert_eq!(held, if budget.is_some() { held_one } else { 2.0 * held_one }, "budget {budget:?}");
    }
}

/// The cache's budget is shared between entities: another entity rotating more adapters than
/// the cache holds takes back its own, not the victim's (with one least-recently-used order the
/// victim's adapter, the oldest, was the first to go and was read again on its next request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_entitys_adapter_rotation_does_not_evict_anothers() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let adapter = |id: &str, owner: &str, b: f32| {
        let path = dir.path().join(id);
        write_adapter(&path, b);
        AdapterRef { checkpoint_id: id.into(), name: id.into(), owner: owner.into(), path, confined_to: None }
    };
    let victim = adapter("v", "victim", 0.3);
    let rotation: Vec<AdapterRef> =
        (0..4).map(|i| adapter(&format!("a{i}"), "attacker", 0.1 * (i + 1) as f32)).collect();
    let mut engine = Engine::new();
    engine.add_path("tiny", &gguf, Default::default(), EngineConfig::default()).unwrap();
    let m = engine.models()[0].clone();
    tokens(submit(&m, request(&[1, 2, 3], 2, Some(victim.clone()))).unwrap()).await;
    let one = metric(&metrics_text(&engine), "tandem:lora_adapter_cache_bytes");
    assert!(one > 0.0);
    // Room for two and a half adapters (all are the same size).
    engine.set_adapter_cache_bytes((2.5 * one) as usize);
    for turn in 0..6 {
        tokens(submit(&m, request(&[1, 2, 3], 2, Some(rotation[turn % 4].clone()))).unwrap()).await;
    }
    let text = metrics_text(&engine);
    assert_eq!(metric(&text, "tandem:lora_adapter_loads_total"), 7.0, "every turn of the rotation reads");
    tokens(submit(&m, request(&[1, 2, 3], 2, Some(victim))).unwrap()).await;
    let text = metrics_text(&engine);
    assert_eq!(metric(&text, "tandem:lora_adapter_loads_total"), 7.0, "the victim's adapter was still held");
    assert_eq!(metric(&text, "tandem:lora_adapter_cache_bytes"), 2.0 * one);
}

/// Target logprobs and alternative draws come from the same rows as the prompt logprobs: a
/// target naming the prompt's own token scores what its prompt logprob says, a greedy draw is
/// the top-ranked token, and seeded draws repeat; the sampled tokens do not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_scoring_answers_from_the_prefill_rows() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf);
    let mut engine = Engine::new();
    engine.add_path("tiny", &gguf, Default::default(), EngineConfig::default()).unwrap();
    let e = &engine.models()[0];
    let prompt = e.tokenize("score every position", false).unwrap();
    let rows = prompt.len() - 1;
    let scored = |alt_k: usize, temperature: f32, seed: Option<u64>| {
        let mut r = request(&prompt, 4, None);
        r.params.seed = seed;
        r.prompt_logprobs = Some(1);
        // Row i names the prompt token it scores and token 0; the last row names nothing.
        let mut targets: Vec<Vec<u32>> = (0..rows).map(|i| vec![prompt[i + 1], 0]).collect();
        targets[rows - 1].clear();
        r.prompt_scoring = Some(Box::new(PromptScoring { targets, alt_k, temperature }));
        r
    };
    let run = |r: GenerateRequest| async {
        let mut rx = submit(e, r).unwrap();
        let (mut scores, mut lps, mut out) = (None, None, Vec::new());
        while let Some(ev) = rx.recv().await {
            match ev {
                InferEvent::PromptScores(s) => {
                    assert!(lps.is_none(), "scores come before the prompt logprobs");
                    scores = Some(s)
                }
                InferEvent::PromptLogprobs(p) => lps = Some(p),
                InferEvent::Token { token_id, .. } => out.push(token_id),
                InferEvent::Finished { .. } => break,
                InferEvent::Error(m) => panic!("{m}"),
                _ => {}
            }
        }
        (scores.expect("scores"), lps.expect("prompt logprobs"), out)
    };
    let (greedy, lps, out) = run(scored(3, 0.0, None)).await;
    assert_eq!((greedy.targets.len(), greedy.alt.len()), (rows, rows));
    for i in 0..rows {
        let ranked = lps[i + 1].as_ref().unwrap();
        if i + 1 < rows {
            assert_eq!(greedy.targets[i].len(), 2);
            assert!((greedy.targets[i][0] - ranked[0].logprob).abs() < 1e-6, "row {i}");
            assert!(greedy.targets[i][1] <= 0.0);
        } else {
            assert!(greedy.targets[i].is_empty());
        }
        let best = ranked.iter().find(|r| r.rank == 1).expect("top-1 listed");
        assert_eq!(greedy.alt[i], vec![(best.token_id, best.logprob); 3], "row {i}");
    }
    assert_eq!(out, tokens(submit(e, request(&prompt, 4, None)).unwrap()).await, "sampling is unchanged");
    let (a, _, _) = run(scored(4, 1.0, Some(11))).await;
    let (b, _, _) = run(scored(4, 1.0, Some(11))).await;
    assert_eq!(a.alt, b.alt, "seeded draws repeat");
    assert!(a.alt.iter().all(|r| r.len() == 4 && r.iter().all(|(_, lp)| *lp <= 0.0)));
}
