//! A persistent team of threads for the forward pass's parallel sections.
//!
//! A decode step of the 135M model opens ~150 parallel sections (four matmuls per layer and the
//! output head), ~40 µs each. Rayon runs a section started outside its pool by injecting a job,
//! waking sleeping workers through a futex and putting the caller to sleep on a latch until they
//! are done; `perf` put ~35% of single-stream decode in the kernel's thread switching. A team
//! instead keeps its helper threads spinning on one atomic word between sections, and the thread
//! that opens a section works on it too: a section costs a cache-line transfer, not two wake-ups.
//!
//! The protocol, in one 64-bit word `state` = (`n` << 32) | `next`:
//! - the leader (the thread the team is installed on) publishes a section by storing the job
//!   pointer, zeroing `done`, then storing `state = (n, 0)`;
//! - any thread claims task `i` by a `fetch_add(1)` on `state` that returns `next = i < n`. The
//!   job pointer it then reads is this section's: the leader cannot end the section, let alone
//!   publish another, until `done` counts task `i`;
//! - the leader returns once `done == n`, so the job's borrow outlives every use of it.
//!
//! Helpers spin for [`Team::spin`] after their last task, then sleep on a condvar; the leader
//! wakes sleepers when it publishes. The sleep check is the usual SeqCst pair: a helper
//! increments `sleeping` before its last look at `state`, the leader stores `state` before it
//! reads `sleeping`, so one of them sees the other.
//!
//! Threads other than the leader, and tasks calling [`for_each`] again, fall back to rayon and
//! to running serially: the training pool keeps rayon, and a nested section never deadlocks.
//! (Hand-written rather than a crate: micropool and paralight schedule general work; this needs
//! a fixed count of equal tasks and one atomic, and it is ~200 lines with its tests.)

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A section's job: task `i` for every `i < n`.
type Job<'a> = &'a (dyn Fn(usize) + Sync + 'a);

/// Keeps a field on a cache line of its own (the claimed counter and the done counter are
/// written by every thread; sharing a line with the job pointer would make every read miss).
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

struct Shared {
    state: Padded<AtomicU64>,
    done: Padded<AtomicUsize>,
    /// Points at the leader's `Job` (a fat reference on its stack) while a section is open.
    job: AtomicPtr<()>,
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    spin: Duration,
}

/// The team: `threads - 1` helpers plus whichever thread calls [`Team::install`].
pub struct Team {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    threads: usize,
}

thread_local! {
    /// The team this thread leads, set by [`Team::install`].
    static LEADS: RefCell<Option<Arc<Shared>>> = const { RefCell::new(None) };
    /// Whether this thread is running a team task (a nested section then runs serially).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
    /// The team size seen by [`threads`] on this thread.
    static SIZE: Cell<usize> = const { Cell::new(0) };
}

const fn pack(n: usize, next: usize) -> u64 {
    ((n as u64) << 32) | next as u64
}

const fn unpack(s: u64) -> (usize, usize) {
    ((s >> 32) as usize, (s & 0xffff_ffff) as usize)
}

impl Team {
    /// Starts `threads - 1` helper threads (named `{name}-{i}`) that spin `spin` after their
    /// last task before sleeping.
    pub fn new(threads: usize, spin: Duration, name: &str) -> std::io::Result<Team> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: Padded(AtomicU64::new(0)),
            done: Padded(AtomicUsize::new(0)),
            job: AtomicPtr::new(std::ptr::null_mut()),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            panic: Mutex::new(None),
            spin,
        });
        let mut helpers = Vec::new();
        for i in 1..threads {
            let s = shared.clone();
            let spawned = std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                SIZE.set(threads);
                helper(&s)
            });
            match spawned {
                Ok(h) => helpers.push(h),
                Err(e) => {
                    stop(&shared, helpers);
                    return Err(e);
                }
            }
        }
        Ok(Team { shared, helpers, threads })
    }

    /// Runs `f` with this thread leading the team: [`for_each`] calls made by `f` on this
    /// thread use the team.
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        let before = LEADS.replace(Some(self.shared.clone()));
        let size_before = SIZE.replace(self.threads);
        struct Restore(Option<Arc<Shared>>, usize);
        impl Drop for Restore {
            fn drop(&mut self) {
                LEADS.set(self.0.take());
                SIZE.set(self.1);
            }
        }
        let _restore = Restore(before, size_before);
        f()
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        stop(&self.shared, std::mem::take(&mut self.helpers));
    }
}

fn stop(shared: &Shared, helpers: Vec<JoinHandle<()>>) {
    shared.stop.store(true, SeqCst);
    drop(shared.lock.lock().unwrap_or_else(|p| p.into_inner()));
    shared.wake.notify_all();
    for h in helpers {
        let _ = h.join();
    }
}

/// The threads a parallel section started here would use (for sizing tasks).
pub fn threads() -> usize {
    match SIZE.get() {
        0 => rayon::current_num_threads().max(1),
        n => n,
    }
}

/// Runs `f(i)` for every `i < n` in parallel: on this thread's team if it leads one, else on
/// rayon's current pool; serially inside a team task.
pub fn for_each(n: usize, f: impl Fn(usize) + Sync) {
    if n == 0 {
        return;
    }
    if n == 1 || IN_TASK.get() {
        (0..n).for_each(f);
        return;
    }
    let team = LEADS.with_borrow(|t| t.clone());
    match team {
        Some(team) => run(&team, n, &f),
        _ => {
            use rayon::prelude::*;
            (0..n).into_par_iter().for_each(&f)
        }
    }
}

/// Runs `f(i, chunk)` for each `size`-long chunk `i` of `data` (whose length is a multiple of
/// `size`), in parallel as [`for_each`] does.
pub fn for_each_chunk_mut<T: Send>(data: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    assert!(size > 0 && data.len().is_multiple_of(size), "{} values in chunks of {size}", data.len());
    let shared = Disjoint::new(data);
    // SAFETY: task i takes only chunk i, so no two tasks' slices overlap.
    for_each(shared.len / size, |i| f(i, unsafe { shared.slice(i * size, size) }));
}

/// Runs `f(g, rows)` in parallel for each group `g` of `groups`, `rows` being the `size`-long
/// chunks of `data` the group names, in its order: one task per group. Panics when a chunk is
/// named twice or does not exist (tasks must never share a chunk).
pub fn for_each_group_mut<T: Send>(
    data: &mut [T],
    size: usize,
    groups: &[Vec<usize>],
    f: impl Fn(usize, &mut [&mut [T]]) + Sync,
) {
    assert!(size > 0 && data.len().is_multiple_of(size), "{} values in chunks of {size}", data.len());
    let mut taken = vec![false; data.len() / size];
    for &i in groups.iter().flatten() {
        assert!(!std::mem::replace(&mut taken[i], true), "chunk {i} is in two groups");
    }
    let shared = Disjoint::new(data);
    for_each(groups.len(), |g| {
        // SAFETY: every chunk index exists and lies in one group only (asserted above), so no
        // two tasks', nor two of one task's, slices overlap.
        let mut rows: Vec<&mut [T]> = groups[g].iter().map(|&i| unsafe { shared.slice(i * size, size) }).collect();
        f(g, &mut rows);
    });
}

/// Runs `f(i, j, segment)` in parallel for segment `j` of each `row`-long chunk `i` of `data`,
/// the segments of a chunk being `bounds[j]..bounds[j + 1]` (`bounds` rises strictly from 0 to
/// `row`): one task per (chunk, segment), so a chunk's parts may run on different threads.
pub fn for_each_segment_mut<T: Send>(
    data: &mut [T],
    row: usize,
    bounds: &[usize],
    f: impl Fn(usize, usize, &mut [T]) + Sync,
) {
    assert!(row > 0 && data.len().is_multiple_of(row), "{} values in rows of {row}", data.len());
    assert!(
        bounds.len() >= 2
            && bounds[0] == 0
            && bounds[bounds.len() - 1] == row
            && bounds.windows(2).all(|w| w[0] < w[1]),
        "segment bounds {bounds:?} of a row of {row}"
    );
    let k = bounds.len() - 1;
    let shared = Disjoint::new(data);
    // SAFETY: task u takes segment u % k of row u / k; the bounds rise strictly inside a row
    // (asserted), so no two tasks' slices overlap.
    for_each(shared.len / row * k, |u| {
        let (i, j) = (u / k, u % k);
        f(i, j, unsafe { shared.slice(i * row + bounds[j], bounds[j + 1] - bounds[j]) })
    });
}

/// A mutable slice whose disjoint parts parallel tasks take (each caller says why its parts are
/// disjoint). It holds the `&mut` borrow, so the slice outlives the section.
pub(crate) struct Disjoint<'a, T> {
    ptr: *mut T,
    pub len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: tasks use disjoint parts only (the contract of `slice`), and `T: Send` lets a part
// move to another thread.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}
unsafe impl<T: Send> Send for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    pub fn new(data: &'a mut [T]) -> Self {
        Disjoint { ptr: data.as_mut_ptr(), len: data.len(), _borrow: std::marker::PhantomData }
    }

    /// `data[start..start + len]`.
    ///
    /// # Safety
    /// No other live slice taken from this `Disjoint` overlaps it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len), "{start}+{len} of {}", self.len);
        // SAFETY: in bounds (asserted), borrowed for 'a, and not aliased (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// The leader's side of one section.
fn run(s: &Shared, n: usize, f: &(dyn Fn(usize) + Sync)) {
    assert!(n < 1 << 31, "a section of {n} tasks");
    let job: Job<'_> = f;
    // The job pointer is only dereferenced by claimers of this section's tasks (module doc).
    s.job.store(&job as *const Job<'_> as *mut (), Release);
    s.done.0.store(0, Relaxed);
    s.state.0.store(pack(n, 0), SeqCst);
    if s.sleeping.load(SeqCst) > 0 {
        drop(s.lock.lock().unwrap_or_else(|p| p.into_inner()));
        s.wake.notify_all();
    }
    work(s);
    // Wait for the helpers' claimed tasks; yield now and then, in case one was preempted by a
    // thread this spin would otherwise keep off the core.
    let mut spins = 0u32;
    while s.done.0.load(Acquire) < n {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    s.job.store(std::ptr::null_mut(), Relaxed);
    if let Some(p) = s.panic.lock().unwrap_or_else(|p| p.into_inner()).take() {
        resume_unwind(p);
    }
}

/// Claims and runs tasks of the open section until none is left; whether it ran any.
fn work(s: &Shared) -> bool {
    let mut ran = false;
    loop {
        let (n, i) = unpack(s.state.0.fetch_add(1, AcqRel));
        if i >= n {
            return ran;
        }
        // SAFETY: task i < n of the section published with this state is claimed and not yet
        // counted in `done`, so the leader is still inside `run` with `job` alive and the pointer
        // (stored before `state`, which this fetch_add read) pointing at it.
        let job: Job<'_> = unsafe { *(s.job.load(Acquire) as *const Job<'_>) };
        let was = IN_TASK.replace(true);
        let r = catch_unwind(AssertUnwindSafe(|| job(i)));
        IN_TASK.set(was);
        if let Err(p) = r {
            s.panic.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(p);
        }
        s.done.0.fetch_add(1, Release);
        ran = true;
    }
}

fn open(s: &Shared) -> bool {
    let (n, i) = unpack(s.state.0.load(SeqCst));
    i < n
}

fn helper(s: &Shared) {
    let mut idle_since = Instant::now();
    let mut spins = 0u32;
    while !s.stop.load(Relaxed) {
        if open(s) {
            if work(s) {
                idle_since = Instant::now();
            }
            continue;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(256) || idle_since.elapsed() < s.spin {
            std::hint::spin_loop();
            continue;
        }
        s.sleeping.fetch_add(1, SeqCst);
        let mut guard = s.lock.lock().unwrap_or_else(|p| p.into_inner());
        while !open(s) && !s.stop.load(SeqCst) {
            guard = s.wake.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
        drop(guard);
        s.sleeping.fetch_sub(1, SeqCst);
        idle_since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once_in_back_to_back_sections() {
        let team = Team::new(3, Duration::from_micros(200), "t").unwrap();
        team.install(|| {
            assert_eq!(threads(), 3);
            for n in [0, 1, 2, 3, 7, 64, 1000] {
                for _ in 0..50 {
                    let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                    for_each(n, |i| {
                        hits[i].fetch_add(1, Relaxed);
                    });
                    assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
                }
            }
        });
        assert_eq!(threads(), rayon::current_num_threads());
    }

    #[test]
    fn segments_of_rows_are_each_written_by_one_task() {
        let team = Team::new(2, Duration::from_micros(200), "t").unwrap();
        team.install(|| {
            // Rows of 7 split 0..3, 3..4, 4..7: each value gets its (row, segment) once.
            let mut data = vec![0u32; 5 * 7];
            for_each_segment_mut(&mut data, 7, &[0, 3, 4, 7], |i, j, seg| {
                seg.iter_mut().for_each(|v| *v += (10 * i + j + 1) as u32);
            });
            let want: Vec<u32> = (0..5).flat_map(|i| [0, 0, 0, 1, 2, 2, 2].map(|j| (10 * i + j + 1) as u32)).collect();
            assert_eq!(data, want);
        });
        let caught = std::panic::catch_unwind(|| for_each_segment_mut(&mut [0u8; 6], 3, &[0, 2, 2, 3], |_, _, _| {}));
        assert!(caught.is_err(), "empty segments are refused");
    }

    #[test]
    fn helpers_that_slept_wake_for_the_next_section() {
        let team = Team::new(2, Duration::ZERO, "t").unwrap();
        team.install(|| {
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(2));
                let on: Mutex<std::collections::HashSet<_>> = Mutex::default();
                let count = AtomicU32::new(0);
                for_each(64, |_| {
                    on.lock().unwrap().insert(std::thread::current().id());
                    count.fetch_add(1, Relaxed);
                    std::thread::sleep(Duration::from_micros(50));
                });
                assert_eq!(count.load(Relaxed), 64);
            }
        });
    }

    #[test]
    fn a_nested_section_runs_serially_and_a_panic_reaches_the_leader() {
        let team = Team::new(2, Duration::from_micros(100), "t").unwrap();
        team.install(|| {
            let total = AtomicU32::new(0);
            for_each(8, |_| {
                for_each(4, |_| {
                    total.fetch_add(1, Relaxed);
                })
            });
            assert_eq!(total.load(Relaxed), 32);
            let r = catch_unwind(|| {
                for_each(16, |i| {
                    if i == 5 {
                        panic!("task 5");
                    }
                })
            });
            assert!(r.is_err());
            // The team still works after a task panicked.
            let count = AtomicU32::new(0);
            for_each(16, |_| {
                count.fetch_add(1, Relaxed);
            });
            assert_eq!(count.load(Relaxed), 16);
        });
    }

    #[test]
    fn chunks_are_handed_out_whole_and_once() {
        let team = Team::new(2, Duration::from_micros(100), "t").unwrap();
        let mut data = vec![0usize; 6 * 37];
        team.install(|| for_each_chunk_mut(&mut data, 6, |i, c| c.iter_mut().for_each(|v| *v += i + 1)));
        for (i, c) in data.chunks(6).enumerate() {
            assert!(c.iter().all(|v| *v == i + 1));
        }
    }

    #[test]
    fn a_dropped_team_stops_its_sleeping_and_spinning_helpers() {
        for spin in [Duration::ZERO, Duration::from_secs(10)] {
            let team = Team::new(4, spin, "t").unwrap();
            team.install(|| for_each(8, |_| ()));
            drop(team); // joins its helpers, or this test hangs
        }
    }
}
