//! The blocks each host was last seen to own, so an allocation tries them without listing the
//! host's affinities first (one datastore read fewer per allocation). A hint is only ever a guess:
//! every take checks the block's affinity in its own write, and an allocation the hinted blocks
//! cannot serve lists the affinities afresh before it claims anything, so a stale hint costs a
//! round, never a duplicate or a leaked block. Releasing an affinity forgets the host's hint.
//!
//! A block a take found exhausted (no free address, none cooling down) is remembered as full for
//! [`FULL_FOR`] (or until this
//! allocator releases an address in it), so the allocations after it go straight to the listing
//! and the claim instead of first asking the datastore for a block with nothing to give. A full
//! mark gone stale (another process released addresses in the block meanwhile) costs at most a
//! new block sooner, never an address.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use ipnetwork::IpNetwork;

/// How long a block found full is skipped.
const FULL_FOR: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct HostHint {
    blocks: Vec<IpNetwork>,
    /// Blocks a take found full, and when.
    full: BTreeMap<IpNetwork, Instant>,
}

/// Per host, the blocks confirmed affine to it when last listed or claimed; shared by clones.
#[derive(Clone, Debug, Default)]
pub(crate) struct Hints(Arc<Mutex<BTreeMap<String, HostHint>>>);

impl Hints {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<String, HostHint>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn get(&self, host: &str) -> Option<Vec<IpNetwork>> {
        self.with(|m| m.get(host).map(|h| h.blocks.clone()))
    }

    /// The host's blocks now; full marks of blocks it no longer owns go.
    pub(crate) fn set(&self, host: &str, blocks: Vec<IpNetwork>) {
        self.with(|m| {
            let hint = m.entry(host.to_owned()).or_default();
            hint.full.retain(|b, _| blocks.contains(b));
            hint.blocks = blocks;
        });
    }

    pub(crate) fn forget(&self, host: &str) {
        self.with(|m| m.remove(host));
    }

    /// True when a take found `block` full within [`FULL_FOR`].
    pub(crate) fn is_full(&self, host: &str, block: &IpNetwork) -> bool {
        self.with(|m| {
            m.get(host)
                .and_then(|h| h.full.get(block))
                .is_some_and(|at| at.elapsed() < FULL_FOR)
        })
    }

    /// A take from `block` for `host` left it exhausted.
    pub(crate) fn mark_full(&self, host: &str, block: IpNetwork) {
        self.with(|m| {
            m.entry(host.to_owned())
                .or_default()
                .full
                .insert(block, Instant::now());
        });
    }

    /// Addresses of `block` were released: no host skips it any more.
    pub(crate) fn freed(&self, block: &IpNetwork) {
        self.with(|m| {
            for hint in m.values_mut() {
                hint.full.remove(block);
            }
        });
    }

    /// `addr` was released: no host skips the block holding it any more.
    pub(crate) fn freed_addr(&self, addr: std::net::IpAddr) {
        self.with(|m| {
            for hint in m.values_mut() {
                hint.full.retain(|b, _| !b.contains(addr));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_mark_is_per_host_and_goes_with_a_release_or_the_block() {
        let hints = Hints::default();
        let (a, b): (IpNetwork, IpNetwork) = (
            "10.0.0.0/26".parse().expect("cidr"),
            "10.0.0.64/26".parse().expect("cidr"),
        );
        hints.set("n1", vec![a, b]);
        hints.mark_full("n1", a);
        assert!(hints.is_full("n1", &a));
        assert!(!hints.is_full("n1", &b));
        assert!(!hints.is_full("n2", &a), "another host's mark");
        hints.freed(&a);
        assert!(!hints.is_full("n1", &a), "a release clears it");
        hints.mark_full("n1", a);
        hints.freed_addr("10.0.0.70".parse().expect("ip"));
        assert!(hints.is_full("n1", &a), "an address of another block");
        hints.freed_addr("10.0.0.7".parse().expect("ip"));
        assert!(
            !hints.is_full("n1", &a),
            "an address of the block clears it"
        );
        hints.mark_full("n1", a);
        hints.set("n1", vec![b]);
        hints.set("n1", vec![a, b]);
        assert!(
            !hints.is_full("n1", &a),
            "a block the host lost loses its mark"
        );
    }
}
