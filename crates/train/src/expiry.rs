//! When Tinker checkpoints expire (`ttl_seconds` on a save, `PUT .../ttl`): one small file beside
//! each run's saved states. It names its owner and run because the directories hold only the
//! owner's hash, and the sweep that deletes what expired must know whose it is.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// The file in a run's directory. No state name gives it (a state is `<name>.safetensors`).
pub const FILE: &str = ".expiry";

/// One run's expiring checkpoints: checkpoint (`weights/NAME`, ...) -> ms since the epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expiries {
    pub owner: String,
    pub model_id: String,
    pub at: BTreeMap<String, i64>,
}

impl Expiries {
    /// Sets or clears one checkpoint's expiry.
    pub fn set(&mut self, checkpoint: &str, at: Option<i64>) {
        match at {
            Some(t) => self.at.insert(checkpoint.to_string(), t),
            None => self.at.remove(checkpoint),
        };
    }

    /// The checkpoints due at `now`, soonest first.
    pub fn due(&self, now: i64) -> Vec<String> {
        let mut due: Vec<(&i64, &String)> = self.at.iter().filter(|(_, t)| **t <= now).map(|(c, t)| (t, c)).collect();
        due.sort();
        due.into_iter().map(|(_, c)| c.clone()).collect()
    }
}

/// The run's expiries (`None` when it has none); a file that cannot be read or parsed is an
/// error, never an empty list that the next write would put in its place.
pub fn read(path: &Path) -> Result<Option<Expiries>, String> {
    read_json(path, "expiry list")
}

/// A list kept beside a run's states as JSON (`None` when there is no file); `what` names it in
/// errors.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<Option<T>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("the {what} {} is damaged: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("reading the {what}: {e}")),
    }
}

/// Writes the run's expiries (removes the file when none is left).
pub fn write(path: &Path, e: &Expiries) -> Result<(), String> {
    if e.at.is_empty() {
        return match std::fs::remove_file(path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(format!("writing the expiry list: {err}")),
            _ => Ok(()),
        };
    }
    write_whole(path, &serde_json::to_vec(e).unwrap_or_default())
        .map_err(|err| format!("writing the expiry list: {err}"))
}

/// Writes `bytes` to a new file beside `path`, syncs it and renames it over `path`: a crash
/// leaves the old file or the new one, never half of one.
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Every run's expiries under `root` (`<root>/<owner hash>/<run>/.expiry`), with the file each
/// was read from; unreadable files are skipped with a warning (the sweep must go on for
/// everyone else).
pub fn all(root: &Path) -> Vec<(std::path::PathBuf, Expiries)> {
    let dirs = |p: &Path| std::fs::read_dir(p).into_iter().flatten().flatten().map(|e| e.path());
    let mut out = Vec::new();
    // (`.published`, the publication index, is no owner's.)
    for owner in dirs(root).filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))) {
        for run in dirs(&owner) {
            let path = run.join(FILE);
            match read(&path) {
                Ok(Some(e)) => out.push((path, e)),
                Ok(None) => {}
                Err(err) => tracing::warn!(error = %err, "skipping an expiry list"),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_checkpoints_are_those_at_or_before_now_soonest_first() {
        let mut e = Expiries { owner: "o".into(), model_id: "s:train:0".into(), at: BTreeMap::new() };
        e.set("weights/b", Some(200));
        e.set("sampler_weights/a", Some(100));
        e.set("external_weights/c", Some(301));
        assert_eq!(e.due(99), Vec::<String>::new());
        assert_eq!(e.due(200), vec!["sampler_weights/a".to_string(), "weights/b".to_string()]);
        e.set("weights/b", None);
        assert_eq!(e.due(1_000), vec!["sampler_weights/a".to_string(), "external_weights/c".to_string()]);
    }

    #[test]
    fn the_file_goes_when_nothing_expires_and_a_damaged_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h").join("run").join(FILE);
        assert_eq!(read(&path), Ok(None));
        let mut e = Expiries { owner: "o/x".into(), model_id: "s:train:1".into(), at: BTreeMap::new() };
        e.set("weights/final", Some(5));
        write(&path, &e).unwrap();
        assert_eq!(read(&path), Ok(Some(e.clone())));
        assert_eq!(all(dir.path()), vec![(path.clone(), e.clone())]);
        e.set("weights/final", None);
        write(&path, &e).unwrap();
        assert!(!path.exists());
        std::fs::write(&path, b"{not json").unwrap();
        assert!(read(&path).unwrap_err().contains("damaged"));
        assert!(all(dir.path()).is_empty(), "skipped, not fatal");
    }
}
