//! Checkpoint files on local disk: `<data-dir>/checkpoints/<model-id>/<checkpoint-id>/`.
//!
//! A checkpoint directory becomes visible only whole: files are written into a temporary
//! directory, fsynced, renamed into place and the parent directory fsynced, before the store
//! records the checkpoint row. An object-store backend for scale-out is a later step.

use crate::Result;
use std::fs;
use std::path::{Path, PathBuf};
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct CheckpointDir {
    root: PathBuf,
}

impl CheckpointDir {
    /// Uses (and creates) `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root)?;
        Ok(CheckpointDir { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path recorded in the store for a checkpoint, relative to the root.
    pub fn relative_path(model_id: Uuid, checkpoint_id: Uuid) -> String {
        format!("{model_id}/{checkpoint_id}")
    }

    /// Absolute directory of a recorded relative path. Paths are made by [`Self::relative_path`];
    /// anything that could escape the root is refused.
    pub fn resolve(&self, relative: &str) -> Option<PathBuf> {
        let ok =
            !relative.is_empty() && relative.split('/').all(|part| !part.is_empty() && part != "." && part != "..");
        ok.then(|| self.root.join(relative))
    }

    /// Writes `files` (name, bytes) as one checkpoint directory, atomically and durably.
    pub fn write_atomic(&self, relative: &str, files: &[(&str, &[u8])]) -> Result<PathBuf> {
        let target =
            self.resolve(relative).ok_or_else(|| crate::StoreError::Io(format!("bad checkpoint path {relative}")))?;
        let parent = target.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&parent)?;
        let tmp = parent.join(format!(".tmp-{}", tandem_core::new_id()));
        fs::create_dir(&tmp)?;
        for (name, bytes) in files {
            let path = tmp.join(name);
            fs::write(&path, bytes)?;
            fs::File::open(&path)?.sync_all()?;
        }
        fs::File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, &target)?;
        fs::File::open(&parent)?.sync_all()?;
        Ok(target)
    }

    /// Removes a checkpoint's files; a missing directory is not an error.
    pub fn remove(&self, relative: &str) -> Result<()> {
        if let Some(dir) = self.resolve(relative) {
            match fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Removes every checkpoint directory (and leftover temp directory) that no live checkpoint
    /// owns: what a crash between the database commit and the file removal, or between the
    /// file write and the database commit, leaves behind. Returns how many were removed.
    pub fn sweep(&self, live: &[String]) -> Result<usize> {
        let live: std::collections::HashSet<&str> = live.iter().map(String::as_str).collect();
        let mut removed = 0;
        for model in fs::read_dir(&self.root)? {
            let model = model?;
            if !model.file_type()?.is_dir() {
                continue;
            }
            let model_name = model.file_name().to_string_lossy().into_owned();
            for cp in fs::read_dir(model.path())? {
                let cp = cp?;
                let rel = format!("{model_name}/{}", cp.file_name().to_string_lossy());
                if !live.contains(rel.as_str()) {
                    fs::remove_dir_all(cp.path())?;
                    removed += 1;
                }
            }
            if fs::read_dir(model.path())?.next().is_none() {
                fs::remove_dir(model.path())?;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_remove_and_sweep() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(tmp.path().join("checkpoints")).unwrap();
        let (m, a, b) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let ra = CheckpointDir::relative_path(m, a);
        let rb = CheckpointDir::relative_path(m, b);
        let pa = dir.write_atomic(&ra, &[("adapter_config.json", b"{}")]).unwrap();
        dir.write_atomic(&rb, &[("x", b"1")]).unwrap();
        assert_eq!(fs::read(pa.join("adapter_config.json")).unwrap(), b"{}");
        assert_eq!(dir.sweep(std::slice::from_ref(&ra)).unwrap(), 1);
        assert!(pa.exists());
        dir.remove(&ra).unwrap();
        dir.remove(&ra).unwrap();
        assert!(!pa.exists());
        assert!(dir.resolve("../etc").is_none());
        assert_eq!(dir.sweep(&[]).unwrap(), 0);
    }
}
