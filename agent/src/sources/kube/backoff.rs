//! The watchers' retry delays: 100 ms doubling to 5 s, back to 100 ms after any good event
//! (`StreamBackoff` resets it). Shorter than client-go's 800 ms → 30 s: one node's agent is a
//! small load on the API server, and a change made while it was away should arrive soon after.

use std::time::Duration;

const FIRST: Duration = Duration::from_millis(100);
const MAX: Duration = Duration::from_secs(5);

/// The retry delays of one watcher.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(MAX);
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::utils::Backoff as _;

    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut b = WatchBackoff::default();
        let first: Vec<u64> = b.by_ref().take(8).map(|d| d.as_millis() as u64).collect();
        assert_eq!(first, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next(), Some(FIRST));
    }
}
