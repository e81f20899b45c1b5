//! How long the allocator keeps freed memory before it hands it back to the system.
//!
//! The server and the training bench allocate with mimalloc, which returns ("purges") freed pages
//! to the system. A training step allocates and frees gigabytes of activations, so with its
//! defaults every op's output lands on fresh pages the kernel must fault in and zero: on Qwen2.5 0.5B
//! (4 x 256 tokens, LoRA r8) 233,000 minor faults in four steps, 15-17 s a step. Kept for a
//! minute, 2,600 faults and 12-13.6 s a step (`examples/train_step`, session 23), at the same peak
//! RSS. mimalloc purges what was freed only once the delay has passed, so
//! the trainer hands freed memory back explicitly when a job ends ([`release_freed_memory`]).
//!
//! Serving alone does not need the minute: its big temporaries (loading's, a prefill's) are
//! freed once, and kept they only raise the peak (Qwen2.5 0.5B: 738 against 679 MB once loaded,
//! 843 against 783 MB after a prefill, 16 streams and a JSON schema; session 32). So the server
//! keeps mimalloc's own delay, and the minute holds only while something trains: a
//! [`KeepFreed`] guard, which every training session holds.
// One FFI call into mimalloc's option table: the crate's one use of `unsafe` outside kernels/.
#![allow(unsafe_code)]

/// mimalloc's `mi_option_purge_delay` (its `mi_option_e`, v3): not among the constants
/// libmimalloc-sys declares. The test below checks the numbering against defaults.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays with the allocator (see the module comment).
pub const KEEP_FREED_MS: i64 = 60_000;

/// Sets mimalloc's purge delay to [`KEEP_FREED_MS`], unless the environment sets it
/// (`MIMALLOC_PURGE_DELAY`, which mimalloc reads itself). Call before the heavy work starts.
pub fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: mi_option_set only stores an integer in mimalloc's option table.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, KEEP_FREED_MS as std::os::raw::c_long) };
}

/// The guards alive: keepers ([`KeepFreed`]), purgers ([`PurgeAtOnce`]) and the purge delay from
/// before the first of them (restored after the last).
struct Guards {
    keepers: usize,
    purgers: usize,
    before: Option<std::os::raw::c_long>,
}

static GUARDS: std::sync::Mutex<Guards> = std::sync::Mutex::new(Guards { keepers: 0, purgers: 0, before: None });

/// Counts a guard in or out (+1 or -1 on `keep` or `purge`) and sets the delay they
/// call for: a minute while anything trains, else 0 while something loads, else the delay from
/// before. The environment's `MIMALLOC_PURGE_DELAY`, when set, is never overridden.
fn update(keep: isize, purge: isize) {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    let mut g = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: mi_option_get/set only read and store an integer in mimalloc's option table.
    unsafe {
        if g.keepers + g.purgers == 0 {
            g.before = Some(libmimalloc_sys::mi_option_get(PURGE_DELAY));
        }
        g.keepers = g.keepers.saturating_add_signed(keep);
        g.purgers = g.purgers.saturating_add_signed(purge);
        let delay = if g.keepers > 0 {
            KEEP_FREED_MS as std::os::raw::c_long
        } else if g.purgers > 0 {
            0
        } else {
            g.before.take().unwrap_or(libmimalloc_sys::mi_option_get(PURGE_DELAY))
        };
        libmimalloc_sys::mi_option_set(PURGE_DELAY, delay);
    }
}

/// While one of these lives, freed memory is kept for [`KEEP_FREED_MS`]: every training session
/// holds one. When the last goes, the delay is what it was before and the dropping thread's
/// freed memory is handed back.
#[derive(Debug)]
pub struct KeepFreed(());

impl KeepFreed {
    pub fn begin() -> KeepFreed {
        update(1, 0);
        KeepFreed(())
    }
}

impl Drop for KeepFreed {
    fn drop(&mut self) {
        update(-1, 0);
        release_freed_memory();
    }
}

/// While this lives (and nothing trains), freed memory goes back to the system at once: for
/// loading a model, whose every tensor's file bytes are freed once its packed copy is built.
/// Kept even a second, they sat on top of the layers loaded after them (Qwen2.5 0.5B: 737 MB at
/// the peak of loading, 679 with no delay; session 32). Not for serving: a decode step's freed
/// buffers, faulted in again at every step, cost ~10% of its speed.
#[derive(Debug)]
pub struct PurgeAtOnce(());

impl PurgeAtOnce {
    pub fn begin() -> PurgeAtOnce {
        update(0, 1);
        PurgeAtOnce(())
    }
}

impl Drop for PurgeAtOnce {
    fn drop(&mut self) {
        update(0, -1);
    }
}

/// Hands every freed page back to the system now (mimalloc's `mi_collect(true)`, which purges
/// regardless of the delay): a trainer calls it when a job ends, so an idle server's memory is
/// what it holds, not what its last job freed.
pub fn release_freed_memory() {
    // SAFETY: mi_collect only walks mimalloc's own heaps and arenas.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use libmimalloc_sys::{mi_option_get, mi_option_os_tag, mi_option_use_numa_nodes};

    /// The tests of this module write one global option: one at a time.
    static OPTION: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        let _one = OPTION.lock().unwrap();
        // SAFETY: reading and writing mimalloc's option table.
        unsafe {
            // The neighbours of the hard-coded index are where the bindings say, with their
            // documented defaults (os_tag 100, use_numa_nodes 0), so the numbering is v3's.
            assert_eq!(mi_option_os_tag, PURGE_DELAY + 3);
            assert_eq!(mi_option_use_numa_nodes, PURGE_DELAY + 1);
            assert_eq!(mi_option_get(mi_option_os_tag), 100);
            keep_freed_memory();
            assert_eq!(mi_option_get(PURGE_DELAY), KEEP_FREED_MS as std::os::raw::c_long);
        }
    }

    #[test]
    fn the_minute_holds_while_a_guard_lives_and_the_delay_comes_back_after_the_last() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return; // the environment decides, and the guard leaves it alone
        }
        let _one = OPTION.lock().unwrap();
        // SAFETY: reading and writing mimalloc's option table.
        unsafe {
            libmimalloc_sys::mi_option_set(PURGE_DELAY, 7);
            let a = KeepFreed::begin();
            assert_eq!(mi_option_get(PURGE_DELAY), KEEP_FREED_MS as std::os::raw::c_long);
            let b = KeepFreed::begin();
            drop(a);
            assert_eq!(mi_option_get(PURGE_DELAY), KEEP_FREED_MS as std::os::raw::c_long, "one guard still lives");
            drop(b);
            assert_eq!(mi_option_get(PURGE_DELAY), 7);
            // Loading purges at once, unless something trains; the delay comes back after both.
            let load = PurgeAtOnce::begin();
            assert_eq!(mi_option_get(PURGE_DELAY), 0);
            let train = KeepFreed::begin();
            assert_eq!(mi_option_get(PURGE_DELAY), KEEP_FREED_MS as std::os::raw::c_long);
            drop(load);
            assert_eq!(mi_option_get(PURGE_DELAY), KEEP_FREED_MS as std::os::raw::c_long);
            drop(train);
            assert_eq!(mi_option_get(PURGE_DELAY), 7);
        }
    }
}
