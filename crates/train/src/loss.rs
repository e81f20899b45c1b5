//! The policy loss of one packed sequence and its gradient with respect to each trained token's
//! new log-probability, as ART's `loss_fn` defines it (contract §3).
//!
//! The model only ever needs `dL/d new_lp` per token: autograd then takes it through the network
//! as the gradient of the surrogate `sum(g_t * new_lp_t)`. Keeping the loss here, on plain
//! numbers, lets every knob be checked against hand-computed values and finite differences.

use tandem_core::train_config::{ImportanceSamplingLevel, KlSource, LossKind, TrainConfig};

/// The loss's settings, resolved from the job's `TrainConfig`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossConfig {
    pub kind: LossKind,
    pub epsilon: f64,
    pub epsilon_high: f64,
    pub level: ImportanceSamplingLevel,
    /// `max_negative_advantage_importance_sampling_weight`: r <- min(r, m) when set and non-zero.
    pub max_ratio: Option<f64>,
    pub mask_prob_ratio: bool,
    /// `variant_k2_tau`: A <- A - tau * d (d detached).
    pub k2_tau: Option<f64>,
    /// `truncated_importance_sampling` U: loss x min(exp(old - original), U), detached; applies
    /// only where the sampler's original logprob is known (with `precalculate_logprobs`).
    pub truncated_is: Option<f64>,
    /// The KL penalty's coefficient and source (`kl_penalty_coef > 0`); tokens then carry
    /// `ref_lp`, and the row's mean KL term is passed to [`policy_loss_part`].
    pub kl: Option<(f64, KlSource)>,
}

impl LossConfig {
    pub fn from_train(c: &TrainConfig) -> Self {
        LossConfig {
            kind: c.loss,
            epsilon: c.epsilon,
            epsilon_high: c.epsilon_high,
            level: c.importance_sampling_level,
            max_ratio: c.max_negative_advantage_importance_sampling_weight.filter(|m| *m != 0.0),
            mask_prob_ratio: c.mask_prob_ratio,
            k2_tau: c.variant_k2_tau,
            truncated_is: c.truncated_importance_sampling,
            kl: c.kl_penalty.as_ref().map(|k| (k.coef, k.source)),
        }
    }
}

/// One trained token of a packed sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenInput {
    /// Log-probability under the weights being trained.
    pub new_lp: f64,
    /// The behaviour logprob the ratio is taken against; NaN or infinite means "on-policy"
    /// (ratio 1, as ART sets it to `new_lp.detach()`).
    pub old_lp: f64,
    /// The sampler's logprob when `old_lp` was recomputed (`precalculate_logprobs`), else NaN.
    pub original_lp: f64,
    pub advantage: f64,
    pub weight: f64,
    /// Which trajectory sequence of the row the token belongs to (for sequence-level ratios).
    pub segment: usize,
    /// The reference policy's logprob of the token, for the KL penalty (else NaN).
    pub ref_lp: f64,
}

/// Supervised fine-tuning's loss over one batch: the mean cross-entropy of its `n` trained
/// tokens (ART's token mean, so longer examples weigh more), `-sum(lp) / n`, and its gradient
/// per token, `-1 / n`, for a share `new_lp` of those tokens.
pub fn sft_loss_part(new_lp: &[f64], n: usize) -> (f64, Vec<f64>) {
    let n = n.max(1) as f64;
    (-new_lp.iter().sum::<f64>() / n, vec![-1.0 / n; new_lp.len()])
}

/// A token's KL term, `src - ref` (ART's `kl_t`): the source is the sampler's logprob (the
/// learner's where the sampler's is unknown) or the learner's own, detached either way.
pub fn kl_term(t: &TokenInput, source: KlSource) -> f64 {
    let src = match source {
        KlSource::Sample if t.old_lp.is_finite() => t.old_lp,
        _ => t.new_lp,
    };
    src - t.ref_lp
}

/// The k3 estimate of KL(sampler || learner) over tokens whose sampler logprob is known:
/// `(r - 1) - ln r` with `r = exp(new - old)`, summed, and the count (the `kl_div` metric).
pub fn behaviour_kl(tokens: &[TokenInput]) -> (f64, usize) {
    tokens.iter().filter(|t| t.old_lp.is_finite()).fold((0.0, 0), |(s, n), t| {
        let log_r = (t.new_lp - t.old_lp).clamp(-20.0, 20.0);
        (s + log_r.exp() - 1.0 - log_r, n + 1)
    })
}

/// The mean KL term over a row's trained tokens (ART's `kl_policy_ref`); 0 for no tokens.
pub fn kl_mean<'a>(tokens: impl IntoIterator<Item = &'a TokenInput>, source: KlSource) -> f64 {
    let (sum, n) = tokens.into_iter().fold((0.0, 0usize), |(s, n), t| (s + kl_term(t, source), n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// The loss of a row, its gradient per token, and diagnostics.
#[derive(Debug, Clone, PartialEq)]
pub struct LossOutput {
    pub loss: f64,
    /// dL / d new_lp, per token in input order.
    pub grad: Vec<f64>,
    /// Fraction of tokens whose ratio is below 1 - epsilon / above 1 + epsilon_high.
    pub clip_low: f64,
    pub clip_high: f64,
    pub mean_ratio: f64,
}

/// How a token's ratio depends on the log-ratio `d` of its own token and, for sequence-level
/// variants, on the mean `d` of its segment.
fn ratio(level: ImportanceSamplingLevel, d: f64, seg_mean: f64) -> (f64, f64, f64) {
    let (rt, rs) = (d.exp(), seg_mean.exp());
    // (r, dr/d d_own, dr/d mean_d)
    match level {
        ImportanceSamplingLevel::Token => (rt, rt, 0.0),
        ImportanceSamplingLevel::Sequence => (rs, 0.0, rs),
        ImportanceSamplingLevel::Average => ((rt + rs) / 2.0, rt / 2.0, rs / 2.0),
        ImportanceSamplingLevel::GeometricAverage => {
            let r = (rt * rs).sqrt();
            (r, r / 2.0, r / 2.0)
        }
    }
}

/// `L = sum(l_t * w_t) / (N + 1e-18)` over the row's `N` trained tokens, and `dL/d new_lp`.
pub fn policy_loss(tokens: &[TokenInput], cfg: &LossConfig) -> LossOutput {
    let kl = cfg.kl.map_or(0.0, |(_, source)| kl_mean(tokens, source));
    policy_loss_part(tokens, cfg, tokens.len(), kl)
}

/// The share of a row's loss (and its gradient) that comes from `tokens`, a set of whole
/// segments of a row with `row_tokens` trained tokens in all. Every token's term depends only
/// on its own segment, so the parts of a row sum to [`policy_loss`] of the whole row: a long row
/// can be processed in parts of bounded memory. `row_kl` is [`kl_mean`] over the whole row (the
/// KL penalty shifts each advantage by `coef * (row_kl - kl_t)`), unused without a penalty.
pub fn policy_loss_part(tokens: &[TokenInput], cfg: &LossConfig, row_tokens: usize, row_kl: f64) -> LossOutput {
    let n = tokens.len();
    let denom = row_tokens as f64 + 1e-18;
    let (lo, hi) = (1.0 - cfg.epsilon, 1.0 + cfg.epsilon_high);
    // d = clamp(new - old, +-20); its derivative is 0 where clamped.
    let (d, dd): (Vec<f64>, Vec<f64>) = tokens
        .iter()
        .map(|t| {
            if !t.old_lp.is_finite() {
                (0.0, 1.0)
            } else {
                let raw = t.new_lp - t.old_lp;
                (raw.clamp(-20.0, 20.0), if raw.abs() < 20.0 { 1.0 } else { 0.0 })
            }
        })
        .unzip();
    let segments = tokens.iter().map(|t| t.segment + 1).max().unwrap_or(0);
    let (mut seg_sum, mut seg_n) = (vec![0.0; segments], vec![0usize; segments]);
    for (t, d) in tokens.iter().zip(&d) {
        seg_sum[t.segment] += d;
        seg_n[t.segment] += 1;
    }
    let seg_mean: Vec<f64> = seg_sum.iter().zip(&seg_n).map(|(s, c)| s / (*c).max(1) as f64).collect();

    let mut loss = 0.0;
    let mut grad = vec![0.0; n];
    // dL/d r_t times dr_t/d mean_d, summed per segment (spread back over the segment's tokens).
    let mut seg_grad = vec![0.0; segments];
    let (mut clip_low, mut clip_high, mut ratio_sum) = (0usize, 0usize, 0.0);
    for (i, t) in tokens.iter().enumerate() {
        let (mut r, mut dr_own, mut dr_mean) = ratio(cfg.level, d[i], seg_mean[t.segment]);
        ratio_sum += r;
        if r < lo {
            clip_low += 1;
        } else if r > hi {
            clip_high += 1;
        }
        if let Some(m) = cfg.max_ratio {
            if r > m {
                (r, dr_own, dr_mean) = (m, 0.0, 0.0);
            }
        }
        if cfg.mask_prob_ratio && !(r > lo && r < hi) {
            (r, dr_own, dr_mean) = (0.0, 0.0, 0.0);
        }
        // Both shapings use detached quantities: they move the advantage, not the gradient path.
        let a = t.advantage - cfg.k2_tau.map_or(0.0, |tau| tau * d[i])
            + cfg.kl.map_or(0.0, |(coef, source)| coef * (row_kl - kl_term(t, source)));
        let tis = match cfg.truncated_is {
            Some(u) if t.original_lp.is_finite() && t.old_lp.is_finite() => (t.old_lp - t.original_lp).exp().min(u),
            _ => 1.0,
        };
        let scale = t.weight * tis / denom;
        match cfg.kind {
            LossKind::Ppo => {
                let (l, dl_dr) = ppo_term(r, a, lo, hi);
                loss += l * scale;
                let g = dl_dr * scale;
                grad[i] += g * dr_own * dd[i];
                seg_grad[t.segment] += g * dr_mean;
            }
            LossKind::Cispo => {
                let (l, g) = cispo_term(r, a, t.new_lp, lo, hi);
                loss += l * scale;
                grad[i] += g * scale;
            }
        }
    }
    for (i, t) in tokens.iter().enumerate() {
        grad[i] += seg_grad[t.segment] / seg_n[t.segment] as f64 * dd[i];
    }
    let nf = n.max(1) as f64;
    LossOutput {
        loss,
        grad,
        clip_low: clip_low as f64 / nf,
        clip_high: clip_high as f64 / nf,
        mean_ratio: if n == 0 { 1.0 } else { ratio_sum / nf },
    }
}

/// PPO's term of one token with ratio `r` and advantage `a`, `-min(r a, clip(r, lo, hi) a)`,
/// and its derivative in `r`: the gradient flows through `r` where the unclipped term is the
/// minimum, or where clipping does not bite (both terms then agree).
pub fn ppo_term(r: f64, a: f64, lo: f64, hi: f64) -> (f64, f64) {
    // max/min, not clamp: bounds from a client (even crossed or NaN ones, refused earlier) can
    // never panic here.
    let (unclipped, clipped) = (r * a, r.max(lo).min(hi) * a);
    let dl_dr = if unclipped <= clipped || (lo..=hi).contains(&r) { -a } else { 0.0 };
    (-unclipped.min(clipped), dl_dr)
}

/// CISPO's term of one token, `-sg(clip(r, lo, hi)) a lp`, and its derivative in `lp` (the
/// clipped ratio is a constant to the gradient).
pub fn cispo_term(r: f64, a: f64, lp: f64, lo: f64, hi: f64) -> (f64, f64) {
    let c = r.max(lo).min(hi);
    (-c * a * lp, -c * a)
}

#[cfg(test)]
mod tests;
