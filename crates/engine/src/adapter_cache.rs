//! Which LoRA adapters stay loaded: a ledger bounded by bytes, shared fairly between entities.
//!
//! Why bytes and not a count: an adapter's size spans three orders of magnitude (an r8 adapter
//! of SmolLM2 on every projection is ~5 MB in bf16, an r64 one of a 7B model over a GB), so a
//! count either wastes memory on small ones or lets large ones take the machine. Serving many
//! checkpoints at once (each tenant's newest step, a group's rollouts on one) must not read from
//! disk once warm, so the default budget holds ~200 small adapters (README: `--adapter-cache-mib`).
//!
//! Why shared by entity: with one least-recently-used order for everyone, an entity rotating
//! more adapters than the cache holds evicted every other entity's adapters, which were then
//! read from disk again on their next request (session 55: a victim's adapter stream 76 -> 58
//! tok/s). Over the budget, the entity holding the most gives back first, its least recently
//! used adapter first ([`evictions`]): an entity within an equal split of the budget loses
//! nothing to another's rotation, and an entity alone may use all of it.
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
    /// The entity whose adapter it is.
    owner: String,
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

    /// The checkpoint's slot (`owner`'s adapter), marked as just used; a new empty one if it is
    /// not held.
    pub fn slot(&mut self, id: &str, owner: &str) -> Slot<T> {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(id) {
            e.used = self.clock;
            return e.slot.clone();
        }
        let slot = Slot::default();
        let entry = Entry { slot: slot.clone(), owner: owner.to_string(), used: self.clock, bytes: 0 };
        self.entries.insert(id.to_string(), entry);
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

    /// Holds `owner`'s adapter loaded elsewhere (replacing what `id` held).
    pub fn put(&mut self, id: &str, owner: &str, adapter: Arc<T>, bytes: usize) {
        self.clock += 1;
        let slot = Arc::new(Mutex::new(Some(adapter)));
        self.entries.insert(id.to_string(), Entry { slot, owner: owner.to_string(), used: self.clock, bytes });
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
        let view: Vec<Held<'_>> = self
            .entries
            .iter()
            .map(|(id, e)| Held { id: id.as_str(), owner: e.owner.as_str(), bytes: e.bytes, used: e.used })
            .collect();
        let drop = evictions(&view, self.budget, MAX_ENTRIES, keep);
        for id in drop {
            self.entries.remove(&id);
        }
    }

    /// Bytes held per owner (tests).
    #[cfg(test)]
    fn bytes_of(&self, owner: &str) -> usize {
        self.entries.values().filter(|e| e.owner == owner).map(|e| e.bytes).sum()
    }
}

/// One entry as eviction sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held<'a> {
    pub id: &'a str,
    pub owner: &'a str,
    /// 0 while loading (or after a failed load).
    pub bytes: usize,
    /// The ledger's clock at the last use.
    pub used: u64,
}

/// The entries to drop, in order, until the bytes fit `budget` and at most `max_entries` remain.
///
/// While over, the owner holding the most (bytes, or entries when over the count) gives back
/// its least recently used entry: water-filling from the top, so the result is the max-min fair
/// split of the budget (an owner under the level all end at keeps everything) and an owner alone
/// may hold it all. `keep` (the adapter a request is about to use) is passed over; when its owner
/// holds the most and has nothing else, it is dropped from the ledger rather than another
/// owner's entry, as long as another holds something: its request keeps its copy, and the next
/// request reads it again. Alone it stays, even over the budget. Entries without bytes free
/// nothing and go only for the count.
pub(crate) fn evictions(entries: &[Held<'_>], budget: usize, max_entries: usize, keep: Option<&str>) -> Vec<String> {
    use std::collections::BTreeMap;
    let mut live = vec![true; entries.len()];
    // Per owner: bytes and entries held.
    let mut per: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for e in entries {
        let p = per.entry(e.owner).or_default();
        p.0 += e.bytes;
        p.1 += 1;
    }
    let (mut bytes, mut count) = (entries.iter().map(|e| e.bytes).sum::<usize>(), entries.len());
    let kept = keep.and_then(|k| entries.iter().position(|e| e.id == k));
    let mut out = Vec::new();
    loop {
        let by_count = count > max_entries;
        if !by_count && bytes <= budget {
            return out;
        }
        // What counts: entries for the count, loaded bytes for the budget.
        let weight = |e: &Held<'_>| if by_count { 1 } else { e.bytes };
        let holds = |owner: &str| if by_count { per[owner].1 } else { per[owner].0 };
        // Each owner's least recently used entry that may go (never `keep`).
        let mut oldest: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            if live[i] && Some(i) != kept && weight(e) > 0 {
                let o = oldest.entry(e.owner).or_insert(i);
                if e.used < entries[*o].used {
                    *o = i;
                }
            }
        }
        // The owner holding the most (ties: the one with the older entry to give).
        let age = |o: &str| oldest.get(o).map_or(u64::MAX, |&i| entries[i].used);
        let top = per
            .keys()
            .copied()
            .filter(|o| holds(o) > 0)
            .max_by(|a, b| holds(a).cmp(&holds(b)).then(age(b).cmp(&age(a))));
        let victim = match (top.and_then(|o| oldest.get(o).copied()), kept.filter(|&k| live[k])) {
            (Some(i), _) => i,
            // The top owner's only entry is the kept one: it goes if anyone else holds anything.
            (None, Some(k)) if top == Some(entries[k].owner) && !oldest.is_empty() => k,
            // Over, with nothing else to drop: the kept one stays, over the budget.
            _ => return out,
        };
        let e = &entries[victim];
        live[victim] = false;
        let p = per.get_mut(e.owner).expect("every owner is counted");
        p.0 -= e.bytes;
        p.1 -= 1;
        bytes -= e.bytes;
        count -= 1;
        out.push(e.id.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries of one owner, "x": (id, bytes, last use).
    fn one_owner<'a>(e: &[(&'a str, usize, u64)]) -> Vec<Held<'a>> {
        e.iter().map(|&(id, bytes, used)| Held { id, owner: "x", bytes, used }).collect()
    }

    /// Entries of several owners: (id, owner, bytes, last use).
    fn owned<'a>(e: &[(&'a str, &'a str, usize, u64)]) -> Vec<Held<'a>> {
        e.iter().map(|&(id, owner, bytes, used)| Held { id, owner, bytes, used }).collect()
    }

    #[test]
    fn least_recently_used_go_until_the_bytes_fit() {
        // 10 + 20 + 30 + 40 = 100 bytes against a budget of 60: the oldest (b at 1, then a at 2)
        // go, 30 + 40 = 70 is still over, so c (3) goes too; d is kept (just loaded).
        let e = one_owner(&[("a", 10, 2), ("b", 20, 1), ("c", 30, 3), ("d", 40, 4)]);
        assert_eq!(evictions(&e, 60, 100, Some("d")), ["b", "a", "c"]);
        // Within budget and count: nothing.
        assert!(evictions(&e, 100, 4, Some("d")).is_empty());
        // Over by one byte: only the oldest.
        assert_eq!(evictions(&e, 99, 100, None), ["b"]);
    }

    #[test]
    fn the_kept_one_stays_even_alone_over_the_budget() {
        let e = one_owner(&[("big", 500, 5), ("small", 10, 1)]);
        assert_eq!(evictions(&e, 100, 100, Some("big")), ["small"]);
    }

    #[test]
    fn loading_entries_free_nothing_and_go_only_for_the_count() {
        // Empty slots (0 bytes) are skipped while bytes are over; the count cap takes the
        // oldest whatever its size.
        let e = one_owner(&[("loading", 0, 1), ("x", 50, 2), ("y", 50, 3)]);
        assert_eq!(evictions(&e, 60, 100, Some("y")), ["x"]);
        assert_eq!(evictions(&e, 1000, 2, Some("y")), ["loading"]);
    }

    #[test]
    fn another_owners_rotation_takes_its_own_adapters_first() {
        // The victim v holds one adapter of 10 bytes, used first of all; the attacker a five of
        // 20, 110 in all against 100. One order for everyone dropped v1 (the oldest); the owner
        // holding the most (a, 100) gives back its oldest instead, and 90 fit.
        let e = owned(&[
            ("v1", "v", 10, 1),
            ("a1", "a", 20, 2),
            ("a2", "a", 20, 3),
            ("a3", "a", 20, 4),
            ("a4", "a", 20, 5),
            ("a5", "a", 20, 6),
        ]);
        assert_eq!(evictions(&e, 100, 100, Some("a5")), ["a1"]);
    }

    #[test]
    fn the_budget_is_water_filled_from_the_top() {
        // a holds 50 (five of 10, used 1-5), b 40 (four, used 6-9), c 10 (used 10); budget 70.
        // 100: a (50) gives a1 -> 90; a and b tie at 40, a's oldest (2) is older than b's (6):
        // a2 -> 80; b (40) gives b6 -> 70, which fits. a and b end at 30 each; c, under that
        // level, keeps its 10.
        let mut e = Vec::new();
        let ids: Vec<String> = (1..=10)
            .map(|i| {
                format!(
                    "{}{i}",
                    if i <= 5 {
                        "a"
                    } else if i <= 9 {
                        "b"
                    } else {
                        "c"
                    }
                )
            })
            .collect();
        for (i, id) in ids.iter().enumerate() {
            e.push(Held { id, owner: &id[..1], bytes: 10, used: i as u64 + 1 });
        }
        assert_eq!(evictions(&e, 70, 100, None), ["a1", "a2", "b6"]);
        // Over the entry cap, the owner with the most entries gives back first, loading or not.
        let n = owned(&[("a1", "a", 0, 1), ("a2", "a", 10, 2), ("b1", "b", 0, 3)]);
        assert_eq!(evictions(&n, 1000, 2, None), ["a1"]);
    }

    #[test]
    fn an_adapter_over_its_owners_share_is_not_kept_at_anothers_cost() {
        // a's just-loaded 70 and b's 40 do not fit 100. a holds the most and has nothing else:
        // its adapter leaves the ledger (the request in hand keeps its copy), b's stays.
        let e = owned(&[("b1", "b", 40, 1), ("big", "a", 70, 5)]);
        assert_eq!(evictions(&e, 100, 100, Some("big")), ["big"]);
        // b holding nothing but a slot still loading: the kept one stays, over the budget.
        let e = owned(&[("b1", "b", 0, 1), ("big", "a", 170, 5)]);
        assert!(evictions(&e, 100, 100, Some("big")).is_empty());
    }

    #[test]
    fn the_ledger_counts_loaded_bytes_and_evicts_by_use() {
        let mut l: Ledger<u8> = Ledger::new(100);
        let a = l.slot("a", "x");
        l.loaded("a", &a, 60);
        let b = l.slot("b", "x");
        l.loaded("b", &b, 30);
        assert_eq!((l.entries.len(), l.bytes()), (2, 90));
        // Using a makes b the least recently used; c's 30 bytes then push b out.
        let _ = l.slot("a", "x");
        let c = l.slot("c", "x");
        l.loaded("c", &c, 30);
        assert_eq!(l.bytes(), 90);
        assert!(Arc::ptr_eq(&l.slot("a", "x"), &a));
        assert!(!Arc::ptr_eq(&l.slot("b", "x"), &b), "b was evicted and comes back empty");
        // A slot forgotten while loading is not counted when its load ends.
        let d = l.slot("d", "x");
        l.forget("d");
        l.loaded("d", &d, 50);
        assert!(!l.entries.contains_key("d"));
        // A smaller budget evicts at once.
        l.set_budget(30);
        assert!(l.bytes() <= 30);
    }

    #[test]
    fn a_victims_adapter_outlives_another_entitys_rotation() {
        // Budget for five adapters of 10. The victim uses one; the attacker rotates twenty,
        // each loaded once, then the victim asks again: the same slot, not read again.
        let mut l: Ledger<u8> = Ledger::new(50);
        let v = l.slot("v", "victim");
        l.loaded("v", &v, 10);
        for i in 0..20 {
            let id = format!("a{i}");
            let s = l.slot(&id, "attacker");
            l.loaded(&id, &s, 10);
        }
        assert!(Arc::ptr_eq(&l.slot("v", "victim"), &v));
        assert_eq!((l.bytes_of("victim"), l.bytes_of("attacker")), (10, 40));
        // put() takes an owner too: the victim's second adapter still fits its half.
        l.put("v2", "victim", Arc::new(0), 10);
        assert_eq!((l.bytes_of("victim"), l.bytes_of("attacker")), (20, 30));
    }
}
