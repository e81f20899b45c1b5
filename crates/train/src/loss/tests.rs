use super::*;

fn tok(new_lp: f64, old_lp: f64, advantage: f64, weight: f64, segment: usize) -> TokenInput {
    TokenInput { new_lp, old_lp, original_lp: f64::NAN, advantage, weight, segment, ref_lp: f64::NAN }
}

fn cfg(kind: LossKind, epsilon: f64, epsilon_high: f64) -> LossConfig {
    LossConfig {
        kind,
        epsilon,
        epsilon_high,
        level: ImportanceSamplingLevel::Token,
        max_ratio: None,
        mask_prob_ratio: false,
        k2_tau: None,
        truncated_is: None,
        kl: None,
    }
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-6, "{a} != {b}");
}

#[test]
fn ppo_token_level_by_hand() {
    // r = e^0.1 in range; e^0.5 clipped at 1.2 with A > 0 (no gradient); e^-0.5 below 0.8 with
    // A < 0 (clipped term is the min: no gradient); e^1 with A < 0 (unclipped is the min).
    let t = [
        tok(-1.0, -1.1, 1.0, 1.0, 0),
        tok(-0.5, -1.0, 1.0, 1.0, 1),
        tok(-2.0, -1.5, -1.0, 1.0, 2),
        tok(-0.2, -1.2, -1.0, 1.0, 3),
    ];
    let out = policy_loss(&t, &cfg(LossKind::Ppo, 0.2, 0.2));
    let e = std::f64::consts::E;
    close(out.loss, (-1.1051709 - 1.2 + 0.8 + e) / 4.0);
    let want = [-1.1051709 / 4.0, 0.0, 0.0, e / 4.0];
    for (g, w) in out.grad.iter().zip(want) {
        close(*g, w);
    }
    close(out.clip_low, 0.25);
    close(out.clip_high, 0.5);
}

#[test]
fn cispo_by_hand_with_weights_and_on_policy_tokens() {
    // Clip range [0, 5]: e^0.5 passes, e^1.9 = 6.69 is clipped to 5; ratio detached.
    let t = [tok(-1.0, -1.5, 2.0, 0.5, 0), tok(-0.1, -2.0, -1.0, 1.5, 0)];
    let out = policy_loss(&t, &cfg(LossKind::Cispo, 1.0, 4.0));
    close(out.loss, (1.6487213 * 2.0 * 0.5 - 5.0 * 0.1 * 1.5) / 2.0);
    close(out.grad[0], -1.6487213 * 2.0 * 0.5 / 2.0);
    close(out.grad[1], 5.0 * 1.5 / 2.0);
    // A missing old logprob is on-policy: ratio 1.
    let out = policy_loss(&[tok(-1.0, f64::NAN, 1.0, 1.0, 0)], &cfg(LossKind::Cispo, 1.0, 4.0));
    close(out.loss, 1.0);
    close(out.grad[0], -1.0);
    close(out.mean_ratio, 1.0);
}

#[test]
fn sequence_level_ratio_spreads_over_the_segment() {
    // d = 0.2, 0.4 -> r = e^0.3 for both; L = -e^0.3, dL/dd_i = -0.5 e^0.3.
    let mut c = cfg(LossKind::Ppo, 0.2, 0.4);
    c.level = ImportanceSamplingLevel::Sequence;
    let out = policy_loss(&[tok(-1.0, -1.2, 1.0, 1.0, 0), tok(-1.0, -1.4, 1.0, 1.0, 0)], &c);
    close(out.loss, -(0.3f64).exp());
    close(out.grad[0], -0.5 * (0.3f64).exp());
    close(out.grad[1], -0.5 * (0.3f64).exp());
}

#[test]
fn ratio_cap_mask_k2_tau_and_truncated_is() {
    let one = |c: &LossConfig, t: TokenInput| policy_loss(&[t], c);
    // Cap: r = e^1 -> 1.5, no gradient through r (CISPO's gradient is the direct term).
    let mut c = cfg(LossKind::Cispo, 1.0, 4.0);
    c.max_ratio = Some(1.5);
    let out = one(&c, tok(-1.0, -2.0, 1.0, 1.0, 0));
    close(out.grad[0], -1.5);
    // Mask: PPO with r = e^0.5 outside (0.8, 1.2) -> r = 0 -> loss -min(0, 0.8) = 0, no gradient.
    let mut c = cfg(LossKind::Ppo, 0.2, 0.2);
    c.mask_prob_ratio = true;
    let out = one(&c, tok(-0.5, -1.0, 1.0, 1.0, 0));
    close(out.loss, 0.0);
    close(out.grad[0], 0.0);
    // k2 tau: A' = 1 - 0.1 * 0.5 = 0.95; PPO in range: l = -e^0.5 * 0.95 (tau term detached).
    let mut c = cfg(LossKind::Ppo, 1.0, 1.0);
    c.k2_tau = Some(0.1);
    let out = one(&c, tok(-0.5, -1.0, 1.0, 1.0, 0));
    close(out.loss, -(0.5f64).exp() * 0.95);
    close(out.grad[0], -(0.5f64).exp() * 0.95);
    // Truncated IS: min(exp(-1 - -2), 2) = 2 multiplies the loss and its gradient.
    let mut c = cfg(LossKind::Cispo, 1.0, 4.0);
    c.truncated_is = Some(2.0);
    let mut t = tok(-1.0, -1.0, 1.0, 1.0, 0);
    t.original_lp = -2.0;
    let out = one(&c, t);
    close(out.loss, 2.0);
    close(out.grad[0], -2.0);
    // Clamped log-ratio: d = 25 -> 20, and no gradient through it.
    let out = one(&cfg(LossKind::Ppo, 1e9, 1e9), tok(0.0, -25.0, -1.0, 1.0, 0));
    assert!((out.loss / (20.0f64).exp() - 1.0).abs() < 1e-12);
    close(out.grad[0], 0.0);
}

/// PPO's gradient (which flows through the ratio) against central finite differences of the
/// loss, for every importance-sampling level, away from the clip boundaries.
#[test]
fn ppo_gradient_matches_finite_differences() {
    let base = [
        tok(-1.0, -1.05, 0.7, 1.2, 0),
        tok(-0.3, -0.28, -0.4, 0.8, 0),
        tok(-2.0, -2.1, 1.1, 1.0, 0),
        tok(-0.9, -0.8, -1.3, 0.6, 1),
        tok(-1.4, -1.5, 0.5, 1.4, 1),
    ];
    for level in [
        ImportanceSamplingLevel::Token,
        ImportanceSamplingLevel::Sequence,
        ImportanceSamplingLevel::Average,
        ImportanceSamplingLevel::GeometricAverage,
    ] {
        let mut c = cfg(LossKind::Ppo, 0.3, 0.4);
        c.level = level;
        let out = policy_loss(&base, &c);
        for i in 0..base.len() {
            let h = 1e-6;
            let (mut up, mut down) = (base, base);
            up[i].new_lp += h;
            down[i].new_lp -= h;
            let fd = (policy_loss(&up, &c).loss - policy_loss(&down, &c).loss) / (2.0 * h);
            assert!((fd - out.grad[i]).abs() < 1e-6, "{level:?} token {i}: fd {fd} vs {}", out.grad[i]);
        }
    }
}

#[test]
fn parts_of_a_row_sum_to_the_row() {
    let t = [
        tok(-1.0, -1.2, 1.0, 1.0, 0),
        tok(-1.0, -1.4, 1.0, 0.5, 0),
        tok(-2.0, -1.5, -1.0, 2.0, 1),
        tok(-0.3, -0.2, 0.4, 1.0, 2),
    ];
    let mut c = cfg(LossKind::Ppo, 0.2, 0.3);
    c.level = ImportanceSamplingLevel::Sequence;
    let whole = policy_loss(&t, &c);
    // Segments {0} and {1, 2}, renumbered from 0 within each part.
    let a = policy_loss_part(&t[..2], &c, 4, 0.0);
    let mut rest = [t[2], t[3]];
    rest[0].segment = 0;
    rest[1].segment = 1;
    let b = policy_loss_part(&rest, &c, 4, 0.0);
    close(a.loss + b.loss, whole.loss);
    for (g, w) in a.grad.iter().chain(&b.grad).zip(&whole.grad) {
        close(*g, *w);
    }
}

#[test]
fn kl_penalty_moves_advantages_by_hand() {
    // Sample source: kl = old - ref = (0.5, -0.5, and for the NaN old logprob new - ref = 0.0),
    // mean 0; coef 0.2 shifts A by 0.2 * (0 - kl) = (-0.1, +0.1, 0). CISPO at ratio 1 (clip
    // range [0, 5]): dL/d new = -A * w / N.
    let mut t = [tok(-1.0, -1.0, 1.0, 1.0, 0), tok(-2.0, -2.0, 1.0, 1.0, 0), tok(-1.5, f64::NAN, -1.0, 1.0, 0)];
    for x in &mut t {
        x.ref_lp = -1.5;
    }
    let mut c = cfg(LossKind::Cispo, 1.0, 4.0);
    c.kl = Some((0.2, KlSource::Sample));
    close(kl_mean(&t, KlSource::Sample), 0.0);
    let out = policy_loss(&t, &c);
    let want = [-0.9 / 3.0, -1.1 / 3.0, 1.0 / 3.0];
    for (g, w) in out.grad.iter().zip(want) {
        close(*g, w);
    }
    // Current learner: kl = new - ref = (0.5, -0.5, 0) here too, since new == old.
    c.kl = Some((0.2, KlSource::CurrentLearner));
    let same = policy_loss(&t, &c);
    for (g, w) in same.grad.iter().zip(want) {
        close(*g, w);
    }
    // A learner that moved away from the reference on the first token only: kl = (1.0, -0.5, 0),
    // mean 1/6; the first token loses 0.2 * (1/6 - 1) of advantage.
    t[0].new_lp = -0.5;
    close(kl_mean(&t, KlSource::CurrentLearner), 1.0 / 6.0);
    let moved = policy_loss(&t, &c);
    let a0 = 1.0 + 0.2 * (1.0 / 6.0 - 1.0);
    // r = e^0.5 for the first token, inside [0, 5]: dL/d new = -r * A / N.
    close(moved.grad[0], -(0.5f64).exp() * a0 / 3.0);
    close(moved.grad[1], -(1.0 + 0.2 * (1.0 / 6.0 + 0.5)) / 3.0);
}

#[test]
fn kl_penalty_parts_use_the_row_mean() {
    let mut t = [tok(-1.0, -1.2, 1.0, 1.0, 0), tok(-1.0, -1.4, 1.0, 0.5, 0), tok(-2.0, -1.5, -1.0, 2.0, 1)];
    for (x, r) in t.iter_mut().zip([-1.0, -2.0, -0.5]) {
        x.ref_lp = r;
    }
    let mut c = cfg(LossKind::Ppo, 0.2, 0.3);
    c.kl = Some((0.5, KlSource::Sample));
    let whole = policy_loss(&t, &c);
    let row_kl = kl_mean(&t, KlSource::Sample);
    let a = policy_loss_part(&t[..2], &c, 3, row_kl);
    let mut rest = [t[2]];
    rest[0].segment = 0;
    let b = policy_loss_part(&rest, &c, 3, row_kl);
    close(a.loss + b.loss, whole.loss);
    for (g, w) in a.grad.iter().chain(&b.grad).zip(&whole.grad) {
        close(*g, *w);
    }
}

#[test]
fn behaviour_kl_by_hand() {
    // r = e^0.5: e^0.5 - 1 - 0.5; r = 1: 0; unknown old logprob: not counted.
    let t = [tok(-0.5, -1.0, 1.0, 1.0, 0), tok(-1.0, -1.0, 1.0, 1.0, 0), tok(-1.0, f64::NAN, 1.0, 1.0, 0)];
    let (sum, n) = behaviour_kl(&t);
    assert_eq!(n, 2);
    close(sum, 0.5f64.exp() - 1.5);
}

#[test]
fn sft_loss_is_the_token_mean_cross_entropy() {
    // A batch of 4 trained tokens processed in two parts: the shares add up.
    let (a, ga) = sft_loss_part(&[-1.0, -2.0], 4);
    let (b, gb) = sft_loss_part(&[-0.5, -0.5], 4);
    close(a + b, 1.0);
    assert_eq!(ga, vec![-0.25, -0.25]);
    assert_eq!(gb.len(), 2);
}
