//! `experimental_config` of a training job, parsed once into a typed, fully defaulted config.
//!
//! ART sends every key it knows, with `null` for unset ones, and adds keys with each release, so:
//! `null` or absent means the default, unknown keys are ignored, and known keys are range-checked.
//! Defaults follow ART's RL trainer (contract §3); `kimi_k2_tau` is accepted for `variant_k2_tau`.

use crate::validate::{optional, Validator};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How the probability ratio of a token is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportanceSamplingLevel {
    Token,
    Sequence,
    Average,
    GeometricAverage,
}

/// The policy loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// PPO-clip: gradient through the ratio.
    Ppo,
    /// CISPO: clipped, detached ratio times advantage times the new log-probability.
    Cispo,
}

/// Whose log-probabilities the KL penalty compares with the reference policy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlSource {
    /// The sampler's logprobs of each token (the learner's where the sampler's are unknown).
    Sample,
    /// The learner's own logprobs at this step, detached.
    CurrentLearner,
}

/// The reference policy of a KL penalty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlReference {
    /// A checkpoint step of the model being trained; 0 is the base model.
    Step(i64),
    /// The step the job trains from, minus this many (at least 0), resolved when the job starts.
    Lag(i64),
    /// `kl_ref_adapter_path` as sent; the api resolves it to one of the model's own checkpoints
    /// (a `Step`) before the job is stored, or refuses it.
    AdapterPath(String),
}

/// ART's KL penalty (0.5.23): per trained token `kl_t = src_t - ref_t` (detached) and
/// `A_t <- A_t + coef * (mean(kl) - kl_t)`, the mean over the packed row's trained tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KlPenalty {
    pub coef: f64,
    pub source: KlSource,
    pub reference: KlReference,
}

/// The typed training configuration with every default resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub learning_rate: f64,
    pub loss: LossKind,
    pub epsilon: f64,
    pub epsilon_high: f64,
    pub importance_sampling_level: ImportanceSamplingLevel,
    pub advantage_balance: f64,
    pub variant_k2_tau: Option<f64>,
    pub mask_prob_ratio: bool,
    pub max_negative_advantage_importance_sampling_weight: Option<f64>,
    pub precalculate_logprobs: bool,
    pub scale_rewards: bool,
    pub allow_training_without_logprobs: bool,
    pub truncated_importance_sampling: Option<f64>,
    pub num_trajectories_learning_rate_multiplier_power: f64,
    pub packed_sequence_length: Option<u32>,
    /// `kl_penalty_coef > 0`: the penalty and its reference policy. Absent in configs stored
    /// before it existed.
    #[serde(default)]
    pub kl_penalty: Option<KlPenalty>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            learning_rate: 5e-6,
            loss: LossKind::Cispo,
            epsilon: 1.0,
            epsilon_high: 4.0,
            importance_sampling_level: ImportanceSamplingLevel::Token,
            advantage_balance: 0.0,
            variant_k2_tau: None,
            mask_prob_ratio: false,
            max_negative_advantage_importance_sampling_weight: None,
            precalculate_logprobs: false,
            scale_rewards: true,
            allow_training_without_logprobs: false,
            truncated_importance_sampling: None,
            num_trajectories_learning_rate_multiplier_power: 0.0,
            packed_sequence_length: None,
            kl_penalty: None,
        }
    }
}

const LEVELS: [&str; 4] = ["token", "sequence", "average", "geometric_average"];

/// Parses `experimental_config` (the caller has stepped into its location). `None` on error.
pub fn parse_train_config(v: &mut Validator, value: Option<&Value>) -> Option<TrainConfig> {
    let empty = Map::new();
    let obj = match value.filter(|x| !x.is_null()) {
        Some(x) => v.object(x)?,
        None => &empty,
    };
    let errors_before = v.error_count();
    let mut c = TrainConfig::default();

    let flag =
        |v: &mut Validator, key: &str| -> Option<bool> { optional(obj, key).and_then(|x| v.at(key, |v| v.boolean(x))) };
    let ranged = |v: &mut Validator, key: &str, lo: f64, hi: Option<f64>| -> Option<f64> {
        let x = optional(obj, key)?;
        v.at(key, |v| {
            let n = v.number(x)?;
            v.range_f64(x, n, Some(lo), hi).then_some(n)
        })
    };

    if let Some(x) = optional(obj, "learning_rate") {
        if let Some(lr) = v.at("learning_rate", |v| v.number(x).filter(|n| v.greater_than(x, *n, 0.0))) {
            let ok = v.at("learning_rate", |v| v.range_f64(x, lr, None, Some(1.0)));
            if ok {
                c.learning_rate = lr;
            }
        }
    }

    // `ppo` decides the loss; 0.5.23 also sends `loss_fn`, which is used only when `ppo` is null.
    let ppo = flag(v, "ppo");
    let loss_fn = optional(obj, "loss_fn").and_then(|x| v.at("loss_fn", |v| v.literal(x, &["cispo", "ppo"])));
    c.loss = match (ppo, loss_fn) {
        (Some(true), _) | (None, Some("ppo")) => LossKind::Ppo,
        _ => LossKind::Cispo,
    };
    let (eps_default, eps_high_default) = match c.loss {
        LossKind::Ppo => (0.2, None),
        LossKind::Cispo => (1.0, Some(4.0)),
    };
    c.epsilon = ranged(v, "epsilon", 0.0, None).unwrap_or(eps_default);
    // An unset epsilon_high falls back to epsilon under PPO, to 4.0 under CISPO (ART's defaults).
    c.epsilon_high = ranged(v, "epsilon_high", 0.0, None)
        .or(eps_high_default.filter(|_| optional(obj, "epsilon").is_none()))
        .unwrap_or(c.epsilon);

    if let Some(x) = optional(obj, "importance_sampling_level") {
        if let Some(level) = v.at("importance_sampling_level", |v| v.literal(x, &LEVELS)) {
            c.importance_sampling_level = match level {
                "token" => ImportanceSamplingLevel::Token,
                "sequence" => ImportanceSamplingLevel::Sequence,
                "average" => ImportanceSamplingLevel::Average,
                _ => ImportanceSamplingLevel::GeometricAverage,
            };
        }
    }
    c.advantage_balance = ranged(v, "advantage_balance", -1.0, Some(1.0)).unwrap_or(0.0);
    c.variant_k2_tau = ranged(v, "variant_k2_tau", 0.0, None).or_else(|| ranged(v, "kimi_k2_tau", 0.0, None));
    c.mask_prob_ratio = flag(v, "mask_prob_ratio").unwrap_or(false);
    // 0 means "not set", as in ART ("if set and non-zero").
    c.max_negative_advantage_importance_sampling_weight =
        ranged(v, "max_negative_advantage_importance_sampling_weight", 0.0, None).filter(|m| *m > 0.0);
    c.precalculate_logprobs = flag(v, "precalculate_logprobs").unwrap_or(false);
    c.scale_rewards = flag(v, "scale_rewards").unwrap_or(true);
    c.allow_training_without_logprobs = flag(v, "allow_training_without_logprobs").unwrap_or(false);
    if let Some(x) = optional(obj, "truncated_importance_sampling") {
        c.truncated_importance_sampling =
            v.at("truncated_importance_sampling", |v| v.number(x).filter(|n| v.greater_than(x, *n, 0.0)));
    }
    // The learning rate is multiplied by (trajectories in the row)^power: bounded so that it stays
    // finite and within a few orders of magnitude of `learning_rate` (ART uses 0 or about +-0.5).
    c.num_trajectories_learning_rate_multiplier_power = ranged(
        v,
        "num_trajectories_learning_rate_multiplier_power",
        -MAX_LR_MULTIPLIER_POWER,
        Some(MAX_LR_MULTIPLIER_POWER),
    )
    .unwrap_or(0.0);
    if let Some(x) = optional(obj, "packed_sequence_length") {
        c.packed_sequence_length = v.at("packed_sequence_length", |v| {
            let n = v.integer(x)?;
            v.range_i64(x, n, 1, 1 << 20).then_some(n as u32)
        });
    }
    c.kl_penalty = kl_penalty(v, obj);
    (v.error_count() == errors_before).then_some(c)
}

/// The KL penalty's fields: `kl_penalty_coef` (0 or absent: off), `kl_penalty_source`,
/// `kl_penalty_reference_step`, `kl_penalty_step_lag`, `kl_ref_adapter_path`. The reference is,
/// in ART's order of precedence, the adapter path, the reference step, the step lag, else the
/// base model (step 0).
fn kl_penalty(v: &mut Validator, obj: &Map<String, Value>) -> Option<KlPenalty> {
    let coef = optional(obj, "kl_penalty_coef").and_then(|x| {
        v.at("kl_penalty_coef", |v| {
            let n = v.number(x)?;
            v.range_f64(x, n, Some(0.0), Some(MAX_KL_COEF)).then_some(n)
        })
    });
    let source = optional(obj, "kl_penalty_source")
        .and_then(|x| v.at("kl_penalty_source", |v| v.literal(x, &["sample", "current_learner"])))
        .map(|s| if s == "sample" { KlSource::Sample } else { KlSource::CurrentLearner });
    let step = optional(obj, "kl_penalty_reference_step").and_then(|x| {
        v.at("kl_penalty_reference_step", |v| {
            let n = v.integer(x)?;
            v.range_i64(x, n, 0, i64::MAX).then_some(n)
        })
    });
    let lag = optional(obj, "kl_penalty_step_lag").and_then(|x| {
        v.at("kl_penalty_step_lag", |v| {
            let n = v.integer(x)?;
            v.range_i64(x, n, 1, i64::MAX).then_some(n)
        })
    });
    if let (Some(_), Some(x)) = (step, optional(obj, "kl_penalty_step_lag")) {
        v.at("kl_penalty_step_lag", |v| {
            v.value_error(x, "only one of kl_penalty_reference_step and kl_penalty_step_lag may be set")
        });
    }
    let path = optional(obj, "kl_ref_adapter_path")
        .and_then(|x| v.at("kl_ref_adapter_path", |v| v.string_len(x, 1, 4096).map(str::to_string)));
    let coef = coef.filter(|c| *c > 0.0)?;
    let reference = match (path, step, lag) {
        (Some(p), _, _) => KlReference::AdapterPath(p),
        (None, Some(s), _) => KlReference::Step(s),
        (None, None, Some(l)) => KlReference::Lag(l),
        (None, None, None) => KlReference::Step(0),
    };
    // ART's ServerlessBackend sends "sample" when a coefficient is set and no source is given.
    Some(KlPenalty { coef, source: source.unwrap_or(KlSource::Sample), reference })
}

/// Largest accepted |num_trajectories_learning_rate_multiplier_power|.
pub const MAX_LR_MULTIPLIER_POWER: f64 = 1.0;

/// Largest accepted `kl_penalty_coef`: keeps every shaped advantage finite.
const MAX_KL_COEF: f64 = 1e3;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<TrainConfig, Value> {
        let mut v = Validator::new("body");
        let c = v.at("experimental_config", |v| parse_train_config(v, Some(&value)));
        let e = v.into_errors();
        match c {
            Some(c) if e.is_empty() => Ok(c),
            _ => Err(serde_json::to_value(e).unwrap()),
        }
    }

    #[test]
    fn art_0_5_23_default_body_gives_the_defaults() {
        let body = json!({
            "advantage_balance": 0.0, "allow_training_without_logprobs": false, "epsilon": null,
            "epsilon_high": null, "importance_sampling_level": "token", "kimi_k2_tau": null,
            "kl_penalty_coef": 0.0, "kl_penalty_reference_step": null,
            "kl_penalty_source": "current_learner", "kl_penalty_step_lag": null,
            "kl_ref_adapter_path": null, "learning_rate": 5e-6,
            "logprob_calculation_chunk_size": 1024, "loss_fn": "cispo", "mask_prob_ratio": false,
            "max_negative_advantage_importance_sampling_weight": null, "normalize_advantages": true,
            "num_trajectories_learning_rate_multiplier_power": 0.0, "packed_sequence_length": null,
            "plot_tensors": false, "ppo": false, "precalculate_logprobs": false,
            "scale_learning_rate_by_reward_std_dev": false, "scale_rewards": true,
            "truncated_importance_sampling": null
        });
        assert_eq!(parse(body).unwrap(), TrainConfig::default());
        assert_eq!(parse(json!({})).unwrap(), TrainConfig::default());
    }

    #[test]
    fn epsilon_defaults_follow_the_loss() {
        let ppo = parse(json!({"ppo": true})).unwrap();
        assert_eq!((ppo.loss, ppo.epsilon, ppo.epsilon_high), (LossKind::Ppo, 0.2, 0.2));
        let ppo = parse(json!({"ppo": null, "loss_fn": "ppo", "epsilon": 0.3})).unwrap();
        assert_eq!((ppo.loss, ppo.epsilon, ppo.epsilon_high), (LossKind::Ppo, 0.3, 0.3));
        let cispo = parse(json!({"epsilon": 0.5})).unwrap();
        assert_eq!((cispo.epsilon, cispo.epsilon_high), (0.5, 0.5));
        let cispo = parse(json!({"epsilon_high": 2.0})).unwrap();
        assert_eq!((cispo.epsilon, cispo.epsilon_high), (1.0, 2.0));
    }

    #[test]
    fn aliases_and_typed_fields() {
        let c = parse(json!({"kimi_k2_tau": 0.1, "importance_sampling_level": "geometric_average",
                             "max_negative_advantage_importance_sampling_weight": 0,
                             "packed_sequence_length": 4096, "unknown": [1]}))
        .unwrap();
        assert_eq!(c.variant_k2_tau, Some(0.1));
        assert_eq!(c.importance_sampling_level, ImportanceSamplingLevel::GeometricAverage);
        assert_eq!(c.max_negative_advantage_importance_sampling_weight, None);
        assert_eq!(c.packed_sequence_length, Some(4096));
        let c = parse(json!({"variant_k2_tau": 0.2, "kimi_k2_tau": 0.1})).unwrap();
        assert_eq!(c.variant_k2_tau, Some(0.2));
    }

    #[test]
    fn out_of_range_values_are_named() {
        let e = parse(json!({"advantage_balance": 2, "learning_rate": -1, "importance_sampling_level": "x",
                             "kl_penalty_coef": -0.5, "ppo": "yes",
                             "num_trajectories_learning_rate_multiplier_power": 2000}))
        .unwrap_err();
        let locs: Vec<Value> = e.as_array().unwrap().iter().map(|x| x["loc"].clone()).collect();
        assert!(locs.contains(&json!(["body", "experimental_config", "advantage_balance"])));
        assert!(locs.contains(&json!(["body", "experimental_config", "learning_rate"])));
        assert!(locs.contains(&json!(["body", "experimental_config", "importance_sampling_level"])));
        assert!(locs.contains(&json!(["body", "experimental_config", "kl_penalty_coef"])));
        assert!(locs.contains(&json!(["body", "experimental_config", "ppo"])));
        // 2000 made the learning rate infinite (the job "succeeded" and bricked the model).
        assert!(locs.contains(&json!([
            "body",
            "experimental_config",
            "num_trajectories_learning_rate_multiplier_power"
        ])));
        assert_eq!(locs.len(), 6);
    }

    #[test]
    fn kl_penalty_reference_by_precedence() {
        let kl = |body: Value| parse(body).unwrap().kl_penalty;
        assert_eq!(kl(json!({"kl_penalty_coef": 0.0, "kl_penalty_reference_step": 3})), None);
        let k = kl(json!({"kl_penalty_coef": 0.1})).unwrap();
        assert_eq!((k.coef, k.source, k.reference), (0.1, KlSource::Sample, KlReference::Step(0)));
        let k = kl(json!({"kl_penalty_coef": 0.1, "kl_penalty_source": "current_learner",
                          "kl_penalty_step_lag": 2}))
        .unwrap();
        assert_eq!((k.source, k.reference), (KlSource::CurrentLearner, KlReference::Lag(2)));
        let k = kl(json!({"kl_penalty_coef": 0.1, "kl_penalty_reference_step": 4,
                          "kl_ref_adapter_path": "wandb-artifact:///e/p/m:step2"}))
        .unwrap();
        assert_eq!(k.reference, KlReference::AdapterPath("wandb-artifact:///e/p/m:step2".into()));
    }

    #[test]
    fn kl_penalty_fields_are_checked() {
        let e = parse(json!({"kl_penalty_coef": 0.1, "kl_penalty_reference_step": 1, "kl_penalty_step_lag": 1,
                             "kl_penalty_source": "teacher"}))
        .unwrap_err();
        let locs: Vec<Value> = e.as_array().unwrap().iter().map(|x| x["loc"][2].clone()).collect();
        assert_eq!(locs, vec![json!("kl_penalty_source"), json!("kl_penalty_step_lag")]);
        assert!(parse(json!({"kl_penalty_coef": 0.1, "kl_penalty_step_lag": 0})).is_err());
        assert!(parse(json!({"kl_penalty_coef": 1e9})).is_err());
        assert!(parse(json!({"kl_penalty_coef": 0.1, "kl_penalty_reference_step": -1})).is_err());
    }

    #[test]
    fn configs_stored_before_the_kl_penalty_still_read() {
        let mut stored = serde_json::to_value(TrainConfig::default()).unwrap();
        stored.as_object_mut().unwrap().remove("kl_penalty");
        let c: TrainConfig = serde_json::from_value(stored).unwrap();
        assert_eq!(c, TrainConfig::default());
    }

    #[test]
    fn not_an_object_is_an_error_and_null_is_default() {
        assert!(parse(json!([1])).is_err());
        let mut v = Validator::new("body");
        assert_eq!(parse_train_config(&mut v, Some(&Value::Null)), Some(TrainConfig::default()));
    }
}
