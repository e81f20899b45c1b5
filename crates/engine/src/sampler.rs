//! Turning logits into the next token: pure functions over a logits vector, in vLLM's order
//! (constraints and bias, penalties, then temperature, min-p, top-k, top-p and a seeded draw).

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tandem_core::inference::{LogitsProcessor, SamplingParams};

/// What the sequence has produced so far, for penalties and constraints.
pub struct History<'a> {
    pub prompt: &'a [u32],
    pub generated: &'a [u32],
}

/// Masks, biases and penalties, applied in place to raw logits.
/// `ends` are the tokens that end generation as EOS does (`TextTokenizer::end_ids`).
pub fn process(logits: &mut [f32], p: &SamplingParams, h: &History<'_>, ends: &[u32]) {
    let banned = f32::NEG_INFINITY;
    if let Some(allowed) = &p.allowed_token_ids {
        // Sorted and deduplicated at validation: one walk alongside the logits, no allocation.
        let mut next = allowed.iter().copied().peekable();
        for (id, l) in logits.iter_mut().enumerate() {
            while next.next_if(|t| (*t as usize) < id).is_some() {}
            if next.next_if_eq(&(id as u32)).is_none() {
                *l = banned;
            }
        }
    }
    // min_tokens: no EOS and no stop token before enough tokens exist.
    if h.generated.len() < p.min_tokens {
        if !p.ignore_eos {
            ends.iter().for_each(|e| ban(logits, *e));
        }
        for t in &p.stop_token_ids {
            ban(logits, *t);
        }
    }
    for word in &p.bad_words {
        let (last, prefix) = word.split_last().expect("bad words are non-empty");
        if h.generated.ends_with(prefix) {
            ban(logits, *last);
        }
    }
    for proc in &p.processors {
        apply_processor(logits, proc, h);
    }
    for (t, bias) in &p.logit_bias {
        if let Some(l) = logits.get_mut(*t as usize) {
            *l += bias.clamp(-100.0, 100.0);
        }
    }
    if p.repetition_penalty != 1.0 {
        let mut seen = vec![false; logits.len()];
        for t in h.prompt.iter().chain(h.generated) {
            if let Some(s) = seen.get_mut(*t as usize) {
                *s = true;
            }
        }
        for (l, s) in logits.iter_mut().zip(seen) {
            if s {
                *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
            }
        }
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        let mut counts = std::collections::HashMap::<u32, u32>::new();
        for t in h.generated {
            *counts.entry(*t).or_default() += 1;
        }
        for (t, c) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= p.frequency_penalty * c as f32 + p.presence_penalty;
            }
        }
    }
}

fn apply_processor(logits: &mut [f32], proc: &LogitsProcessor, h: &History<'_>) {
    match proc {
        LogitsProcessor::SuppressTokens { token_ids } => {
            for t in token_ids {
                ban(logits, *t);
            }
        }
        LogitsProcessor::NoRepeatNgram { n } => {
            let n = *n;
            let all: Vec<u32> = h.prompt.iter().chain(h.generated).copied().collect();
            if n == 0 || all.len() < n {
                return;
            }
            // The last n-1 tokens, followed by any token that followed them before, would repeat.
            let tail = &all[all.len() + 1 - n..];
            for w in all.windows(n) {
                if &w[..n - 1] == tail {
                    ban(logits, w[n - 1]);
                }
            }
        }
    }
}

fn ban(logits: &mut [f32], t: u32) {
    if let Some(l) = logits.get_mut(t as usize) {
        *l = f32::NEG_INFINITY;
    }
}

/// Picks the next token from processed logits: candidates in order of logit, best first (ties
/// by id, so the order is deterministic), truncated by min-p, top-k and top-p, then the token
/// where a uniform draw over their probabilities falls. Only the best candidates are sorted at
/// first ([`HEAD`]): the walk almost always ends among them, and sorting a whole vocabulary was
/// a tenth of a decode step. When a truncation or the draw reaches past them, the rest are
/// sorted too and the pick is made again with the same draw.
pub fn sample(logits: &[f32], p: &SamplingParams, rng: &mut ChaCha8Rng) -> u32 {
    if p.is_greedy() {
        return argmax(logits);
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).filter(|i| logits[*i as usize] > f32::NEG_INFINITY).collect();
    if idx.is_empty() {
        return argmax(logits);
    }
    let draw = rng.random::<f64>();
    let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    if idx.len() > HEAD {
        idx.select_nth_unstable_by(HEAD - 1, cmp);
        idx[..HEAD].sort_unstable_by(cmp);
        if let Some(t) = pick(logits, &idx, HEAD, p, draw) {
            return t;
        }
        idx[HEAD..].sort_unstable_by(cmp);
    } else {
        idx.sort_unstable_by(cmp);
    }
    pick(logits, &idx, idx.len(), p, draw).unwrap_or_else(|| argmax(logits))
}

/// Candidates sorted before the rest (see [`sample`]).
const HEAD: usize = 256;

/// The pick of [`sample`] over candidates whose first `sorted` are in order; `None` when it
/// would depend on the order of the others.
fn pick(logits: &[f32], idx: &[u32], sorted: usize, p: &SamplingParams, draw: f64) -> Option<u32> {
    let max = logits[idx[0] as usize];
    let probs: Vec<f64> = idx.iter().map(|i| (((logits[*i as usize] - max) / p.temperature) as f64).exp()).collect();
    let mut n = probs.len();
    // min-p: drop tokens below min_p times the top probability.
    if p.min_p > 0.0 {
        let keep = probs.iter().take_while(|q| **q >= p.min_p as f64 * probs[0]).count().max(1);
        if keep >= sorted && sorted < n {
            return None;
        }
        n = keep;
    }
    if p.top_k > 0 {
        n = n.min(p.top_k.max(1));
    }
    // The kept set is the best `n`: known when they are all sorted, or when all are kept.
    if sorted < n && n < probs.len() {
        return None;
    }
    let ordered = |i: usize| i < sorted || sorted == probs.len();
    if p.top_p < 1.0 {
        let total: f64 = probs[..n].iter().sum();
        let mut acc = 0.0;
        let mut keep = n;
        for (i, q) in probs[..n].iter().enumerate() {
            if !ordered(i) {
                return None;
            }
            acc += q / total;
            if acc >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        n = keep.max(1);
    }
    let total: f64 = probs[..n].iter().sum();
    let mut u = draw * total;
    for (i, q) in probs[..n].iter().enumerate() {
        if !ordered(i) {
            return None;
        }
        u -= q;
        if u < 0.0 {
            return Some(idx[i]);
        }
    }
    ordered(n - 1).then(|| idx[n - 1])
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, l) in logits.iter().enumerate() {
        if *l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// log-softmax of raw logits: returns the log normaliser, so `logprob(t) = logit[t] - lse`
/// (the trainer's head computes the same number: `tandem_model::as_served::log_normalizer`).
pub fn log_normalizer(logits: &[f32]) -> f32 {
    tandem_model::as_served::log_normalizer(logits)
}

/// `k` independent draws, with replacement, from softmax(logits / temperature) over the whole
/// vocabulary (no truncation: Tinker's alternative prompt tokens are the model's own
/// distribution); temperature 0 gives the most likely token `k` times. One cumulative sum, then
/// a binary search a draw.
pub fn draws(logits: &[f32], k: usize, temperature: f32, rng: &mut ChaCha8Rng) -> Vec<u32> {
    if k == 0 || logits.is_empty() {
        return Vec::new();
    }
    if temperature <= 0.0 {
        return vec![argmax(logits); k];
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut acc = 0.0f64;
    let cumulative: Vec<f64> = logits
        .iter()
        .map(|l| {
            acc += (((l - max) / temperature) as f64).exp();
            acc
        })
        .collect();
    (0..k)
        .map(|_| {
            let u = rng.random::<f64>() * acc;
            // The first token whose cumulative mass passes the draw (a zero-mass token never is).
            cumulative.partition_point(|c| *c <= u).min(logits.len() - 1) as u32
        })
        .collect()
}

/// The `k` largest raw logits' ids, best first (ties by id).
pub fn top_k_ids(logits: &[f32], k: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(idx.len());
    let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    idx.select_nth_unstable_by(k - 1, cmp);
    idx.truncate(k);
    idx.sort_unstable_by(cmp);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn params() -> SamplingParams {
        SamplingParams { max_tokens: 10, ..Default::default() }
    }

    #[test]
    fn draws_follow_the_tempered_distribution() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        // ln 1, ln 3, -inf: probabilities 1/4, 3/4, 0 at temperature 1.
        let logits = [0.0, 3f32.ln(), f32::NEG_INFINITY];
        let d = draws(&logits, 40_000, 1.0, &mut rng);
        let ones = d.iter().filter(|t| **t == 1).count() as f64 / d.len() as f64;
        assert!((ones - 0.75).abs() < 0.01, "{ones}");
        assert!(d.iter().all(|t| *t < 2), "a token of zero probability is never drawn");
        // Temperature 2 flattens to sqrt(1):sqrt(3), so 1/(1+sqrt 3) = 0.366 for token 0.
        let d = draws(&logits, 40_000, 2.0, &mut rng);
        let zeros = d.iter().filter(|t| **t == 0).count() as f64 / d.len() as f64;
        assert!((zeros - 0.366).abs() < 0.01, "{zeros}");
        assert_eq!(draws(&logits, 3, 0.0, &mut rng), vec![1, 1, 1]);
        assert!(draws(&logits, 0, 1.0, &mut rng).is_empty());
    }

    fn no_history() -> History<'static> {
        History { prompt: &[], generated: &[] }
    }

    #[test]
    fn greedy_is_argmax() {
        let p = SamplingParams { temperature: 0.0, ..params() };
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(sample(&[0.1, 2.0, 1.9], &p, &mut rng), 1);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let logits = [1.0, 3.0, 2.9, 0.0];
        for _ in 0..50 {
            assert_eq!(sample(&logits, &SamplingParams { top_k: 1, ..params() }, &mut rng), 1);
            assert_eq!(sample(&logits, &SamplingParams { top_p: 0.01, ..params() }, &mut rng), 1);
        }
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_probabilities() {
        let logits = [0.0, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let p = params();
        let draw = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..4000).map(|_| sample(&logits, &p, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let ones = draw(7).iter().filter(|t| **t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
    }

    #[test]
    fn sorting_the_best_first_picks_what_a_full_sort_picks() {
        // The reference: every candidate sorted, then the same truncations and walk.
        fn full(logits: &[f32], p: &SamplingParams, draw: f64) -> u32 {
            let mut idx: Vec<u32> =
                (0..logits.len() as u32).filter(|i| logits[*i as usize] > f32::NEG_INFINITY).collect();
            idx.sort_unstable_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b)));
            super::pick(logits, &idx, idx.len(), p, draw).unwrap()
        }
        let mut gen = ChaCha8Rng::seed_from_u64(5);
        // A vocabulary's worth of logits, peaked (the walk ends in the head) and flat (it does not).
        for spread in [8.0f32, 0.05] {
            let logits: Vec<f32> = (0..50_000).map(|_| gen.random::<f32>() * spread).collect();
            for p in [
                params(),
                SamplingParams { min_p: 0.5, ..params() },
                SamplingParams { top_k: 40, ..params() },
                SamplingParams { top_k: 1000, ..params() },
                SamplingParams { top_p: 0.9, ..params() },
                SamplingParams { temperature: 0.3, top_p: 0.5, ..params() },
            ] {
                for seed in 0..40 {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed);
                    let draw = ChaCha8Rng::seed_from_u64(seed).random::<f64>();
                    assert_eq!(
                        sample(&logits, &p, &mut rng),
                        full(&logits, &p, draw),
                        "spread {spread} seed {seed} {p:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // probs ∝ 1, 0.5, 0.01: min_p 0.1 keeps the first two only
        let logits = [0.0, (0.5f32).ln(), (0.01f32).ln()];
        let p = SamplingParams { min_p: 0.1, ..params() };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        assert!((0..2000).all(|_| sample(&logits, &p, &mut rng) != 2));
    }

    #[test]
    fn penalties_by_hand() {
        let mut logits = vec![2.0, -2.0, 1.0, 1.0];
        let p = SamplingParams { repetition_penalty: 2.0, frequency_penalty: 0.5, presence_penalty: 0.25, ..params() };
        let h = History { prompt: &[0], generated: &[1, 2, 2] };
        process(&mut logits, &p, &h, &[99]);
        // token 0: in prompt -> 2/2 = 1; no output count
        // token 1: -2*2 = -4, then -0.5*1 - 0.25 = -4.75
        // token 2: 1/2 = 0.5, then -0.5*2 - 0.25 = -0.75
        assert_eq!(logits, vec![1.0, -4.75, -0.75, 1.0]);
    }

    #[test]
    fn masks_bias_min_tokens_and_bad_words() {
        let p = SamplingParams {
            allowed_token_ids: Some(vec![0, 1, 2]),
            logit_bias: vec![(1, 500.0)],
            min_tokens: 2,
            stop_token_ids: vec![2],
            bad_words: vec![vec![0], vec![5, 1]],
            ..params()
        };
        let mut logits = vec![0.0; 6];
        process(&mut logits, &p, &History { prompt: &[], generated: &[5] }, &[3]);
        // 0 banned (one-token bad word), 1 banned (after 5), 2 banned (stop token under min_tokens),
        // 3..5 not allowed
        assert!(logits.iter().all(|l| *l == f32::NEG_INFINITY), "{logits:?}");
        let mut logits = vec![0.0; 6];
        process(&mut logits, &p, &History { prompt: &[], generated: &[4, 4] }, &[3]);
        assert_eq!(&logits[..3], &[f32::NEG_INFINITY, 100.0, 0.0]);
        // A sorted allowed list with gaps and an id past the vocabulary keeps exactly its ids.
        let p = SamplingParams { allowed_token_ids: Some(vec![1, 3, 9]), ..params() };
        let mut logits = vec![0.5; 6];
        process(&mut logits, &p, &no_history(), &[99]);
        let ninf = f32::NEG_INFINITY;
        assert_eq!(logits, vec![ninf, 0.5, ninf, 0.5, ninf, ninf]);
    }

    #[test]
    fn builtin_processors() {
        let p = SamplingParams {
            processors: vec![
                LogitsProcessor::SuppressTokens { token_ids: vec![4] },
                LogitsProcessor::NoRepeatNgram { n: 2 },
            ],
            ..params()
        };
        // History 1 2 3 1: the bigram "1 2" exists, so after a trailing 1 token 2 is banned.
        let mut logits = vec![0.0; 6];
        process(&mut logits, &p, &History { prompt: &[1, 2], generated: &[3, 1] }, &[5]);
        assert_eq!(logits, vec![0.0, 0.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0]);
    }

    #[test]
    fn logprob_helpers() {
        let logits = [0.0f32, 0.0, (2.0f32).ln()];
        let lse = log_normalizer(&logits);
        assert!((lse - (4.0f32).ln()).abs() < 1e-6);
        assert_eq!(top_k_ids(&logits, 2), vec![2, 0]);
        assert_eq!(top_k_ids(&logits, 0), Vec::<u32>::new());
        assert_eq!(top_k_ids(&logits, 9).len(), 3);
    }
}
