use super::*;

fn entry() -> Arc<ModelEntry> {
    Arc::new(ModelEntry {
        entity: "a".into(),
        session_id: "s".into(),
        base_model: "m".into(),
        rank: 8,
        create_request: "r".into(),
        order: Mutex::default(),
        moved: watch::channel(0).0,
        released: Default::default(),
        record_id: uuid::Uuid::nil(),
        samplers: Mutex::default(),
        pending: Mutex::default(),
        inflight: Arc::default(),
    })
}

fn receive(m: &ModelEntry, seq: i64) {
    m.order().arrive(seq, &format!("req-{seq}"));
    m.bump();
}

/// Only a gap is timed: a call whose predecessors all arrived waits for them as long as they
/// run; one past a gap gives up after the limit, naming the missing seq_id, and the order
/// moves past both, so the next call runs (issue 50: it had waited forever).
#[tokio::test]
async fn calls_wait_their_turn_and_only_gaps_time_out() {
    let limit = Duration::from_millis(100);
    let m = entry();
    for s in [1, 2, 3] {
        receive(&m, s);
    }
    let behind = tokio::spawn({
        let m = m.clone();
        async move { m.wait_turn(3, limit).await }
    });
    tokio::time::sleep(limit * 3).await;
    assert!(!behind.is_finished(), "it waits for 1 and 2 to run, untimed");
    m.finish(1);
    m.finish(2);
    assert_eq!(behind.await.unwrap(), Waited::Run);
    m.finish(3);

    receive(&m, 9);
    let started = Instant::now();
    assert_eq!(m.wait_turn(9, limit).await, Waited::GaveUp(4), "4 never came");
    assert!(started.elapsed() >= limit);
    receive(&m, 10);
    assert_eq!(m.wait_turn(10, limit).await, Waited::Run, "the order moved past 4..=9");

    let filled = tokio::spawn({
        let m = m.clone();
        async move { m.wait_turn(12, Duration::from_secs(30)).await }
    });
    receive(&m, 12);
    tokio::time::sleep(Duration::from_millis(20)).await;
    receive(&m, 11);
    m.finish(10);
    m.finish(11);
    assert_eq!(filled.await.unwrap(), Waited::Run);
}

/// Fetched results leave the cap (issue 50: a client that fetched everything got 429 at
/// call 9,999); a failed result keeps only an excerpt of what the client sent.
#[tokio::test]
async fn fetched_results_leave_the_cap_and_errors_are_excerpts() {
    let state = TinkerState::default();
    for _ in 0..MAX_FUTURES_PER_ENTITY {
        let (id, promise) = state.future("a").unwrap();
        promise.set(Outcome::Json(serde_json::json!({})));
        assert!(state.wait("a", &id, Duration::ZERO).await.unwrap().is_some());
    }
    let mut pending = Vec::new();
    for _ in 0..MAX_FUTURES_PER_ENTITY {
        pending.push(state.future("a").expect("fetched results do not count"));
    }
    assert!(state.future("a").is_none(), "unfetched ones do");
    assert!(state.future("b").is_some(), "per entity");
    let (id, promise) = pending.pop().unwrap();
    drop(pending);
    promise.set(Outcome::Failed { error: format!("loss_fn_config {:?}", "k".repeat(10 << 20)), category: "user" });
    let got = state.wait("a", &id, Duration::ZERO).await.unwrap().unwrap();
    let Outcome::Failed { error, .. } = &*got else { panic!("{got:?}") };
    assert!(error.len() < MAX_ERROR_BYTES + 32 && error.ends_with("(cut)"), "{}", error.len());
}

/// The per-entity model cap is checked and taken in one step.
#[test]
fn model_places_are_taken_atomically() {
    let state = Arc::new(TinkerState::default());
    let places: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16).map(|_| s.spawn(|| state.reserve_model("a"))).collect();
        handles.into_iter().filter_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(places.len(), MAX_MODELS_PER_ENTITY);
    assert!(state.reserve_model("b").is_some());
    drop(places);
    assert!(state.reserve_model("a").is_some(), "given back when dropped");
}

#[test]
fn queued_bytes_are_bounded_per_entity() {
    let state = Arc::new(TinkerState::default());
    let first = state.queue_bytes("a", MAX_QUEUED_BYTES_PER_ENTITY - 10).unwrap();
    assert!(state.queue_bytes("a", 11).is_none());
    let small = state.queue_bytes("a", 10).unwrap();
    assert!(state.queue_bytes("b", MAX_QUEUED_BYTES_PER_ENTITY * 2).is_some(), "a lone call always fits");
    drop((first, small));
    assert!(state.queue_bytes("a", MAX_QUEUED_BYTES_PER_ENTITY).is_some());
}

#[tokio::test]
async fn futures_are_per_entity_and_complete_once() {
    let state = TinkerState::default();
    let (id, promise) = state.future("a").unwrap();
    assert!(state.wait("b", &id, Duration::ZERO).await.is_err(), "another entity's future is unknown");
    assert!(state.wait("a", &id, Duration::from_millis(10)).await.unwrap().is_none(), "pending");
    promise.set(Outcome::Json(serde_json::json!({"ok": 1})));
    let got = state.wait("a", &id, Duration::from_secs(1)).await.unwrap().unwrap();
    assert!(matches!(&*got, Outcome::Json(v) if v["ok"] == 1));
    // A promise dropped unset fails its future rather than leaving it pending forever.
    let (id, promise) = state.future("a").unwrap();
    drop(promise);
    let got = state.wait("a", &id, Duration::from_secs(1)).await.unwrap().unwrap();
    assert!(matches!(&*got, Outcome::Failed { category: "server", .. }));
}
