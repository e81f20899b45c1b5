use super::*;
use tandem_store::{CheckpointDir, SqliteStore};

struct Fixture {
    catalog: Catalog,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    let files = Checkpoints::local(CheckpointDir::open(&root).unwrap());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().await.unwrap());
    Fixture { catalog: Catalog::new(store, files), root, _dir: dir }
}

fn info(rank: usize) -> StateInfo {
    StateInfo { base_model: "base".into(), rank, modules: Modules::ALL }
}

fn state(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    vec![(STATE_FILE.into(), bytes.to_vec()), ("state.json".into(), b"{}".to_vec())]
}

fn sampler(name: &str, step: i64) -> SavedSampler {
    SavedSampler {
        name: name.into(),
        step,
        checkpoint_id: uuid::Uuid::now_v7(),
        created_at: 1,
        record_id: uuid::Uuid::now_v7(),
        base_model: "base".into(),
        rank: 8,
        unembed: false,
        attn: true,
        mlp: true,
    }
}

/// The directories under `tinker/` in the checkpoint store.
fn blobs(root: &std::path::Path) -> usize {
    std::fs::read_dir(root.join("tinker")).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test]
async fn a_state_saved_over_gets_fresh_files_and_the_old_ones_go() {
    let f = fixture().await;
    let key = CheckpointKey::new("s:train:0", CheckpointKind::Weights, "final");
    f.catalog.save_state("alice", "s:train:0", "final", state(b"one"), &info(8), None).await.unwrap();
    let first = f.catalog.state("alice", &key, false).await.unwrap().unwrap();
    assert_eq!(first.info, info(8));
    assert_eq!(std::fs::read(first.dir.join(STATE_FILE)).unwrap(), b"one");
    // Published, then saved over: the path is private again and names the new bytes only.
    assert_eq!(f.catalog.set_public("alice", &key, true).await.unwrap(), Some(true));
    assert!(f.catalog.state("bob", &key, true).await.unwrap().is_some(), "published");
    f.catalog.save_state("alice", "s:train:0", "final", state(b"two"), &info(16), Some(5)).await.unwrap();
    assert!(f.catalog.state("bob", &key, true).await.unwrap().is_none(), "new weights under the name are private");
    let second = f.catalog.state("alice", &key, false).await.unwrap().unwrap();
    assert_ne!(second.dir, first.dir);
    assert!(!first.dir.exists(), "the replaced files are gone");
    assert_eq!((std::fs::read(second.dir.join(STATE_FILE)).unwrap(), second.info.rank), (b"two".to_vec(), 16));
    assert_eq!(blobs(&f.root), 1);
    // Another entity's state is missing, not forbidden; a private one is not readable as published.
    assert!(f.catalog.state("bob", &key, false).await.unwrap().is_none());
    assert_eq!(f.catalog.expired(5).await.unwrap().len(), 1);
    assert!(f.catalog.delete("alice", &key).await.unwrap().is_some());
    assert_eq!(blobs(&f.root), 0, "deleting removes the files");
}

#[tokio::test]
async fn a_refused_save_leaves_nothing_behind() {
    let f = fixture().await;
    for i in 0..MAX_STATES_PER_ENTITY {
        let run = format!("s{}:train:0", i % 3);
        f.catalog.save_state("alice", &run, &format!("n{i}"), state(b"x"), &info(8), None).await.unwrap();
    }
    let over = f.catalog.save_state("alice", "s0:train:0", "one-more", state(b"x"), &info(8), None).await;
    assert!(matches!(over, Err(TinkerError::User(m)) if m.contains("64 saved states")));
    assert_eq!(blobs(&f.root) as i64, MAX_STATES_PER_ENTITY, "the refused save's files went again");
    // Saving over a name still works at the cap; a bad name is refused before anything is written.
    f.catalog.save_state("alice", "s0:train:0", "n0", state(b"y"), &info(8), None).await.unwrap();
    for bad in ["", "a/b", "..", &"x".repeat(129)] {
        let r = f.catalog.save_external("alice", "s0:train:0", bad, state(b"x"), None).await;
        assert!(matches!(r, Err(TinkerError::User(_))), "{bad:?}");
    }
    // Another entity's run is missing, not writable.
    let theirs = f.catalog.save_state("bob", "s0:train:0", "mine", state(b"x"), &info(8), None).await;
    assert!(matches!(theirs, Err(TinkerError::NotFound(_))), "{theirs:?}");
    assert_eq!(blobs(&f.root) as i64, MAX_STATES_PER_ENTITY);
}

#[tokio::test]
async fn sampler_names_replace_and_forget_their_checkpoints() {
    let f = fixture().await;
    let a = sampler("a", 1);
    assert_eq!(f.catalog.note_sampler("alice", "s:train:0", &a, None).await.unwrap(), None);
    let again = sampler("a", 2);
    let replaced = f.catalog.note_sampler("alice", "s:train:0", &again, Some(9)).await.unwrap();
    assert_eq!(replaced, Some(a), "the caller deletes the replaced checkpoint");
    assert_eq!(f.catalog.samplers("alice", "s:train:0").await.unwrap(), vec![again.clone()]);
    assert!(f.catalog.samplers("bob", "s:train:0").await.unwrap().is_empty());
    f.catalog.sampler_room("alice", "s:train:0", "b").await.unwrap();
    assert!(matches!(f.catalog.sampler_room("alice", "s:train:0", "b/c").await, Err(TinkerError::User(_))));
    let key = CheckpointKey::new("s:train:0", CheckpointKind::SamplerWeights, "a");
    assert!(f.catalog.set_expiry("alice", &key, None).await.unwrap());
    assert!(!f.catalog.set_expiry("bob", &key, None).await.unwrap(), "another entity's is missing");
    assert!(f.catalog.expired(i64::MAX).await.unwrap().is_empty());
    assert_eq!(f.catalog.delete("alice", &key).await.unwrap().as_ref().and_then(sampler_of), Some(again));
    assert_eq!(f.catalog.set_public("alice", &key, true).await.unwrap(), None, "nothing to publish");
}

#[tokio::test]
async fn external_weights_list_their_files() {
    let f = fixture().await;
    let files = vec![("adapter_config.json".into(), b"{}".to_vec()), ("adapter_model.safetensors".into(), vec![0; 10])];
    assert_eq!(f.catalog.save_external("alice", "s:train:0", "final", files, None).await.unwrap(), 12);
    let listed = f.catalog.external_files("alice", "s:train:0", "final").await.unwrap().unwrap();
    assert_eq!(
        listed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["adapter_config.json", "adapter_model.safetensors"]
    );
    assert!(f.catalog.external_files("bob", "s:train:0", "final").await.unwrap().is_none());
    let entries = f.catalog.list("alice", None).await.unwrap();
    assert_eq!((entries.len(), entries[0].size_bytes), (1, 12));
}

#[tokio::test]
async fn an_old_catalog_is_imported_once_with_its_marks() {
    let f = fixture().await;
    let old = f._dir.path().join("tinker-states");
    let run = old.join(crate::legacy::owner_hash("alice")).join("s_train_0");
    std::fs::create_dir_all(run.join("external").join("ext")).unwrap();
    std::fs::write(run.join("final.safetensors"), b"weights").unwrap();
    let about =
        r#"{"base_model":"base","rank":8,"alpha":32.0,"train_attn":true,"train_mlp":false,"train_unembed":true}"#;
    std::fs::write(run.join("final.json"), about).unwrap();
    std::fs::write(run.join("external").join("ext").join("adapter_config.json"), b"{}").unwrap();
    std::fs::write(run.join(".sampler_weights"), serde_json::to_vec(&[sampler("pub", 1)]).unwrap()).unwrap();
    let expiry = r#"{"owner":"alice","model_id":"s:train:0","at":{"weights/final":77}}"#;
    std::fs::write(run.join(".expiry"), expiry).unwrap();
    let public = r#"{"owner":"alice","model_id":"s:train:0","checkpoints":["sampler_weights/pub"]}"#;
    std::fs::write(run.join(".public"), public).unwrap();
    std::fs::create_dir_all(old.join(crate::legacy::owner_hash("gone")).join("x_train_0")).unwrap();
    let entities = vec!["alice".to_string(), "bob".to_string()];
    let done = crate::legacy::import(&old, &f.catalog, &entities).await.unwrap().unwrap();
    assert_eq!(done.entries, 3);
    assert_eq!(done.unknown_owners, vec![crate::legacy::owner_hash("gone")]);
    assert!(!old.exists() && f._dir.path().join("tinker-states.imported").is_dir());
    let key = CheckpointKey::new("s:train:0", CheckpointKind::Weights, "final");
    let saved = f.catalog.state("alice", &key, false).await.unwrap().unwrap();
    assert_eq!(saved.info.modules, Modules { attn: true, mlp: false, unembed: true });
    assert_eq!(std::fs::read_to_string(saved.dir.join("state.json")).unwrap(), about, "alpha kept for loading");
    assert_eq!(f.catalog.expired(77).await.unwrap().len(), 1);
    let published = CheckpointKey::new("s:train:0", CheckpointKind::SamplerWeights, "pub");
    assert_eq!(f.catalog.published(&published).await.unwrap().map(|e| e.owner).as_deref(), Some("alice"));
    assert!(f.catalog.external_files("alice", "s:train:0", "ext").await.unwrap().is_some());
    assert_eq!(crate::legacy::import(&old, &f.catalog, &entities).await.unwrap(), None, "once");
}
