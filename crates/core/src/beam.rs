//! Beam search as vLLM's OpenAI server runs it (`use_beam_search`): every step each live beam is
//! extended by its `2 * width` most likely next tokens (raw-model logprobs), the `width` best
//! extensions by cumulative logprob survive, and an extension by the end-of-sequence token ends a
//! beam. At the end, finished and live beams are ranked by
//! `cum_logprob / len ** length_penalty`, where `len` counts the prompt too and not a final EOS
//! (vLLM's `get_beam_search_score`). Pure: the caller runs the model.
//!
//! Cost: a step looks at every candidate but copies only the `width` survivors' token lists, and
//! payloads (a logprob entry per token, the heavy part) are shared between a beam and its
//! extensions, so a step costs O(width * (length + candidates)) whatever the payloads hold.
//! Finished beams are kept only while they could still rank among the best `width`.

use std::sync::Arc;

/// One hypothesis: the tokens generated after the prompt, each with the caller's payload `T`
/// (e.g. its logprob entry for the response).
#[derive(Debug, Clone, PartialEq)]
pub struct Beam<T> {
    pub tokens: Vec<u32>,
    pub payloads: Payloads<T>,
    pub cum_logprob: f64,
    /// Ended by the end-of-sequence token (finish_reason `stop`).
    pub finished: bool,
}

/// A beam's payloads, newest last, as a shared list: extending a beam by one token shares all
/// of its parent's payloads.
#[derive(Debug)]
pub struct Payloads<T>(Option<Arc<Link<T>>>);

#[derive(Debug)]
struct Link<T> {
    value: T,
    prev: Option<Arc<Link<T>>>,
}

impl<T> Clone for Payloads<T> {
    fn clone(&self) -> Self {
        Payloads(self.0.clone())
    }
}

impl<T> Default for Payloads<T> {
    fn default() -> Self {
        Payloads(None)
    }
}

impl<T: PartialEq> PartialEq for Payloads<T> {
    fn eq(&self, other: &Self) -> bool {
        let (mut a, mut b) = (self.0.as_deref(), other.0.as_deref());
        loop {
            match (a, b) {
                (None, None) => return true,
                (Some(x), Some(y)) if x.value == y.value => (a, b) = (x.prev.as_deref(), y.prev.as_deref()),
                _ => return false,
            }
        }
    }
}

impl<T: Clone> Payloads<T> {
    pub fn push(&self, value: T) -> Self {
        Payloads(Some(Arc::new(Link { value, prev: self.0.clone() })))
    }

    /// Oldest first.
    pub fn to_vec(&self) -> Vec<T> {
        let mut out = Vec::new();
        let mut at = self.0.as_deref();
        while let Some(link) = at {
            out.push(link.value.clone());
            at = link.prev.as_deref();
        }
        out.reverse();
        out
    }
}

impl<T: Clone> From<Vec<T>> for Payloads<T> {
    fn from(values: Vec<T>) -> Self {
        values.into_iter().fold(Payloads::default(), |p, v| p.push(v))
    }
}

impl<T> Drop for Payloads<T> {
    /// Iteratively: a long list dropped recursively would overflow the stack.
    fn drop(&mut self) {
        let mut next = self.0.take();
        while let Some(link) = next {
            next = match Arc::try_unwrap(link) {
                Ok(mut only) => only.prev.take(),
                Err(_) => None, // still shared: its other owner drops it later
            };
        }
    }
}

/// The search's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamParams {
    pub width: usize,
    pub length_penalty: f64,
    pub eos: u32,
    pub ignore_eos: bool,
    /// Keep the EOS token in a finished beam's tokens.
    pub include_eos: bool,
    /// The prompt's length (the ranking score's length counts it).
    pub prompt_len: usize,
}

/// The search state between steps.
#[derive(Debug, Clone)]
pub struct BeamSearch<T> {
    pub params: BeamParams,
    pub live: Vec<Beam<T>>,
    pub done: Vec<Beam<T>>,
}

impl<T: Clone> BeamSearch<T> {
    pub fn new(params: BeamParams) -> Self {
        let root = Beam { tokens: Vec::new(), payloads: Payloads::default(), cum_logprob: 0.0, finished: false };
        BeamSearch { params, live: vec![root], done: Vec::new() }
    }

    /// How many candidates each live beam needs per step.
    pub fn candidates_per_beam(&self) -> usize {
        2 * self.params.width
    }

    /// Extends the live beams: `candidates[i]` holds live beam i's next-token
    /// `(id, logprob, payload)` triples. EOS extensions (unless ignored) move to `done`; the `width` best other extensions
    /// (ties: earlier beam, then better candidate rank) become the new live beams.
    pub fn step(&mut self, candidates: &[Vec<(u32, f32, T)>]) {
        let p = self.params;
        // (cumulative logprob, beam, candidate) of every non-EOS extension; only the best
        // `width` become beams (a stable sort keeps equal scores in beam, then rank, order).
        let mut next: Vec<(f64, usize, usize)> = Vec::new();
        for (i, (beam, cands)) in self.live.iter().zip(candidates).enumerate() {
            for (j, (id, lp, payload)) in cands.iter().enumerate() {
                let cum = beam.cum_logprob + *lp as f64;
                if *id == p.eos && !p.ignore_eos {
                    let (tokens, payloads) = if p.include_eos {
                        ([beam.tokens.as_slice(), &[*id]].concat(), beam.payloads.push(payload.clone()))
                    } else {
                        (beam.tokens.clone(), beam.payloads.clone())
                    };
                    self.done.push(Beam { tokens, payloads, cum_logprob: cum, finished: true });
                } else {
                    next.push((cum, i, j));
                }
            }
        }
        next.sort_by(|a, b| b.0.total_cmp(&a.0));
        next.truncate(p.width);
        self.live = next
            .into_iter()
            .map(|(cum, i, j)| {
                let (beam, (id, _, payload)) = (&self.live[i], &candidates[i][j]);
                Beam {
                    tokens: [beam.tokens.as_slice(), &[*id]].concat(),
                    payloads: beam.payloads.push(payload.clone()),
                    cum_logprob: cum,
                    finished: false,
                }
            })
            .collect();
        self.prune_done();
    }

    /// Keeps the `width` best finished beams (once there are twice as many): a finished beam's
    /// score never changes, so one outside the best `width` finished ones can never be returned.
    fn prune_done(&mut self) {
        let p = self.params;
        if self.done.len() > 2 * p.width.max(1) {
            let key = |b: &Beam<T>| score(b, p.prompt_len, p);
            self.done.sort_by(|a, b| key(b).total_cmp(&key(a)));
            self.done.truncate(p.width);
        }
    }

    /// The `width` best beams, finished or not, best first.
    pub fn best(self) -> Vec<Beam<T>> {
        let p = self.params;
        let mut all: Vec<Beam<T>> = self.done.into_iter().chain(self.live).collect();
        let key = |b: &Beam<T>| score(b, p.prompt_len, p);
        all.sort_by(|a, b| key(b).total_cmp(&key(a)));
        all.truncate(p.width);
        all
    }
}

/// vLLM's ranking score: the cumulative logprob over the length to the power `length_penalty`;
/// the length includes the prompt and excludes a trailing EOS.
pub fn score<T>(b: &Beam<T>, prompt_len: usize, p: BeamParams) -> f64 {
    let mut len = prompt_len + b.tokens.len();
    if b.tokens.last() == Some(&p.eos) {
        len -= 1;
    }
    b.cum_logprob / (len.max(1) as f64).powf(p.length_penalty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(width: usize) -> BeamParams {
        BeamParams { width, length_penalty: 1.0, eos: 0, ignore_eos: false, include_eos: false, prompt_len: 2 }
    }

    #[test]
    fn keeps_the_best_extensions_across_beams() {
        let mut s = BeamSearch::<()>::new(params(2));
        s.step(&[vec![(5, -0.1, ()), (6, -0.5, ()), (7, -2.0, ()), (8, -3.0, ())]]);
        assert_eq!(s.live.iter().map(|b| b.tokens.clone()).collect::<Vec<_>>(), vec![vec![5], vec![6]]);
        // Extensions: [5, 3] = -0.1 - 0.3 = -0.4, [6, 9] = -0.5 - 0.05 = -0.55, [5, 4] = -1.1,
        // [6, 10] = -4.5: one survivor from each beam.
        s.step(&[vec![(3, -0.3, ()), (4, -1.0, ())], vec![(9, -0.05, ()), (10, -4.0, ())]]);
        let got: Vec<(Vec<u32>, f64)> = s.live.iter().map(|b| (b.tokens.clone(), b.cum_logprob)).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, vec![5, 3]);
        assert!((got[0].1 + 0.4).abs() < 1e-6);
        assert_eq!(got[1].0, vec![6, 9]);
        assert!((got[1].1 + 0.55).abs() < 1e-6);
    }

    #[test]
    fn eos_finishes_a_beam_and_frees_its_slot() {
        let mut s = BeamSearch::<()>::new(params(2));
        s.step(&[vec![(0, -0.2, ()), (4, -0.7, ()), (5, -0.9, ()), (6, -5.0, ())]]);
        assert_eq!(s.done.len(), 1);
        assert!(s.done[0].finished && s.done[0].tokens.is_empty());
        assert_eq!(s.live.iter().map(|b| b.tokens[0]).collect::<Vec<_>>(), vec![4, 5]);
        // With include_eos the token stays; with ignore_eos it is an ordinary token.
        let mut s = BeamSearch::<()>::new(BeamParams { include_eos: true, ..params(1) });
        s.step(&[vec![(0, -0.2, ()), (4, -0.7, ())]]);
        assert_eq!(s.done[0].tokens, vec![0]);
        let mut s = BeamSearch::<()>::new(BeamParams { ignore_eos: true, ..params(1) });
        s.step(&[vec![(0, -0.2, ()), (4, -0.7, ())]]);
        assert!(s.done.is_empty());
        assert_eq!(s.live[0].tokens, vec![0]);
    }

    #[test]
    fn final_ranking_uses_the_length_penalty() {
        // Prompt of 2 tokens. A: 1 token, -1.2 -> len 3; B: 4 tokens, -2.0 -> len 6.
        let a = Beam { tokens: vec![1], payloads: vec![()].into(), cum_logprob: -1.2, finished: true };
        let b = Beam { tokens: vec![1, 2, 3, 4], payloads: vec![(); 4].into(), cum_logprob: -2.0, finished: false };
        for (lp, first) in [(0.0, &a), (1.0, &b), (2.0, &b)] {
            // lp 0: -1.2 vs -2.0 -> A. lp 1: -0.4 vs -0.333 -> B. lp 2: -0.133 vs -0.0556 -> B.
            let p = BeamParams { length_penalty: lp, ..params(1) };
            let s = BeamSearch { params: p, live: vec![b.clone()], done: vec![a.clone()] };
            assert_eq!(&s.best()[0], first, "length_penalty {lp}");
        }
        // A trailing EOS does not count towards the length: -1.0 / (2 + 2 - 1) = -0.333.
        let e = Beam { tokens: vec![7, 0], payloads: vec![(), ()].into(), cum_logprob: -1.0, finished: true };
        let p = BeamParams { include_eos: true, ..params(1) };
        assert!((score(&e, 2, p) + 1.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn long_searches_share_payloads_and_keep_few_finished_beams() {
        // 3000 steps of width 4, every beam offered EOS each step: cheap, and at most 2 * width
        // finished beams are ever held.
        let mut s = BeamSearch::<u32>::new(params(4));
        for step in 0..3000u32 {
            let cands: Vec<Vec<(u32, f32, u32)>> =
                s.live.iter().map(|_| vec![(0, -5.0, step), (1, -0.01, step), (2, -0.02, step)]).collect();
            s.step(&cands);
            assert!(s.done.len() <= 8);
        }
        let best = s.best();
        assert_eq!(best.len(), 4);
        let top = &best[0];
        assert_eq!(top.payloads.to_vec().len(), top.tokens.len());
        assert_eq!(top.payloads.to_vec()[..3], [0, 1, 2], "payloads stay in token order");
        // Dropping 3000-long shared lists does not overflow the stack.
        drop(best);
    }
}
