//! tandem's domain: types and pure rules shared by every other crate. No I/O, no async.
//!
//! - [`validate`]: walking JSON bodies and collecting pydantic-shaped field errors.
//! - [`trajectory`]: validating ART trajectory groups into summaries.
//! - [`metrics`]: the metrics a trajectory log computes.
//! - [`train_config`]: the typed `experimental_config`.
//! - [`sequences`]: ART trajectories to the token sequences a trainer trains on.
//! - [`sft`]: supervised fine-tuning: datasets, config, trained spans of a conversation.
//! - [`records`]: models, checkpoints, logs, jobs and events as the store keeps them.
//! - [`names`]: what a model address may contain.
//! - [`chat`]: chat messages (role and content typed, the rest as sent).
//! - [`inference`]: the port between the api and the inference engine.
//! - [`tinker`]: the port between the Tinker routes and the training sessions.
//! - [`tool_calls`]: tool calls in each model family's own syntax, and reading them back.
//! - [`seq_order`]: the `seq_id` order of a Tinker model's calls (a pure ledger).
//! - [`beam`]: beam search steps and ranking (vLLM's `use_beam_search`).
//! - [`health`]: the training worker's heartbeat.
//! - [`history`]: a model's curves over steps, downsampled.
//! - [`hf_files`]: where a tokenizer's files go for a Hugging Face client (a hub cache's layout).
//! - [`telemetry`]: Prometheus metrics shared by the engine, the worker and the api.

pub mod beam;
pub mod chat;
pub mod health;
pub mod hf_files;
pub mod history;
pub mod inference;
pub mod metrics;
pub mod names;
pub mod records;
pub mod seq_order;
pub mod sequences;
pub mod sft;
pub mod telemetry;
pub mod tinker;
pub mod tool_calls;
pub mod train_config;
pub mod trajectory;
pub mod validate;

/// A new time-ordered id (UUIDv7).
pub fn new_id() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}
