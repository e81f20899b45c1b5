//! The continuous-batching loop of one base model, on its own thread.
//!
//! Each iteration: take new requests, drop abandoned ones (their receiver was dropped: the client
//! went away), let the pure scheduler pick this step's work, run one batched forward pass, then
//! sample, detokenize, check stops and send events per sequence. Requests join and leave between
//! steps; a request's n choices share one prefill and are forked from its KV cache.

use crate::metrics::EngineMetrics;
use crate::prefix::PrefixCache;
use crate::scheduler::{self, Budget, Running, Waiting};
use crate::sequence::{Seq, SeqId};
use crate::share;
use crate::tokenizer::TextTokenizer;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_core::inference::{GenerateRequest, InferEvent, LoraTag};
use tandem_model::kernels::team;
use tandem_model::{KvCache, Llama, LoraAdapter, SeqInput};
use tokio::sync::mpsc::UnboundedSender;

/// Limits of one engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// New tokens per step: decode tokens plus prefill chunks.
    pub step_tokens: usize,
    /// Sequences decoding at once.
    pub max_seqs: usize,
    /// Requests waiting for admission before new ones get 503.
    pub max_waiting: usize,
    /// Memory the running sequences' KV caches may use together, in bytes. Turned into
    /// positions per model by [`EngineConfig::kv_tokens`]; the default is a quarter of the
    /// machine's memory (the rest is for weights, prefix cache and the trainer).
    pub kv_cache_bytes: u64,
    /// Prompt positions kept for prefix reuse; `None`: as many as [`PREFIX_CACHE_BYTES`] of the
    /// model's KV hold ([`EngineConfig::prefix_tokens`]).
    pub prefix_cache_tokens: Option<usize>,
    /// Serves at most this context (vLLM's `--max-model-len`); `None`: the model's own.
    pub max_model_len: Option<usize>,
    /// How long the engine's helper threads spin after a parallel section before sleeping:
    /// longer than the gap between two decode steps (sampling, streaming, admission), so a busy
    /// engine never sleeps, and short enough that an idle one gives the cores back to training
    /// within a millisecond. Sleeping between sections costs ~30% of single-stream decode.
    pub team_spin: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            step_tokens: 512,
            max_seqs: 32,
            max_waiting: 256,
            kv_cache_bytes: machine_memory_bytes().map_or(4 << 30, |m| m / 4),
            prefix_cache_tokens: None,
            max_model_len: None,
            team_spin: Duration::from_millis(1),
        }
    }
}

/// The prefix cache's default size in bytes of KV. Its entries live beside the running
/// sequences' KV (not in their budget), so they are resident memory for as long as they are
/// kept: in an RL loop, whose checkpoint changes every step, most of them are never read again.
/// 16,384 positions (the default before) were ~380 MB on SmolLM2 and most of `make
/// bench-rl-trl`'s growth between training jobs (docs/benchmarks.md, session 26).
pub const PREFIX_CACHE_BYTES: u64 = 128 << 20;

impl EngineConfig {
    /// Prompt positions the prefix cache keeps for a model: the configured number, or as many
    /// as [`PREFIX_CACHE_BYTES`] hold at the model's KV bytes a position.
    pub fn prefix_tokens(&self, model: &tandem_model::LlamaConfig) -> usize {
        self.prefix_cache_tokens.unwrap_or((PREFIX_CACHE_BYTES / kv_position_bytes(model)) as usize)
    }

    /// KV positions the budget holds for a model: its bytes over what one position costs
    /// ([`kv_position_bytes`]), but never less than one full context, so that any one sequence
    /// can always run to its end alone.
    pub fn kv_tokens(&self, model: &tandem_model::LlamaConfig) -> usize {
        ((self.kv_cache_bytes / kv_position_bytes(model)) as usize).max(model.context_len)
    }
}

/// What one cached position costs: keys and values of every layer, as the cache stores them.
fn kv_position_bytes(model: &tandem_model::LlamaConfig) -> u64 {
    (model.n_layer * model.kv_dim() * 2 * tandem_model::KV_VALUE_BYTES).max(1) as u64
}

/// The memory this process may use: `MemTotal` of /proc/meminfo, or its control group's limit
/// when that is lower. In a container (a Kubernetes pod with a memory limit) /proc/meminfo shows
/// the host's memory, so a quarter of it could be far over the pod's limit, and the kernel would
/// kill the server as its KV cache grew.
fn machine_memory_bytes() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let total = read("/proc/meminfo").and_then(|info| mem_total(&info));
    // cgroup v2, then v1.
    let limit = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|l| cgroup_limit(&l));
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

/// `MemTotal` of a /proc/meminfo text, in bytes.
fn mem_total(info: &str) -> Option<u64> {
    let kib: u64 =
        info.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// A control group's memory limit in bytes; `None` for none (`max` in v2, a number near
/// `i64::MAX` in v1).
fn cgroup_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes < 1 << 60).then_some(bytes)
}

/// A request handed to the loop.
pub(crate) struct Job {
    pub req: GenerateRequest,
    pub adapter: Option<Arc<LoraAdapter>>,
    /// The adapter's name and owner, for `vllm:lora_requests_info`.
    pub lora: Option<Arc<LoraTag>>,
    pub tx: UnboundedSender<InferEvent>,
    pub received: Instant,
    /// The structured-output matcher, already compiled.
    pub matcher: Option<llguidance::Matcher>,
    /// Whether it took a place in the queue at submission (a beam search's steps do not).
    pub holds_place: bool,
}

/// Marks the engine stopped when its thread ends, by return or by unwinding.
struct StoppedOnExit(Arc<EngineMetrics>);

impl Drop for StoppedOnExit {
    fn drop(&mut self) {
        self.0.mark_stopped();
    }
}

struct Queued {
    id: SeqId,
    arrival: u64,
    tenant: u64,
    job: Job,
    /// The prompt's chain hashes in the prefix cache's scope (`PrefixCache::prefix_hashes`),
    /// made once: admission looks them up, and planning compares waiting prompts by them.
    hashes: Vec<u64>,
}

pub(crate) struct EngineLoop {
    pub model: Arc<Llama>,
    pub tok: Arc<TextTokenizer>,
    pub config: EngineConfig,
    pub rx: Receiver<Job>,
    pub metrics: Arc<EngineMetrics>,
    pub prefix: PrefixCache,
    waiting: Vec<Queued>,
    running: Vec<Seq>,
    /// Sequences preempted for higher-priority requests, waiting to be prefilled again.
    preempted: Vec<Seq>,
    next_id: u64,
    /// Steps run so far (the scheduler's rotation clock).
    steps: u64,
    /// Measured step times, for the scheduler's slowdown guard.
    cost: crate::fair::StepCost,
    /// Time saved by tenants the guard held back (the scheduler's deficit round robin).
    credits: std::collections::BTreeMap<u64, f64>,
}

/// A step's cost before the engine has timed its own: about what the bundled model measures on
/// two cores (4 ms fixed, 1 ms a token, 1.4 ms a token per thousand positions it attends, 2 ms
/// per thousand cached positions a sequence reads).
const PRIOR_COST: crate::fair::Cost = crate::fair::Cost { a: 0.004, c: 0.001, e: 0.0014, f: 0.002 };

/// The longest a step is planned to take: a request that arrives during a step waits at most
/// about this long before its own first chunk runs (a 512-token chunk deep in a long context
/// would otherwise take seconds). On a model whose step's fixed part (reading the weights) is
/// longer than a tenth of this, a step of one tenant's work alone stretches to ten times that
/// part (`fair::step_cap`), so that a long prompt alone loses at most a tenth of its prefill
/// speed to its chunking.
const MAX_STEP_SECONDS: f64 = 0.25;

impl EngineLoop {
    pub fn new(
        model: Arc<Llama>,
        tok: Arc<TextTokenizer>,
        config: EngineConfig,
        rx: Receiver<Job>,
        metrics: Arc<EngineMetrics>,
    ) -> Self {
        let prefix = PrefixCache::new(config.prefix_tokens(&model.config));
        EngineLoop {
            model,
            tok,
            config,
            rx,
            metrics,
            prefix,
            waiting: Vec::new(),
            running: Vec::new(),
            preempted: Vec::new(),
            next_id: 0,
            steps: 0,
            cost: crate::fair::StepCost::new(PRIOR_COST),
            credits: Default::default(),
        }
    }

    /// Runs until every sender is gone. A step that panics fails the requests it was running and
    /// the loop goes on (`recover`); should the thread end anyway, `/health` knows at once.
    /// Runs the loop on a fresh [`team::Team`] of rayon's thread count (`RAYON_NUM_THREADS`),
    /// or on rayon's pool if its threads cannot start.
    pub fn run_on_team(self) {
        let threads = rayon::current_num_threads();
        match team::Team::new(threads, self.config.team_spin, "engine") {
            Ok(t) => t.install(|| self.run()),
            Err(e) => {
                tracing::warn!(error = %e, "engine thread team did not start; using the shared pool");
                self.run()
            }
        }
    }

    pub fn run(mut self) {
        let _stopped = StoppedOnExit(self.metrics.clone());
        while self.run_once() {}
        tracing::info!("engine loop stopped");
    }

    /// One iteration: receive, then one guarded step. False when the engine should stop.
    pub(crate) fn run_once(&mut self) -> bool {
        self.metrics.beat();
        if !self.receive() {
            return false;
        }
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| self.step())) {
            self.recover(panic.as_ref());
        }
        let kv_used = self.running.iter().map(Seq::kv_positions).sum();
        let kv_budget = self.config.kv_tokens(&self.model.config);
        self.metrics.set_gauges(self.running.len(), self.waiting.len() + self.preempted.len(), kv_used, kv_budget);
        let waiting = self.waiting.iter().map(|q| &q.job.lora).chain(self.preempted.iter().map(|s| &s.req.lora));
        self.metrics.set_loras(self.running.iter().map(|s| &s.req.lora), waiting);
        true
    }

    /// After a panicking step: every request it had started ends with an error event (their
    /// state may be half-updated), the prefix cache is dropped (an insert may have been cut off),
    /// and requests still waiting are served as usual. The panic's text is logged, not sent: it
    /// describes the server, not the request.
    fn recover(&mut self, panic: &(dyn std::any::Any + Send)) {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        let failed = self.running.len() + self.preempted.len();
        tracing::error!(panic = %what, failed, "an engine step panicked; its requests end with an error, the engine goes on");
        for seq in self.running.drain(..).chain(self.preempted.drain(..)) {
            let _ = seq.req.tx.send(InferEvent::Error(
                "the inference engine failed while running this request (the failure is logged; other \
                 requests go on)"
                    .into(),
            ));
        }
        self.prefix.clear();
        self.metrics.failure();
    }

    /// Takes new requests; waits for one when idle. False when the engine should stop.
    fn receive(&mut self) -> bool {
        if self.idle() {
            match self.rx.recv_timeout(Duration::from_millis(500)) {
                Ok(job) => self.enqueue(job),
                Err(RecvTimeoutError::Timeout) => return true,
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok(job) => self.enqueue(job),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return !(self.idle()),
            }
        }
    }

    fn idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty() && self.preempted.is_empty()
    }

    fn enqueue(&mut self, job: Job) {
        self.next_id += 1;
        let tenant = crate::sequence::tenant_id(&job.req.tenant);
        let id = SeqId { request: self.next_id, choice: 0 };
        let req = &job.req;
        let adapter_key = req.adapter.as_ref().map(|a| a.checkpoint_id.as_str());
        let hashes = self.prefix.prefix_hashes(&req.prompt, &req.tenant, adapter_key, req.cache_salt.as_deref());
        self.waiting.push(Queued { id, arrival: self.next_id, tenant, job, hashes });
    }

    fn step(&mut self) {
        let entered = Instant::now();
        // A closed channel means the client is gone: free its sequences now. Aborts are counted
        // in choices, as finished ones are: a waiting request or an unforked sequence holds
        // all of its choices.
        let choices = |lp: &Self| -> usize {
            lp.running.iter().chain(&lp.preempted).map(|s| s.n.max(1)).sum::<usize>()
                + lp.waiting.iter().map(|q| q.job.req.n.max(1)).sum::<usize>()
        };
        let before = choices(self);
        self.running.retain(|s| !s.req.tx.is_closed());
        let places = |w: &[Queued]| w.iter().filter(|q| q.job.holds_place).count();
        let places_before = places(&self.waiting);
        self.waiting.retain(|q| !q.job.tx.is_closed());
        self.metrics.dequeued(places_before - places(&self.waiting));
        self.preempted.retain(|s| !s.req.tx.is_closed());
        let dropped = before - choices(self);
        if dropped > 0 {
            self.metrics.aborted(dropped);
        }
        let plan = self.plan();
        for id in &plan.preempt {
            if let Some(pos) = self.running.iter().position(|s| s.id == *id) {
                let mut seq = self.running.remove(pos);
                seq.preempt();
                self.metrics.preempted();
                self.preempted.push(seq);
            }
        }
        for id in &plan.admit {
            match self.preempted.iter().position(|s| s.id == *id) {
                Some(pos) => {
                    let seq = self.preempted.remove(pos);
                    self.running.push(seq);
                }
                None => self.admit(*id),
            }
        }
        let work: std::collections::HashMap<SeqId, usize> = plan.work.iter().copied().collect();
        if work.is_empty() {
            return;
        }
        self.steps += 1;
        // The step's shape for the cost model: its tokens, the positions they attend and the
        // cached ones its sequences read (n tokens after p cached ones).
        let (mut tokens, mut attended, mut cached) = (0, 0, 0);
        // The step's debug line (its cost model's prediction per tenant) is only worked out
        // when that line is on: the engine loop is the hot path.
        let model_cost =
            tracing::enabled!(target: "tandem_engine::step", tracing::Level::DEBUG).then(|| self.cost.cost());
        let mut by_tenant: Vec<(u64, usize, f64)> = Vec::new();
        let started = Instant::now();
        let order: Vec<usize> = (0..self.running.len()).filter(|i| work.contains_key(&self.running[*i].id)).collect();
        let result = {
            let mut inputs: Vec<SeqInput<'_>> = Vec::with_capacity(order.len());
            for seq in self.running.iter_mut().filter(|s| work.contains_key(&s.id)) {
                seq.last_step = self.steps;
                let n = work[&seq.id].min(seq.prefill_left.max(1));
                let p = seq.cache.len();
                (tokens, attended, cached) = (tokens + n, attended + n * p + n * (n + 1) / 2, cached + p);
                if let Some(cost) = &model_cost {
                    let secs = cost.tokens(p, n);
                    match by_tenant.iter_mut().find(|t| t.0 == seq.req.tenant) {
                        Some(t) => (t.1, t.2) = (t.1 + n, t.2 + secs),
                        None => by_tenant.push((seq.req.tenant, n, secs)),
                    }
                }
                inputs.push(seq.input(n));
            }
            self.model.forward(&mut inputs)
        };
        let forward = started.elapsed();
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed");
                for i in order.iter().rev() {
                    let seq = self.running.remove(*i);
                    let _ = seq.req.tx.send(InferEvent::Error(e.to_string()));
                }
                return;
            }
        };
        // Bookkeeping first (prompt logprobs, prefix cache, forks), in order; then every sequence
        // with a row to sample from samples in parallel (each has its own RNG and channel, and
        // with 16 sequences the sequential loop left a core idle for a millisecond per step).
        let mut forks = Vec::new();
        // Sequence id -> the slot of the logits it samples from.
        let mut slot_of: std::collections::HashMap<SeqId, usize> = std::collections::HashMap::new();
        for (slot, i) in order.iter().enumerate() {
            let seq = &mut self.running[*i];
            let n = work[&seq.id].min(seq.prefill_left.max(1));
            if seq.prefill_left > 0 {
                seq.record_prompt_logprobs(seq.cache.len() - n, logits.rows(slot), &self.tok);
                seq.prefill_left -= n;
                self.metrics.prompt_tokens(n);
                if seq.prefill_left > 0 {
                    continue;
                }
                // Whole tiles of the prompt become shared: the prefix-cache entry and the other
                // choices then hold them once, not a copy each.
                seq.cache.freeze();
                self.prefix.insert(std::mem::take(&mut seq.prefix_hashes), &seq.cache);
                // The other choices sample their first token from the same prompt logits.
                let new = seq.fork_choices();
                slot_of.extend(new.iter().map(|f| (f.id, slot)));
                forks.extend(new);
            }
            if logits.rows(slot).len() > 0 {
                slot_of.insert(seq.id, slot);
            }
        }
        let (tok, cfg, metrics) = (&*self.tok, &self.model.config, &*self.metrics);
        // Sampled in parallel, one task per sequence and its "finished" flag.
        let mut seqs: Vec<(&mut Seq, bool)> =
            self.running.iter_mut().chain(forks.iter_mut()).map(|s| (s, false)).collect();
        team::for_each_chunk_mut(&mut seqs, 1, |_, one| {
            let (seq, finished) = &mut one[0];
            if let Some(row) = slot_of.get(&seq.id).and_then(|s| logits.last(*s)) {
                *finished = seq.sample_and_emit(row, tok, cfg, metrics);
            }
        });
        let finished: Vec<SeqId> = seqs.into_iter().filter(|(_, f)| *f).map(|(s, _)| s.id).collect();
        self.running.extend(forks);
        self.running.retain(|s| !finished.contains(&s.id));
        let elapsed = started.elapsed();
        self.cost.observe(tokens, attended, cached, elapsed.as_secs_f64());
        self.metrics.step(elapsed);
        // For operators and for tuning the cost model: `TANDEM_LOG=tandem_engine::step=debug`.
        // `tenants` holds (tenant, tokens, predicted seconds).
        if let Some(cost) = model_cost {
            tracing::debug!(
                target: "tandem_engine::step",
                tokens,
                attended,
                cached,
                seconds = elapsed.as_secs_f64(),
                forward = forward.as_secs_f64(),
                planning = (started - entered).as_secs_f64(),
                predicted = cost.a + by_tenant.iter().map(|t| t.2).sum::<f64>(),
                tenants = ?by_tenant,
            );
        }
    }

    fn plan(&mut self) -> scheduler::Plan<SeqId> {
        let running: Vec<Running<SeqId>> = self
            .running
            .iter()
            .map(|s| Running {
                id: s.id,
                tenant: s.req.tenant,
                prefill_left: s.prefill_left,
                priority: s.req.priority,
                arrival: s.req.arrival,
                reserve: s.kv_positions(),
                preemptible: s.preemptible(),
                last_step: s.last_step,
                position: s.cache.len(),
            })
            .collect();
        // Requests about to reuse a prefix another one computes this step or the next sit out
        // (`share`): compared in the order the scheduler admits each tenant's requests.
        let mut order: Vec<usize> = (0..self.waiting.len()).collect();
        order.sort_by_key(|&i| (self.waiting[i].job.req.priority, self.waiting[i].arrival));
        let leaders: Vec<share::Leader> = self
            .running
            .iter()
            .filter(|s| s.prefill_left > 0 && !s.prefix_hashes.is_empty())
            .map(|s| share::Leader { hashes: &s.prefix_hashes, left: s.prefill_left })
            .collect();
        let candidates: Vec<Option<&[u64]>> = order
            .iter()
            .map(|&i| {
                let q = &self.waiting[i];
                q.job.req.prompt_logprobs.is_none().then_some(&q.hashes[..])
            })
            .collect();
        let sits_out = share::deferred(
            &leaders,
            &candidates,
            self.config.step_tokens,
            |h| self.prefix.holds(h),
            |n| self.prefix.keeps(n),
        );
        let mut deferred = vec![false; self.waiting.len()];
        for (&i, d) in order.iter().zip(sits_out) {
            deferred[i] = d;
        }
        let mut waiting: Vec<Waiting<SeqId>> = self
            .waiting
            .iter()
            .zip(&deferred)
            .filter(|(_, d)| !**d)
            .map(|(q, _)| {
                let p = &q.job.req;
                Waiting {
                    id: q.id,
                    tenant: q.tenant,
                    priority: p.priority,
                    arrival: q.arrival,
                    prefill: p.prompt.len(),
                    // The prompt once, and each choice's first token; decoding grows it a
                    // position a step (the scheduler preempts when that outgrows the budget).
                    reserve: crate::sequence::start_reserve(p.prompt.len(), p.n),
                    seqs: p.n,
                }
            })
            .collect();
        waiting.extend(self.preempted.iter().map(|s| Waiting {
            id: s.id,
            tenant: s.req.tenant,
            priority: s.req.priority,
            arrival: s.req.arrival,
            prefill: s.prefill_source_len(),
            reserve: s.prefill_source_len() + 1,
            seqs: 1,
        }));
        let budget = Budget {
            step_tokens: self.config.step_tokens,
            max_seqs: self.config.max_seqs,
            kv_tokens: self.config.kv_tokens(&self.model.config),
            cost: self.cost.cost(),
            max_step_seconds: MAX_STEP_SECONDS,
        };
        let mut plan = scheduler::schedule_with(&running, &waiting, &budget, &self.credits);
        self.credits = std::mem::take(&mut plan.credits);
        plan
    }

    /// Moves a waiting request into the running set, reusing a cached prefix if there is one.
    fn admit(&mut self, id: SeqId) {
        let Some(pos) = self.waiting.iter().position(|q| q.id == id) else { return };
        let mut q = self.waiting.remove(pos);
        self.metrics.dequeued(usize::from(q.job.holds_place));
        let cfg = &self.model.config;
        let hashes = std::mem::take(&mut q.hashes);
        let req = &q.job.req;
        // Prompt logprobs need every prompt position computed, so no cache is reused for them.
        let hit = if req.prompt_logprobs.is_some() {
            None
        } else {
            self.prefix.lookup(&hashes, req.prompt.len().saturating_sub(1))
        };
        let cached = hit.as_ref().map_or(0, |(_, n)| *n);
        let cache = match hit {
            // Shares the entry's whole tiles, copies the rest.
            Some((kv, n)) => KvCache::prefix_of(&kv, n),
            None => KvCache::new(cfg.n_layer, cfg.kv_dim()),
        };
        self.metrics.prefix_lookup(req.prompt.len(), cached);
        self.metrics.queued_for(q.job.received.elapsed());
        let _ = q.job.tx.send(InferEvent::Started { cached_tokens: cached });
        self.running.push(Seq::new(q.id.request, q.arrival, q.job, cache, cached, hashes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_is_the_lower_of_the_machines_and_the_cgroups() {
        assert_eq!(mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"), Some(24_576_000 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(cgroup_limit("4294967296\n"), Some(4 << 30));
        assert_eq!(cgroup_limit("max\n"), None);
        // cgroup v1's "no limit" (a page-rounded i64::MAX).
        assert_eq!(cgroup_limit("9223372036854771712\n"), None);
        let default = EngineConfig::default().kv_cache_bytes;
        assert!(default > 0 && default <= machine_memory_bytes().unwrap() / 4 + 1);
    }
    use tandem_core::inference::SamplingParams;
    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    fn tiny_loop() -> (EngineLoop, std::sync::mpsc::Sender<Job>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        tandem_model::testing::write_tiny_gguf(&path);
        let loaded = tandem_model::load(&path).unwrap();
        let tok = Arc::new(TextTokenizer::from_meta(&loaded.tokenizer).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let lp = EngineLoop::new(
            Arc::new(loaded.model),
            tok,
            EngineConfig::default(),
            rx,
            Arc::new(crate::metrics::EngineMetrics::detached("tiny")),
        );
        (lp, tx)
    }

    fn job(prompt: Vec<u32>) -> (Job, UnboundedReceiver<InferEvent>) {
        let (tx, rx) = unbounded_channel();
        let params = SamplingParams { temperature: 0.0, max_tokens: 3, ignore_eos: true, ..Default::default() };
        let req = GenerateRequest {
            request_id: "t".into(),
            adapter: None,
            prompt,
            n: 1,
            params,
            priority: 0,
            tenant: "a".into(),
            cache_salt: None,
            prompt_logprobs: None,
            prompt_scoring: None,
            beam_step: false,
        };
        (Job { req, adapter: None, lora: None, tx, received: Instant::now(), matcher: None, holds_place: true }, rx)
    }

    /// Events until the request ends: (tokens, whether it ended with an error).
    fn drain(rx: &mut UnboundedReceiver<InferEvent>) -> (usize, Option<bool>) {
        let mut tokens = 0;
        while let Ok(ev) = rx.try_recv() {
            match ev {
                InferEvent::Token { .. } => tokens += 1,
                InferEvent::Finished { .. } => return (tokens, Some(false)),
                InferEvent::Error(_) => return (tokens, Some(true)),
                _ => {}
            }
        }
        (tokens, None)
    }

    /// The cached positions a request's `Started` event reports, once it has been admitted.
    fn cached_tokens(rx: &mut UnboundedReceiver<InferEvent>) -> Option<usize> {
        while let Ok(ev) = rx.try_recv() {
            if let InferEvent::Started { cached_tokens } = ev {
                return Some(cached_tokens);
            }
        }
        None
    }

    /// Requests arriving together under one long prefix: the first computes it, the others sit
    /// out its step and take the prefix from the cache (`share`); an unrelated one and another
    /// tenant's with the same tokens are admitted at once and compute their own.
    #[test]
    fn requests_arriving_together_compute_their_shared_prefix_once() {
        let (mut lp, tx) = tiny_loop();
        let system: Vec<u32> = (1..=40).collect();
        let chat = |i: u32| system.iter().copied().chain([50 + i, 60 + i, 70 + i]).collect::<Vec<u32>>();
        let (mut rxs, mut others) = (Vec::new(), Vec::new());
        for i in 0..3 {
            let (j, rx) = job(chat(i));
            tx.send(j).unwrap();
            rxs.push(rx);
        }
        let (unrelated, rx) = job((100..143).collect());
        tx.send(unrelated).unwrap();
        others.push(rx);
        let (mut elsewhere, rx) = job(chat(0));
        elsewhere.req.tenant = "b".into();
        tx.send(elsewhere).unwrap();
        others.push(rx);
        assert!(lp.run_once());
        assert_eq!(cached_tokens(&mut rxs[0]), Some(0), "the first computes the prefix");
        for rx in &mut others {
            assert_eq!(cached_tokens(rx), Some(0), "admitted in the first step, nothing to share");
        }
        assert_eq!(cached_tokens(&mut rxs[1]), None, "waits for the first's prefix");
        assert!(lp.run_once());
        for rx in &mut rxs[1..] {
            assert_eq!(cached_tokens(rx), Some(40), "the shared prefix from the cache");
        }
        for _ in 0..10 {
            lp.run_once();
        }
        for rx in rxs.iter_mut().chain(&mut others) {
            assert_eq!(drain(rx), (3, Some(false)), "every request is served in full");
        }
    }

    /// A client that leaves while its request waits aborts every choice it asked for.
    #[test]
    fn a_request_whose_client_left_counts_each_choice_as_aborted() {
        let (mut lp, tx) = tiny_loop();
        let (mut three, rx) = job(vec![1, 2, 3]);
        three.req.n = 3;
        three.req.params.temperature = 1.0;
        tx.send(three).unwrap();
        drop(rx);
        assert!(lp.run_once());
        assert_eq!(lp.metrics.aborts(), 3);
        assert!(lp.waiting.is_empty() && lp.running.is_empty());
    }

    /// A step that panics (here: a sequence with no prompt, which the loop took before submit
    /// refused empty prompts) ends the requests it ran with an error event; the loop goes on and
    /// serves the next request, and it is not marked stopped.
    #[test]
    fn a_panicking_step_fails_its_requests_and_the_loop_goes_on() {
        let (mut lp, tx) = tiny_loop();
        let (bad, mut bad_rx) = job(Vec::new());
        tx.send(bad).unwrap();
        assert!(lp.run_once());
        assert_eq!(drain(&mut bad_rx), (0, Some(true)), "the request the step ran gets an error event");
        assert!(lp.running.is_empty() && lp.preempted.is_empty());

        let (good, mut good_rx) = job(vec![1, 2, 3]);
        tx.send(good).unwrap();
        for _ in 0..10 {
            assert!(lp.run_once());
        }
        assert_eq!(drain(&mut good_rx), (3, Some(false)), "the next request is served in full");
        assert!(!lp.metrics.is_stopped());
        assert_eq!(lp.metrics.failures(), 1);
    }
}
