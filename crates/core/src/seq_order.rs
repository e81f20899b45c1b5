//! The `seq_id` order of one Tinker training model's calls: a pure ledger (no clock, no locks),
//! driven by the Tinker service (`tandem_tinker::registry`, its `ModelEntry`).
//!
//! The SDK numbers a model's training calls 1, 2, 3, ... and may send them in parallel; they run
//! in that order. The rules, each of which keeps a model from wedging (issue 50):
//! - every `seq_id` received is consumed by whatever answer it gets: a call refused for its own
//!   input still takes its place, answered at once ([`SeqOrder::arrive`] then
//!   [`SeqOrder::finish`], which may come before its turn: the order then skips it), so the
//!   calls after it run;
//! - a retry of a received `seq_id` gets the first call's request id (its future);
//! - a call waits untimed only behind calls that were all received (running work, bounded by its
//!   own size); at a gap (an earlier `seq_id` never received) its wait is timed by the caller, and
//!   when that time is up [`SeqOrder::give_up`] declares the missing ids lost and this call failed:
//!   the order moves past all of them, and a lost call arriving later is answered as given up.
//!   Only gaps of up to [`LOSS_WINDOW`] ids are declared lost: a `seq_id` forged far ahead (no
//!   SDK has that many calls in flight) fails alone and takes nobody's place.

use std::collections::BTreeMap;

/// Retries are recognised for this many `seq_id`s behind the next one to run.
pub const RETAINED: u64 = 4096;
/// The widest gap a call that gave up declares lost (the SDK keeps at most a few hundred calls
/// in flight per session).
pub const LOSS_WINDOW: u64 = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    /// Received, waiting or running: its request id.
    Waiting(String),
    /// Answered already (failed at a gap), or finished: its request id.
    Answered(String),
    /// Never received before a later call gave up waiting for it.
    Lost,
}

/// What a call's arrival is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// A new call, now in the order.
    New,
    /// A retry of a call received before: its request id.
    Retry(String),
    /// A `seq_id` that was declared lost while a later call waited for it: answer it as failed.
    GivenUp,
    /// Before the first `seq_id` (1), or so far behind that it is no longer remembered.
    OutOfRange,
}

/// Where a waiting call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Every earlier call has been answered: it runs now.
    Now,
    /// Earlier calls were all received and some are still to run: it waits, untimed.
    Behind,
    /// `seq_id` `.0` was never received: it waits, timed by the caller.
    Gap(u64),
    /// It was answered already (it failed at a gap): it never runs.
    Answered,
}

#[derive(Debug, Clone)]
pub struct SeqOrder {
    /// The next `seq_id` to run; every id below it is answered or lost.
    next: u64,
    slots: BTreeMap<u64, Slot>,
    /// Resumed and no call received yet: the first to arrive sets `next`.
    floating: bool,
}

impl Default for SeqOrder {
    fn default() -> Self {
        SeqOrder { next: 1, slots: BTreeMap::new(), floating: false }
    }
}

impl SeqOrder {
    /// The order of a model rebuilt on another node after the node holding it stopped: which
    /// calls that node had taken is unknown (they are lost), so the first call to arrive starts
    /// the order, and later calls wait only for the ids after it.
    pub fn resumed() -> Self {
        SeqOrder { floating: true, ..SeqOrder::default() }
    }

    /// The next `seq_id` to run.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// What call `seq` arriving would be, changing nothing.
    pub fn peek(&self, seq: i64) -> Arrival {
        if seq < 1 {
            return Arrival::OutOfRange;
        }
        match self.slots.get(&(seq as u64)) {
            Some(Slot::Waiting(id) | Slot::Answered(id)) => Arrival::Retry(id.clone()),
            Some(Slot::Lost) => Arrival::GivenUp,
            None if (seq as u64) < self.next => Arrival::OutOfRange,
            None => Arrival::New,
        }
    }

    /// Call `seq` arrives with request id `request` (taken into the order when it is new).
    pub fn arrive(&mut self, seq: i64, request: &str) -> Arrival {
        let arrival = self.peek(seq);
        if arrival == Arrival::New {
            if std::mem::take(&mut self.floating) {
                self.next = seq as u64;
            }
            self.slots.insert(seq as u64, Slot::Waiting(request.to_string()));
        }
        arrival
    }

    /// Where call `seq` (received) stands.
    pub fn turn(&self, seq: u64) -> Turn {
        if matches!(self.slots.get(&seq), Some(Slot::Answered(_))) || seq < self.next {
            return Turn::Answered;
        }
        if seq == self.next {
            return Turn::Now;
        }
        match (self.next..seq).find(|s| !self.slots.contains_key(s)) {
            Some(missing) => Turn::Gap(missing),
            None => Turn::Behind,
        }
    }

    /// Call `seq` has its answer (it ran, or failed whatever the reason): the order moves on.
    pub fn finish(&mut self, seq: u64) {
        if let Some(slot) = self.slots.get_mut(&seq) {
            if let Slot::Waiting(id) = slot {
                *slot = Slot::Answered(std::mem::take(id));
            }
        }
        self.advance();
    }

    /// Call `seq` waited its time at a gap: every `seq_id` before it not received is lost, and
    /// `seq` itself is answered (failed). The first lost id, for the caller's message; `None`
    /// when the gap had closed meanwhile (then nothing changes and the call goes on waiting).
    pub fn give_up(&mut self, seq: u64) -> Option<u64> {
        let Turn::Gap(first) = self.turn(seq) else { return None };
        if seq - self.next <= LOSS_WINDOW {
            for s in first..seq {
                self.slots.entry(s).or_insert(Slot::Lost);
            }
        }
        self.finish(seq);
        Some(first)
    }

    /// Moves `next` past every answered or lost slot, and forgets those too far behind.
    fn advance(&mut self) {
        while matches!(self.slots.get(&self.next), Some(Slot::Answered(_) | Slot::Lost)) {
            self.next += 1;
        }
        let floor = self.next.saturating_sub(RETAINED);
        while self.slots.first_key_value().is_some_and(|(s, _)| *s < floor) {
            self.slots.pop_first();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_run_in_order_and_retries_get_the_first_request() {
        let mut o = SeqOrder::default();
        assert_eq!(o.arrive(2, "r2"), Arrival::New);
        assert_eq!(o.turn(2), Turn::Gap(1));
        assert_eq!(o.arrive(1, "r1"), Arrival::New);
        assert_eq!((o.turn(1), o.turn(2)), (Turn::Now, Turn::Behind));
        assert_eq!(o.arrive(2, "again"), Arrival::Retry("r2".into()));
        o.finish(1);
        assert_eq!(o.turn(2), Turn::Now);
        o.finish(2);
        assert_eq!(o.next(), 3);
        assert_eq!(o.arrive(1, "late"), Arrival::Retry("r1".into()), "a finished call's retry");
        assert_eq!(o.arrive(0, "zero"), Arrival::OutOfRange);
    }

    /// Issue 50's first probe: a refused call still consumes its seq_id, answered before its
    /// turn or in it.
    #[test]
    fn a_refused_call_consumes_its_seq_id() {
        let mut o = SeqOrder::default();
        o.arrive(1, "r1");
        o.arrive(3, "refused");
        o.finish(3);
        assert_eq!(o.turn(3), Turn::Answered);
        assert_eq!(o.next(), 1, "1 still runs first");
        o.arrive(2, "r2");
        o.finish(1);
        assert_eq!(o.turn(2), Turn::Now);
        o.finish(2);
        assert_eq!(o.next(), 4, "past the refused 3");
        assert_eq!(o.arrive(3, "again"), Arrival::Retry("refused".into()));
    }

    /// Issue 50's second probe: call 2 fails at the gap of 1; 1 arriving late is given up, not
    /// run; 3 runs at once; a retry of 2 gets 2's (failed) request.
    #[test]
    fn a_timed_out_gap_moves_the_order_past_it() {
        let mut o = SeqOrder::default();
        o.arrive(2, "r2");
        assert_eq!(o.give_up(2), Some(1));
        assert_eq!(o.next(), 3);
        assert_eq!(o.arrive(1, "r1"), Arrival::GivenUp);
        assert_eq!(o.arrive(3, "r3"), Arrival::New);
        assert_eq!(o.turn(3), Turn::Now);
        assert_eq!(o.arrive(2, "again"), Arrival::Retry("r2".into()));
    }

    #[test]
    fn calls_received_inside_a_gap_keep_their_turn() {
        let mut o = SeqOrder::default();
        o.arrive(1, "r1");
        o.arrive(3, "r3");
        o.arrive(5, "r5");
        // 5 gives up first: 2 and 4 are lost; 1 and 3 still run, in order.
        assert_eq!(o.give_up(5), Some(2));
        assert_eq!(o.turn(1), Turn::Now);
        assert_eq!(o.turn(3), Turn::Behind, "2 is lost, not missing: no gap");
        assert_eq!(o.turn(5), Turn::Answered);
        o.finish(1);
        assert_eq!(o.turn(3), Turn::Now);
        o.finish(3);
        assert_eq!(o.next(), 6, "past the lost 4 and the answered 5");
        assert_eq!(o.arrive(4, "r4"), Arrival::GivenUp);
    }

    /// A forged seq_id far ahead gives up alone: the calls before it keep their places.
    #[test]
    fn a_gap_wider_than_the_window_declares_nothing_lost() {
        let mut o = SeqOrder::default();
        let far = 2 + LOSS_WINDOW + 1;
        o.arrive(far as i64, "far");
        assert_eq!(o.give_up(far), Some(1));
        assert_eq!(o.slots.len(), 1, "no lost slots were written");
        assert_eq!(o.arrive(1, "r1"), Arrival::New);
        assert_eq!(o.turn(1), Turn::Now);
        assert_eq!(o.turn(far), Turn::Answered);
    }

    #[test]
    fn a_gap_closed_meanwhile_is_not_given_up() {
        let mut o = SeqOrder::default();
        o.arrive(2, "r2");
        o.arrive(1, "r1");
        assert_eq!(o.give_up(2), None);
        assert_eq!(o.turn(2), Turn::Behind);
    }

    #[test]
    fn a_resumed_order_starts_at_its_first_call() {
        let mut o = SeqOrder::resumed();
        assert_eq!(o.arrive(0, "r0"), Arrival::OutOfRange);
        assert_eq!(o.arrive(41, "r41"), Arrival::New);
        assert_eq!((o.next(), o.turn(41)), (41, Turn::Now), "no gap behind the first call");
        assert_eq!(o.arrive(43, "r43"), Arrival::New);
        assert_eq!(o.turn(43), Turn::Gap(42), "after it, the order is the usual one");
        assert_eq!(o.arrive(40, "r40"), Arrival::OutOfRange, "calls before it were the stopped node's");
        o.finish(41);
        assert_eq!(o.arrive(42, "r42"), Arrival::New);
        o.finish(42);
        assert_eq!(o.turn(43), Turn::Now);
    }

    #[test]
    fn old_slots_are_forgotten() {
        let mut o = SeqOrder::default();
        for s in 1..=RETAINED + 10 {
            o.arrive(s as i64, "r");
            o.finish(s);
        }
        assert!(o.slots.len() as u64 <= RETAINED);
        assert_eq!(o.arrive(1, "r"), Arrival::OutOfRange);
        assert_eq!(o.arrive(RETAINED as i64 + 10, "x"), Arrival::Retry("r".into()));
    }
}
