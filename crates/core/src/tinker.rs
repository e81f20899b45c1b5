//! The port between the Tinker routes (api) and the training sessions they drive (train): plain
//! numbers in, plain numbers out, so the api never sees a tensor.

use std::collections::BTreeMap;

/// A Tinker training run: a model a session created, `{session}:train:{seq}` to the SDK (its
/// `model_id`, the `RUN` of `tinker://RUN/...`), and the name of its tandem model record
/// (`{session}-train-{seq}`, project `tinker`). Sessions are the server's fresh ids, so a run is
/// one owner's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId {
    session: String,
    seq: u64,
}

impl RunId {
    /// Model `seq` of session `session` (`None` for an empty session id).
    pub fn new(session: &str, seq: u64) -> Option<Self> {
        (!session.is_empty()).then(|| RunId { session: session.to_string(), seq })
    }

    /// A run id as the SDK sends it; `None` for anything else (a record's name included), so
    /// a string is one run or none.
    pub fn parse(id: &str) -> Option<Self> {
        let (session, seq) = id.rsplit_once(":train:")?;
        RunId::new(session, Self::number(seq)?)
    }

    /// The run a tandem record name `{session}-train-{seq}` is (`None` for records not made
    /// by Tinker).
    pub fn of_record(name: &str) -> Option<Self> {
        let (session, seq) = name.rsplit_once("-train-")?;
        RunId::new(session, Self::number(seq)?)
    }

    /// Digits only, no sign or padding: one number, one spelling.
    fn number(digits: &str) -> Option<u64> {
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        canonical.then(|| digits.parse().ok()).flatten()
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The name of its tandem model record.
    pub fn record_name(&self) -> String {
        format!("{}-train-{}", self.session, self.seq)
    }
}

/// The session a Tinker id belongs to: a session id itself (`tandem-...`), or a model
/// (`{session}:train:{n}`), sampling session (`{session}:sample:{n}`) or request
/// (`{session}:req:{id}`) id. In a cluster it is what finds the node holding the call's state.
pub fn session_of(id: &str) -> Option<&str> {
    let session = match id.split_once(':') {
        Some((session, rest)) => {
            let known = ["train:", "sample:", "req:"].iter().any(|p| rest.starts_with(p));
            known.then_some(session)?
        }
        None => id,
    };
    (!session.is_empty()).then_some(session)
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:train:{}", self.session, self.seq)
    }
}

/// What a Tinker checkpoint path names after its run (`tinker://RUN/KIND/NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CheckpointKind {
    /// `weights/NAME`: a training state (adapter, AdamW moments and step), `save_weights`.
    Weights,
    /// `sampler_weights/NAME`: a checkpoint of the model's tandem record, served for sampling.
    SamplerWeights,
    /// `external_weights/NAME`: PEFT files to download (`save_weights_external`).
    ExternalWeights,
}

impl CheckpointKind {
    pub const ALL: [CheckpointKind; 3] =
        [CheckpointKind::Weights, CheckpointKind::SamplerWeights, CheckpointKind::ExternalWeights];

    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointKind::Weights => "weights",
            CheckpointKind::SamplerWeights => "sampler_weights",
            CheckpointKind::ExternalWeights => "external_weights",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One checkpoint of a Tinker run as the catalog keys it: run ids are the server's (a session's
/// fresh id and a number), so a run and everything under it is one owner's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckpointKey {
    pub model_id: String,
    pub kind: CheckpointKind,
    pub name: String,
}

impl CheckpointKey {
    pub fn new(model_id: &str, kind: CheckpointKind, name: &str) -> Self {
        CheckpointKey { model_id: model_id.to_string(), kind, name: name.to_string() }
    }

    /// `model_id` and `KIND/NAME` as the RestClient names a checkpoint of a run.
    pub fn of_run(model_id: &str, checkpoint: &str) -> Option<Self> {
        let (kind, name) = checkpoint.split_once('/')?;
        Some(CheckpointKey::new(model_id, CheckpointKind::parse(kind)?, name))
    }

    /// A `tinker://RUN/KIND/NAME` path.
    pub fn parse_path(path: &str) -> Option<Self> {
        let rest = path.strip_prefix("tinker://")?;
        let (run, checkpoint) = rest.split_once('/')?;
        (!run.is_empty()).then_some(())?;
        let key = CheckpointKey::of_run(run, checkpoint)?;
        (!key.name.is_empty()).then_some(key)
    }

    /// `KIND/NAME`.
    pub fn checkpoint(&self) -> String {
        format!("{}/{}", self.kind.as_str(), self.name)
    }

    /// `tinker://RUN/KIND/NAME`.
    pub fn path(&self) -> String {
        format!("tinker://{}/{}", self.model_id, self.checkpoint())
    }
}

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// Why a call failed, by kind: the API maps each to one status (and a future's category) once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TinkerError {
    /// The caller's input (a 400; `user`, never retried by the SDK).
    User(String),
    /// What the call names is not the caller's or not there (a 404, as another entity's is).
    NotFound(String),
    /// The store or the blob store did not answer: nothing was written, the same call may
    /// succeed shortly (a 503 with `Retry-After`).
    Unavailable(String),
    /// The caller holds its share already (sessions, models, pending results, queued bytes):
    /// a 429 with `Retry-After`, which the SDK retries, once some of it is done.
    Busy(String),
    /// The server's fault (a 500).
    Server(String),
}

impl std::fmt::Display for TinkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TinkerError::User(m)
            | TinkerError::NotFound(m)
            | TinkerError::Unavailable(m)
            | TinkerError::Busy(m)
            | TinkerError::Server(m) => f.write_str(m),
        }
    }
}

/// What the held models take of the trainer's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldMemory {
    /// Bytes the live models' adapters, moments and pending gradients hold.
    pub live_bytes: u64,
    pub live: usize,
    /// Models parked to files, read back at their next call.
    pub parked: usize,
}

/// Files by name, as a checkpoint directory holds them.
pub type Files = Vec<(String, Vec<u8>)>;

/// A saved state's weights file in its directory (beside it, `state.json` says what it is).
pub const STATE_FILE: &str = "state.safetensors";

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
    /// The model's training state (adapter, AdamW moments and step) as files and what it is: the
    /// catalog keeps them (Tinker's `save_weights`). The state file is [`STATE_FILE`].
    fn state_files(&self, model_id: &str) -> Result<(Files, StateInfo), TinkerError>;
    /// A new model of `entity` from saved state files in `dir` (the catalog's, its own or a
    /// published one), with its optimizer's moments or fresh ones.
    fn load_state(
        &self,
        entity: &str,
        model_id: &str,
        dir: &std::path::Path,
        with_optimizer: bool,
    ) -> Result<(), TinkerError>;
    /// Replaces the held model's adapter with saved state files of the same base model and rank,
    /// with its optimizer's moments or fresh ones (the deprecated `TrainingClient.load_state`).
    fn load_state_into(&self, model_id: &str, dir: &std::path::Path, with_optimizer: bool) -> Result<(), TinkerError>;
    /// The model's adapter as PEFT files for download (`save_weights_external`); with
    /// `recipients` (age recipients) every file is encrypted to them and named `*.age`.
    fn external_files(&self, model_id: &str, recipients: &[String]) -> Result<Vec<(String, Vec<u8>)>, TinkerError>;
    /// What the held models take of memory, for `/metrics`.
    fn memory(&self) -> HeldMemory;
    /// Forgets a model (its session ended).
    fn release(&self, model_id: &str);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_names_its_session() {
        assert_eq!(session_of("tandem-ab"), Some("tandem-ab"));
        assert_eq!(session_of("tandem-ab:train:3"), Some("tandem-ab"));
        assert_eq!(session_of("tandem-ab:sample:0"), Some("tandem-ab"));
        assert_eq!(session_of("tandem-ab:req:ff"), Some("tandem-ab"));
        assert_eq!(session_of("tandem-ab:other:1"), None);
        assert_eq!(session_of(":train:1"), None);
        assert_eq!(session_of(""), None);
    }

    #[test]
    fn run_ids_have_one_spelling() {
        let run = RunId::parse("tandem-ab:train:12").unwrap();
        assert_eq!((run.session(), run.seq()), ("tandem-ab", 12));
        assert_eq!(run.to_string(), "tandem-ab:train:12");
        assert_eq!(run.record_name(), "tandem-ab-train-12");
        assert_eq!(RunId::of_record("tandem-ab-train-12"), Some(run));
        // The last marker splits: a session id may hold the marker's text.
        assert_eq!(RunId::parse("a:train:b:train:0").unwrap().session(), "a:train:b");
        assert_eq!(RunId::of_record("a-train-b-train-3").unwrap().to_string(), "a-train-b:train:3");
        // A record's name is not a run id, nor is anything without one number.
        for bad in
            ["tandem-ab-train-12", ":train:1", "s:train:", "s:train:-1", "s:train:+1", "s:train:01", "s:train:1x"]
        {
            assert_eq!(RunId::parse(bad), None, "{bad}");
        }
        assert_eq!(RunId::parse("s:train:0").unwrap().seq(), 0);
        assert_eq!(RunId::of_record("s:train:1"), None);
    }
}
