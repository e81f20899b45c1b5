//! Which LoRA adapters stay loaded: a ledger bounded by bytes, least recently used out.
//!
//! Why bytes and not a count: an adapter's size spans three orders of magnitude (an r8 adapter
//! of SmolLM2 on every projection is ~5 MB in bf16, an r64 one of a 7B model over a GB), so a
//! count either wastes memory on small ones or lets large ones take the machine. Serving many
//! checkpoints at once (each tenant's newest step, a group's rollouts on one) must not read from
//! disk once warm, so the default budget holds ~200 small adapters (README: `--adapter-cache-mib`).
//!
//! The ledger is pure bookkeeping over slots (`Slot`): the wrapper in `served` loads into a slot
//! outside the ledger's lock, so loading one checkpoint never holds up a request for another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One checkpoint's adapter, filled once loaded. Requests for it wait on its own lock.
pub(crate) type Slot<T> = Arc<Mutex<Option<Arc<T>>>>;

/// Default budget: 1 GiB.
pub const DEFAULT_BYTES: usize = 1 << 30;

/// Entries at most, loaded or not: bounds the map when loads fail (an empty slot holds no bytes).
const MAX_ENTRIES: usize = 4096;

struct Entry<T> {
    slot: Slot<T>,
    /// The ledger's clock at the last use.
    used: u64,
    /// The loaded adapter's size; 0 while loading (or after a failed load).
    bytes: usize,
}

pub(crate) struct Ledger<T> {
    entries: HashMap<String, Entry<T>>,
    clock: u64,
    budget: usize,
}

impl<T> Ledger<T> {
    pub fn new(budget: usize) -> Self {
        Ledger { entries: HashMap::new(), clock: 0, budget }
    }

    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.evict(None);
    }

    /// The checkpoint's slot, marked as just used; a new empty one if it is not held.
    pub fn slot(&mut self, id: &str) -> Slot<T> {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(id) {
            e.used = self.clock;
            return e.slot.clone();
        }
        let slot = Slot::default();
        self.entries.insert(id.to_string(), Entry { slot: slot.clone(), used: self.clock, bytes: 0 });
        self.evict(Some(id));
        slot
    }

    /// Records that `slot` (the one `slot(id)` gave) now holds `bytes`, and drops the least
    /// recently used others until the loaded ones fit the budget. A slot no longer held (forgotten
    /// while it loaded) is left out: its adapter serves the requests that hold it, then goes.
    pub fn loaded(&mut self, id: &str, slot: &Slot<T>, bytes: usize) {
        match self.entries.get_mut(id) {
            Some(e) if Arc::ptr_eq(&e.slot, slot) => e.bytes = bytes,
            _ => return,
        }
        self.evict(Some(id));
    }

    /// Holds an adapter loaded elsewhere (replacing what `id` held).
    pub fn put(&mut self, id: &str, adapter: Arc<T>, bytes: usize) {
        self.clock += 1;
        let slot = Arc::new(Mutex::new(Some(adapter)));
        self.entries.insert(id.to_string(), Entry { slot, used: self.clock, bytes });
        self.evict(Some(id));
    }

    pub fn forget(&mut self, id: &str) {
        self.entries.remove(id);
    }

    /// Bytes of the loaded adapters held.
    pub fn bytes(&self) -> usize {
        self.entries.values().map(|e| e.bytes).sum()
    }

    fn evict(&mut self, keep: Option<&str>) {
        let view: Vec<(&str, usize, u64)> = self.entries.iter().map(|(k, e)| (k.as_str(), e.bytes, e.used)).collect();
        let drop = evictions(&view, self.budget, MAX_ENTRIES, keep);
        for id in drop {
            self.entries.remove(&id);
        }
    }
}

/// The entries (id, bytes, last use) to drop, least recently used first, until the bytes fit
/// `budget` and at most `max_entries` remain; never `keep` (the adapter a request is about to
/// use, kept even when it alone is over the budget). Entries without bytes free nothing and go
/// only for the count.
pub(crate) fn evictions(
    entries: &[(&str, usize, u64)],
    budget: usize,
    max_entries: usize,
    keep: Option<&str>,
) -> Vec<String> {
    let mut order: Vec<&(&str, usize, u64)> = entries.iter().filter(|e| Some(e.0) != keep).collect();
    order.sort_by_key(|e| e.2);
    let (mut bytes, mut count) = (entries.iter().map(|e| e.1).sum::<usize>(), entries.len());
    let mut out = Vec::new();
    for &&(id, b, _) in &order {
        let (over_bytes, over_count) = (bytes > budget, count > max_entries);
        if !over_bytes && !over_count {
            break;
        }
        if b == 0 && !over_count {
            continue; // dropping it frees no bytes
        }
        out.push(id.to_string());
        bytes -= b;
        count -= 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_used_go_until_the_bytes_fit() {
        // 10 + 20 + 30 + 40 = 100 bytes against a budget of 60: the oldest (b at 1, then a at 2)
        // go, 30 + 40 = 70 is still over, so c (3) goes too; d is kept (just loaded).
        let e = [("a", 10, 2), ("b", 20, 1), ("c", 30, 3), ("d", 40, 4)];
        assert_eq!(evictions(&e, 60, 100, Some("d")), ["b", "a", "c"]);
        // Within budget and count: nothing.
        assert!(evictions(&e, 100, 4, Some("d")).is_empty());
        // Over by one byte: only the oldest.
        assert_eq!(evictions(&e, 99, 100, None), ["b"]);
    }

    #[test]
    fn the_kept_one_stays_even_alone_over_the_budget() {
        let e = [("big", 500, 5), ("small", 10, 1)];
        assert_eq!(evictions(&e, 100, 100, Some("big")), ["small"]);
    }

    #[test]
    fn loading_entries_free_nothing_and_go_only_for_the_count() {
        // Empty slots (0 bytes) are skipped while bytes are over; the count cap takes the
        // oldest whatever its size.
        let e = [("loading", 0, 1), ("x", 50, 2), ("y", 50, 3)];
        assert_eq!(evictions(&e, 60, 100, Some("y")), ["x"]);
        assert_eq!(evictions(&e, 1000, 2, Some("y")), ["loading"]);
    }

    #[test]
    fn the_ledger_counts_loaded_bytes_and_evicts_by_use() {
        let mut l: Ledger<u8> = Ledger::new(100);
        let a = l.slot("a");
        l.loaded("a", &a, 60);
        let b = l.slot("b");
        l.loaded("b", &b, 30);
        assert_eq!((l.entries.len(), l.bytes()), (2, 90));
        // Using a makes b the least recently used; c's 30 bytes then push b out.
        let _ = l.slot("a");
        let c = l.slot("c");
        l.loaded("c", &c, 30);
        assert_eq!(l.bytes(), 90);
        assert!(Arc::ptr_eq(&l.slot("a"), &a));
        assert!(!Arc::ptr_eq(&l.slot("b"), &b), "b was evicted and comes back empty");
        // A slot forgotten while loading is not counted when its load ends.
        let d = l.slot("d");
        l.forget("d");
        l.loaded("d", &d, 50);
        assert!(!l.entries.contains_key("d"));
        // A smaller budget evicts at once.
        l.set_budget(30);
        assert!(l.bytes() <= 30);
    }
}
