//! The nodes source: renews this node's record (its heartbeat) every third of `--node-expiry`, lists every
//! node record and block affinity every [`LIST_EVERY`], and sends the loop what changed ([`NodeDelta`]s), then
//! [`NodeDelta::Synced`] after the first full listing. A datastore that does not answer changes nothing: the
//! routes in place stay (fail static) and the next round retries.
//!
//! Endpoints too: this node's endpoints (from the loop's snapshot, with their effective labels) are
//! published as endpoint records when they change, and every other live node's records reach the loop as
//! remote pods ([`Command::ClusterPods`]), so this node's maps know their addresses by identity.

use std::{collections::BTreeMap, time::Duration};

use ipam::model::{EndpointRecord, NodeRecord};

use crate::{
    applier::{Command, LoopHandle},
    nodes::{ClusterNode, ClusterPod, NodeDelta, diff, store::NodeStore},
    policy::pods::RemotePod,
    snapshot::Snapshot,
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

/// This node's endpoint records, from the loop's snapshot (effective labels: a Pod document's win).
#[must_use]
pub fn local_records(node: &str, snapshot: &Snapshot) -> Vec<EndpointRecord> {
    let mut records: Vec<EndpointRecord> = snapshot
        .endpoints
        .values()
        .filter(|v| !v.endpoint.ips.is_empty())
        .map(|v| EndpointRecord {
            node: node.to_owned(),
            namespace: v.endpoint.namespace.clone(),
            pod: v.endpoint.pod.clone(),
            labels: v.endpoint.labels.clone(),
            ips: v.endpoint.ips.clone(),
        })
        .collect();
    records.sort_by_key(EndpointRecord::key_name);
    records.dedup_by(|a, b| a.key_name() == b.key_name());
    records
}

/// The pods of other, live nodes, sorted by key (`namespace/name`).
#[must_use]
pub fn remote_pods(
    node: &str,
    records: Vec<EndpointRecord>,
    nodes: &BTreeMap<String, ClusterNode>,
) -> Vec<ClusterPod> {
    let mut pods: Vec<ClusterPod> = records
        .into_iter()
        .filter(|r| r.node != node && nodes.get(&r.node).is_some_and(|n| n.alive))
        .map(|r| ClusterPod {
            node: r.node,
            pod: RemotePod {
                key: format!("{}/{}", r.namespace, r.pod),
                namespace: r.namespace,
                labels: r.labels,
                ips: r.ips,
                named_ports: Vec::new(),
            },
        })
        .collect();
    pods.sort_by(|a, b| a.pod.key.cmp(&b.pod.key));
    pods
}

/// Runs until the loop is gone.
pub async fn run<S: NodeStore>(dataplane: LoopHandle, store: S, mut record: NodeRecord) {
    let every = interval(Duration::from_secs(record.expiry));
    let mut known = BTreeMap::new();
    let mut synced = false;
    let mut renew_at = tokio::time::Instant::now();
    let snapshots = dataplane.subscribe();
    let mut published: Option<Vec<EndpointRecord>> = None;
    let mut sent_pods: Option<Vec<ClusterPod>> = None;
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
                let local = local_records(&record.name, &snapshots.borrow());
                if let Err(e) = endpoints_round(
                    &store,
                    &dataplane,
                    &record.name,
                    local,
                    &known,
                    &mut published,
                    &mut sent_pods,
                )
                .await
                {
                    if matches!(e, EndpointsRoundError::LoopGone) {
                        return;
                    }
                    tracing::warn!(error = %e, "endpoint records: round failed; retrying");
                }
            }
            Err(e) => tracing::warn!(error = %e, "node records: round failed; retrying"),
        }
        tokio::time::sleep(LIST_EVERY.min(every)).await;
    }
}

/// Why an endpoint round did not finish.
#[derive(Debug, thiserror::Error)]
enum EndpointsRoundError {
    /// The datastore failed.
    #[error(transparent)]
    Store(#[from] crate::nodes::store::NodeStoreError),
    /// The loop is gone.
    #[error("the dataplane loop is gone")]
    LoopGone,
}

/// Publishes this node's records when they changed, and sends the other nodes' pods when they changed.
async fn endpoints_round<S: NodeStore>(
    store: &S,
    dataplane: &LoopHandle,
    node: &str,
    local: Vec<EndpointRecord>,
    nodes: &BTreeMap<String, ClusterNode>,
    published: &mut Option<Vec<EndpointRecord>>,
    sent: &mut Option<Vec<ClusterPod>>,
) -> Result<(), EndpointsRoundError> {
    if published.as_ref() != Some(&local) {
        store.publish_endpoints(node, &local).await?;
        *published = Some(local);
    }
    let pods = remote_pods(node, store.endpoints().await?, nodes);
    if sent.as_ref() != Some(&pods) {
        dataplane
            .send(Command::ClusterPods(pods.clone()))
            .map_err(|_| EndpointsRoundError::LoopGone)?;
        *sent = Some(pods);
    }
    Ok(())
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
