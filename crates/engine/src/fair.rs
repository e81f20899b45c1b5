//! Fair shares between tenants: the pure arithmetic the step scheduler applies (issue 32).
//!
//! Three rules, each work-conserving (a tenant alone gets everything):
//! - **Max-min shares** ([`water_fill`]): a budget (decode slots, a step's tokens, KV positions)
//!   is divided so that no tenant gets more than another unless that other wants less.
//! - **Slowdown guard** ([`guard_caps`]): a step's time grows with the work in it, so one
//!   tenant's tokens slow every other tenant's stream. No tenant's work in a step may cost more
//!   than the step's fixed part `a` plus the cheapest other tenant's: then a step with `k`
//!   tenants takes at most `k (a + cheapest)`, so each tenant's work runs at least `1 / k` as fast
//!   as it would alone (its fair share of the machine), whatever the others send.
//! - **Cost model** ([`Cost`], [`StepCost`]): `a + c n + e w + f r` seconds for `n` tokens
//!   attending `w` thousand positions, of sequences holding `r` thousand cached positions,
//!   fitted to the engine's own steps, so a token deep in a long context counts for what it
//!   costs.

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

/// Max-min fair division of `total` seconds among `demands` (continuous water-filling): each
/// gets `min(demand, level)`, the level as high as the total allows.
pub fn water_fill_time(demands: &[f64], total: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|&i, &j| demands[i].total_cmp(&demands[j]));
    let mut share = vec![0.0; demands.len()];
    let mut left = total.max(0.0);
    for (k, &i) in order.iter().enumerate() {
        let level = left / (order.len() - k) as f64;
        share[i] = demands[i].min(level);
        left -= share[i];
    }
    share
}

/// A step's time as the engine measures it: `a + c n + e w + f r`, for `n` tokens attending
/// `w` thousand positions in all (a token at position `p` attends `p + 1`), of sequences whose
/// caches hold `r` thousand positions in all. `a` is the fixed part (reading the weights, the
/// step's overhead), `c` a token's own work, `e` attention's arithmetic, `f` reading a
/// sequence's cached keys and values once a step (what a decode token deep in a long context
/// mostly pays: memory-bound, where a prefill chunk shares that read among its tokens).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub a: f64,
    pub c: f64,
    pub e: f64,
    pub f: f64,
}

impl Cost {
    /// Seconds for `m` tokens of one sequence whose cache already holds `p` positions (no time
    /// for none).
    pub fn tokens(&self, p: usize, m: usize) -> f64 {
        if m == 0 {
            return 0.0;
        }
        let (p, m) = (p as f64, m as f64);
        self.c * m + self.e * (m * p + m * (m + 1.0) / 2.0) / 1000.0 + self.f * p / 1000.0
    }

    /// The most of `m` tokens at position `p` that fit in `seconds` (monotone: binary search;
    /// a nanosecond of slack absorbs the rounding of budgets computed as sums).
    pub fn fit(&self, p: usize, m: usize, seconds: f64) -> usize {
        let seconds = seconds + 1e-9;
        let (mut lo, mut hi) = (0usize, m);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.tokens(p, mid) <= seconds {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

/// The slowdown guard, in time: each tenant's work in a step may cost at most `a` plus the
/// cheapest other tenant's (`costs[i]` is tenant i's; 0 = not in the step). The cheapest is
/// capped by the second cheapest. Then a step with `k` tenants takes at most `k` times
/// `a + cheapest`, so each tenant's work runs at least `1 / k` as fast as alone (`a + its own`).
pub fn guard_caps(costs: &[f64], a: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..costs.len()).filter(|&i| costs[i] > 0.0).collect();
    if order.len() < 2 {
        return costs.to_vec();
    }
    order.sort_by(|&i, &j| costs[i].total_cmp(&costs[j]).then(i.cmp(&j)));
    let (least, second) = (costs[order[0]], costs[order[1]]);
    costs.iter().enumerate().map(|(i, &c)| if i == order[0] { c.min(a + second) } else { c.min(a + least) }).collect()
}

/// A capped step's longest planned time: `max_step` (0.25 s in the engine), or ten times the
/// step's fixed part `a` where that is longer, up to [`STRETCHED_STEP_MAX`].
///
/// Why: each step reads every weight once whatever its size, so a prompt split into capped steps
/// pays `a` once a step. On the bundled model `a` is ~4 ms, and 0.25 s steps lose ~2% to it; on
/// Qwen2.5-Coder 1.5B on two AVX2 cores it is ~50 ms and a token ~11 ms, so 0.25 s steps held 17
/// tokens and a lone 512-token prompt took 30 steps, ~25% longer than in one pass (prefill
/// through HTTP 69 tok/s against 88 in process; a 7B model's steps would have held one token).
/// Capping at ten times `a` keeps the fixed part at a tenth of a full step on any model; a
/// request arriving during one waits at most ten of that model's decode steps, or 2 s. The
/// scheduler stretches only a step of one tenant's work: with two or more in it the slowdown
/// guard and 0.25 s hold, so a victim's decodes beside an attacker's long prompts are not slowed
/// further (docs/benchmarks.md, session 56).
pub fn step_cap(max_step: f64, a: f64) -> f64 {
    max_step.max((10.0 * a).min(STRETCHED_STEP_MAX))
}

/// The longest [`step_cap`] stretches a step to (a big model's arrival latency bound).
pub const STRETCHED_STEP_MAX: f64 = 2.0;

/// Fits [`Cost`] to the engine's steps. Steps are binned by size (1-2 tokens, 3-15, 16-127, 128
/// and more), each bin keeping recent means of its steps' features and time, and the fit is
/// least squares over the bins' means plus a weak prior. Binning keeps what small steps cost
/// while only large ones run (a forgetting fit over all steps lost it, and with it the fixed
/// part: under a flood of 32-token steps the guard then let everything through).
#[derive(Debug, Clone)]
pub struct StepCost {
    /// Per bin: means of (n, w, r, seconds).
    bins: [Option<[f64; 4]>; 4],
    prior: Cost,
}

impl StepCost {
    /// Weight of a new step in its bin's means.
    const ALPHA: f64 = 0.1;
    /// Weight of each of the prior's points against a bin's one: enough to settle what the
    /// bins leave open (one or two sizes seen), too little to bend what they determine.
    const PRIOR: f64 = 1e-4;

    pub fn new(prior: Cost) -> Self {
        StepCost { bins: [None; 4], prior }
    }

    /// A step of `tokens` tokens attending `attended` positions in all, of sequences whose
    /// caches held `cached` positions in all, took `seconds`.
    pub fn observe(&mut self, tokens: usize, attended: usize, cached: usize, seconds: f64) {
        if tokens == 0 || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let bin = match tokens {
            1..=2 => 0,
            3..=15 => 1,
            16..=127 => 2,
            _ => 3,
        };
        let x = [tokens as f64, attended as f64 / 1000.0, cached as f64 / 1000.0, seconds];
        self.bins[bin] = Some(match self.bins[bin] {
            None => x,
            Some(m) => std::array::from_fn(|i| m[i] + Self::ALPHA * (x[i] - m[i])),
        });
    }

    /// The current fit, each part at least a microsecond's worth (never zero or negative).
    pub fn cost(&self) -> Cost {
        let p = self.prior;
        let mut xtx = [[0.0; 4]; 4];
        let mut xty = [0.0; 4];
        let mut add = |n: f64, w: f64, r: f64, t: f64, weight: f64| {
            let x = [1.0, n, w, r];
            for i in 0..4 {
                for j in 0..4 {
                    xtx[i][j] += weight * x[i] * x[j];
                }
                xty[i] += weight * x[i] * t;
            }
        };
        for (n, w, r) in [(1.0, 0.0, 0.0), (64.0, 0.0, 0.0), (64.0, 64.0, 1.0), (1.0, 8.0, 8.0)] {
            add(n, w, r, p.a + p.c * n + p.e * w + p.f * r, Self::PRIOR);
        }
        for [n, w, r, t] in self.bins.iter().flatten() {
            add(*n, *w, *r, *t, 1.0);
        }
        let theta = solve(xtx, xty).unwrap_or([p.a, p.c, p.e, p.f]);
        Cost { a: theta[0].max(1e-6), c: theta[1].max(1e-6), e: theta[2].max(1e-9), f: theta[3].max(0.0) }
    }
}

/// Solves an N x N system by Gaussian elimination with partial pivoting.
#[allow(clippy::needless_range_loop)] // row and column indices, as in the elimination's math
fn solve<const N: usize>(mut m: [[f64; N]; N], mut b: [f64; N]) -> Option<[f64; N]> {
    for col in 0..N {
        let pivot = (col..N).max_by(|&i, &j| m[i][col].abs().total_cmp(&m[j][col].abs()))?;
        if m[pivot][col].abs() < 1e-15 {
            return None;
        }
        m.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..N {
            let f = m[row][col] / m[col][col];
            for k in col..N {
                m[row][k] -= f * m[col][k];
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; N];
    for row in (0..N).rev() {
        let rest: f64 = (row + 1..N).map(|k| m[row][k] * x[k]).sum();
        x[row] = (b[row] - rest) / m[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_step_keeps_its_fixed_part_to_a_tenth() {
        // The bundled model (4 ms fixed): the 0.25 s cap stands.
        assert_eq!(step_cap(0.25, 0.004), 0.25);
        // Qwen 1.5B on AVX2 (50 ms fixed): 0.5 s, of which 0.45 s for tokens.
        assert!((step_cap(0.25, 0.05) - 0.5).abs() < 1e-12);
        // A model whose fixed part is 0.4 s: 2 s at most, not 4.
        assert_eq!(step_cap(0.25, 0.4), STRETCHED_STEP_MAX);
        // A longer configured cap is never shortened.
        assert_eq!(step_cap(10.0, 0.4), 10.0);
    }

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
    fn time_is_water_filled_continuously() {
        assert_eq!(water_fill_time(&[0.01, 0.5], 0.2), vec![0.01, 0.19]);
        assert_eq!(water_fill_time(&[0.5, 0.5], 0.2), vec![0.1, 0.1]);
        assert_eq!(water_fill_time(&[0.05, 0.05], 0.2), vec![0.05, 0.05]);
        assert_eq!(water_fill_time(&[], 0.2), Vec::<f64>::new());
    }

    #[test]
    fn a_chunk_costs_its_tokens_and_their_attention() {
        let cost = Cost { a: 0.004, c: 0.001, e: 0.001, f: 0.002 };
        // 2 tokens after 1,000 positions attend 1,001 and 1,002: 0.002 + 0.001 * 2.003, and the
        // 1,000 cached positions are read once: 0.002.
        assert!((cost.tokens(1000, 2) - (0.002 + 0.002003 + 0.002)).abs() < 1e-12);
        assert_eq!(cost.tokens(1000, 0), 0.0);
        // Only attention: m tokens at 1,000 cost m/1000 + m(m+1)/2e6 s; 224 fit in 0.25 s, 225 not.
        let attention = Cost { a: 0.0, c: 0.0, e: 0.001, f: 0.0 };
        assert_eq!(attention.fit(1000, 512, 0.25), 224);
        assert_eq!(attention.fit(1000, 100, 0.25), 100);
        assert_eq!(attention.fit(1000, 512, 0.0), 0);
    }

    #[test]
    fn the_time_guard_caps_everyone_at_a_plus_the_cheapest() {
        assert_eq!(guard_caps(&[0.001, 0.5], 0.004), vec![0.001, 0.005]);
        assert_eq!(guard_caps(&[0.3, 0.5], 0.004), vec![0.3, 0.304]);
        assert_eq!(guard_caps(&[0.0, 0.5], 0.004), vec![0.0, 0.5], "a tenant not in the step protects no one");
        // Any capped pair takes at most twice the cheaper one's time alone.
        for x in [0.001, 0.01, 0.1] {
            for y in [0.001, 0.05, 2.0] {
                let c = guard_caps(&[x, y], 0.004);
                assert!(0.004 + c[0] + c[1] <= 2.0 * (0.004 + c[0].min(c[1])) + 1e-12, "{x} {y}: {c:?}");
            }
        }
    }

    #[test]
    fn the_cost_model_recovers_its_parts_from_steps() {
        let prior = Cost { a: 0.004, c: 0.001, e: 0.0014, f: 0.002 };
        let mut fit = StepCost::new(prior);
        let c0 = fit.cost();
        for (g, t) in [(c0.a, prior.a), (c0.c, prior.c), (c0.e, prior.e), (c0.f, prior.f)] {
            assert!((g - t).abs() < 1e-9, "{c0:?}");
        }
        // Steps of another machine: a = 3 ms, c = 2.4 ms, e = 0.5 ms and f = 2 ms per thousand
        // positions: single decodes, 8-token chunks, 32-token and 512-token chunks, each of one
        // sequence at varying depths.
        let truth = Cost { a: 0.003, c: 0.0024, e: 0.0005, f: 0.002 };
        let step = |fit: &mut StepCost, n: usize, p: usize| {
            fit.observe(n, n * p + n * (n + 1) / 2, p, truth.a + truth.tokens(p, n));
        };
        for i in 0..4000usize {
            let (n, p) = [(1, 40 + i % 6000), (8, 100 + i % 3000), (32, 300 + i % 500), (512, 4000 - i % 700)][i % 4];
            step(&mut fit, n, p);
            fit.observe(0, 0, 0, 1.0);
            fit.observe(3, 10, 0, f64::NAN);
        }
        let got = fit.cost();
        for (g, t) in [(got.a, truth.a), (got.c, truth.c), (got.e, truth.e), (got.f, truth.f)] {
            assert!((g - t).abs() < 0.02 * t, "{got:?} vs {truth:?}");
        }
        // Then a long flood of 32-token chunks only: what small steps cost is kept.
        for i in 0..5000usize {
            step(&mut fit, 32, 300 + i % 500);
        }
        let got = fit.cost();
        assert!((got.a - truth.a).abs() < 0.05 * truth.a, "{got:?} vs {truth:?}");
    }
}
