//! Per-item retry backoff for the drivers: a map key or a link whose kernel operation failed stays
//! dirty and is retried after a delay that doubles per failure (10 ms → 5 s), while the driver's
//! other items proceed.

use std::{
    collections::HashMap,
    hash::Hash,
    time::{Duration, Instant},
};

const FIRST: Duration = Duration::from_millis(10);
const MAX: Duration = Duration::from_secs(5);

/// Failures so far of one item and when it may be retried.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    failures: u32,
    due: Instant,
}

/// The items in backoff.
#[derive(Debug)]
pub struct Backoff<K> {
    items: HashMap<K, Attempt>,
}

impl<K> Default for Backoff<K> {
    fn default() -> Self {
        Self {
            items: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> Backoff<K> {
    /// True unless `key` failed and its delay has not passed at `now`.
    pub fn is_due(&self, key: &K, now: Instant) -> bool {
        self.items.get(key).is_none_or(|a| a.due <= now)
    }

    /// `key` failed at `now`: its next try waits twice as long as the last.
    pub fn failed(&mut self, key: &K, now: Instant) {
        let failures = self.items.get(key).map_or(0, |a| a.failures) + 1;
        let delay = FIRST.saturating_mul(1 << (failures - 1).min(16)).min(MAX);
        self.items.insert(
            key.clone(),
            Attempt {
                failures,
                due: now + delay,
            },
        );
    }

    /// `key` succeeded (or is no longer wanted): no delay.
    pub fn succeeded(&mut self, key: &K) {
        self.items.remove(key);
    }

    /// The earliest time an item in backoff may be retried.
    pub fn next_due(&self) -> Option<Instant> {
        self.items.values().map(|a| a.due).min()
    }

    /// Items in backoff.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing is in backoff.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Keeps only the items `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.items.retain(|k, _| keep(k));
    }

    /// True when `key` is in backoff (failed and not yet succeeded).
    pub fn contains(&self, key: &K) -> bool {
        self.items.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_up_to_the_cap_and_success_clears_it() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        b.failed(&1u32, t0);
        assert!(!b.is_due(&1, t0));
        assert!(b.is_due(&1, t0 + FIRST));
        assert!(b.is_due(&2, t0), "other items are not delayed");
        b.failed(&1, t0);
        assert!(!b.is_due(&1, t0 + FIRST), "the second failure waits longer");
        assert!(b.is_due(&1, t0 + FIRST * 2));
        for _ in 0..40 {
            b.failed(&1, t0);
        }
        assert_eq!(b.next_due(), Some(t0 + MAX), "capped");
        b.succeeded(&1);
        assert!(b.is_empty());
        assert!(b.is_due(&1, t0));
    }
}
