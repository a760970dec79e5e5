//! Cluster-wide identities for the agent: with an etcd or Kubernetes datastore, a label set's number comes
//! from the datastore by compare-and-swap (`ipam::identity`), so every node agrees on it. The calculation
//! asks synchronously, on the loop's thread, only for a label set it has not seen; the answer is cached. A
//! task of its own ([`upkeep`]) renews what this node uses (its endpoints' identities and its policy CIDRs')
//! every quarter of the grace period and collects identities unused for the grace period; a node that
//! stops renewing stops holding them. With the embedded datastore identities stay in the state
//! directory's `identities.json` (one node: nothing to agree with).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use ipam::{identity::IdentityAllocator, store::AnyStore};
use tokio::sync::watch;

use crate::calc::identity::{IdentityError, LabelSet};

/// Label key of a CIDR identity's label set.
const CIDR_LABEL: &str = "weir.dev/cidr";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The datastore-backed identity allocator of one node.
pub struct ClusterIdentities {
    allocator: IdentityAllocator<AnyStore>,
    runtime: tokio::runtime::Handle,
    /// What this node was answered, by number (its CIDR label sets are renewed from here).
    known: Mutex<BTreeMap<u32, LabelSet>>,
}

impl std::fmt::Debug for ClusterIdentities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterIdentities").finish_non_exhaustive()
    }
}

impl ClusterIdentities {
    /// Identities of `node` in `store` (the IPAM's), numbers from `maps_schema::identity::FIRST_ALLOCATED`.
    #[must_use]
    pub fn new(
        store: AnyStore,
        node: &str,
        grace: Duration,
        runtime: tokio::runtime::Handle,
    ) -> Arc<Self> {
        Arc::new(Self {
            allocator: IdentityAllocator::new(
                store,
                node,
                maps_schema::identity::FIRST_ALLOCATED..=u32::from(u16::MAX),
                grace.as_secs(),
            ),
            runtime,
            known: Mutex::new(BTreeMap::new()),
        })
    }

    /// The number of `labels`, from the datastore (blocking: called from the loop's thread, or from
    /// startup code; it runs on a thread of its own so it never blocks inside an async task's context).
    pub fn allocate(&self, labels: &LabelSet) -> Result<u32, IdentityError> {
        let id = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    self.runtime
                        .block_on(self.allocator.allocate(&labels.0, now()))
                })
                .join()
        })
        .map_err(|_| IdentityError::ClusterPanicked)?
        .map_err(|source| IdentityError::Cluster { source })?;
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, labels.clone());
        Ok(id)
    }

    /// The numbers to renew: the endpoints' identities `endpoints` and every CIDR identity answered.
    fn in_use(&self, endpoints: Vec<u32>) -> BTreeSet<u32> {
        let mut ids: BTreeSet<u32> = endpoints.into_iter().collect();
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        ids.extend(
            known
                .iter()
                .filter(|(_, labels)| labels.0.contains_key(CIDR_LABEL))
                .map(|(id, _)| *id),
        );
        ids
    }
}

/// Renews this node's identities every quarter of `grace` and collects unused ones every half of it, until
/// the loop's snapshots end. Failures are logged and retried at the next round; an identity found gone while
/// in use (collected during a datastore partition longer than the grace period) is logged as an error naming
/// the fix.
/// `snapshots` are the loop's (`control::snapshot`), `endpoint_identities` reads the endpoints' identities
/// from one (so this layer need not know the loop's types).
pub async fn upkeep<S: Send + Sync + 'static>(
    identities: Arc<ClusterIdentities>,
    snapshots: watch::Receiver<S>,
    endpoint_identities: impl Fn(&S) -> Vec<u32> + Send + 'static,
    grace: Duration,
) {
    let renew_every = grace / 4;
    let mut round: u64 = 0;
    loop {
        tokio::time::sleep(renew_every).await;
        if snapshots.has_changed().is_err() {
            return;
        }
        round += 1;
        let ids: Vec<u32> = {
            let endpoints = endpoint_identities(&snapshots.borrow());
            identities.in_use(endpoints).into_iter().collect()
        };
        match identities.allocator.renew(&ids, now()).await {
            Ok(gone) if gone.is_empty() => {
                tracing::debug!(renewed = ids.len(), "cluster identities renewed");
            }
            Ok(gone) => tracing::error!(
                identities = ?gone,
                "cluster identities in use here were collected (the datastore was unreachable for longer than \
                 --identity-gc-grace?): restart this agent to allocate its label sets again"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "renewing cluster identities failed; retrying next round");
            }
        }
        if round.is_multiple_of(2) {
            match identities.allocator.collect_garbage(now()).await {
                Ok(released) if !released.is_empty() => {
                    tracing::info!(identities = ?released, "unused cluster identities released");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "collecting unused cluster identities failed"),
            }
        }
    }
}
