//! [`TinkerModels`]: the training sessions the Tinker routes drive, held in memory between
//! calls, each call taking the trainer's turn (`tandem_jobs::turns`) like a job's step, so
//! Tinker clients and `/v1/preview` jobs of other entities share the trainer fairly.

use crate::adamw::AdamParams;
use crate::session::{AdamStep, Session};
use crate::token_loss::TokenLoss;
use crate::LoraTrainer;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tandem_core::tinker::{
    AdamSettings, Datum, Expired, Forwarded, LoraSpec, Modules, SavedSampler, StateInfo, TinkerError, TinkerTrainer,
};
use tandem_jobs::turns::Turns;
use tandem_jobs::TrainError;

/// The directory of a run's external weights (one directory of PEFT files a name).
const EXTERNAL_DIR: &str = "external";

/// An owner's directory name: not the entity's name, which may hold any character.
fn owner_hash(owner: &str) -> String {
    Sha256::digest(owner.as_bytes()).iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// `dir`, created if missing.
fn parent_created(dir: &std::path::Path) -> Result<&std::path::Path, TinkerError> {
    std::fs::create_dir_all(dir).map_err(|e| TinkerError::Server(format!("saving the external weights: {e}")))?;
    Ok(dir)
}

/// Saved states one entity may keep (each is an adapter and its moments: ~29 MB at rank 8 on
/// the bundled model); saving over an existing name does not count.
pub const MAX_STATES_PER_ENTITY: usize = 64;

/// Sampler weights saved by name one model may keep listed (each is a checkpoint on disk).
pub const MAX_SAMPLERS_PER_MODEL: usize = 1024;
// No state name can give this file name (a state is `<name>.safetensors` and `<name>.json`).
const SAMPLERS_FILE: &str = ".sampler_weights";

/// Tinker's LoRA scale numerator: `alpha / rank` with alpha fixed, as Tinker's service does,
/// so the learning rate that suits one rank suits the others.
pub const LORA_ALPHA: f64 = 32.0;

/// A held model: its entity and its session.
type HeldModel = (String, Arc<Mutex<Session>>);

pub struct TinkerModels {
    trainer: Arc<LoraTrainer>,
    /// Saved states: `<dir>/<owner hash>/<model id>/<name>.safetensors` (and `.json`).
    states: PathBuf,
    turns: Arc<Turns>,
    /// Held models: their entity (whose account their calls' trainer time is charged to) and
    /// session.
    models: Mutex<HashMap<String, HeldModel>>,
    /// Serialises changes to the lists kept beside a run's states (saved samplers, expiries:
    /// read, change, write back).
    samplers: Mutex<()>,
    /// Most models held at once, server-wide (each holds an adapter, its moments and pending
    /// gradients in memory).
    max_models: usize,
}

impl TinkerModels {
    pub fn new(trainer: Arc<LoraTrainer>, turns: Arc<Turns>, max_models: usize, states: PathBuf) -> Self {
        TinkerModels {
            trainer,
            states,
            turns,
            models: Mutex::default(),
            samplers: Mutex::default(),
            max_models: max_models.max(1),
        }
    }

    /// The directory of `owner`'s saved states of `model_id`. The owner is hashed (any entity
    /// name is a safe directory); an id that could leave its directory is refused.
    fn run_dir(&self, owner: &str, model_id: &str) -> Result<PathBuf, TinkerError> {
        if !safe_name(model_id) {
            return Err(TinkerError::User(format!(
                "the model id {model_id:?} may not be empty, `.` or `..`, or hold '/' or '\\'"
            )));
        }
        Ok(self.states.join(owner_hash(owner)).join(model_id.replace(':', "_")))
    }

    /// Where `owner`'s external weights `name` of `model_id` live: a directory of PEFT files.
    fn external_dir(&self, owner: &str, model_id: &str, name: &str) -> Result<PathBuf, TinkerError> {
        if !safe_name(name) || name.len() > 128 || name.starts_with('.') {
            return Err(TinkerError::User(format!(
                "the name {name:?} may not be empty, start with '.', hold '/' or '\\', or exceed 128 bytes"
            )));
        }
        Ok(self.run_dir(owner, model_id)?.join(EXTERNAL_DIR).join(name))
    }

    /// Where `owner`'s state `name` of `model_id` lives.
    fn state_path(&self, owner: &str, model_id: &str, name: &str) -> Result<PathBuf, TinkerError> {
        if !safe_name(name) || name.len() > 128 {
            return Err(TinkerError::User(format!(
                "the state name {name:?} may not be empty, `.` or `..`, hold '/' or '\\', or exceed 128 bytes"
            )));
        }
        Ok(self.run_dir(owner, model_id)?.join(format!("{name}.safetensors")))
    }

    /// `owner`'s list of sampler weights saved by name of `model_id`, beside its saved states.
    fn samplers_path(&self, owner: &str, model_id: &str) -> Result<PathBuf, TinkerError> {
        Ok(self.run_dir(owner, model_id)?.join(SAMPLERS_FILE))
    }

    /// Makes `owner`'s checkpoint of `model_id` private (new weights under a published name, or a
    /// deletion: publishing named what was there then). The caller holds `self.samplers`.
    fn unpublish_held(&self, owner: &str, model_id: &str, checkpoint: &str) -> Result<(), TinkerError> {
        let dir = self.run_dir(owner, model_id)?;
        crate::publish::set(&self.states, &dir, owner, model_id, checkpoint, false)
            .map(|_| ())
            .map_err(TinkerError::Server)
    }

    /// The list (empty when there is none yet); a file that cannot be read is an error, never an
    /// empty list that the next write would put in its place.
    fn read_samplers(path: &std::path::Path) -> Result<Vec<SavedSampler>, TinkerError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                TinkerError::Server(format!("the sampler weights list {} is damaged: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(TinkerError::Server(format!("reading the sampler weights list: {e}"))),
        }
    }

    fn write_samplers(path: &std::path::Path, list: &[SavedSampler]) -> Result<(), TinkerError> {
        crate::expiry::write_whole(path, &serde_json::to_vec(list).unwrap_or_default())
            .map_err(|e| TinkerError::Server(format!("recording the sampler weights: {e}")))
    }

    fn hold(&self, entity: &str, model_id: &str, session: Session) -> Result<(), TinkerError> {
        let mut models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        if models.len() >= self.max_models {
            return Err(TinkerError::User("this server's training models are all taken (--max-tinker-models)".into()));
        }
        models.insert(model_id.to_string(), (entity.to_string(), Arc::new(Mutex::new(session))));
        Ok(())
    }

    /// A held model's entity and session.
    fn model(&self, id: &str) -> Result<HeldModel, TinkerError> {
        let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        models.get(id).cloned().ok_or_else(|| TinkerError::User(format!("model {id:?} is not held by this server")))
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
        let (entity, session) = self.model(id)?;
        // Charged to the model's entity, with its other models' calls and its jobs.
        let mut turn = self.turns.enter_for(&entity);
        let mut s = session.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s, &mut turn).map_err(error)
    }
}

/// A model id or state name usable as one path component.
fn safe_name(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '\\', '\0']) && s != "." && s != ".."
}

/// Whether a list has room for `name` (a name already there is saved over).
fn room_for(list: &[SavedSampler], name: &str) -> Result<(), TinkerError> {
    if list.len() >= MAX_SAMPLERS_PER_MODEL && !list.iter().any(|s| s.name == name) {
        return Err(TinkerError::User(format!(
            "a model may keep {MAX_SAMPLERS_PER_MODEL} sampler weights saved by name; delete some or save over a name"
        )));
    }
    Ok(())
}

fn error(e: TrainError) -> TinkerError {
    match e {
        TrainError::Invalid(m) => TinkerError::User(m),
        other => TinkerError::Server(other.to_string()),
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
        Ok(self.model(model_id)?.1.lock().unwrap_or_else(|e| e.into_inner()).modules())
    }

    fn save_state(&self, owner: &str, model_id: &str, name: &str) -> Result<(), TinkerError> {
        let path = self.state_path(owner, model_id, name)?;
        if !path.exists() {
            // <owner>/<model>/<name>.safetensors: the owner's directory is two levels up.
            let owner_dir = path.parent().and_then(|p| p.parent());
            let held = owner_dir.and_then(|d| std::fs::read_dir(d).ok()).into_iter().flatten().flatten();
            let count: usize = held
                .filter_map(|m| std::fs::read_dir(m.path()).ok())
                .map(|files| {
                    files.flatten().filter(|f| f.path().extension().is_some_and(|e| e == "safetensors")).count()
                })
                .sum();
            if count >= MAX_STATES_PER_ENTITY {
                return Err(TinkerError::User(format!(
                    "an entity may keep {MAX_STATES_PER_ENTITY} saved states; save over an existing name"
                )));
            }
        }
        {
            let _guard = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
            self.unpublish_held(owner, model_id, &format!("weights/{name}"))?;
        }
        self.with_session(model_id, |s| s.save_state(&path))
    }

    fn state_info(&self, owner: &str, source_model: &str, name: &str) -> Option<StateInfo> {
        let path = self.state_path(owner, source_model, name).ok()?;
        let (base_model, rank, _) = crate::session::state_info(&path)?;
        Some(StateInfo { base_model, rank, modules: crate::session::state_modules(&path) })
    }

    fn load_state(
        &self,
        entity: &str,
        owner: &str,
        model_id: &str,
        source_model: &str,
        name: &str,
        with_optimizer: bool,
    ) -> Result<(), TinkerError> {
        let path = self.state_path(owner, source_model, name)?;
        let session = {
            let _turn = self.turns.enter_for(entity);
            Session::load_state(&self.trainer, &path, with_optimizer).map_err(error)?
        };
        self.hold(entity, model_id, session)
    }

    fn load_state_into(
        &self,
        owner: &str,
        model_id: &str,
        source_model: &str,
        name: &str,
        with_optimizer: bool,
    ) -> Result<(), TinkerError> {
        let path = self.state_path(owner, source_model, name)?;
        let trainer = &self.trainer;
        self.with_session(model_id, |s| s.load_into(trainer, &path, with_optimizer))
    }

    fn list_states(&self, owner: &str, model_id: &str) -> Vec<(String, u64, i64)> {
        let Ok(dir) = self.run_dir(owner, model_id) else { return Vec::new() };
        let mut out: Vec<(String, u64, i64)> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|f| {
                let path = f.path();
                let name = path.file_name()?.to_str()?.strip_suffix(".safetensors")?.to_string();
                let meta = f.metadata().ok()?;
                let at = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64;
                Some((name, meta.len(), at))
            })
            .collect();
        out.sort();
        out
    }

    fn may_note_sampler(&self, owner: &str, model_id: &str, name: &str) -> Result<(), TinkerError> {
        room_for(&Self::read_samplers(&self.samplers_path(owner, model_id)?)?, name)
    }

    fn note_sampler(
        &self,
        owner: &str,
        model_id: &str,
        saved: SavedSampler,
    ) -> Result<Option<SavedSampler>, TinkerError> {
        let path = self.samplers_path(owner, model_id)?;
        let _guard = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        let mut list = Self::read_samplers(&path)?;
        room_for(&list, &saved.name)?;
        self.unpublish_held(owner, model_id, &format!("sampler_weights/{}", saved.name))?;
        let replaced = list.iter().position(|s| s.name == saved.name).map(|at| list.remove(at));
        list.push(saved);
        Self::write_samplers(&path, &list)?;
        Ok(replaced)
    }

    fn saved_samplers(&self, owner: &str, model_id: &str) -> Vec<SavedSampler> {
        // Unreadable reads as none here (a listing shows less); writers refuse instead.
        self.samplers_path(owner, model_id).and_then(|p| Self::read_samplers(&p)).unwrap_or_default()
    }

    fn forget_sampler(&self, owner: &str, model_id: &str, name: &str) -> Result<Option<SavedSampler>, TinkerError> {
        // A model id no run can have names nothing.
        let Ok(path) = self.samplers_path(owner, model_id) else { return Ok(None) };
        let _guard = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        let mut list = Self::read_samplers(&path)?;
        let Some(at) = list.iter().position(|s| s.name == name) else { return Ok(None) };
        self.unpublish_held(owner, model_id, &format!("sampler_weights/{name}"))?;
        let gone = list.remove(at);
        // Not forgotten unless written.
        Self::write_samplers(&path, &list)?;
        Ok(Some(gone))
    }

    fn delete_state(&self, owner: &str, model_id: &str, name: &str) -> Result<bool, TinkerError> {
        // A name no state can have names nothing.
        let Ok(path) = self.state_path(owner, model_id, name) else { return Ok(false) };
        {
            let _guard = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
            self.unpublish_held(owner, model_id, &format!("weights/{name}"))?;
        }
        let existed = removed(std::fs::remove_file(&path), "the saved state")?;
        removed(std::fs::remove_file(path.with_extension("json")), "the saved state's description")?;
        Ok(existed)
    }

    fn save_external(
        &self,
        owner: &str,
        model_id: &str,
        name: &str,
        recipients: &[String],
    ) -> Result<u64, TinkerError> {
        let dir = self.external_dir(owner, model_id, name)?;
        let sealed = match recipients.is_empty() {
            true => None,
            false => Some(crate::encrypt::Recipients::parse(recipients).map_err(TinkerError::User)?),
        };
        if !dir.exists() {
            let root = self.states.join(owner_hash(owner));
            let count = std::fs::read_dir(&root)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|run| std::fs::read_dir(run.path().join(EXTERNAL_DIR)).ok())
                .map(|d| d.count())
                .sum::<usize>();
            if count >= MAX_STATES_PER_ENTITY {
                return Err(TinkerError::User(format!(
                    "an entity may keep {MAX_STATES_PER_ENTITY} external weights; delete some or save over a name"
                )));
            }
        }
        let files = self.adapter_files(model_id)?;
        let io = |e: std::io::Error| TinkerError::Server(format!("saving the external weights: {e}"));
        // Written beside, then swapped in: a reader never sees half a set.
        let parent = dir.parent().ok_or_else(|| TinkerError::Server("no directory for the weights".into()))?;
        // (Names never start with '.', so this is nobody's; a model's calls run one at a time.)
        let fresh = parent_created(parent)?.join(format!(".writing-{name}"));
        let _ = std::fs::remove_dir_all(&fresh);
        std::fs::create_dir_all(&fresh).map_err(io)?;
        let mut bytes = 0u64;
        for (file, data) in &files {
            let (file, data) = match &sealed {
                Some(r) => (format!("{file}.age"), r.encrypt(data).map_err(TinkerError::Server)?),
                None => (file.clone(), data.clone()),
            };
            std::fs::write(fresh.join(&file), &data).map_err(io)?;
            bytes += data.len() as u64;
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&fresh, &dir).map_err(io)?;
        Ok(bytes)
    }

    fn external_files(&self, owner: &str, model_id: &str, name: &str) -> Option<Vec<(String, PathBuf)>> {
        let dir = self.external_dir(owner, model_id, name).ok()?;
        let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter_map(|f| Some((f.file_name().to_str()?.to_string(), f.path())))
            .collect();
        files.sort();
        Some(files)
    }

    fn delete_external(&self, owner: &str, model_id: &str, name: &str) -> Result<bool, TinkerError> {
        let Ok(dir) = self.external_dir(owner, model_id, name) else { return Ok(false) };
        removed(std::fs::remove_dir_all(dir), "the external weights")
    }

    fn list_external(&self, owner: &str, model_id: &str) -> Vec<(String, u64, i64)> {
        let Ok(dir) = self.run_dir(owner, model_id) else { return Vec::new() };
        let mut out: Vec<(String, u64, i64)> = std::fs::read_dir(dir.join(EXTERNAL_DIR))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|f| {
                let name = f.file_name().to_str()?.to_string();
                // A set being written (`.writing-NAME`) is nobody's yet.
                if name.starts_with('.') {
                    return None;
                }
                let files = std::fs::read_dir(f.path()).ok()?.flatten().filter_map(|x| x.metadata().ok());
                let bytes = files.map(|m| m.len()).sum();
                let at = f.metadata().ok()?.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
                Some((name, bytes, at as i64))
            })
            .collect();
        out.sort();
        out
    }

    fn set_expiry(
        &self,
        owner: &str,
        model_id: &str,
        checkpoint: &str,
        at: Option<i64>,
    ) -> Result<Option<i64>, TinkerError> {
        let path = self.run_dir(owner, model_id)?.join(crate::expiry::FILE);
        let _guard = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        let mut list = crate::expiry::read(&path).map_err(TinkerError::Server)?.unwrap_or_else(|| {
            crate::expiry::Expiries { owner: owner.to_string(), model_id: model_id.to_string(), ..Default::default() }
        });
        let before = list.at.get(checkpoint).copied();
        if before == at {
            return Ok(before);
        }
        list.set(checkpoint, at);
        crate::expiry::write(&path, &list).map_err(TinkerError::Server)?;
        Ok(before)
    }

    fn expiries(&self, owner: &str, model_id: &str) -> std::collections::BTreeMap<String, i64> {
        let Ok(dir) = self.run_dir(owner, model_id) else { return Default::default() };
        crate::expiry::read(&dir.join(crate::expiry::FILE)).ok().flatten().map(|e| e.at).unwrap_or_default()
    }

    fn set_public(&self, owner: &str, model_id: &str, checkpoint: &str, public: bool) -> Result<bool, TinkerError> {
        let dir = self.run_dir(owner, model_id)?;
        let _guard = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        crate::publish::set(&self.states, &dir, owner, model_id, checkpoint, public).map_err(TinkerError::Server)
    }

    fn public(&self, owner: &str, model_id: &str) -> std::collections::BTreeSet<String> {
        let Ok(dir) = self.run_dir(owner, model_id) else { return Default::default() };
        crate::publish::read(&dir.join(crate::publish::FILE)).ok().flatten().map(|p| p.checkpoints).unwrap_or_default()
    }

    fn publisher(&self, model_id: &str, checkpoint: &str) -> Option<String> {
        if !safe_name(model_id) {
            return None; // an id that could leave its directory names nothing
        }
        crate::publish::owner_of(&self.states, model_id, checkpoint, |owner| self.run_dir(owner, model_id).ok())
    }

    fn expired(&self, now: i64) -> Vec<Expired> {
        let mut out = Vec::new();
        for (path, list) in crate::expiry::all(&self.states) {
            // A list counts only where it lies: a copied file cannot name another owner's run.
            if self.run_dir(&list.owner, &list.model_id).map(|d| d.join(crate::expiry::FILE)).ok() != Some(path) {
                tracing::warn!(owner = %list.owner, run = %list.model_id, "skipping a misplaced expiry list");
                continue;
            }
            for checkpoint in list.due(now) {
                out.push(Expired { owner: list.owner.clone(), model_id: list.model_id.clone(), checkpoint });
            }
        }
        out
    }

    fn release(&self, model_id: &str) {
        let dropped = self.models.lock().unwrap_or_else(|e| e.into_inner()).remove(model_id);
        drop(dropped);
        // Its adapter, optimizer state and the last calls' activations go back to the system now.
        self.trainer.release_freed_memory();
    }
}

/// Whether a removal removed something: "not found" is `false`, any other failure an error
/// (the caller must not count the thing as gone).
fn removed(r: std::io::Result<()>, what: &str) -> Result<bool, TinkerError> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(TinkerError::Server(format!("deleting {what}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models(dir: &std::path::Path) -> TinkerModels {
        TinkerModels::new(Arc::new(LoraTrainer::new(Vec::new())), Arc::new(Turns::new(1)), 1, dir.to_path_buf())
    }

    #[test]
    fn deletes_tell_gone_from_failed() {
        let dir = tempfile::tempdir().unwrap();
        let m = models(dir.path());
        // Nothing there: not found, not an error.
        assert!(!m.delete_state("alice", "s:train:0", "a").unwrap());
        assert!(!m.delete_external("alice", "s:train:0", "a").unwrap());
        assert!(m.forget_sampler("alice", "s:train:0", "a").unwrap().is_none());
        // Something there that cannot be removed: an error, so nobody counts it gone.
        let run = m.run_dir("alice", "s:train:0").unwrap();
        std::fs::create_dir_all(run.join("a.safetensors")).unwrap();
        assert!(m.delete_state("alice", "s:train:0", "a").is_err());
        std::fs::create_dir_all(run.join(EXTERNAL_DIR)).unwrap();
        std::fs::write(run.join(EXTERNAL_DIR).join("a"), b"not a directory").unwrap();
        assert!(m.delete_external("alice", "s:train:0", "a").is_err());
        std::fs::write(run.join(SAMPLERS_FILE), b"{damaged").unwrap();
        assert!(m.forget_sampler("alice", "s:train:0", "a").is_err());
        // A state that is there goes, and then is not found.
        std::fs::write(run.join("b.safetensors"), b"x").unwrap();
        assert!(m.delete_state("alice", "s:train:0", "b").unwrap());
        assert!(!m.delete_state("alice", "s:train:0", "b").unwrap());
        // set_expiry answers what it replaced.
        assert_eq!(m.set_expiry("alice", "s:train:0", "weights/b", Some(7)).unwrap(), None);
        assert_eq!(m.set_expiry("alice", "s:train:0", "weights/b", None).unwrap(), Some(7));
    }

    #[test]
    fn expiries_are_kept_per_run_and_only_where_they_lie_count() {
        let dir = tempfile::tempdir().unwrap();
        let m = models(dir.path());
        m.set_expiry("alice", "s:train:0", "weights/rolling", Some(1_000)).unwrap();
        m.set_expiry("alice", "s:train:0", "sampler_weights/periodic", Some(5_000)).unwrap();
        m.set_expiry("bob", "t:train:1", "external_weights/x", Some(2_000)).unwrap();
        assert_eq!(m.expiries("alice", "s:train:0").len(), 2);
        assert!(m.expiries("bob", "s:train:0").is_empty(), "another owner's run of the same id");
        let due = |now| {
            let mut d: Vec<(String, String)> = m.expired(now).into_iter().map(|x| (x.owner, x.checkpoint)).collect();
            d.sort();
            d
        };
        assert_eq!(due(999), vec![]);
        assert_eq!(
            due(2_000),
            vec![("alice".into(), "weights/rolling".into()), ("bob".into(), "external_weights/x".into())]
        );
        // Cleared: no longer due; the last one cleared takes the file with it.
        m.set_expiry("alice", "s:train:0", "weights/rolling", None).unwrap();
        m.set_expiry("bob", "t:train:1", "external_weights/x", None).unwrap();
        assert_eq!(due(10_000), vec![("alice".into(), "sampler_weights/periodic".into())]);
        assert!(!m.run_dir("bob", "t:train:1").unwrap().join(crate::expiry::FILE).exists());
        // Alice's list copied into Bob's directory names Alice's run: ignored there.
        let bobs = m.run_dir("bob", "t:train:1").unwrap();
        std::fs::create_dir_all(&bobs).unwrap();
        std::fs::copy(
            m.run_dir("alice", "s:train:0").unwrap().join(crate::expiry::FILE),
            bobs.join(crate::expiry::FILE),
        )
        .unwrap();
        assert_eq!(due(10_000), vec![("alice".into(), "sampler_weights/periodic".into())]);
    }
}
