//! Model addressing (contract §2): a served base id (the default), an adapter the caller's entity
//! loaded with `/v1/load_lora_adapter` (by its name), or a trained model of the
//! caller's entity as `wandb-artifact:///{entity}/{project}/{name}[:stepN]` (two slashes too) or
//! `{entity}/{project}/{name}[:stepN]`. No suffix = the latest checkpoint (the base if none),
//! `:step0` = the base. Anything else, another entity's model or a deleted step is a 404.
//!
//! Every resolution of a trained model asks the store. What it answered is remembered per node
//! ([`LastKnown`]) and used only when the store does not answer: checkpoints this node already
//! holds serve on through a database outage (nothing is trained, recorded or deleted while it
//! lasts: those need the store too).

use crate::error::{ApiError, ErrorKind};
use crate::AppState;
use std::collections::HashMap;
use std::sync::Mutex;
use tandem_core::inference::{AdapterRef, ModelHandle};
use tandem_core::names::split_step_suffix;
use tandem_store::StoreError;
use uuid::Uuid;

/// A trained model's name as the store last resolved it: its base model, and its checkpoint
/// (id, relative path) unless the name meant the base (step 0, or no checkpoint yet).
#[derive(Debug, Clone, PartialEq)]
struct Known {
    base_model: String,
    checkpoint: Option<(Uuid, String)>,
}

/// The last resolution of each (entity, project, name, step) this node made, at most
/// [`LAST_KNOWN_MAX`] of them (beyond it an arbitrary one is dropped: a dropped name only loses
/// its fallback, never its correctness), and when the store last failed to answer: for
/// [`STORE_RECHECK`] after that, names with a fallback skip the store (they would each wait the
/// pool's acquire timeout), and after it one lookup at a time tries the store again.
#[derive(Debug, Default)]
pub struct LastKnown(Mutex<HashMap<String, Known>>, Mutex<Breaker>);

#[derive(Debug, Default)]
struct Breaker {
    down_at: Option<std::time::Instant>,
    probing: bool,
}

const LAST_KNOWN_MAX: usize = 10_000;
const STORE_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl LastKnown {
    /// Whether a lookup should go to the store (false: the store failed moments ago, or another
    /// lookup is finding out whether it is back). A true answer must be followed by
    /// [`Self::store_answered`].
    fn ask_store(&self) -> bool {
        let mut b = self.1.lock().unwrap_or_else(|e| e.into_inner());
        match b.down_at {
            None => true,
            Some(at) if at.elapsed() < STORE_RECHECK || b.probing => false,
            Some(_) => {
                b.probing = true;
                true
            }
        }
    }

    /// What a lookup that went to the store found: whether the store answered at all.
    fn store_answered(&self, answered: bool) {
        let mut b = self.1.lock().unwrap_or_else(|e| e.into_inner());
        b.probing = false;
        b.down_at = if answered { None } else { Some(std::time::Instant::now()) };
    }

    fn remember(&self, key: String, known: Known) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= LAST_KNOWN_MAX && !map.contains_key(&key) {
            if let Some(any) = map.keys().next().cloned() {
                map.remove(&any);
            }
        }
        map.insert(key, known);
    }

    fn forget(&self, key: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    fn get(&self, key: &str) -> Option<Known> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
    }

    /// `entity`'s trained model names this node resolved, with their base models, sorted: what
    /// `/v1/models` lists while the store does not answer (the names that still serve).
    pub(crate) fn names_of(&self, entity: &str) -> Vec<(String, String)> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<(String, String)> = map
            .iter()
            .filter_map(|(key, known)| {
                let [e, project, name, step] = key.split('\0').collect::<Vec<_>>()[..] else { return None };
                let step = match step {
                    "-1" => String::new(),
                    s => format!(":step{s}"),
                };
                (e == entity)
                    .then(|| (format!("wandb-artifact:///{e}/{project}/{name}{step}"), known.base_model.clone()))
            })
            .collect();
        names.sort();
        names
    }
}

/// Why a trained model's name did not resolve from the store.
enum Lookup {
    NotFound,
    Store(StoreError),
}

impl From<StoreError> for Lookup {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Lookup::NotFound,
            other => Lookup::Store(other),
        }
    }
}

/// The store's answer for a trained model's name (`step` None: the latest).
async fn lookup(state: &AppState, entity: &str, project: &str, name: &str, step: Option<i64>) -> Result<Known, Lookup> {
    let record = state.store().find_model(entity, project, name).await?;
    let step = match step {
        Some(s) => s,
        None => state.store().latest_step(record.id).await?,
    };
    if step == 0 {
        return Ok(Known { base_model: record.base_model, checkpoint: None });
    }
    let cp = state.store().get_checkpoint(record.id, step).await?;
    Ok(Known { base_model: record.base_model, checkpoint: Some((cp.id, cp.path)) })
}

/// What a `model` string resolves to: the served base model and, for a trained step, its adapter.
#[derive(Clone)]
pub struct Target {
    pub model: ModelHandle,
    pub adapter: Option<AdapterRef>,
    /// The name echoed in responses.
    pub name: String,
}

fn not_found(model: &str, state: &AppState) -> ApiError {
    let aliases = state.served_models().join(", ");
    ApiError {
        param: Some("model".into()),
        ..ApiError::new(ErrorKind::NotFound, format!("The model `{model}` does not exist. Valid aliases: {aliases}."))
    }
}

/// Resolves `model` for `entity`; a 503 when this server runs no inference engine.
pub async fn resolve(state: &AppState, entity: &str, model: Option<&str>) -> Result<Target, ApiError> {
    let served = state.models();
    let Some(model) = model else {
        let Some(base) = served.first() else { return Err(super::no_engine()) };
        return Ok(Target { model: base.clone(), adapter: None, name: base.info().id.clone() });
    };
    if let Some(base) = state.model(model) {
        return Ok(Target { model: base.clone(), adapter: None, name: model.to_string() });
    }
    if served.is_empty() {
        return Err(super::no_engine());
    }
    // An adapter this entity loaded at run time (`/v1/load_lora_adapter`).
    if let Some(l) = state.loras().get(entity, model) {
        let base = state.model(&l.base).cloned().ok_or_else(|| not_found(model, state))?;
        return Ok(Target { model: base, adapter: Some(l.adapter), name: model.to_string() });
    }
    let path =
        model.strip_prefix("wandb-artifact:///").or_else(|| model.strip_prefix("wandb-artifact://")).unwrap_or(model);
    let (path, step) = split_step_suffix(path);
    let parts: Vec<&str> = path.split('/').collect();
    let [e, project, name] = parts.as_slice() else { return Err(not_found(model, state)) };
    if *e != entity {
        return Err(not_found(model, state));
    }
    // Entity, project and name cannot hold U+0000 as path segments of a served name.
    let key = format!("{entity}\0{project}\0{name}\0{}", step.map_or(-1, |s| s));
    let last = state.last_known();
    let fallback = last.get(&key);
    let asked = match &fallback {
        Some(_) if !last.ask_store() => Err(Lookup::Store(StoreError::Unavailable("skipped: down moments ago".into()))),
        _ => {
            let r = lookup(state, entity, project, name, step).await;
            last.store_answered(!matches!(r, Err(Lookup::Store(StoreError::Unavailable(_)))));
            r
        }
    };
    let known = match asked {
        Ok(known) => {
            state.last_known().remember(key, known.clone());
            known
        }
        Err(Lookup::NotFound) => {
            state.last_known().forget(&key);
            return Err(not_found(model, state));
        }
        Err(Lookup::Store(StoreError::Unavailable(why))) => match fallback {
            Some(known) => {
                tracing::debug!(model, error = %why, "the store is unavailable; serving the last known resolution");
                known
            }
            None => return Err(StoreError::Unavailable(why).into()),
        },
        Err(Lookup::Store(other)) => return Err(other.into()),
    };
    let base = state.model(&known.base_model).cloned().ok_or_else(|| not_found(model, state))?;
    let Some((checkpoint_id, relative)) = known.checkpoint else {
        return Ok(Target { model: base, adapter: None, name: model.to_string() });
    };
    // On a node sharing a blob store, the first request for a checkpoint downloads it.
    let path = state.checkpoints().local_dir(&relative).await?.ok_or_else(|| not_found(model, state))?;
    Ok(Target {
        model: base,
        adapter: Some(AdapterRef {
            checkpoint_id: checkpoint_id.to_string(),
            name: model.to_string(),
            owner: entity.to_string(),
            path,
            confined_to: None,
        }),
        name: model.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_known_names_are_the_entitys_own() {
        let last = LastKnown::default();
        let known = Known { base_model: "base".into(), checkpoint: None };
        last.remember("a\0p\0m\0-1".into(), known.clone());
        last.remember("a\0p\0m\x003".into(), known.clone());
        last.remember("b\0p\0secret\0-1".into(), known);
        let names: Vec<String> = last.names_of("a").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["wandb-artifact:///a/p/m", "wandb-artifact:///a/p/m:step3"]);
        assert_eq!(last.names_of("c"), []);
    }

    #[test]
    fn last_known_remembers_forgets_and_stays_bounded() {
        let last = LastKnown::default();
        let known = |step: u128| Known {
            base_model: "base".into(),
            checkpoint: Some((Uuid::from_u128(step), format!("m/{step}"))),
        };
        last.remember("a\0p\0m\0-1".into(), known(1));
        last.remember("a\0p\0m\0-1".into(), known(2));
        assert_eq!(last.get("a\0p\0m\0-1"), Some(known(2)), "the newest resolution wins");
        assert_eq!(last.get("b\0p\0m\0-1"), None, "another entity's name is another key");
        last.forget("a\0p\0m\0-1");
        assert_eq!(last.get("a\0p\0m\0-1"), None);
        for i in 0..LAST_KNOWN_MAX as u128 + 10 {
            last.remember(format!("a\0p\0m{i}\0-1"), known(i));
        }
        assert_eq!(last.0.lock().unwrap().len(), LAST_KNOWN_MAX);
    }

    #[test]
    fn a_store_that_just_failed_is_skipped_then_probed_by_one_lookup() {
        let last = LastKnown::default();
        assert!(last.ask_store());
        last.store_answered(false);
        assert!(!last.ask_store(), "skipped right after a failure");
        std::thread::sleep(STORE_RECHECK + std::time::Duration::from_millis(50));
        assert!(last.ask_store(), "one lookup probes after the recheck interval");
        assert!(!last.ask_store(), "while it probes, the others use the fallback");
        last.store_answered(true);
        assert!(last.ask_store() && last.ask_store(), "back: every lookup asks the store");
    }
}
