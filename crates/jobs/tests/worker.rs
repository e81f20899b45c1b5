//! The worker's side of the job state machine, driven by scripted trainers (test doubles that
//! stand in for the real trainer, which is not part of this crate).

use serde_json::{json, Map};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tandem_core::records::{JobKind, JobStatus, Order, PageRequest};
use tandem_jobs::{TrainError, TrainJob, TrainOutput, TrainSink, Trainer, Worker, WorkerConfig};
use tandem_store::{CheckpointDir, Checkpoints, Lease, NewJob, NewModel, Reclaim, SqliteStore, Store};
use uuid::Uuid;

/// What a scripted trainer does.
#[derive(Clone, Copy)]
enum Script {
    /// Two gradient steps, then adapter files.
    Succeed,
    /// Starts, then waits for should_stop() to say stop.
    WaitForStop,
    /// Refuses the input.
    Invalid,
}

struct Scripted {
    script: Script,
    seen: Mutex<Vec<(i64, bool)>>, // (base_step, had base checkpoint dir)
}

impl Trainer for Scripted {
    fn train(&self, job: &TrainJob, sink: &mut dyn TrainSink) -> Result<TrainOutput, TrainError> {
        self.seen.lock().unwrap().push((job.base_step, job.base_checkpoint.as_ref().is_some_and(|p| p.is_dir())));
        match self.script {
            Script::Succeed => {
                sink.started(2, Map::from_iter([("num_trajectories".to_string(), json!(4))]));
                for i in 0..2 {
                    sink.gradient_step(BTreeMap::from([
                        ("loss".into(), 0.5 - i as f64 * 0.1),
                        ("grad_norm".into(), f64::NAN),
                    ]));
                }
                let files = vec![("adapter_config.json".to_string(), b"{\"r\": 8}".to_vec())];
                Ok(TrainOutput { files, metrics: BTreeMap::from([("train/loss".into(), 0.45)]) })
            }
            Script::WaitForStop => {
                sink.started(100, Map::new());
                for _ in 0..500 {
                    if let Some(stop) = sink.should_stop() {
                        return Err(stop);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(TrainError::Failed("never told to stop".into()))
            }
            Script::Invalid => Err(TrainError::Invalid("trajectory 0 has no token ids".into())),
        }
    }
}

struct Fixture {
    store: Arc<SqliteStore>,
    checkpoints: CheckpointDir,
    model_id: Uuid,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("t.db")).await.unwrap());
    let checkpoints = CheckpointDir::open(dir.path().join("checkpoints")).unwrap();
    let new = NewModel { entity: "e".into(), project: "p".into(), name: "m".into(), base_model: "b".into() };
    let (model, _) = store.create_model(&new, false).await.unwrap();
    Fixture { store, checkpoints, model_id: model.id, _dir: dir }
}

impl Fixture {
    fn worker(&self, script: Script) -> (Worker, Arc<Scripted>) {
        let trainer = Arc::new(Scripted { script, seen: Mutex::default() });
        let store = self.store.clone() as Arc<dyn Store>;
        (
            Worker::new(store, Checkpoints::local(self.checkpoints.clone()), trainer.clone(), WorkerConfig::default()),
            trainer,
        )
    }

    async fn queue(&self) -> Uuid {
        let config = serde_json::to_value(tandem_core::train_config::TrainConfig::default()).unwrap();
        let new = NewJob { model_id: self.model_id, kind: JobKind::Rl, config, inputs: json!([]), rollout: None };
        self.store.create_job(&new).await.unwrap().id
    }

    /// Waits for the job's `training_started` event, not just `running`: the claim sets the status
    /// before the trainer's thread has run, and a job stopped in between has no events (it simply
    /// runs again, without a `training_restarted`), which is not what these tests are about.
    async fn wait_started(&self, job: Uuid) {
        while !self.events(job).await.iter().any(|(k, _)| k == "training_started") {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(self.store.get_job("e", job).await.unwrap().status, JobStatus::Running);
    }

    async fn events(&self, job: Uuid) -> Vec<(String, serde_json::Value)> {
        let page = PageRequest { after: None, limit: 100, order: Order::Asc };
        let events = self.store.list_events("e", job, page).await.unwrap();
        events.items.into_iter().map(|e| (e.kind.as_str().to_string(), e.data)).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_job_records_its_checkpoint_before_training_ended() {
    let f = fixture().await;
    let (worker, trainer) = f.worker(Script::Succeed);
    let job = f.queue().await;
    assert!(worker.run_once().await.unwrap());
    let events = f.events(job).await;
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, vec!["training_started", "gradient_step", "gradient_step", "training_ended"]);
    assert_eq!(events[0].1, json!({"num_trajectories": 4, "num_sequences": 2}));
    assert_eq!(events[1].1, json!({"loss": 0.5}), "non-finite values are dropped, never sent as null");
    assert_eq!(events[3].1, json!({"step": 1}));
    let done = f.store.get_job("e", job).await.unwrap();
    assert_eq!((done.status, done.step), (JobStatus::Succeeded, Some(1)));
    let cp = f.store.get_checkpoint(f.model_id, 1).await.unwrap();
    assert_eq!(cp.metrics["train/loss"], 0.45);
    let files = f.checkpoints.resolve(&cp.path).unwrap();
    assert_eq!(std::fs::read(files.join("adapter_config.json")).unwrap(), b"{\"r\": 8}");

    // The next job continues from the latest checkpoint and produces latest + 1.
    let job2 = f.queue().await;
    assert!(worker.run_once().await.unwrap());
    assert_eq!(f.store.get_job("e", job2).await.unwrap().step, Some(2));
    assert_eq!(*trainer.seen.lock().unwrap(), vec![(0, false), (1, true)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_stops_when_cancelled() {
    let f = fixture().await;
    let (worker, _) = f.worker(Script::WaitForStop);
    let job = f.queue().await;
    let run = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await }
    });
    f.wait_started(job).await;
    f.store.cancel_job("e", job).await.unwrap();
    assert!(run.await.unwrap().unwrap());
    assert_eq!(f.store.get_job("e", job).await.unwrap().status, JobStatus::Cancelled);
    let kinds: Vec<String> = f.events(job).await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, vec!["training_started", "training_failed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_the_job_for_recovery() {
    let f = fixture().await;
    let (worker, _) = f.worker(Script::WaitForStop);
    let job = f.queue().await;
    let run = tokio::spawn(worker.clone().run());
    f.wait_started(job).await;
    worker.stop();
    run.await.unwrap();
    assert_eq!(f.store.get_job("e", job).await.unwrap().status, JobStatus::Running);

    // Stopping ended its lease: any trainer sharing the store takes it back now, not a lease later.
    let r = f.store.recover_interrupted_jobs(3, Reclaim::Expired).await.unwrap();
    assert_eq!(r.requeued, vec![job]);
    let (next, _) = f.worker(Script::Succeed);
    next.recover().await.unwrap();
    assert!(next.run_once().await.unwrap());
    let kinds: Vec<String> = f.events(job).await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        kinds,
        vec![
            "training_started",
            "training_restarted",
            "training_started",
            "gradient_step",
            "gradient_step",
            "training_ended"
        ]
    );
}

/// A trainer whose job another trainer re-claimed (its lease ran out while it was cut off) learns
/// it at its next renewal, stops, and writes nothing more: the job stays the other trainer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_that_loses_its_lease_stops_and_writes_nothing() {
    let f = fixture().await;
    let trainer = Arc::new(Scripted { script: Script::WaitForStop, seen: Mutex::default() });
    let config = WorkerConfig { lease_ttl: Duration::from_millis(300), ..WorkerConfig::default() };
    let worker =
        Worker::new(f.store.clone() as Arc<dyn Store>, Checkpoints::local(f.checkpoints.clone()), trainer, config);
    let job = f.queue().await;
    let run = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await }
    });
    while f.events(job).await.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // What another trainer does once the lease has run out: re-queue, then claim.
    f.store.recover_interrupted_jobs(3, Reclaim::All).await.unwrap();
    let other = Lease { owner: "other".into(), ttl_ms: 60_000 };
    assert_eq!(f.store.claim_next_job(&other).await.unwrap().unwrap().job.id, job);
    assert!(run.await.unwrap().unwrap());
    let done = f.store.get_job("e", job).await.unwrap();
    assert_eq!((done.status, done.attempts), (JobStatus::Running, 2));
    let kinds: Vec<String> = f.events(job).await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, vec!["training_started", "training_restarted"], "nothing from the first trainer after");
    assert!(f.store.live_checkpoint_paths().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_error_fails_the_job_with_its_message() {
    let f = fixture().await;
    let (worker, _) = f.worker(Script::Invalid);
    let job = f.queue().await;
    worker.run_once().await.unwrap();
    let done = f.store.get_job("e", job).await.unwrap();
    assert_eq!(done.status, JobStatus::Failed);
    assert_eq!(done.error_message.as_deref(), Some("trajectory 0 has no token ids"));
    let events = f.events(job).await;
    assert_eq!(events[0], ("training_started".to_string(), json!({"num_sequences": 0})));
    assert_eq!(events[1].1, json!({"error_message": "trajectory 0 has no token ids"}));
}

/// A checkpoint that cannot be written (here its model directory is a file, as a full disk would
/// refuse it) ends the job at once with `training_failed`, leaves no files, and the model's next
/// job runs normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_cannot_be_written_fails_the_job_and_frees_the_model() {
    let f = fixture().await;
    let (worker, _) = f.worker(Script::Succeed);
    let blocker = f.checkpoints.root().join(f.model_id.to_string());
    std::fs::write(&blocker, b"not a directory").unwrap();
    let job = f.queue().await;
    assert!(worker.run_once().await.unwrap());
    let done = f.store.get_job("e", job).await.unwrap();
    assert_eq!(done.status, JobStatus::Failed);
    assert!(done.error_message.as_deref().unwrap_or("").starts_with("internal error"), "{:?}", done.error_message);
    let kinds: Vec<String> = f.events(job).await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds.first().map(String::as_str), Some("training_started"));
    assert_eq!(kinds.last().map(String::as_str), Some("training_failed"));
    assert_eq!(f.store.latest_step(f.model_id).await.unwrap(), 0, "no checkpoint was recorded");

    std::fs::remove_file(&blocker).unwrap();
    let next = f.queue().await;
    assert!(worker.run_once().await.unwrap());
    assert_eq!(f.store.get_job("e", next).await.unwrap().step, Some(1));
}

/// Runs gradient steps of 20 ms (as many as the job's learning rate says), logging each as
/// ("entity/model", step).
struct Stepper {
    log: Arc<Mutex<Vec<(String, usize)>>>,
}

impl Trainer for Stepper {
    fn train(&self, job: &TrainJob, sink: &mut dyn TrainSink) -> Result<TrainOutput, TrainError> {
        let steps = match &job.task {
            tandem_jobs::TrainTask::Rl { config, .. } => config.learning_rate.round() as usize,
            tandem_jobs::TrainTask::Sft { .. } => 1,
        };
        sink.started(steps as u64, Map::new());
        for i in 0..steps {
            if let Some(stop) = sink.should_stop() {
                return Err(stop);
            }
            self.log.lock().unwrap().push((format!("{}/{}", job.model.entity, job.model.name), i));
            std::thread::sleep(Duration::from_millis(20));
            sink.gradient_step(BTreeMap::from([("loss".into(), 0.1)]));
        }
        Ok(TrainOutput { files: vec![("adapter_config.json".to_string(), b"{}".to_vec())], metrics: BTreeMap::new() })
    }
}

/// Another entity's small job starts within a step or two of a long one's (it does not wait
/// for the long job to end), the two alternate at step boundaries, and both finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_two_entities_are_time_sliced_at_step_boundaries() {
    let f = fixture().await;
    let new = NewModel { entity: "v".into(), project: "p".into(), name: "m".into(), base_model: "b".into() };
    let (victim_model, _) = f.store.create_model(&new, false).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let trainer = Arc::new(Stepper { log: log.clone() });
    let store = f.store.clone() as Arc<dyn Store>;
    let worker = Worker::new(store, Checkpoints::local(f.checkpoints.clone()), trainer, WorkerConfig::default());
    // The "learning rate" is the job's number of steps (the stepper reads it so).
    let queue = |model_id: Uuid, steps: f64| {
        let config = tandem_core::train_config::TrainConfig { learning_rate: steps, ..Default::default() };
        let config = serde_json::to_value(config).unwrap();
        NewJob { model_id, kind: JobKind::Rl, config, inputs: json!([]), rollout: None }
    };
    let long = f.store.create_job(&queue(f.model_id, 40.0)).await.unwrap().id;
    // A job of another model of the same entity waits for the first: one job per entity.
    let new = NewModel { entity: "e".into(), name: "m2".into(), ..new };
    let (other_model, _) = f.store.create_model(&new, false).await.unwrap();
    let long2 = f.store.create_job(&queue(other_model.id, 2.0)).await.unwrap().id;
    let run = tokio::spawn(worker.clone().run());
    while log.lock().unwrap().len() < 3 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let short = f.store.create_job(&queue(victim_model.id, 3.0)).await.unwrap().id;
    let queued_at = log.lock().unwrap().len();
    worker.waker().notify_one();
    for job in [long, short, long2] {
        let entity = if job == short { "v" } else { "e" };
        while f.store.get_job(entity, job).await.unwrap().status != JobStatus::Succeeded {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    worker.stop();
    run.await.unwrap();
    let log = log.lock().unwrap().clone();
    let first_short = log.iter().position(|(e, _)| e == "v/m").unwrap();
    assert!(first_short <= queued_at + 3, "queued after step {queued_at}, first ran at {first_short}: {log:?}");
    let last_short = log.iter().rposition(|(e, _)| e == "v/m").unwrap();
    // The small job ran its three steps interleaved with the long one's, not after it.
    let long_steps_meanwhile = log[first_short..=last_short].iter().filter(|(e, _)| e == "e/m").count();
    assert!(long_steps_meanwhile <= 3, "{log:?}");
    assert_eq!(log.iter().filter(|(e, _)| e == "e/m").count(), 40, "{log:?}");
    assert!(
        log[last_short..].iter().filter(|(e, _)| e == "e/m").count() > 20,
        "the short job ended long before: {log:?}"
    );
    // e's other job ran only after its first ended.
    let last_long = log.iter().rposition(|(e, _)| e == "e/m").unwrap();
    let first_long2 = log.iter().position(|(e, _)| e == "e/m2").unwrap();
    assert!(first_long2 > last_long, "{log:?}");
    assert_eq!(log.iter().filter(|(e, _)| e == "e/m2").count(), 2);
}

/// A trainer whose state (a step counter) can be parked: it counts runs in memory and refuses
/// to step while parked.
struct Parker {
    log: Arc<Mutex<Vec<String>>>,
    in_memory: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

struct Counter {
    value: Option<u64>,
    path: Option<std::path::PathBuf>,
    in_memory: Arc<std::sync::atomic::AtomicUsize>,
}

impl tandem_jobs::Park for Counter {
    fn park(&mut self, path: &std::path::Path) -> Result<(), String> {
        let v = self.value.take().ok_or("parked twice")?;
        std::fs::write(path, v.to_string()).map_err(|e| e.to_string())?;
        self.path = Some(path.to_path_buf());
        self.in_memory.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn unpark(&mut self) -> Result<(), String> {
        let Some(path) = self.path.take() else { return Ok(()) };
        self.value = Some(std::fs::read_to_string(&path).unwrap().parse().unwrap());
        std::fs::remove_file(path).unwrap();
        self.in_memory.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

impl Trainer for Parker {
    fn train(&self, job: &TrainJob, sink: &mut dyn TrainSink) -> Result<TrainOutput, TrainError> {
        use std::sync::atomic::Ordering::SeqCst;
        let steps = match &job.task {
            tandem_jobs::TrainTask::Rl { config, .. } => config.learning_rate.round() as u64,
            tandem_jobs::TrainTask::Sft { .. } => 1,
        };
        self.in_memory.fetch_add(1, SeqCst);
        let mut state = Counter { value: Some(0), path: None, in_memory: self.in_memory.clone() };
        sink.started(steps, Map::new());
        let result = (|| {
            for _ in 0..steps {
                if let Some(stop) = sink.boundary(&mut state) {
                    return Err(stop);
                }
                self.most.fetch_max(self.in_memory.load(SeqCst), SeqCst);
                let v = state.value.as_mut().ok_or_else(|| TrainError::Failed("stepped while parked".into()))?;
                *v += 1;
                self.log.lock().unwrap().push(job.model.entity.clone());
                std::thread::sleep(Duration::from_millis(15));
                sink.gradient_step(BTreeMap::from([("loss".into(), 0.1)]));
            }
            Ok(state.value.unwrap_or(0))
        })();
        self.in_memory.fetch_sub(1, SeqCst);
        let counted = result?;
        let metrics = BTreeMap::from([("steps".to_string(), counted as f64)]);
        Ok(TrainOutput { files: vec![("adapter_config.json".to_string(), b"{}".to_vec())], metrics })
    }
}

/// With more entities than runs held in memory, a held job parks its state at a step boundary so
/// every entity's job gets the trainer within a few steps, never more states in memory than
/// the capacity, and each state comes back intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_beyond_the_held_runs_get_turns_by_parking() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let f = fixture().await;
    let park_dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (in_memory, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let trainer = Arc::new(Parker { log: log.clone(), in_memory: in_memory.clone(), most: most.clone() });
    let config = WorkerConfig {
        max_runs: 1,
        max_parked: 2,
        park_dir: Some(park_dir.path().to_path_buf()),
        ..WorkerConfig::default()
    };
    let store = f.store.clone() as Arc<dyn Store>;
    let worker = Worker::new(store, Checkpoints::local(f.checkpoints.clone()), trainer, config);
    let queue = |model_id: Uuid, steps: f64| {
        let config = tandem_core::train_config::TrainConfig { learning_rate: steps, ..Default::default() };
        let config = serde_json::to_value(config).unwrap();
        NewJob { model_id, kind: JobKind::Rl, config, inputs: json!([]), rollout: None }
    };
    let long = f.store.create_job(&queue(f.model_id, 30.0)).await.unwrap().id;
    let run = tokio::spawn(worker.clone().run());
    while log.lock().unwrap().len() < 3 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut shorts = Vec::new();
    for entity in ["v", "w"] {
        let new = NewModel { entity: entity.into(), project: "p".into(), name: "m".into(), base_model: "b".into() };
        let (model, _) = f.store.create_model(&new, false).await.unwrap();
        shorts.push((entity, f.store.create_job(&queue(model.id, 3.0)).await.unwrap().id));
    }
    let queued_at = log.lock().unwrap().len();
    worker.waker().notify_one();
    for (entity, job) in shorts.iter().copied().chain([("e", long)]) {
        while f.store.get_job(entity, job).await.unwrap().status != JobStatus::Succeeded {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let step = f.store.get_job(entity, job).await.unwrap().step.unwrap();
        let model = f.store.get_job(entity, job).await.unwrap().model_id;
        let cp = f.store.get_checkpoint(model, step).await.unwrap();
        let want = if job == long { 30.0 } else { 3.0 };
        assert_eq!(cp.metrics["steps"], want, "the state came back intact through parking");
    }
    worker.stop();
    run.await.unwrap();
    let log = log.lock().unwrap().clone();
    for (entity, _) in &shorts {
        let first = log.iter().position(|e| e == entity).unwrap();
        // A step or two of the long job while the claims land, and the other newcomer's first
        // step, before each.
        assert!(first <= queued_at + 5, "{entity} queued after step {queued_at}, first ran at {first}: {log:?}");
    }
    assert_eq!(most.load(SeqCst), 1, "more states in memory than --max-training-runs");
    assert!(worker.metrics().parked_count() > 0, "nobody parked: {log:?}");
    assert_eq!(std::fs::read_dir(park_dir.path()).unwrap().count(), 0, "parked files left behind");
}
