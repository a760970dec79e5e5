//! The nodes source: renews this node's record (its heartbeat) every third of `--node-expiry`, lists every
//! node record, block affinity and endpoint record once, then follows their changes through a datastore
//! watch (etcd) from the listing's revision, and sends the loop only what changed ([`NodeDelta`]s, then
//! [`NodeDelta::Synced`] after the first listing). A node added or removed reaches the loop as soon as its
//! watch event does. Liveness needs no event: every [`TICK`] the nodes are judged again at the current time,
//! so a node whose heartbeat stopped turns silent (degraded; its routes stay while its record exists). A store without a watch is listed again every [`TICK`].
//!
//! A watch whose revision was compacted is followed by a new listing at once; a listing or watch that fails
//! marks the source stale (`Command::SourceStale`: not ready, `applied.source_error`) and is retried with
//! backoff. While the datastore does not answer, the routes in place stay (fail static).
//!
//! Endpoints too: this node's endpoints (from the loop's snapshot, with their effective labels) are
//! published as endpoint records when they change, and the records of every other node with a record,
//! silent or not, reach the loop as remote pods ([`Command::ClusterPods`]), so this node's maps know their
//! addresses by identity. A node's silence changes only its health (fail static, `crate::cluster`).

use std::{collections::BTreeMap, future::Future, sync::Arc, time::Duration};

use ipam::model::{EndpointRecord, NodeRecord};
use tokio::sync::watch;

use crate::{
    calc::policy::pods::RemotePod,
    cluster::{
        ClusterNode, ClusterPod, NodeDelta, diff,
        records::Records,
        store::{NodeStore, NodeStoreError, RecordChanges},
    },
    control::{
        applier::{Command, LoopHandle},
        snapshot::Snapshot,
    },
};

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How often the source judges liveness, renews its record when due, publishes this node's endpoints when
/// they changed, and (for a store without a watch) lists again.
pub const TICK: Duration = Duration::from_secs(1);

/// The first wait after a failed listing or watch; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How often the source renews its record: a third of the expiry, at least every second.
#[must_use]
pub fn interval(expiry: Duration) -> Duration {
    (expiry / 3).max(Duration::from_secs(1))
}

/// Where the source's commands go, and where this node's endpoints come from.
pub trait Output: Send {
    /// Sends a command; false when the loop is gone.
    fn send(&self, command: Command) -> bool;
    /// This node's endpoint records now.
    fn local(&self, node: &str) -> Vec<EndpointRecord>;
    /// Resolves when this node's endpoints may have changed; false when the loop is gone.
    fn changed(&mut self) -> impl Future<Output = bool> + Send;
}

/// The dataplane loop as the source's output.
struct LoopOutput {
    handle: LoopHandle,
    snapshots: watch::Receiver<Arc<Snapshot>>,
}

impl Output for LoopOutput {
    fn send(&self, command: Command) -> bool {
        self.handle.send(command).is_ok()
    }

    fn local(&self, node: &str) -> Vec<EndpointRecord> {
        local_records(node, &self.snapshots.borrow())
    }

    async fn changed(&mut self) -> bool {
        self.snapshots.changed().await.is_ok()
    }
}

/// The loop is gone: the source ends.
struct Gone;

/// How one listing-and-watch ended.
enum Ended {
    /// List again at once (the watch's revision was compacted, or the store cannot watch).
    Relist,
    /// The listing or the watch failed: wait, then list again.
    Failed(NodeStoreError),
}

/// The source's state.
struct Follower<S, O> {
    store: S,
    out: O,
    record: NodeRecord,
    tick: Duration,
    renew_every: Duration,
    renew_at: tokio::time::Instant,
    records: Records,
    known: BTreeMap<String, ClusterNode>,
    synced: bool,
    stale: bool,
    published: Option<Vec<EndpointRecord>>,
    sent_pods: Option<Vec<ClusterPod>>,
}

impl<S: NodeStore, O: Output> Follower<S, O> {
    fn new(store: S, out: O, record: NodeRecord, tick: Duration) -> Self {
        Self {
            renew_every: interval(Duration::from_secs(record.expiry)),
            renew_at: tokio::time::Instant::now(),
            store,
            out,
            record,
            tick,
            records: Records::default(),
            known: BTreeMap::new(),
            synced: false,
            stale: false,
            published: None,
            sent_pods: None,
        }
    }

    fn send(&self, command: Command) -> Result<(), Gone> {
        if self.out.send(command) {
            Ok(())
        } else {
            Err(Gone)
        }
    }

    /// Lists, then follows, until the loop is gone.
    async fn run(mut self) {
        let mut backoff = MIN_BACKOFF;
        loop {
            match self.list_and_follow(&mut backoff).await {
                Err(Gone) => return,
                Ok(Ended::Relist) => {}
                Ok(Ended::Failed(e)) => {
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis(), "node records: the datastore failed; the routes in place stay");
                    if self.set_stale(Some(e.to_string())).is_err() {
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// One listing, then its watch until it ends.
    async fn list_and_follow(&mut self, backoff: &mut Duration) -> Result<Ended, Gone> {
        self.heartbeat_if_due().await;
        let listing = match self.store.list_records().await {
            Ok(l) => l,
            Err(e) => return Ok(Ended::Failed(e)),
        };
        self.records = listing.records;
        let first = !self.synced;
        self.send_changes()?;
        if first {
            tracing::info!(
                nodes = self.known.len(),
                watch = listing.revision.is_some(),
                "node records listed"
            );
        }
        let mut changes = match listing.revision {
            Some(rev) => match self.store.watch_records(rev).await {
                Ok(w) => w,
                Err(e) => return Ok(Ended::Failed(e)),
            },
            None => None,
        };
        self.set_stale(None)?;
        *backoff = MIN_BACKOFF;
        self.publish().await;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + self.tick, self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                batch = next(&mut changes) => match batch {
                    Some(Ok(batch)) => {
                        for change in batch {
                            self.records.apply(change);
                        }
                        self.send_changes()?;
                    }
                    Some(Err(e)) if e.is_compacted() => {
                        tracing::info!(error = %e, "node records: the watch's revision was compacted; listing again");
                        return Ok(Ended::Relist);
                    }
                    Some(Err(e)) => return Ok(Ended::Failed(e)),
                    None => return Ok(Ended::Failed(NodeStoreError::WatchEnded)),
                },
                _ = tick.tick() => {
                    self.heartbeat_if_due().await;
                    self.send_changes()?;
                    self.publish().await;
                    if changes.is_none() {
                        return Ok(Ended::Relist);
                    }
                }
                alive = self.out.changed() => {
                    if !alive {
                        return Err(Gone);
                    }
                    self.publish().await;
                }
            }
        }
    }

    /// Tells the loop whether the source is stale, when that changed.
    fn set_stale(&mut self, why: Option<String>) -> Result<(), Gone> {
        if why.is_some() == self.stale {
            return Ok(());
        }
        self.stale = why.is_some();
        self.send(Command::SourceStale(
            why.map(|e| format!("node records: {e}")),
        ))
    }

    /// Renews this node's record when due; a failure is retried at the next tick.
    async fn heartbeat_if_due(&mut self) {
        if tokio::time::Instant::now() < self.renew_at {
            return;
        }
        self.record.heartbeat = now();
        match self.store.heartbeat(&self.record).await {
            Ok(()) => self.renew_at = tokio::time::Instant::now() + self.renew_every,
            Err(e) => {
                tracing::warn!(error = %e, "node records: cannot renew this node's record; retrying");
            }
        }
    }

    /// Sends the node deltas since the last send (liveness judged now), [`NodeDelta::Synced`] once, and the
    /// remote pods when they changed.
    fn send_changes(&mut self) -> Result<(), Gone> {
        let nodes = self.records.cluster(now());
        let deltas = diff(&self.known, &nodes);
        self.known = nodes;
        let first = !self.synced;
        for delta in deltas.into_iter().chain(first.then_some(NodeDelta::Synced)) {
            self.send(Command::Node(delta))?;
        }
        self.synced = true;
        let pods = remote_pods(
            &self.record.name,
            self.records.endpoint_records(),
            &self.known,
        );
        if self.sent_pods.as_ref() != Some(&pods) {
            self.send(Command::ClusterPods(pods.clone()))?;
            self.sent_pods = Some(pods);
        }
        Ok(())
    }

    /// Publishes this node's endpoint records when they changed; a failure is retried at the next tick.
    async fn publish(&mut self) {
        let local = self.out.local(&self.record.name);
        if self.published.as_ref() == Some(&local) {
            return;
        }
        match self
            .store
            .publish_endpoints(&self.record.name, &local)
            .await
        {
            Ok(()) => self.published = Some(local),
            Err(e) => {
                tracing::warn!(error = %e, "endpoint records: cannot publish this node's; retrying");
            }
        }
    }
}

/// The next batch of a watch; never, without one.
async fn next(
    changes: &mut Option<RecordChanges>,
) -> Option<Result<Vec<crate::cluster::records::RecordChange>, NodeStoreError>> {
    match changes {
        Some(c) => c.recv().await,
        None => std::future::pending().await,
    }
}

/// Runs until the loop is gone.
pub async fn run<S: NodeStore>(dataplane: LoopHandle, store: S, record: NodeRecord) {
    let out = LoopOutput {
        snapshots: dataplane.subscribe(),
        handle: dataplane,
    };
    Follower::new(store, out, record, TICK).run().await;
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

/// The pods of other nodes that have a record (silent ones included: fail static), sorted by key
/// (`namespace/name`).
#[must_use]
pub fn remote_pods(
    node: &str,
    records: Vec<EndpointRecord>,
    nodes: &BTreeMap<String, ClusterNode>,
) -> Vec<ClusterPod> {
    let mut pods: Vec<ClusterPod> = records
        .into_iter()
        .filter(|r| r.node != node && nodes.contains_key(&r.node))
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

#[cfg(test)]
mod tests;
