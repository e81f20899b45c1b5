//! Schemas of the Tinker routes' bodies (`/api/v1/...`, the `tinker` SDK 0.38's wire), for the
//! OpenAPI document only: the handlers decode their own types (`tinker/*.rs`) and check the
//! rules stated here, so a client reading this document and the server agree. Names carry
//! `Tinker` so they never collide with the preview area's schemas.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::{IntoParams, IntoResponses, ToSchema};

use super::bodies::{PreviewErrorBody, ValidationErrorBody};

/// The errors every keyed Tinker route may answer with, in FastAPI's shape as the SDK reads
/// them. The SDK retries 429 and 503 (both carry `Retry-After`) and raises the rest.
#[derive(IntoResponses)]
pub enum TinkerErrors {
    #[response(status = 401, description = "No valid API key (`X-API-Key: tml-<key>` or a bearer token)")]
    Unauthorized(PreviewErrorBody),
    #[response(status = 404, description = "No such session, model, request or checkpoint for this key's entity")]
    NotFound(PreviewErrorBody),
    #[response(status = 422, description = "The body does not decode or breaks a rule")]
    Invalid(ValidationErrorBody),
    #[response(
        status = 429,
        description = "The entity holds its share already (sessions, models, pending results, queued bytes); Retry-After"
    )]
    Busy(PreviewErrorBody),
    #[response(status = 503, description = "This node does not train, or the store did not answer; Retry-After")]
    Unavailable(PreviewErrorBody),
}

/// A checkpoint of a run, as the RestClient's paths name it.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TinkerCheckpointPath {
    /// A run id, `{session}:train:{n}`.
    pub run: String,
    /// `weights`, `sampler_weights` or `external_weights`.
    pub kind: String,
    /// The checkpoint's name.
    pub name: String,
}

/// An offset page of a listing.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TinkerPage {
    /// Page size (1 to 100).
    pub limit: Option<i64>,
    /// Items to skip.
    pub offset: Option<i64>,
}

/// A JSON object the SDK reads (its fields are the SDK's types of the same name).
#[derive(ToSchema)]
pub struct TinkerObject(BTreeMap<String, Value>);

/// `{session_id}` of a heartbeat.
#[derive(ToSchema)]
pub struct TinkerSessionRef {
    pub session_id: String,
}

/// A training call's immediate answer: the future `retrieve_future` fetches.
#[derive(ToSchema)]
pub struct TinkerSubmitted {
    pub request_id: String,
    pub model_id: String,
}

/// `asample`'s immediate answer.
#[derive(ToSchema)]
pub struct TinkerSubmittedSamples {
    pub request_id: String,
    pub sample_sequence_ids: Vec<String>,
}

/// The LoRA a model trains.
#[derive(ToSchema)]
pub struct TinkerLoraConfig {
    #[schema(minimum = 1, maximum = 256)]
    pub rank: u32,
    pub seed: Option<u64>,
    /// Adapters on the MLP projections (default true).
    pub train_mlp: Option<bool>,
    /// Adapters on the attention projections (default true).
    pub train_attn: Option<bool>,
    /// An adapter on the output head (default true). Not all three false.
    pub train_unembed: Option<bool>,
}

/// `create_model`: model `model_seq_id` of a session on a served base model.
#[derive(ToSchema)]
pub struct TinkerCreateModel {
    pub session_id: String,
    #[schema(minimum = 0)]
    pub model_seq_id: i64,
    /// A served base model (`get_server_capabilities`).
    pub base_model: String,
    /// Required: only LoRA models are trained.
    pub lora_config: Option<TinkerLoraConfig>,
    /// `{"type": "adamw"}` (the only optimizer).
    pub optimizer_config: Option<TinkerObject>,
}

/// A model by its id (`{session}:train:{n}`).
#[derive(ToSchema)]
pub struct TinkerModelRef {
    pub model_id: String,
}

/// AdamW's settings for one step.
#[derive(ToSchema)]
pub struct TinkerAdamParams {
    pub learning_rate: f64,
    pub beta1: Option<f64>,
    pub beta2: Option<f64>,
    pub eps: Option<f64>,
    pub weight_decay: Option<f64>,
    /// 0: no clipping.
    pub grad_clip_norm: Option<f64>,
}

/// `optim_step`: a call in the model's `seq_id` order.
#[derive(ToSchema)]
pub struct TinkerOptimStep {
    pub model_id: String,
    pub seq_id: i64,
    pub adam_params: TinkerAdamParams,
}

/// `save_weights_for_sampler`: named weights (`path`) or the ephemeral kind
/// (`sampling_session_seq_id`).
#[derive(ToSchema)]
pub struct TinkerSaveForSampler {
    pub model_id: String,
    pub seq_id: i64,
    pub path: Option<String>,
    pub sampling_session_seq_id: Option<i64>,
    /// 3600 to 315360000, or null (never).
    pub ttl_seconds: Option<i64>,
    /// `snapshot` (default) or `inflight`.
    pub kind: Option<String>,
}

/// `save_weights` (a training state) and `save_weights_external` (PEFT files).
#[derive(ToSchema)]
pub struct TinkerSaveState {
    pub model_id: String,
    pub seq_id: i64,
    /// The name.
    pub path: String,
    pub ttl_seconds: Option<i64>,
    /// `save_weights_external` only: age recipients (`age1...`) the files are encrypted to.
    pub age_encryption_recipients: Option<Vec<String>>,
}

/// `load_weights`: a new model (`session_id`, `model_seq_id`) or into a held one (`model_id`,
/// `seq_id`) from `tinker://RUN/weights/NAME`.
#[derive(ToSchema)]
pub struct TinkerLoadState {
    pub session_id: Option<String>,
    pub model_seq_id: Option<i64>,
    pub model_id: Option<String>,
    pub seq_id: Option<i64>,
    pub path: String,
    /// With the AdamW moments and step.
    pub optimizer: Option<bool>,
}

/// `weights_info`: what a `tinker://` path names.
#[derive(ToSchema)]
pub struct TinkerWeightsInfo {
    pub tinker_path: String,
}

/// `create_sampling_session`: of a base model or of saved sampler weights.
#[derive(ToSchema)]
pub struct TinkerCreateSampler {
    pub session_id: String,
    pub sampling_session_seq_id: i64,
    pub base_model: Option<String>,
    pub model_path: Option<String>,
}

/// A prompt as chunks of tokens (`{"type": "encoded_text", "tokens": [...]}`).
#[derive(ToSchema)]
pub struct TinkerPrompt {
    pub chunks: Vec<TinkerObject>,
}

#[derive(ToSchema)]
pub struct TinkerSamplingParams {
    pub max_tokens: Option<u64>,
    pub seed: Option<i64>,
    /// A string, token ids or a list of strings.
    pub stop: Option<Value>,
    pub temperature: Option<f64>,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
}

/// `asample`: samples of a sampling session, with the logprobs asked for.
#[derive(ToSchema)]
pub struct TinkerSample {
    pub sampling_session_id: String,
    pub num_samples: Option<u32>,
    pub prompt: TinkerPrompt,
    pub sampling_params: Option<TinkerSamplingParams>,
    pub prompt_logprobs: Option<bool>,
    pub prompt_logprobs_last_n: Option<i64>,
    pub topk_prompt_logprobs: Option<i64>,
    pub topk_sample_logprobs: Option<i64>,
    pub prompt_alt_tokens_k: Option<i64>,
    /// A tensor (`{"data": [...], "dtype": "int64", "shape": [...]}`) of target tokens.
    pub target_prompt_logprobs: Option<TinkerObject>,
}

/// A checkpoint's TTL (null: never expires).
#[derive(ToSchema)]
pub struct TinkerTtl {
    pub ttl_seconds: Option<i64>,
}

/// `retrieve_future`.
#[derive(ToSchema)]
pub struct TinkerRetrieve {
    pub request_id: String,
}

/// A protobuf message of `proto/tinker_public.proto` (`ForwardBackwardRequest` in,
/// `ForwardBackwardOutput` or `SampleResponse` out).
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct TinkerProtobuf(Vec<u8>);
