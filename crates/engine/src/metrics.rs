//! Engine metrics in Prometheus text format, kept in atomics so the api reads them without
//! touching the loop. Names follow vLLM's (`vllm:` prefix dropped for `tandem:`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tandem_core::inference::FinishReason;

/// Latency buckets in seconds (upper bounds), as vLLM uses for time to first token.
const BUCKETS: [f64; 14] = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; 15],
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        let i = BUCKETS.iter().position(|b| secs <= *b).unwrap_or(BUCKETS.len());
        self.counts[i] += 1;
        self.sum += secs;
    }

    fn render(&self, name: &str, labels: &str, out: &mut String) {
        out.push_str(&format!("# TYPE {name} histogram\n"));
        let mut acc = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            acc += self.counts[i];
            out.push_str(&format!("{name}_bucket{{{labels},le=\"{b}\"}} {acc}\n"));
        }
        acc += self.counts[BUCKETS.len()];
        out.push_str(&format!(
            "{name}_bucket{{{labels},le=\"+Inf\"}} {acc}\n{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {acc}\n",
            self.sum
        ));
    }
}

#[derive(Default)]
pub struct EngineMetrics {
    running: AtomicU64,
    waiting: AtomicU64,
    /// KV positions the running sequences hold (shared prompt tiles once), and the budget.
    kv_used: AtomicU64,
    kv_budget: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    prefix_queries: AtomicU64,
    prefix_hits: AtomicU64,
    finished_stop: AtomicU64,
    finished_length: AtomicU64,
    finished_abort: AtomicU64,
    steps: AtomicU64,
    preemptions: AtomicU64,
    /// Requests submitted and not yet admitted or dropped (in the channel or waiting): the
    /// queue bound, counted at submission so that a burst cannot overshoot it.
    queued: AtomicU64,
    /// Steps that panicked: their requests ended with an error, the loop went on.
    failures: AtomicU64,
    /// Set when the loop's thread ends (no more requests will be served).
    stopped: AtomicBool,
    /// Unix ms of the loop's last iteration.
    heartbeat_ms: AtomicU64,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    queue: Mutex<Histogram>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl EngineMetrics {
    pub fn beat(&self) {
        self.heartbeat_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Milliseconds since the loop last went round (it goes round at least every 500 ms idle).
    pub fn since_heartbeat_ms(&self) -> u64 {
        now_ms().saturating_sub(self.heartbeat_ms.load(Ordering::Relaxed))
    }

    pub fn set_gauges(&self, running: usize, waiting: usize, kv_used: usize, kv_budget: usize) {
        self.running.store(running as u64, Ordering::Relaxed);
        self.waiting.store(waiting as u64, Ordering::Relaxed);
        self.kv_used.store(kv_used as u64, Ordering::Relaxed);
        self.kv_budget.store(kv_budget as u64, Ordering::Relaxed);
    }

    pub fn running(&self) -> u64 {
        self.running.load(Ordering::Relaxed)
    }

    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Takes a place in the queue if fewer than `max` are taken.
    pub fn try_enqueue(&self, max: usize) -> bool {
        self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| ((q as usize) < max).then_some(q + 1)).is_ok()
    }

    /// Gives `n` places back (requests admitted, dropped, or never sent).
    pub fn dequeued(&self, n: usize) {
        let _ = self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| Some(q.saturating_sub(n as u64)));
    }

    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Acquire)
    }

    pub fn prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn generation_tokens(&self, n: usize) {
        self.generation_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn prefix_lookup(&self, queried: usize, hit: usize) {
        self.prefix_queries.fetch_add(queried as u64, Ordering::Relaxed);
        self.prefix_hits.fetch_add(hit as u64, Ordering::Relaxed);
    }

    pub fn finished(&self, reason: FinishReason) {
        let c = match reason {
            FinishReason::Stop => &self.finished_stop,
            FinishReason::Length => &self.finished_length,
            FinishReason::Abort => &self.finished_abort,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn aborted(&self, n: usize) {
        self.finished_abort.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A running sequence gave way to a higher-priority request (vLLM's `num_preemptions`).
    pub fn preempted(&self) {
        self.preemptions.fetch_add(1, Ordering::Relaxed);
    }

    /// A step panicked and was recovered from.
    pub fn failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// The loop's thread has ended, for whatever reason.
    pub fn mark_stopped(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub fn step(&self, _took: Duration) {
        self.steps.fetch_add(1, Ordering::Relaxed);
    }

    pub fn first_token(&self, d: Duration) {
        self.ttft.lock().unwrap_or_else(|e| e.into_inner()).observe(d.as_secs_f64());
    }

    pub fn inter_token(&self, d: Duration) {
        self.itl.lock().unwrap_or_else(|e| e.into_inner()).observe(d.as_secs_f64());
    }

    pub fn queued_for(&self, d: Duration) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).observe(d.as_secs_f64());
    }

    /// This engine's series, labelled with its model.
    pub fn render(&self, model: &str) -> String {
        let l = format!("model_name=\"{}\"", model.replace('"', "'"));
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut line = |kind: &str, name: &str, value: u64| {
            out.push_str(&format!("# TYPE {name} {kind}\n{name}{{{l}}} {value}\n"));
        };
        line("gauge", "tandem:num_requests_running", g(&self.running));
        line("gauge", "tandem:num_requests_waiting", g(&self.waiting));
        line("counter", "tandem:prompt_tokens_total", g(&self.prompt_tokens));
        line("counter", "tandem:generation_tokens_total", g(&self.generation_tokens));
        line("counter", "tandem:prefix_cache_queries_total", g(&self.prefix_queries));
        line("counter", "tandem:prefix_cache_hits_total", g(&self.prefix_hits));
        line("counter", "tandem:engine_steps_total", g(&self.steps));
        line("counter", "tandem:num_preemptions_total", g(&self.preemptions));
        line("counter", "tandem:engine_step_failures_total", g(&self.failures));
        out.push_str("# TYPE tandem:request_success_total counter\n");
        for (reason, v) in
            [("stop", &self.finished_stop), ("length", &self.finished_length), ("abort", &self.finished_abort)]
        {
            out.push_str(&format!("tandem:request_success_total{{{l},finished_reason=\"{reason}\"}} {}\n", g(v)));
        }
        let budget = g(&self.kv_budget);
        let usage = if budget == 0 { 0.0 } else { g(&self.kv_used) as f64 / budget as f64 };
        out.push_str(&format!("# TYPE tandem:kv_cache_usage_perc gauge\ntandem:kv_cache_usage_perc{{{l}}} {usage}\n"));
        let q = g(&self.prefix_queries);
        let rate = if q == 0 { 0.0 } else { g(&self.prefix_hits) as f64 / q as f64 };
        out.push_str(&format!(
            "# TYPE tandem:prefix_cache_hit_rate gauge\ntandem:prefix_cache_hit_rate{{{l}}} {rate}\n"
        ));
        self.ttft.lock().unwrap_or_else(|e| e.into_inner()).render("tandem:time_to_first_token_seconds", &l, &mut out);
        self.itl.lock().unwrap_or_else(|e| e.into_inner()).render("tandem:inter_token_latency_seconds", &l, &mut out);
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).render("tandem:request_queue_time_seconds", &l, &mut out);
        out
    }
}
