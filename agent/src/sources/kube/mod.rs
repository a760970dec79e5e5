//! The Kubernetes source (`--source kubernetes`): kube-rs watchers on Pods, Namespaces,
//! NetworkPolicies, Nodes, Services and EndpointSlices feed one task that keeps their converted objects (`cluster`). Once
//! every watcher delivered its initial list it sends the loop the whole `PolicySet`
//! (`Command::Policies`; the loop writes nothing to the kernel before: the node is not in sync),
//! and from then on one delta per object changed (`Command::ClusterDeltas`), with no debounce:
//! whatever queued while the loop was busy forms one batch. A relist (after 410 Gone) sends only
//! the objects it found changed, come or gone — nothing when nothing changed. Conversion errors
//! are logged naming the object, which is left out; the rest is applied.
//!
//! Under a shared datastore the Nodes are also the node records (`nodes`): every converted Node
//! reaches the nodes task, which joins them with the block affinities into the loop's node deltas.
//!
//! When the API server is unreachable the dataplane keeps its last state (nothing is sent) and
//! the loop is told the source is stale (`Command::SourceStale`: `/readyz` and `weir status`
//! report it) until the API server answers again; the watchers resume within their backoff.

mod backoff;
mod client;
mod cluster;
pub mod nodes;
mod store;
mod watch;

#[cfg(test)]
mod services_tests;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service},
    discovery::v1::EndpointSlice,
    networking::v1::NetworkPolicy,
};
use kube::Api;
use tokio::sync::mpsc;

pub use client::client;
pub use watch::Kind;

use crate::control::applier::{Command, LoopError, LoopHandle};
use cluster::Cluster;
use store::Key;
use watch::Change;

/// What the source reads from the API server, for the DaemonSet's ClusterRole (`deploy/weir.yaml`
/// is checked against it): (API group, resource) — `""` is the core group.
pub const RBAC_RESOURCES: &[(&str, &str)] = &[
    ("", "pods"),
    ("", "namespaces"),
    ("", "nodes"),
    ("", "services"),
    ("networking.k8s.io", "networkpolicies"),
    ("discovery.k8s.io", "endpointslices"),
];
/// The verbs its watchers use on each (a paged list, then watches).
pub const RBAC_VERBS: &[&str] = &["list", "watch"];
/// How often the API server is probed while a watcher is failing.
const PROBE_EVERY: Duration = Duration::from_secs(1);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors setting up the Kubernetes source.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig could not be read or used.
    #[error(
        "cannot use the kubeconfig {}: {source}; fix the file or point --kubeconfig (WEIR_KUBECONFIG) at another",
        path.display()
    )]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Not in a cluster, and no kubeconfig given.
    #[error(
        "no in-cluster configuration ({0}); run the agent in a pod with a service account, or pass --kubeconfig (WEIR_KUBECONFIG)"
    )]
    InCluster(#[source] kube::config::InClusterError),
    /// The client could not be built from the configuration.
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// Runs the source until the loop is gone; every converted Node goes to `nodes` when given (the node
/// records of `nodes::run`).
pub async fn run(dataplane_loop: LoopHandle, client: kube::Client, nodes: Option<nodes::Feed>) {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(watch::forward(
        Api::<Pod>::all(client.clone()),
        Kind::Pods,
        cluster::pod,
        tx.clone(),
    ));
    tokio::spawn(watch::forward(
        Api::<Namespace>::all(client.clone()),
        Kind::Namespaces,
        cluster::namespace,
        tx.clone(),
    ));
    tokio::spawn(watch::forward(
        Api::<NetworkPolicy>::all(client.clone()),
        Kind::NetworkPolicies,
        cluster::policy,
        tx.clone(),
    ));
    tokio::spawn(watch::forward(
        Api::<Node>::all(client.clone()),
        Kind::Nodes,
        cluster::node,
        tx.clone(),
    ));
    tokio::spawn(watch::forward(
        Api::<Service>::all(client.clone()),
        Kind::Services,
        cluster::service,
        tx.clone(),
    ));
    tokio::spawn(watch::forward(
        Api::<EndpointSlice>::all(client.clone()),
        Kind::EndpointSlices,
        cluster::endpoint_slice,
        tx,
    ));
    Source {
        nodes,
        ..Source::default()
    }
    .run(&dataplane_loop, rx, &client)
    .await;
}

/// The source's state between events.
#[derive(Default)]
struct Source {
    cluster: Cluster,
    /// Kinds whose watcher failed last, with the error.
    failing: BTreeMap<Kind, String>,
    /// What the loop was last told about staleness.
    told_stale: bool,
    /// The first set was sent (in sync).
    sent: bool,
    /// Where the Nodes go as node records.
    nodes: Option<nodes::Feed>,
}

impl Source {
    async fn run(
        mut self,
        dataplane_loop: &LoopHandle,
        mut rx: mpsc::UnboundedReceiver<Change>,
        client: &kube::Client,
    ) {
        let mut probe = tokio::time::interval(PROBE_EVERY);
        loop {
            tokio::select! {
                change = rx.recv() => {
                    let Some(change) = change else { return };
                    let mut touched = BTreeSet::new();
                    self.take(change, &mut touched);
                    // Everything queued joins this batch.
                    while let Ok(change) = rx.try_recv() {
                        self.take(change, &mut touched);
                    }
                    // The Nodes to the nodes task: at their first list, then when one changed.
                    if let Some(feed) = &self.nodes
                        && (feed.borrow().is_none() || touched.iter().any(|(k, _)| *k == Kind::Nodes))
                        && let Some(objects) = self.cluster.nodes()
                    {
                        nodes::publish(feed, objects);
                    }
                    if self.send(dataplane_loop, touched).is_err() {
                        return;
                    }
                }
                _ = probe.tick(), if !self.failing.is_empty() => {
                    let answer = tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await;
                    if matches!(answer, Ok(Ok(_))) {
                        tracing::info!("the API server answers again; the watchers resume");
                        self.failing.clear();
                    }
                }
            }
            let stale = !self.failing.is_empty();
            if stale != self.told_stale {
                self.told_stale = stale;
                let why = stale.then(|| {
                    let failing: Vec<String> = self
                        .failing
                        .iter()
                        .map(|(k, e)| format!("{} watcher: {e}", k.name()))
                        .collect();
                    format!(
                        "the Kubernetes API server is unreachable ({}); the last known state stays in force",
                        failing.join("; ")
                    )
                });
                if dataplane_loop.send(Command::SourceStale(why)).is_err() {
                    return;
                }
            }
        }
    }

    /// Tells the loop what a batch of changes did: nothing before every initial list is in, then
    /// the whole set once, then one delta per object changed (the object as it is now: an object
    /// changed twice in a batch is sent once).
    fn send(
        &mut self,
        dataplane_loop: &LoopHandle,
        touched: BTreeSet<(Kind, Key)>,
    ) -> Result<(), LoopError> {
        if !self.cluster.synced() {
            return Ok(());
        }
        if !self.sent {
            tracing::info!(objects = ?self.cluster.counts(), "every watcher delivered its initial list; in sync");
            self.sent = true;
            let (set, errors) = self.cluster.set();
            return dataplane_loop.send(Command::Policies { set, errors });
        }
        if touched.is_empty() {
            return Ok(());
        }
        let deltas = touched
            .iter()
            .map(|(kind, key)| self.cluster.delta(*kind, key))
            .collect();
        dataplane_loop.send(Command::ClusterDeltas(deltas))
    }

    fn take(&mut self, change: Change, touched: &mut BTreeSet<(Kind, Key)>) {
        let kind = change.kind();
        match &change {
            Change::Error(_, e) => {
                tracing::warn!(kind = kind.name(), error = %e, "watcher failed; retrying with backoff");
                self.failing.insert(kind, e.clone());
                return;
            }
            Change::InitApply(_, key, object) | Change::Apply(_, key, object) => {
                if let Some(e) = object.error() {
                    tracing::warn!(object = %cluster::object_name(kind, key), error = %e, "object refused and left out until a valid version of it arrives (fix the object on the API server); the rest is applied");
                }
            }
            _ => {}
        }
        self.failing.remove(&kind);
        touched.extend(self.cluster.take(change).into_iter().map(|key| (kind, key)));
    }
}
