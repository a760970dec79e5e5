//! The node's desired state: sources (the endpoint registry, links, policies, node addresses)
//! feed the incremental calculation (`crate::calc`), which records what each change alters in the
//! managers' and drivers' desired state. Every change bumps a generation; the applier publishes the
//! generation it has applied, so an API call can answer only once its change is in the kernel. No
//! kernel I/O happens here.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use weir_api::Endpoint;

use crate::{
    calc::{
        Calculation,
        identity::{Identities, IdentityError},
        pod_ipam::IpamHints,
        policy::{
            compile::RuleRef,
            load::PolicyFileError,
            model::{Pod, PolicySet},
            pods::{self, RemotePod},
            warnings,
        },
    },
    cluster::{
        AddressView, ClusterPod, NodeDelta,
        routing::{NodeRoutes, NodeStatus},
    },
    dataplane::plane::Dataplane,
    kernel::{Drift, LinkEvent},
    paths::Paths,
    sources::registry::{Registry, RegistryError},
};

/// Errors of node state changes.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The registry refused or failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Identity allocation failed.
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

/// The caveats of `policies` (`policy::warnings`), each new one (not in `before`) logged naming
/// its object.
fn caveats(policies: &PolicySet, before: &[String]) -> Vec<String> {
    let now: Vec<String> = warnings::check(policies)
        .into_iter()
        .map(|w| w.reason)
        .collect();
    let known: BTreeSet<&String> = before.iter().collect();
    for w in now.iter().filter(|w| !known.contains(w)) {
        tracing::warn!(warning = %w, "a source object applies with a caveat");
    }
    now
}

/// Desired state of this node.
pub struct Node {
    registry: Registry,
    calc: Calculation,
    /// Drivers and managers.
    pub dataplane: Dataplane,
    /// The host interfaces' drivers (the XDP prefilter, the masquerade) with their desired state;
    /// the loop applies them beside the maps.
    pub host: crate::dataplane::host::HostDrivers,
    policy_errors: Vec<PolicyFileError>,
    /// Objects that apply with a caveat (`policy::warnings`), as `weir status` lists them.
    policy_warnings: Vec<String>,
    /// The source's Pods (local endpoints take their labels from them) and Nodes.
    cluster: PolicySet,
    /// Each Service's views (`GET /v1/services`), rebuilt per Service as it changes.
    service_views: BTreeMap<
        crate::calc::services::incremental::ObjectKey,
        Arc<Vec<crate::calc::services::view::ServiceView>>,
    >,
    /// The pool and address annotations of the source's Pods and Namespaces (read on CNI ADD).
    ipam_hints: Arc<IpamHints>,
    /// This node's name, when known (its pods are not remote).
    node_name: Option<String>,
    node_addresses: BTreeSet<IpAddr>,
    address_sources: BTreeSet<(u32, IpAddr)>,
    links_synced: bool,
    /// False while the cluster source (`--source kubernetes`) has not delivered every initial
    /// list: its first whole set makes it true (the policy files are read before `open`).
    policies_synced: bool,
    generation: u64,
    /// Routes to other nodes' blocks (with node records: an `etcd:` datastore).
    routes: Option<NodeRoutes>,
    /// Other nodes' pods from their endpoint records.
    cluster_pods: Vec<ClusterPod>,
    /// The documents of the last policy set, waiting for [`Node::drop_retired`].
    retired: Option<PolicySet>,
    /// How often every driver reads its kernel state back and repairs drift (`--refresh-interval`;
    /// `None`: only at start, after a failed write and on the kernel's deletion events).
    refresh_interval: Option<std::time::Duration>,
}

/// What `GET /v1/status` and `weir status` show of the node (the API contract's).
pub use weir_api::NodeSummary;

impl Node {
    /// Loads the persisted sources and restores every endpoint into the managers before anything
    /// may be swept.
    pub fn open(
        paths: &Paths,
        dataplane: Dataplane,
        policies: PolicySet,
        policy_errors: Vec<PolicyFileError>,
    ) -> Result<Self, NodeError> {
        let identities = Identities::load(&paths.identities())?;
        Self::open_with_identities(paths, dataplane, policies, policy_errors, identities)
    }

    /// [`Node::open`] with the given identity allocator (cluster-wide identities from the datastore).
    pub fn open_with_identities(
        paths: &Paths,
        mut dataplane: Dataplane,
        policies: PolicySet,
        policy_errors: Vec<PolicyFileError>,
        identities: Identities,
    ) -> Result<Self, NodeError> {
        let registry = Registry::load(&paths.registry())?;
        let mut calc = Calculation::new(identities);
        calc.set_policies(&policies)?;
        let effective: Vec<_> = registry
            .endpoints()
            .map(|e| pods::effective(e, &policies))
            .collect();
        let endpoints: Vec<&Endpoint> = effective.iter().map(AsRef::as_ref).collect();
        calc.upsert_endpoints(&endpoints)?;
        for e in registry.endpoints() {
            calc.set_endpoint_ports(&e.key(), pods::named_ports_of(e, &policies));
        }
        calc.set_remote_pods(&pods::remote(&policies, registry.endpoints(), None))?;
        let ipam_hints = IpamHints::of(&policies);
        let policy_warnings = caveats(&policies, &[]);
        let changed_services = dataplane
            .services
            .set(&policies.services, &policies.endpoint_slices);
        let cluster = PolicySet {
            policies: Default::default(),
            namespaces: Default::default(),
            ..policies
        };
        let mut node = Self {
            registry,
            calc,
            dataplane,
            host: crate::dataplane::host::HostDrivers::default(),
            policy_errors,
            policy_warnings,
            cluster,
            ipam_hints,
            node_name: None,
            node_addresses: BTreeSet::new(),
            address_sources: BTreeSet::new(),
            links_synced: false,
            policies_synced: true,
            generation: 1,
            routes: None,
            cluster_pods: Vec::new(),
            retired: None,
            refresh_interval: None,
            service_views: BTreeMap::new(),
        };
        node.refresh_service_views(changed_services);
        node.flush();
        Ok(node)
    }

    /// Hands what the last change altered to the managers and drivers (no kernel I/O).
    fn flush(&mut self) {
        self.calc.flush(&mut self.dataplane);
    }

    /// New source contents: take the valid set, remember the refusals. Endpoints whose Pod's
    /// labels changed move to their new identity (the same path as a re-registration with new
    /// labels); remote pods' addresses follow the set.
    pub fn set_policies(
        &mut self,
        mut policies: PolicySet,
        errors: Vec<PolicyFileError>,
    ) -> Result<u64, NodeError> {
        if self.only_policies_differ(&policies) {
            // An edit of NetworkPolicies alone (the common one): no endpoint moves and no named
            // port, remote pod, IPAM hint or Service changes, so only the policies are diffed.
            self.calc.set_policies(&policies)?;
            self.policy_warnings = caveats(&policies, &self.policy_warnings);
            self.retired = Some(PolicySet {
                policies: std::mem::take(&mut policies.policies),
                namespaces: std::mem::take(&mut policies.namespaces),
                ..PolicySet::default()
            });
            self.policy_errors = errors;
            self.flush();
            return Ok(self.changed());
        }
        let relabelled: Vec<Endpoint> = self
            .registry
            .endpoints()
            .filter_map(|e| {
                let now = pods::effective(e, &policies);
                (now.labels != pods::effective(e, &self.cluster).labels).then(|| now.into_owned())
            })
            .collect();
        self.calc.set_policies(&policies)?;
        self.calc
            .upsert_endpoints(&relabelled.iter().collect::<Vec<_>>())?;
        // Without Pod objects, before or now, no endpoint has named ports to change.
        if !policies.pods.is_empty() || !self.cluster.pods.is_empty() {
            for e in self.registry.endpoints() {
                self.calc
                    .set_endpoint_ports(&e.key(), pods::named_ports_of(e, &policies));
            }
        }
        let remote = self.remote_pods(&policies);
        self.calc.set_remote_pods(&remote)?;
        self.ipam_hints = IpamHints::of(&policies);
        self.policy_warnings = caveats(&policies, &self.policy_warnings);
        let changed_services = self
            .dataplane
            .services
            .set(&policies.services, &policies.endpoint_slices);
        // The policies and namespaces are the calculation's now; the set's own copies are freed
        // after the loop has published (`drop_retired`), not on the write's path.
        self.retired = Some(PolicySet {
            policies: std::mem::take(&mut policies.policies),
            namespaces: std::mem::take(&mut policies.namespaces),
            ..PolicySet::default()
        });
        self.cluster = policies;
        self.refresh_service_views(changed_services);
        self.policy_errors = errors;
        self.policies_synced = true;
        self.flush();
        Ok(self.changed())
    }

    /// The remote pods: the source's (`set`), and the other nodes' endpoint records (a pod both name is the
    /// source's), never a local endpoint's.
    fn remote_pods(&self, set: &PolicySet) -> Vec<RemotePod> {
        let mut pods = pods::remote(set, self.registry.endpoints(), self.node_name.as_deref());
        let mut skip: BTreeSet<String> = self
            .registry
            .endpoints()
            .map(|e| format!("{}/{}", e.namespace, e.pod))
            .collect();
        skip.extend(pods.iter().map(|p| p.key.clone()));
        pods.extend(
            self.cluster_pods
                .iter()
                .map(|c| &c.pod)
                .filter(|p| !skip.contains(&p.key))
                .cloned(),
        );
        pods.sort_by(|a, b| a.key.cmp(&b.key));
        pods
    }

    /// The other nodes' pods, from their endpoint records (the whole set): they become remote pods.
    pub fn set_cluster_pods(&mut self, pods: Vec<ClusterPod>) -> Result<u64, NodeError> {
        if pods == self.cluster_pods {
            return Ok(self.generation);
        }
        self.cluster_pods = pods;
        let remote = self.remote_pods(&self.cluster);
        self.calc.set_remote_pods(&remote)?;
        self.flush();
        Ok(self.changed())
    }

    /// Every pod address known: this node's endpoints and the other nodes' pods, with the identity this
    /// node's maps give each.
    #[must_use]
    pub fn addresses(&self) -> Vec<AddressView> {
        let here = self.node_name.clone().unwrap_or_default();
        let mut out: Vec<AddressView> = self
            .registry
            .endpoints()
            .flat_map(|e| {
                let identity = self.identity(e);
                let (pod, node) = (format!("{}/{}", e.namespace, e.pod), here.clone());
                e.ips.iter().map(move |ip| AddressView {
                    ip: *ip,
                    identity,
                    node: node.clone(),
                    pod: pod.clone(),
                })
            })
            .collect();
        let identity = |ip: &IpAddr| {
            match ip {
                IpAddr::V4(v4) => self.dataplane.ident4.desired(&v4.octets()),
                IpAddr::V6(v6) => self.dataplane.ident6.desired(&v6.octets()),
            }
            .map(|i| i.identity)
        };
        // Node addresses (no pod): this node's (host) and the other nodes' (remote-node, or the
        // identity of a policy CIDR covering them).
        let nodes = self
            .node_addresses
            .iter()
            .map(|ip| (here.as_str(), *ip))
            .chain(self.calc.remote_node_addresses());
        for (node, ip) in nodes {
            out.push(AddressView {
                ip,
                identity: Some(self.dataplane.identity_of(ip)),
                node: node.to_owned(),
                pod: String::new(),
            });
        }
        let mut known: BTreeSet<String> = out.iter().map(|a| a.pod.clone()).collect();
        for c in &self.cluster_pods {
            known.insert(c.pod.key.clone());
            for ip in &c.pod.ips {
                out.push(AddressView {
                    ip: *ip,
                    identity: identity(ip),
                    node: c.node.clone(),
                    pod: c.pod.key.clone(),
                });
            }
        }
        // Other nodes' pods from the source's Pod objects (`--source kubernetes`).
        for p in self.cluster.pods.values() {
            let Some(remote) = pods::remote_pod(p, false, self.node_name.as_deref()) else {
                continue;
            };
            if known.contains(&remote.key) {
                continue;
            }
            for ip in &remote.ips {
                out.push(AddressView {
                    ip: *ip,
                    identity: identity(ip),
                    node: p.node.clone().unwrap_or_default(),
                    pod: remote.key.clone(),
                });
            }
        }
        out.sort_by_key(|a| a.ip);
        out
    }

    /// Routes this node's way to other nodes' blocks through `routes` (from now on, node deltas reach it).
    pub fn set_routing(&mut self, routes: NodeRoutes) {
        self.routes = Some(routes);
    }

    /// A change of the cluster's nodes: the desired routes follow (no kernel I/O).
    pub fn on_node_delta(&mut self, delta: NodeDelta) {
        self.remote_node_identities(&delta);
        match &mut self.routes {
            Some(routes) => routes.on_delta(delta),
            None => tracing::debug!(?delta, "a node delta without routing; ignored"),
        }
    }

    /// Other nodes' addresses carry the remote-node identity (the local node's record is skipped:
    /// its addresses are `host`, from the link watcher).
    fn remote_node_identities(&mut self, delta: &NodeDelta) {
        let local = self.node_name.as_deref();
        match delta {
            NodeDelta::Upsert(node) if Some(node.name.as_str()) != local => {
                self.calc.set_remote_node(&node.name, Some(&node.addresses));
            }
            NodeDelta::Gone(name) if Some(name.as_str()) != local => {
                self.calc.set_remote_node(name, None);
            }
            NodeDelta::Upsert(_) | NodeDelta::Gone(_) | NodeDelta::Synced => return,
        }
        self.flush();
    }

    /// Sets how often the loop refreshes every driver (`None`: never periodically).
    pub fn set_refresh_interval(&mut self, interval: Option<std::time::Duration>) {
        self.refresh_interval = interval;
    }

    /// How often the loop refreshes every driver.
    #[must_use]
    pub fn refresh_interval(&self) -> Option<std::time::Duration> {
        self.refresh_interval
    }

    /// A periodic refresh: every driver reads its kernel state back at the next apply and repairs
    /// what was changed from outside (no kernel I/O here).
    pub fn refresh(&mut self) {
        self.dataplane.refresh();
        self.host.refresh();
        if let Some(routes) = &mut self.routes {
            routes.refresh();
        }
    }

    /// Every driver's counters, the routes' and the VXLAN device's repairs included.
    #[must_use]
    pub fn dataplane_stats(&self) -> crate::dataplane::plane::DataplaneStats {
        let mut stats = self.dataplane.stats();
        if let Some(routes) = &self.routes {
            let (r, v) = routes.routing().stats();
            stats.repairs.push(("routes".to_owned(), r.repairs));
            stats.repairs.push(("vxlan".to_owned(), v.repairs));
        }
        stats
    }

    /// True when the routes have work to do.
    #[must_use]
    pub fn routes_dirty(&self) -> bool {
        self.routes.as_ref().is_some_and(NodeRoutes::is_dirty)
    }

    /// Reconciles the routes (the loop calls this after the maps, on its thread).
    pub fn apply_routes(&mut self) -> Result<(), crate::dataplane::node_routes::NodeRoutesError> {
        self.routes.as_mut().map_or(Ok(()), NodeRoutes::apply)
    }

    /// The cluster's nodes as the status shows them.
    #[must_use]
    pub fn node_status(&self) -> Vec<NodeStatus> {
        self.routes
            .as_ref()
            .map(NodeRoutes::status)
            .unwrap_or_default()
    }

    /// Frees what the last [`Self::set_policies`] left to free (the loop calls it once a batch
    /// is published; at most one set waits otherwise).
    pub fn drop_retired(&mut self) {
        self.retired = None;
    }

    /// The policies come from a source that has not listed them yet (`--source kubernetes`):
    /// not in sync (nothing written) until its first [`Self::set_policies`].
    pub fn await_policy_source(&mut self) {
        self.policies_synced = false;
    }

    /// This node's name (its pods in the source are local, never remote).
    pub fn set_node_name(&mut self, name: &str) -> Result<u64, NodeError> {
        self.node_name = Some(name.to_owned());
        self.refresh_remote_pods()?;
        self.flush();
        Ok(self.changed())
    }

    /// True when the source has a Pod object named as `endpoint`'s registration names its pod:
    /// only then can registering or removing the endpoint change which pods are remote
    /// (`pods::remote` leaves out exactly the Pods named by a local endpoint).
    fn has_pod(&self, endpoint: &Endpoint) -> bool {
        (!self.cluster.pods.is_empty()
            && self
                .cluster
                .pods
                .contains_key(&(endpoint.namespace.clone(), endpoint.pod.clone())))
            || self.cluster_pods.iter().any(|c| {
                c.pod.namespace == endpoint.namespace
                    && c.pod.key == format!("{}/{}", endpoint.namespace, endpoint.pod)
            })
    }

    /// Recomputes the remote pods from the source's Pods, the other nodes' endpoint records and the local
    /// endpoints.
    fn refresh_remote_pods(&mut self) -> Result<(), NodeError> {
        let remote = self.remote_pods(&self.cluster);
        self.calc.set_remote_pods(&remote)?;
        Ok(())
    }

    /// The endpoints whose view `policies` would change: their namespace's labels or their
    /// Pod's labels change (so their identities).
    #[must_use]
    pub fn relabelled_endpoints(&self, policies: &PolicySet) -> BTreeSet<String> {
        if self.only_policies_differ(policies) {
            return BTreeSet::new();
        }
        let namespaces = self.calc.relabelled_namespaces(policies);
        self.registry
            .endpoints()
            .filter(|e| {
                namespaces.contains(&e.namespace)
                    || pods::effective(e, policies).labels
                        != pods::effective(e, &self.cluster).labels
            })
            .map(Endpoint::key)
            .collect()
    }

    /// True when `set` differs from what the node holds in its NetworkPolicies alone: its Pods,
    /// Nodes, Services, EndpointSlices, namespace labels and annotations are the node's (after a
    /// first whole set).
    fn only_policies_differ(&self, set: &PolicySet) -> bool {
        let held = &self.cluster;
        self.policies_synced
            && set.pods == held.pods
            && set.nodes == held.nodes
            && set.services == held.services
            && set.endpoint_slices == held.endpoint_slices
            && set.namespace_annotations == held.namespace_annotations
            && self.calc.relabelled_namespaces(set).is_empty()
    }

    /// The source's Services with their EndpointSlices' endpoints (`GET /v1/services`).
    #[must_use]
    pub fn service_views(&self) -> Vec<crate::calc::services::view::ServiceView> {
        self.service_views
            .values()
            .flat_map(|v| v.iter().cloned())
            .collect()
    }

    /// [`Self::service_views`] as the snapshot publishes them: one shared part per Service.
    #[must_use]
    pub fn service_view_parts(&self) -> Arc<crate::calc::services::view::ServiceViews> {
        Arc::new(self.service_views.values().cloned().collect())
    }

    /// Rebuilds the views of the Services `changed` (their object or slices changed).
    pub(crate) fn refresh_service_views(
        &mut self,
        changed: BTreeSet<crate::calc::services::incremental::ObjectKey>,
    ) {
        for key in changed {
            match self.cluster.services.get(&key) {
                Some(service) => {
                    let slices = self.dataplane.services.slices_of(&key);
                    self.service_views.insert(
                        key,
                        Arc::new(crate::calc::services::view::views_of(service, &slices)),
                    );
                }
                None => {
                    self.service_views.remove(&key);
                }
            }
        }
    }

    /// The pool and address annotations of the source's Pods and Namespaces.
    #[must_use]
    pub fn ipam_hints(&self) -> Arc<IpamHints> {
        Arc::clone(&self.ipam_hints)
    }

    /// The source's Pod object of a local endpoint, if any.
    #[must_use]
    pub fn pod_of(&self, endpoint: &Endpoint) -> Option<&Pod> {
        pods::pod_of(endpoint, &self.cluster)
    }

    /// The endpoint as policy sees it (its Pod's labels when the source has the Pod).
    #[must_use]
    pub fn effective(&self, endpoint: &Endpoint) -> Endpoint {
        pods::effective(endpoint, &self.cluster).into_owned()
    }

    /// The node's own addresses carry the host identity (kubelet probes).
    pub fn set_node_addresses(&mut self, addresses: BTreeSet<IpAddr>) -> Result<u64, NodeError> {
        if addresses == self.node_addresses {
            return Ok(self.generation);
        }
        self.calc.set_node_addresses(&addresses);
        self.node_addresses = addresses;
        self.flush();
        Ok(self.changed())
    }

    /// Where a policy-map rule id came from.
    #[must_use]
    pub fn rule(&self, rule_id: u32) -> Option<&RuleRef> {
        self.calc.rule(rule_id)
    }

    /// Every rule id in use with its origin, in id order.
    #[must_use]
    pub fn rules(&self) -> Vec<(u32, &RuleRef)> {
        self.calc.rules()
    }

    /// True once every source has been read (the links dump, and the cluster source's initial
    /// lists when it is one; the registry is read at open).
    #[must_use]
    pub fn in_sync(&self) -> bool {
        self.links_synced && self.policies_synced
    }

    /// Whether the links dump and the cluster source (policy files or the API server's initial
    /// lists) have each been read (`weir_source_synced`).
    #[must_use]
    pub fn sources_synced(&self) -> (bool, bool) {
        (self.links_synced, self.policies_synced)
    }

    /// The desired-state generation.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn changed(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// A link event from the watcher.
    pub fn on_link(&mut self, event: &LinkEvent) -> u64 {
        let Dataplane {
            attachments,
            endpoints: driver,
            endpoints_manager: manager,
            ..
        } = &mut self.dataplane;
        match event {
            LinkEvent::Up {
                ifname,
                ifindex,
                up,
            } => {
                attachments.link_up(ifname, *ifindex, *up);
                manager.link_up(driver, ifname, *ifindex);
            }
            LinkEvent::Gone { ifname } => {
                attachments.link_gone(ifname);
                manager.link_gone(driver, ifname);
            }
            LinkEvent::Address {
                ifindex,
                addr,
                present,
            } => {
                let changed = if *present {
                    self.address_sources.insert((*ifindex, *addr))
                } else {
                    self.address_sources.remove(&(*ifindex, *addr))
                };
                if changed {
                    let addresses = self.address_sources.iter().map(|(_, a)| *a).collect();
                    if let Err(e) = self.set_node_addresses(addresses) {
                        tracing::error!(error = %e, "cannot recompute after a node address change");
                    }
                }
            }
            LinkEvent::Synced => self.links_synced = true,
            // Nothing desired changes: the drivers read the named part back at the next apply.
            LinkEvent::Drift(drift) => {
                match drift {
                    Drift::Tc { ifindex } => attachments.check(*ifindex),
                    Drift::Route | Drift::Neighbour { .. } => {
                        if let Some(routes) = &mut self.routes {
                            routes.refresh();
                        }
                    }
                }
                return self.generation;
            }
        }
        self.changed()
    }

    /// Registers (or replaces) an endpoint; returns it with its identity, and the generation that
    /// must be applied before its map entries are in the kernel.
    pub fn upsert_endpoint(
        &mut self,
        endpoint: Endpoint,
    ) -> Result<(Endpoint, u32, u64), NodeError> {
        // Its identity is allocated and persisted before the registry holds the endpoint.
        self.calc
            .prepare_endpoint(&pods::effective(&endpoint, &self.cluster))?;
        let replaced_pod = self
            .registry
            .get(&endpoint.key())
            .filter(|old| self.has_pod(old))
            .is_some();
        let stored = self.registry.upsert(endpoint)?;
        let identity = self
            .calc
            .upsert_endpoints(&[&pods::effective(&stored, &self.cluster)])?
            .first()
            .copied()
            .unwrap_or_default();
        self.calc
            .set_endpoint_ports(&stored.key(), pods::named_ports_of(&stored, &self.cluster));
        // A pod that just became local is no longer remote (and the one its registration named
        // before may be remote again).
        if replaced_pod || self.has_pod(&stored) {
            self.refresh_remote_pods()?;
        }
        self.flush();
        Ok((stored, identity, self.changed()))
    }

    /// Removes an endpoint; returns it if it existed, and the generation to wait for.
    pub fn delete_endpoint(&mut self, key: &str) -> Result<(Option<Endpoint>, u64), NodeError> {
        let removed = self.registry.remove(key)?;
        if removed.is_some() {
            self.calc.remove_endpoint(key);
            self.calc.set_endpoint_ports(key, Vec::new());
            if removed.as_ref().is_some_and(|e| self.has_pod(e)) {
                self.refresh_remote_pods()?;
            }
            self.flush();
        }
        Ok((removed, self.changed()))
    }

    /// Every endpoint.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.registry.endpoints()
    }

    /// One endpoint.
    #[must_use]
    pub fn endpoint(&self, key: &str) -> Option<&Endpoint> {
        self.registry.get(key)
    }

    /// The identity of an endpoint, if allocated.
    #[must_use]
    pub fn identity(&self, endpoint: &Endpoint) -> Option<u32> {
        self.calc
            .identity_of(&pods::effective(endpoint, &self.cluster))
    }

    /// Summary for status.
    #[must_use]
    pub fn summary(&self) -> NodeSummary {
        NodeSummary {
            endpoints: self.registry.len(),
            workload_links: self.dataplane.attachments.links().len(),
            in_sync: self.in_sync(),
            generation: self.generation,
            policies: self.calc.policy_count(),
            policy_errors: self.policy_errors.iter().map(ToString::to_string).collect(),
            policy_warnings: self.policy_warnings.clone(),
        }
    }
}

#[path = "node_deltas.rs"]
mod deltas;
pub use deltas::DeltasApplied;

#[cfg(test)]
#[path = "node_deltas_tests.rs"]
mod deltas_tests;

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
