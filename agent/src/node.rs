//! The node's desired state: sources (the endpoint registry, links, identities) feed the managers.
//! Every change bumps a generation; the applier publishes the generation it has applied, so an API
//! call can answer only once its change is in the kernel. No kernel I/O happens here.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use maps_schema::{IdentityInfo, identity::HOST};
use serde::Serialize;

use crate::{
    dataplane::{endpoints, plane::Dataplane},
    identity::{Identities, IdentityError, LabelSet},
    linkwatch::LinkEvent,
    paths::Paths,
    policy::{
        compile::{RuleRef, Subject, compile},
        load::PolicyFileError,
        model::PolicySet,
    },
    registry::{Endpoint, Registry, RegistryError},
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

/// Desired state of this node.
pub struct Node {
    registry: Registry,
    identities: Identities,
    /// Drivers and managers.
    pub dataplane: Dataplane,
    policies: PolicySet,
    policy_errors: Vec<PolicyFileError>,
    rules: Vec<RuleRef>,
    node_addresses: BTreeSet<IpAddr>,
    address_sources: BTreeSet<(u32, IpAddr)>,
    links_synced: bool,
    generation: u64,
}

/// What `GET /v1/status` and `weir status` show of the node.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct NodeSummary {
    /// Registered endpoints.
    pub endpoints: usize,
    /// Workload links seen.
    pub workload_links: usize,
    /// True once every source has been read.
    pub in_sync: bool,
    /// Desired-state generation.
    pub generation: u64,
    /// NetworkPolicies in force.
    pub policies: usize,
    /// Policy documents that were refused (file:line: reason).
    pub policy_errors: Vec<String>,
}

impl Node {
    /// Loads the persisted sources and restores every endpoint into the managers before anything
    /// may be swept.
    pub fn open(
        paths: &Paths,
        dataplane: Dataplane,
        policies: PolicySet,
        policy_errors: Vec<PolicyFileError>,
    ) -> Result<Self, NodeError> {
        let registry = Registry::load(&paths.registry())?;
        let identities = Identities::load(&paths.identities())?;
        let mut node = Self {
            registry,
            identities,
            dataplane,
            policies,
            policy_errors,
            rules: Vec::new(),
            node_addresses: BTreeSet::new(),
            address_sources: BTreeSet::new(),
            links_synced: false,
            generation: 1,
        };
        node.recompute()?;
        Ok(node)
    }

    /// Recomputes every desired map from the sources (managers only: no kernel I/O).
    fn recompute(&mut self) -> Result<(), NodeError> {
        let namespaces = &self.policies.namespaces;
        let mut identities = Vec::new();
        for endpoint in self.registry.endpoints() {
            identities.push(identity_of(&mut self.identities, namespaces, endpoint)?);
        }
        let endpoints: Vec<&Endpoint> = self.registry.endpoints().collect();
        let subjects: Vec<Subject<'_>> = endpoints
            .iter()
            .zip(&identities)
            .map(|(e, i)| Subject {
                endpoint: e,
                identity: *i,
            })
            .collect();
        let compiled = compile(&self.policies, &subjects, &mut self.identities)?;
        let dp = &mut self.dataplane;
        let (mut ident4, mut ident6) = (HashMap::new(), HashMap::new());
        for address in &self.node_addresses {
            insert_ident(&mut ident4, &mut ident6, *address, HOST);
        }
        for (endpoint, identity) in endpoints.iter().zip(&identities) {
            let flags = compiled.flags.get(&endpoint.id).copied().unwrap_or(0);
            dp.endpoints_manager.upsert(
                &mut dp.endpoints,
                &endpoint.host_ifname,
                endpoints::entry(endpoint, *identity, flags),
            );
            for ip in &endpoint.ips {
                insert_ident(&mut ident4, &mut ident6, *ip, *identity);
            }
        }
        dp.ident4.replace_all(ident4);
        dp.ident6.replace_all(ident6);
        dp.ipcache4.replace_all(compiled.ipcache4);
        dp.ipcache6.replace_all(compiled.ipcache6);
        dp.policy.replace_all(compiled.policy);
        self.rules = compiled.rules;
        Ok(())
    }

    /// New policy files: take the valid set, remember the refusals.
    pub fn set_policies(
        &mut self,
        policies: PolicySet,
        errors: Vec<PolicyFileError>,
    ) -> Result<u64, NodeError> {
        self.policies = policies;
        self.policy_errors = errors;
        self.recompute()?;
        Ok(self.changed())
    }

    /// Policy files changed but some document is bad: keep the last good policies in force.
    pub fn policy_refused(&mut self, errors: Vec<PolicyFileError>) {
        self.policy_errors = errors;
    }

    /// The node's own addresses carry the host identity (kubelet probes).
    pub fn set_node_addresses(&mut self, addresses: BTreeSet<IpAddr>) -> Result<u64, NodeError> {
        if addresses == self.node_addresses {
            return Ok(self.generation);
        }
        self.node_addresses = addresses;
        self.recompute()?;
        Ok(self.changed())
    }

    /// Where a policy-map rule id came from.
    #[must_use]
    pub fn rule(&self, rule_id: u32) -> Option<&RuleRef> {
        self.rules
            .get(usize::try_from(rule_id).ok()?.checked_sub(1)?)
    }

    /// True once every source has been read (the links dump; the registry is read at open).
    #[must_use]
    pub fn in_sync(&self) -> bool {
        self.links_synced
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
        }
        self.changed()
    }

    /// Registers (or replaces) an endpoint; returns it with its identity, and the generation that
    /// must be applied before its map entries are in the kernel.
    pub fn upsert_endpoint(
        &mut self,
        endpoint: Endpoint,
    ) -> Result<(Endpoint, u32, u64), NodeError> {
        let stored = self.registry.upsert(endpoint)?;
        let identity = identity_of(&mut self.identities, &self.policies.namespaces, &stored)?;
        self.recompute()?;
        Ok((stored, identity, self.changed()))
    }

    /// Removes an endpoint; returns it if it existed, and the generation to wait for.
    pub fn delete_endpoint(&mut self, key: &str) -> Result<(Option<Endpoint>, u64), NodeError> {
        let removed = self.registry.remove(key)?;
        if let Some(endpoint) = &removed {
            let Dataplane {
                endpoints: driver,
                endpoints_manager: manager,
                ..
            } = &mut self.dataplane;
            manager.remove(driver, &endpoint.host_ifname);
            self.recompute()?;
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
        self.identities
            .get(&labels_of(&self.policies.namespaces, endpoint))
    }

    /// Summary for status.
    #[must_use]
    pub fn summary(&self) -> NodeSummary {
        NodeSummary {
            endpoints: self.registry.len(),
            workload_links: self.dataplane.attachments.links().len(),
            in_sync: self.in_sync(),
            generation: self.generation,
            policies: self.policies.policies.len(),
            policy_errors: self.policy_errors.iter().map(ToString::to_string).collect(),
        }
    }
}

fn insert_ident(
    v4: &mut HashMap<[u8; 4], IdentityInfo>,
    v6: &mut HashMap<[u8; 16], IdentityInfo>,
    address: IpAddr,
    identity: u32,
) {
    let info = IdentityInfo { identity, flags: 0 };
    match address {
        IpAddr::V4(a) => {
            v4.insert(a.octets(), info);
        }
        IpAddr::V6(a) => {
            v6.insert(a.octets(), info);
        }
    }
}

fn labels_of(
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    endpoint: &Endpoint,
) -> LabelSet {
    let empty = BTreeMap::new();
    LabelSet::for_pod(
        &endpoint.labels,
        &endpoint.namespace,
        namespaces.get(&endpoint.namespace).unwrap_or(&empty),
    )
}

fn identity_of(
    identities: &mut Identities,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    endpoint: &Endpoint,
) -> Result<u32, IdentityError> {
    identities.get_or_allocate(&labels_of(namespaces, endpoint))
}
