use super::*;

fn entry() -> Arc<ModelEntry> {
    Arc::new(ModelEntry::new(RunId::new("s", 0).unwrap(), "a", "m", 8, "r", uuid::Uuid::nil()))
}

type State = Registry<()>;

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
    let state = State::default();
    for _ in 0..MAX_FUTURES_PER_ENTITY {
        let (id, promise) = state.future("a", "s").unwrap();
        promise.set(Outcome::Json(serde_json::json!({})));
        assert!(state.wait("a", &id, Duration::ZERO).await.unwrap().is_some());
    }
    let mut pending = Vec::new();
    for _ in 0..MAX_FUTURES_PER_ENTITY {
        pending.push(state.future("a", "s").expect("fetched results do not count"));
    }
    assert!(state.future("a", "s").is_err(), "unfetched ones do");
    assert!(state.future("b", "s").is_ok(), "per entity");
    let (id, promise) = pending.pop().unwrap();
    drop(pending);
    promise.set(Outcome::user(format!("loss_fn_config {:?}", "k".repeat(10 << 20))));
    let got = state.wait("a", &id, Duration::ZERO).await.unwrap().unwrap();
    let Outcome::Failed { error, .. } = &*got else { panic!("{got:?}") };
    assert!(error.len() < MAX_ERROR_BYTES + 32 && error.ends_with("(cut)"), "{}", error.len());
}

/// The per-entity model cap is checked and taken in one step.
#[test]
fn model_places_are_taken_atomically() {
    let state = State::default();
    let places: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16).map(|_| s.spawn(|| state.reserve_model("a"))).collect();
        handles.into_iter().filter_map(|h| h.join().unwrap().ok()).collect()
    });
    assert_eq!(places.len(), MAX_MODELS_PER_ENTITY);
    assert!(state.reserve_model("b").is_ok());
    drop(places);
    assert!(state.reserve_model("a").is_ok(), "given back when dropped");
}

#[test]
fn queued_bytes_are_bounded_per_entity() {
    let state = State::default();
    let first = state.queue_bytes("a", MAX_QUEUED_BYTES_PER_ENTITY - 10).unwrap();
    assert!(state.queue_bytes("a", 11).is_err());
    let small = state.queue_bytes("a", 10).unwrap();
    assert!(state.queue_bytes("b", MAX_QUEUED_BYTES_PER_ENTITY * 2).is_ok(), "a lone call always fits");
    drop((first, small));
    assert!(state.queue_bytes("a", MAX_QUEUED_BYTES_PER_ENTITY).is_ok());
}

#[tokio::test]
async fn futures_are_per_entity_and_complete_once() {
    let state = State::default();
    let (id, promise) = state.future("a", "s").unwrap();
    assert!(state.wait("b", &id, Duration::ZERO).await.is_err(), "another entity's future is unknown");
    assert!(state.wait("a", &id, Duration::from_millis(10)).await.unwrap().is_none(), "pending");
    promise.set(Outcome::Json(serde_json::json!({"ok": 1})));
    let got = state.wait("a", &id, Duration::from_secs(1)).await.unwrap().unwrap();
    assert!(matches!(&*got, Outcome::Json(v) if v["ok"] == 1));
    // A promise dropped unset fails its future rather than leaving it pending forever.
    let (id, promise) = state.future("a", "s").unwrap();
    drop(promise);
    let got = state.wait("a", &id, Duration::from_secs(1)).await.unwrap().unwrap();
    assert!(matches!(&*got, Outcome::Failed { category: Category::Server, .. }));
}

async fn outcome(state: &State, accepted: &Accepted) -> Arc<Outcome> {
    state.wait("a", &accepted.request_id, Duration::from_secs(5)).await.unwrap().expect("answered")
}

/// The service's order end to end: calls run in `seq_id` order whatever order they arrive in,
/// a refused call consumes its `seq_id` at once (issue 50: it had wedged the model), a retry
/// gets the first call's future, an old `seq_id` is the caller's mistake, and a released
/// model's waiting calls fail.
#[tokio::test]
async fn calls_are_accepted_refused_and_run_in_order() {
    let state = State::new(Waits { seq_gap: Duration::from_secs(30), ..Waits::default() });
    let m = entry();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let work = |n: u64| {
        let ran = ran.clone();
        move || {
            ran.lock().unwrap().push(n);
            Outcome::Json(serde_json::json!({ "n": n }))
        }
    };
    let third = state.accept_blocking(m.clone(), 3, work(3)).unwrap();
    let refused = state.refuse(m.clone(), 2, "bad loss".into()).unwrap();
    let first = state.accept_blocking(m.clone(), 1, work(1)).unwrap();
    assert_eq!(state.accept_blocking(m.clone(), 1, work(99)).unwrap(), first, "a retry is the same call");
    assert!(matches!(&*outcome(&state, &third).await, Outcome::Json(v) if v["n"] == 3));
    assert_eq!(*ran.lock().unwrap(), vec![1, 3]);
    assert!(
        matches!(&*outcome(&state, &refused).await, Outcome::Failed { category: Category::User, error } if error == "bad loss")
    );
    let old = state.accept_blocking(m.clone(), 0, work(0));
    assert!(matches!(old, Err(TinkerError::User(e)) if e.contains("already run")), "the creation is seq_id 0");

    // Released while a call waits at a gap: it fails at once, not after the gap's limit.
    let waiting = state.accept_blocking(m.clone(), 5, work(5)).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    m.release();
    let got = outcome(&state, &waiting).await;
    assert!(matches!(&*got, Outcome::Failed { error, .. } if error.contains("released")), "{got:?}");
    assert_eq!(*ran.lock().unwrap(), vec![1, 3]);
}

/// Sessions, their models and samplers end together; another entity's are not found.
#[test]
fn sessions_own_their_models_and_samplers() {
    struct Sampler(&'static str);
    impl Owned for Sampler {
        fn entity(&self) -> &str {
            self.0
        }
    }
    let state = Registry::<Sampler>::default();
    let session = state.create_session("a").unwrap();
    let run = RunId::new(&session, 0).unwrap();
    assert!(state.enter_model(Arc::new(ModelEntry::new(run.clone(), "a", "m", 8, "r", uuid::Uuid::nil()))));
    let stray = RunId::new("tandem-gone", 0).unwrap();
    assert!(
        !state.enter_model(Arc::new(ModelEntry::new(stray, "a", "m", 8, "r", uuid::Uuid::nil()))),
        "no such session"
    );
    state.add_sampler(format!("{session}:sample:0"), Sampler("a")).unwrap();
    assert!(state.model("b", &run).is_none() && state.sampler("b", &format!("{session}:sample:0")).is_none());
    assert!(state.model_named("a", &run.to_string()).is_some());
    assert!(matches!(state.finish("b", &session), Err(TinkerError::NotFound(_))));
    let ended = state.finish("a", &session).unwrap();
    assert_eq!((ended.sessions, ended.models), (vec![session.clone()], vec![run.clone()]));
    assert!(state.model("a", &run).is_none() && state.sampler("a", &format!("{session}:sample:0")).is_none());
    for _ in 0..MAX_SESSIONS_PER_ENTITY {
        state.create_session("c").unwrap();
    }
    assert!(matches!(state.create_session("c"), Err(TinkerError::Busy(_))));
}

/// A session taken over from a stopped node keeps its id, says it was taken over, and its
/// rebuilt model's order starts at the first call that arrives; futures name their session.
#[tokio::test]
async fn an_adopted_session_keeps_its_id_and_resumes_its_order() {
    let state = Registry::<()>::default();
    assert!(state.adopt_session("a", "tandem-old"));
    assert!(!state.adopt_session("a", "tandem-old"), "once");
    assert_eq!(state.session("a", "tandem-old"), Some(true));
    assert_eq!(state.session("b", "tandem-old"), None, "another entity's is none");
    let fresh = state.create_session("a").unwrap();
    assert_eq!(state.session("a", &fresh), Some(false));

    let run = RunId::new("tandem-old", 0).unwrap();
    let model = Arc::new(ModelEntry::new(run.clone(), "a", "m", 8, "", uuid::Uuid::nil()).resumed());
    assert!(state.enter_model(model.clone()));
    let accepted = state.accept(model.clone(), 57, async { Outcome::Json(serde_json::json!({"ok": 57})) }).unwrap();
    assert!(accepted.request_id.starts_with("tandem-old:req:"), "{}", accepted.request_id);
    let done = state.wait("a", &accepted.request_id, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(done.as_deref(), Some(Outcome::Json(_))), "seq 57 ran without waiting for 1..56");
    assert!(state.accept(model, 3, async { Outcome::Json(serde_json::json!({})) }).is_err(), "before the resume");
}
