//! Fair shares between tenants: the pure arithmetic the step scheduler applies (issue 32).
//!
//! Three rules, each work-conserving (a tenant alone gets everything):
//! - **Max-min shares** ([`water_fill`]): a budget (decode slots, a step's tokens, KV positions)
//!   is divided so that no tenant gets more than another unless that other wants less.
//! - **Slowdown guard** ([`guard`]): a step's time grows with the tokens in it, `T(n) ~ a + c n`,
//!   so one tenant's tokens slow every other tenant's stream. No tenant may put more than
//!   `r + m` tokens in a step where another tenant has `m`, with `r = a / c` ([`StepCost`]): then
//!   the step takes at most `a + c m + c (r + m) = 2 (a + c m)` time per other tenant, so each
//!   tenant's work runs at least `1 / k` as fast as it would alone when `k` tenants have work
//!   (its fair share of the machine), whatever the others send.
//! - **Cost model** ([`StepCost`]): `a` and `c` measured from the engine's own steps.

/// Max-min fair division of `total` units among `demands`: every demand gets
/// `min(demand, level)` for the largest level the total allows, and the units left by integer
/// division go one each to the earliest demands still wanting (the caller orders them, e.g. by
/// who was served least). Returns the shares in the demands' order; their sum is
/// `min(total, sum of demands)`.
pub fn water_fill(demands: &[usize], total: usize) -> Vec<usize> {
    let mut share = vec![0usize; demands.len()];
    let mut left = total;
    loop {
        let wanting: Vec<usize> = (0..demands.len()).filter(|&i| share[i] < demands[i]).collect();
        if wanting.is_empty() || left == 0 {
            return share;
        }
        let level = left / wanting.len();
        if level == 0 {
            // Fewer units than tenants still wanting: one each, in order.
            for &i in wanting.iter().take(left) {
                share[i] += 1;
            }
            return share;
        }
        for &i in &wanting {
            let give = level.min(demands[i] - share[i]);
            share[i] += give;
            left -= give;
        }
    }
}

/// Caps each tenant's tokens in a step at `ratio + m`, where `m` is the fewest tokens another
/// tenant with work in the step has (tenants with 0 tokens are not in the step and are not
/// protected by it). The tenant with the fewest tokens is never cut below what it has (its cap
/// is the second fewest plus `ratio`). Returns the capped shares.
pub fn guard(shares: &[usize], ratio: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..shares.len()).filter(|&i| shares[i] > 0).collect();
    if order.len() < 2 {
        return shares.to_vec();
    }
    order.sort_by_key(|&i| (shares[i], i));
    let (least, second) = (shares[order[0]], shares[order[1]]);
    shares
        .iter()
        .enumerate()
        .map(|(i, &s)| if i == order[0] { s.min(ratio + second) } else { s.min(ratio + least) })
        .collect()
}

/// The step time's fixed part `a` (weights read, per-step overhead) against its part per token
/// `c`, as exponentially weighted means of what the engine measures: small steps (at most
/// [`StepCost::SMALL`] tokens) estimate `a + c`, large ones (at least [`StepCost::LARGE`]) the
/// slope. Until both have been seen, the ratio is the configured default.
#[derive(Debug, Clone)]
pub struct StepCost {
    /// Mean time of small steps and their mean token count.
    small: Option<(f64, f64)>,
    /// Mean time and token count of large steps.
    large: Option<(f64, f64)>,
    default_ratio: usize,
}

impl StepCost {
    pub const SMALL: usize = 2;
    pub const LARGE: usize = 16;
    /// Weight of a new measurement in the means.
    const ALPHA: f64 = 0.1;

    pub fn new(default_ratio: usize) -> Self {
        StepCost { small: None, large: None, default_ratio: default_ratio.max(1) }
    }

    /// A step of `tokens` tokens took `seconds`.
    pub fn observe(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let slot = if tokens <= Self::SMALL {
            &mut self.small
        } else if tokens >= Self::LARGE {
            &mut self.large
        } else {
            return;
        };
        let n = tokens as f64;
        *slot = Some(match *slot {
            None => (seconds, n),
            Some((t, m)) => (t + Self::ALPHA * (seconds - t), m + Self::ALPHA * (n - m)),
        });
    }

    /// `a / c`, in tokens: how many tokens add as much time as a step's fixed part. At least 1.
    pub fn ratio(&self) -> usize {
        let (Some((ts, ns)), Some((tl, nl))) = (self.small, self.large) else { return self.default_ratio };
        let c = (tl - ts) / (nl - ns);
        if !(c > 0.0) {
            // Large steps no slower than small ones: per-token cost is negligible.
            return self.default_ratio.max(Self::LARGE);
        }
        let a = ts - c * ns;
        ((a / c).round().max(1.0) as usize).min(1 << 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_filling_gives_the_small_their_demand_and_splits_the_rest() {
        assert_eq!(water_fill(&[1, 100], 32), vec![1, 31]);
        assert_eq!(water_fill(&[100, 100], 32), vec![16, 16]);
        assert_eq!(water_fill(&[100, 100, 100], 32), vec![11, 11, 10], "the remainder goes first to first");
        assert_eq!(water_fill(&[5, 20, 100], 32), vec![5, 14, 13]);
        assert_eq!(water_fill(&[3, 4], 32), vec![3, 4], "less wanted than there is");
        assert_eq!(water_fill(&[10, 10, 10], 2), vec![1, 1, 0]);
        assert_eq!(water_fill(&[], 8), Vec::<usize>::new());
        assert_eq!(water_fill(&[0, 7], 8), vec![0, 7]);
        assert_eq!(water_fill(&[9, 9], 0), vec![0, 0]);
    }

    #[test]
    fn the_guard_caps_everyone_at_ratio_plus_the_smallest() {
        // One decode stream against 31: with r = 4 the large tenant keeps 5.
        assert_eq!(guard(&[1, 31], 4), vec![1, 5]);
        // The smallest is capped by the second smallest only.
        assert_eq!(guard(&[30, 31], 4), vec![30, 34.min(31)]);
        assert_eq!(guard(&[2, 3, 40], 4), vec![2, 3, 6]);
        // A tenant with nothing in the step protects no one.
        assert_eq!(guard(&[0, 300], 4), vec![0, 300]);
        assert_eq!(guard(&[300], 4), vec![300]);
    }

    #[test]
    fn the_guarded_step_takes_at_most_twice_the_smallest_alone() {
        // With T(n) = a + c n and r = a / c, any guarded split of two tenants takes at most
        // 2 T(m) for the smaller's m.
        let (a, c) = (4.0, 1.0);
        for m in 1..50usize {
            for other in [1usize, 10, 100, 1000] {
                let s = guard(&[m, other], 4);
                let t = a + c * (s[0] + s[1]) as f64;
                let least = s[0].min(s[1]) as f64;
                assert!(t <= 2.0 * (a + c * least) + 1e-9, "{m} {other}: {s:?}");
            }
        }
    }

    #[test]
    fn the_cost_model_recovers_the_fixed_part_over_the_slope() {
        let mut cost = StepCost::new(7);
        assert_eq!(cost.ratio(), 7, "the default until both sizes are seen");
        let (a, c) = (0.0045, 0.0011);
        for _ in 0..50 {
            cost.observe(1, a + c);
            cost.observe(32, a + 32.0 * c);
            cost.observe(8, 1.0); // medium steps are not used
        }
        assert_eq!(cost.ratio(), 4, "a / c = 4.09");
        cost.observe(0, 1.0);
        cost.observe(1, f64::NAN);
        assert_eq!(cost.ratio(), 4);
        let mut flat = StepCost::new(3);
        flat.observe(1, 0.01);
        flat.observe(64, 0.01);
        assert_eq!(flat.ratio(), StepCost::LARGE, "no per-token cost: a loose guard");
    }
}
