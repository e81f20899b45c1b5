//! The Tinker catalog's behaviour on every backend (SQLite in memory and on disk, PostgreSQL
//! when it answers): owner scoping, caps that hold under concurrency, replacement, expiry,
//! publishing, and the sweep's live files.

use serde_json::json;
use std::sync::Arc;
use tandem_core::tinker::{CheckpointKey, CheckpointKind};
use tandem_store::{Store, StoreError, TinkerCap, TinkerChange, TinkerEntry};

mod common;
use common::backends;

fn entry(owner: &str, run: &str, kind: CheckpointKind, name: &str, created_at: i64) -> TinkerEntry {
    TinkerEntry {
        owner: owner.into(),
        key: CheckpointKey::new(run, kind, name),
        size_bytes: 10,
        created_at,
        expires_at: None,
        public: false,
        blob: (kind != CheckpointKind::SamplerWeights).then(|| format!("tinker/{owner}-{run}-{name}-{created_at}")),
        meta: json!({ "rank": 8 }),
    }
}

#[tokio::test]
async fn entries_are_the_owners_and_replaced_whole() {
    for (name, store, _scratch) in backends().await {
        let a = entry("alice", "s1:train:0", CheckpointKind::Weights, "final", 1);
        assert_eq!(store.tinker_put(&a, None).await.unwrap(), None, "{name}");
        assert_eq!(store.tinker_get("alice", &a.key).await.unwrap(), Some(a.clone()), "{name}");
        assert_eq!(store.tinker_get("bob", &a.key).await.unwrap(), None, "{name}: another owner's is missing");
        assert!(store.tinker_list("bob", None).await.unwrap().is_empty());
        // Another owner cannot write under alice's run.
        let theirs = entry("bob", "s1:train:0", CheckpointKind::Weights, "x", 2);
        assert!(matches!(store.tinker_put(&theirs, None).await, Err(StoreError::Conflict(_))), "{name}");
        // Saving over a name returns what it replaces (whose files the caller removes), and the
        // new one starts private whatever the old one was.
        store.tinker_change("alice", &a.key, TinkerChange::Public(true)).await.unwrap();
        let again = TinkerEntry { size_bytes: 20, ..entry("alice", "s1:train:0", CheckpointKind::Weights, "final", 3) };
        let before = store.tinker_put(&again, None).await.unwrap().unwrap();
        assert_eq!((before.created_at, before.public), (1, true), "{name}");
        let now = store.tinker_get("alice", &a.key).await.unwrap().unwrap();
        assert_eq!((now.size_bytes, now.public, now.blob), (20, false, again.blob.clone()), "{name}");
        assert_eq!(store.tinker_published(&a.key).await.unwrap(), None, "{name}: new weights are private");
        // Listing: by run, kind and name; one run or all.
        let s = entry("alice", "s1:train:0", CheckpointKind::SamplerWeights, "a", 4);
        let other_run = entry("alice", "s2:train:0", CheckpointKind::ExternalWeights, "z", 5);
        store.tinker_put(&s, None).await.unwrap();
        store.tinker_put(&other_run, None).await.unwrap();
        let names = |l: Vec<TinkerEntry>| l.into_iter().map(|e| e.key.checkpoint()).collect::<Vec<_>>();
        assert_eq!(
            names(store.tinker_list("alice", None).await.unwrap()),
            ["sampler_weights/a", "weights/final", "external_weights/z"],
            "{name}"
        );
        assert_eq!(names(store.tinker_list("alice", Some("s2:train:0")).await.unwrap()), ["external_weights/z"]);
        // Deleting returns what went; a second time nothing; another owner's delete nothing.
        assert_eq!(store.tinker_delete("bob", &s.key).await.unwrap(), None, "{name}");
        assert_eq!(store.tinker_delete("alice", &s.key).await.unwrap().map(|e| e.created_at), Some(4));
        assert_eq!(store.tinker_delete("alice", &s.key).await.unwrap(), None);
    }
}

#[tokio::test]
async fn expiry_and_publishing_change_only_what_exists() {
    for (name, store, _scratch) in backends().await {
        let a = entry("alice", "s1:train:0", CheckpointKind::Weights, "a", 1);
        let b = entry("alice", "s1:train:0", CheckpointKind::SamplerWeights, "b", 2);
        let c = TinkerEntry { expires_at: Some(50), ..entry("alice", "s9:train:0", CheckpointKind::Weights, "c", 3) };
        for e in [&a, &b, &c] {
            store.tinker_put(e, None).await.unwrap();
        }
        let missing = CheckpointKey::new("s1:train:0", CheckpointKind::Weights, "nope");
        assert_eq!(store.tinker_change("alice", &missing, TinkerChange::Expiry(Some(1))).await.unwrap(), None);
        assert_eq!(store.tinker_change("bob", &a.key, TinkerChange::Expiry(Some(1))).await.unwrap(), None, "{name}");
        let before = store.tinker_change("alice", &b.key, TinkerChange::Expiry(Some(100))).await.unwrap().unwrap();
        assert_eq!(before.expires_at, None);
        let due = |l: Vec<TinkerEntry>| l.into_iter().map(|e| e.key.name).collect::<Vec<_>>();
        assert_eq!(due(store.tinker_expired(49, 10).await.unwrap()), Vec::<String>::new(), "{name}");
        assert_eq!(due(store.tinker_expired(100, 10).await.unwrap()), ["c", "b"], "{name}: soonest first");
        assert_eq!(due(store.tinker_expired(100, 1).await.unwrap()), ["c"], "{name}: at most the limit");
        store.tinker_change("alice", &b.key, TinkerChange::Expiry(None)).await.unwrap();
        assert_eq!(due(store.tinker_expired(1_000, 10).await.unwrap()), ["c"], "{name}");
        // Published: readable by key whoever asks, until made private.
        assert_eq!(store.tinker_published(&a.key).await.unwrap(), None);
        let was = store.tinker_change("alice", &a.key, TinkerChange::Public(true)).await.unwrap().unwrap();
        assert!(!was.public);
        assert_eq!(store.tinker_published(&a.key).await.unwrap().map(|e| e.owner).as_deref(), Some("alice"));
        store.tinker_change("alice", &a.key, TinkerChange::Public(false)).await.unwrap();
        assert_eq!(store.tinker_published(&a.key).await.unwrap(), None, "{name}");
        // The sweep keeps the catalog's files.
        let live = store.live_checkpoint_paths().await.unwrap();
        for e in [&a, &c] {
            assert!(live.contains(e.blob.as_ref().unwrap()), "{name}: {live:?}");
        }
    }
}

#[tokio::test]
async fn caps_hold_under_concurrency_per_owner_and_per_run() {
    for (name, store, _scratch) in backends().await {
        let cap = TinkerCap { max: 4, per_model: false };
        let tries = (0..12).map(|i| {
            let store: Arc<dyn Store> = store.clone();
            tokio::spawn(async move {
                let e = entry("alice", &format!("s{}:train:0", i % 3), CheckpointKind::Weights, &format!("n{i}"), i);
                store.tinker_put(&e, Some(cap)).await
            })
        });
        let mut kept = 0;
        for t in tries {
            match t.await.unwrap() {
                Ok(None) => kept += 1,
                Err(StoreError::AtLimit(n)) => assert_eq!(n, 4, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
        assert_eq!(kept, 4, "{name}: the cap held");
        assert_eq!(store.tinker_list("alice", None).await.unwrap().len(), 4);
        // Saving over a name does not count; other kinds and owners have their own counts.
        let first = store.tinker_list("alice", None).await.unwrap().remove(0);
        let over = TinkerEntry { created_at: 99, ..first.clone() };
        assert!(store.tinker_put(&over, Some(cap)).await.unwrap().is_some(), "{name}");
        let ext = entry("alice", "s0:train:0", CheckpointKind::ExternalWeights, "e", 1);
        assert_eq!(store.tinker_put(&ext, Some(cap)).await.unwrap(), None);
        assert_eq!(
            store.tinker_put(&entry("bob", "b:train:0", CheckpointKind::Weights, "x", 1), Some(cap)).await.unwrap(),
            None
        );
        // Per run: the same owner's other run has room.
        let per_run = TinkerCap { max: 1, per_model: true };
        let s = |run: &str, n: &str| entry("carol", run, CheckpointKind::SamplerWeights, n, 1);
        store.tinker_put(&s("c:train:0", "a"), Some(per_run)).await.unwrap();
        assert!(matches!(store.tinker_put(&s("c:train:0", "b"), Some(per_run)).await, Err(StoreError::AtLimit(1))));
        store.tinker_put(&s("c:train:1", "b"), Some(per_run)).await.unwrap();
    }
}

/// A secret is the first one stored, whoever asks after (every node of a cluster signs with the
/// same key), also when nodes ask at once.
#[tokio::test]
async fn secrets_are_the_first_stored() {
    for (name, store, _scratch) in backends().await {
        let asked: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.tinker_secret("urls", &format!("{i:064x}")).await.unwrap() })
            })
            .collect();
        let mut got = Vec::new();
        for a in asked {
            got.push(a.await.unwrap());
        }
        assert!(got.iter().all(|g| g == &got[0]), "{name}: {got:?}");
        assert_eq!(store.tinker_secret("urls", "other").await.unwrap(), got[0], "{name}");
        assert_eq!(store.tinker_secret("else", "fresh").await.unwrap(), "fresh", "{name}: per name");
    }
}

/// A session's host moves only from the node that holds it (one of several nodes racing to take a
/// dead host's session over wins), and only its host forgets it.
#[tokio::test]
async fn session_hosts_move_once_and_only_the_host_drops_them() {
    use tandem_store::TinkerSession;
    for (name, store, _scratch) in backends().await {
        let s = TinkerSession { id: "tandem-a".into(), entity: "alice".into(), node: "n1".into(), models: json!([]) };
        store.tinker_session_put(&s).await.unwrap();
        let models = json!([{ "seq": 0, "base_model": "base", "rank": 8 }]);
        store.tinker_session_put(&TinkerSession { models: models.clone(), ..s.clone() }).await.unwrap();
        let other = TinkerSession { id: "tandem-b".into(), ..s.clone() };
        store.tinker_session_put(&other).await.unwrap();
        assert_eq!(store.tinker_session("tandem-a").await.unwrap().unwrap().models, models, "{name}");
        assert_eq!(store.tinker_session("tandem-z").await.unwrap(), None, "{name}");

        let racing: Vec<_> = (0..6)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(
                    async move { store.tinker_session_move("tandem-a", "n1", &format!("m{i}")).await.unwrap() },
                )
            })
            .collect();
        let mut won = 0;
        for r in racing {
            won += r.await.unwrap() as usize;
        }
        assert_eq!(won, 1, "{name}: one node takes the session over");
        let host = store.tinker_session("tandem-a").await.unwrap().unwrap().node;
        assert!(host.starts_with('m'), "{name}: {host}");
        assert!(!store.tinker_session_move("tandem-a", "n1", "n9").await.unwrap(), "{name}: n1 no longer holds it");

        let mut counts = store.tinker_session_counts().await.unwrap();
        counts.sort();
        assert_eq!(counts, vec![(host.clone(), 1), ("n1".to_string(), 1)], "{name}");
        store.tinker_session_drop("tandem-a", "n1").await.unwrap();
        assert!(store.tinker_session("tandem-a").await.unwrap().is_some(), "{name}: the old host cannot drop it");
        store.tinker_session_drop("tandem-a", &host).await.unwrap();
        assert_eq!(store.tinker_session("tandem-a").await.unwrap(), None, "{name}");

        // A node that left the registry: its old rows go; a registered node's stay.
        let beat = tandem_store::NodeBeat {
            id: "n1".into(),
            name: "n1".into(),
            role: "trainer".into(),
            version: "t".into(),
            busy: false,
            address: String::new(),
        };
        store.node_heartbeat(&beat).await.unwrap();
        let gone = TinkerSession { id: "tandem-c".into(), node: "n-gone".into(), ..s.clone() };
        store.tinker_session_put(&gone).await.unwrap();
        assert_eq!(store.tinker_session_sweep(0).await.unwrap(), 0, "{name}: none that old");
        let later = tandem_store::now_ms() + 1000;
        assert_eq!(store.tinker_session_sweep(later).await.unwrap(), 1, "{name}: n1's tandem-b stays");
        assert!(store.tinker_session("tandem-b").await.unwrap().is_some(), "{name}");
    }
}
