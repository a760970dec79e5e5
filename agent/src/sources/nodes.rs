//! The nodes source: renews this node's record (its heartbeat) every third of `--node-expiry`, lists every
//! node record and block affinity every [`LIST_EVERY`], and sends the loop what changed ([`NodeDelta`]s), then
//! [`NodeDelta::Synced`] after the first full listing. A datastore that does not answer changes nothing: the
//! routes in place stay (fail static) and the next round retries.

use std::{collections::BTreeMap, time::Duration};

use ipam::model::NodeRecord;

use crate::{
    applier::{Command, LoopHandle},
    nodes::{ClusterNode, NodeDelta, diff, store::NodeStore},
};

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How often the source lists the records and affinities.
pub const LIST_EVERY: Duration = Duration::from_secs(1);

/// How often the source renews its record: a third of the expiry, at least every second.
#[must_use]
pub fn interval(expiry: Duration) -> Duration {
    (expiry / 3).max(Duration::from_secs(1))
}

/// One round: the heartbeat (when `renew`), the listing, and the deltas from `known` (updated). Errors leave
/// `known` as it was.
pub async fn round<S: NodeStore>(
    store: &S,
    record: &mut NodeRecord,
    renew: bool,
    known: &mut BTreeMap<String, ClusterNode>,
) -> Result<Vec<NodeDelta>, crate::nodes::store::NodeStoreError> {
    if renew {
        record.heartbeat = now();
        store.heartbeat(record).await?;
    }
    let listed = store.nodes(now()).await?;
    let deltas = diff(known, &listed);
    *known = listed;
    Ok(deltas)
}

/// Runs until the loop is gone.
pub async fn run<S: NodeStore>(dataplane: LoopHandle, store: S, mut record: NodeRecord) {
    let every = interval(Duration::from_secs(record.expiry));
    let mut known = BTreeMap::new();
    let mut synced = false;
    let mut renew_at = tokio::time::Instant::now();
    loop {
        let renew = tokio::time::Instant::now() >= renew_at;
        match round(&store, &mut record, renew, &mut known).await {
            Ok(deltas) => {
                if renew {
                    renew_at = tokio::time::Instant::now() + every;
                }
                let first = !synced;
                for delta in deltas.into_iter().chain(first.then_some(NodeDelta::Synced)) {
                    if dataplane.send(Command::Node(delta)).is_err() {
                        return;
                    }
                }
                if first {
                    tracing::info!(nodes = known.len(), "node records listed");
                }
                synced = true;
            }
            Err(e) => tracing::warn!(error = %e, "node records: round failed; retrying"),
        }
        tokio::time::sleep(LIST_EVERY.min(every)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipam::{Ipam, store::memory::MemoryStore};

    fn record(name: &str, addr: &str) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            addresses: vec![addr.parse().expect("ip")],
            labels: BTreeMap::new(),
            heartbeat: 0,
            expiry: 30,
        }
    }

    #[tokio::test]
    async fn rounds_send_what_changed_and_a_deleted_record_goes() {
        let store = Ipam::new(MemoryStore::new());
        let (mut a, mut b) = (record("a", "192.0.2.1"), record("b", "192.0.2.2"));
        let (mut known_a, mut known_b) = (BTreeMap::new(), BTreeMap::new());
        let first = round(&store, &mut a, true, &mut known_a)
            .await
            .expect("round");
        assert!(matches!(first.as_slice(), [NodeDelta::Upsert(n)] if n.name == "a" && n.alive));
        round(&store, &mut b, true, &mut known_b)
            .await
            .expect("round");
        let next = round(&store, &mut a, true, &mut known_a)
            .await
            .expect("round");
        assert!(
            next.iter()
                .any(|d| matches!(d, NodeDelta::Upsert(n) if n.name == "b")),
            "{next:?}"
        );
        store.delete_node("b").await.expect("delete");
        let gone = round(&store, &mut a, true, &mut known_a)
            .await
            .expect("round");
        assert!(gone.contains(&NodeDelta::Gone("b".into())), "{gone:?}");
        assert_eq!(interval(Duration::from_secs(42)), Duration::from_secs(14));
        assert_eq!(interval(Duration::from_secs(3)), Duration::from_secs(1));
    }
}
