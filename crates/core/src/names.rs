//! Rules for the names that make up a model address `{entity}/{project}/{name}[:stepN]`.

/// Longest entity, project or model name accepted.
pub const MAX_NAME_LEN: usize = 128;

/// Why a name cannot be used in a model address, or `None` if it can.
///
/// A name must survive being written into `wandb-artifact:///{entity}/{project}/{name}:step{N}`
/// and parsed back, so it may not contain `/`, whitespace or control characters, and may not end
/// in something that reads as a `:stepN` suffix.
pub fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("must not be empty");
    }
    if name.chars().count() > MAX_NAME_LEN {
        return Some("must be at most 128 characters");
    }
    if name.chars().any(|c| c == '/' || c.is_whitespace() || c.is_control()) {
        return Some("must not contain '/', whitespace or control characters");
    }
    if split_step_suffix(name).1.is_some() {
        return Some("must not end in ':step<N>'");
    }
    None
}

/// Splits `name:step12` into (`name`, Some(12)); anything else is returned whole.
pub fn split_step_suffix(s: &str) -> (&str, Option<i64>) {
    if let Some((head, tail)) = s.rsplit_once(":step") {
        if !tail.is_empty() && tail.len() <= 18 && tail.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(n) = tail.parse() {
                return (head, Some(n));
            }
        }
    }
    (s, None)
}

/// A checkpoint of one model named by the user, e.g. in `kl_ref_adapter_path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointRef {
    /// The latest checkpoint (the base model before any).
    Latest,
    Step(i64),
    /// A checkpoint's id, as the checkpoints list shows it.
    Id(uuid::Uuid),
}

/// The model a [`CheckpointRef`] must belong to.
pub struct ModelName<'a> {
    pub id: uuid::Uuid,
    pub entity: &'a str,
    pub project: &'a str,
    pub name: &'a str,
}

/// Reads a reference to one of `model`'s checkpoints: its address
/// `wandb-artifact:///{entity}/{project}/{name}[:stepN]` (or without the scheme), a checkpoint
/// id (alone or as `.../{model_id}/{checkpoint_id}`), or ART's local checkpoint directory
/// `.../{project}/models/{name}/checkpoints/{step}`. Anything else, including another model's
/// checkpoints, is `None`: a server path is never followed.
pub fn checkpoint_ref(text: &str, model: &ModelName) -> Option<CheckpointRef> {
    let address = text.strip_prefix("wandb-artifact:///").or_else(|| text.strip_prefix("wandb-artifact://"));
    let (path, step) = split_step_suffix(address.unwrap_or(text));
    if path == format!("{}/{}/{}", model.entity, model.project, model.name) {
        return Some(step.map_or(CheckpointRef::Latest, CheckpointRef::Step));
    }
    if address.is_some() {
        return None;
    }
    let parts: Vec<&str> = text.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    let uuid = |s: &str| uuid::Uuid::parse_str(s).ok();
    match parts.as_slice() {
        [id] => uuid(id).map(CheckpointRef::Id),
        [.., m, id] if uuid(id).is_some() && uuid(m).is_some() => {
            (uuid(m) == Some(model.id)).then(|| CheckpointRef::Id(uuid(id).unwrap_or_default()))
        }
        [.., project, "models", name, "checkpoints", step] if *project == model.project && *name == model.name => {
            step.bytes().all(|b| b.is_ascii_digit()).then(|| step.parse().ok().map(CheckpointRef::Step)).flatten()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_refs() {
        let id = uuid::Uuid::from_u128(7);
        let cp = uuid::Uuid::from_u128(9);
        let m = ModelName { id, entity: "e", project: "p", name: "n" };
        let r = |s: &str| checkpoint_ref(s, &m);
        assert_eq!(r("wandb-artifact:///e/p/n:step3"), Some(CheckpointRef::Step(3)));
        assert_eq!(r("wandb-artifact://e/p/n"), Some(CheckpointRef::Latest));
        assert_eq!(r("e/p/n:step0"), Some(CheckpointRef::Step(0)));
        assert_eq!(r("wandb-artifact:///e/p/other:step3"), None);
        assert_eq!(r("wandb-artifact:///f/p/n:step3"), None);
        assert_eq!(r(&cp.to_string()), Some(CheckpointRef::Id(cp)));
        assert_eq!(r(&format!("/data/checkpoints/{id}/{cp}")), Some(CheckpointRef::Id(cp)));
        assert_eq!(r(&format!("/data/checkpoints/{cp}/{cp}")), None);
        assert_eq!(r(".art/p/models/n/checkpoints/0004"), Some(CheckpointRef::Step(4)));
        assert_eq!(r("/home/u/.art/p/models/x/checkpoints/0004"), None);
        assert_eq!(r("../../etc/passwd"), None);
        assert_eq!(r(".art/p/models/n/checkpoints/-1"), None);
    }

    #[test]
    fn names() {
        assert_eq!(name_problem("agent-001.v2_x"), None);
        assert!(name_problem("").is_some());
        assert!(name_problem("a/b").is_some());
        assert!(name_problem("a b").is_some());
        assert!(name_problem("run:step3").is_some());
        assert_eq!(name_problem("run:stepper"), None);
        assert!(name_problem(&"x".repeat(129)).is_some());
    }

    #[test]
    fn step_suffix() {
        assert_eq!(split_step_suffix("m:step12"), ("m", Some(12)));
        assert_eq!(split_step_suffix("m:step"), ("m:step", None));
        assert_eq!(split_step_suffix("m"), ("m", None));
        assert_eq!(split_step_suffix("a:step1:step2"), ("a:step1", Some(2)));
    }
}
