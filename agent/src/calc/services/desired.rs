//! The service maps' desired contents (IPv4), computed from the model with no kernel I/O: every
//! frontend (cluster IP, port, protocol; a NodePort as `NODEPORT_ANY`, its port, protocol, with
//! only this node's backends under `externalTrafficPolicy: Local`) of every Service, its ready
//! backends in slot order (sorted by address and port, so the order does not depend on the
//! slices' order; this node's flagged local), its terminating backends that still serve (in
//! `svc_backend4` flagged terminating, in no slot: they keep their flows), and reverse NAT. Ids are stable: a frontend or backend keeps its id for as long as it exists, so one
//! Service changing changes only its own keys; freed ids are reused lowest first.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use maps_schema::service::{
    BACKEND_FLAG_LOCAL, BACKEND_FLAG_TERMINATING, Backend4, MAX_SLOTS, NODEPORT_ANY, RevNat4,
    SCOPE_ALL, SCOPE_PODS, SVC_FLAG_AFFINITY, SVC_FLAG_EXTERNAL_LOCAL, SVC_FLAG_INTERNAL_LOCAL,
    SlotKey, SlotValue, Svc4Key, Svc4Value,
};

use super::model::{EndpointSlice, Service, ServicePort, SessionAffinity, TargetPort};

/// Services by (namespace, name).
pub type Services = BTreeMap<(String, String), Service>;
/// EndpointSlices by (namespace, name).
pub type Slices = BTreeMap<(String, String), EndpointSlice>;

/// What the four service maps should hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// `svc4`.
    pub frontends: BTreeMap<Svc4Key, Svc4Value>,
    /// `svc_slots`.
    pub slots: BTreeMap<SlotKey, SlotValue>,
    /// `svc_backends4`.
    pub backends: BTreeMap<u32, Backend4>,
    /// `svc_revnat4`.
    pub revnat: BTreeMap<u32, RevNat4>,
}

/// Stable id allocation across computations.
#[derive(Clone, Debug, Default)]
pub struct Ids {
    services: BTreeMap<Svc4Key, u32>,
    backends: BTreeMap<Backend4, u32>,
}

fn keep_or_allocate<K: Ord + Copy>(ids: &mut BTreeMap<K, u32>, wanted: &BTreeSet<K>) {
    ids.retain(|k, _| wanted.contains(k));
    let mut used: BTreeSet<u32> = ids.values().copied().collect();
    let mut next = 1u32;
    for k in wanted {
        if ids.contains_key(k) {
            continue;
        }
        while used.contains(&next) {
            next += 1;
        }
        ids.insert(*k, next);
        used.insert(next);
    }
}

/// The backends' port for one Service port on one slice: the slice's port of the Service port's
/// name and protocol; a slice listing no port at all falls back to a numbered `targetPort`.
pub(crate) fn backend_port(port: &ServicePort, slice: &EndpointSlice) -> Option<u16> {
    if let Some(p) = slice
        .ports
        .iter()
        .find(|p| p.name == port.name && p.protocol == port.protocol)
    {
        return Some(p.port);
    }
    match (&port.target, slice.ports.is_empty()) {
        (TargetPort::Number(n), true) => Some(*n),
        _ => None,
    }
}

/// The IPv4 backends of one Service port on `slices` (the Service's own): the ready ones (new
/// flows), and the terminating ones that still serve (`serving` but not `ready`: they keep their
/// flows), each sorted, at most [`MAX_SLOTS`]; those whose `nodeName` is `node` are flagged local;
/// `local_only` keeps only those. An address both ready and draining (two slices disagreeing) is
/// ready.
fn backends_of<'a>(
    port: &ServicePort,
    slices: impl Iterator<Item = &'a EndpointSlice>,
    node: &str,
    local_only: bool,
) -> (Vec<Backend4>, Vec<Backend4>) {
    let (mut ready, mut draining) = (BTreeSet::new(), BTreeSet::new());
    for slice in slices {
        let Some(target) = backend_port(port, slice) else {
            continue;
        };
        for e in &slice.endpoints {
            let set = if e.serves_new_flows() {
                &mut ready
            } else if e.keeps_flows() {
                &mut draining
            } else {
                continue;
            };
            let local = !node.is_empty() && e.node.as_deref() == Some(node);
            if local_only && !local {
                continue;
            }
            for addr in &e.addresses {
                if let IpAddr::V4(v4) = addr {
                    set.insert(Backend4 {
                        addr: v4.octets(),
                        port: target,
                        protocol: port.protocol,
                        flags: if local { BACKEND_FLAG_LOCAL } else { 0 },
                    });
                }
            }
        }
    }
    let draining = draining.difference(&ready).copied();
    (
        ready.iter().copied().take(MAX_SLOTS as usize).collect(),
        draining.take(MAX_SLOTS as usize).collect(),
    )
}

/// A backend as `svc_backend4` holds it: `draining` (no frontend gives it a slot) adds
/// [`BACKEND_FLAG_TERMINATING`] to its identity.
#[must_use]
pub fn backend_value(backend: Backend4, draining: bool) -> Backend4 {
    let mut value = backend;
    if draining {
        value.flags |= BACKEND_FLAG_TERMINATING;
    }
    value
}

/// A backend's identity (what its id is kept for) from the value `svc_backend4` holds.
#[must_use]
pub fn backend_identity(value: Backend4) -> Backend4 {
    Backend4 {
        flags: value.flags & !BACKEND_FLAG_TERMINATING,
        ..value
    }
}

/// One frontend a Service declares: its reverse NAT, its value's flags and affinity timeout (the
/// id and count are the maps' business), and its ready backends in slot order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendSpec {
    /// `svc_revnat4`'s value.
    pub revnat: RevNat4,
    /// `Svc4Value::flags`.
    pub flags: u16,
    /// `Svc4Value::affinity_timeout_secs`.
    pub affinity_timeout_secs: u32,
    /// The ready backends, in slot order.
    pub backends: Vec<Backend4>,
    /// The terminating backends that still serve: in `svc_backend4` (flagged terminating unless
    /// another frontend gives them a slot), in no slot.
    pub draining: Vec<Backend4>,
}

/// Every IPv4 frontend `service` declares (cluster IPs × ports, then its NodePorts), in order,
/// with its backends on `slices` (the Service's own EndpointSlices) for node `node`.
pub fn frontends_of<'a>(
    service: &Service,
    slices: impl Iterator<Item = &'a EndpointSlice> + Clone,
    node: &str,
) -> Vec<(Svc4Key, FrontendSpec)> {
    let (affinity_flags, affinity_timeout_secs) = match service.affinity {
        SessionAffinity::None => (0, 0),
        SessionAffinity::ClientIp { timeout_seconds } => (SVC_FLAG_AFFINITY, timeout_seconds),
    };
    let mut out = Vec::new();
    for port in &service.ports {
        // (address, port, whether `externalTrafficPolicy` applies): cluster IPs, external
        // addresses, the NodePort.
        let v4 = |ips: &[IpAddr], external: bool| {
            ips.iter()
                .filter_map(move |ip| match ip {
                    IpAddr::V4(v4) => Some((v4.octets(), port.port, external)),
                    IpAddr::V6(_) => None,
                })
                .collect::<Vec<_>>()
        };
        let node_port = port.node_port.map(|n| (NODEPORT_ANY, n, true));
        let all = v4(&service.cluster_ips, false)
            .into_iter()
            .chain(v4(&service.external_ips, true))
            .chain(node_port);
        for (addr, frontend_port, external) in all {
            let key = Svc4Key {
                addr,
                port: frontend_port,
                protocol: port.protocol,
                scope: SCOPE_ALL,
            };
            let revnat = RevNat4 {
                addr,
                port: frontend_port,
                pad: 0,
            };
            let local_only = if external {
                service.external_local
            } else {
                service.internal_local
            };
            let (backends, draining) = backends_of(port, slices.clone(), node, local_only);
            let mut flags = affinity_flags;
            if local_only {
                flags |= if external {
                    SVC_FLAG_EXTERNAL_LOCAL
                } else {
                    SVC_FLAG_INTERNAL_LOCAL
                };
            }
            out.push((
                key,
                FrontendSpec {
                    revnat,
                    flags,
                    affinity_timeout_secs,
                    backends,
                    draining,
                },
            ));
            // `Local` external: this node's pods get every backend (its own entry, which
            // `from_endpoint` looks up after finding the `Local` flag), as kube-proxy gives them.
            if external && local_only {
                let (backends, draining) = backends_of(port, slices.clone(), node, false);
                out.push((
                    Svc4Key {
                        scope: SCOPE_PODS,
                        ..key
                    },
                    FrontendSpec {
                        revnat,
                        flags: affinity_flags,
                        affinity_timeout_secs,
                        backends,
                        draining,
                    },
                ));
            }
        }
    }
    out
}

/// The EndpointSlices of each Service, by the Service's (namespace, name).
#[must_use]
pub fn slices_by_service(slices: &Slices) -> BTreeMap<(String, String), Vec<&EndpointSlice>> {
    let mut out: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices.values() {
        out.entry((slice.namespace.clone(), slice.service.clone()))
            .or_default()
            .push(slice);
    }
    out
}

/// Computes the desired maps for node `node` (whose endpoints are local; empty: none is),
/// keeping ids stable through `ids`. A frontend two Services claim (the same cluster IP or
/// NodePort, port and protocol) goes to the first by namespace and name.
#[must_use]
pub fn compute(services: &Services, slices: &Slices, ids: &mut Ids, node: &str) -> Desired {
    let by_service = slices_by_service(slices);
    let none = Vec::new();
    let mut frontends: Vec<(Svc4Key, FrontendSpec)> = Vec::new();
    let mut claimed = BTreeSet::new();
    for (key, service) in services {
        let own = by_service.get(key).unwrap_or(&none);
        for (frontend, spec) in frontends_of(service, own.iter().copied(), node) {
            if claimed.insert(frontend) {
                frontends.push((frontend, spec));
            }
        }
    }
    let wanted_services: BTreeSet<Svc4Key> = frontends.iter().map(|f| f.0).collect();
    let wanted_backends: BTreeSet<Backend4> = frontends
        .iter()
        .flat_map(|f| f.1.backends.iter().chain(&f.1.draining).copied())
        .collect();
    keep_or_allocate(&mut ids.services, &wanted_services);
    keep_or_allocate(&mut ids.backends, &wanted_backends);
    let mut desired = Desired::default();
    let mut draining = Vec::new();
    for (key, spec) in frontends {
        let Some(&service_id) = ids.services.get(&key) else {
            continue;
        };
        let mut count: u16 = 0;
        for backend in &spec.backends {
            let Some(&backend_id) = ids.backends.get(backend) else {
                continue;
            };
            desired.slots.insert(
                SlotKey {
                    service_id,
                    slot: count,
                    pad: 0,
                },
                SlotValue { backend_id },
            );
            desired.backends.insert(backend_id, *backend);
            count += 1;
        }
        desired.frontends.insert(
            key,
            Svc4Value {
                service_id,
                backend_count: count,
                flags: spec.flags,
                affinity_timeout_secs: spec.affinity_timeout_secs,
                pad: 0,
            },
        );
        desired.revnat.insert(service_id, spec.revnat);
        draining.extend(spec.draining);
    }
    // Draining backends no frontend gives a slot: in the map, flagged.
    for backend in draining {
        if let Some(&backend_id) = ids.backends.get(&backend) {
            desired
                .backends
                .entry(backend_id)
                .or_insert_with(|| backend_value(backend, true));
        }
    }
    desired
}
