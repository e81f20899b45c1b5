//! Trajectory groups as ART sends them: validation and the typed summary used for metrics.
//!
//! The raw JSON of every group is kept untouched (it is stored and returned byte-for-byte in
//! content), while validation extracts only what the server computes with: rewards, numeric
//! metrics and exception counts. Every field is optional with ART's own default (`reward` 0.0,
//! `messages_and_choices` [], `metrics` {}, ...): ART 0.5.23 serialises compactly and omits each
//! field equal to its default. Present fields are type-checked, numbers must be finite, and
//! unknown keys pass.

use crate::validate::{optional, Validator};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Count limits on one request, so a single body cannot ask for unbounded work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrajectoryLimits {
    pub max_groups: usize,
    pub max_trajectories_per_group: usize,
    pub max_trajectories: usize,
}

impl Default for TrajectoryLimits {
    fn default() -> Self {
        TrajectoryLimits { max_groups: 4096, max_trajectories_per_group: 1024, max_trajectories: 65536 }
    }
}

/// What the server needs to know about one trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct TrajectorySummary {
    pub reward: f64,
    /// Numeric metrics (bools as 0/1).
    pub metrics: BTreeMap<String, f64>,
}

/// What the server needs to know about one group.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GroupSummary {
    pub trajectories: Vec<TrajectorySummary>,
    pub metrics: BTreeMap<String, f64>,
    /// Rollouts that raised instead of producing a trajectory.
    pub exceptions: usize,
}

impl GroupSummary {
    /// ART's zero-variance rule: one trajectory or fewer, or every reward within 1e-12 of the others.
    pub fn has_reward_variance(&self) -> bool {
        let rewards = self.trajectories.iter().map(|t| t.reward);
        let (lo, hi) = rewards.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| (lo.min(r), hi.max(r)));
        self.trajectories.len() > 1 && hi - lo > 1e-12
    }
}

/// Validates `trajectory_groups` (the value at `body.trajectory_groups`; the caller has already
/// stepped into that location) and returns the summaries, or records errors on `v`.
pub fn validate_groups(v: &mut Validator, value: &Value, limits: &TrajectoryLimits) -> Option<Vec<GroupSummary>> {
    let groups = v.array_max(value, limits.max_groups)?;
    let total: usize =
        groups.iter().filter_map(|g| g.get("trajectories").and_then(Value::as_array).map(Vec::len)).sum();
    if total > limits.max_trajectories {
        let why = format!("at most {} trajectories are accepted in one request, got {total}", limits.max_trajectories);
        v.value_error(&Value::Null, &why);
        return None;
    }
    let errors_before = v.error_count();
    let mut out = Vec::with_capacity(groups.len());
    for (i, group) in groups.iter().enumerate() {
        if let Some(g) = v.at(i, |v| validate_group(v, group, limits)) {
            out.push(g);
        }
    }
    (v.error_count() == errors_before).then_some(out)
}

fn validate_group(v: &mut Validator, value: &Value, limits: &TrajectoryLimits) -> Option<GroupSummary> {
    let obj = v.object(value)?;
    let mut group = GroupSummary::default();
    if let Some(trajs) = optional(obj, "trajectories") {
        v.at("trajectories", |v| {
            if let Some(items) = v.array_max(trajs, limits.max_trajectories_per_group) {
                for (j, t) in items.iter().enumerate() {
                    if let Some(t) = v.at(j, |v| validate_trajectory(v, t)) {
                        group.trajectories.push(t);
                    }
                }
            }
        });
    }
    if let Some(m) = optional(obj, "metrics") {
        group.metrics = v.at("metrics", |v| numeric_metrics(v, m)).unwrap_or_default();
    }
    if let Some(e) = optional(obj, "exceptions") {
        group.exceptions = v.at("exceptions", |v| v.array(e).map(Vec::len)).unwrap_or(0);
    }
    check_optional(v, obj, "metadata", Kind::Dict);
    check_optional(v, obj, "logs", Kind::List);
    Some(group)
}

fn validate_trajectory(v: &mut Validator, value: &Value) -> Option<TrajectorySummary> {
    let obj = v.object(value)?;
    if let Some(mc) = optional(obj, "messages_and_choices") {
        v.at("messages_and_choices", |v| messages_and_choices(v, mc));
    }
    // An absent reward is ART's default, 0.0 (compact serialisation drops it).
    let reward = match optional(obj, "reward") {
        Some(r) => v.at("reward", |v| v.number(r)),
        None => Some(0.0),
    };
    let metrics = match optional(obj, "metrics") {
        Some(m) => v.at("metrics", |v| numeric_metrics(v, m)),
        None => Some(BTreeMap::new()),
    };
    if let Some(histories) = optional(obj, "additional_histories") {
        v.at("additional_histories", |v| {
            for (k, h) in v.array(histories).cloned().unwrap_or_default().iter().enumerate() {
                v.at(k, |v| history(v, h));
            }
        });
    }
    if let Some(x) = optional(obj, "exchanges") {
        v.at("exchanges", |v| exchanges(v, x));
    }
    check_optional(v, obj, "tools", Kind::List);
    check_optional(v, obj, "metadata", Kind::Dict);
    check_optional(v, obj, "logs", Kind::List);
    check_optional(v, obj, "start_time", Kind::Str);
    check_optional(v, obj, "initial_policy_version", Kind::Int);
    check_optional(v, obj, "final_policy_version", Kind::Int);
    Some(TrajectorySummary { reward: reward?, metrics: metrics? })
}

/// An additional history: `{messages_and_choices, tools?}`.
fn history(v: &mut Validator, value: &Value) {
    if let Some(obj) = v.object(value) {
        if let Some(mc) = v.required(obj, "messages_and_choices") {
            v.at("messages_and_choices", |v| messages_and_choices(v, mc));
        }
        check_optional(v, obj, "tools", Kind::List);
    }
}

/// `{chat_completions?, completions?, responses?, messages?}`, each a list of exchange objects
/// (`request`, `response`, times); their content is read when a job trains on them.
fn exchanges(v: &mut Validator, value: &Value) {
    if let Some(obj) = v.dict(value) {
        for kind in crate::sequences::EXCHANGE_KINDS {
            if let Some(list) = optional(obj, kind) {
                v.at(kind, |v| {
                    if let Some(items) = v.array(list) {
                        for (k, x) in items.iter().enumerate() {
                            v.at(k, |v| v.dict(x));
                        }
                    }
                });
            }
        }
    }
}

/// Each element is a message dict or a Choice dict; their inner shape is checked by the trainer.
fn messages_and_choices(v: &mut Validator, value: &Value) {
    if let Some(items) = v.array(value) {
        for (k, item) in items.iter().enumerate() {
            v.at(k, |v| v.dict(item));
        }
    }
}

/// `{str: number | bool}`; bools count as 0/1, as ART averages them.
fn numeric_metrics(v: &mut Validator, value: &Value) -> Option<BTreeMap<String, f64>> {
    let map: &Map<String, Value> = v.dict(value)?;
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (k, x) in map {
        let num = match x {
            Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
            _ => v.at(k.as_str(), |v| v.number(x)),
        };
        match num {
            Some(n) => {
                out.insert(k.clone(), n);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

enum Kind {
    Dict,
    List,
    Str,
    Int,
}

fn check_optional(v: &mut Validator, obj: &Map<String, Value>, key: &str, kind: Kind) {
    if let Some(x) = optional(obj, key) {
        v.at(key, |v| match kind {
            Kind::Dict => v.dict(x).is_some(),
            Kind::List => v.array(x).is_some(),
            Kind::Str => v.string(x).is_some(),
            Kind::Int => v.integer(x).is_some(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(value: Value) -> Result<Vec<GroupSummary>, Value> {
        let mut v = Validator::new("body");
        let out = v.at("trajectory_groups", |v| validate_groups(v, &value, &TrajectoryLimits::default()));
        let errors = v.into_errors();
        match out {
            Some(g) if errors.is_empty() => Ok(g),
            _ => Err(serde_json::to_value(errors).unwrap()),
        }
    }

    #[test]
    fn accepts_art_shaped_groups_and_reads_metrics() {
        let groups = json!([{
            "trajectories": [
                {"messages_and_choices": [{"role": "user", "content": "hi"}], "reward": 1,
                 "metrics": {"correct": true, "len": 3.5}, "nvext": {"x": 1}, "tools": null},
                {"messages_and_choices": [], "reward": 0.5, "metrics": {"correct": false}}
            ],
            "exceptions": [{"type": "ValueError"}],
            "metrics": {"difficulty": 2}
        }]);
        let g = run(groups).unwrap();
        assert_eq!(g[0].trajectories[0].reward, 1.0);
        assert_eq!(g[0].trajectories[0].metrics["correct"], 1.0);
        assert_eq!(g[0].trajectories[1].metrics["correct"], 0.0);
        assert_eq!(g[0].exceptions, 1);
        assert_eq!(g[0].metrics["difficulty"], 2.0);
        assert!(g[0].has_reward_variance());
    }

    #[test]
    fn errors_point_into_the_body() {
        let groups = json!([
            {"trajectories": [{"messages_and_choices": [], "reward": 1}]},
            {"trajectories": [
                {"messages_and_choices": [], "reward": 1},
                {"messages_and_choices": [], "reward": 1},
                {"messages_and_choices": "no", "reward": "high", "metrics": {"m": "x"}}
            ]},
            {"trajectories": [{"reward": 2, "exchanges": {"chat_completions": [{}, 3]}}]}
        ]);
        let e = run(groups).unwrap_err();
        let locs: Vec<&Value> = e.as_array().unwrap().iter().map(|x| &x["loc"]).collect();
        assert_eq!(
            locs,
            vec![
                &json!(["body", "trajectory_groups", 1, "trajectories", 2, "messages_and_choices"]),
                &json!(["body", "trajectory_groups", 1, "trajectories", 2, "reward"]),
                &json!(["body", "trajectory_groups", 1, "trajectories", 2, "metrics", "m"]),
                &json!(["body", "trajectory_groups", 2, "trajectories", 0, "exchanges", "chat_completions", 1]),
            ]
        );
        assert_eq!(e[1]["type"], "float_type");
        assert_eq!(e[3]["type"], "dict_type");
    }

    #[test]
    fn compact_groups_take_arts_defaults() {
        // ART 0.5.23 drops every field equal to its default: reward 0.0, empty lists and dicts.
        let g = run(json!([{}, {"trajectories": [{}, {"reward": 1.0}, {"metrics": {"x": true}}]}])).unwrap();
        assert!(g[0].trajectories.is_empty());
        let rewards: Vec<f64> = g[1].trajectories.iter().map(|t| t.reward).collect();
        assert_eq!(rewards, vec![0.0, 1.0, 0.0]);
        assert_eq!(g[1].trajectories[2].metrics["x"], 1.0);
        assert!(g[1].has_reward_variance());
    }

    #[test]
    fn non_finite_numbers_are_refused() {
        // JSON has no NaN, but a number too large for f64 must not become infinity.
        let body: Value =
            serde_json::from_str(r#"[{"trajectories": [{"reward": 1e308}, {"reward": -1e308}]}]"#).unwrap();
        assert!(run(body).is_ok());
        let huge = serde_json::from_str::<Value>(r#"[{"trajectories": [{"reward": 1e400}]}]"#);
        assert!(huge.is_err(), "serde_json refuses numbers out of f64's range");
    }

    #[test]
    fn count_limits_are_enforced() {
        let mut v = Validator::new("body");
        let limits = TrajectoryLimits { max_groups: 1, ..Default::default() };
        let groups = json!([{"trajectories": []}, {"trajectories": []}]);
        assert!(validate_groups(&mut v, &groups, &limits).is_none());
        let e = serde_json::to_value(v.into_errors()).unwrap();
        assert_eq!(e[0]["type"], "too_long");
    }

    #[test]
    fn zero_variance_rule() {
        let t = |r| TrajectorySummary { reward: r, metrics: BTreeMap::new() };
        let g = |rs: &[f64]| GroupSummary { trajectories: rs.iter().map(|r| t(*r)).collect(), ..Default::default() };
        assert!(!g(&[1.0]).has_reward_variance());
        assert!(!g(&[0.5, 0.5 + 1e-13]).has_reward_variance());
        assert!(g(&[0.0, 1.0]).has_reward_variance());
        assert!(!g(&[]).has_reward_variance());
    }
}
