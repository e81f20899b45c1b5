//! The Tinker service below HTTP: what the routes of `tandem-api`'s `tinker` module call.
//!
//! - [`registry`]: sessions, training models with their calls in `seq_id` order, futures,
//!   sampling sessions, and each entity's shares (checked and taken in one step), in memory on
//!   the node serving them.
//! - [`catalog`]: saved states, sampler weights saved by name, external weights, their expiries
//!   and publish marks, as store rows and checkpoint-store files, so any node of a cluster reads
//!   the same catalog; [`legacy`] imports the file catalogs older versions kept.
//! - [`sweep`]: a checkpoint deleted (a client's `DELETE`, or its TTL passed) and the sweep of
//!   expired ones, through the front's port for sampler weights' checkpoints.
//! - [`urls`]: the signed download URLs of external weights.
//!
//! The compute port (`tandem_core::tinker::TinkerTrainer`) trains; this crate orders the calls
//! and keeps what the training leaves. Errors are `tandem_core::tinker::TinkerError` kinds, which
//! the front maps to statuses once.

pub mod catalog;
pub mod legacy;
pub mod registry;
pub mod sweep;
pub mod urls;

pub use catalog::{Catalog, SavedState};
pub use registry::{Accepted, ModelEntry, Outcome, Registry, Waits};
