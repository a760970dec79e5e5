//! The service maps' desired contents kept one Service at a time: a Service or EndpointSlice
//! change recomputes only the Services it touches (and those whose claim on a shared frontend it
//! moves), and answers the map entries to set and delete — no pass over every Service, so one
//! change costs the same at 10 or 10,000 Services. The contents always equal what
//! [`super::desired::compute`] gives for the same model (ids aside: each kept as long as its key
//! exists, freed ones reused lowest first, and those the kernel already holds kept, so a restarted
//! agent writes nothing). No kernel I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use maps_schema::service::{Backend4, RevNat4, SlotKey, SlotValue, Svc4Key, Svc4Value};

use super::{
    desired::{FrontendSpec, Services, backend_identity, backend_value, frontends_of},
    model::EndpointSlice,
};

/// A Service's or EndpointSlice's (namespace, name).
pub type ObjectKey = (String, String);

/// Map entries to write (`Some`) or delete (`None`), in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ops {
    /// `svc4`.
    pub frontends: Vec<(Svc4Key, Option<Svc4Value>)>,
    /// `svc_slots`.
    pub slots: Vec<(SlotKey, Option<SlotValue>)>,
    /// `svc_backends4`.
    pub backends: Vec<(u32, Option<Backend4>)>,
    /// `svc_revnat4`.
    pub revnat: Vec<(u32, Option<RevNat4>)>,
}

/// Ids allocated lowest free first; an id a key held in the kernel before this process started
/// is kept for that key (until [`IdPool::forget_seeds`]).
#[derive(Debug)]
struct IdPool<K: Ord> {
    held: BTreeMap<K, u32>,
    used: BTreeSet<u32>,
    /// Ids given back below `next`.
    free: BTreeSet<u32>,
    /// The lowest id never handed out.
    next: u32,
    /// What the kernel held when the agent started, and those ids while their keys have not
    /// taken them.
    seeded: BTreeMap<K, u32>,
    reserved: BTreeSet<u32>,
}

impl<K: Ord> Default for IdPool<K> {
    fn default() -> Self {
        Self {
            held: BTreeMap::new(),
            used: BTreeSet::new(),
            free: BTreeSet::new(),
            next: 1,
            seeded: BTreeMap::new(),
            reserved: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Clone> IdPool<K> {
    fn seed(&mut self, seeded: BTreeMap<K, u32>) {
        self.reserved = seeded.values().copied().collect();
        self.seeded = seeded;
    }

    /// Seeded ids no key took back are free for any key now.
    fn forget_seeds(&mut self) {
        self.seeded.clear();
        self.reserved.clear();
    }

    fn get(&self, key: &K) -> Option<u32> {
        self.held.get(key).copied()
    }

    fn take(&mut self, key: &K) -> u32 {
        if let Some(id) = self.held.get(key) {
            return *id;
        }
        let id = match self.seeded.get(key) {
            Some(id) if !self.used.contains(id) => {
                self.reserved.remove(id);
                self.free.remove(id);
                *id
            }
            _ => self.fresh(),
        };
        self.held.insert(key.clone(), id);
        self.used.insert(id);
        id
    }

    fn fresh(&mut self) -> u32 {
        if let Some(id) = self
            .free
            .iter()
            .copied()
            .find(|id| !self.reserved.contains(id))
        {
            self.free.remove(&id);
            return id;
        }
        loop {
            let id = self.next;
            self.next = self.next.saturating_add(1);
            if !self.used.contains(&id) && !self.reserved.contains(&id) {
                return id;
            }
        }
    }

    fn give_back(&mut self, key: &K) {
        if let Some(id) = self.held.remove(key) {
            self.used.remove(&id);
            if id < self.next {
                self.free.insert(id);
            }
        }
    }
}

/// A frontend as written: its id and spec, and its backends' ids in slot order.
#[derive(Clone, Debug)]
struct Placed {
    service_id: u32,
    spec: FrontendSpec,
}

/// The maps' contents, kept by Service.
#[derive(Debug, Default)]
pub struct Tracker {
    node: String,
    /// The frontends each Service owns, as written.
    owned: HashMap<ObjectKey, BTreeMap<Svc4Key, Placed>>,
    /// The Services declaring each frontend; the first by (namespace, name) owns it.
    claims: HashMap<Svc4Key, BTreeSet<ObjectKey>>,
    /// Each Service's declared frontends, as last computed.
    declared: HashMap<ObjectKey, Vec<(Svc4Key, FrontendSpec)>>,
    service_ids: IdPool<Svc4Key>,
    backend_ids: IdPool<Backend4>,
    /// How many frontends hold each backend (by identity), in a slot or draining.
    backend_refs: HashMap<Backend4, Refs>,
    /// The backend ids an update touched, with the backend (identity) that held each: their
    /// `svc_backend4` entries are written once, from the final counts.
    touched: BTreeMap<u32, Backend4>,
}

/// How many frontends hold a backend.
#[derive(Clone, Copy, Debug, Default)]
struct Refs {
    /// In a slot (it takes new flows).
    slots: u32,
    /// Draining (terminating but serving: it keeps its flows).
    draining: u32,
}

impl Tracker {
    /// Nothing yet, for node `node` (its endpoints are local backends).
    #[must_use]
    pub fn new(node: &str) -> Self {
        Self {
            node: node.to_owned(),
            ..Self::default()
        }
    }

    /// The node whose endpoints are local backends.
    pub fn set_node(&mut self, node: &str) {
        node.clone_into(&mut self.node);
    }

    /// The ids the kernel's maps hold (read once at start): a key still wanted keeps its id.
    pub fn seed(
        &mut self,
        frontends: impl IntoIterator<Item = (Svc4Key, u32)>,
        backends: impl IntoIterator<Item = (u32, Backend4)>,
    ) {
        self.service_ids.seed(frontends.into_iter().collect());
        self.backend_ids.seed(
            backends
                .into_iter()
                .map(|(id, b)| (backend_identity(b), id))
                .collect(),
        );
    }

    /// After the first whole set: the kernel's ids no Service took back are free for any.
    pub fn forget_seeds(&mut self) {
        self.service_ids.forget_seeds();
        self.backend_ids.forget_seeds();
    }

    /// Recomputes `changed` Services (present in `services`, or gone) with their slices
    /// (`slices_of`), and every other Service whose ownership of a shared frontend that moves.
    /// Every frontend a Service gives up is deleted before any is written (a frontend can pass
    /// from one Service to another in one update).
    pub fn update<'a>(
        &mut self,
        services: &Services,
        slices_of: &dyn Fn(&ObjectKey) -> Vec<&'a EndpointSlice>,
        changed: impl IntoIterator<Item = ObjectKey>,
    ) -> Ops {
        let mut affected: BTreeSet<ObjectKey> = BTreeSet::new();
        for key in changed {
            let declared = services.get(&key).map_or_else(Vec::new, |s| {
                frontends_of(s, slices_of(&key).into_iter(), &self.node)
            });
            // Claims move first: a frontend another Service now owns (or no longer does) makes
            // that Service's frontends change too.
            let old: BTreeSet<Svc4Key> = self
                .declared
                .get(&key)
                .map(|d| d.iter().map(|(k, _)| *k).collect())
                .unwrap_or_default();
            let new: BTreeSet<Svc4Key> = declared.iter().map(|(k, _)| *k).collect();
            for frontend in old.symmetric_difference(&new) {
                let owner_before = self.owner(frontend);
                let claimants = self.claims.entry(*frontend).or_default();
                if new.contains(frontend) {
                    claimants.insert(key.clone());
                } else {
                    claimants.remove(&key);
                }
                if claimants.is_empty() {
                    self.claims.remove(frontend);
                }
                affected.extend(owner_before);
                affected.extend(self.owner(frontend));
            }
            if declared.is_empty() {
                self.declared.remove(&key);
            } else {
                self.declared.insert(key.clone(), declared);
            }
            affected.insert(key);
        }
        let mut ops = Ops::default();
        for key in &affected {
            self.release(key, &mut ops);
        }
        for key in &affected {
            self.acquire(key, &mut ops);
        }
        self.write_backends(&mut ops);
        ops
    }

    /// The `svc_backend4` entries of the backends this update touched, from the final counts:
    /// a backend some frontend gives a slot as is, one only draining flagged terminating, one
    /// no frontend holds (its id not taken again) deleted.
    fn write_backends(&mut self, ops: &mut Ops) {
        for (id, backend) in std::mem::take(&mut self.touched) {
            let held = self.backend_ids.get(&backend) == Some(id);
            match self.backend_refs.get(&backend) {
                Some(refs) if held => {
                    ops.backends
                        .push((id, Some(backend_value(backend, refs.slots == 0))));
                }
                // Given back, and not taken again in this update (a backend taking it would
                // have replaced this one in `touched`).
                _ => ops.backends.push((id, None)),
            }
        }
    }

    fn owner(&self, frontend: &Svc4Key) -> Option<ObjectKey> {
        self.claims.get(frontend)?.first().cloned()
    }

    /// The frontends `key` declares and owns, with their specs.
    fn wanted(&self, key: &ObjectKey) -> Vec<(Svc4Key, FrontendSpec)> {
        self.declared
            .get(key)
            .map(|d| {
                d.iter()
                    .filter(|(k, _)| self.owner(k).as_ref() == Some(key))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Deletes the frontends `key` owned and no longer does, with their slots, reverse NAT and
    /// ids.
    fn release(&mut self, key: &ObjectKey, ops: &mut Ops) {
        let wanted: BTreeSet<Svc4Key> = self.wanted(key).into_iter().map(|(k, _)| k).collect();
        let Some(owned) = self.owned.get_mut(key) else {
            return;
        };
        let gone: Vec<(Svc4Key, Placed)> = owned
            .iter()
            .filter(|(k, _)| !wanted.contains(k))
            .map(|(k, p)| (*k, p.clone()))
            .collect();
        for (frontend, _) in &gone {
            owned.remove(frontend);
        }
        if owned.is_empty() {
            self.owned.remove(key);
        }
        for (frontend, old) in gone {
            ops.frontends.push((frontend, None));
            for slot in 0..old.spec.backends.len() {
                let slot = u16::try_from(slot).unwrap_or(u16::MAX);
                ops.slots.push((
                    SlotKey {
                        service_id: old.service_id,
                        slot,
                        pad: 0,
                    },
                    None,
                ));
            }
            ops.revnat.push((old.service_id, None));
            self.service_ids.give_back(&frontend);
            self.unref(&old.spec);
        }
    }

    /// Writes the frontends `key` owns as declared: ops for what changed.
    fn acquire(&mut self, key: &ObjectKey, ops: &mut Ops) {
        for (frontend, spec) in self.wanted(key) {
            let service_id = self.service_ids.take(&frontend);
            let old = self.owned.get(key).and_then(|o| o.get(&frontend)).cloned();
            if old
                .as_ref()
                .is_some_and(|o| o.service_id == service_id && o.spec == spec)
            {
                continue;
            }
            // New references first, so a backend kept across the change keeps its id.
            let mut count: u16 = 0;
            for backend in &spec.draining {
                self.backend_refs.entry(*backend).or_default().draining += 1;
                let backend_id = self.backend_ids.take(backend);
                self.touched.insert(backend_id, *backend);
            }
            for backend in &spec.backends {
                self.backend_refs.entry(*backend).or_default().slots += 1;
                let backend_id = self.backend_ids.take(backend);
                self.touched.insert(backend_id, *backend);
                ops.slots.push((
                    SlotKey {
                        service_id,
                        slot: count,
                        pad: 0,
                    },
                    Some(SlotValue { backend_id }),
                ));
                count += 1;
            }
            let old_count = old.as_ref().map_or(0, |o| o.spec.backends.len());
            for slot in usize::from(count)..old_count {
                let slot = u16::try_from(slot).unwrap_or(u16::MAX);
                ops.slots.push((
                    SlotKey {
                        service_id,
                        slot,
                        pad: 0,
                    },
                    None,
                ));
            }
            ops.revnat.push((service_id, Some(spec.revnat)));
            ops.frontends.push((
                frontend,
                Some(Svc4Value {
                    service_id,
                    backend_count: count,
                    flags: spec.flags,
                    affinity_timeout_secs: spec.affinity_timeout_secs,
                    pad: 0,
                }),
            ));
            if let Some(old) = &old {
                self.unref(&old.spec);
            }
            self.owned
                .entry(key.clone())
                .or_default()
                .insert(frontend, Placed { service_id, spec });
        }
    }

    /// Drops a frontend's references to its backends; an id no frontend holds any more is given
    /// back (its entry is deleted by [`Self::write_backends`]).
    fn unref(&mut self, spec: &FrontendSpec) {
        let slotted = spec.backends.iter().map(|b| (b, true));
        for (backend, slot) in slotted.chain(spec.draining.iter().map(|b| (b, false))) {
            let Some(refs) = self.backend_refs.get_mut(backend) else {
                continue;
            };
            let count = if slot {
                &mut refs.slots
            } else {
                &mut refs.draining
            };
            *count = count.saturating_sub(1);
            if let Some(id) = self.backend_ids.get(backend) {
                self.touched.insert(id, *backend);
            }
            if refs.slots == 0 && refs.draining == 0 {
                self.backend_refs.remove(backend);
                self.backend_ids.give_back(backend);
            }
        }
    }
}
