//! Engine metrics under vLLM's names (`vllm:...`, labelled `model_name` and `engine` as vLLM's
//! v1 engine labels them), plus a few of tandem's own (`tandem:...`). Values are
//! `prometheus-client` atomics the loop updates without locking; the api encodes them on scrape.
//! The queue bound, the heartbeat and the stopped flag are plain atomics: they steer admission and
//! health, and are not exported.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tandem_core::inference::{FinishReason, LoraActivity, LoraTag};
use tandem_core::telemetry::{buckets_1_2_5, INTER_TOKEN_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model_name: String,
    engine: String,
}

/// `vllm:cache_config_info`'s labels (vLLM prints its CacheConfig's fields; these are the ones
/// that have a meaning here). The KV cache is kept a position at a time, so a block is one token
/// and the blocks are the positions the budget holds: `block_size * num_gpu_blocks` is the
/// capacity in tokens, which is what a router computes from them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    engine: String,
    block_size: &'static str,
    cache_dtype: &'static str,
    enable_prefix_caching: &'static str,
    num_gpu_blocks: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SuccessLabels {
    model_name: String,
    engine: String,
    finished_reason: &'static str,
}

type Histograms = Family<ModelLabels, Histogram, fn() -> Histogram>;

fn ttft() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}
fn inter_token() -> Histogram {
    Histogram::new(INTER_TOKEN_BUCKETS)
}
fn latency() -> Histogram {
    Histogram::new(REQUEST_LATENCY_BUCKETS)
}
/// Token counts per request. vLLM stops these at the model's context length; one family serves
/// every model here, so they stop at 100,000 tokens (the longest context tandem loads is shorter).
fn token_counts() -> Histogram {
    Histogram::new(buckets_1_2_5(100_000))
}

/// Every engine's series, one family per metric name (the api registers them once).
pub(crate) struct Families {
    running: Family<ModelLabels, Gauge>,
    waiting: Family<ModelLabels, Gauge>,
    kv_usage: Family<ModelLabels, Gauge<f64, AtomicU64>>,
    prompt_tokens: Family<ModelLabels, Counter>,
    generation_tokens: Family<ModelLabels, Counter>,
    prefix_queries: Family<ModelLabels, Counter>,
    prefix_hits: Family<ModelLabels, Counter>,
    preemptions: Family<ModelLabels, Counter>,
    success: Family<SuccessLabels, Counter>,
    ttft: Histograms,
    inter_token: Histograms,
    per_output_token: Histograms,
    e2e: Histograms,
    queue: Histograms,
    prefill: Histograms,
    decode: Histograms,
    inference: Histograms,
    request_prompt_tokens: Histograms,
    request_generation_tokens: Histograms,
    steps: Family<ModelLabels, Counter>,
    failures: Family<ModelLabels, Counter>,
    cache_config: Family<CacheLabels, Gauge>,
    /// The engine's adapter cache (shared by its models): reads from disk, and bytes held.
    pub adapter_loads: Counter,
    pub adapter_bytes: Gauge,
}

impl Default for Families {
    fn default() -> Self {
        Families {
            running: Family::default(),
            waiting: Family::default(),
            kv_usage: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            prefix_queries: Family::default(),
            prefix_hits: Family::default(),
            preemptions: Family::default(),
            success: Family::default(),
            ttft: Family::new_with_constructor(ttft),
            inter_token: Family::new_with_constructor(inter_token),
            per_output_token: Family::new_with_constructor(inter_token),
            e2e: Family::new_with_constructor(latency),
            queue: Family::new_with_constructor(latency),
            prefill: Family::new_with_constructor(latency),
            decode: Family::new_with_constructor(latency),
            inference: Family::new_with_constructor(latency),
            request_prompt_tokens: Family::new_with_constructor(token_counts),
            request_generation_tokens: Family::new_with_constructor(token_counts),
            steps: Family::default(),
            failures: Family::default(),
            cache_config: Family::default(),
            adapter_loads: Counter::default(),
            adapter_bytes: Gauge::default(),
        }
    }
}

impl Families {
    /// The handles of one engine, `index` in the order models were added.
    pub fn for_model(&self, model_name: &str, index: usize) -> EngineMetrics {
        let l = ModelLabels { model_name: model_name.to_string(), engine: index.to_string() };
        let reason = |finished_reason| {
            self.success.get_or_create_owned(&SuccessLabels {
                model_name: l.model_name.clone(),
                engine: l.engine.clone(),
                finished_reason,
            })
        };
        EngineMetrics {
            queued: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            heartbeat_ms: AtomicU64::new(0),
            running: self.running.get_or_create_owned(&l),
            waiting: self.waiting.get_or_create_owned(&l),
            kv_usage: self.kv_usage.get_or_create_owned(&l),
            prompt_tokens: self.prompt_tokens.get_or_create_owned(&l),
            generation_tokens: self.generation_tokens.get_or_create_owned(&l),
            prefix_queries: self.prefix_queries.get_or_create_owned(&l),
            prefix_hits: self.prefix_hits.get_or_create_owned(&l),
            preemptions: self.preemptions.get_or_create_owned(&l),
            finished: [reason("stop"), reason("length"), reason("abort")],
            ttft: self.ttft.get_or_create_owned(&l),
            inter_token: self.inter_token.get_or_create_owned(&l),
            per_output_token: self.per_output_token.get_or_create_owned(&l),
            e2e: self.e2e.get_or_create_owned(&l),
            queue: self.queue.get_or_create_owned(&l),
            prefill: self.prefill.get_or_create_owned(&l),
            decode: self.decode.get_or_create_owned(&l),
            inference: self.inference.get_or_create_owned(&l),
            request_prompt_tokens: self.request_prompt_tokens.get_or_create_owned(&l),
            request_generation_tokens: self.request_generation_tokens.get_or_create_owned(&l),
            steps: self.steps.get_or_create_owned(&l),
            failures: self.failures.get_or_create_owned(&l),
            loras: Mutex::default(),
        }
    }

    /// Engine `index`'s `vllm:cache_config_info` series (set to 1, as vLLM's info gauges are).
    pub fn describe_cache(&self, index: usize, kv_tokens: usize) {
        let labels = CacheLabels {
            engine: index.to_string(),
            block_size: "1",
            cache_dtype: "float16",
            enable_prefix_caching: "True",
            num_gpu_blocks: kv_tokens.to_string(),
        };
        self.cache_config.get_or_create(&labels).set(1);
    }

    pub fn register(&self, r: &mut Registry) {
        r.register("vllm:num_requests_running", "Number of requests in model execution batches", self.running.clone());
        r.register("vllm:num_requests_waiting", "Number of requests waiting to be processed", self.waiting.clone());
        r.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage (positions held by running sequences over the budget)",
            self.kv_usage.clone(),
        );
        r.register("vllm:prompt_tokens", "Number of prefill tokens processed", self.prompt_tokens.clone());
        r.register("vllm:generation_tokens", "Number of generation tokens processed", self.generation_tokens.clone());
        r.register(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens",
            self.prefix_queries.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens",
            self.prefix_hits.clone(),
        );
        r.register("vllm:num_preemptions", "Cumulative number of preemption from the engine", self.preemptions.clone());
        r.register("vllm:request_success", "Count of successfully processed requests", self.success.clone());
        r.register(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds",
            self.ttft.clone(),
        );
        r.register(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds",
            self.inter_token.clone(),
        );
        r.register(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request (decode time over output tokens after the first)",
            self.per_output_token.clone(),
        );
        r.register("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds", self.e2e.clone());
        r.register(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request",
            self.queue.clone(),
        );
        r.register(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request",
            self.prefill.clone(),
        );
        r.register(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request",
            self.decode.clone(),
        );
        r.register(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request",
            self.inference.clone(),
        );
        r.register(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed per request",
            self.request_prompt_tokens.clone(),
        );
        r.register(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed per request",
            self.request_generation_tokens.clone(),
        );
        r.register("tandem:engine_steps", "Steps (batched forward passes) the engine loop ran", self.steps.clone());
        r.register(
            "tandem:engine_step_failures",
            "Engine steps that panicked; their requests ended with an error and the loop went on",
            self.failures.clone(),
        );
        r.register(
            "tandem:lora_adapter_loads",
            "LoRA adapters read from disk into the adapter cache (a warm cache reads none)",
            self.adapter_loads.clone(),
        );
        r.register(
            "tandem:lora_adapter_cache_bytes",
            "Bytes of LoRA adapters the adapter cache holds (bounded by --adapter-cache-mib)",
            self.adapter_bytes.clone(),
        );
        r.register("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", self.cache_config.clone());
    }
}

/// One engine's handles into [`Families`], and the atomics that steer it.
pub struct EngineMetrics {
    /// Requests submitted and not yet admitted or dropped (in the channel or waiting): the
    /// queue bound, counted at submission so that a burst cannot overshoot it.
    queued: AtomicU64,
    /// Set when the loop's thread ends (no more requests will be served).
    stopped: AtomicBool,
    /// Unix ms of the loop's last iteration.
    heartbeat_ms: AtomicU64,
    running: Gauge,
    waiting: Gauge,
    kv_usage: Gauge<f64, AtomicU64>,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    prefix_queries: Counter,
    prefix_hits: Counter,
    preemptions: Counter,
    /// By finish reason: stop, length, abort.
    finished: [Counter; 3],
    ttft: Histogram,
    inter_token: Histogram,
    per_output_token: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    inference: Histogram,
    request_prompt_tokens: Histogram,
    request_generation_tokens: Histogram,
    steps: Counter,
    failures: Counter,
    /// The adapters of the running sequences and of the waiting ones, as the loop last saw them.
    loras: Mutex<InUse>,
}

/// The adapters of running sequences, and of waiting ones.
type InUse = (Vec<Arc<LoraTag>>, Vec<Arc<LoraTag>>);

/// Each adapter once, sorted: vLLM joins their names into one label. Done when a scrape reads
/// them, not at every loop round.
fn distinct(mut tags: Vec<Arc<LoraTag>>) -> Vec<Arc<LoraTag>> {
    tags.sort();
    tags.dedup();
    tags
}

/// When one choice reached each phase, for the per-request histograms at its end.
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    pub received: Instant,
    pub admitted: Instant,
    pub first_token: Option<Instant>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl EngineMetrics {
    /// An engine outside any registry (tests that build a loop by hand).
    pub fn detached(model_name: &str) -> Self {
        Families::default().for_model(model_name, 0)
    }

    pub fn beat(&self) {
        self.heartbeat_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Milliseconds since the loop last went round (it goes round at least every 500 ms idle).
    pub fn since_heartbeat_ms(&self) -> u64 {
        now_ms().saturating_sub(self.heartbeat_ms.load(Ordering::Relaxed))
    }

    pub fn set_gauges(&self, running: usize, waiting: usize, kv_used: usize, kv_budget: usize) {
        self.running.set(running as i64);
        self.waiting.set(waiting as i64);
        self.kv_usage.set(if kv_budget == 0 { 0.0 } else { kv_used as f64 / kv_budget as f64 });
    }

    /// The adapters of the running and the waiting sequences, one per sequence that has one;
    /// set every loop round.
    pub fn set_loras<'a>(
        &self,
        running: impl Iterator<Item = &'a Option<Arc<LoraTag>>>,
        waiting: impl Iterator<Item = &'a Option<Arc<LoraTag>>>,
    ) {
        let held = (running.flatten().cloned().collect(), waiting.flatten().cloned().collect());
        *self.loras.lock().unwrap_or_else(|p| p.into_inner()) = held;
    }

    /// What `vllm:lora_requests_info` reports of this engine, stamped with the loop's last round.
    pub fn lora_activity(&self, max_lora: usize) -> LoraActivity {
        let (running, waiting) = self.loras.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (running, waiting) = (distinct(running), distinct(waiting));
        let updated_unix = self.heartbeat_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        LoraActivity { running, waiting, max_lora, updated_unix }
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
        self.prompt_tokens.inc_by(n as u64);
    }

    pub fn generation_tokens(&self, n: usize) {
        self.generation_tokens.inc_by(n as u64);
    }

    pub fn prefix_lookup(&self, queried: usize, hit: usize) {
        self.prefix_queries.inc_by(queried as u64);
        self.prefix_hits.inc_by(hit as u64);
    }

    /// A choice ended (for `Abort` from inside the loop: the grammar gave up). `generated` is
    /// how many tokens it produced.
    pub fn finished(&self, reason: FinishReason, timeline: Timeline, prompt: usize, generated: usize) {
        let i = match reason {
            FinishReason::Stop => 0,
            FinishReason::Length => 1,
            FinishReason::Abort => 2,
        };
        self.finished[i].inc();
        let now = Instant::now();
        self.e2e.observe((now - timeline.received).as_secs_f64());
        self.inference.observe((now - timeline.admitted).as_secs_f64());
        if let Some(first) = timeline.first_token {
            self.prefill.observe((first - timeline.admitted).as_secs_f64());
            self.decode.observe((now - first).as_secs_f64());
            if generated > 1 {
                self.per_output_token.observe((now - first).as_secs_f64() / (generated - 1) as f64);
            }
        }
        self.request_prompt_tokens.observe(prompt as f64);
        self.request_generation_tokens.observe(generated as f64);
    }

    /// Choices that ended because their client left or the loop dropped them.
    pub fn aborted(&self, n: usize) {
        self.finished[2].inc_by(n as u64);
    }

    /// A running sequence gave way to a higher-priority request (vLLM's `num_preemptions`).
    pub fn preempted(&self) {
        self.preemptions.inc();
    }

    /// A step panicked and was recovered from.
    pub fn failure(&self) {
        self.failures.inc();
    }

    pub fn aborts(&self) -> u64 {
        self.finished[2].get()
    }

    pub fn failures(&self) -> u64 {
        self.failures.get()
    }

    /// The loop's thread has ended, for whatever reason.
    pub fn mark_stopped(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub fn step(&self, _took: Duration) {
        self.steps.inc();
    }

    pub fn first_token(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
    }

    pub fn inter_token(&self, d: Duration) {
        self.inter_token.observe(d.as_secs_f64());
    }

    pub fn queued_for(&self, d: Duration) {
        self.queue.observe(d.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn two_engines_share_one_family_per_name() {
        let families = Families::default();
        let a = families.for_model("a", 0);
        let b = families.for_model("b", 1);
        a.prompt_tokens(7);
        b.prompt_tokens(2);
        a.set_gauges(1, 2, 25, 100);
        let t = Instant::now();
        a.finished(FinishReason::Length, Timeline { received: t, admitted: t, first_token: Some(t) }, 5, 3);
        let mut reg = Registry::default();
        families.register(&mut reg);
        let mut text = String::new();
        encode(&mut text, &reg).unwrap();
        assert_eq!(text.matches("# TYPE vllm:prompt_tokens counter\n").count(), 1, "{text}");
        assert!(text.contains("vllm:prompt_tokens_total{model_name=\"a\",engine=\"0\"} 7\n"), "{text}");
        assert!(text.contains("vllm:prompt_tokens_total{model_name=\"b\",engine=\"1\"} 2\n"), "{text}");
        assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"a\",engine=\"0\"} 0.25\n"), "{text}");
        assert!(text.contains("vllm:num_requests_waiting{model_name=\"a\",engine=\"0\"} 2\n"), "{text}");
        assert!(
            text.contains("vllm:request_success_total{model_name=\"a\",engine=\"0\",finished_reason=\"length\"} 1\n")
        );
        assert!(text.contains("vllm:request_generation_tokens_sum{model_name=\"a\",engine=\"0\"} 3.0\n"), "{text}");
        assert!(text.contains("vllm:e2e_request_latency_seconds_count{model_name=\"a\",engine=\"0\"} 1\n"), "{text}");
        assert!(text.contains("# HELP vllm:num_requests_running "), "{text}");
    }
}
