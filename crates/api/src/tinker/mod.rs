//! The Tinker training API's wire formats (the `tinker` SDK 0.38.0's protobuf bodies).
//!
//! - [`pb`]: prost types of `proto/tinker_public.proto` (field numbers are the SDK's).
//! - [`wire`]: a `forward_backward` request's data read into token ids, targets and loss inputs,
//!   checked; its output (per-datum logprobs, `name:reduction` metrics) encoded.
//! - `answer`: FastAPI's error shapes, the one map of `TinkerError` kinds, the typed JSON body.
//! - [`routes`]: the handlers under `/api/v1/` (configuration, sessions, training calls, futures).
//! - [`models`]: `create_model`, `get_info`, and the registration `load_weights` shares.
//! - [`front`]: in a cluster, each call forwarded to the node holding its session; `resume`:
//!   the sessions' rows in the store, and a session taken over when its node stopped.
//! - `order`: training calls into their model's `seq_id` order through the service
//!   (`tandem_tinker::registry`: sessions, models, futures, caps), answered as the SDK reads them.
//! - [`weights`]: saving for the sampler, saving and loading the training state.
//! - [`runs`]: the RestClient's listings of runs and their checkpoints.
//! - [`external`]: adapters saved as PEFT files and downloaded by signed URLs.
//! - [`expiry`]: checkpoints' TTLs, and the sweep that deletes what has expired.
//! - [`publish`]: checkpoints published to every entity that knows their path.
//! - `samplers`: sampler weights saved by name, found and checked live.
//! - [`sample`]: sampling sessions and `asample` through the engine.
//! - `scores`: top-k, target and alternative-token answers of `asample`.

mod answer;
pub mod expiry;
pub mod external;
pub mod front;
pub mod models;
mod order;
pub mod publish;
mod resume;
pub mod routes;
pub mod runs;
pub mod sample;
mod samplers;
mod scores;
pub mod weights;
pub mod wire;

use crate::auth::require_tinker;
use crate::AppState;
use axum::middleware::from_fn_with_state;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The Tinker service's memory on this node, with this front's sampling sessions.
pub type TinkerState = tandem_tinker::Registry<sample::Sampler>;

/// The Tinker routes (nested under `/api/v1`), each in `/openapi.json`; anything else there is a
/// clear 404.
pub fn router(state: AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(routes::client_config))
        .routes(routes!(routes::dynamic_config))
        .routes(routes!(routes::telemetry))
        .routes(routes!(routes::capabilities))
        .routes(routes!(routes::create_session))
        .routes(routes!(routes::heartbeat))
        .routes(routes!(routes::finish))
        .routes(routes!(models::create_model))
        .routes(routes!(models::get_info))
        .routes(routes!(routes::forward_backward))
        .routes(routes!(routes::optim_step))
        .routes(routes!(weights::save_weights_for_sampler))
        .routes(routes!(weights::save_weights))
        .routes(routes!(weights::load_weights))
        .routes(routes!(sample::create))
        .routes(routes!(sample::get))
        .routes(routes!(sample::asample))
        .routes(routes!(runs::list_runs))
        .routes(routes!(runs::get_run))
        .routes(routes!(runs::list_checkpoints))
        .routes(routes!(runs::list_all_checkpoints))
        .routes(routes!(weights::delete_checkpoint))
        .routes(routes!(external::save))
        .routes(routes!(external::urls))
        .routes(routes!(expiry::set_ttl))
        .routes(routes!(publish::publish, publish::unpublish))
        .routes(routes!(weights::weights_info))
        .routes(routes!(routes::retrieve_future))
        .fallback(routes::not_served)
        // In a cluster, a session's calls go to the node holding it (after authentication).
        .layer(from_fn_with_state(state.clone(), front::route))
        .layer(from_fn_with_state(state, require_tinker))
        // Signed URLs carry their permission: a plain HTTP client fetches them without a key.
        .routes(routes!(external::download))
}

/// The SDK's protobuf messages.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tinker_public.rs"));
}
