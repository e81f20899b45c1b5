//! The port between the Tinker routes (api) and the training sessions they drive (train): plain
//! numbers in, plain numbers out, so the api never sees a tensor.

use std::collections::BTreeMap;

/// One datum of a `forward_backward` call: input tokens, one target per token (position `i`
/// predicts `targets[i]`), and the loss inputs by key, each as long as the targets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Datum {
    pub tokens: Vec<u32>,
    pub targets: Vec<u32>,
    pub inputs: BTreeMap<String, Vec<f64>>,
}

/// Sampler weights saved by name: a checkpoint of the model's tandem record, remembered beyond
/// the model's session (as saved training states are), so its `tinker://` path samples, lists
/// and deletes after the run that saved it has ended. The checkpoint's id is kept with its step:
/// a step number is reused once the latest checkpoint is deleted, so a name is live only while
/// the checkpoint at its step is still the one it saved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedSampler {
    pub name: String,
    pub step: i64,
    pub checkpoint_id: uuid::Uuid,
    /// Milliseconds since the epoch.
    pub created_at: i64,
    pub record_id: uuid::Uuid,
    pub base_model: String,
    pub rank: usize,
    /// Whether the files carry an output-head pair (`train_unembed`).
    #[serde(default)]
    pub unembed: bool,
    /// Whether the attention's and the MLP's projections trained (saves before these were
    /// recorded trained both).
    #[serde(default = "trained")]
    pub attn: bool,
    #[serde(default = "trained")]
    pub mlp: bool,
}

fn trained() -> bool {
    true
}

/// A new model's adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraSpec {
    pub rank: usize,
    pub seed: Option<u64>,
    pub modules: Modules,
}

/// What an adapter trains (Tinker's `train_attn`, `train_mlp`, `train_unembed`): the attention's
/// projections, the MLP's, and the output head. Projections not trained keep their fresh pair,
/// whose B is 0, so they add nothing, and get no gradient and no optimizer step; the output head
/// has a pair only when it trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modules {
    pub attn: bool,
    pub mlp: bool,
    pub unembed: bool,
}

impl Modules {
    /// Every projection of every layer, not the output head: what `/v1/preview` jobs train.
    pub const ALL: Modules = Modules { attn: true, mlp: true, unembed: false };

    /// Whether projection `m` trains, in q, k, v, o, gate, up, down order.
    pub fn trains(&self, m: usize) -> bool {
        if m < 4 {
            self.attn
        } else {
            self.mlp
        }
    }

    /// Whether anything trains.
    pub fn any(&self) -> bool {
        self.attn || self.mlp || self.unembed
    }
}

/// A saved state as `weights_info` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateInfo {
    pub base_model: String,
    pub rank: usize,
    pub modules: Modules,
}

/// One `optim_step`'s AdamW settings (`grad_clip_norm` 0: no clipping).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamSettings {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub grad_clip_norm: f64,
}

/// Each datum's target logprobs and the call's summed loss.
#[derive(Debug, Clone, PartialEq)]
pub struct Forwarded {
    pub logprobs: Vec<Vec<f32>>,
    pub loss: f64,
}

/// Why a call failed: the caller's input (`user`, never retried by the SDK) or the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TinkerError {
    User(String),
    Server(String),
}

impl std::fmt::Display for TinkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TinkerError::User(m) | TinkerError::Server(m) => f.write_str(m),
        }
    }
}

/// A checkpoint whose time to live has passed: `checkpoint` as the SDK names it
/// (`weights/NAME`, `sampler_weights/NAME`, `external_weights/NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    pub owner: String,
    pub model_id: String,
    pub checkpoint: String,
}

/// Training models held between calls. Every method blocks (it computes): call it off the
/// async workers. Model ids are the api's; ownership is the api's to check.
pub trait TinkerTrainer: Send + Sync {
    /// A fresh adapter on a served base model, held for `entity` (whose account the trainer
    /// time of its calls is charged to).
    fn create(&self, entity: &str, model_id: &str, base_model: &str, lora: LoraSpec) -> Result<(), TinkerError>;
    /// Runs `data` forward and, with `backward`, adds its gradients to the model's pending ones.
    fn forward_backward(
        &self,
        model_id: &str,
        data: &[Datum],
        loss_fn: &str,
        config: &[(String, f64)],
        backward: bool,
    ) -> Result<Forwarded, TinkerError>;
    /// One AdamW step on the pending gradients; the gradient norm before clipping.
    fn optim_step(&self, model_id: &str, adam: AdamSettings) -> Result<f64, TinkerError>;
    /// The model's adapter as PEFT files (`adapter_config.json`, `adapter_model.safetensors`),
    /// to publish as a checkpoint that the engine serves.
    fn adapter_files(&self, model_id: &str) -> Result<Vec<(String, Vec<u8>)>, TinkerError>;
    /// What the model trains.
    fn modules(&self, model_id: &str) -> Result<Modules, TinkerError>;
    /// Saves the model's training state (adapter, AdamW moments and step) as `name`, in
    /// `owner`'s space: Tinker's `save_weights`.
    fn save_state(&self, owner: &str, model_id: &str, name: &str) -> Result<(), TinkerError>;
    /// The base model, rank and trained modules of a saved state of `owner`'s (`None`: no such
    /// state).
    fn state_info(&self, owner: &str, source_model: &str, name: &str) -> Option<StateInfo>;
    /// A new model of `entity` from `owner`'s saved state (its own, or one published), with its
    /// optimizer's moments or fresh ones.
    fn load_state(
        &self,
        entity: &str,
        owner: &str,
        model_id: &str,
        source_model: &str,
        name: &str,
        with_optimizer: bool,
    ) -> Result<(), TinkerError>;
    /// Replaces the held model's adapter with a saved state of the same base model and rank,
    /// with its optimizer's moments or fresh ones (the deprecated `TrainingClient.load_state`).
    fn load_state_into(
        &self,
        owner: &str,
        model_id: &str,
        source_model: &str,
        name: &str,
        with_optimizer: bool,
    ) -> Result<(), TinkerError>;
    /// `owner`'s saved states of `model_id`: (name, bytes, written at, ms since the epoch).
    fn list_states(&self, owner: &str, model_id: &str) -> Vec<(String, u64, i64)>;
    /// Whether `owner` may save sampler weights `name` of `model_id` (a new name counts against
    /// the limit; saving over a name does not).
    fn may_note_sampler(&self, owner: &str, model_id: &str, name: &str) -> Result<(), TinkerError>;
    /// Remembers sampler weights `owner` saved by name of `model_id`; the entry it replaces (a
    /// name saved again), whose checkpoint the caller deletes.
    fn note_sampler(
        &self,
        owner: &str,
        model_id: &str,
        saved: SavedSampler,
    ) -> Result<Option<SavedSampler>, TinkerError>;
    /// `owner`'s sampler weights saved by name of `model_id`.
    fn saved_samplers(&self, owner: &str, model_id: &str) -> Vec<SavedSampler>;
    /// Forgets sampler weights saved by name; the forgotten entry (`None`: there was none). An
    /// error (the list could not be read or written) forgets nothing.
    fn forget_sampler(&self, owner: &str, model_id: &str, name: &str) -> Result<Option<SavedSampler>, TinkerError>;
    /// Deletes a saved state; whether it existed. An error (not "not found") deletes nothing
    /// the caller may count as gone.
    fn delete_state(&self, owner: &str, model_id: &str, name: &str) -> Result<bool, TinkerError>;
    /// Writes the model's adapter as PEFT files under `name` in `owner`'s space (Tinker's
    /// `save_weights_external`, what `tinker checkpoint download` fetches); the bytes written.
    /// With `recipients` (age recipients), every file is encrypted to them and named `*.age`.
    fn save_external(&self, owner: &str, model_id: &str, name: &str, recipients: &[String])
        -> Result<u64, TinkerError>;
    /// The files of `owner`'s external weights `name` of `model_id`: (file name, path).
    fn external_files(&self, owner: &str, model_id: &str, name: &str) -> Option<Vec<(String, std::path::PathBuf)>>;
    /// Deletes external weights; whether they existed (an error: they may still be there).
    fn delete_external(&self, owner: &str, model_id: &str, name: &str) -> Result<bool, TinkerError>;
    /// `owner`'s external weights of `model_id`: (name, bytes, written at, ms since the epoch).
    fn list_external(&self, owner: &str, model_id: &str) -> Vec<(String, u64, i64)>;
    /// Sets when `owner`'s checkpoint of `model_id` expires (ms since the epoch), or with
    /// `None` that it never does; the expiry it had (so a save that fails can put it back).
    fn set_expiry(
        &self,
        owner: &str,
        model_id: &str,
        checkpoint: &str,
        at: Option<i64>,
    ) -> Result<Option<i64>, TinkerError>;
    /// When `owner`'s checkpoints of `model_id` expire, by checkpoint (those that do).
    fn expiries(&self, owner: &str, model_id: &str) -> std::collections::BTreeMap<String, i64>;
    /// Marks `owner`'s checkpoint of `model_id` public (other entities may load it by its path)
    /// or private; whether that changed anything (false: it already was).
    fn set_public(&self, owner: &str, model_id: &str, checkpoint: &str, public: bool) -> Result<bool, TinkerError>;
    /// `owner`'s public checkpoints of `model_id`.
    fn public(&self, owner: &str, model_id: &str) -> std::collections::BTreeSet<String>;
    /// Whose public checkpoint `checkpoint` of `model_id` is (`None`: it is not public).
    fn publisher(&self, model_id: &str, checkpoint: &str) -> Option<String>;
    /// Every owner's checkpoints whose expiry is at or before `now` (ms since the epoch).
    fn expired(&self, now: i64) -> Vec<Expired>;
    /// Forgets a model (its session ended).
    fn release(&self, model_id: &str);
}
