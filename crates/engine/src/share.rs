//! Prefix sharing within a batch: a waiting request whose prompt starts with positions another
//! request of its scope is about to compute waits for them, then takes them from the prefix
//! cache, instead of computing the same positions beside it in the same step. Pure.
//!
//! Why: the prefix cache only holds a prompt once its prefill is done, so requests that arrive
//! together (a group of RL rollouts on one prompt sent as separate requests, as ART's are;
//! concurrent chats under one system prompt) all miss it and compute their common prefix once
//! each. SGLang's scheduler checks the same thing (its in-batch prefix check). On
//! Qwen2.5-Coder 1.5B, 16 chats arriving together prefilled ~780 of their 1,150 prompt tokens
//! (docs/benchmarks.md, session 49).
//!
//! Bounds, so that waiting never costs more than it saves:
//! - a request waits only for a leader that finishes its whole prompt within one step's token
//!   budget (the cache takes a prompt when it is complete): at most a step or two of delay;
//! - only for at least [`MIN_SHARED`] positions not in the cache already;
//! - only when the cache can keep the leader's prompt;
//! - never across scopes: the chain hashes (`prefix::PrefixCache::prefix_hashes`) start from the
//!   tenant, adapter and salt, so equal hashes mean the same scope and the same tokens;
//! - a leader that is preempted, cancelled or done stops being one, so nothing waits forever.

use std::collections::HashMap;

/// The fewest shared positions worth a wait (about a prefill chunk's fixed cost).
pub const MIN_SHARED: usize = 32;

/// A request whose prompt others may wait for: its chain hashes (one per prompt position) and
/// the prefill tokens it has left (a waiting request: its whole prompt).
#[derive(Debug, Clone, Copy)]
pub struct Leader<'a> {
    pub hashes: &'a [u64],
    pub left: usize,
}

/// For each waiting request (`waiting`, in the order the scheduler admits a tenant's requests:
/// priority, then arrival), whether it sits this step out to reuse a prefix a running prefill
/// (`running`) or a request before it computes. A request that may not reuse the cache (prompt
/// logprobs) passes `None`. `cached(h)`: the prefix cache holds the prefix whose last chain hash
/// is `h`; `keeps(n)`: it can keep a prompt of `n` positions.
pub fn deferred(
    running: &[Leader],
    waiting: &[Option<&[u64]>],
    step_tokens: usize,
    cached: impl Fn(u64) -> bool,
    keeps: impl Fn(usize) -> bool,
) -> Vec<bool> {
    if waiting.is_empty() {
        return Vec::new();
    }
    // One leader per first MIN_SHARED positions: the running prefills first, then the earliest
    // waiting request. Equal hashes at one position mean equal prompts up to it.
    let mut leaders: HashMap<u64, Leader> = HashMap::new();
    let can_lead =
        |l: &Leader| l.hashes.len() >= MIN_SHARED && l.left > 0 && l.left <= step_tokens && keeps(l.hashes.len());
    for l in running.iter().filter(|l| can_lead(l)) {
        leaders.entry(l.hashes[MIN_SHARED - 1]).or_insert(*l);
    }
    waiting
        .iter()
        .map(|w| {
            let Some(hashes) = *w else { return false };
            if hashes.len() <= MIN_SHARED {
                return false;
            }
            let key = hashes[MIN_SHARED - 1];
            if let Some(leader) = leaders.get(&key) {
                // The cache serves at most all but the last prompt position.
                let shared = common_prefix(leader.hashes, hashes).min(hashes.len() - 1);
                if shared >= MIN_SHARED && !cached(hashes[shared - 1]) {
                    return true;
                }
                return false;
            }
            let me = Leader { hashes, left: hashes.len() };
            if can_lead(&me) {
                leaders.insert(key, me);
            }
            false
        })
        .collect()
}

/// How many positions two chain-hashed prompts share: equal hashes at a position mean equal
/// prompts up to it, so the first difference is found by bisection.
fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    let (mut lo, mut hi) = (0, a.len().min(b.len()));
    // Invariant: the first `lo` positions are shared, and position `hi` (if any) is not
    // reached (positions past `hi` are out of range or past a difference).
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if a[mid - 1] == b[mid - 1] {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chain hashes as `PrefixCache::prefix_hashes` makes them (any function of the previous
    /// hash and the token will do here).
    fn chain(scope: u64, tokens: &[u32]) -> Vec<u64> {
        let mut prev = scope.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x51;
        tokens
            .iter()
            .map(|&t| {
                prev = (prev ^ t as u64).wrapping_mul(0x100_0000_01B3).rotate_left(17) ^ 0xABCD;
                prev
            })
            .collect()
    }

    fn prompt(shared: usize, own: usize, seed: u32) -> Vec<u32> {
        (0..shared as u32).chain((0..own as u32).map(|i| 100_000 + seed * 1000 + i)).collect()
    }

    #[test]
    fn common_prefixes_are_found_by_bisection() {
        let a = chain(1, &prompt(40, 10, 1));
        let b = chain(1, &prompt(40, 10, 2));
        assert_eq!(common_prefix(&a, &b), 40);
        assert_eq!(common_prefix(&a, &a), 50);
        assert_eq!(common_prefix(&a, &a[..7]), 7);
        assert_eq!(common_prefix(&a, &chain(2, &prompt(40, 10, 1))), 0);
        assert_eq!(common_prefix(&[], &a), 0);
    }

    #[test]
    fn requests_arriving_together_wait_for_the_first_of_their_prefix() {
        // Four chats under one 40-token system prompt, and one unrelated.
        let p: Vec<Vec<u64>> = (0..4).map(|i| chain(1, &prompt(40, 20, i))).collect();
        let other = chain(1, &prompt(0, 60, 9));
        let waiting = vec![Some(&p[0][..]), Some(&p[1][..]), Some(&other[..]), Some(&p[2][..]), Some(&p[3][..])];
        let d = deferred(&[], &waiting, 512, |_| false, |_| true);
        assert_eq!(d, vec![false, true, false, true, true]);
        // Once the first prompt is in the cache, nobody waits.
        let d = deferred(&[], &waiting[1..], 512, |h| h == p[1][39], |_| true);
        assert_eq!(d, vec![false, false, false, false]);
    }

    #[test]
    fn a_running_prefill_leads_and_a_finished_one_does_not() {
        let a = chain(1, &prompt(64, 8, 1));
        let b = chain(1, &prompt(64, 8, 2));
        let waiting = [Some(&b[..])];
        assert_eq!(deferred(&[Leader { hashes: &a, left: 30 }], &waiting, 512, |_| false, |_| true), vec![true]);
        assert_eq!(deferred(&[Leader { hashes: &a, left: 0 }], &waiting, 512, |_| false, |_| true), vec![false]);
    }

    #[test]
    fn nobody_waits_when_it_would_not_pay() {
        let a = chain(1, &prompt(40, 8, 1));
        let b = chain(1, &prompt(40, 8, 2));
        let go = |w: &[Option<&[u64]>], step: usize, keeps: bool| deferred(&[], w, step, |_| false, |_| keeps);
        // Shares fewer than MIN_SHARED positions.
        let short = chain(1, &prompt(MIN_SHARED - 1, 20, 3));
        let short2 = chain(1, &prompt(MIN_SHARED - 1, 20, 4));
        assert_eq!(go(&[Some(&short), Some(&short2)], 512, true), vec![false, false]);
        // A leader whose prompt takes more than a step to prefill.
        assert_eq!(go(&[Some(&a), Some(&b)], 47, true), vec![false, false]);
        assert_eq!(go(&[Some(&a), Some(&b)], 48, true), vec![false, true]);
        // A cache that could not keep the leader's prompt.
        assert_eq!(go(&[Some(&a), Some(&b)], 512, false), vec![false, false]);
        // A request that may not reuse the cache neither waits nor leads.
        assert_eq!(go(&[None, Some(&b)], 512, true), vec![false, false]);
        assert_eq!(go(&[Some(&a), None], 512, true), vec![false, false]);
        // Another scope (tenant, adapter or salt) never waits for this one.
        let elsewhere = chain(2, &prompt(40, 8, 2));
        assert_eq!(go(&[Some(&a), Some(&elsewhere)], 512, true), vec![false, false]);
    }

    #[test]
    fn an_identical_prompt_waits_for_all_but_its_last_position() {
        // The cache serves all but a prompt's last position; the same prompt twice still waits.
        let a = chain(1, &prompt(50, 0, 1));
        let d = deferred(&[], &[Some(&a[..]), Some(&a[..])], 512, |_| false, |_| true);
        assert_eq!(d, vec![false, true]);
        // And not once the cache holds those positions.
        let d = deferred(&[], &[Some(&a[..]), Some(&a[..])], 512, |h| h == a[48], |_| true);
        assert_eq!(d, vec![false, false]);
    }
}
