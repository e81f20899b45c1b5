//! Time-slicing the trainer between entities' jobs at gradient-step boundaries.
//!
//! A worker runs one job per entity at once, each on its own blocking thread that keeps the
//! job's adapter, optimizer state and packed rows in memory; only the thread holding the turn
//! computes. At each step boundary the holder offers the turn back, and the waiter that has
//! used the least trainer time gets it (a newcomer starts level with the least-served runner,
//! as VTC lifts a new client's counter, so it can neither bank credit nor be starved). A small
//! job of another entity therefore starts within one gradient step of a long one, and entities
//! with work share the trainer's time equally, in steps' granularity.
//!
//! Time is charged to an account: a run entered for an entity ([`Turns::enter_for`]: its jobs,
//! its Tinker calls) shares that entity's, so an entity's many short Tinker calls add up as one
//! long job's steps do, and its next call starts behind entities that used less (issue 50: each
//! call had started level with the least served, its time forgotten when it ended). An entity's
//! time is kept while the trainer has any work and forgotten when it is idle.

use std::collections::{HashMap, HashSet};

/// Whose time a run's work is: an entity's (shared by all its runs) or the run's own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Account {
    Entity(String),
    Run(u64),
}
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// What the holder does at a step boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Go on: nobody waits, or the holder is still the least served.
    Keep,
    /// The turn went to this run; wait for it to come back.
    Pass(u64),
    /// The least-served waiter is parked and every held place is taken: park (free this run's
    /// memory), then [`Ledger::park`] hands the turn over.
    Park,
}

/// The pure bookkeeping of turns: who holds it, who waits, each run's trainer time, and whose
/// state is in memory.
#[derive(Debug)]
pub struct Ledger {
    holder: Option<u64>,
    /// Waiting runs in arrival order (ties in time go to the earliest).
    waiting: Vec<u64>,
    /// Each present run's (holder or waiting) account.
    runs: HashMap<u64, Account>,
    /// Seconds each account's runs have held the turn, lifted on arrival to the least of the
    /// accounts present; kept while the trainer has work, cleared when it has none.
    used: HashMap<Account, f64>,
    /// Runs whose adapter and optimizer are in memory; a run that has not started or that
    /// parked is not among them.
    held: HashSet<u64>,
    /// Most runs held in memory at once (`--max-training-runs`).
    capacity: usize,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger::new(usize::MAX)
    }
}

impl Ledger {
    pub fn new(capacity: usize) -> Self {
        Ledger {
            holder: None,
            waiting: Vec::new(),
            runs: HashMap::new(),
            used: HashMap::new(),
            held: HashSet::new(),
            capacity: capacity.max(1),
        }
    }

    /// A run arrives with its own account; `true` when it holds the turn at once (nobody did).
    pub fn arrive(&mut self, id: u64) -> bool {
        self.arrive_as(id, Account::Run(id))
    }

    /// A run arrives, charged to `account`; `true` when it holds the turn at once. The account
    /// is lifted to the least time of the accounts present, so it banks no credit; one that has
    /// used more keeps its time (its runs wait behind the less served).
    pub fn arrive_as(&mut self, id: u64, account: Account) -> bool {
        if self.runs.is_empty() {
            // An idle trainer: nobody is owed anything.
            self.used.clear();
        }
        let present: HashSet<&Account> = self.runs.values().collect();
        let floor = present.iter().map(|a| self.used.get(*a).copied().unwrap_or(0.0)).fold(f64::INFINITY, f64::min);
        let floor = if floor.is_finite() { floor } else { 0.0 };
        let t = self.used.entry(account.clone()).or_insert(floor);
        *t = t.max(floor);
        self.runs.insert(id, account);
        if self.holder.is_none() {
            self.give(id);
            true
        } else {
            self.waiting.push(id);
            false
        }
    }

    /// The holder reaches a step boundary after `secs` of work. `can_park`: its state can be
    /// parked here (a run that cannot park only passes the turn to runs already in memory, or
    /// to a new one when there is room).
    pub fn boundary(&mut self, id: u64, secs: f64, can_park: bool) -> Next {
        debug_assert_eq!(self.holder, Some(id));
        if let Some(account) = self.runs.get(&id) {
            *self.used.entry(account.clone()).or_default() += secs.max(0.0);
        }
        if self.waiting.is_empty() {
            return Next::Keep;
        }
        let room = self.held.len() < self.capacity;
        self.waiting.push(id);
        let Some(i) = self.least_served(|l, w| can_park || room || l.held.contains(&w)) else {
            self.waiting.retain(|w| *w != id);
            return Next::Keep;
        };
        let next = self.waiting[i];
        if next == id {
            self.waiting.remove(i);
            Next::Keep
        } else if room || self.held.contains(&next) {
            self.waiting.remove(i);
            self.give(next);
            Next::Pass(next)
        } else {
            // Full: the holder parks first; `next` keeps its place in the queue.
            self.waiting.retain(|w| *w != id);
            Next::Park
        }
    }

    /// The holder parked after [`Next::Park`] (`freed`: its memory is free; `false` when
    /// writing its state failed and it stays in memory, over the capacity): the run that holds
    /// the turn now.
    pub fn park(&mut self, id: u64, freed: bool) -> u64 {
        debug_assert_eq!(self.holder, Some(id));
        if freed {
            self.held.remove(&id);
        }
        self.waiting.push(id);
        let next = self.take_least_served().unwrap_or(id);
        self.give(next);
        next
    }

    /// The holder ends (or a waiter leaves): the run that holds the turn afterwards, if any.
    pub fn leave(&mut self, id: u64) -> Option<u64> {
        // A run's own account goes with it; an entity's stays for its next run.
        if let Some(Account::Run(own)) = self.runs.remove(&id) {
            self.used.remove(&Account::Run(own));
        }
        self.held.remove(&id);
        self.waiting.retain(|w| *w != id);
        if self.holder == Some(id) {
            self.holder = None;
            // The leaver's place is free, so the least served fits whoever it is.
            if let Some(next) = self.take_least_served() {
                self.give(next);
            }
        }
        self.holder
    }

    pub fn holder(&self) -> Option<u64> {
        self.holder
    }

    /// Runs whose state is in memory.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    fn give(&mut self, id: u64) {
        self.holder = Some(id);
        self.held.insert(id);
    }

    /// Seconds run `id`'s account has used.
    fn used_by(&self, id: &u64) -> f64 {
        self.runs.get(id).and_then(|a| self.used.get(a)).copied().unwrap_or(0.0)
    }

    /// The place in `waiting` of the least-served waiter that `fits` (ties: the earliest).
    fn least_served(&self, fits: impl Fn(&Self, u64) -> bool) -> Option<usize> {
        let used = |id: &u64| self.used_by(id);
        let mut best: Option<(usize, f64)> = None;
        for (i, id) in self.waiting.iter().enumerate() {
            if fits(self, *id) && best.is_none_or(|(_, b)| used(id) < b) {
                best = Some((i, used(id)));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Removes and returns the least-served waiter, whoever it is.
    fn take_least_served(&mut self) -> Option<u64> {
        self.least_served(|_, _| true).map(|i| self.waiting.remove(i))
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
    /// Turns for runs of which at most `capacity` are held in memory at once.
    pub fn new(capacity: usize) -> Self {
        Turns { ledger: Mutex::new((Ledger::new(capacity), 0)), changed: Condvar::new() }
    }

    /// Waits until this run holds the turn (its time its own).
    pub fn enter(self: &Arc<Self>) -> Turn {
        self.enter_as(None)
    }

    /// Waits until this run holds the turn, its time charged to `entity` with that entity's
    /// other runs.
    pub fn enter_for(self: &Arc<Self>, entity: &str) -> Turn {
        self.enter_as(Some(entity))
    }

    fn enter_as(self: &Arc<Self>, entity: Option<&str>) -> Turn {
        let mut g = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        g.1 += 1;
        let id = g.1;
        let account = entity.map_or(Account::Run(id), |e| Account::Entity(e.to_string()));
        if !g.0.arrive_as(id, account) {
            while g.0.holder() != Some(id) {
                g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        Turn { turns: self.clone(), id, since: Instant::now() }
    }

    /// Runs present: holding or waiting for the turn.
    pub fn runs(&self) -> usize {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).0.runs.len()
    }

    /// Runs whose state is in memory.
    pub fn held(&self) -> usize {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).0.held()
    }
}

impl Turn {
    /// A step boundary of a run that cannot park here: hands the turn to a less-served waiting
    /// run in memory (or a new one, when there is room) and waits until it comes back.
    pub fn boundary(&mut self) {
        let parked = self.boundary_or_park(false);
        debug_assert!(!parked);
    }

    /// A step boundary of a run that can park: `true` when it must park now and then call
    /// [`Turn::park`]; otherwise as [`Turn::boundary`].
    pub fn boundary_or_park(&mut self, can_park: bool) -> bool {
        let turns = &self.turns;
        let mut g = turns.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let next = g.0.boundary(self.id, self.since.elapsed().as_secs_f64(), can_park);
        self.since = Instant::now();
        match next {
            Next::Keep => false,
            Next::Park => true,
            Next::Pass(_) => {
                turns.changed.notify_all();
                while g.0.holder() != Some(self.id) {
                    g = turns.changed.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                self.since = Instant::now();
                false
            }
        }
    }

    /// After parking (`freed`: the state left memory): hands the turn over and waits until it
    /// comes back; the run then reads its state back.
    pub fn park(&mut self, freed: bool) {
        let turns = &self.turns;
        let mut g = turns.ledger.lock().unwrap_or_else(|e| e.into_inner());
        if g.0.park(self.id, freed) != self.id {
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

    /// The run holding the turn after `id`'s boundary (no parking: capacity is unbounded).
    fn b(l: &mut Ledger, id: u64, secs: f64) -> u64 {
        match l.boundary(id, secs, true) {
            Next::Keep => id,
            Next::Pass(n) => n,
            Next::Park => panic!("parked with unbounded capacity"),
        }
    }

    #[test]
    fn a_newcomer_gets_the_turn_at_the_next_boundary_and_time_is_shared() {
        let mut l = Ledger::default();
        assert!(l.arrive(1));
        // Alone, the holder keeps the turn step after step.
        assert_eq!(b(&mut l, 1, 10.0), 1);
        assert_eq!(b(&mut l, 1, 10.0), 1);
        // A newcomer starts level with the least served (1 has used 20 s, so does 2 now)...
        assert!(!l.arrive(2));
        // ...and gets the turn at 1's next boundary: 1 has used 25 s, 2 has 20 s.
        assert_eq!(b(&mut l, 1, 5.0), 2);
        // 2's steps are short: it keeps the turn while it has used less than 1 (25 s).
        assert_eq!(b(&mut l, 2, 2.0), 2); // 22
        assert_eq!(b(&mut l, 2, 2.0), 2); // 24
        assert_eq!(b(&mut l, 2, 2.0), 1); // 26 > 25
        assert_eq!(b(&mut l, 1, 5.0), 2); // 30 > 26

        // 2 ends: 1 holds the turn again.
        assert_eq!(l.leave(2), Some(1));
        assert_eq!(l.leave(1), None);
        assert_eq!(l.holder(), None);
    }

    /// An entity's runs share its time (issue 50): its second short call starts behind another
    /// entity that used less, not level with it; the time is forgotten once the trainer idles.
    #[test]
    fn an_entitys_calls_share_its_time() {
        let a = || Account::Entity("a".into());
        let mut l = Ledger::default();
        assert!(l.arrive_as(1, Account::Entity("b".into())));
        assert!(!l.arrive_as(2, a()));
        assert_eq!(b(&mut l, 1, 1.0), 2); // b: 1 s; a: 0
        assert_eq!(b(&mut l, 2, 5.0), 1); // a: 5 s
                                          // a's call ends and its next one arrives: it keeps a's 5 s (the floor is b's 1 s).
        assert_eq!(l.leave(2), Some(1));
        assert!(!l.arrive_as(3, a()));
        assert_eq!(b(&mut l, 1, 1.0), 1, "b (2 s) is still behind a (5 s)");
        assert_eq!(b(&mut l, 1, 3.5), 3, "b (5.5 s) has now used more");
        // With a run's own account (Turns::enter), each call starts at the floor, as before.
        assert_eq!(l.leave(3), Some(1));
        assert!(!l.arrive(4));
        assert_eq!(b(&mut l, 1, 0.1), 4);
        // Idle: the entities' times are forgotten.
        l.leave(4);
        l.leave(1);
        assert!(l.arrive_as(5, a()));
        assert_eq!(l.used_by(&5), 0.0);
    }

    #[test]
    fn three_runs_rotate_by_least_time_with_ties_to_the_earliest() {
        let mut l = Ledger::default();
        assert!(l.arrive(1));
        assert!(!l.arrive(2));
        assert!(!l.arrive(3));
        // All at 0: the earliest waiter (2) goes first; then 3; then 1 (ties by arrival).
        assert_eq!(b(&mut l, 1, 1.0), 2);
        assert_eq!(b(&mut l, 2, 1.0), 3);
        assert_eq!(b(&mut l, 3, 1.0), 1);
        // A waiter that leaves is skipped.
        assert_eq!(l.leave(2), Some(1));
        assert_eq!(b(&mut l, 1, 1.0), 3);
        // A newcomer arrives level with the least served present: 3's recorded 1 s (1 has 2 s).
        assert!(!l.arrive(4));
        assert_eq!(b(&mut l, 3, 0.5), 4); // 3: 1.5 s, 4: 1 s
        assert_eq!(b(&mut l, 4, 0.6), 3); // 4: 1.6 s > 3's 1.5 s
        assert_eq!(b(&mut l, 3, 0.6), 4); // 3: 2.1 s; 1: 2 s; 4: 1.6 s
        assert_eq!(b(&mut l, 4, 0.5), 1); // 4: 2.1 s; 1's 2 s is the least
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

    #[test]
    fn beyond_the_capacity_the_holder_parks_for_a_less_served_run() {
        let mut l = Ledger::new(2);
        assert!(l.arrive(1));
        assert!(!l.arrive(2));
        assert!(!l.arrive(3));
        // Room for a second run in memory: 2 starts without anyone parking.
        assert_eq!(l.boundary(1, 1.0, true), Next::Pass(2));
        assert_eq!(l.held(), 2);
        // 3 is the least served and memory is full: 2 parks, then 3 gets the turn.
        assert_eq!(l.boundary(2, 1.0, true), Next::Park);
        assert_eq!(l.holder(), Some(2), "the turn stays with the parking run until it has parked");
        assert_eq!(l.park(2, true), 3);
        assert_eq!(l.held(), 2);
        // A run that cannot park passes only to a run in memory (1), never to parked 2.
        assert_eq!(l.boundary(3, 1.0, false), Next::Pass(1));
        // 1 (2 s) parks for 2 (1 s, parked), ties with 3 going to the earliest waiter.
        assert_eq!(l.boundary(1, 1.0, true), Next::Park);
        assert_eq!(l.park(1, true), 2);
        assert_eq!(l.held(), 2);
        // 2 ends: its place is free, and 3 (least served) holds the turn.
        assert_eq!(l.leave(2), Some(3));
        assert_eq!(l.held(), 1);
        // With room, a parked run comes back without anyone parking.
        assert_eq!(l.boundary(3, 5.0, true), Next::Pass(1));
        assert_eq!(l.held(), 2);
    }

    #[test]
    fn a_run_that_could_not_park_still_hands_the_turn_over() {
        let mut l = Ledger::new(1);
        assert!(l.arrive(1));
        assert!(!l.arrive(2));
        // Without room or parking, 1 keeps the turn: 2 is not in memory.
        assert_eq!(l.boundary(1, 1.0, false), Next::Keep);
        assert_eq!(l.boundary(1, 1.0, true), Next::Park);
        // Writing its state failed: 2 gets the turn anyway, over the capacity.
        assert_eq!(l.park(1, false), 2);
        assert_eq!(l.held(), 2);
        assert_eq!(l.boundary(2, 5.0, true), Next::Pass(1));
    }

    #[test]
    fn threads_beyond_the_capacity_park_and_take_turns() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let turns = Arc::new(Turns::new(2));
        let in_memory = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let steps = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (turns, in_memory, most, steps) = (turns.clone(), in_memory.clone(), most.clone(), steps.clone());
                std::thread::spawn(move || {
                    let mut turn = turns.enter();
                    in_memory.fetch_add(1, Ordering::SeqCst);
                    for _ in 0..5 {
                        most.fetch_max(in_memory.load(Ordering::SeqCst), Ordering::SeqCst);
                        steps.lock().unwrap().push(t);
                        std::thread::sleep(std::time::Duration::from_millis(3));
                        if turn.boundary_or_park(true) {
                            in_memory.fetch_sub(1, Ordering::SeqCst);
                            turn.park(true);
                            in_memory.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    in_memory.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let steps = steps.lock().unwrap().clone();
        assert_eq!(steps.len(), 20);
        assert!(most.load(Ordering::SeqCst) <= 2, "more runs in memory than the capacity: {steps:?}");
        // Every run got the turn before any ended: all four appear among the first eight steps.
        let early: HashSet<usize> = steps[..8].iter().copied().collect();
        assert_eq!(early.len(), 4, "{steps:?}");
    }
}
