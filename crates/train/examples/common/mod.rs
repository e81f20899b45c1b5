//! What the trainer examples share: settings from the environment, a tokenizer for jobs that
//! come as token ids, a sink that keeps each step's metrics, and synthetic RL groups and jobs.
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use tandem_core::chat::ChatMessage;
use tandem_core::inference::InputError;
use tandem_core::sequences::{ChatTokenizer, RlInputs, Sequence, TokenizedGroup, TokenizedGroups, TokenizedTrajectory};
use tandem_core::train_config::TrainConfig;
use tandem_jobs::{ReferencePolicy, TrainError, TrainJob, TrainSink, TrainTask};

pub fn env(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Everything comes as token ids: nothing is rendered.
pub struct Ids;
impl ChatTokenizer for Ids {
    fn render(&self, _: &[ChatMessage], _: Option<&Value>, _: bool) -> Result<Vec<u32>, InputError> {
        Err(InputError::Template("token ids only".into()))
    }
    fn tokenize(&self, _: &str) -> Result<Vec<u32>, InputError> {
        Err(InputError::Template("token ids only".into()))
    }
    fn token_id(&self, _: &[u8]) -> Option<u32> {
        None
    }
}

/// Each gradient step's metrics.
#[derive(Default)]
pub struct Steps(pub Vec<BTreeMap<String, f64>>);
impl TrainSink for Steps {
    fn started(&mut self, _: u64, _: Map<String, Value>) {}
    fn gradient_step(&mut self, m: BTreeMap<String, f64>) {
        self.0.push(m);
    }
    fn should_stop(&mut self) -> Option<TrainError> {
        None
    }
}

/// `count` groups of `group` rollouts: a `prompt`-token prompt of its own per group, then each
/// rollout's `completion` sampled tokens (logprob -2, trained) and reward k / group.
pub fn groups(count: usize, group: usize, prompt: usize, completion: usize) -> Vec<TokenizedGroup> {
    let ids = |n: usize, salt: usize| (0..n).map(move |i| (100 + (i * 7 + salt * 131) % 20000) as u32);
    (0..count)
        .map(|g| TokenizedGroup {
            trajectories: (0..group)
                .map(|k| {
                    let tokens: Vec<u32> = ids(prompt, g).chain(ids(completion, 1000 + g * group + k)).collect();
                    let trained: Vec<bool> = (0..tokens.len()).map(|i| i >= prompt).collect();
                    let old_lp = trained.iter().map(|t| if *t { -2.0 } else { f64::NAN }).collect();
                    TokenizedTrajectory {
                        reward: k as f64 / group as f64,
                        sequences: vec![Sequence { tokens, trained, old_lp }],
                    }
                })
                .collect(),
        })
        .collect()
}

/// An RL job of the bench entity's model on base "base" over `groups`.
pub fn rl_job(groups: Vec<TokenizedGroup>, config: TrainConfig, kl_reference: Option<ReferencePolicy>) -> TrainJob {
    TrainJob {
        job_id: uuid::Uuid::now_v7(),
        model: tandem_core::records::ModelRecord {
            id: uuid::Uuid::nil(),
            entity: "bench".into(),
            project: "bench".into(),
            name: "rl-job".into(),
            base_model: "base".into(),
            run_id: "r".into(),
            created_at: 0,
        },
        base_step: 0,
        base_checkpoint: None,
        task: TrainTask::Rl {
            config,
            inputs: RlInputs::Tokenized(TokenizedGroups { format: 2, groups }),
            kl_reference,
        },
    }
}
