//! Prometheus metrics that more than one crate touches: vLLM's bucket layouts, the label sets, and
//! the training worker's metrics. Values live in `prometheus-client` types (atomics behind `Arc`s),
//! so the loop that updates one never waits for a scrape; `GET /metrics` encodes one registry that
//! every part registered into.

pub use prometheus_client;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// vLLM's buckets for time to first token, in seconds.
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];

/// vLLM's buckets for the time between two output tokens (and per output token), in seconds.
pub const INTER_TOKEN_BUCKETS: [f64; 19] =
    [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];

/// vLLM's buckets for whole-request phases (end to end, queued, prefill, decode, running).
pub const REQUEST_LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];

/// A training job runs from seconds (a tiny SFT) to hours.
pub const JOB_DURATION_BUCKETS: [f64; 13] =
    [1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0];

/// HTTP request durations, in seconds (prometheus-fastapi-instrumentator's default, as vLLM's
/// server exports them).
pub const HTTP_DURATION_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0];

/// vLLM's 1-2-5 series up to `max` inclusive (1, 2, 5, 10, 20, 50, ...): buckets for token
/// counts, so they reach the context length and no further.
pub fn buckets_1_2_5(max: u64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale: u64 = 1;
    loop {
        for m in [1u64, 2, 5] {
            match m.checked_mul(scale) {
                Some(v) if v <= max => out.push(v as f64),
                _ => return out,
            }
        }
        match scale.checked_mul(10) {
            Some(s) => scale = s,
            None => return out,
        }
    }
}

/// Labels of a training series: the job's kind (`rl` or `sft`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// Labels of a finished job: its kind and how it ended (`succeeded`, `failed`, `cancelled`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub kind: &'static str,
    pub outcome: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn job_histogram() -> Histogram {
    Histogram::new(JOB_DURATION_BUCKETS)
}

/// What the training worker counts. The jobs per state are read from the store at each scrape
/// instead (the store is the truth, also for jobs another process queued).
#[derive(Debug)]
pub struct TrainingMetrics {
    gradient_steps: Family<KindLabels, Counter>,
    trained_tokens: Family<KindLabels, Counter>,
    job_seconds: HistogramFamily<OutcomeLabels>,
    parked: Counter,
}

impl Default for TrainingMetrics {
    fn default() -> Self {
        let m = TrainingMetrics {
            gradient_steps: Family::default(),
            trained_tokens: Family::default(),
            job_seconds: Family::new_with_constructor(job_histogram),
            parked: Counter::default(),
        };
        // Counters read 0 from the start (an absent series is not a zero to a dashboard); the
        // duration histograms appear with the first job that ends.
        for kind in ["rl", "sft"] {
            let _ = m.gradient_steps.get_or_create(&KindLabels { kind });
            let _ = m.trained_tokens.get_or_create(&KindLabels { kind });
        }
        m
    }
}

impl TrainingMetrics {
    /// One optimiser step that trained `tokens` tokens.
    pub fn gradient_step(&self, kind: &'static str, tokens: u64) {
        self.gradient_steps.get_or_create(&KindLabels { kind }).inc();
        self.trained_tokens.get_or_create(&KindLabels { kind }).inc_by(tokens);
    }

    /// A job ended (`outcome`: succeeded, failed or cancelled) after running `secs`.
    pub fn job_finished(&self, kind: &'static str, outcome: &'static str, secs: f64) {
        self.job_seconds.get_or_create(&OutcomeLabels { kind, outcome }).observe(secs);
    }

    /// A held job parked its state to give its place in memory to another entity's job.
    pub fn parked(&self) {
        self.parked.inc();
    }

    /// Parks since start.
    pub fn parked_count(&self) -> u64 {
        self.parked.get()
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tandem:training_runs_parked",
            "Times a training job's adapter and optimizer left memory for another entity's job",
            self.parked.clone(),
        );
        registry.register(
            "tandem:training_gradient_steps",
            "Optimiser steps taken by training jobs",
            self.gradient_steps.clone(),
        );
        registry.register(
            "tandem:training_trained_tokens",
            "Tokens that carried a loss in training jobs' optimiser steps",
            self.trained_tokens.clone(),
        );
        registry.register(
            "tandem:training_job_duration_seconds",
            "Wall time of finished training jobs, from claim to end",
            self.job_seconds.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn one_two_five_buckets_stop_at_the_maximum() {
        assert_eq!(buckets_1_2_5(8192), vec![1., 2., 5., 10., 20., 50., 100., 200., 500., 1000., 2000., 5000.]);
        assert_eq!(buckets_1_2_5(10), vec![1., 2., 5., 10.]);
        assert_eq!(buckets_1_2_5(0), Vec::<f64>::new());
        // No overflow at the top of the range.
        assert_eq!(buckets_1_2_5(u64::MAX).len(), 3 * 19 + 1);
    }

    #[test]
    fn training_metrics_encode_with_their_labels() {
        let m = TrainingMetrics::default();
        m.gradient_step("rl", 100);
        m.gradient_step("rl", 28);
        m.job_finished("sft", "failed", 3.0);
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut text = String::new();
        encode(&mut text, &reg).unwrap();
        assert!(text.contains("# TYPE tandem:training_gradient_steps counter\n"), "{text}");
        assert!(text.contains("tandem:training_gradient_steps_total{kind=\"rl\"} 2\n"), "{text}");
        assert!(text.contains("tandem:training_trained_tokens_total{kind=\"rl\"} 128\n"), "{text}");
        assert!(
            text.contains(
                "tandem:training_job_duration_seconds_bucket{le=\"2.5\",kind=\"sft\",outcome=\"failed\"} 0\n"
            ) || text.contains(
                "tandem:training_job_duration_seconds_bucket{kind=\"sft\",outcome=\"failed\",le=\"2.5\"} 0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("tandem:training_job_duration_seconds_count{kind=\"sft\",outcome=\"failed\"} 1\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
