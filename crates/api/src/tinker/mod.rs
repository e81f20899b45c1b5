//! The Tinker training API's wire formats (the `tinker` SDK 0.38.0's protobuf bodies).
//!
//! - [`pb`]: prost types of `proto/tinker_public.proto` (field numbers are the SDK's).
//! - [`wire`]: a `forward_backward` request's data read into token ids, targets and loss inputs,
//!   checked; its output (per-datum logprobs, `name:reduction` metrics) encoded.
//! - [`state`]: sessions, models in `seq_id` order, futures.
//! - [`routes`]: the handlers under `/api/v1/` (sessions, models, training calls, futures).
//! - `order`: training calls run in their model's `seq_id` order, each consuming its `seq_id`.
//! - [`weights`]: saving for the sampler, saving and loading the training state.
//! - [`runs`]: the RestClient's listings of runs and their checkpoints.
//! - [`external`]: adapters saved as PEFT files and downloaded by signed URLs.
//! - [`expiry`]: checkpoints' TTLs, and the sweep that deletes what has expired.
//! - [`publish`]: checkpoints published to every entity that knows their path.
//! - `samplers`: sampler weights saved by name, found and checked live.
//! - [`sample`]: sampling sessions and `asample` through the engine.
//! - `scores`: top-k, target and alternative-token answers of `asample`.

pub mod expiry;
pub mod external;
mod order;
pub mod publish;
pub mod routes;
pub mod runs;
pub mod sample;
mod samplers;
mod scores;
pub mod state;
pub mod weights;
pub mod wire;

use crate::auth::require_tinker;
use crate::AppState;
use axum::middleware::from_fn_with_state;
use axum::routing::post;
use axum::Router;

/// The Tinker routes (nested under `/api/v1`); anything else there is a clear 404.
pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/client/config", post(routes::client_config))
        .route("/client/dynamic_config", post(routes::dynamic_config))
        .route("/telemetry", post(routes::telemetry))
        .route("/get_server_capabilities", axum::routing::get(routes::capabilities))
        .route("/create_session", post(routes::create_session))
        .route("/session_heartbeat", post(routes::heartbeat))
        .route("/sessions/{id}/finish", post(routes::finish))
        .route("/create_model", post(routes::create_model))
        .route("/get_info", post(routes::get_info))
        .route("/forward_backward", post(routes::forward_backward))
        .route("/optim_step", post(routes::optim_step))
        .route("/save_weights_for_sampler", post(weights::save_weights_for_sampler))
        .route("/save_weights", post(weights::save_weights))
        .route("/load_weights", post(weights::load_weights))
        .route("/create_sampling_session", post(sample::create))
        .route("/samplers/{id}", axum::routing::get(sample::get))
        .route("/asample", post(sample::asample))
        .route("/training_runs", axum::routing::get(runs::list_runs))
        .route("/training_runs/{run}", axum::routing::get(runs::get_run))
        .route("/training_runs/{run}/checkpoints", axum::routing::get(runs::list_checkpoints))
        .route("/checkpoints", axum::routing::get(runs::list_all_checkpoints))
        .route("/training_runs/{run}/checkpoints/{kind}/{name}", axum::routing::delete(weights::delete_checkpoint))
        .route("/save_weights_external", post(external::save))
        .route(
            "/training_runs/{run}/checkpoints/{kind}/{name}/external_weights_urls",
            axum::routing::get(external::urls),
        )
        .route("/training_runs/{run}/checkpoints/{kind}/{name}/ttl", axum::routing::put(expiry::set_ttl))
        .route(
            "/training_runs/{run}/checkpoints/{kind}/{name}/publish",
            post(publish::publish).delete(publish::unpublish),
        )
        .route("/weights_info", post(weights::weights_info))
        .route("/retrieve_future", post(routes::retrieve_future))
        .fallback(routes::not_served)
        .layer(from_fn_with_state(state, require_tinker))
        // Signed URLs carry their permission: a plain HTTP client fetches them without a key.
        .route("/external_weights_files/{token}/{file}", axum::routing::get(external::download))
}

/// The SDK's protobuf messages.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tinker_public.rs"));
}
