//! What the dataplane loop publishes after every batch (a `watch` of an `Arc<Snapshot>`): every
//! read of the API and of the metrics comes from here, never from the node itself, so no reader
//! waits for the loop (or for the kernel I/O of an apply).

use std::{collections::BTreeMap, sync::Arc};

use weir_api::EndpointView;

use crate::{
    calc::{pod_ipam::IpamHints, policy::compile::RuleRef, services::view::ServiceViews},
    control::{
        applier::Applied,
        node::{Node, NodeSummary},
    },
    dataplane::plane::DataplaneStats,
};
use prometheus_client::metrics::histogram::Histogram;

/// Upper bounds (seconds) of the apply duration histogram: 0.5 ms to 10 s.
const APPLY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What the dataplane loop measures beside its state, published in every snapshot.
#[derive(Clone, Debug)]
pub struct LoopMeasures {
    /// Durations of the loop's applies (one histogram shared by every snapshot).
    pub apply_durations: Histogram,
    /// The sources' sync state as of the snapshot.
    pub sources: SourceSync,
    /// Periodic refreshes started (`--refresh-interval`).
    pub refreshes: u64,
}

impl Default for LoopMeasures {
    fn default() -> Self {
        Self {
            apply_durations: Histogram::new(APPLY_BUCKETS),
            sources: SourceSync::default(),
            refreshes: 0,
        }
    }
}

/// Whether each source the loop reads is in sync, and how often it came back after being down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceSync {
    /// The link watcher has dumped the links and is running.
    pub links: bool,
    /// Times the link watcher synced again after it stopped and was restarted.
    pub links_resyncs: u64,
    /// The cluster source (policy directory, or the API server's lists) was read and is not stale.
    pub cluster: bool,
    /// Times the cluster source became reachable again after going stale.
    pub cluster_resyncs: u64,
}

/// The node as the loop last published it.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Apply progress and readiness.
    pub applied: Applied,
    /// The node's summary (endpoints, links, in-sync, generation, policies, refusals).
    pub summary: NodeSummary,
    /// Every endpoint with its identity and ifindex, by key (`container:ifname`). Shared with the
    /// previous snapshot when no endpoint changed.
    /// Each view is shared too, so a new snapshot copies pointers, not endpoints.
    pub endpoints: Arc<BTreeMap<String, Arc<EndpointView>>>,
    /// Workload links the link watcher reported (host ifname → ifindex).
    pub links: Arc<BTreeMap<String, u32>>,
    /// Rule id → where the rule came from (`weir policy trace` and the rule hit counters name
    /// them; ids are hashed, not dense: `calc::rule_ids`).
    pub rules: Arc<BTreeMap<u32, RuleRef>>,
    /// Driver counters.
    pub stats: DataplaneStats,
    /// The cluster's nodes with their blocks and routes (empty without node records).
    pub nodes: Arc<Vec<crate::cluster::routing::NodeStatus>>,
    /// The pool and address annotations of the source's Pods and Namespaces (CNI ADD reads
    /// them). Shared with the node: replaced only when the source's objects change.
    pub ipam_hints: Arc<IpamHints>,
    /// The source's Services with their endpoints (`GET /v1/services`); rebuilt only when a
    /// Service or an EndpointSlice changed.
    pub services: Arc<ServiceViews>,
    /// What the loop measures for `/metrics`: apply durations, the sources' sync state.
    pub measured: LoopMeasures,
    /// The host interfaces' drivers: the prefilter's and the masquerade's attachments and errors.
    pub host: Arc<crate::dataplane::host::HostStatus>,
}

impl Snapshot {
    /// The snapshot of a node before the loop ran.
    #[must_use]
    pub fn of(node: &Node, links: &BTreeMap<String, u32>, applied: Applied) -> Self {
        Self {
            applied,
            summary: node.summary(),
            endpoints: Arc::new(endpoint_views(node)),
            links: Arc::new(links.clone()),
            rules: Arc::new(rules(node)),
            stats: node.dataplane_stats(),
            nodes: Arc::new(node.node_status()),
            ipam_hints: node.ipam_hints(),
            services: node.service_view_parts(),
            measured: LoopMeasures::default(),
            host: Arc::new(node.host.status().clone()),
        }
    }

    /// One endpoint.
    #[must_use]
    pub fn endpoint(&self, key: &str) -> Option<&EndpointView> {
        self.endpoints.get(key).map(AsRef::as_ref)
    }
}

/// Every endpoint as the API shows it.
#[must_use]
pub fn endpoint_views(node: &Node) -> BTreeMap<String, Arc<EndpointView>> {
    node.endpoints()
        .map(|e| (e.key(), Arc::new(view(node, e))))
        .collect()
}

/// One endpoint as the API shows it.
#[must_use]
pub fn view(node: &Node, endpoint: &weir_api::Endpoint) -> EndpointView {
    EndpointView {
        // With its Pod's labels when the source has the Pod.
        endpoint: node.effective(endpoint),
        identity: node.identity(endpoint),
        ifindex: node
            .dataplane
            .endpoints_manager
            .ifindex(&endpoint.host_ifname),
    }
}

/// The rules in force by id, sharing `previous` when they are the same (a policy edit that keeps
/// its rules' names and number, as a port or peer change does, recreates the same ids).
#[must_use]
pub fn rules_since(
    node: &Node,
    previous: &Arc<BTreeMap<u32, RuleRef>>,
) -> Arc<BTreeMap<u32, RuleRef>> {
    let now = node.rules();
    let same = now.len() == previous.len()
        && now
            .iter()
            .zip(previous.iter())
            .all(|((id, rule), (old_id, old))| id == old_id && *rule == old);
    if same {
        Arc::clone(previous)
    } else {
        Arc::new(now.into_iter().map(|(id, r)| (id, r.clone())).collect())
    }
}

/// The rules in force by id.
#[must_use]
pub fn rules(node: &Node) -> BTreeMap<u32, RuleRef> {
    node.rules()
        .into_iter()
        .map(|(id, rule)| (id, rule.clone()))
        .collect()
}
