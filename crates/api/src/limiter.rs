//! Per-entity concurrency limit on the inference routes: beyond it a request gets 429 with
//! `Retry-After` before any rendering or tokenizing. A permit is released when dropped, i.e. when
//! the response (or its stream) ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub struct EntityLimiter {
    limit: usize,
    active: Mutex<HashMap<String, usize>>,
}

pub struct Permit {
    limiter: Arc<EntityLimiter>,
    entity: String,
}

impl EntityLimiter {
    pub fn new(limit: usize) -> Self {
        EntityLimiter { limit, active: Mutex::new(HashMap::new()) }
    }

    /// A permit, or `None` if the entity already has `limit` requests in flight.
    pub fn acquire(self: &Arc<Self>, entity: &str) -> Option<Permit> {
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        let n = active.entry(entity.to_string()).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Permit { limiter: self.clone(), entity: entity.to_string() })
    }

    /// Requests one entity may have in flight (`--per-entity-limit`).
    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn in_flight(&self, entity: &str) -> usize {
        self.active.lock().unwrap_or_else(|e| e.into_inner()).get(entity).copied().unwrap_or(0)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut active = self.limiter.active.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = active.get_mut(&self.entity) {
            *n -= 1;
            if *n == 0 {
                active.remove(&self.entity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_counted_per_entity_and_released_on_drop() {
        let l = Arc::new(EntityLimiter::new(2));
        let a1 = l.acquire("a").unwrap();
        let _a2 = l.acquire("a").unwrap();
        assert!(l.acquire("a").is_none());
        assert!(l.acquire("b").is_some());
        drop(a1);
        assert_eq!(l.in_flight("a"), 1);
        assert!(l.acquire("a").is_some());
    }
}
