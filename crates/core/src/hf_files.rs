//! A tokenizer as files a Hugging Face client loads offline: the flat directory
//! `AutoTokenizer.from_pretrained(DIR)` reads, and the same files in the layout of a Hugging Face
//! hub cache, so that loading by the model's *name* (`AutoTokenizer.from_pretrained("org/name")`,
//! which the tinker SDK's `SamplingClient.get_tokenizer()`, tinker-cookbook's `get_tokenizer` and
//! ART do) finds them with `HF_HUB_CACHE` pointed at it and `HF_HUB_OFFLINE=1`.

use sha2::{Digest, Sha256};

/// One file: its path relative to the directory it is written into, and its bytes.
pub type File = (String, Vec<u8>);

/// The directory name a model id gets among others (`org/name` as `org--name`, a `:` as `_`).
pub fn dir_name(id: &str) -> String {
    id.replace('/', "--").replace(':', "_")
}

/// `files` in a hub cache's layout for the repository `id`: `models--{id, / as --}/refs/main`
/// naming a revision and `snapshots/{revision}/` holding the files. The revision is derived from
/// the files' bytes (40 hex digits, the form the hub client expects of a commit), so rewriting the
/// same files gives the same paths and a changed tokenizer a new snapshot.
pub fn hub_layout(id: &str, files: &[File]) -> Vec<File> {
    let mut hash = Sha256::new();
    for (name, bytes) in files {
        hash.update((name.len() as u64).to_le_bytes());
        hash.update(name.as_bytes());
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    }
    let revision: String = hash.finalize().iter().take(20).map(|b| format!("{b:02x}")).collect();
    let repo = format!("models--{}", id.replace('/', "--"));
    let mut out = vec![(format!("{repo}/refs/main"), revision.clone().into_bytes())];
    out.extend(files.iter().map(|(name, bytes)| (format!("{repo}/snapshots/{revision}/{name}"), bytes.clone())));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_layout_names_one_revision_from_the_bytes() {
        let files =
            vec![("tokenizer.json".to_string(), b"{}".to_vec()), ("tokenizer_config.json".to_string(), b"{}".to_vec())];
        let a = hub_layout("org/name", &files);
        let rev = String::from_utf8(a[0].1.clone()).unwrap();
        assert_eq!(a[0].0, "models--org--name/refs/main");
        assert_eq!(rev.len(), 40);
        assert!(rev.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(a[1].0, format!("models--org--name/snapshots/{rev}/tokenizer.json"));
        assert_eq!(a[2].0, format!("models--org--name/snapshots/{rev}/tokenizer_config.json"));
        // Same bytes, same revision; one byte changed, another.
        assert_eq!(hub_layout("org/name", &files)[0].1, a[0].1);
        let mut changed = files.clone();
        changed[0].1 = b"{ }".to_vec();
        assert_ne!(hub_layout("org/name", &changed)[0].1, a[0].1);
        // A name without an organisation, as the hub allows.
        assert_eq!(hub_layout("gpt2", &files)[0].0, "models--gpt2/refs/main");
    }

    #[test]
    fn dir_names_hold_no_separators() {
        assert_eq!(dir_name("HuggingFaceTB/SmolLM2-135M-Instruct"), "HuggingFaceTB--SmolLM2-135M-Instruct");
        assert_eq!(dir_name("a/b:c"), "a--b_c");
    }
}
