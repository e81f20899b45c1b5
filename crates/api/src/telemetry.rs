//! `GET /metrics`: one Prometheus registry holding the engine's series (vLLM's names), the
//! training worker's, the queued and running jobs read from the store at each scrape, and HTTP
//! requests per route as vLLM's server exports them (`http_requests_total`,
//! `http_request_duration_seconds`). Encoded by `prometheus-client` in the OpenMetrics text
//! format, which Prometheus asks for first and reads natively; a scraper that does not ask for
//! OpenMetrics in `Accept` gets the classic text format 0.0.4 (as vLLM's `prometheus_client`
//! answers by default), converted from it by [`classic_text`].

use crate::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;
use tandem_core::inference::{LoraActivity, LoraTag};
use tandem_core::records::{JobKind, JobStatus};
use tandem_core::telemetry::{TrainingMetrics, HTTP_DURATION_BUCKETS};

/// What Prometheus is told the body is, when it asks for OpenMetrics.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The classic text format, for every other scraper.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether an `Accept` header asks for OpenMetrics (Prometheus lists it first when it does).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.split(',').any(|part| part.trim().starts_with("application/openmetrics-text")))
}

/// The OpenMetrics text of the registry in the classic Prometheus text format (0.0.4): no `# EOF`
/// or `# UNIT` lines, a counter family's `# TYPE` and `# HELP` name its `_total` sample (the
/// samples are already named so), types the classic format lacks become `untyped`, exemplars
/// are dropped and HELP keeps only the classic escapes. Pure; the samples are unchanged.
pub fn classic_text(open: &str) -> String {
    let mut out = String::with_capacity(open.len());
    let mut help: Option<(&str, String)> = None;
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text.replace("\\\"", "\"")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let Some((family, kind)) = rest.rsplit_once(' ') else { continue };
            let (name, kind) = match kind {
                "counter" => (format!("{family}_total"), "counter"),
                "gauge" | "histogram" | "summary" => (family.to_string(), kind),
                _ => (family.to_string(), "untyped"),
            };
            if let Some((_, text)) = help.take().filter(|(h, _)| *h == family) {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        // A sample, without any exemplar (` # {labels} value`).
        let sample = match line.find(" # {") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(sample);
        out.push('\n');
    }
    out
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    handler: String,
    method: String,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    handler: String,
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    kind: &'static str,
    state: &'static str,
}

fn http_histogram() -> Histogram {
    Histogram::new(HTTP_DURATION_BUCKETS)
}

/// The server's registry and the series the api itself keeps.
pub struct Telemetry {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<RouteLabels, Histogram, fn() -> Histogram>,
    jobs: Family<JobLabels, Gauge>,
    /// Tinker models held, live or parked, and the live ones' bytes.
    tinker_models: Family<StateLabel, Gauge>,
    tinker_bytes: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

impl Telemetry {
    pub(crate) fn new(backend: Option<&crate::SharedBackend>, training: Option<&TrainingMetrics>) -> Self {
        let mut registry = Registry::default();
        if let Some(b) = backend {
            b.register_metrics(&mut registry);
        }
        if let Some(t) = training {
            t.register(&mut registry);
        }
        let requests = Family::<RequestLabels, Counter>::default();
        let durations = Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(http_histogram);
        let jobs = Family::<JobLabels, Gauge>::default();
        registry.register(
            "tandem:training_jobs",
            "Training jobs queued or running, of every entity, by kind and state",
            jobs.clone(),
        );
        registry.register(
            // The encoder appends `_total` to a counter's name.
            "http_requests",
            "Total number of requests by method, status and handler",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Latency of HTTP requests until the response head (a stream's body runs on)",
            durations.clone(),
        );
        let tinker_models = Family::<StateLabel, Gauge>::default();
        let tinker_bytes = Gauge::default();
        registry.register(
            "tandem:tinker_models",
            "Tinker training models this node holds, live or parked to files",
            tinker_models.clone(),
        );
        registry.register(
            "tandem:tinker_live_bytes",
            "Bytes the live Tinker models' adapters, optimizer moments and pending gradients hold",
            tinker_bytes.clone(),
        );
        Telemetry { registry, requests, durations, jobs, tinker_models, tinker_bytes }
    }
}

fn standard_method(m: &axum::http::Method) -> &'static str {
    match m.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}

/// The status class vLLM's HTTP metrics label a response with.
fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Counts and times every request by its route template (`/v1/preview/models/{id}`, never the
/// ids in it), so no label carries what a caller sent. Unmatched paths are `none`.
pub(crate) async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let handler = request.extensions().get::<MatchedPath>().map_or("none", |p| p.as_str()).to_string();
    // As vLLM's server: scrapes and probes are not the traffic these series describe.
    if matches!(handler.as_str(), "/metrics" | "/health" | "/v1/health") {
        return next.run(request).await;
    }
    // Anyone may send any method name: only the standard ones become label values, so a client
    // cannot grow the registry without bound.
    let method = standard_method(request.method()).to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let t = state.telemetry();
    let route = RouteLabels { handler, method };
    t.durations.get_or_create(&route).observe(started.elapsed().as_secs_f64());
    let status = status_class(response.status().as_u16());
    t.requests.get_or_create(&RequestLabels { handler: route.handler, method: route.method, status }).inc();
    response
}

/// The text of `GET /metrics` for `caller`: the registry's, with the job gauges refreshed from
/// the store first when it answers within `HEALTH_TIMEOUT` (otherwise they keep their last
/// values: a slow or saturated store never holds a scrape, nor fails the engine's series with
/// it), and `vllm:lora_requests_info`, which names only the caller's own adapters ([`lora_info`]).
pub(crate) async fn render(state: &AppState, caller: &str) -> Result<String, crate::error::ApiError> {
    let t = state.telemetry();
    match tokio::time::timeout(crate::HEALTH_TIMEOUT, state.store().active_job_counts()).await {
        Ok(Ok(counts)) => {
            for kind in [JobKind::Rl, JobKind::Sft] {
                for status in [JobStatus::Queued, JobStatus::Running] {
                    let n = counts.iter().find(|(k, s, _)| *k == kind && *s == status).map_or(0, |c| c.2);
                    t.jobs.get_or_create(&JobLabels { kind: kind.as_str(), state: status.as_str() }).set(n);
                }
            }
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "metrics: job counts not refreshed"),
        Err(_) => tracing::warn!("metrics: job counts not refreshed (the store timed out)"),
    }
    if let Some(trainer) = state.tinker_trainer() {
        let held = trainer.memory();
        t.tinker_models.get_or_create(&StateLabel { state: "live" }).set(held.live as i64);
        t.tinker_models.get_or_create(&StateLabel { state: "parked" }).set(held.parked as i64);
        t.tinker_bytes.set(held.live_bytes.min(i64::MAX as u64) as i64);
    }
    let mut per_caller = Registry::default();
    if !state.models().is_empty() {
        let activity: Vec<LoraActivity> = state.models().iter().map(|m| m.lora_activity()).collect();
        let (labels, updated) = lora_info(&activity, caller);
        let family = Family::<LoraInfoLabels, Gauge<f64, AtomicU64>>::default();
        family.get_or_create(&labels).set(updated);
        per_caller.register("vllm:lora_requests_info", "Running stats on lora requests", family);
    }
    let mut text = String::new();
    encode_registry(&mut text, &t.registry)
        .and_then(|_| encode_registry(&mut text, &per_caller))
        .and_then(|_| encode_eof(&mut text))
        .map_err(|_| {
            crate::error::ApiError::new(crate::error::ErrorKind::Internal, "the metrics could not be encoded")
        })?;
    Ok(text)
}

/// vLLM's `vllm:lora_requests_info` labels: the adapters one batch holds, and the names of the
/// adapters running and waiting, comma-joined. A router (the Gateway API Inference Extension's
/// endpoint picker) sends a request for an adapter to a node that lists it as running.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LoraInfoLabels {
    max_lora: String,
    waiting_lora_adapters: String,
    running_lora_adapters: String,
}

/// The one `vllm:lora_requests_info` series of the node's engines as `caller` may see it, and its
/// value: the newest engine round, in Unix seconds (vLLM sets the time of its last update).
/// Another entity's adapter names are left out (they name its projects and models), as are names
/// holding a comma, which the joined label could not carry.
pub(crate) fn lora_info(engines: &[LoraActivity], caller: &str) -> (LoraInfoLabels, f64) {
    let names = |pick: fn(&LoraActivity) -> &Vec<Arc<LoraTag>>| {
        let mut seen: Vec<&str> = engines
            .iter()
            .flat_map(|e| pick(e).iter())
            .filter(|t| t.owner == caller && !t.name.contains(','))
            .map(|t| t.name.as_str())
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen.join(",")
    };
    let labels = LoraInfoLabels {
        max_lora: engines.iter().map(|e| e.max_lora).max().unwrap_or(0).to_string(),
        waiting_lora_adapters: names(|e| &e.waiting),
        running_lora_adapters: names(|e| &e.running),
    };
    (labels, engines.iter().map(|e| e.updated_unix).fold(0.0, f64::max))
}

#[cfg(test)]
mod tests {
    use super::{classic_text, lora_info, standard_method, status_class, wants_openmetrics};
    use std::sync::Arc;
    use tandem_core::inference::{LoraActivity, LoraTag};

    #[test]
    fn lora_info_names_only_the_callers_adapters_once_each() {
        let tag = |name: &str, owner: &str| Arc::new(LoraTag { name: name.into(), owner: owner.into() });
        let engines = [
            LoraActivity {
                running: vec![tag("a/p/m:step2", "a"), tag("b/secret/m:step1", "b"), tag("x,y", "a")],
                waiting: vec![tag("a/p/m:step3", "a")],
                max_lora: 32,
                updated_unix: 100.5,
            },
            LoraActivity {
                running: vec![tag("a/p/m:step2", "a"), tag("mine", "a")],
                waiting: vec![],
                max_lora: 8,
                updated_unix: 101.0,
            },
        ];
        let (labels, at) = lora_info(&engines, "a");
        assert_eq!(labels.running_lora_adapters, "a/p/m:step2,mine");
        assert_eq!(labels.waiting_lora_adapters, "a/p/m:step3");
        assert_eq!(labels.max_lora, "32");
        assert_eq!(at, 101.0);
        let (other, _) = lora_info(&engines, "c");
        assert_eq!((other.running_lora_adapters.as_str(), other.waiting_lora_adapters.as_str()), ("", ""));
        assert_eq!(lora_info(&engines, "b").0.running_lora_adapters, "b/secret/m:step1");
    }

    #[test]
    fn openmetrics_becomes_the_classic_text_format() {
        let open = "# HELP http_requests Total number of \\\"requests\\\".\n# TYPE http_requests counter\n\
                    http_requests_total{handler=\"/x\"} 3 # {trace_id=\"a\"} 1.0\n\
                    # HELP tokens Tokens.\n# TYPE tokens gauge\n# UNIT tokens tokens\ntokens 2\n\
                    # TYPE d histogram\nd_bucket{le=\"+Inf\"} 1\nd_sum 0.5\nd_count 1\n\
                    # TYPE i info\ni_info{v=\"1\"} 1\n# EOF\n";
        assert_eq!(
            classic_text(open),
            "# HELP http_requests_total Total number of \"requests\".\n# TYPE http_requests_total counter\n\
             http_requests_total{handler=\"/x\"} 3\n\
             # HELP tokens Tokens.\n# TYPE tokens gauge\ntokens 2\n\
             # TYPE d histogram\nd_bucket{le=\"+Inf\"} 1\nd_sum 0.5\nd_count 1\n\
             # TYPE i untyped\ni_info{v=\"1\"} 1\n"
        );
    }

    #[test]
    fn only_an_openmetrics_accept_gets_openmetrics() {
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prom)));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4;q=0.5,*/*;q=0.1")));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }

    #[test]
    fn statuses_are_grouped_by_class() {
        assert_eq!(status_class(200), "2xx");
        assert_eq!(status_class(429), "4xx");
        assert_eq!(status_class(503), "5xx");
        assert_eq!(status_class(101), "1xx");
    }

    #[test]
    fn only_standard_methods_become_labels() {
        use axum::http::Method;
        assert_eq!(standard_method(&Method::POST), "POST");
        assert_eq!(standard_method(&Method::from_bytes(b"FROBNICATE").unwrap()), "other");
    }
}
