//! Published Tinker checkpoints (`publish_checkpoint_from_tinker_path`): other entities may load
//! them by their `tinker://` path, which names the run but not its owner. Two kinds of file:
//! the run's set of public checkpoints beside its saved states (the truth), and one pointer a
//! published run under `<states>/.published/` that names the run's owner (how a path without an
//! owner is resolved). A pointer alone grants nothing: the owner's set must name the checkpoint,
//! and the set names its owner and run, so a copied or stale file cannot make anything public.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The set's file in a run's directory (no state name gives it: states are `<name>.safetensors`).
pub const FILE: &str = ".public";
/// The pointers' directory under the states' root (owner directories are hex hashes).
pub const INDEX_DIR: &str = ".published";

/// One run's public checkpoints (`weights/NAME`, `sampler_weights/NAME`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Public {
    pub owner: String,
    pub model_id: String,
    pub checkpoints: BTreeSet<String>,
}

/// The run's set (`None` when nothing of it is public); a damaged file is an error, never an
/// empty set that the next write would put in its place.
pub fn read(path: &Path) -> Result<Option<Public>, String> {
    crate::expiry::read_json(path, "public checkpoint list")
}

/// The pointer file of run `model_id` under the states' root.
pub fn pointer(root: &Path, model_id: &str) -> PathBuf {
    root.join(INDEX_DIR).join(model_id.replace(':', "_"))
}

/// Marks checkpoint `checkpoint` of `owner`'s run `model_id` (its directory `run_dir`) public or
/// private; whether that changed anything. The caller serialises changes to a run's lists.
pub fn set(
    root: &Path,
    run_dir: &Path,
    owner: &str,
    model_id: &str,
    checkpoint: &str,
    public: bool,
) -> Result<bool, String> {
    let path = run_dir.join(FILE);
    let mut list =
        read(&path)?.unwrap_or_else(|| Public { owner: owner.into(), model_id: model_id.into(), ..Default::default() });
    let changed = match public {
        true => list.checkpoints.insert(checkpoint.to_string()),
        false => list.checkpoints.remove(checkpoint),
    };
    if !changed {
        return Ok(false);
    }
    if public {
        // The pointer first: a set naming a checkpoint no pointer leads to would be public to
        // nobody, while a pointer without the set's entry is harmless.
        let at = pointer(root, model_id);
        match std::fs::read_to_string(&at) {
            Ok(o) if o == owner => {}
            // Run ids are the server's (a session id is a fresh UUID): two owners cannot share one.
            Ok(_) => return Err(format!("run {model_id} is another entity's")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => crate::expiry::write_whole(&at, owner.as_bytes())
                .map_err(|e| format!("writing the publication index: {e}"))?,
            Err(e) => return Err(format!("reading the publication index: {e}")),
        }
    }
    let written = match list.checkpoints.is_empty() {
        true => match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        false => crate::expiry::write_whole(&path, &serde_json::to_vec(&list).unwrap_or_default()),
    };
    written.map_err(|e| format!("writing the public checkpoint list: {e}"))?;
    Ok(true)
}

/// Whose public checkpoint `checkpoint` of run `model_id` is (`None`: nobody's). `run_dir`
/// gives an owner's directory of the run.
pub fn owner_of(
    root: &Path,
    model_id: &str,
    checkpoint: &str,
    run_dir: impl Fn(&str) -> Option<PathBuf>,
) -> Option<String> {
    let owner = std::fs::read_to_string(pointer(root, model_id)).ok()?;
    let list = read(&run_dir(&owner)?.join(FILE)).ok()??;
    (list.owner == owner && list.model_id == model_id && list.checkpoints.contains(checkpoint)).then_some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_public_only_while_its_owners_set_names_it() {
        let root = tempfile::tempdir().unwrap();
        let run_dir = |owner: &str| Some(root.path().join(owner).join("s_train_0"));
        let dir = run_dir("alice").unwrap();
        let run = "s:train:0";
        assert_eq!(owner_of(root.path(), run, "weights/a", run_dir), None);
        assert_eq!(set(root.path(), &dir, "alice", run, "weights/a", true), Ok(true));
        assert_eq!(set(root.path(), &dir, "alice", run, "weights/a", true), Ok(false), "already public");
        assert_eq!(owner_of(root.path(), run, "weights/a", run_dir).as_deref(), Some("alice"));
        assert_eq!(owner_of(root.path(), run, "weights/b", run_dir), None, "only what was published");
        // A run id that maps to the same files is not the run the set names.
        assert_eq!(owner_of(root.path(), "s_train_0", "weights/a", run_dir), None);
        // Another owner cannot publish under the same run id.
        let theirs = run_dir("bob").unwrap();
        assert!(set(root.path(), &theirs, "bob", run, "weights/x", true).is_err());
        assert_eq!(set(root.path(), &dir, "alice", run, "weights/a", false), Ok(true));
        assert_eq!(set(root.path(), &dir, "alice", run, "weights/a", false), Ok(false), "already private");
        assert_eq!(owner_of(root.path(), run, "weights/a", run_dir), None);
        assert!(!dir.join(FILE).exists(), "an emptied set leaves no file");
    }

    #[test]
    fn a_damaged_set_is_an_error_not_an_empty_one() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("o").join("r");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(FILE), b"{not json").unwrap();
        assert!(set(root.path(), &dir, "o", "r", "weights/a", true).is_err());
        assert_eq!(std::fs::read(dir.join(FILE)).unwrap(), b"{not json");
    }
}
