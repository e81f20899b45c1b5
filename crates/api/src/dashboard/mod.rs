//! The web dashboard (issue 16): static pages built into the binary and served at
//! `/` and `/ui/...`, with no data of their own. They read the same JSON routes as any client,
//! with the API key the user signed in with (kept in the tab's `sessionStorage`, sent as a
//! Bearer header). A strict Content-Security-Policy allows only this server's own scripts,
//! styles and connections: nothing loads from elsewhere, nothing inline runs.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The files, by name under `/ui/`.
const JS: &str = "text/javascript; charset=utf-8";
const ASSETS: [(&str, &str, &str); 10] = [
    ("app.js", JS, include_str!("assets/app.js")),
    ("dom.js", JS, include_str!("assets/dom.js")),
    ("chart.js", JS, include_str!("assets/chart.js")),
    ("metrics.js", JS, include_str!("assets/metrics.js")),
    ("model.js", JS, include_str!("assets/model.js")),
    ("job.js", JS, include_str!("assets/job.js")),
    ("trajectories.js", JS, include_str!("assets/trajectories.js")),
    ("server.js", JS, include_str!("assets/server.js")),
    ("reference.js", JS, include_str!("assets/reference.js")),
    ("app.css", "text/css; charset=utf-8", include_str!("assets/app.css")),
];
const INDEX: &str = include_str!("assets/index.html");

fn page(content_type: &'static str, body: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // The files change with the binary only; revalidating is cheap and never shows a stale page.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => page(content_type, body),
        None => (StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

/// `/` and `/ui/{file}`: no key needed (the pages hold no data).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/", get(index)).route("/ui/{file}", get(asset))
}
