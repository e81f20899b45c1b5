//! How long the allocator keeps freed memory before it hands it back to the system.
//!
//! The server and the training bench allocate with mimalloc, which returns ("purges") freed pages
//! to the system. A training step allocates and frees gigabytes of activations, so with its
//! defaults every op's output lands on fresh pages the kernel must fault in and zero: on Qwen2.5 0.5B
//! (4 x 256 tokens, LoRA r8) 233,000 minor faults in four steps, 15-17 s a step. Kept for a
//! minute, 2,600 faults and 12-13.6 s a step (`examples/train_step`, session 23), at the same peak
//! RSS. mimalloc purges what was freed only once the delay has passed, so
//! the trainer hands freed memory back explicitly when a job ends ([`release_freed_memory`]).
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

    #[test]
    fn the_purge_delay_option_is_the_one_set() {
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
}
