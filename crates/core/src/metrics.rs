//! The metrics a trajectory log computes, exactly as ART's `Model.log` does (contract §3).

use crate::trajectory::GroupSummary;
use std::collections::BTreeMap;

/// Metrics of one logged batch, keyed `{split}/...`. Keys whose value is undefined for this batch
/// (the mean of nothing) are left out rather than written as NaN, because JSON has no NaN and
/// ART's client converts every value with `float()`.
pub fn log_metrics(split: &str, groups: &[GroupSummary]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let trajectories: Vec<_> = groups.iter().flat_map(|g| &g.trajectories).collect();
    let exceptions: usize = groups.iter().map(|g| g.exceptions).sum();

    // Trajectory metrics first, so that the reward below wins over a metric named "reward".
    let mut sums: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for t in &trajectories {
        for (k, x) in &t.metrics {
            let e = sums.entry(k).or_default();
            e.0 += x;
            e.1 += 1;
        }
    }
    for (k, (sum, n)) in sums {
        out.insert(format!("{split}/{k}"), sum / n as f64);
    }
    let mut group_sums: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for g in groups {
        for (k, x) in &g.metrics {
            let e = group_sums.entry(k).or_default();
            e.0 += x;
            e.1 += 1;
        }
    }
    for (k, (sum, n)) in group_sums {
        out.insert(format!("{split}/group/{k}"), sum / n as f64);
    }

    if let Some(mean) = mean(trajectories.iter().map(|t| t.reward)) {
        out.insert(format!("{split}/reward"), mean);
    }
    let stds = groups
        .iter()
        .filter(|g| g.trajectories.len() > 1)
        .map(|g| population_std(g.trajectories.iter().map(|t| t.reward)));
    if let Some(mean_std) = mean(stds) {
        out.insert(format!("{split}/reward_std_dev"), mean_std);
    }
    let attempts = trajectories.len() + exceptions;
    if attempts > 0 {
        out.insert(format!("{split}/exception_rate"), exceptions as f64 / attempts as f64);
    }
    let trainable = groups.iter().filter(|g| g.has_reward_variance()).count();
    out.insert(format!("{split}/data/step_num_trajectories"), attempts as f64);
    out.insert(format!("{split}/data/step_num_groups_submitted"), groups.len() as f64);
    out.insert(format!("{split}/data/step_num_groups_trainable"), trainable as f64);
    // Finite inputs can still give an infinite spread (rewards of +-1e308): such a metric is
    // undefined here, and is left out rather than stored.
    out.retain(|_, v| v.is_finite());
    out
}

/// The mean, summing `x / n` so that finite inputs give a finite mean.
fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let xs: Vec<f64> = xs.collect();
    let n = xs.len() as f64;
    (!xs.is_empty()).then(|| xs.iter().map(|x| x / n).sum())
}

/// Standard deviation dividing by n (numpy's default, which ART uses).
fn population_std(xs: impl Iterator<Item = f64> + Clone) -> f64 {
    let Some(m) = mean(xs.clone()) else { return 0.0 };
    let var = mean(xs.map(|x| (x - m) * (x - m))).unwrap_or(0.0);
    var.sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::TrajectorySummary;

    fn t(reward: f64, metrics: &[(&str, f64)]) -> TrajectorySummary {
        TrajectorySummary { reward, metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect() }
    }

    #[test]
    fn huge_rewards_never_make_infinite_metrics() {
        let g = GroupSummary { trajectories: vec![t(1e308, &[]), t(1e308, &[]), t(-1e308, &[])], ..Default::default() };
        let m = log_metrics("val", &[g]);
        assert!((m["val/reward"] - 1e308 / 3.0).abs() < 1e293);
        assert!(!m.contains_key("val/reward_std_dev"), "an infinite spread is left out");
        assert!(m.values().all(|v| v.is_finite()));
    }

    #[test]
    fn hand_computed_example() {
        // Group A: rewards 1, 0 (std 0.5), one exception; metric correct = 1, 0.
        // Group B: rewards 0.5, 0.5, 0.5 (std 0); metric correct only on one trajectory = 1;
        //          group metric difficulty 3.
        // Group C: a single trajectory with reward 2 (not counted in the std mean).
        let groups = vec![
            GroupSummary {
                trajectories: vec![t(1.0, &[("correct", 1.0)]), t(0.0, &[("correct", 0.0)])],
                metrics: BTreeMap::from([("difficulty".to_string(), 1.0)]),
                exceptions: 1,
            },
            GroupSummary {
                trajectories: vec![t(0.5, &[("correct", 1.0)]), t(0.5, &[]), t(0.5, &[])],
                metrics: BTreeMap::from([("difficulty".to_string(), 3.0)]),
                exceptions: 0,
            },
            GroupSummary { trajectories: vec![t(2.0, &[])], ..Default::default() },
        ];
        let m = log_metrics("val", &groups);
        // mean reward = (1 + 0 + 0.5*3 + 2) / 6 = 4.5 / 6 = 0.75
        assert_eq!(m["val/reward"], 0.75);
        // std over groups with >1 trajectory: (0.5 + 0) / 2
        assert_eq!(m["val/reward_std_dev"], 0.25);
        // 1 exception / (6 trajectories + 1)
        assert_eq!(m["val/exception_rate"], 1.0 / 7.0);
        // correct over the 3 trajectories that carry it: (1 + 0 + 1) / 3
        assert_eq!(m["val/correct"], 2.0 / 3.0);
        assert_eq!(m["val/group/difficulty"], 2.0);
        assert_eq!(m["val/data/step_num_trajectories"], 7.0);
        assert_eq!(m["val/data/step_num_groups_submitted"], 3.0);
        assert_eq!(m["val/data/step_num_groups_trainable"], 1.0);
        assert_eq!(m.len(), 8);
    }

    #[test]
    fn empty_log_has_only_counts() {
        let m = log_metrics("train", &[]);
        assert_eq!(m.len(), 3);
        assert_eq!(m["train/data/step_num_groups_submitted"], 0.0);
    }

    #[test]
    fn reward_wins_over_a_metric_named_reward() {
        let groups = vec![GroupSummary { trajectories: vec![t(1.0, &[("reward", 9.0)])], ..Default::default() }];
        assert_eq!(log_metrics("val", &groups)["val/reward"], 1.0);
    }
}
