//! Uploaded datasets in the blob store: `datasets/<sha256 of the content>`. Content addressing
//! makes "write, then record" trivial (the object is whole before the row names it, and the same
//! file uploaded twice is one object), and lets deletion be a sweep: an object no dataset row
//! names, older than the grace period, goes.

use crate::checkpoints::{io, BlobStore};
use crate::{Result, StoreError};
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use std::time::Duration;

const DATASETS: &str = "datasets";

impl BlobStore {
    /// Stores a dataset's bytes; returns the key its row records.
    pub async fn put_dataset(&self, bytes: Vec<u8>) -> Result<String> {
        let key = hex::encode(Sha256::digest(&bytes));
        self.store.put(&ObjectPath::from(format!("{DATASETS}/{key}")), PutPayload::from(bytes)).await.map_err(io)?;
        Ok(key)
    }

    /// The bytes of the dataset stored under `key`.
    pub async fn get_dataset(&self, key: &str) -> Result<Vec<u8>> {
        // Keys are what `put_dataset` returned, read back from the database: hex only.
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(StoreError::Io(format!("bad dataset blob key {key:?}")));
        }
        let got = self.store.get(&ObjectPath::from(format!("{DATASETS}/{key}"))).await.map_err(io)?;
        Ok(got.bytes().await.map_err(io)?.to_vec())
    }

    /// Removes dataset objects no live dataset names (`live`) that are older than `grace` (an
    /// upload whose row is not committed yet is younger). Returns how many went.
    pub async fn sweep_datasets(&self, live: &[String], grace: Duration) -> Result<usize> {
        let live: std::collections::HashSet<&str> = live.iter().map(String::as_str).collect();
        let cutoff = crate::checkpoints::cutoff_ms(grace);
        let prefix = ObjectPath::from(DATASETS);
        let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await.map_err(io)?;
        let mut removed = 0;
        for meta in metas {
            let owned = meta.location.filename().is_some_and(|name| live.contains(name));
            if owned || meta.last_modified.timestamp_millis() > cutoff {
                continue;
            }
            self.delete_quietly(&meta.location).await?;
            removed += 1;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn datasets_are_stored_by_content_and_swept_when_no_row_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::open(&format!("file://{}", dir.path().display())).unwrap();
        let a = blobs.put_dataset(b"{\"messages\": []}\n".to_vec()).await.unwrap();
        assert_eq!(a.len(), 64);
        assert_eq!(blobs.put_dataset(b"{\"messages\": []}\n".to_vec()).await.unwrap(), a, "same bytes, one key");
        let b = blobs.put_dataset(b"other".to_vec()).await.unwrap();
        assert_eq!(blobs.get_dataset(&b).await.unwrap(), b"other");
        assert!(blobs.get_dataset("../checkpoints/x").await.is_err());
        // Young objects stay whatever names them; old ones go unless a row names them.
        assert_eq!(blobs.sweep_datasets(&[], Duration::from_secs(3600)).await.unwrap(), 0);
        assert_eq!(blobs.sweep_datasets(std::slice::from_ref(&a), Duration::ZERO).await.unwrap(), 1);
        assert!(blobs.get_dataset(&b).await.is_err());
        assert_eq!(blobs.get_dataset(&a).await.unwrap(), b"{\"messages\": []}\n");
    }
}
