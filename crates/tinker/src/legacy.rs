//! Catalogs written by versions before the store kept it (up to session 35): files beside each
//! run's saved states, under `<data-dir>/tinker-states/<owner hash>/<run>/`. They are imported
//! once at start, then the directory is renamed `tinker-states.imported` (kept, not deleted: an
//! operator may want to look).
//!
//! The old layout: `<name>.safetensors` and `<name>.json` (a state), `external/<name>/` (external
//! weights), `.sampler_weights` (a JSON list of [`SavedSampler`]), `.expiry` (`{owner, model_id,
//! at: {"KIND/NAME": ms}}`), `.public` (`{owner, model_id, checkpoints: ["KIND/NAME"]}`). Owner
//! directories are the first 12 bytes of the entity's SHA-256 in hex, so an owner is found by
//! hashing the entities the store knows.

use crate::catalog::{state_info, Catalog, Result};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use tandem_core::tinker::{CheckpointKey, CheckpointKind, SavedSampler, TinkerError, STATE_FILE};

/// What an import did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Imported {
    pub entries: usize,
    /// Owner directories no known entity hashes to (left in the renamed directory).
    pub unknown_owners: Vec<String>,
}

/// The directory an old owner's runs lived in.
pub fn owner_hash(owner: &str) -> String {
    Sha256::digest(owner.as_bytes()).iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// A run id from its old directory name (`{session}:train:{n}` was written with `_` for `:`).
fn run_id(dir: &str) -> String {
    if let Some((session, n)) = dir.rsplit_once("_train_") {
        if !session.is_empty() && n.parse::<u64>().is_ok() {
            return format!("{session}:train:{n}");
        }
    }
    dir.to_string()
}

#[derive(Deserialize)]
struct Expiries {
    model_id: String,
    at: BTreeMap<String, i64>,
}

#[derive(Deserialize)]
struct Public {
    model_id: String,
    checkpoints: BTreeSet<String>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes)
        .map_err(|e| tracing::warn!(file = %path.display(), error = %e, "skipping a damaged list"))
        .ok()
}

fn dirs(p: &Path) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(p).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir())
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn io(e: std::io::Error) -> TinkerError {
    TinkerError::Server(format!("importing the old Tinker catalog: {e}"))
}

/// Imports `root` (an old `tinker-states` directory) if it exists, for the owners among
/// `entities`; then renames it. Nothing is imported twice: a rerun after a crash saves over
/// the same names.
pub async fn import(root: &Path, catalog: &Catalog, entities: &[String]) -> Result<Option<Imported>> {
    if !root.is_dir() {
        return Ok(None);
    }
    let owners: HashMap<String, &String> = entities.iter().map(|e| (owner_hash(e), e)).collect();
    let mut done = Imported::default();
    for owner_dir in dirs(root).filter(|p| !file_name(p).starts_with('.')) {
        let Some(owner) = owners.get(&file_name(&owner_dir)) else {
            done.unknown_owners.push(file_name(&owner_dir));
            continue;
        };
        for run_dir in dirs(&owner_dir) {
            done.entries += import_run(&run_dir, owner, catalog).await?;
        }
    }
    let mut moved = root.as_os_str().to_owned();
    moved.push(".imported");
    std::fs::rename(root, PathBuf::from(moved)).map_err(io)?;
    if !done.unknown_owners.is_empty() {
        tracing::warn!(owners = ?done.unknown_owners, "old Tinker checkpoints of entities without a key were not imported");
    }
    Ok(Some(done))
}

/// One run's states, external weights and sampler names, with their expiries and publish marks.
async fn import_run(dir: &Path, owner: &str, catalog: &Catalog) -> Result<usize> {
    let expiries: Option<Expiries> = read_json(&dir.join(".expiry"));
    let public: Option<Public> = read_json(&dir.join(".public"));
    let model_id = match (&expiries, &public) {
        (Some(e), _) => e.model_id.clone(),
        (_, Some(p)) => p.model_id.clone(),
        _ => run_id(&file_name(dir)),
    };
    let expiry = |c: &str| expiries.as_ref().and_then(|e| e.at.get(c).copied());
    let mut keys = Vec::new();
    for f in std::fs::read_dir(dir).map_err(io)?.flatten() {
        let path = f.path();
        let Some(name) = file_name(&path).strip_suffix(".safetensors").map(str::to_string) else { continue };
        let about = std::fs::read(path.with_extension("json")).map_err(io)?;
        let Some(info) = serde_json::from_slice(&about).ok().as_ref().and_then(state_info) else { continue };
        let files = vec![(STATE_FILE.to_string(), std::fs::read(&path).map_err(io)?), ("state.json".into(), about)];
        catalog.save_state(owner, &model_id, &name, files, &info, expiry(&format!("weights/{name}"))).await?;
        keys.push(CheckpointKey::new(&model_id, CheckpointKind::Weights, &name));
    }
    for ext in dirs(&dir.join("external")).filter(|p| !file_name(p).starts_with('.')) {
        let name = file_name(&ext);
        let mut files = Vec::new();
        for f in std::fs::read_dir(&ext).map_err(io)?.flatten() {
            files.push((file_name(&f.path()), std::fs::read(f.path()).map_err(io)?));
        }
        catalog.save_external(owner, &model_id, &name, files, expiry(&format!("external_weights/{name}"))).await?;
        keys.push(CheckpointKey::new(&model_id, CheckpointKind::ExternalWeights, &name));
    }
    let samplers: Vec<SavedSampler> = read_json(&dir.join(".sampler_weights")).unwrap_or_default();
    for s in &samplers {
        catalog.note_sampler(owner, &model_id, s, expiry(&format!("sampler_weights/{}", s.name))).await?;
        keys.push(CheckpointKey::new(&model_id, CheckpointKind::SamplerWeights, &s.name));
    }
    // Published marks last: every save above starts private.
    for key in &keys {
        if public.as_ref().is_some_and(|p| p.checkpoints.contains(&key.checkpoint())) {
            catalog.set_public(owner, key, true).await?;
        }
    }
    tracing::info!(run = %model_id, entries = keys.len(), "imported an old Tinker run's catalog");
    Ok(keys.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_run_directories_name_their_runs() {
        assert_eq!(run_id("3f2a-b1_train_0"), "3f2a-b1:train:0");
        assert_eq!(run_id("a_train_b_train_12"), "a_train_b:train:12");
        assert_eq!(run_id("_train_1"), "_train_1");
        assert_eq!(run_id("plain"), "plain");
        assert_eq!(owner_hash("e").len(), 24);
    }
}
