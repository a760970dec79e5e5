//! The service maps' driver family: `svc4_v1` (frontends), `svc_slots_v1`, `svc_members_v1`,
//! `svc_backend4_v1` and `svc_revnat4_v1`, desired one Service at a time by
//! `services::incremental` (no kernel I/O when the sources change; a change costs what it
//! touches, whatever the number of Services), each reconciled by its own [`MapDriver`] (read back,
//! write the diff, sweep orphans). `svc_members_v1` is the inverse of the slots (each backend's
//! slot in each service), derived here from the slots' changes. The ids
//! the maps held when the agent started are kept for their keys, so a restart over unchanged
//! state writes nothing.
//!
//! Security order (`plane`): nothing is written before identities, ipcache and policy are (a
//! packet to a frontend is judged by its backend's identity, so a backend must not be reachable
//! through a frontend before the policy that guards it is in place); within the family, backends,
//! reverse NAT, slots and members go before the frontends that point at them. Deletes always go (they only
//! close). Established translated flows do not depend on these maps (`svc_ct4_v1` holds their
//! backend), so a backend leaving a service ends no flow.

use std::{
    collections::{BTreeSet, HashMap},
    time::Instant,
};

use maps_schema::service::{
    Backend4, MemberKey, MemberValue, RevNat4, SVC_BACKENDS4, SVC_MEMBERS, SVC_REVNAT4, SVC_SLOTS,
    SVC4, SlotKey, SlotValue, Svc4Key, Svc4Value,
};

use super::map_driver::{DriverStats, MapDriver, Pending};
use crate::kernel::{KernelError, MapIo, PinnedHash};
use crate::{
    calc::services::{
        desired::{Services, Slices},
        incremental::{ObjectKey, Ops, Tracker},
        model::{EndpointSlice, Service},
    },
    paths::Paths,
};

/// The slices of `service` in `index` (Service → slice keys) and `all`.
fn slices_in<'a>(
    index: &HashMap<ObjectKey, BTreeSet<ObjectKey>>,
    all: &'a HashMap<ObjectKey, EndpointSlice>,
    service: &ObjectKey,
) -> Vec<&'a EndpointSlice> {
    index
        .get(service)
        .map(|keys| keys.iter().filter_map(|k| all.get(k)).collect())
        .unwrap_or_default()
}

/// Hands a map's share of the incremental ops to its driver (`None`: delete), in order.
fn write<K, V>(driver: &mut MapDriver<K, V>, ops: Vec<(K, Option<V>)>)
where
    K: Clone + Eq + std::hash::Hash + Send + std::fmt::Debug,
    V: Clone + PartialEq + Send,
{
    for (k, v) in ops {
        match v {
            Some(v) => driver.set(k, v),
            None => driver.remove(&k),
        }
    }
}

/// A desired frontend, its value, and its backends (id, backend) in slot order.
pub type FrontendEntry = (Svc4Key, Svc4Value, Vec<(u32, Backend4)>);

/// The five service map drivers and the ids that keep their keys stable.
pub struct ServiceMaps {
    /// `svc4_v1`.
    pub frontends: MapDriver<Svc4Key, Svc4Value>,
    /// `svc_slots_v1`.
    pub slots: MapDriver<SlotKey, SlotValue>,
    /// `svc_members_v1` (the slots' inverse).
    pub members: MapDriver<MemberKey, MemberValue>,
    /// `svc_backend4_v1`.
    pub backends: MapDriver<u32, Backend4>,
    /// `svc_revnat4_v1`.
    pub revnat: MapDriver<u32, RevNat4>,
    tracker: Tracker,
    /// The Services and slices as last set, and each Service's slices.
    services: HashMap<ObjectKey, Service>,
    slices: HashMap<ObjectKey, EndpointSlice>,
    slices_of: HashMap<ObjectKey, BTreeSet<ObjectKey>>,
    /// The first whole set is in (the kernel's ids no Service took back are free now).
    settled: bool,
}

impl ServiceMaps {
    /// Drivers over these maps; the first apply is a full resync. The ids the frontends and
    /// backends maps hold now are kept for their keys.
    pub fn new(
        frontends: Box<dyn MapIo<Svc4Key, Svc4Value>>,
        slots: Box<dyn MapIo<SlotKey, SlotValue>>,
        members: Box<dyn MapIo<MemberKey, MemberValue>>,
        backends: Box<dyn MapIo<u32, Backend4>>,
        revnat: Box<dyn MapIo<u32, RevNat4>>,
    ) -> Self {
        let mut tracker = Tracker::new("");
        match (frontends.read_all(), backends.read_all()) {
            (Ok(f), Ok(b)) => tracker.seed(f.into_iter().map(|(k, v)| (k, v.service_id)), b),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "cannot read the service maps' ids: they are allocated afresh (the first apply rewrites what moved)");
            }
        }
        Self {
            frontends: MapDriver::new(frontends),
            slots: MapDriver::new(slots),
            members: MapDriver::new(members),
            backends: MapDriver::new(backends),
            revnat: MapDriver::new(revnat),
            tracker,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_of: HashMap::new(),
            settled: false,
        }
    }

    /// The node whose endpoints are local (NodePorts translate to them without a source change,
    /// and `externalTrafficPolicy: Local` serves only them). Call before the first [`Self::set`].
    #[must_use]
    pub fn for_node(mut self, node: &str) -> Self {
        self.tracker.set_node(node);
        self
    }

    /// Drivers over the pinned maps under `paths`.
    pub fn open(paths: &Paths) -> Result<Self, KernelError> {
        let pin = |name: &str| paths.map_pin(name);
        Ok(Self::new(
            Box::new(PinnedHash::open(SVC4, &pin(SVC4))?),
            Box::new(PinnedHash::open(SVC_SLOTS, &pin(SVC_SLOTS))?),
            Box::new(PinnedHash::open(SVC_MEMBERS, &pin(SVC_MEMBERS))?),
            Box::new(PinnedHash::open(SVC_BACKENDS4, &pin(SVC_BACKENDS4))?),
            Box::new(PinnedHash::open(SVC_REVNAT4, &pin(SVC_REVNAT4))?),
        ))
    }

    /// Drivers over new maps of the fake kernel (`testing`'s in-process agent).
    #[cfg(feature = "testing")]
    pub(crate) fn fake(kernel: &crate::kernel::fake::FakeKernel) -> Self {
        FakeServiceMaps::new(kernel).drivers()
    }

    /// Manager side: the sources' Services and EndpointSlices now (a whole set). Only the
    /// Services whose object or slices changed are recomputed; only what changed becomes dirty;
    /// no kernel I/O. Returns the Services whose object or slices changed.
    pub fn set(&mut self, services: &Services, slices: &Slices) -> BTreeSet<ObjectKey> {
        let service_keys: BTreeSet<ObjectKey> = services
            .keys()
            .chain(self.services.keys())
            .cloned()
            .collect();
        let slice_keys: BTreeSet<ObjectKey> =
            slices.keys().chain(self.slices.keys()).cloned().collect();
        let changed = self.update(services, slices, service_keys, slice_keys);
        if !self.settled {
            self.settled = true;
            self.tracker.forget_seeds();
        }
        changed
    }

    /// Manager side: the Services `service_keys` and EndpointSlices `slice_keys` changed (each
    /// present in `services`/`slices`, or gone); the rest is as last set. No kernel I/O. Returns
    /// the Services whose object or slices changed.
    pub fn update(
        &mut self,
        services: &Services,
        slices: &Slices,
        service_keys: impl IntoIterator<Item = ObjectKey>,
        slice_keys: impl IntoIterator<Item = ObjectKey>,
    ) -> BTreeSet<ObjectKey> {
        let mut changed: BTreeSet<ObjectKey> = BTreeSet::new();
        for key in service_keys {
            let now = services.get(&key);
            if now == self.services.get(&key) {
                continue;
            }
            match now {
                Some(s) => self.services.insert(key.clone(), s.clone()),
                None => self.services.remove(&key),
            };
            changed.insert(key);
        }
        for key in slice_keys {
            let now = slices.get(&key);
            let before = self.slices.get(&key);
            if now == before {
                continue;
            }
            let owner = |s: &EndpointSlice| (s.namespace.clone(), s.service.clone());
            if let Some(old) = before.map(owner) {
                if let Some(set) = self.slices_of.get_mut(&old) {
                    set.remove(&key);
                    if set.is_empty() {
                        self.slices_of.remove(&old);
                    }
                }
                changed.insert(old);
            }
            match now {
                Some(slice) => {
                    let new = owner(slice);
                    self.slices_of
                        .entry(new.clone())
                        .or_default()
                        .insert(key.clone());
                    self.slices.insert(key, slice.clone());
                    changed.insert(new);
                }
                None => {
                    self.slices.remove(&key);
                }
            }
        }
        if changed.is_empty() {
            return changed;
        }
        let (index, all) = (&self.slices_of, &self.slices);
        let slices_of = |service: &ObjectKey| slices_in(index, all, service);
        let ops = self
            .tracker
            .update(services, &slices_of, changed.iter().cloned());
        self.write(ops);
        changed
    }

    /// The EndpointSlices of Service `key`, as last set.
    pub fn slices_of(&self, key: &ObjectKey) -> Vec<&EndpointSlice> {
        slices_in(&self.slices_of, &self.slices, key)
    }

    fn write(&mut self, ops: Ops) {
        write(&mut self.backends, ops.backends);
        write(&mut self.revnat, ops.revnat);
        for (key, value) in ops.slots {
            self.member_follows(key, value);
            match value {
                Some(v) => self.slots.set(key, v),
                None => self.slots.remove(&key),
            }
        }
        write(&mut self.frontends, ops.frontends);
    }

    /// Keeps `svc_members_v1` the inverse of the slots as slot `key` becomes `value`: the backend
    /// it held leaves the members unless it has taken another slot since, the new one is there.
    fn member_follows(&mut self, key: SlotKey, value: Option<SlotValue>) {
        let before = self.slots.desired(&key).map(|v| v.backend_id);
        let member = |backend_id| MemberKey {
            service_id: key.service_id,
            backend_id,
        };
        let here = MemberValue {
            slot: key.slot,
            pad: 0,
        };
        if let Some(old) = before
            && value.is_none_or(|v| v.backend_id != old)
            && self.members.desired(&member(old)) == Some(&here)
        {
            self.members.remove(&member(old));
        }
        if let Some(v) = value {
            self.members.set(member(v.backend_id), here);
        }
    }

    /// A periodic refresh of the five maps (`MapDriver::refresh`).
    pub fn refresh(&mut self) {
        self.frontends.refresh();
        self.slots.refresh();
        self.members.refresh();
        self.backends.refresh();
        self.revnat.refresh();
    }

    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.frontends.is_dirty()
            || self.slots.is_dirty()
            || self.members.is_dirty()
            || self.backends.is_dirty()
            || self.revnat.is_dirty()
    }

    /// Reconciles the five maps. `open`: the policy the backends' traffic is judged by is in
    /// place (else every write is held and only deletes go). Frontends are written once the
    /// backends, reverse NAT, slots and members they point at are.
    pub fn apply_due(&mut self, now: Instant, open: bool) -> Vec<Pending> {
        let mut left = vec![
            self.backends.apply_due(now, &|_, _| open),
            self.revnat.apply_due(now, &|_, _| open),
            self.slots.apply_due(now, &|_, _| open),
            self.members.apply_due(now, &|_, _| open),
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
            (self.members.name().to_owned(), self.members.stats()),
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

/// The five maps in the fake kernel (clones share them: a restarted agent's drivers see what the
/// previous one wrote).
#[cfg(any(test, feature = "testing"))]
#[derive(Clone)]
pub(crate) struct FakeServiceMaps {
    pub(crate) frontends: crate::kernel::fake::FakeMap<Svc4Key, Svc4Value>,
    pub(crate) slots: crate::kernel::fake::FakeMap<SlotKey, SlotValue>,
    pub(crate) members: crate::kernel::fake::FakeMap<MemberKey, MemberValue>,
    pub(crate) backends: crate::kernel::fake::FakeMap<u32, Backend4>,
    pub(crate) revnat: crate::kernel::fake::FakeMap<u32, RevNat4>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeServiceMaps {
    pub(crate) fn new(kernel: &crate::kernel::fake::FakeKernel) -> Self {
        Self {
            frontends: kernel.map(SVC4),
            slots: kernel.map(SVC_SLOTS),
            members: kernel.map(SVC_MEMBERS),
            backends: kernel.map(SVC_BACKENDS4),
            revnat: kernel.map(SVC_REVNAT4),
        }
    }

    /// Fresh drivers over these maps (what a new agent process has).
    pub(crate) fn drivers(&self) -> ServiceMaps {
        ServiceMaps::new(
            Box::new(self.frontends.clone()),
            Box::new(self.slots.clone()),
            Box::new(self.members.clone()),
            Box::new(self.backends.clone()),
            Box::new(self.revnat.clone()),
        )
    }

    /// Writes and deletes of the five maps so far.
    #[cfg(test)]
    pub(crate) fn mutations(&self) -> u64 {
        self.frontends.mutations()
            + self.slots.mutations()
            + self.members.mutations()
            + self.backends.mutations()
            + self.revnat.mutations()
    }
}
