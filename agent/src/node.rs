//! The node's desired state: sources (the endpoint registry, links, identities) feed the managers.
//! Every change bumps a generation; the applier publishes the generation it has applied, so an API
//! call can answer only once its change is in the kernel. No kernel I/O happens here.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    dataplane::{endpoints, plane::Dataplane},
    identity::{Identities, IdentityError, LabelSet},
    linkwatch::LinkEvent,
    paths::Paths,
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
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
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
}

impl Node {
    /// Loads the persisted sources and restores every endpoint into the managers before anything
    /// may be swept.
    pub fn open(paths: &Paths, mut dataplane: Dataplane) -> Result<Self, NodeError> {
        let registry = Registry::load(&paths.registry())?;
        let mut identities = Identities::load(&paths.identities())?;
        let namespaces = BTreeMap::new();
        for endpoint in registry.endpoints() {
            let identity = identity_of(&mut identities, &namespaces, endpoint)?;
            let Dataplane {
                endpoints: driver,
                endpoints_manager: manager,
                ..
            } = &mut dataplane;
            manager.upsert(
                driver,
                &endpoint.host_ifname,
                endpoints::entry(endpoint, identity, 0),
            );
        }
        Ok(Self {
            registry,
            identities,
            dataplane,
            namespaces,
            links_synced: false,
            generation: 1,
        })
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
        } = &mut self.dataplane;
        match event {
            LinkEvent::Up { ifname, ifindex } => {
                attachments.link_up(ifname, *ifindex);
                manager.link_up(driver, ifname, *ifindex);
            }
            LinkEvent::Gone { ifname } => {
                attachments.link_gone(ifname);
                manager.link_gone(driver, ifname);
            }
            LinkEvent::Synced => self.links_synced = true,
        }
        self.changed()
    }

    /// Registers (or replaces) an endpoint; returns it with its id and identity, and the generation
    /// that must be applied before its map entries are in the kernel.
    pub fn upsert_endpoint(
        &mut self,
        endpoint: Endpoint,
    ) -> Result<(Endpoint, u32, u64), NodeError> {
        let stored = self.registry.upsert(endpoint)?;
        let identity = identity_of(&mut self.identities, &self.namespaces, &stored)?;
        let Dataplane {
            endpoints: driver,
            endpoints_manager: manager,
            ..
        } = &mut self.dataplane;
        manager.upsert(
            driver,
            &stored.host_ifname,
            endpoints::entry(&stored, identity, 0),
        );
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
        self.identities.get(&labels_of(&self.namespaces, endpoint))
    }

    /// Summary for status.
    #[must_use]
    pub fn summary(&self) -> NodeSummary {
        NodeSummary {
            endpoints: self.registry.len(),
            workload_links: self.dataplane.attachments.links().len(),
            in_sync: self.in_sync(),
            generation: self.generation,
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
