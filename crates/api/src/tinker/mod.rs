//! The Tinker training API's wire formats (the `tinker` SDK 0.38.0's protobuf bodies).
//!
//! - [`pb`]: prost types of `proto/tinker_public.proto` (field numbers are the SDK's).
//! - [`wire`]: a `forward_backward` request's data read into token ids, targets and loss inputs,
//!   checked; its output (per-datum logprobs, `name:reduction` metrics) encoded.

pub mod wire;

/// The SDK's protobuf messages.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tinker_public.rs"));
}
