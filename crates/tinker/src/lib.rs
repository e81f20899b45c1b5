//! The Tinker service below HTTP. Today: its catalog ([`Catalog`]: saved states, sampler weights
//! saved by name, external weights, their expiries and publish marks) as store rows and
//! checkpoint-store files, so any node of a cluster reads the same catalog, and the import of
//! catalogs older versions kept as files ([`legacy`]). The session queue, futures and caps still
//! live in `tandem-api`'s `tinker` module (docs/status.md says what is left to move).
//!
//! The compute port (`tandem_core::tinker::TinkerTrainer`) trains; this crate keeps what the
//! training leaves.

pub mod catalog;
pub mod legacy;

pub use catalog::{Catalog, SavedState};
