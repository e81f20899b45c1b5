//! Schemas of what the routes read and of the bodies they answer with that are not typed views
//! (errors, chat completions, health). The handlers validate raw JSON with `tandem_core::validate`
//! (so that errors come in the contract's shape, every field at once); these types describe the
//! same rules to the OpenAPI document and are never deserialised. Constraints are stated where the
//! validator enforces exactly them, and left out where a rule is semantic (a served model's name,
//! a context length): the reliability suite's schemathesis run checks both directions.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::{IntoParams, IntoResponses, ToSchema};
use uuid::Uuid;

// ---------- errors ----------

/// The preview area's error body (FastAPI's): a message.
#[derive(ToSchema)]
pub struct PreviewErrorBody {
    pub detail: String,
}

/// One problem with a request field, as FastAPI (pydantic) reports it.
#[derive(ToSchema)]
pub struct FieldErrorBody {
    /// Where: `body`, `query` or `path`, then keys (strings) and indices (integers).
    pub loc: Vec<Value>,
    pub msg: String,
    #[schema(rename = "type")]
    pub kind: String,
    /// The offending value, any JSON.
    pub input: Value,
    pub ctx: Option<Value>,
}

/// The preview area's validation error (422): every field problem at once.
#[derive(ToSchema)]
pub struct ValidationErrorBody {
    pub detail: Vec<FieldErrorBody>,
}

/// The OpenAI-compatible area's error (vLLM's shape).
#[derive(ToSchema)]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorDetail,
}

/// The errors every inference route (chat, `/tokenize`, `/detokenize`) may answer with.
#[derive(IntoResponses)]
pub enum InferenceErrors {
    #[response(status = 400, description = "Invalid request")]
    BadRequest(OpenAiErrorBody),
    #[response(status = 401, description = "No valid API key")]
    Unauthorized(OpenAiErrorBody),
    #[response(status = 404, description = "No such model for this key's entity")]
    NotFound(OpenAiErrorBody),
    #[response(status = 429, description = "Too many concurrent requests of this entity (Retry-After)")]
    TooManyRequests(OpenAiErrorBody),
    #[response(status = 503, description = "Queue full or no engine (Retry-After)")]
    Unavailable(OpenAiErrorBody),
}

/// The errors of `/v1/messages`, in Anthropic's shape.
#[derive(IntoResponses)]
pub enum AnthropicErrors {
    #[response(status = 400, description = "Invalid request (`invalid_request_error`)")]
    BadRequest(AnthropicErrorBody),
    #[response(status = 401, description = "No valid API key (`authentication_error`)")]
    Unauthorized(AnthropicErrorBody),
    #[response(status = 404, description = "No such model for this key's entity (`not_found_error`)")]
    NotFound(AnthropicErrorBody),
    #[response(
        status = 429,
        description = "Too many concurrent requests of this entity (`rate_limit_error`, Retry-After)"
    )]
    TooManyRequests(AnthropicErrorBody),
    #[response(status = 503, description = "Queue full or no engine (`overloaded_error`, Retry-After)")]
    Unavailable(AnthropicErrorBody),
}

/// `{"type": "error", "error": {"type", "message"}}`.
#[derive(ToSchema)]
pub struct AnthropicErrorBody {
    /// `error`.
    #[schema(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorDetail,
}

#[derive(ToSchema)]
pub struct AnthropicErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, `rate_limit_error`,
    /// `overloaded_error`, `api_error`, ...
    #[schema(rename = "type")]
    pub kind: String,
    pub message: String,
}

#[derive(ToSchema)]
pub struct OpenAiErrorDetail {
    pub message: String,
    #[schema(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    /// The HTTP status.
    pub code: u16,
}

// ---------- query parameters ----------

/// A cursor page of a list, in creation order.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// The id (a UUID) of the last item of the previous page; empty: the first page.
    pub after: Option<String>,
    /// Items per page.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    /// `asc` (oldest first, the default) or `desc`.
    #[param(inline)]
    pub order: Option<SortOrder>,
}

#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum SortOrder {
    Asc,
    Desc,
}

/// A cursor page of a job's events, always in append order.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventPageParams {
    /// The id (a UUID) of the last event already read; empty: from the first.
    pub after: Option<String>,
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProjectFilter {
    /// Only this project's items.
    pub project: Option<String>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SplitFilter {
    /// Only logs of this split.
    pub split: Option<String>,
}

/// Where an uploaded dataset goes: the address `wandb-artifact:///entity/project/name:vN`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DatasetAddress {
    #[param(min_length = 1, max_length = 128, pattern = r"^(?!.*:step[0-9]{1,18}$)[^/\s\x00-\x1f\x7f-\x9f]+$")]
    pub project: String,
    #[param(min_length = 1, max_length = 128, pattern = r"^(?!.*:step[0-9]{1,18}$)[^/\s\x00-\x1f\x7f-\x9f]+$")]
    pub name: String,
}

// ---------- preview request bodies ----------

/// `POST /v1/preview/models`.
#[derive(ToSchema)]
pub struct CreateModelBody {
    /// Must be the key's own entity when given.
    pub entity: Option<String>,
    /// No `/`, whitespace or control characters, and no `:stepN` ending.
    #[schema(min_length = 1, max_length = 128, pattern = r"^(?!.*:step[0-9]{1,18}$)[^/\s\x00-\x1f\x7f-\x9f]+$")]
    pub project: String,
    #[schema(min_length = 1, max_length = 128, pattern = r"^(?!.*:step[0-9]{1,18}$)[^/\s\x00-\x1f\x7f-\x9f]+$")]
    pub name: String,
    /// One of the base models this server serves (`GET /v1/models`).
    pub base_model: String,
    /// Answer with the existing model of that name instead of a 409.
    pub return_existing: Option<bool>,
}

/// `POST /v1/preview/models/{model_id}/log`: a batch of scored trajectory groups.
#[derive(ToSchema)]
pub struct LogBody {
    /// `train` or `val` (any short name without `/`).
    #[schema(min_length = 1, max_length = 64)]
    pub split: String,
    #[schema(min_items = 1)]
    pub trajectory_groups: Vec<TrajectoryGroupBody>,
}

/// Trajectories rolled out from one prompt; the advantage compares them.
#[derive(ToSchema)]
pub struct TrajectoryGroupBody {
    #[schema(min_items = 1)]
    pub trajectories: Vec<TrajectoryBody>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub exceptions: Option<Value>,
}

/// One rollout: its messages and choices (a choice holds the sampled tokens' logprobs), reward
/// and metrics.
#[derive(ToSchema)]
pub struct TrajectoryBody {
    #[schema(value_type = Vec<Object>, min_items = 1)]
    pub messages_and_choices: Value,
    pub reward: f64,
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub additional_histories: Option<Value>,
    pub metrics: Option<BTreeMap<String, f64>>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub logs: Option<Value>,
    pub initial_policy_version: Option<i64>,
    pub final_policy_version: Option<i64>,
    pub start_time: Option<String>,
    pub end_time: Option<String>,
}

/// `POST /v1/preview/training-jobs`: an RL step on the given logs (ART's `train`).
#[derive(ToSchema)]
pub struct TrainingJobBody {
    pub model_id: Uuid,
    /// The trajectory groups to train on.
    #[schema(min_items = 1)]
    pub trajectory_groups: Vec<TrajectoryGroupBody>,
    /// ART's `dev` / `_config` knobs (learning rate, KL penalty, PPO/GRPO variants, ...).
    #[schema(value_type = Option<Object>)]
    pub experimental_config: Option<Value>,
}

/// `POST /v1/preview/sft-training-jobs`: supervised fine-tuning on an uploaded dataset.
#[derive(ToSchema)]
pub struct SftJobBody {
    pub model_id: Uuid,
    /// `wandb-artifact:///entity/project/name:vN` of an uploaded dataset.
    pub training_data_url: String,
    #[schema(value_type = Option<Object>)]
    pub config: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub experimental_config: Option<Value>,
}

/// `DELETE /v1/preview/models/{model_id}/checkpoints`.
#[derive(ToSchema)]
pub struct DeleteCheckpointsBody {
    /// Steps to delete (1 or more).
    #[schema(min_items = 1)]
    pub steps: Vec<i64>,
}

// ---------- OpenAI-compatible bodies ----------

/// `POST /v1/chat/completions`, as vLLM serves it. Every field of the interface is accepted;
/// the ones below are those with a shape worth stating (the rest: see the interface document).
#[derive(ToSchema)]
pub struct ChatCompletionBody {
    #[schema(min_items = 1)]
    pub messages: Vec<ChatMessageBody>,
    /// A served base model, a model record's name, or `name:stepN` of a checkpoint.
    pub model: Option<String>,
    pub n: Option<i64>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stream: Option<bool>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    #[schema(value_type = Option<Object>)]
    pub stop: Option<Value>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub structured_outputs: Option<Value>,
    pub return_token_ids: Option<bool>,
    pub priority: Option<i64>,
    pub cache_salt: Option<String>,
}

/// One chat message; `content` is a string or a list of text parts.
#[derive(ToSchema)]
pub struct ChatMessageBody {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    #[schema(value_type = Object, nullable)]
    pub content: Option<Value>,
    pub name: Option<String>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Value>,
    pub tool_call_id: Option<String>,
}

/// A chat completion (`stream: false`); a stream sends `chat.completion.chunk` events instead.
#[derive(ToSchema)]
pub struct ChatCompletionResponse {
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    pub created: i64,
    pub model: String,
    #[schema(value_type = Vec<Object>)]
    pub choices: Value,
    #[schema(value_type = Object)]
    pub usage: Value,
}

/// `POST /v1/completions`, as vLLM serves it. The sampling fields and vLLM's extras are those of
/// chat completions; the ones below are completions' own or worth stating.
#[derive(ToSchema)]
pub struct CompletionBody {
    /// A string, a list of strings, a list of token ids, or a list of lists of token ids.
    #[schema(value_type = Object)]
    pub prompt: Value,
    /// A served base model, a model record's name, or `name:stepN` of a checkpoint.
    pub model: Option<String>,
    /// Default 16.
    pub max_tokens: Option<i64>,
    pub n: Option<i64>,
    /// Must equal `n` when given.
    pub best_of: Option<i64>,
    /// Prepend the prompt to each choice's text (and, with `logprobs`, its tokens' logprobs).
    pub echo: Option<bool>,
    /// Top alternatives per token (0-20); 0 returns the sampled tokens' logprobs alone.
    pub logprobs: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<i64>,
    pub stream: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub stop: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub structured_outputs: Option<Value>,
    /// Default true: text prompts get the tokenizer's special tokens (a BOS).
    pub add_special_tokens: Option<bool>,
    pub return_token_ids: Option<bool>,
    pub prompt_logprobs: Option<i64>,
    pub priority: Option<i64>,
    pub cache_salt: Option<String>,
}

/// A completion (`stream: false`); a stream sends `text_completion` chunks instead.
#[derive(ToSchema)]
pub struct CompletionResponseBody {
    pub id: String,
    /// `text_completion`.
    pub object: String,
    pub created: i64,
    pub model: String,
    /// `n` choices per prompt, numbered prompt by prompt.
    #[schema(value_type = Vec<Object>)]
    pub choices: Value,
    #[schema(value_type = Object)]
    pub usage: Value,
}

/// `POST /v1/messages` (Anthropic's Messages API, as vLLM serves it). vLLM's extra sampling
/// fields (`return_token_ids`, `logprobs`, `priority`, `structured_outputs`, ...) are accepted too.
#[derive(ToSchema)]
pub struct MessagesBody {
    /// `{role: "user" | "assistant", content}`; content a string or blocks (`text`, `tool_use`,
    /// `tool_result`, `thinking`).
    #[schema(value_type = Vec<Object>)]
    pub messages: Value,
    pub max_tokens: i64,
    pub model: Option<String>,
    /// A string or a list of text blocks.
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    /// `{name, description, input_schema}` each.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    /// `{type: auto | any | tool | none, name?, disable_parallel_tool_use?}`.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// `{type: enabled, budget_tokens}` or `{type: disabled}`.
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<Value>,
}

/// A message (`stream: false`); a stream sends Anthropic's events instead.
#[derive(ToSchema)]
pub struct MessageResponseBody {
    /// `msg_<request id>`.
    pub id: String,
    /// `message`.
    #[schema(rename = "type")]
    pub kind: String,
    pub role: String,
    pub model: String,
    /// `text`, `thinking` and `tool_use` blocks.
    #[schema(value_type = Vec<Object>)]
    pub content: Value,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    /// `{input_tokens, output_tokens}`.
    #[schema(value_type = Object)]
    pub usage: Value,
}

/// `POST /v1/responses` (OpenAI's Responses API, as vLLM serves it). vLLM's extra sampling fields
/// (`return_token_ids`, `priority`, `top_k`, ...) are accepted too.
#[derive(ToSchema)]
pub struct ResponsesBody {
    /// A string, or input items: messages (`{role, content}`), `function_call`,
    /// `function_call_output`, `reasoning`.
    #[schema(value_type = Object)]
    pub input: Value,
    pub model: Option<String>,
    pub instructions: Option<String>,
    /// Continue the conversation of a stored response of this key's entity.
    pub previous_response_id: Option<String>,
    /// Default true: keep the response for `GET /v1/responses/{id}` and chaining.
    pub store: Option<bool>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stream: Option<bool>,
    /// Function tools: `{type: "function", name, description, parameters, strict}`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `{format: {type: text | json_object | json_schema, ...}}`.
    #[schema(value_type = Option<Object>)]
    pub text: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    pub include: Option<Vec<String>>,
    pub top_logprobs: Option<i64>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
}

/// A response object (`stream: false`, or `GET`); a stream sends the Responses events instead.
#[derive(ToSchema)]
pub struct ResponseObjectBody {
    /// `resp_...`.
    pub id: String,
    /// `response`.
    pub object: String,
    pub created_at: i64,
    /// `completed`, or `incomplete` (cut at `max_output_tokens`).
    pub status: String,
    pub model: String,
    /// `reasoning`, `message` and `function_call` items.
    #[schema(value_type = Vec<Object>)]
    pub output: Value,
    #[schema(value_type = Object)]
    pub usage: Value,
}

/// `POST /tokenize`: `prompt` text, or chat `messages` rendered with the model's template.
#[derive(ToSchema)]
pub struct TokenizeBody {
    pub model: Option<String>,
    pub prompt: Option<String>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<Value>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub return_token_strs: Option<bool>,
}

#[derive(ToSchema)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

/// `POST /v1/load_lora_adapter` (vLLM's body, plus `base_model_name`).
#[derive(ToSchema)]
pub struct LoadLoraBody {
    /// The name requests use as `model`: printable, no spaces, not a base model's id.
    pub lora_name: String,
    /// A PEFT adapter directory (`adapter_config.json`, `adapter_model.safetensors`), relative to
    /// the server's `--lora-root` or absolute under it.
    pub lora_path: String,
    /// Replace an adapter already loaded under this name (default false: that is a 400).
    pub load_inplace: Option<bool>,
    /// The served base model the adapter runs on (default: the first served model).
    pub base_model_name: Option<String>,
}

/// `POST /v1/unload_lora_adapter`.
#[derive(ToSchema)]
pub struct UnloadLoraBody {
    pub lora_name: String,
    /// vLLM's; accepted and ignored.
    pub lora_int_id: Option<i64>,
}

/// `POST /detokenize`.
#[derive(ToSchema)]
pub struct DetokenizeBody {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// `GET /health`.
#[derive(ToSchema)]
pub struct HealthBody {
    /// `ok` or `unavailable`.
    pub status: String,
    pub detail: Option<String>,
}

/// `GET /v1/system-check`: each part's `success`, `duration` and `error`.
#[derive(ToSchema)]
pub struct SystemCheckBody {
    pub api: bool,
    #[schema(value_type = Object)]
    pub database: Value,
    #[schema(value_type = Object)]
    pub training_queue: Value,
    #[schema(value_type = Object)]
    pub inference: Value,
}
