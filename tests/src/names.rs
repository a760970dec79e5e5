//! Generated names for test resources: every one starts with `wt` (never `weir`, which the agent
//! treats as a workload veth) and fits the 15-character limit of link names.

use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh `wt…` name ending in `suffix` (at most 4 characters), unique in this process and
/// unlikely to collide with another process: `wt` + 5 hex digits of pid + 3 hex counter + suffix.
#[must_use]
pub fn unique(suffix: &str) -> String {
    assert!(
        suffix.len() <= 4,
        "name suffix {suffix:?} is longer than 4 characters"
    );
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!(
        "wt{:05x}{:03x}{suffix}",
        std::process::id() & 0xf_ffff,
        n & 0xfff
    );
    debug_assert!(name.len() <= 15);
    name
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_fit_and_differ() {
        let a = super::unique("h");
        let b = super::unique("h");
        assert!(a.starts_with("wt") && a.len() <= 15, "{a}");
        assert_ne!(a, b);
    }
}
