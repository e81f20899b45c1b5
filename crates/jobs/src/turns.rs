//! Time-slicing the trainer between entities' jobs at gradient-step boundaries.
//!
//! A worker runs one job per entity at once, each on its own blocking thread that keeps the
//! job's adapter, optimizer state and packed rows in memory; only the thread holding the turn
//! computes. At each step boundary the holder offers the turn back, and the waiter that has
//! used the least trainer time gets it (a newcomer starts level with the least-served runner,
//! as VTC lifts a new client's counter, so it can neither bank credit nor be starved). A small
//! job of another entity therefore starts within one gradient step of a long one, and entities
//! with work share the trainer's time equally, in steps' granularity.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// The pure bookkeeping of turns: who holds it, who waits, and each run's trainer time.
#[derive(Debug, Default)]
pub struct Ledger {
    holder: Option<u64>,
    /// Waiting runs in arrival order (ties in time go to the earliest).
    waiting: Vec<u64>,
    /// Seconds each present run (holder or waiting) has held the turn, lifted on arrival.
    used: HashMap<u64, f64>,
}

impl Ledger {
    /// A run arrives; `true` when it holds the turn at once (nobody did).
    pub fn arrive(&mut self, id: u64) -> bool {
        let floor = self.used.values().copied().fold(f64::INFINITY, f64::min);
        self.used.insert(id, if floor.is_finite() { floor } else { 0.0 });
        if self.holder.is_none() {
            self.holder = Some(id);
            true
        } else {
            self.waiting.push(id);
            false
        }
    }

    /// The holder reaches a step boundary after `secs` of work: the run that gets the turn
    /// next (the holder again when nobody waits or it is still the least served).
    pub fn boundary(&mut self, id: u64, secs: f64) -> u64 {
        debug_assert_eq!(self.holder, Some(id));
        *self.used.entry(id).or_default() += secs.max(0.0);
        if self.waiting.is_empty() {
            return id;
        }
        self.waiting.push(id);
        let next = self.take_least_served();
        self.holder = Some(next);
        next
    }

    /// The holder ends (or a waiter leaves): the run that holds the turn afterwards, if any.
    pub fn leave(&mut self, id: u64) -> Option<u64> {
        self.used.remove(&id);
        self.waiting.retain(|w| *w != id);
        if self.holder == Some(id) {
            self.holder = if self.waiting.is_empty() { None } else { Some(self.take_least_served()) };
        }
        self.holder
    }

    pub fn holder(&self) -> Option<u64> {
        self.holder
    }

    fn take_least_served(&mut self) -> u64 {
        let used = |id: &u64| self.used.get(id).copied().unwrap_or(0.0);
        let (mut best, mut best_used) = (0, f64::INFINITY);
        for (i, id) in self.waiting.iter().enumerate() {
            if used(id) < best_used {
                (best, best_used) = (i, used(id));
            }
        }
        self.waiting.remove(best)
    }
}

/// The turn shared by a worker's runs: threads block on it between steps.
#[derive(Debug, Default)]
pub struct Turns {
    ledger: Mutex<(Ledger, u64)>,
    changed: Condvar,
}

/// A run's place at the turn. It holds the turn from [`Turns::enter`]'s return to each
/// [`Turn::boundary`] call, and after it; dropping it leaves.
pub struct Turn {
    turns: Arc<Turns>,
    id: u64,
    since: Instant,
}

impl Turns {
    /// Waits until this run holds the turn.
    pub fn enter(self: &Arc<Self>) -> Turn {
        let mut g = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        g.1 += 1;
        let id = g.1;
        if !g.0.arrive(id) {
            while g.0.holder() != Some(id) {
                g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        Turn { turns: self.clone(), id, since: Instant::now() }
    }

    /// Runs present: holding or waiting for the turn.
    pub fn runs(&self) -> usize {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).0.used.len()
    }
}

impl Turn {
    /// A step boundary: hands the turn to a less-served waiting run, if any, and waits until
    /// it comes back. Returns at once when nobody waits.
    pub fn boundary(&mut self) {
        let turns = &self.turns;
        let mut g = turns.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let next = g.0.boundary(self.id, self.since.elapsed().as_secs_f64());
        if next != self.id {
            turns.changed.notify_all();
            while g.0.holder() != Some(self.id) {
                g = turns.changed.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        self.since = Instant::now();
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut g = self.turns.ledger.lock().unwrap_or_else(|e| e.into_inner());
        g.0.leave(self.id);
        self.turns.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newcomer_gets_the_turn_at_the_next_boundary_and_time_is_shared() {
        let mut l = Ledger::default();
        assert!(l.arrive(1));
        // Alone, the holder keeps the turn step after step.
        assert_eq!(l.boundary(1, 10.0), 1);
        assert_eq!(l.boundary(1, 10.0), 1);
        // A newcomer starts level with the least served (1 has used 20 s, so does 2 now)...
        assert!(!l.arrive(2));
        // ...and gets the turn at 1's next boundary: 1 has used 25 s, 2 has 20 s.
        assert_eq!(l.boundary(1, 5.0), 2);
        // 2's steps are short: it keeps the turn while it has used less than 1 (25 s).
        assert_eq!(l.boundary(2, 2.0), 2); // 22
        assert_eq!(l.boundary(2, 2.0), 2); // 24
        assert_eq!(l.boundary(2, 2.0), 1); // 26 > 25
        assert_eq!(l.boundary(1, 5.0), 2); // 30 > 26
                                           // 2 ends: 1 holds the turn again.
        assert_eq!(l.leave(2), Some(1));
        assert_eq!(l.leave(1), None);
        assert_eq!(l.holder(), None);
    }

    #[test]
    fn three_runs_rotate_by_least_time_with_ties_to_the_earliest() {
        let mut l = Ledger::default();
        assert!(l.arrive(1));
        assert!(!l.arrive(2));
        assert!(!l.arrive(3));
        // All at 0: the earliest waiter (2) goes first; then 3; then 1 (ties by arrival).
        assert_eq!(l.boundary(1, 1.0), 2);
        assert_eq!(l.boundary(2, 1.0), 3);
        assert_eq!(l.boundary(3, 1.0), 1);
        // A waiter that leaves is skipped.
        assert_eq!(l.leave(2), Some(1));
        assert_eq!(l.boundary(1, 1.0), 3);
        // A newcomer arrives level with the least served present: 3's recorded 1 s (1 has 2 s).
        assert!(!l.arrive(4));
        assert_eq!(l.boundary(3, 0.5), 4); // 3: 1.5 s, 4: 1 s
        assert_eq!(l.boundary(4, 0.6), 3); // 4: 1.6 s > 3's 1.5 s
        assert_eq!(l.boundary(3, 0.6), 4); // 3: 2.1 s; 1: 2 s; 4: 1.6 s
        assert_eq!(l.boundary(4, 0.5), 1); // 4: 2.1 s; 1's 2 s is the least
    }

    #[test]
    fn threads_alternate_at_boundaries() {
        let turns = Arc::new(Turns::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut first = turns.enter();
        let (t2, l2) = (turns.clone(), log.clone());
        let second = std::thread::spawn(move || {
            let mut turn = t2.enter();
            for i in 0..3 {
                l2.lock().unwrap().push(("b", i));
                std::thread::sleep(std::time::Duration::from_millis(20));
                turn.boundary();
            }
        });
        while turns.runs() < 2 {
            std::thread::yield_now();
        }
        for i in 0..3 {
            log.lock().unwrap().push(("a", i));
            std::thread::sleep(std::time::Duration::from_millis(20));
            first.boundary();
        }
        drop(first);
        second.join().unwrap();
        let log = log.lock().unwrap().clone();
        // a's first step, then b's: b arrived level with a's recorded time, and a has used
        // more at its first boundary. After that the order follows the measured times.
        assert_eq!(&log[..2], &[("a", 0), ("b", 0)], "{log:?}");
        assert_eq!(log.len(), 6);
    }
}
