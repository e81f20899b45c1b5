//! `GET /metrics`: one Prometheus registry holding the engine's series (vLLM's names), the
//! training worker's, the queued and running jobs read from the store at each scrape, and HTTP
//! requests per route as vLLM's server exports them (`http_requests_total`,
//! `http_request_duration_seconds`). Encoded by `prometheus-client` in the OpenMetrics text
//! format, which Prometheus asks for first and reads natively.

use crate::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Instant;
use tandem_core::records::{JobKind, JobStatus};
use tandem_core::telemetry::{TrainingMetrics, HTTP_DURATION_BUCKETS};

/// What Prometheus is told the body is.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
        Telemetry { registry, requests, durations, jobs }
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

/// The registry's text, with the job gauges refreshed from the store first.
pub(crate) async fn render(state: &AppState) -> Result<String, crate::error::ApiError> {
    let counts = state.store().active_job_counts().await?;
    let t = state.telemetry();
    for kind in [JobKind::Rl, JobKind::Sft] {
        for status in [JobStatus::Queued, JobStatus::Running] {
            let n = counts.iter().find(|(k, s, _)| *k == kind && *s == status).map_or(0, |c| c.2);
            t.jobs.get_or_create(&JobLabels { kind: kind.as_str(), state: status.as_str() }).set(n);
        }
    }
    let mut text = String::new();
    encode(&mut text, &t.registry).map_err(|_| {
        crate::error::ApiError::new(crate::error::ErrorKind::Internal, "the metrics could not be encoded")
    })?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::{standard_method, status_class};

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
