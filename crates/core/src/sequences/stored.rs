//! A training job's RL inputs as the store keeps them: every trajectory tokenized once, when the
//! job is created, so the trainer never renders or tokenizes again (and trains on exactly what
//! was checked).
//!
//! Jobs created before this format stored the raw `trajectory_groups` list; the trainer still
//! tokenizes those itself ([`RlInputs::Raw`]), so a job queued by an older server finishes.

use super::{fits_model, tokenize_trajectory, ChatTokenizer, Sequence, TrainedModel};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The version written in [`TokenizedGroups::format`]. Version 1 was the raw list.
pub const TOKENIZED_FORMAT: u32 = 2;

/// Every group of a job, tokenized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizedGroups {
    pub format: u32,
    pub groups: Vec<TokenizedGroup>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizedGroup {
    pub trajectories: Vec<TokenizedTrajectory>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizedTrajectory {
    pub reward: f64,
    pub sequences: Vec<Sequence>,
}

/// A sequence as stored: the trained tokens as runs, and their logprobs alone (JSON has no NaN:
/// an unknown logprob is null).
#[derive(Serialize, Deserialize)]
pub(super) struct StoredSequence {
    tokens: Vec<u32>,
    /// Half-open `[start, end)` runs of trained tokens, in order.
    trained: Vec<[u32; 2]>,
    /// The behaviour logprob of each trained token, in order.
    old_lp: Vec<Option<f64>>,
}

impl From<Sequence> for StoredSequence {
    fn from(s: Sequence) -> Self {
        let mut runs: Vec<[u32; 2]> = Vec::new();
        let mut old_lp = Vec::new();
        for (i, trained) in s.trained.iter().enumerate() {
            if !trained {
                continue;
            }
            let i = i as u32;
            match runs.last_mut() {
                Some(run) if run[1] == i => run[1] = i + 1,
                _ => runs.push([i, i + 1]),
            }
            old_lp.push(Some(s.old_lp[i as usize]).filter(|l| l.is_finite()));
        }
        StoredSequence { tokens: s.tokens, trained: runs, old_lp }
    }
}

impl TryFrom<StoredSequence> for Sequence {
    type Error = String;

    fn try_from(s: StoredSequence) -> Result<Self, String> {
        let n = s.tokens.len();
        let mut trained = vec![false; n];
        let mut old_lp = vec![f64::NAN; n];
        let mut lps = s.old_lp.into_iter();
        let mut end = 0usize;
        for [a, b] in s.trained {
            let (a, b) = (a as usize, b as usize);
            if a < end || a >= b || b > n {
                return Err(format!("stored sequence: trained run [{a}, {b}) is out of order or outside {n} tokens"));
            }
            for i in a..b {
                trained[i] = true;
                old_lp[i] =
                    lps.next().ok_or("stored sequence: fewer logprobs than trained tokens")?.unwrap_or(f64::NAN);
            }
            end = b;
        }
        if lps.next().is_some() {
            return Err("stored sequence: more logprobs than trained tokens".into());
        }
        Ok(Sequence { tokens: s.tokens, trained, old_lp })
    }
}

/// What one trajectory could not be trained on, and where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeError {
    pub group: usize,
    pub trajectory: usize,
    /// Names the trajectory (`trajectory_groups[g].trajectories[t]...`) and says why.
    pub message: String,
}

/// The limits the trainer indexes by: token ids below `vocab`, sequences within `context`.
#[derive(Debug, Clone, Copy)]
pub struct ModelBounds {
    pub vocab: usize,
    pub context: usize,
}

/// Tokenizes every trajectory of `groups` (already validated by `trajectory::validate_groups`)
/// as the trainer trains on it, checking each against the model's bounds. Every trajectory is
/// tried, so all errors are reported at once.
pub fn tokenize_groups(
    groups: &Value,
    tok: &dyn ChatTokenizer,
    model: &TrainedModel,
    allow_without_logprobs: bool,
    bounds: ModelBounds,
) -> Result<TokenizedGroups, Vec<TokenizeError>> {
    let empty = Vec::new();
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (g, group) in groups.as_array().unwrap_or(&empty).iter().enumerate() {
        let trajs = group.get("trajectories").and_then(Value::as_array).unwrap_or(&empty);
        let mut trajectories = Vec::with_capacity(trajs.len());
        for (t, traj) in trajs.iter().enumerate() {
            let at = format!("trajectory_groups[{g}].trajectories[{t}]");
            let checked = tokenize_trajectory(traj, tok, model, allow_without_logprobs, &at)
                .and_then(|seqs| fits_model(&seqs, bounds.vocab, bounds.context, &at).map(|()| seqs));
            match checked {
                Ok(sequences) => {
                    let reward = traj.get("reward").and_then(Value::as_f64).unwrap_or(0.0);
                    trajectories.push(TokenizedTrajectory { reward, sequences });
                }
                Err(message) => errors.push(TokenizeError { group: g, trajectory: t, message }),
            }
        }
        out.push(TokenizedGroup { trajectories });
    }
    if errors.is_empty() {
        Ok(TokenizedGroups { format: TOKENIZED_FORMAT, groups: out })
    } else {
        Err(errors)
    }
}

/// A job's stored RL inputs.
#[derive(Debug, Clone, PartialEq)]
pub enum RlInputs {
    /// Tokenized at job creation (format 2).
    Tokenized(TokenizedGroups),
    /// The raw `trajectory_groups` list: a job stored before format 2, or created while no
    /// served model could tokenize it. The trainer tokenizes it.
    Raw(Value),
}

impl RlInputs {
    /// Reads the stored value: a list is raw groups, an object a tokenized format.
    pub fn from_stored(v: Value) -> Result<Self, String> {
        match v {
            Value::Array(_) => Ok(RlInputs::Raw(v)),
            Value::Object(ref o) => match o.get("format").and_then(Value::as_u64) {
                Some(f) if f == u64::from(TOKENIZED_FORMAT) => serde_json::from_value(v)
                    .map(RlInputs::Tokenized)
                    .map_err(|e| format!("stored trajectories are unreadable: {e}")),
                other => Err(format!("stored trajectories have an unknown format {other:?}")),
            },
            _ => Err("stored trajectories are neither a list nor a tokenized format".into()),
        }
    }

    pub fn to_stored(&self) -> Value {
        match self {
            RlInputs::Raw(v) => v.clone(),
            // Serialising plain numbers and strings cannot fail.
            RlInputs::Tokenized(t) => serde_json::to_value(t).unwrap_or(Value::Null),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn seq(tokens: &[u32], trained: &[bool], lps: &[f64]) -> Sequence {
        Sequence { tokens: tokens.to_vec(), trained: trained.to_vec(), old_lp: lps.to_vec() }
    }

    #[test]
    fn a_sequence_is_stored_as_runs_and_read_back_equal() {
        let nan = f64::NAN;
        let s = seq(&[5, 6, 7, 8, 9, 10], &[false, true, true, false, true, true], &[nan, -0.5, nan, nan, -1.0, -2.0]);
        let v = serde_json::to_value(&s).unwrap();
        // Context tokens carry no logprob; an unknown one of a trained token is null.
        assert_eq!(
            v,
            json!({"tokens": [5, 6, 7, 8, 9, 10], "trained": [[1, 3], [4, 6]], "old_lp": [-0.5, null, -1.0, -2.0]})
        );
        let back: Sequence = serde_json::from_value(v).unwrap();
        assert_eq!((back.tokens, back.trained), (s.tokens, s.trained));
        assert!(back.old_lp[0].is_nan() && back.old_lp[2].is_nan() && back.old_lp[3].is_nan());
        assert_eq!((back.old_lp[1], back.old_lp[4], back.old_lp[5]), (-0.5, -1.0, -2.0));
    }

    #[test]
    fn a_stored_sequence_that_does_not_add_up_is_refused() {
        for bad in [
            json!({"tokens": [1, 2], "trained": [[1, 3]], "old_lp": [0.0, 0.0]}),
            json!({"tokens": [1, 2, 3], "trained": [[1, 2], [0, 1]], "old_lp": [0.0, 0.0]}),
            json!({"tokens": [1, 2], "trained": [[1, 1]], "old_lp": []}),
            json!({"tokens": [1, 2], "trained": [[1, 2]], "old_lp": []}),
            json!({"tokens": [1, 2], "trained": [[1, 2]], "old_lp": [0.0, 0.0]}),
        ] {
            assert!(serde_json::from_value::<Sequence>(bad.clone()).is_err(), "{bad}");
        }
    }

    /// Text tokenizes to its bytes; a message renders as its content's bytes.
    struct Bytes;
    impl ChatTokenizer for Bytes {
        fn render(
            &self,
            messages: &[crate::chat::ChatMessage],
            _tools: Option<&Value>,
            _gen: bool,
        ) -> Result<Vec<u32>, crate::inference::InputError> {
            Ok(messages.iter().flat_map(|m| m.text().into_bytes()).map(u32::from).collect())
        }
        fn tokenize(&self, text: &str) -> Result<Vec<u32>, crate::inference::InputError> {
            Ok(text.bytes().map(u32::from).collect())
        }
        fn token_id(&self, _bytes: &[u8]) -> Option<u32> {
            None
        }
    }

    fn traj(reward: Option<f64>, prompt: &[u32], ids: &[u32]) -> Value {
        let lps: Vec<Value> = ids.iter().map(|i| json!({"token": format!("token_id:{i}"), "logprob": -0.25})).collect();
        let mut t = json!({"messages_and_choices": [{"role": "user", "content": "q"},
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "a"},
             "prompt_token_ids": prompt, "token_ids": ids, "logprobs": {"content": lps}}]});
        if let Some(r) = reward {
            t["reward"] = json!(r);
        }
        t
    }

    const MODEL: TrainedModel = TrainedModel { entity: "e", project: "p", name: "m" };
    const BOUNDS: ModelBounds = ModelBounds { vocab: 100, context: 4 };

    #[test]
    fn groups_tokenize_with_their_rewards_and_survive_the_store() {
        let groups = json!([{"trajectories": [traj(Some(1.5), &[1, 2], &[3]), traj(None, &[1], &[4, 5])]}, {"trajectories": []}]);
        let t = tokenize_groups(&groups, &Bytes, &MODEL, false, BOUNDS).unwrap();
        assert_eq!(t.format, TOKENIZED_FORMAT);
        assert_eq!(t.groups.len(), 2);
        let g = &t.groups[0].trajectories;
        // ART's default reward is 0.0.
        assert_eq!((g[0].reward, g[1].reward), (1.5, 0.0));
        assert_eq!(g[0].sequences[0].tokens, vec![1, 2, 3]);
        assert_eq!(g[1].sequences[0].old_lp[1..], [-0.25, -0.25]);
        // Context tokens have NaN logprobs (never equal): compare what the store holds.
        let stored = RlInputs::Tokenized(t).to_stored();
        let RlInputs::Tokenized(back) = RlInputs::from_stored(stored.clone()).unwrap() else { panic!("not tokenized") };
        assert_eq!(back.groups[0].trajectories[0].sequences[0].trained, vec![false, false, true]);
        assert_eq!(RlInputs::Tokenized(back).to_stored(), stored);
    }

    #[test]
    fn every_untrainable_trajectory_is_named() {
        // Token 500 is out of the vocabulary; five tokens exceed the context of four.
        let groups = json!([{"trajectories": [traj(None, &[1], &[500]), traj(None, &[1], &[2])]},
                            {"trajectories": [traj(None, &[1, 2, 3], &[4, 5])]}]);
        let e = tokenize_groups(&groups, &Bytes, &MODEL, false, BOUNDS).unwrap_err();
        assert_eq!(e.iter().map(|e| (e.group, e.trajectory)).collect::<Vec<_>>(), vec![(0, 0), (1, 0)]);
        assert!(e[0].message.starts_with("trajectory_groups[0].trajectories[0]: token id 500"), "{}", e[0].message);
        assert!(e[1].message.contains("longer than the model's context of 4"), "{}", e[1].message);
    }

    #[test]
    fn stored_inputs_of_older_jobs_still_read() {
        let raw = json!([{"trajectories": []}]);
        assert_eq!(RlInputs::from_stored(raw.clone()).unwrap(), RlInputs::Raw(raw));
        assert!(RlInputs::from_stored(json!({"format": 3, "groups": []})).unwrap_err().contains("unknown format"));
        assert!(RlInputs::from_stored(json!({"format": 2})).unwrap_err().contains("unreadable"));
        assert!(RlInputs::from_stored(json!("x")).is_err());
    }
}
