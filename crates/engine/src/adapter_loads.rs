//! Adapter reads from disk: one at a time, taken in turn between entities, on a thread of their
//! own at a lower priority than the engine's.
//!
//! Why: reading an adapter (its safetensors parsed, every matrix rounded to bf16 and laid out as
//! the kernels read it) is CPU work any request on a checkpoint the cache does not hold can
//! start. Run on the requests' own blocking threads, an entity rotating 64 adapters through a
//! small cache kept a dozen reads going at once, and the kernel's scheduler shared the two cores
//! among them and the engine's threads alike: another entity's adapter stream fell to 0.18x its
//! speed alone (session 59, `make bench-adapter-share`), under the engine's own bound of 0.5x
//! for two entities. One read at a time bounds that work to one thread; at nice [`LOAD_NICE`]
//! the engine's threads take the cores whenever they want them (as the trainer's threads do,
//! `tandem_train::trainer::TRAIN_NICE`); and turns by entity (the one whose last turn is oldest
//! goes next, its reads in arrival order) keep another entity's queue of reads from holding up
//! a victim's first read for longer than one read per entity waiting.
//!
//! [`Turns`] is the pure ledger; [`Loads`] the thread and the waiting around it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The loader thread's niceness (0 is the engine's; 19 the lowest).
pub const LOAD_NICE: i32 = 10;

/// Whose read goes next.
#[derive(Default)]
pub(crate) struct Turns {
    /// Each entity's waiting reads (tickets), in arrival order.
    waiting: BTreeMap<String, VecDeque<u64>>,
    /// The turn count at each entity's last turn, while anything waits.
    last: HashMap<String, u64>,
    turns: u64,
    tickets: u64,
}

impl Turns {
    /// Queues a read of `entity`'s; returns its ticket.
    pub fn arrive(&mut self, entity: &str) -> u64 {
        self.tickets += 1;
        self.waiting.entry(entity.to_string()).or_default().push_back(self.tickets);
        self.tickets
    }

    /// The next read to run: the oldest of the entity whose last turn is the oldest (never is
    /// oldest of all; ties go to the earlier ticket). Forgets the turns once nothing waits, so
    /// an entity arriving at an idle loader is not held behind its own past.
    pub fn next(&mut self) -> Option<u64> {
        let (entity, _) = self.waiting.iter().min_by_key(|(e, q)| (self.last.get(*e).copied().unwrap_or(0), q[0]))?;
        let entity = entity.clone();
        let queue = self.waiting.get_mut(&entity).expect("the entity waits");
        let ticket = queue.pop_front().expect("queues are never empty");
        if queue.is_empty() {
            self.waiting.remove(&entity);
        }
        self.turns += 1;
        self.last.insert(entity, self.turns);
        if self.waiting.is_empty() {
            self.last.clear();
        }
        Some(ticket)
    }
}

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    turns: Turns,
    jobs: HashMap<u64, Job>,
    running: bool,
}

/// The loader: [`Loads::run`] queues a read and waits for its result.
#[derive(Default)]
pub(crate) struct Loads {
    state: Mutex<State>,
    work: Condvar,
}

impl Loads {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `read` on the loader thread in `entity`'s turn and returns what it returned; `None`
    /// if it panicked. Blocks the caller (a blocking thread) until then.
    pub fn run<R: Send + 'static>(
        self: &Arc<Self>,
        entity: &str,
        read: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let start = {
            let mut s = self.state();
            let ticket = s.turns.arrive(entity);
            s.jobs.insert(ticket, Box::new(move || drop(tx.send(read()))));
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            let loads = self.clone();
            let spawned = std::thread::Builder::new().name("tandem-adapter-loads".into()).spawn(move || loads.serve());
            if spawned.is_err() {
                // No thread: this caller serves the queue itself (at its own priority) until it
                // is empty, and the next read tries to start the thread again.
                tracing::warn!("could not start the adapter loader thread; reading on the request's thread");
                loop {
                    self.serve_until_idle();
                    let mut s = self.state();
                    if s.jobs.is_empty() {
                        s.running = false;
                        break;
                    }
                }
            }
        } else {
            self.work.notify_one();
        }
        rx.recv().ok()
    }

    /// The loader thread: lowers its priority, then runs reads in turn until idle for a while
    /// with no one else holding the loader (the engine was dropped).
    fn serve(self: Arc<Self>) {
        lower_priority();
        loop {
            self.serve_until_idle();
            // Checked under the lock before waiting, so that a read queued after the last
            // pass is never left for the timeout.
            let mut s = self.state();
            while s.jobs.is_empty() {
                let (guard, wait) =
                    self.work.wait_timeout(s, Duration::from_secs(10)).unwrap_or_else(|e| e.into_inner());
                s = guard;
                if wait.timed_out() && s.jobs.is_empty() && Arc::strong_count(&self) == 1 {
                    s.running = false;
                    return;
                }
            }
        }
    }

    /// Runs queued reads in turn until none is left.
    fn serve_until_idle(&self) {
        loop {
            let job = {
                let mut s = self.state();
                match s.turns.next() {
                    Some(ticket) => s.jobs.remove(&ticket).expect("every ticket has its job"),
                    None => return,
                }
            };
            // A panicking read drops its sender: its caller gets `None`, the loader goes on.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        }
    }
}

fn lower_priority() {
    if let Err(e) = tandem_model::priority::set_this_thread(LOAD_NICE) {
        tracing::warn!(error = %e, "could not lower the priority of the adapter loader thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_take_turns_and_each_keeps_its_order() {
        // a queues three reads, then b two, then c one: a1 (first ticket), then b and c, whose
        // last turns (never) are older than a's, in ticket order, then a, b, a.
        let mut t = Turns::default();
        let a: Vec<u64> = (0..3).map(|_| t.arrive("a")).collect();
        let b: Vec<u64> = (0..2).map(|_| t.arrive("b")).collect();
        let c = t.arrive("c");
        let order: Vec<u64> = std::iter::from_fn(|| t.next()).collect();
        assert_eq!(order, [a[0], b[0], c, a[1], b[1], a[2]]);
        assert_eq!(t.next(), None);
    }

    #[test]
    fn an_arrival_waits_at_most_one_read_per_entity_ahead() {
        // a has 50 reads queued and one ran; v arrives: v goes next, not after a's 49.
        let mut t = Turns::default();
        for _ in 0..50 {
            t.arrive("a");
        }
        t.next();
        let v = t.arrive("v");
        assert_eq!(t.next(), Some(v));
        // Once idle the turns are forgotten: a arriving alone goes at once.
        while t.next().is_some() {}
        let a = t.arrive("a");
        assert_eq!(t.next(), Some(a));
    }

    #[test]
    fn reads_run_on_one_lower_priority_thread_and_a_panic_is_contained() {
        let loads = Arc::new(Loads::default());
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let loads = loads.clone();
                std::thread::spawn(move || {
                    loads.run(if i % 2 == 0 { "a" } else { "b" }, move || {
                        (i, std::thread::current().name().map(String::from))
                    })
                })
            })
            .collect();
        for (i, h) in threads.into_iter().enumerate() {
            let (got, name) = h.join().unwrap().expect("a result");
            assert_eq!(got, i);
            assert_eq!(name.as_deref(), Some("tandem-adapter-loads"));
        }
        assert_eq!(loads.run("a", || panic!("a bad file")), None::<()>);
        #[cfg(target_os = "linux")]
        assert_eq!(loads.run("a", || tandem_model::priority::of_this_thread().unwrap()), Some(LOAD_NICE));
    }
}
