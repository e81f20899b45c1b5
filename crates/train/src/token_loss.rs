//! The built-in losses of a Tinker `forward_backward` call, per datum, summed over its tokens
//! (Tinker's `loss:sum`; no normalisation: the client scales its weights and advantages).
//!
//! As in [`crate::loss`], only `dL / d new_lp` per token is needed: autograd takes it through
//! the network as the gradient of `sum(g_t * new_lp_t)`. PPO's and CISPO's per-token terms are
//! [`crate::loss`]'s own ([`ppo_term`], [`cispo_term`]), shared with the `/v1/preview` trainer,
//! which normalises and shapes them the way ART does.

use crate::loss::{cispo_term, ppo_term};

/// Tinker's clip thresholds when the call names none (its documented epsilon of 0.2).
pub const CLIP_LOW: f64 = 0.8;
pub const CLIP_HIGH: f64 = 1.2;

/// A built-in loss, as `forward_backward`'s `loss_fn` names it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TokenLoss {
    /// `-sum(w * lp)`: supervised learning; weights may be any finite number (DPO and custom
    /// losses computed on the client send negative ones).
    CrossEntropy,
    /// `-sum(exp(lp - q) * A)`.
    ImportanceSampling,
    /// `-sum(min(r * A, clip(r, low, high) * A))`, `r = exp(lp - q)`.
    Ppo { low: f64, high: f64 },
    /// `-sum(sg(clip(r, low, high)) * lp * A)`.
    Cispo { low: f64, high: f64 },
    /// Tinker's DRO: `-sum(lp * A - beta / 2 * (lp - q)^2)`.
    Dro { beta: f64 },
    /// Tinker's GSPO (token-level form): the ratio is the datum's sequence ratio
    /// `exp(mean over the ratio mask of (lp - q))` with each token's own gradient, clipped as PPO
    /// clips: `-sum(min(r_s * A, clip(r_s, low, high) * A))`.
    Gspo { low: f64, high: f64 },
    /// `stable_reinforce` as tandem defines it (Tinker has not published its objective): a
    /// REINFORCE whose importance weight is detached and truncated, plus a penalty on the k3
    /// estimate of KL(sampler || learner) over the tokens with an advantage:
    /// `-sum(sg(min(r, TRUNCATE)) * A * lp) + kl_coeff * sum_{A != 0}((r - 1) - ln r)`.
    StableReinforce { kl_coeff: f64 },
}

/// `stable_reinforce`'s truncation of the importance weight (as truncated importance sampling
/// bounds it: large ratios of stale or low-precision samples cannot blow up a step).
pub const TRUNCATE: f64 = 2.0;
/// DRO's `beta` when the call names none (Tinker publishes no default; its example uses 0.05).
pub const DRO_BETA: f64 = 0.05;
/// GSPO's thresholds when the call names none: the GSPO paper's epsilons (3e-4 and 4e-4), since
/// a sequence's mean log-ratio moves far less than a token's.
pub const GSPO_LOW: f64 = 1.0 - 3e-4;
pub const GSPO_HIGH: f64 = 1.0 + 4e-4;

impl TokenLoss {
    /// The loss named `name` with its `loss_fn_config` (`clip_low_threshold`,
    /// `clip_high_threshold` for PPO and CISPO). Anything else is refused with the names served.
    pub fn parse(name: &str, config: &[(String, f64)]) -> Result<Self, String> {
        let get = |key: &str, default: f64| -> Result<f64, String> {
            match config.iter().find(|(k, _)| k == key) {
                None => Ok(default),
                Some((_, v)) if v.is_finite() && *v >= 0.0 => Ok(*v),
                Some((_, v)) => Err(format!("loss_fn_config {key} must be a finite number >= 0, got {v}")),
            }
        };
        let clip = |low: f64, high: f64| -> Result<(f64, f64), String> {
            let (low, high) = (get("clip_low_threshold", low)?, get("clip_high_threshold", high)?);
            if low > high {
                return Err(format!("clip_low_threshold {low} is above clip_high_threshold {high}"));
            }
            Ok((low, high))
        };
        let known: &[&str] = match name {
            "ppo" | "cispo" | "gspo" => &["clip_low_threshold", "clip_high_threshold"],
            "dro" => &["beta"],
            "stable_reinforce" => &["kl_coeff"],
            _ => &[],
        };
        if let Some((k, _)) = config.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            return Err(match known {
                [] => format!("{name} takes no loss_fn_config (got {k:?})"),
                _ => format!("loss_fn_config {k:?} is not a setting of {name:?} (known: {})", known.join(", ")),
            });
        }
        match name {
            "cross_entropy" => Ok(TokenLoss::CrossEntropy),
            "importance_sampling" => Ok(TokenLoss::ImportanceSampling),
            "ppo" => clip(CLIP_LOW, CLIP_HIGH).map(|(low, high)| TokenLoss::Ppo { low, high }),
            "cispo" => clip(CLIP_LOW, CLIP_HIGH).map(|(low, high)| TokenLoss::Cispo { low, high }),
            "gspo" => clip(GSPO_LOW, GSPO_HIGH).map(|(low, high)| TokenLoss::Gspo { low, high }),
            "dro" => Ok(TokenLoss::Dro { beta: get("beta", DRO_BETA)? }),
            "stable_reinforce" => Ok(TokenLoss::StableReinforce { kl_coeff: get("kl_coeff", 0.0)? }),
            "custom" => Err("loss_fn \"custom\" names a loss uploaded to Tinker's service; tandem has no uploaded losses: compute it on the client with forward_backward_custom".into()),
            other => Err(format!(
                "loss_fn {other:?} is not served; served: cross_entropy, importance_sampling, ppo, cispo, gspo, dro, stable_reinforce"
            )),
        }
    }

    /// The `loss_fn_inputs` a datum must carry besides `target_tokens`.
    pub fn required_inputs(self) -> &'static [&'static str] {
        match self {
            TokenLoss::CrossEntropy => &["weights"],
            _ => &["logprobs", "advantages"],
        }
    }
}

/// One datum's per-token inputs, each as long as its `target_tokens`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatumInputs {
    pub weights: Vec<f64>,
    /// The sampler's logprob of each target (`logprobs`).
    pub sampling_lp: Vec<f64>,
    pub advantages: Vec<f64>,
    /// Per-token thresholds, overriding the call's when present.
    pub clip_low: Vec<f64>,
    pub clip_high: Vec<f64>,
    /// GSPO's `sequence_ratio_mask`: the positions whose log-ratios make the sequence ratio
    /// (absent: those with a non-zero advantage).
    pub ratio_mask: Vec<f64>,
}

impl DatumInputs {
    /// A datum's inputs from its `loss_fn_inputs` by key (the keys Tinker names; absent ones
    /// empty).
    pub fn from_map(inputs: &std::collections::BTreeMap<String, Vec<f64>>) -> Self {
        let take = |key: &str| inputs.get(key).cloned().unwrap_or_default();
        DatumInputs {
            weights: take("weights"),
            sampling_lp: take("logprobs"),
            advantages: take("advantages"),
            clip_low: take("clip_low_threshold"),
            clip_high: take("clip_high_threshold"),
            ratio_mask: take("sequence_ratio_mask"),
        }
    }
}

/// A datum's loss and `dL / d new_lp` per token.
#[derive(Debug, Clone, PartialEq)]
pub struct DatumLoss {
    pub loss: f64,
    pub grad: Vec<f64>,
}

/// The loss of one datum whose targets have the new logprobs `new_lp`. Inputs were checked
/// for length and finiteness when the call was read ([`check_inputs`]).
pub fn datum_loss(kind: TokenLoss, new_lp: &[f64], inputs: &DatumInputs) -> DatumLoss {
    let mut loss = 0.0;
    let mut grad = vec![0.0; new_lp.len()];
    let seq_log_ratio = match kind {
        TokenLoss::Gspo { .. } => sequence_log_ratio(new_lp, inputs),
        _ => 0.0,
    };
    for (i, lp) in new_lp.iter().copied().enumerate() {
        let at = |v: &[f64], default: f64| v.get(i).copied().unwrap_or(default);
        let (l, g) = match kind {
            TokenLoss::CrossEntropy => {
                let w = at(&inputs.weights, 0.0);
                (-w * lp, -w)
            }
            TokenLoss::ImportanceSampling => {
                let (a, r) = (at(&inputs.advantages, 0.0), ratio(lp, at(&inputs.sampling_lp, lp)));
                (-r * a, -r * a)
            }
            TokenLoss::Ppo { low, high } => {
                let (low, high) = (at(&inputs.clip_low, low), at(&inputs.clip_high, high));
                let (a, r) = (at(&inputs.advantages, 0.0), ratio(lp, at(&inputs.sampling_lp, lp)));
                let (l, dl_dr) = ppo_term(r, a, low, high);
                // dr / d lp = r.
                (l, dl_dr * r)
            }
            TokenLoss::Cispo { low, high } => {
                let (low, high) = (at(&inputs.clip_low, low), at(&inputs.clip_high, high));
                let (a, r) = (at(&inputs.advantages, 0.0), ratio(lp, at(&inputs.sampling_lp, lp)));
                cispo_term(r, a, lp, low, high)
            }
            TokenLoss::Dro { beta } => {
                let (a, d) = (at(&inputs.advantages, 0.0), lp - at(&inputs.sampling_lp, lp));
                (-(lp * a - 0.5 * beta * d * d), -a + beta * d)
            }
            TokenLoss::Gspo { low, high } => {
                let (low, high) = (at(&inputs.clip_low, low), at(&inputs.clip_high, high));
                // The ratio's value is the sequence's; its gradient flows through the token's own
                // logprob (exp(s + lp - sg(lp))), so dr / d lp = r.
                let (a, r) = (at(&inputs.advantages, 0.0), seq_log_ratio.exp());
                let (l, dl_dr) = ppo_term(r, a, low, high);
                (l, dl_dr * r)
            }
            TokenLoss::StableReinforce { kl_coeff } => {
                let (a, r) = (at(&inputs.advantages, 0.0), ratio(lp, at(&inputs.sampling_lp, lp)));
                let w = r.min(TRUNCATE);
                let (kl, dkl) = if a != 0.0 { ((r - 1.0) - r.ln(), r - 1.0) } else { (0.0, 0.0) };
                (-w * a * lp + kl_coeff * kl, -w * a + kl_coeff * dkl)
            }
        };
        loss += l;
        grad[i] = g;
    }
    DatumLoss { loss, grad }
}

/// Whether target `i`'s gradient can be other than zero: a zero weight (cross entropy) or a zero
/// advantage (every RL loss) makes it zero whatever its logprob. The head's backward skips such
/// targets (a Tinker datum's prompt positions).
pub fn trains(kind: TokenLoss, inputs: &DatumInputs, i: usize) -> bool {
    let v = match kind {
        TokenLoss::CrossEntropy => &inputs.weights,
        // DRO's penalty pulls every position towards the sampler's logprob, as Tinker states it.
        TokenLoss::Dro { .. } => return i < inputs.sampling_lp.len(),
        _ => &inputs.advantages,
    };
    v.get(i).is_some_and(|x| *x != 0.0)
}

/// GSPO's sequence log-ratio: the mean of `lp - q` over the ratio mask's non-zero positions
/// (those with a non-zero advantage when no mask is given), bounded as [`ratio`] bounds a
/// token's; 0 over no positions.
fn sequence_log_ratio(new_lp: &[f64], inputs: &DatumInputs) -> f64 {
    let counted = |i: usize| match inputs.ratio_mask.get(i) {
        Some(m) => *m != 0.0,
        None => inputs.advantages.get(i).is_some_and(|a| *a != 0.0),
    };
    let (sum, n) =
        new_lp.iter().enumerate().filter(|(i, _)| counted(*i)).fold((0.0, 0usize), |(s, n), (i, lp)| {
            (s + (lp - inputs.sampling_lp.get(i).copied().unwrap_or(*lp)), n + 1)
        });
    if n == 0 {
        0.0
    } else {
        (sum / n as f64).clamp(-20.0, 20.0)
    }
}

/// `exp(lp - q)`, the log-ratio bounded so that a wild sampler logprob cannot overflow.
fn ratio(lp: f64, q: f64) -> f64 {
    (lp - q).clamp(-20.0, 20.0).exp()
}

/// Checks a datum's inputs against its `n` targets: every input the loss needs is present, as
/// long as the targets, and finite (a NaN advantage would poison the whole step).
pub fn check_inputs(kind: TokenLoss, n: usize, inputs: &DatumInputs) -> Result<(), String> {
    let named = [
        ("weights", &inputs.weights),
        ("logprobs", &inputs.sampling_lp),
        ("advantages", &inputs.advantages),
        ("clip_low_threshold", &inputs.clip_low),
        ("clip_high_threshold", &inputs.clip_high),
        ("sequence_ratio_mask", &inputs.ratio_mask),
    ];
    for key in kind.required_inputs() {
        let v = named.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
        if v.is_none_or(|v| v.is_empty() && n > 0) {
            return Err(format!("loss_fn_inputs lacks {key:?}, which {kind:?} needs"));
        }
    }
    for (key, v) in named {
        if v.is_empty() {
            continue;
        }
        if v.len() != n {
            return Err(format!("loss_fn_inputs {key:?} has {} values for {n} target tokens", v.len()));
        }
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(format!("loss_fn_inputs {key:?} holds {} at position {i}", v[i]));
        }
    }
    // Per-token thresholds, each beside the call's where only one is given, must not cross.
    if let TokenLoss::Ppo { low, high } | TokenLoss::Cispo { low, high } | TokenLoss::Gspo { low, high } = kind {
        let at = |v: &[f64], i: usize, default: f64| v.get(i).copied().unwrap_or(default);
        if let Some(i) = (0..n).find(|&i| at(&inputs.clip_low, i, low) > at(&inputs.clip_high, i, high)) {
            return Err(format!(
                "at position {i} the clip_low_threshold {} is above the clip_high_threshold {}",
                at(&inputs.clip_low, i, low),
                at(&inputs.clip_high, i, high)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * (1.0 + b.abs())
    }

    #[test]
    fn cross_entropy_is_the_weighted_negative_logprob_sum() {
        let inputs = DatumInputs { weights: vec![1.0, 0.0, -0.5], ..Default::default() };
        let out = datum_loss(TokenLoss::CrossEntropy, &[-1.0, -2.0, -4.0], &inputs);
        // -(1 * -1) - 0 - (-0.5 * -4) = 1 - 2 = -1.
        assert!(close(out.loss, -1.0), "{out:?}");
        assert_eq!(out.grad, vec![-1.0, 0.0, 0.5]);
    }

    #[test]
    fn importance_sampling_weights_the_advantage_by_the_ratio() {
        let inputs = DatumInputs { sampling_lp: vec![-1.0, -1.0], advantages: vec![2.0, -1.0], ..Default::default() };
        let lp = [-1.0, (0.5f64).ln() - 1.0];
        let out = datum_loss(TokenLoss::ImportanceSampling, &lp, &inputs);
        // Ratios 1 and 0.5: -(1 * 2) - (0.5 * -1) = -1.5; gradients -r * A.
        assert!(close(out.loss, -1.5), "{out:?}");
        assert!(close(out.grad[0], -2.0) && close(out.grad[1], 0.5), "{out:?}");
    }

    #[test]
    fn ppo_stops_the_gradient_where_the_clipped_term_is_the_minimum() {
        let ppo = TokenLoss::Ppo { low: 0.8, high: 1.2 };
        let q = vec![0.0; 4];
        // Ratios 1.5 (A > 0: clipped at 1.2, no gradient), 1.5 (A < 0: unclipped is the min),
        // 0.5 (A > 0: unclipped is the min), 1.1 (inside: both agree).
        let lp: Vec<f64> = [1.5f64, 1.5, 0.5, 1.1].iter().map(|r| r.ln()).collect();
        let inputs = DatumInputs { sampling_lp: q, advantages: vec![1.0, -1.0, 1.0, 2.0], ..Default::default() };
        let out = datum_loss(ppo, &lp, &inputs);
        // -(1.2) - (-1.5) - (0.5) - (2.2) = -2.4.
        assert!(close(out.loss, -2.4), "{out:?}");
        // dL/dlp = -A * r where the unclipped term counts.
        let want = [0.0, 1.5, -0.5, -2.2];
        for (g, w) in out.grad.iter().zip(want) {
            assert!(close(*g, w), "{:?} vs {want:?}", out.grad);
        }
    }

    #[test]
    fn cispo_weights_the_logprob_by_the_detached_clipped_ratio() {
        let cispo = TokenLoss::Cispo { low: 0.8, high: 1.2 };
        let lp = [(2.0f64).ln() - 1.0, -1.0];
        let inputs = DatumInputs { sampling_lp: vec![-1.0, -1.0], advantages: vec![1.0, -3.0], ..Default::default() };
        let out = datum_loss(cispo, &lp, &inputs);
        // Ratios 2 (clipped to 1.2) and 1: -(1.2 * lp0 * 1) - (1 * -1 * -3).
        let want = -1.2 * lp[0] - 3.0;
        assert!(close(out.loss, want), "{out:?} vs {want}");
        assert!(close(out.grad[0], -1.2) && close(out.grad[1], 3.0), "{out:?}");
    }

    #[test]
    fn per_token_thresholds_override_the_calls() {
        let ppo = TokenLoss::Ppo { low: 0.8, high: 1.2 };
        let inputs = DatumInputs {
            sampling_lp: vec![0.0],
            advantages: vec![1.0],
            clip_low: vec![0.5],
            clip_high: vec![2.0],
            ..Default::default()
        };
        // A ratio of 1.5 is inside [0.5, 2]: the gradient flows.
        let out = datum_loss(ppo, &[(1.5f64).ln()], &inputs);
        assert!(close(out.loss, -1.5) && close(out.grad[0], -1.5), "{out:?}");
    }

    #[test]
    fn gradients_match_finite_differences() {
        let inputs = DatumInputs {
            weights: vec![0.7, -0.2, 1.0],
            sampling_lp: vec![-1.0, -0.4, -2.0],
            advantages: vec![0.9, -1.3, 0.4],
            ..Default::default()
        };
        let lp = [-1.1, -0.2, -2.5];
        for kind in [
            TokenLoss::CrossEntropy,
            TokenLoss::ImportanceSampling,
            TokenLoss::Ppo { low: 0.8, high: 1.2 },
            TokenLoss::Dro { beta: 0.3 },
        ] {
            let g = datum_loss(kind, &lp, &inputs).grad;
            for i in 0..3 {
                let h = 1e-6;
                let (mut up, mut down) = (lp, lp);
                up[i] += h;
                down[i] -= h;
                let fd = (datum_loss(kind, &up, &inputs).loss - datum_loss(kind, &down, &inputs).loss) / (2.0 * h);
                assert!((fd - g[i]).abs() < 1e-5, "{kind:?} token {i}: {fd} vs {}", g[i]);
            }
        }
    }

    #[test]
    fn zero_weights_and_advantages_train_nothing() {
        let inputs = DatumInputs { weights: vec![0.0, 0.5], advantages: vec![1.0, 0.0], ..Default::default() };
        let ce: Vec<bool> = (0..3).map(|i| trains(TokenLoss::CrossEntropy, &inputs, i)).collect();
        assert_eq!(ce, [false, true, false]);
        let rl: Vec<bool> = (0..2).map(|i| trains(TokenLoss::ImportanceSampling, &inputs, i)).collect();
        assert_eq!(rl, [true, false]);
        // And datum_loss agrees: those targets' gradients are 0 whatever their logprobs.
        let inputs = DatumInputs { sampling_lp: vec![-1.0; 2], ..inputs };
        assert_eq!(datum_loss(TokenLoss::ImportanceSampling, &[-0.5, -0.5], &inputs).grad[1], 0.0);
        assert_eq!(datum_loss(TokenLoss::CrossEntropy, &[-0.5, -0.5], &inputs).grad[0], 0.0);
    }

    #[test]
    fn dro_is_the_advantage_weighted_logprob_with_a_quadratic_pull_to_the_sampler() {
        let inputs = DatumInputs { sampling_lp: vec![-1.0, -2.0], advantages: vec![2.0, 0.0], ..Default::default() };
        let out = datum_loss(TokenLoss::Dro { beta: 0.5 }, &[-0.5, -3.0], &inputs);
        // -(-0.5 * 2 - 0.25 * 0.25) - (0 - 0.25 * 1) = 1.0625 + 0.25.
        assert!(close(out.loss, 1.3125), "{out:?}");
        // -A + beta * (lp - q): -2 + 0.25, 0 - 0.5.
        assert!(close(out.grad[0], -1.75) && close(out.grad[1], -0.5), "{out:?}");
        assert!(trains(TokenLoss::Dro { beta: 0.5 }, &inputs, 1), "the pull trains every position");
    }

    #[test]
    fn gspo_clips_the_sequence_ratio_of_the_masked_positions() {
        let gspo = TokenLoss::Gspo { low: 0.8, high: 1.2 };
        // Masked positions 1 and 2: log-ratios ln 1.1 and ln 1.1 (mean ln 1.1); position 0 is a
        // prompt position whose q of 0 must not count.
        let q = vec![0.0, -1.0, -2.0];
        let lp = vec![-5.0, (1.1f64).ln() - 1.0, (1.1f64).ln() - 2.0];
        let inputs = DatumInputs {
            sampling_lp: q.clone(),
            advantages: vec![0.0, 1.0, 2.0],
            ratio_mask: vec![0.0, 1.0, 1.0],
            ..Default::default()
        };
        let out = datum_loss(gspo, &lp, &inputs);
        // r = 1.1 inside the clip: -(1.1 * 1) - (1.1 * 2); gradients -A * r.
        assert!(close(out.loss, -3.3), "{out:?}");
        assert!(close(out.grad[0], 0.0) && close(out.grad[1], -1.1) && close(out.grad[2], -2.2), "{out:?}");
        // Without a mask, the positions with an advantage make the ratio: the same here.
        let unmasked = DatumInputs { ratio_mask: vec![], ..inputs.clone() };
        assert_eq!(datum_loss(gspo, &lp, &unmasked), out);
        // A ratio of 1.5 with A > 0 is clipped: no gradient.
        let far = vec![-5.0, (1.5f64).ln() - 1.0, (1.5f64).ln() - 2.0];
        let clipped = datum_loss(gspo, &far, &inputs);
        assert!(close(clipped.loss, -3.6) && clipped.grad.iter().all(|g| *g == 0.0), "{clipped:?}");
    }

    #[test]
    fn stable_reinforce_truncates_a_detached_weight_and_penalises_kl_where_trained() {
        let sr = TokenLoss::StableReinforce { kl_coeff: 0.1 };
        let q = vec![-1.0, -1.0, -1.0];
        // Ratios 1, 3 (truncated to 2) and 0.5 (no advantage: no term at all).
        let lp = vec![-1.0, (3.0f64).ln() - 1.0, (0.5f64).ln() - 1.0];
        let inputs = DatumInputs { sampling_lp: q, advantages: vec![1.0, -1.0, 0.0], ..Default::default() };
        let out = datum_loss(sr, &lp, &inputs);
        let k3 = |r: f64| (r - 1.0) - r.ln();
        // Weights 1 and 2 (truncated), advantages 1 and -1.
        let want = -lp[0] + 2.0 * lp[1] + 0.1 * (k3(1.0) + k3(3.0));
        assert!(close(out.loss, want), "{out:?} vs {want}");
        assert!(close(out.grad[0], -1.0) && close(out.grad[1], 2.0 + 0.1 * 2.0) && out.grad[2] == 0.0, "{out:?}");
    }

    #[test]
    fn names_configs_and_inputs_are_checked() {
        assert_eq!(TokenLoss::parse("cross_entropy", &[]), Ok(TokenLoss::CrossEntropy));
        assert_eq!(TokenLoss::parse("ppo", &[]), Ok(TokenLoss::Ppo { low: CLIP_LOW, high: CLIP_HIGH }));
        let cfg = vec![("clip_low_threshold".to_string(), 0.9), ("clip_high_threshold".to_string(), 1.1)];
        assert_eq!(TokenLoss::parse("cispo", &cfg), Ok(TokenLoss::Cispo { low: 0.9, high: 1.1 }));
        let e = TokenLoss::parse("kto", &[]).unwrap_err();
        assert!(e.contains("not served") && e.contains("stable_reinforce"), "{e}");
        assert_eq!(TokenLoss::parse("dro", &[]), Ok(TokenLoss::Dro { beta: DRO_BETA }));
        assert_eq!(TokenLoss::parse("gspo", &[]), Ok(TokenLoss::Gspo { low: GSPO_LOW, high: GSPO_HIGH }));
        let kl = [("kl_coeff".to_string(), 0.01)];
        assert_eq!(TokenLoss::parse("stable_reinforce", &kl), Ok(TokenLoss::StableReinforce { kl_coeff: 0.01 }));
        assert!(TokenLoss::parse("stable_reinforce", &[("beta".into(), 0.1)]).is_err());
        assert!(TokenLoss::parse("custom", &[]).unwrap_err().contains("forward_backward_custom"));
        assert!(TokenLoss::parse("ppo", &[("clip_low_threshold".into(), f64::NAN)]).is_err());
        assert!(TokenLoss::parse("ppo", &[("clip_low_threshold".into(), 1.5)]).is_err(), "low above high");
        assert!(TokenLoss::parse("ppo", &[("beta".into(), 0.1)]).is_err());
        assert!(TokenLoss::parse("cross_entropy", &cfg).is_err());

        let rl = TokenLoss::Ppo { low: 0.8, high: 1.2 };
        let ok = DatumInputs { sampling_lp: vec![-1.0; 2], advantages: vec![1.0; 2], ..Default::default() };
        assert!(check_inputs(rl, 2, &ok).is_ok());
        assert!(check_inputs(rl, 3, &ok).unwrap_err().contains("2 values for 3"));
        let no_adv = DatumInputs { advantages: vec![], ..ok.clone() };
        assert!(check_inputs(rl, 2, &no_adv).unwrap_err().contains("advantages"));
        let nan = DatumInputs { advantages: vec![1.0, f64::NAN], ..ok };
        assert!(check_inputs(rl, 2, &nan).unwrap_err().contains("NaN at position 1"));
        assert!(check_inputs(TokenLoss::CrossEntropy, 2, &DatumInputs::default()).unwrap_err().contains("weights"));
        // Per-token thresholds that cross each other, or the call's, are refused (issue 50: a
        // clamp with min > max panicked on them).
        let ok = DatumInputs { sampling_lp: vec![-1.0; 2], advantages: vec![1.0; 2], ..Default::default() };
        let crossed = DatumInputs { clip_low: vec![0.9, 1.5], ..ok.clone() };
        assert!(check_inputs(rl, 2, &crossed).unwrap_err().contains("position 1"));
        let crossed = DatumInputs { clip_low: vec![0.5, 0.5], clip_high: vec![1.5, 0.4], ..ok.clone() };
        assert!(check_inputs(TokenLoss::Cispo { low: 0.8, high: 1.2 }, 2, &crossed).is_err());
        // And the math itself has no panic path, whatever the bounds.
        let _ = crate::loss::ppo_term(1.0, 1.0, 2.0, 0.5);
        let _ = crate::loss::cispo_term(1.0, 1.0, -1.0, f64::NAN, 0.5);
    }
}
