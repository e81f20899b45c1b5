//! Prefix cache: KV of recent prompts, reused by later prompts that start the same way.
//!
//! Every prompt position gets a chained hash (its token, the previous position's hash), so the
//! cache works at token granularity, like SGLang's radix cache rather than vLLM's 16-token blocks:
//! entries are whole prompts, so a finer index costs only hashes, and it lets a group of
//! rollouts sharing a prompt (or a system prompt shorter than a block) reuse all of it. The first
//! link also mixes in what changes the KV for equal tokens or must isolate tenants: the tenant (the
//! API key's entity), the adapter and the request's `cache_salt`. So two prompts share cache only
//! within one entity, with the same salt, adapter and prefix: no entity can learn what another
//! prompted from `cached_tokens` or from how fast its prompt was processed. Hashes are keyed per process (unpredictable from outside). An entry keeps one prompt's
//! KV; every position of it is indexed, so a prompt sharing only part of it still reuses that part.
//! Entries and the sequences that reuse them share the KV's whole tiles copy-on-write (see
//! `tandem_model::KvCache`): an entry of a frozen cache costs no copy, and a hit copies at most
//! the one partial tile at its end.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::Arc;
use tandem_model::KvCache;

pub struct PrefixCache {
    hasher: RandomState,
    /// Chain hash of a block boundary -> (entry, tokens covered).
    index: HashMap<u64, (u64, usize)>,
    entries: HashMap<u64, Entry>,
    next_id: u64,
    clock: u64,
    tokens: usize,
    capacity_tokens: usize,
}

struct Entry {
    cache: Arc<KvCache>,
    hashes: Vec<u64>,
    last_used: u64,
}

impl PrefixCache {
    pub fn new(capacity_tokens: usize) -> Self {
        PrefixCache {
            hasher: RandomState::new(),
            index: HashMap::new(),
            entries: HashMap::new(),
            next_id: 0,
            clock: 0,
            tokens: 0,
            capacity_tokens,
        }
    }

    /// Chain hashes of every prefix of `tokens` (entry i covers tokens 0..=i), within the scope of
    /// one tenant, adapter and salt.
    pub fn prefix_hashes(&self, tokens: &[u32], tenant: &str, adapter: Option<&str>, salt: Option<&str>) -> Vec<u64> {
        let mut prev = self.hasher.hash_one((tenant, adapter, salt));
        tokens
            .iter()
            .map(|t| {
                let mut h = self.hasher.build_hasher();
                prev.hash(&mut h);
                t.hash(&mut h);
                prev = h.finish();
                prev
            })
            .collect()
    }

    /// The longest cached prefix of at most `max_tokens` tokens: (its KV, tokens covered).
    pub fn lookup(&mut self, hashes: &[u64], max_tokens: usize) -> Option<(Arc<KvCache>, usize)> {
        self.clock += 1;
        let usable = max_tokens.min(hashes.len());
        for i in (0..usable).rev() {
            if let Some((id, n)) = self.index.get(&hashes[i]).copied() {
                if let Some(e) = self.entries.get_mut(&id) {
                    e.last_used = self.clock;
                    return Some((e.cache.clone(), n));
                }
            }
        }
        None
    }

    /// Whether the prefix whose last chain hash is `hash` is held.
    pub fn holds(&self, hash: u64) -> bool {
        self.index.get(&hash).is_some_and(|(id, _)| self.entries.contains_key(id))
    }

    /// Whether a prompt of `n` positions would be kept ([`PrefixCache::insert`] skips longer ones).
    pub fn keeps(&self, n: usize) -> bool {
        n > 0 && n <= self.capacity_tokens
    }

    /// Keeps the KV of a prompt whose blocks hash to `hashes` (cache holds at least those tokens).
    pub fn insert(&mut self, hashes: Vec<u64>, cache: &KvCache) {
        let n = hashes.len();
        if n == 0 || n > self.capacity_tokens || hashes.last().is_some_and(|h| self.index.contains_key(h)) {
            return;
        }
        self.clock += 1;
        // Cheap when the caller froze the cache: the whole tiles are shared, not copied.
        let mut copy = cache.clone();
        copy.truncate(n);
        let id = self.next_id;
        self.next_id += 1;
        for (i, h) in hashes.iter().enumerate() {
            self.index.insert(*h, (id, i + 1));
        }
        self.tokens += n;
        self.entries.insert(id, Entry { cache: Arc::new(copy), hashes, last_used: self.clock });
        while self.tokens > self.capacity_tokens {
            let Some(oldest) = self.entries.iter().min_by_key(|(_, e)| e.last_used).map(|(id, _)| *id) else { break };
            self.evict(oldest);
        }
    }

    fn evict(&mut self, id: u64) {
        if let Some(e) = self.entries.remove(&id) {
            self.tokens -= e.hashes.len();
            for h in e.hashes {
                if self.index.get(&h).is_some_and(|(owner, _)| *owner == id) {
                    self.index.remove(&h);
                }
            }
        }
    }

    /// Drops every entry made with an adapter (its hashes are unknown here, so all go).
    pub fn clear(&mut self) {
        self.index.clear();
        self.entries.clear();
        self.tokens = 0;
    }

    pub fn cached_tokens(&self) -> usize {
        self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_of(n: usize) -> KvCache {
        let mut c = KvCache::new(1, 2);
        c.fill_for_test(n);
        c
    }

    #[test]
    fn shares_only_equal_prefix_salt_and_adapter() {
        let mut pc = PrefixCache::new(1000);
        let prompt: Vec<u32> = (0..40).collect();
        let h = pc.prefix_hashes(&prompt, "a", None, None);
        assert_eq!(h.len(), 40);
        pc.insert(h.clone(), &cache_of(40));
        // Same first 20 tokens: those 20 are reusable, at token granularity.
        let mut other: Vec<u32> = (0..20).collect();
        other.extend([99; 20]);
        let ho = pc.prefix_hashes(&other, "a", None, None);
        assert_eq!(pc.lookup(&ho, 39).map(|(_, n)| n), Some(20));
        // Never the whole prompt: at least one token must be computed.
        assert_eq!(pc.lookup(&h, 39).map(|(_, n)| n), Some(39));
        assert_eq!(pc.lookup(&h, 31).map(|(_, n)| n), Some(31));
        assert!(pc.lookup(&pc.prefix_hashes(&prompt, "a", None, Some("salt")), 39).is_none());
        assert!(pc.lookup(&pc.prefix_hashes(&prompt, "a", Some("ckpt"), None), 39).is_none());
        // Another tenant shares nothing, whatever it sends.
        assert!(pc.lookup(&pc.prefix_hashes(&prompt, "b", None, None), 39).is_none());
        assert!(pc.lookup(&pc.prefix_hashes(&other, "b", None, None), 39).is_none());
        // A different first token shares nothing.
        assert!(pc.lookup(&pc.prefix_hashes(&[7, 1, 2, 3], "a", None, None), 3).is_none());
    }

    #[test]
    fn evicts_least_recently_used() {
        let mut pc = PrefixCache::new(32);
        let a: Vec<u32> = (0..16).collect();
        let b: Vec<u32> = (100..116).collect();
        let c: Vec<u32> = (200..216).collect();
        let (ha, hb, hc) = (
            pc.prefix_hashes(&a, "a", None, None),
            pc.prefix_hashes(&b, "a", None, None),
            pc.prefix_hashes(&c, "a", None, None),
        );
        pc.insert(ha.clone(), &cache_of(16));
        pc.insert(hb.clone(), &cache_of(16));
        assert!(pc.lookup(&ha, 100).is_some()); // a is now more recent than b
        pc.insert(hc.clone(), &cache_of(16));
        assert!(pc.lookup(&hb, 100).is_none());
        assert!(pc.lookup(&ha, 100).is_some() && pc.lookup(&hc, 100).is_some());
        assert_eq!(pc.cached_tokens(), 32);
    }
}
