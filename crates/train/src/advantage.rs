//! Advantages and token weights, as ART computes them (contract §3, ART's `tokenize.py` and
//! `pack.py`). Pure functions over plain numbers.

/// Group-relative advantages: `r - mean(r)`, divided by `(population std + 1e-6)` when
/// `scale_rewards`. A group with one trajectory or rewards all within 1e-12 of each other is
/// zero-variance: every advantage is 0 (and the trajectories are then not trained).
pub fn group_advantages(rewards: &[f64], scale_rewards: bool) -> Vec<f64> {
    let n = rewards.len();
    if n <= 1 {
        return vec![0.0; n];
    }
    let (lo, hi) = rewards.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    if hi / 2.0 - lo / 2.0 <= 0.5e-12 {
        return vec![0.0; n];
    }
    // Rewards are any finite numbers: computed on rewards / s (s = the largest magnitude, when
    // above 1), so that no sum or square overflows; the result is the same formula.
    let s = lo.abs().max(hi.abs()).max(1.0);
    let scaled: Vec<f64> = rewards.iter().map(|r| r / s).collect();
    let mean = scaled.iter().map(|r| r / n as f64).sum::<f64>();
    let std = (scaled.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
    scaled.iter().map(|r| if scale_rewards { (r - mean) / (std + 1e-6 / s) } else { (r - mean) * s }).collect()
}

/// Per-token advantage and weight over every trainable token of a training call, normalised as
/// ART's packer does: weights to mean 1, then `advantage_balance` b (b > 0 scales negative
/// advantages by 1 - b, b < 0 scales positive ones by 1 + b), then advantages divided by
/// `mean(|A| * w)`. Inputs are per token: the trajectory's advantage and its raw weight
/// `1 / (trainable tokens of the trajectory + 1e-6)`.
pub fn normalise(advantages: &mut [f64], weights: &mut [f64], balance: f64) {
    let n = weights.len();
    if n == 0 {
        return;
    }
    let mean_w = weights.iter().sum::<f64>() / n as f64;
    if mean_w > 0.0 {
        weights.iter_mut().for_each(|w| *w /= mean_w);
    }
    for a in advantages.iter_mut() {
        if balance > 0.0 && *a < 0.0 {
            *a *= 1.0 - balance;
        } else if balance < 0.0 && *a > 0.0 {
            *a *= 1.0 + balance;
        }
    }
    let scale = advantages.iter().zip(weights.iter()).map(|(a, w)| a.abs() * w).sum::<f64>() / n as f64;
    if scale > 0.0 {
        advantages.iter_mut().for_each(|a| *a /= scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} != {b:?}");
        }
    }

    #[test]
    fn huge_rewards_give_finite_advantages() {
        // The unscaled mean and variance of these overflow to infinity.
        close(&group_advantages(&[1e308, -1e308], true), &[1.0, -1.0]);
        close(&group_advantages(&[f64::MAX, f64::MAX, 0.0, 0.0], true), &[1.0, 1.0, -1.0, -1.0]);
        assert_eq!(group_advantages(&[1e308, 1e308], true), vec![0.0, 0.0]);
        let a = group_advantages(&[1e300, 0.0], false);
        assert!((a[0] / 5e299 - 1.0).abs() < 1e-12 && (a[1] / -5e299 - 1.0).abs() < 1e-12, "{a:?}");
    }

    #[test]
    fn group_relative_with_and_without_scaling() {
        // rewards 1, 0, 0, 1: mean 0.5, population std 0.5.
        close(&group_advantages(&[1.0, 0.0, 0.0, 1.0], false), &[0.5, -0.5, -0.5, 0.5]);
        let s = 0.5 / (0.5 + 1e-6);
        close(&group_advantages(&[1.0, 0.0, 0.0, 1.0], true), &[s, -s, -s, s]);
        // rewards 3, 1, 2: mean 2, std sqrt(2/3) = 0.816497.
        let std = (2.0f64 / 3.0).sqrt() + 1e-6;
        close(&group_advantages(&[3.0, 1.0, 2.0], true), &[1.0 / std, -1.0 / std, 0.0]);
    }

    #[test]
    fn zero_variance_groups_are_all_zero() {
        close(&group_advantages(&[0.7], true), &[0.0]);
        close(&group_advantages(&[0.7, 0.7 + 1e-13, 0.7], true), &[0.0, 0.0, 0.0]);
        assert!(group_advantages(&[], true).is_empty());
    }

    #[test]
    fn normalisation_weights_balance_and_scale() {
        // Trajectory X: 1 token, A = +1, w = 1; trajectory Y: 3 tokens, A = -1, w = 1/3 each.
        let mut a = vec![1.0, -1.0, -1.0, -1.0];
        let mut w = vec![1.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
        normalise(&mut a, &mut w, 0.0);
        // mean w = 0.5 -> w = [2, 2/3, 2/3, 2/3]; mean(|A| w) = (2 + 2) / 4 = 1 -> A unchanged.
        close(&w, &[2.0, 2.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0]);
        close(&a, &[1.0, -1.0, -1.0, -1.0]);

        // balance 0.5 halves negatives: A = [1, -.5, -.5, -.5]; mean(|A| w) = (2 + 1) / 4 = 0.75.
        let mut a = vec![1.0, -1.0, -1.0, -1.0];
        let mut w = vec![1.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
        normalise(&mut a, &mut w, 0.5);
        close(&a, &[1.0 / 0.75, -0.5 / 0.75, -0.5 / 0.75, -0.5 / 0.75]);

        // balance -1 keeps only negatives: A = [0, -1, -1, -1]; mean(|A| w) = 2 / 4 = 0.5.
        let mut a = vec![1.0, -1.0, -1.0, -1.0];
        let mut w = vec![1.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
        normalise(&mut a, &mut w, -1.0);
        close(&a, &[0.0, -2.0, -2.0, -2.0]);
    }
}
