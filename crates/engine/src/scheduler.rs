//! The step scheduler: which sequences run this step and with how many tokens. Pure.
//!
//! Decoding sequences always get their one token (so streams never stall behind a long prompt);
//! prompts are then prefilled in chunks from what is left of the step's token budget, and waiting
//! requests are admitted while sequences, tokens and KV memory allow.
//!
//! Several tenants share the engine, and each gets a fair share of what a step has (`fair`):
//! - **Admission**: the next request admitted is always one of the tenant with the fewest
//!   sequences (running or admitted so far); within a tenant requests go in (priority, arrival)
//!   order.
//! - **Decode slots and KV memory**: when a tenant below its max-min share of the sequences
//!   (`max_seqs`) waits and there is no room, running sequences of tenants above their share of
//!   sequences or of KV positions are preempted for it (the most-over tenant's worst first), so a
//!   tenant holding every slot gives one up within a step. The engine drops their KV cache and
//!   recomputes it when they are admitted again (vLLM's recompute preemption).
//! - **Tokens and time**: a step's token budget is water-filled between the tenants with work
//!   (decode tokens and prefill chunks alike); then, in time (`fair::Cost`: a token deep in a
//!   long context costs its attention), the slowdown guard caps each tenant's work at the step's
//!   fixed part plus the cheapest other tenant's, so no tenant's work runs slower than `1 / k` of
//!   its speed alone with `k` tenants busy, and the step is capped at `max_step_seconds` (or,
//!   for one tenant's work alone, ten times the step's fixed part, `fair::step_cap`; time
//!   water-filled between tenants). Within a tenant: decodes first (the least recently served first, so its
//!   streams take turns when it has more than its share), then prompts by (priority, arrival).
//!
//! `priority` is the client's to set, so it orders only that tenant's own requests: a waiting
//! request may also preempt running sequences of its own tenant with strictly lower priority
//! (larger `priority`, the latest arrivals first), as vLLM's priority scheduling does.

use crate::fair::{guard_caps, step_cap, water_fill, water_fill_time, Cost};
use std::collections::BTreeMap;

/// A running sequence as the scheduler sees it. `Id` is the engine's sequence id (the scheduler
/// only compares them; its tests use plain numbers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running<Id = u64> {
    pub id: Id,
    /// Who asked (an id per tenant).
    pub tenant: u64,
    /// Prompt tokens not yet in the KV cache (0 = decoding).
    pub prefill_left: usize,
    pub priority: i64,
    pub arrival: u64,
    /// KV positions it holds, or will hold once its prompt is in (for all its choices, while
    /// they are still to be forked from it).
    pub reserve: usize,
    /// Whether it may be preempted (not a prompt that still has choices to fork, nor one whose
    /// prompt logprobs are being recorded).
    pub preemptible: bool,
    /// The last step it had work in (a tenant's decodes take turns, least recent first).
    pub last_step: u64,
    /// Positions already in its KV cache (what its next token attends, for the step's cost).
    pub position: usize,
}

/// A request waiting for admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting<Id = u64> {
    pub id: Id,
    pub tenant: u64,
    pub priority: i64,
    pub arrival: u64,
    /// Prompt tokens to prefill (after any prefix-cache hit).
    pub prefill: usize,
    /// KV positions it needs to start (all its choices: prompt and first token).
    pub reserve: usize,
    /// Sequences it becomes (its n).
    pub seqs: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// New tokens per step (decode tokens plus prefill chunks).
    pub step_tokens: usize,
    pub max_seqs: usize,
    /// KV positions all sequences together may hold (the KV memory budget). At least the
    /// context length, so that any one sequence can always finish alone.
    pub kv_tokens: usize,
    /// What a step costs (`fair::StepCost`), for the slowdown guard and the step's time cap.
    pub cost: Cost,
    /// The longest a step may be planned to take (so a request arriving during it waits at most
    /// that long for its first chunk), stretched to ten times the step's fixed part where that is
    /// longer when the step holds one tenant's work alone (`fair::step_cap`); each sequence with
    /// work keeps at least one token.
    pub max_step_seconds: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan<Id = u64> {
    /// Running ids to preempt before this step (they get no work).
    pub preempt: Vec<Id>,
    /// Waiting ids to admit, in order.
    pub admit: Vec<Id>,
    /// (id, new tokens this step), for running and newly admitted sequences.
    pub work: Vec<(Id, usize)>,
    /// Each tenant's time credit after this step (deficit round robin, `schedule_with`).
    pub credits: BTreeMap<u64, f64>,
}

/// Plans one step. Decoding adds one
/// position per sequence per step; when that would pass the KV budget, sequences are preempted
/// first (vLLM's recompute preemption), from the tenant holding the most KV, its lowest
/// priority and latest arrival first.
pub fn schedule<Id: Copy + Ord>(running: &[Running<Id>], waiting: &[Waiting<Id>], budget: &Budget) -> Plan<Id> {
    schedule_with(running, waiting, budget, &BTreeMap::new())
}

/// [`schedule`] with each tenant's time credit from the step before: a tenant whose next token
/// alone costs more than the slowdown guard lets it spend in one step (a token deep in a long
/// context) saves the allowance of the steps it sits out and runs once it has enough (deficit
/// round robin in seconds), so the guard's bound holds on average instead of being broken by a
/// token a step.
pub fn schedule_with<Id: Copy + Ord>(
    running: &[Running<Id>],
    waiting: &[Waiting<Id>],
    budget: &Budget,
    credits: &BTreeMap<u64, f64>,
) -> Plan<Id> {
    let kv_reserved = running.iter().map(|r| r.reserve).sum();
    let mut preempt = growth_preemptions(running, kv_reserved, budget);
    let grown: Vec<Running<Id>> = running
        .iter()
        .filter(|r| !preempt.contains(&r.id))
        .map(|r| Running { reserve: r.reserve + usize::from(r.prefill_left == 0), ..r.clone() })
        .collect();
    let kv_grown = grown.iter().map(|r| r.reserve).sum();
    preempt.extend(preemptions(&grown, waiting, kv_grown, budget));
    let mut plan = Plan { preempt, admit: Vec::new(), work: Vec::new(), credits: BTreeMap::new() };
    let (running, kv_reserved) = (&grown[..], kv_grown);
    let freed: usize = running.iter().filter(|r| plan.preempt.contains(&r.id)).map(|r| r.reserve).sum();
    let kept: Vec<Running<Id>> = running.iter().filter(|r| !plan.preempt.contains(&r.id)).cloned().collect();
    let running = &kept[..];
    let kv_reserved = kv_reserved.saturating_sub(freed);
    // Admission candidates, in fair order, while sequences and KV allow (strict order: a request
    // that does not fit blocks those behind it, so a large high-priority request is not starved
    // by a stream of small ones).
    let (mut seqs, mut kv) = (running.len(), kv_reserved);
    let mut candidates = Vec::new();
    for w in fair_order(running, waiting) {
        let fits_kv = kv + w.reserve <= budget.kv_tokens || (seqs == 0 && kv == 0);
        if seqs + w.seqs > budget.max_seqs.max(w.seqs) || !fits_kv {
            break;
        }
        candidates.push(w);
        seqs += w.seqs;
        kv += w.reserve;
    }
    let (grants, credits) = grant_tokens(running, &candidates, budget, credits);
    plan.credits = credits;
    let granted = |id: &Id| grants.get(id).copied().unwrap_or(0);
    for r in running.iter().filter(|r| r.prefill_left == 0) {
        if granted(&r.id) > 0 {
            plan.work.push((r.id, 1));
        }
    }
    let mut prefilling: Vec<&Running<Id>> = running.iter().filter(|r| r.prefill_left > 0).collect();
    prefilling.sort_by_key(|r| (r.priority, r.arrival, r.id));
    for r in prefilling {
        if granted(&r.id) > 0 {
            plan.work.push((r.id, granted(&r.id)));
        }
    }
    for w in candidates {
        // A candidate its tenant's share has no token for waits (and so do the tenant's later
        // ones: shares are given in the same order).
        if granted(&w.id) > 0 {
            plan.admit.push(w.id);
            plan.work.push((w.id, granted(&w.id)));
        }
    }
    plan
}

/// Tokens per sequence this step: the token budget water-filled between tenants by what each
/// could use; then, in time (`Budget::cost`), the slowdown guard and the step's time cap (time
/// water-filled between tenants); each tenant's share spent on its decodes (least recently
/// served first), its prompts being prefilled (priority, arrival) and its admission candidates
/// (in order).
fn grant_tokens<Id: Copy + Ord>(
    running: &[Running<Id>],
    candidates: &[&Waiting<Id>],
    budget: &Budget,
    credits: &BTreeMap<u64, f64>,
) -> (BTreeMap<Id, usize>, BTreeMap<u64, f64>) {
    /// One sequence's claim: (id, position, tokens wanted).
    type Item<Id> = (Id, usize, usize);
    /// A tenant's decodes, prompts being prefilled and admission candidates.
    type Claims<'a, Id> = (Vec<&'a Running<Id>>, Vec<&'a Running<Id>>, Vec<&'a Waiting<Id>>);
    let mut tenants: BTreeMap<u64, Claims<'_, Id>> = BTreeMap::new();
    for r in running {
        let t = tenants.entry(r.tenant).or_default();
        if r.prefill_left == 0 {
            t.0.push(r)
        } else {
            t.1.push(r)
        }
    }
    for w in candidates {
        tenants.entry(w.tenant).or_default().2.push(w);
    }
    let mut items: Vec<Vec<Item<Id>>> = tenants
        .values_mut()
        .map(|(decodes, prefills, admits)| {
            decodes.sort_by_key(|r| (r.last_step, r.arrival, r.id));
            prefills.sort_by_key(|r| (r.priority, r.arrival, r.id));
            let mut v: Vec<Item<Id>> = decodes.iter().map(|r| (r.id, r.position, 1)).collect();
            v.extend(prefills.iter().map(|r| (r.id, r.position, r.prefill_left)));
            v.extend(admits.iter().map(|w| (w.id, 0, w.prefill.max(1))));
            v
        })
        .collect();
    // Tokens: max-min shares of the step's budget.
    let demands: Vec<usize> = items.iter().map(|v| v.iter().map(|i| i.2).sum()).collect();
    for (v, share) in items.iter_mut().zip(water_fill(&demands, budget.step_tokens)) {
        take_tokens(v, share);
    }
    // Time: the slowdown guard, then the step's cap.
    let cost = budget.cost;
    let costs = |items: &[Vec<Item<Id>>]| -> Vec<f64> {
        items.iter().map(|v| v.iter().map(|&(_, p, m)| cost.tokens(p, m)).sum()).collect()
    };
    let wanted = costs(&items);
    let caps = guard_caps(&wanted, cost.a);
    let mut credit_out = BTreeMap::new();
    for ((v, (cap, want)), tenant) in items.iter_mut().zip(caps.into_iter().zip(&wanted)).zip(tenants.keys()) {
        if cap >= *want {
            continue; // not held back: nothing to save
        }
        let allowance = cap + credits.get(tenant).copied().unwrap_or(0.0);
        let spent = take_seconds(v, allowance, &cost, false);
        credit_out.insert(*tenant, allowance - spent);
    }
    let now = costs(&items);
    // Stretched only for a step of one tenant's work: with others in it, their tokens and
    // arrivals keep the short cap (the stretch would slow their decodes too).
    let max_step = if tenants.len() == 1 { step_cap(budget.max_step_seconds, cost.a) } else { budget.max_step_seconds };
    if cost.a + now.iter().sum::<f64>() > max_step {
        for (v, cap) in items.iter_mut().zip(water_fill_time(&now, max_step - cost.a)) {
            take_seconds(v, cap, &cost, true);
        }
    }
    let grants = items.into_iter().flatten().filter(|i| i.2 > 0).map(|(id, _, m)| (id, m)).collect();
    (grants, credit_out)
}

/// Keeps the first `n` tokens of a tenant's claims, in order.
fn take_tokens<Id>(items: &mut [(Id, usize, usize)], mut n: usize) {
    for item in items.iter_mut() {
        item.2 = item.2.min(n);
        n -= item.2;
    }
}

/// Keeps the claims, in order, that fit in `seconds`: the first that does not fit is cut to what
/// does (with `at_least_one`, the first claim keeps a token whatever it costs). Returns the
/// seconds kept.
fn take_seconds<Id>(items: &mut [(Id, usize, usize)], seconds: f64, cost: &Cost, at_least_one: bool) -> f64 {
    let (mut left, mut spent, mut first) = (seconds.max(0.0), 0.0, true);
    for item in items.iter_mut().filter(|i| i.2 > 0) {
        let fit = cost.fit(item.1, item.2, left);
        let keep = if first && at_least_one { fit.max(1) } else { fit };
        let t = cost.tokens(item.1, keep);
        left = (left - t).max(0.0);
        spent += t;
        first = false;
        item.2 = keep;
    }
    spent
}

/// Running sequences to evict so that every decoding sequence has room for its next position.
fn growth_preemptions<Id: Copy + Ord>(running: &[Running<Id>], kv_reserved: usize, budget: &Budget) -> Vec<Id> {
    let growth = running.iter().filter(|r| r.prefill_left == 0).count();
    let mut need = (kv_reserved + growth).saturating_sub(budget.kv_tokens);
    if need == 0 {
        return Vec::new();
    }
    let mut held: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for r in running {
        *held.entry(r.tenant).or_default() += r.reserve;
    }
    let mut victims: Vec<&Running<Id>> = running.iter().filter(|r| r.preemptible).collect();
    victims.sort_by_key(|r| {
        (std::cmp::Reverse(held[&r.tenant]), std::cmp::Reverse(r.priority), std::cmp::Reverse(r.arrival), r.id)
    });
    let mut out = Vec::new();
    for r in victims {
        if need == 0 {
            break;
        }
        out.push(r.id);
        need = need.saturating_sub(r.reserve + usize::from(r.prefill_left == 0));
    }
    out
}

/// Running sequences to evict so that waiting requests fit: for each waiting request in fair
/// order that does not fit, its own tenant's running sequences of strictly lower priority are
/// taken worst first (largest priority, then latest arrival); then, if its tenant holds less
/// than its max-min share of the sequences, sequences of tenants above their share of sequences
/// or of KV positions, the most-over tenant's worst first, never taking a tenant below its
/// shares. If even that would not make room, nothing is evicted for it and the walk stops
/// (strict order).
fn preemptions<Id: Copy + Ord>(
    running: &[Running<Id>],
    waiting: &[Waiting<Id>],
    kv_reserved: usize,
    budget: &Budget,
) -> Vec<Id> {
    let queue = fair_order(running, waiting);
    let mut victims: Vec<&Running<Id>> = running.iter().filter(|r| r.preemptible).collect();
    victims.sort_by_key(|r| (std::cmp::Reverse(r.priority), std::cmp::Reverse(r.arrival), std::cmp::Reverse(r.id)));
    // Max-min shares of sequences and of KV positions among every tenant with work.
    let mut tenants: BTreeMap<u64, (usize, usize)> = BTreeMap::new(); // demand: (seqs, kv)
    let mut held: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for r in running {
        let d = tenants.entry(r.tenant).or_default();
        *d = (d.0 + 1, d.1 + r.reserve);
        let h = held.entry(r.tenant).or_default();
        *h = (h.0 + 1, h.1 + r.reserve);
    }
    for w in waiting {
        let d = tenants.entry(w.tenant).or_default();
        *d = (d.0 + w.seqs, d.1 + w.reserve);
    }
    let seat_share = water_fill(&tenants.values().map(|d| d.0).collect::<Vec<_>>(), budget.max_seqs);
    let kv_share = water_fill(&tenants.values().map(|d| d.1).collect::<Vec<_>>(), budget.kv_tokens);
    let shares: BTreeMap<u64, (usize, usize)> =
        tenants.keys().copied().zip(seat_share.into_iter().zip(kv_share)).collect();
    let share = |t: u64| shares[&t];
    let (mut seqs, mut kv) = (running.len(), kv_reserved);
    let mut evicted: Vec<Id> = Vec::new();
    let fits = |seqs: usize, kv: usize, w: &Waiting<Id>| {
        seqs + w.seqs <= budget.max_seqs.max(w.seqs) && (kv + w.reserve <= budget.kv_tokens || (seqs == 0 && kv == 0))
    };
    for w in queue {
        if fits(seqs, kv, w) {
            seqs += w.seqs;
            kv += w.reserve;
            let h = held.entry(w.tenant).or_default();
            *h = (h.0 + w.seqs, h.1 + w.reserve);
            continue;
        }
        let (mut s, mut k) = (seqs, kv);
        let mut trial = held.clone();
        let mut picks = Vec::new();
        fn take<Id: Copy>(
            r: &Running<Id>,
            picks: &mut Vec<Id>,
            (s, k): (&mut usize, &mut usize),
            trial: &mut BTreeMap<u64, (usize, usize)>,
        ) {
            picks.push(r.id);
            *s -= 1;
            *k -= r.reserve.min(*k);
            let h = trial.entry(r.tenant).or_default();
            *h = (h.0.saturating_sub(1), h.1.saturating_sub(r.reserve));
        }
        for r in victims.iter().filter(|r| r.tenant == w.tenant && r.priority > w.priority && !evicted.contains(&r.id))
        {
            if fits(s, k, w) {
                break;
            }
            take(r, &mut picks, (&mut s, &mut k), &mut trial);
        }
        let own = trial.get(&w.tenant).copied().unwrap_or_default();
        if own.0 < share(w.tenant).0 {
            while !fits(s, k, w) {
                // The tenant furthest above its shares (sequences, then KV) that has a
                // preemptible sequence left.
                let over = |t: u64, h: (usize, usize)| {
                    let (ss, ks) = share(t);
                    (h.0.saturating_sub(ss), h.1.saturating_sub(ks))
                };
                let next = victims
                    .iter()
                    .filter(|r| r.tenant != w.tenant && !evicted.contains(&r.id) && !picks.contains(&r.id))
                    .filter(|r| over(r.tenant, trial[&r.tenant]) != (0, 0))
                    .max_by_key(|r| (over(r.tenant, trial[&r.tenant]), std::cmp::Reverse(r.tenant)))
                    .map(|r| r.tenant);
                let Some(t) = next else { break };
                let r = victims
                    .iter()
                    .find(|r| r.tenant == t && !evicted.contains(&r.id) && !picks.contains(&r.id))
                    .expect("the tenant has a victim left");
                take(r, &mut picks, (&mut s, &mut k), &mut trial);
            }
        }
        if !fits(s, k, w) {
            break;
        }
        evicted.extend(picks);
        held = trial;
        let h = held.entry(w.tenant).or_default();
        *h = (h.0 + w.seqs, h.1 + w.reserve);
        seqs = s + w.seqs;
        kv = k + w.reserve;
    }
    evicted
}

/// The order in which waiting requests are considered: repeatedly, the first (by priority, then
/// arrival) request of the tenant that has the fewest sequences so far, counting the running
/// ones and those ordered before (max-min fairness between tenants).
fn fair_order<'a, Id: Copy + Ord>(running: &[Running<Id>], waiting: &'a [Waiting<Id>]) -> Vec<&'a Waiting<Id>> {
    let mut held: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for r in running {
        *held.entry(r.tenant).or_default() += 1;
    }
    let mut pending: Vec<&Waiting<Id>> = waiting.iter().collect();
    pending.sort_by_key(|w| (w.priority, w.arrival, w.id));
    let mut order = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        // The earliest position of each tenant's first request breaks ties between tenants.
        let (i, _) = pending
            .iter()
            .enumerate()
            .min_by_key(|(i, w)| (held.get(&w.tenant).copied().unwrap_or(0), *i))
            .expect("pending is not empty");
        let w = pending.remove(i);
        *held.entry(w.tenant).or_default() += w.seqs;
        order.push(w);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: u64, prefill_left: usize, priority: i64) -> Running {
        Running {
            id,
            tenant: 0,
            prefill_left,
            priority,
            arrival: id,
            reserve: 100,
            preemptible: true,
            last_step: 0,
            position: 0,
        }
    }

    fn wait(id: u64, prefill: usize, priority: i64) -> Waiting {
        Waiting { id, tenant: 0, priority, arrival: id, prefill, reserve: prefill + 16, seqs: 1 }
    }

    /// A step's time in these tests: 4 ms fixed, 1 ms a token, attention free (unless a test
    /// says otherwise), so the guard allows 4 more tokens than the smallest tenant has.
    const COST: Cost = Cost { a: 0.004, c: 0.001, e: 0.0, f: 0.0 };
    const B: Budget = Budget {
        step_tokens: 100,
        max_seqs: 4,
        kv_tokens: 1000,
        cost: Cost { c: 1e-6, ..COST },
        max_step_seconds: 10.0,
    };
    const FAIR: Budget =
        Budget { max_seqs: 32, kv_tokens: 100_000, step_tokens: 512, cost: COST, max_step_seconds: 10.0 };

    #[test]
    fn decodes_first_then_chunked_prefill() {
        let plan = schedule(&[run(1, 0, 0), run(2, 250, 0), run(3, 0, 0)], &[], &B);
        assert_eq!(plan.work, vec![(1, 1), (3, 1), (2, 98)]);
    }

    #[test]
    fn admission_by_priority_then_arrival_within_budgets() {
        let waiting = [wait(10, 30, 5), wait(11, 30, -1), wait(12, 30, 0), wait(13, 30, 0)];
        let plan = schedule(&[run(1, 0, 0)], &waiting, &B);
        assert_eq!(plan.admit, vec![11, 12, 13]); // max 4 sequences
        assert_eq!(plan.work, vec![(1, 1), (11, 30), (12, 30), (13, 30)]);
        // Token budget: the third admitted gets only what is left, the rest waits.
        let plan = schedule(&[], &[wait(1, 60, 0), wait(2, 60, 0), wait(3, 5, 0)], &B);
        assert_eq!(plan.work, vec![(1, 60), (2, 40)]);
        assert_eq!(plan.admit, vec![1, 2]);
    }

    #[test]
    fn kv_budget_blocks_admission_but_never_deadlocks_an_empty_engine() {
        let big = Waiting { reserve: 5000, ..wait(1, 10, 0) };
        assert_eq!(schedule(&[run(9, 0, 0)], std::slice::from_ref(&big), &B).admit, Vec::<u64>::new());
        assert_eq!(schedule(&[], &[big], &B).admit, vec![1]);
    }

    #[test]
    fn n_greater_than_one_counts_its_sequences() {
        let w = Waiting { seqs: 3, ..wait(1, 10, 0) };
        assert!(schedule(&[run(7, 0, 0), run(8, 0, 0)], std::slice::from_ref(&w), &B).admit.is_empty());
        assert_eq!(schedule(&[run(7, 0, 0)], &[w], &B).admit, vec![1]);
    }

    #[test]
    fn higher_priority_preempts_the_worst_running_sequences() {
        // Full on sequences: the waiting priority-0 request evicts the latest of the priority-5 ones.
        let running = [run(1, 0, 5), run(2, 0, 5), run(3, 0, 1), run(4, 0, 5)];
        let plan = schedule(&running, &[wait(10, 30, 0)], &B);
        assert_eq!(plan.preempt, vec![4]);
        assert_eq!(plan.admit, vec![10]);
        assert_eq!(plan.work, vec![(1, 1), (2, 1), (3, 1), (10, 30)], "the preempted sequence gets no work");
        // Equal or better priorities are never preempted, and nothing is evicted in vain.
        assert_eq!(schedule(&running, &[wait(10, 30, 1)], &B).preempt, vec![4]);
        let even = [run(1, 0, 0), run(2, 0, 0), run(3, 0, 0), run(4, 0, 0)];
        let plan = schedule(&even, &[wait(10, 30, 0)], &B);
        assert!(plan.preempt.is_empty() && plan.admit.is_empty());
        let pinned = [Running { preemptible: false, ..run(1, 0, 9) }, run(2, 0, 0), run(3, 0, 0), run(4, 0, 0)];
        assert!(schedule(&pinned, &[wait(10, 30, 0)], &B).preempt.is_empty());
        // KV: as many as needed to make room, worst first.
        let tight = Budget { max_seqs: 8, kv_tokens: 400, ..B };
        let big = Waiting { reserve: 250, ..wait(10, 30, 0) };
        let plan = schedule(&running, std::slice::from_ref(&big), &tight);
        assert_eq!((plan.preempt, plan.admit), (vec![4, 2, 1], vec![10]));
    }

    #[test]
    fn tenants_share_admission_and_priority_never_crosses_tenants() {
        // Tenant 1 queued first, many requests, at the best priority; tenant 2's single request
        // still gets the second free slot.
        let flood: Vec<Waiting> = (10..16).map(|id| Waiting { tenant: 1, ..wait(id, 10, -100) }).collect();
        let mut waiting = flood.clone();
        waiting.push(Waiting { tenant: 2, ..wait(20, 10, 0) });
        let plan = schedule(&[], &waiting, &B);
        assert_eq!(plan.admit, vec![10, 20, 11, 12], "max 4 sequences, alternating tenants");
        // A tenant that already holds sequences waits behind one that holds none.
        let running = [Running { tenant: 1, ..run(1, 0, -100) }, Running { tenant: 1, ..run(2, 0, -100) }];
        let plan = schedule(&running, &waiting, &B);
        assert_eq!((plan.admit, plan.preempt), (vec![20, 10], vec![]));
        // Full engine: tenant 2 holds nothing, below its share, so tenant 1 (over its share of
        // 3 of the 4 slots) gives up its latest sequence, whatever the priorities say...
        let full: Vec<Running> = (1..5).map(|id| Running { tenant: 1, ..run(id, 0, -5) }).collect();
        let urgent = Waiting { tenant: 2, ..wait(30, 10, 1000) };
        let plan = schedule(&full, std::slice::from_ref(&urgent), &B);
        assert_eq!((plan.preempt, plan.admit), (vec![4], vec![30]));
        // ...and tenant 1's own request of a better priority preempts its own latest one.
        let own = Waiting { tenant: 1, ..wait(30, 10, -1000) };
        assert_eq!(schedule(&full, &[own], &B).preempt, vec![4]);
        // At its share, tenant 2 preempts no one: one slot each of two.
        let half = Budget { max_seqs: 2, ..B };
        let running = [Running { tenant: 1, ..run(1, 0, 0) }, Running { tenant: 2, ..run(2, 0, 0) }];
        let more = Waiting { tenant: 2, ..wait(30, 10, 0) };
        assert!(schedule(&running, &[more], &half).preempt.is_empty());
    }

    #[test]
    fn one_tenant_holding_every_slot_gives_a_newcomer_its_share_at_once() {
        // 32 slots all decoding for tenant 1 (one request's n, or 32 streams): tenant 2's request
        // is admitted the same step by preempting tenant 1's latest sequence.
        let b = FAIR;
        let full: Vec<Running> = (1..=32).map(|id| Running { tenant: 1, ..run(id, 0, 0) }).collect();
        let victim = Waiting { tenant: 2, ..wait(100, 20, 0) };
        let plan = schedule(&full, std::slice::from_ref(&victim), &b);
        assert_eq!((plan.preempt.clone(), plan.admit.clone()), (vec![32], vec![100]));
        // The guard: the newcomer's 20 prompt tokens let tenant 1 decode 24 streams this step.
        let decodes = plan.work.iter().filter(|(id, _)| *id <= 32).count();
        assert_eq!((decodes, plan.work.last().copied()), (24, Some((100, 20))));
        // Once it decodes (1 token), tenant 1 decodes 5 of its 31 a step, taking turns: those
        // that waited longest go first.
        let mut running: Vec<Running> =
            (1..=31).map(|id| Running { tenant: 1, last_step: 40 - id % 7, ..run(id, 0, 0) }).collect();
        running.push(Running { tenant: 2, last_step: 50, ..run(100, 0, 0) });
        let plan = schedule(&running, &[], &b);
        let served: Vec<u64> = plan.work.iter().map(|w| w.0).collect();
        assert_eq!(served.len(), 6);
        assert!(served.contains(&100));
        let mut waited: Vec<u64> =
            served.iter().filter(|id| **id != 100).map(|id| running[*id as usize - 1].last_step).collect();
        waited.sort();
        assert_eq!(waited, vec![34, 34, 34, 34, 35], "those that waited longest");
    }

    #[test]
    fn a_long_prompt_shares_the_step_budget_with_others() {
        // Tenant 1 prefills 8,000 tokens; tenant 2 arrives with 30: both in the next step, tenant 1
        // held to 30 + 4 tokens (the fixed 4 ms) while tenant 2's prompt is in the step.
        let b = FAIR;
        let running = [Running { tenant: 1, ..run(1, 8000, 0) }];
        let plan = schedule(&running, &[Waiting { tenant: 2, ..wait(2, 30, 0) }], &b);
        assert_eq!(plan.work, vec![(1, 34), (2, 30)]);
        // Alone, it takes the whole budget (work-conserving).
        assert_eq!(schedule(&running, &[], &b).work, vec![(1, 512)]);
        // Two long prompts split the budget evenly.
        let plan = schedule(&running, &[Waiting { tenant: 2, ..wait(2, 5000, 0) }], &b);
        assert_eq!(plan.work, vec![(1, 256), (2, 256)]);
    }

    #[test]
    fn deep_context_is_counted_for_its_attention_and_steps_are_capped_in_time() {
        // Attention only: a token at position p costs (p + 1) us.
        let cost = Cost { a: 0.0, c: 0.0, e: 0.001, f: 0.0 };
        let b = Budget { cost, max_step_seconds: 0.25, ..FAIR };
        // Alone at 1,000 positions: 224 tokens fit in 0.25 s (fair.rs computes it by hand).
        let deep = Running { tenant: 1, position: 1000, ..run(1, 8000, 0) };
        assert_eq!(schedule(std::slice::from_ref(&deep), &[], &b).work, vec![(1, 224)]);
        // Against a newcomer's 30 tokens at position 0 (cost 0.465 ms), the deep prompt may cost
        // only as much: its first token (1.001 ms) does not fit, so it sits out and saves the
        // allowance; the third step it has enough for one token.
        let newcomer = Running { tenant: 2, position: 0, ..run(2, 30, 0) };
        let both = [deep.clone(), newcomer];
        let plan = schedule(&both, &[], &b);
        assert_eq!(plan.work, vec![(2, 30)]);
        assert!((plan.credits[&1] - 0.000465).abs() < 1e-12, "{:?}", plan.credits);
        let plan = schedule_with(&both, &[], &b, &plan.credits);
        assert_eq!(plan.work, vec![(2, 30)]);
        let plan = schedule_with(&both, &[], &b, &plan.credits);
        assert_eq!(plan.work, vec![(1, 1), (2, 30)]);
        assert!((plan.credits[&1] - (3.0 * 0.000465 - 0.001001)).abs() < 1e-12);
        // A model whose step's fixed part is 50 ms and a token 11 ms (Qwen 1.5B on AVX2): the cap
        // stretches to 0.5 s, and a lone prompt gets (0.5 - 0.05) / 0.011 = 40.9 -> 40 tokens.
        let big = Budget { cost: Cost { a: 0.05, c: 0.011, e: 0.0, f: 0.0 }, ..b };
        assert_eq!(schedule(&[run(1, 512, 0)], &[], &big).work, vec![(1, 40)]);
        // Two tenants' prompts keep the 0.25 s cap: 0.2 s for tokens, 0.1 s each, 9 tokens each
        // (the stretched cap would give each 20).
        let other = Running { tenant: 2, ..run(2, 512, 0) };
        assert_eq!(schedule(&[run(1, 512, 0), other], &[], &big).work, vec![(1, 9), (2, 9)]);
        // A decode deep in a context counts too: 31 streams at 4,000 positions against one at 40.
        let guarded = Budget { cost: Cost { a: 0.004, c: 0.001, e: 0.001, f: 0.0 }, ..b };
        let mut running: Vec<Running> =
            (1..=31).map(|id| Running { tenant: 1, position: 4000, ..run(id, 0, 0) }).collect();
        running.push(Running { tenant: 2, position: 40, ..run(100, 0, 0) });
        // Tenant 2: 1 ms + 41 us; tenant 1 may spend 4 ms + that: one 5.001 ms token at 4,000.
        let plan = schedule(&running, &[], &guarded);
        assert_eq!(plan.work.len(), 1 + 1, "{:?}", plan.work);
        assert!((plan.credits[&1] - (0.005041 - 0.005001)).abs() < 1e-9, "the rest is saved");
    }

    #[test]
    fn decode_growth_past_the_kv_budget_preempts_the_largest_tenants_latest() {
        // 4 decoding sequences of 100 positions hold the whole budget; each needs one more.
        let b = Budget { kv_tokens: 400, ..B };
        let running = [
            Running { tenant: 1, ..run(1, 0, 0) },
            Running { tenant: 2, reserve: 150, ..run(2, 0, 0) },
            Running { tenant: 2, reserve: 150, ..run(3, 0, 0) },
        ];
        let plan = schedule(&running, &[], &Budget { kv_tokens: 402, ..b });
        assert_eq!(plan.preempt, vec![3], "tenant 2 holds the most; its latest goes");
        assert_eq!(plan.work, vec![(1, 1), (2, 1)]);
        // Room for the growth: nothing is preempted.
        assert!(schedule(&running, &[], &Budget { kv_tokens: 403, ..b }).preempt.is_empty());
    }
}
