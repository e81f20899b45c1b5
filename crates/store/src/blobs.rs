//! Checkpoint files on local disk: `<data-dir>/checkpoints/<model-id>/<checkpoint-id>/`.
//!
//! A checkpoint directory becomes visible only whole: files are written into a temporary
//! directory, fsynced, renamed into place and the parent directory fsynced, before the store
//! records the checkpoint row. A write that fails (a full disk, say) removes its temporary
//! directory at once. Directories are created 0700 and files 0600: checkpoints are one tenant's
//! trained weights, and the server's user is the only one that needs them. With a shared blob
//! store (`checkpoints.rs`) this directory is the node's read-through cache of it.

use crate::Result;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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
        create_private_dir_all(&root)?;
        // An existing root (made by an older version) is tightened as well.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700))?;
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
        create_private_dir_all(&parent)?;
        let tmp = parent.join(format!(".tmp-{}", tandem_core::new_id()));
        fs::DirBuilder::new().mode(0o700).create(&tmp)?;
        let written = (|| -> std::io::Result<()> {
            for (name, bytes) in files {
                let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(tmp.join(name))?;
                f.write_all(bytes)?;
                f.sync_all()?;
            }
            fs::File::open(&tmp)?.sync_all()?;
            match fs::rename(&tmp, &target) {
                // Two downloads of one checkpoint from the blob store at once: the other one
                // put the same files in place first.
                Err(_) if target.is_dir() => fs::remove_dir_all(&tmp),
                other => other,
            }
        })();
        if let Err(e) = written {
            // Nothing refers to the temporary directory: it goes now, not at the next start.
            let _ = fs::remove_dir_all(&tmp);
            return Err(e.into());
        }
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
                    // A file here is what a merged export that a crash interrupted left in its
                    // `.merge-*` directory.
                    if cp.file_type()?.is_dir() {
                        fs::remove_dir_all(cp.path())?;
                    } else {
                        fs::remove_file(cp.path())?;
                    }
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

/// `create_dir_all` with mode 0700 for every directory it creates.
pub fn create_private_dir_all(path: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(path)
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
        // A merged export interrupted by a crash: its directory and file go at the next start.
        fs::create_dir(dir.root().join(".merge-x")).unwrap();
        fs::write(dir.root().join(".merge-x/merged.gguf"), b"GGUF").unwrap();
        assert_eq!(dir.sweep(&[]).unwrap(), 1);
        assert!(!dir.root().join(".merge-x").exists());
    }

    #[test]
    fn checkpoints_are_private_and_a_failed_write_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("checkpoints");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        let dir = CheckpointDir::open(&root).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o700, "an existing root is tightened");
        let m = Uuid::now_v7();
        let written = dir.write_atomic(&CheckpointDir::relative_path(m, Uuid::now_v7()), &[("w", b"1")]).unwrap();
        assert_eq!((mode(written.parent().unwrap()), mode(&written), mode(&written.join("w"))), (0o700, 0o700, 0o600));

        // A write that fails midway (here a file name the directory cannot hold, as a full disk
        // would fail it) leaves no temporary directory behind.
        let failed = dir.write_atomic(&CheckpointDir::relative_path(m, Uuid::now_v7()), &[("ok", b"1"), ("a/b", b"2")]);
        assert!(failed.is_err());
        let left: Vec<_> = fs::read_dir(written.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![written.file_name().unwrap().to_owned()], "only the good checkpoint remains");
    }
}
