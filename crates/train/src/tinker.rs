//! [`TinkerModels`]: the training sessions the Tinker routes drive, held in memory between
//! calls, each call taking the trainer's turn (`tandem_jobs::turns`) like a job's step, so
//! Tinker clients and `/v1/preview` jobs of other entities share the trainer fairly. What a run
//! keeps beyond its session (saved states, sampler names, external weights) is the catalog's
//! (`tandem-tinker`): this side turns a model into files and files into a model.

use crate::adamw::AdamParams;
use crate::session::{AdamStep, Session};
use crate::token_loss::TokenLoss;
use crate::LoraTrainer;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tandem_core::tinker::{
    AdamSettings, Datum, Files, Forwarded, HeldMemory, LoraSpec, Modules, StateInfo, TinkerError, TinkerTrainer,
    STATE_FILE,
};
use tandem_jobs::turns::Turns;
use tandem_jobs::TrainError;

/// Tinker's LoRA scale numerator: `alpha / rank` with alpha fixed, as Tinker's service does,
/// so the learning rate that suits one rank suits the others.
pub const LORA_ALPHA: f64 = 32.0;

/// A held model.
struct Slot {
    /// Whose account its calls' trainer time is charged to.
    entity: String,
    session: Mutex<Session>,
    /// When it last ran, as a tick of [`TinkerModels::clock`]: the least recent parks first.
    used: AtomicU64,
    /// What its adapter, moments and pending gradients hold in memory when live (measured after
    /// each call; kept while parked, as what unparking will cost).
    bytes: AtomicU64,
    parked: AtomicBool,
}

type HeldModel = Arc<Slot>;

/// The memory held models may take together, and where the rest wait.
struct Memory {
    budget: u64,
    park_dir: Option<PathBuf>,
}

pub struct TinkerModels {
    trainer: Arc<LoraTrainer>,
    turns: Arc<Turns>,
    models: Mutex<HashMap<String, HeldModel>>,
    /// Most models held at once, server-wide, live or parked.
    max_models: usize,
    memory: Memory,
    clock: AtomicU64,
}

impl TinkerModels {
    /// Models held without a memory budget (none is ever parked).
    pub fn new(trainer: Arc<LoraTrainer>, turns: Arc<Turns>, max_models: usize) -> Self {
        let memory = Memory { budget: u64::MAX, park_dir: None };
        TinkerModels {
            trainer,
            turns,
            models: Mutex::default(),
            max_models: max_models.max(1),
            memory,
            clock: AtomicU64::new(0),
        }
    }

    /// Live models' adapters, moments and pending gradients held to `budget` bytes together:
    /// before a model runs, the least recently used others without pending gradients are parked
    /// to files in `park_dir` (as jobs are), and read back at their next call.
    pub fn with_memory(mut self, budget: u64, park_dir: PathBuf) -> Self {
        self.memory = Memory { budget, park_dir: Some(park_dir) };
        self
    }

    fn hold(&self, entity: &str, model_id: &str, mut session: Session) -> Result<(), TinkerError> {
        let bytes = session.live_bytes();
        let mut models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        if models.len() >= self.max_models {
            return Err(TinkerError::User("this server's training models are all taken (--max-tinker-models)".into()));
        }
        let slot = Slot {
            entity: entity.to_string(),
            session: Mutex::new(session),
            used: AtomicU64::new(self.tick()),
            bytes: AtomicU64::new(bytes),
            parked: AtomicBool::new(false),
        };
        models.insert(model_id.to_string(), Arc::new(slot));
        drop(models);
        self.make_room(0, model_id);
        Ok(())
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// A held model.
    fn model(&self, id: &str) -> Result<HeldModel, TinkerError> {
        let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        models.get(id).cloned().ok_or_else(|| TinkerError::User(format!("model {id:?} is not held by this server")))
    }

    /// Parks the least recently used live models other than `keep` until the live ones and
    /// `need` more bytes fit the budget. A model that runs or waits for its lock, or has
    /// gradients pending, is passed over; when nothing more can be parked the call runs over
    /// budget (a model never waits for memory another model will not give back).
    fn make_room(&self, need: u64, keep: &str) {
        let Some(dir) = &self.memory.park_dir else { return };
        let mut others: Vec<(String, HeldModel)> = {
            let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
            models.iter().map(|(id, m)| (id.clone(), m.clone())).collect()
        };
        let live = |ms: &[(String, HeldModel)]| -> u64 {
            ms.iter()
                .filter(|(_, m)| !m.parked.load(Ordering::Relaxed))
                .map(|(_, m)| m.bytes.load(Ordering::Relaxed))
                .sum()
        };
        let mut total = live(&others);
        others.retain(|(id, m)| id != keep && !m.parked.load(Ordering::Relaxed));
        others.sort_by_key(|(_, m)| m.used.load(Ordering::Relaxed));
        for (id, m) in others {
            if total.saturating_add(need) <= self.memory.budget {
                return;
            }
            let Ok(mut s) = m.session.try_lock() else { continue };
            let path = dir.join(format!("tinker-{}.safetensors", tandem_core::new_id()));
            match s.park(&path) {
                Ok(true) => {
                    m.parked.store(true, Ordering::Relaxed);
                    total = total.saturating_sub(m.bytes.load(Ordering::Relaxed));
                    tracing::debug!(model = %id, "parked a Tinker model for another's memory");
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(model = %id, error = %e, "could not park a Tinker model"),
            }
        }
    }

    /// Runs `f` on the model's session while holding the trainer's turn.
    fn with_session<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> Result<R, TrainError>,
    ) -> Result<R, TinkerError> {
        self.with_turn(id, |s, _| f(s))
    }

    /// [`Self::with_session`] for work that offers the trainer's turn back at its boundaries.
    fn with_turn<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session, &mut tandem_jobs::turns::Turn) -> Result<R, TrainError>,
    ) -> Result<R, TinkerError> {
        let slot = self.model(id)?;
        // Charged to the model's entity, with its other models' calls and its jobs.
        let mut turn = self.turns.enter_for(&slot.entity);
        if slot.parked.load(Ordering::Relaxed) {
            self.make_room(slot.bytes.load(Ordering::Relaxed), id);
        }
        let mut s = slot.session.lock().unwrap_or_else(|e| e.into_inner());
        s.unpark().map_err(error)?;
        slot.parked.store(false, Ordering::Relaxed);
        slot.used.store(self.tick(), Ordering::Relaxed);
        let done = f(&mut s, &mut turn).map_err(error);
        // Pending gradients, a loaded state of another rank: what it holds now.
        slot.bytes.store(s.live_bytes(), Ordering::Relaxed);
        drop(s);
        self.make_room(0, id);
        done
    }
}

fn error(e: TrainError) -> TinkerError {
    match e {
        TrainError::Invalid(m) => TinkerError::User(m),
        other => TinkerError::Server(other.to_string()),
    }
}

/// A saved state's weights file in `dir`, or the caller's mistake.
fn state_in(dir: &std::path::Path) -> Result<std::path::PathBuf, TinkerError> {
    let path = dir.join(STATE_FILE);
    match path.is_file() {
        true => Ok(path),
        false => Err(TinkerError::NotFound("no such saved state".into())),
    }
}

impl TinkerTrainer for TinkerModels {
    fn create(&self, entity: &str, model_id: &str, base_model: &str, lora: LoraSpec) -> Result<(), TinkerError> {
        {
            let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
            if models.len() >= self.max_models {
                return Err(TinkerError::User(format!(
                    "this server holds {} training models, its limit (--max-tinker-models); finish a session to free one",
                    models.len()
                )));
            }
        }
        let session = {
            let _turn = self.turns.enter_for(entity);
            Session::create(&self.trainer, base_model, lora.rank, LORA_ALPHA, lora.seed)
                .map_err(error)?
                .training(lora.modules, lora.seed)
                .map_err(error)?
        };
        self.hold(entity, model_id, session)
    }

    fn forward_backward(
        &self,
        model_id: &str,
        data: &[Datum],
        loss_fn: &str,
        config: &[(String, f64)],
        backward: bool,
    ) -> Result<Forwarded, TinkerError> {
        let loss = TokenLoss::parse(loss_fn, config).map_err(TinkerError::User)?;
        let trainer = &self.trainer;
        // The turn passes at each slice (a micro-batch): another entity's call waits one slice,
        // not this whole call (issue 50).
        self.with_turn(model_id, |s, turn| {
            s.forward_backward_sliced(trainer, data, loss, backward, &mut || turn.boundary())
        })
        .map(|f| Forwarded { logprobs: f.logprobs, loss: f.loss })
    }

    fn optim_step(&self, model_id: &str, adam: AdamSettings) -> Result<f64, TinkerError> {
        let step = AdamStep {
            params: AdamParams {
                lr: adam.learning_rate,
                beta1: adam.beta1,
                beta2: adam.beta2,
                eps: adam.eps,
                weight_decay: adam.weight_decay,
            },
            grad_clip_norm: adam.grad_clip_norm,
        };
        let trainer = &self.trainer;
        self.with_session(model_id, |s| s.optim_step(trainer, step))
    }

    fn adapter_files(&self, model_id: &str) -> Result<Vec<(String, Vec<u8>)>, TinkerError> {
        self.with_session(model_id, |s| s.adapter_files())
    }

    fn modules(&self, model_id: &str) -> Result<Modules, TinkerError> {
        // No turn: nothing is computed.
        Ok(self.model(model_id)?.session.lock().unwrap_or_else(|e| e.into_inner()).modules())
    }

    fn state_files(&self, model_id: &str) -> Result<(Files, StateInfo), TinkerError> {
        let scratch = std::env::temp_dir().join(format!("tandem-state-{}", tandem_core::new_id()));
        let path = scratch.join(STATE_FILE);
        // Private to the server's user: another tenant's weights pass through it.
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&scratch)
            .map_err(|e| TinkerError::Server(format!("saving the state: {e}")))?;
        let saved = self.with_session(model_id, |s| s.save_state(&path));
        let read = saved.and_then(|()| {
            let io = |e: std::io::Error| TinkerError::Server(format!("saving the state: {e}"));
            let (base_model, rank, _) = crate::session::state_info(&path)
                .ok_or_else(|| TinkerError::Server("the state's description is damaged".into()))?;
            let about = std::fs::read(path.with_extension("json")).map_err(io)?;
            let files =
                vec![(STATE_FILE.to_string(), std::fs::read(&path).map_err(io)?), ("state.json".to_string(), about)];
            Ok((files, base_model, rank))
        });
        let _ = std::fs::remove_dir_all(&scratch);
        let (files, base_model, rank) = read?;
        let modules = self.modules(model_id)?;
        Ok((files, StateInfo { base_model, rank, modules }))
    }

    fn load_state(
        &self,
        entity: &str,
        model_id: &str,
        dir: &std::path::Path,
        with_optimizer: bool,
    ) -> Result<(), TinkerError> {
        let path = state_in(dir)?;
        let session = {
            let _turn = self.turns.enter_for(entity);
            Session::load_state(&self.trainer, &path, with_optimizer).map_err(error)?
        };
        self.hold(entity, model_id, session)
    }

    fn load_state_into(&self, model_id: &str, dir: &std::path::Path, with_optimizer: bool) -> Result<(), TinkerError> {
        let path = state_in(dir)?;
        let trainer = &self.trainer;
        self.with_session(model_id, |s| s.load_into(trainer, &path, with_optimizer))
    }

    fn external_files(&self, model_id: &str, recipients: &[String]) -> Result<Vec<(String, Vec<u8>)>, TinkerError> {
        let sealed = match recipients.is_empty() {
            true => None,
            false => Some(crate::encrypt::Recipients::parse(recipients).map_err(TinkerError::User)?),
        };
        let files = self.adapter_files(model_id)?;
        let Some(r) = sealed else { return Ok(files) };
        files
            .into_iter()
            .map(|(file, data)| Ok((format!("{file}.age"), r.encrypt(&data).map_err(TinkerError::Server)?)))
            .collect()
    }

    fn memory(&self) -> HeldMemory {
        let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        let (parked, live): (Vec<&HeldModel>, Vec<&HeldModel>) =
            models.values().partition(|m| m.parked.load(Ordering::Relaxed));
        HeldMemory {
            live_bytes: live.iter().map(|m| m.bytes.load(Ordering::Relaxed)).sum(),
            live: live.len(),
            parked: parked.len(),
        }
    }

    fn release(&self, model_id: &str) {
        let dropped = self.models.lock().unwrap_or_else(|e| e.into_inner()).remove(model_id);
        drop(dropped);
        // Its adapter, optimizer state and the last calls' activations go back to the system now.
        self.trainer.release_freed_memory();
    }
}

#[cfg(test)]
mod tests;
