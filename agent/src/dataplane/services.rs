//! The service maps' driver family: `svc4_v1` (frontends), `svc_slots_v1`, `svc_backend4_v1`
//! and `svc_revnat4_v1`, desired from `services::desired` (no kernel I/O when the sources
//! change), each reconciled by its own [`MapDriver`] (read back, write the diff, sweep orphans;
//! a restart over unchanged state writes nothing).
//!
//! Security order (`plane`): nothing is written before identities, ipcache and policy are (a
//! packet to a frontend is judged by its backend's identity, so a backend must not be reachable
//! through a frontend before the policy that guards it is in place); within the family, backends,
//! reverse NAT and slots go before the frontends that point at them. Deletes always go (they only
//! close). Established translated flows do not depend on these maps (`svc_ct4_v1` holds their
//! backend), so a backend leaving a service ends no flow.

use std::{collections::HashMap, time::Instant};

use maps_schema::service::{
    Backend4, RevNat4, SVC_BACKENDS4, SVC_REVNAT4, SVC_SLOTS, SVC4, SlotKey, SlotValue, Svc4Key,
    Svc4Value,
};

use super::{
    kernel::{KernelError, MapIo, PinnedHash},
    map_driver::{DriverStats, MapDriver, Pending},
};
use crate::{
    paths::Paths,
    services::desired::{self, Desired, Ids, Services, Slices},
};

/// A desired frontend, its value, and its backends (id, backend) in slot order.
pub type FrontendEntry = (Svc4Key, Svc4Value, Vec<(u32, Backend4)>);

/// The four service map drivers and the ids that keep their keys stable.
pub struct ServiceMaps {
    /// `svc4_v1`.
    pub frontends: MapDriver<Svc4Key, Svc4Value>,
    /// `svc_slots_v1`.
    pub slots: MapDriver<SlotKey, SlotValue>,
    /// `svc_backend4_v1`.
    pub backends: MapDriver<u32, Backend4>,
    /// `svc_revnat4_v1`.
    pub revnat: MapDriver<u32, RevNat4>,
    ids: Ids,
    /// This node's name: endpoints with it as `nodeName` are local backends.
    node: String,
}

fn contents<K: std::hash::Hash + Eq, V>(m: std::collections::BTreeMap<K, V>) -> HashMap<K, V> {
    m.into_iter().collect()
}

impl ServiceMaps {
    /// Drivers over these maps; the first apply is a full resync.
    pub fn new(
        frontends: Box<dyn MapIo<Svc4Key, Svc4Value>>,
        slots: Box<dyn MapIo<SlotKey, SlotValue>>,
        backends: Box<dyn MapIo<u32, Backend4>>,
        revnat: Box<dyn MapIo<u32, RevNat4>>,
    ) -> Self {
        Self {
            frontends: MapDriver::new(frontends),
            slots: MapDriver::new(slots),
            backends: MapDriver::new(backends),
            revnat: MapDriver::new(revnat),
            ids: Ids::default(),
            node: String::new(),
        }
    }

    /// The node whose endpoints are local (NodePorts translate to them without a source change,
    /// and `externalTrafficPolicy: Local` serves only them). Call before the first [`Self::set`].
    #[must_use]
    pub fn for_node(mut self, node: &str) -> Self {
        node.clone_into(&mut self.node);
        self
    }

    /// Drivers over the pinned maps under `paths`.
    pub fn open(paths: &Paths) -> Result<Self, KernelError> {
        let pin = |name: &str| paths.map_pin(name);
        Ok(Self::new(
            Box::new(PinnedHash::open(SVC4, &pin(SVC4))?),
            Box::new(PinnedHash::open(SVC_SLOTS, &pin(SVC_SLOTS))?),
            Box::new(PinnedHash::open(SVC_BACKENDS4, &pin(SVC_BACKENDS4))?),
            Box::new(PinnedHash::open(SVC_REVNAT4, &pin(SVC_REVNAT4))?),
        ))
    }

    /// Drivers over new maps of the fake kernel (`testing`'s in-process agent).
    #[cfg(feature = "testing")]
    pub(crate) fn fake(kernel: &super::fake::FakeKernel) -> Self {
        FakeServiceMaps::new(kernel).drivers()
    }

    /// Manager side: the sources' Services and EndpointSlices now. Only what changed becomes
    /// dirty; no kernel I/O.
    pub fn set(&mut self, services: &Services, slices: &Slices) {
        let Desired {
            frontends,
            slots,
            backends,
            revnat,
        } = desired::compute(services, slices, &mut self.ids, &self.node);
        self.frontends.replace_all(contents(frontends));
        self.slots.replace_all(contents(slots));
        self.backends.replace_all(contents(backends));
        self.revnat.replace_all(contents(revnat));
    }

    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.frontends.is_dirty()
            || self.slots.is_dirty()
            || self.backends.is_dirty()
            || self.revnat.is_dirty()
    }

    /// Reconciles the four maps. `open`: the policy the backends' traffic is judged by is in
    /// place (else every write is held and only deletes go). Frontends are written once the
    /// backends, reverse NAT and slots they point at are.
    pub fn apply_due(&mut self, now: Instant, open: bool) -> Vec<Pending> {
        let mut left = vec![
            self.backends.apply_due(now, &|_, _| open),
            self.revnat.apply_due(now, &|_, _| open),
            self.slots.apply_due(now, &|_, _| open),
        ];
        let below_written = open && left.iter().all(Pending::is_clean);
        left.push(self.frontends.apply_due(now, &|_, _| below_written));
        left
    }

    /// Writes and deletes so far.
    pub fn writes(&self) -> u64 {
        self.stats().iter().map(|(_, s)| s.writes + s.deletes).sum()
    }

    /// Counters by map name.
    pub fn stats(&self) -> Vec<(String, DriverStats)> {
        vec![
            (self.frontends.name().to_owned(), self.frontends.stats()),
            (self.slots.name().to_owned(), self.slots.stats()),
            (self.backends.name().to_owned(), self.backends.stats()),
            (self.revnat.name().to_owned(), self.revnat.stats()),
        ]
    }

    /// Every desired frontend with its backends in slot order (`weir service list`).
    pub fn frontends(&self) -> Vec<FrontendEntry> {
        let mut out: Vec<_> = self
            .frontends
            .entries()
            .map(|(k, v)| {
                let backends = (0..v.backend_count)
                    .filter_map(|slot| {
                        let key = SlotKey {
                            service_id: v.service_id,
                            slot,
                            pad: 0,
                        };
                        let id = self.slots.desired(&key)?.backend_id;
                        Some((id, *self.backends.desired(&id)?))
                    })
                    .collect();
                (*k, *v, backends)
            })
            .collect();
        out.sort_by_key(|(k, _, _)| *k);
        out
    }
}

/// The four maps in the fake kernel (clones share them: a restarted agent's drivers see what the
/// previous one wrote).
#[cfg(any(test, feature = "testing"))]
#[derive(Clone)]
pub(crate) struct FakeServiceMaps {
    pub(crate) frontends: super::fake::FakeMap<Svc4Key, Svc4Value>,
    pub(crate) slots: super::fake::FakeMap<SlotKey, SlotValue>,
    pub(crate) backends: super::fake::FakeMap<u32, Backend4>,
    pub(crate) revnat: super::fake::FakeMap<u32, RevNat4>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeServiceMaps {
    pub(crate) fn new(kernel: &super::fake::FakeKernel) -> Self {
        Self {
            frontends: kernel.map(SVC4),
            slots: kernel.map(SVC_SLOTS),
            backends: kernel.map(SVC_BACKENDS4),
            revnat: kernel.map(SVC_REVNAT4),
        }
    }

    /// Fresh drivers over these maps (what a new agent process has).
    pub(crate) fn drivers(&self) -> ServiceMaps {
        ServiceMaps::new(
            Box::new(self.frontends.clone()),
            Box::new(self.slots.clone()),
            Box::new(self.backends.clone()),
            Box::new(self.revnat.clone()),
        )
    }

    /// Writes and deletes of the four maps so far.
    #[cfg(test)]
    pub(crate) fn mutations(&self) -> u64 {
        self.frontends.mutations()
            + self.slots.mutations()
            + self.backends.mutations()
            + self.revnat.mutations()
    }
}
