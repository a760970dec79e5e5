//! The incremental service maps against the full computation: random changes (Services added,
//! edited and deleted, two Services claiming one frontend, slices moving between Services, ready
//! states flipping, endpoints terminating while they serve), and after every step the maps the ops built hold what `desired::compute`
//! gives for the same model — frontends with their flags, reverse NAT and backends in slot order
//! and draining backends flagged terminating — with no orphan slot or reverse NAT entry, and no
//! backend but those in a slot or draining. Ids kept across steps; seeded ids kept.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use maps_schema::service::{
    BACKEND_FLAG_TERMINATING, Backend4, MemberKey, MemberValue, RevNat4, SlotKey, SlotValue,
    Svc4Key, Svc4Value,
};

use super::{
    desired::{Ids, Services, Slices, compute},
    incremental::{ObjectKey, Ops, Tracker},
    model::{
        Endpoint, EndpointPort, EndpointSlice, Service, ServicePort, SessionAffinity, TargetPort,
    },
};

/// The four maps as a driver would hold them.
#[derive(Debug, Default)]
struct Maps {
    frontends: BTreeMap<Svc4Key, Svc4Value>,
    slots: BTreeMap<SlotKey, SlotValue>,
    backends: BTreeMap<u32, Backend4>,
    revnat: BTreeMap<u32, RevNat4>,
}

fn apply<K: Ord, V>(map: &mut BTreeMap<K, V>, ops: Vec<(K, Option<V>)>) {
    for (k, v) in ops {
        match v {
            Some(v) => map.insert(k, v),
            None => map.remove(&k),
        };
    }
}

impl Maps {
    fn apply(&mut self, ops: Ops) {
        apply(&mut self.frontends, ops.frontends);
        apply(&mut self.slots, ops.slots);
        apply(&mut self.backends, ops.backends);
        apply(&mut self.revnat, ops.revnat);
    }
}

/// Frontends with their backends in slot order, and the draining backends (in the map, in no
/// slot).
type Shape = (
    BTreeMap<Svc4Key, (u16, u32, RevNat4, Vec<Backend4>)>,
    BTreeSet<Backend4>,
);

/// Frontends with their backends in slot order, and the draining backends; panics on an orphan
/// slot or reverse NAT entry, a dangling id, a slotted backend flagged terminating or an
/// unslotted one not flagged.
fn shape(
    frontends: &BTreeMap<Svc4Key, Svc4Value>,
    slots: &BTreeMap<SlotKey, SlotValue>,
    backends: &BTreeMap<u32, Backend4>,
    revnat: &BTreeMap<u32, RevNat4>,
) -> Shape {
    let mut out = BTreeMap::new();
    let mut used_backends = BTreeSet::new();
    let mut slot_count = 0;
    for (k, v) in frontends {
        let list: Vec<Backend4> = (0..v.backend_count)
            .map(|slot| {
                let key = SlotKey {
                    service_id: v.service_id,
                    slot,
                    pad: 0,
                };
                let id = slots.get(&key).expect("a slot of a frontend").backend_id;
                used_backends.insert(id);
                *backends.get(&id).expect("a backend of a slot")
            })
            .collect();
        slot_count += usize::from(v.backend_count);
        let rev = *revnat.get(&v.service_id).expect("a reverse NAT entry");
        out.insert(*k, (v.flags, v.affinity_timeout_secs, rev, list));
    }
    assert_eq!(slots.len(), slot_count, "no orphan slot");
    let mut draining = BTreeSet::new();
    for (id, b) in backends {
        let flagged = b.flags & BACKEND_FLAG_TERMINATING != 0;
        assert_eq!(
            flagged,
            !used_backends.contains(id),
            "only a backend in no slot is flagged terminating: {id} {b:?}"
        );
        if flagged {
            draining.insert(*b);
        }
    }
    assert_eq!(revnat.len(), frontends.len(), "no orphan reverse NAT entry");
    (out, draining)
}

/// A tiny deterministic generator (no dependency for tests).
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

fn service(rng: &mut Rng, name: &str) -> Service {
    // Few cluster IPs, so Services often claim the same frontend.
    let ip = IpAddr::V4(Ipv4Addr::new(10, 96, 0, rng.next(6) as u8 + 1));
    let mut ports = vec![ServicePort {
        name: "a".into(),
        protocol: 6,
        port: 80,
        target: TargetPort::Number(8080),
        node_port: (rng.next(3) == 0).then_some(30_000 + rng.next(3) as u16),
    }];
    if rng.next(2) == 0 {
        ports.push(ServicePort {
            name: "b".into(),
            protocol: 17,
            port: 53,
            target: TargetPort::Number(5353),
            node_port: None,
        });
    }
    Service {
        namespace: "ns".into(),
        name: name.into(),
        cluster_ips: vec![ip],
        ports,
        affinity: if rng.next(4) == 0 {
            SessionAffinity::ClientIp {
                timeout_seconds: 300,
            }
        } else {
            SessionAffinity::None
        },
        external_local: rng.next(2) == 0,
        internal_local: rng.next(3) == 0,
        external_ips: if rng.next(3) == 0 {
            vec![IpAddr::V4(Ipv4Addr::new(192, 0, 2, rng.next(4) as u8 + 1))]
        } else {
            Vec::new()
        },
    }
}

fn slice(rng: &mut Rng, name: &str, svc: &str) -> EndpointSlice {
    let endpoints = (0..rng.next(4))
        .map(|_| {
            // Ready, terminating and serving (draining), terminating, not ready.
            let (ready, serving, terminating) = match rng.next(6) {
                0 => (false, true, true),
                1 => (false, false, true),
                2 => (false, false, false),
                _ => (true, true, false),
            };
            Endpoint {
                addresses: vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, rng.next(8) as u8 + 1))],
                ready,
                serving,
                terminating,
                node: Some(if rng.next(2) == 0 { "n1" } else { "n2" }.into()),
            }
        })
        .collect();
    EndpointSlice {
        namespace: "ns".into(),
        name: name.into(),
        service: svc.into(),
        ports: vec![
            EndpointPort {
                name: "a".into(),
                protocol: 6,
                port: 8080 + rng.next(2) as u16,
            },
            EndpointPort {
                name: "b".into(),
                protocol: 17,
                port: 5353,
            },
        ],
        endpoints,
    }
}

fn slices_of<'a>(slices: &'a Slices) -> impl Fn(&ObjectKey) -> Vec<&'a EndpointSlice> {
    move |key: &ObjectKey| {
        slices
            .values()
            .filter(|s| s.namespace == key.0 && s.service == key.1)
            .collect()
    }
}

#[test]
fn random_changes_keep_the_maps_equal_to_the_full_computation() {
    for seed in 1..=20u64 {
        let mut rng = Rng(seed);
        let mut services = Services::new();
        let mut slices = Slices::new();
        let mut tracker = Tracker::new("n1");
        let mut maps = Maps::default();
        for step in 0..150 {
            let name = format!("s{}", rng.next(8));
            let key: ObjectKey = ("ns".into(), name.clone());
            let mut changed = vec![key.clone()];
            match rng.next(5) {
                0 => {
                    services.remove(&key);
                }
                1 | 2 => {
                    services.insert(key.clone(), service(&mut rng, &name));
                }
                _ => {
                    let slice_name = format!("sl{}", rng.next(10));
                    let skey: ObjectKey = ("ns".into(), slice_name.clone());
                    if let Some(old) = slices.get(&skey) {
                        changed.push(("ns".into(), old.service.clone()));
                    }
                    if rng.next(4) == 0 {
                        slices.remove(&skey);
                    } else {
                        slices.insert(skey, slice(&mut rng, &slice_name, &name));
                    }
                }
            }
            let ops = tracker.update(&services, &slices_of(&slices), changed);
            maps.apply(ops);
            let got = shape(&maps.frontends, &maps.slots, &maps.backends, &maps.revnat);
            let full = compute(&services, &slices, &mut Ids::default(), "n1");
            let want = shape(&full.frontends, &full.slots, &full.backends, &full.revnat);
            assert_eq!(got, want, "seed {seed}, step {step}");
        }
    }
}

#[test]
fn seeded_ids_are_kept_so_a_restart_writes_nothing() {
    let mut rng = Rng(7);
    let mut services = Services::new();
    let mut slices = Slices::new();
    for i in 0..6 {
        let name = format!("s{i}");
        services.insert(("ns".into(), name.clone()), service(&mut rng, &name));
        slices.insert(
            ("ns".into(), format!("sl{i}")),
            slice(&mut rng, &format!("sl{i}"), &name),
        );
    }
    let all: Vec<ObjectKey> = services.keys().cloned().collect();
    let mut first = Tracker::new("n1");
    let mut maps = Maps::default();
    maps.apply(first.update(&services, &slices_of(&slices), all.clone()));
    // Churn moves ids away from the order a fresh computation would give them.
    services.remove(&("ns".into(), "s0".into()));
    maps.apply(first.update(&services, &slices_of(&slices), [("ns".into(), "s0".into())]));
    services.insert(("ns".into(), "s9".into()), service(&mut rng, "s9"));
    maps.apply(first.update(&services, &slices_of(&slices), [("ns".into(), "s9".into())]));

    // A new process seeded from the maps: the whole set writes exactly what is there already.
    let mut second = Tracker::new("n1");
    second.seed(
        maps.frontends.iter().map(|(k, v)| (*k, v.service_id)),
        maps.backends.iter().map(|(k, v)| (*k, *v)),
    );
    let keys: Vec<ObjectKey> = services.keys().cloned().collect();
    let ops = second.update(&services, &slices_of(&slices), keys);
    let mut again = Maps::default();
    again.apply(ops);
    assert_eq!(again.frontends, maps.frontends);
    assert_eq!(again.slots, maps.slots);
    assert_eq!(again.backends, maps.backends);
    assert_eq!(again.revnat, maps.revnat);
}

/// `svc_members_v1` as the slots say it should be: each slotted backend's slot per service.
fn inverse(
    slots: impl IntoIterator<Item = (SlotKey, SlotValue)>,
) -> BTreeMap<MemberKey, MemberValue> {
    slots
        .into_iter()
        .map(|(k, v)| {
            (
                MemberKey {
                    service_id: k.service_id,
                    backend_id: v.backend_id,
                },
                MemberValue {
                    slot: k.slot,
                    pad: 0,
                },
            )
        })
        .collect()
}

#[test]
fn the_members_map_stays_the_inverse_of_the_slots_through_random_changes() {
    let kernel = crate::kernel::fake::FakeKernel::default();
    let fake = crate::dataplane::services::FakeServiceMaps::new(&kernel);
    for seed in 1..=10u64 {
        let mut rng = Rng(seed);
        let mut services = Services::new();
        let mut slices = Slices::new();
        let mut maps = fake.drivers().for_node("n1");
        for step in 0..120 {
            let name = format!("s{}", rng.next(6));
            let key: ObjectKey = ("ns".into(), name.clone());
            match rng.next(4) {
                0 => {
                    services.remove(&key);
                }
                1 => {
                    services.insert(key, service(&mut rng, &name));
                }
                _ => {
                    let slice_name = format!("sl{}", rng.next(8));
                    let skey: ObjectKey = ("ns".into(), slice_name.clone());
                    if rng.next(4) == 0 {
                        slices.remove(&skey);
                    } else {
                        slices.insert(skey, slice(&mut rng, &slice_name, &name));
                    }
                }
            }
            maps.set(&services, &slices);
            let desired: Vec<(SlotKey, SlotValue)> =
                maps.slots.entries().map(|(k, v)| (*k, *v)).collect();
            let members: BTreeMap<MemberKey, MemberValue> =
                maps.members.entries().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(members, inverse(desired), "seed {seed}, step {step}");
            let left = maps.apply_due(std::time::Instant::now(), true);
            assert!(
                left.iter()
                    .all(crate::dataplane::map_driver::Pending::is_clean),
                "seed {seed}, step {step}"
            );
            assert_eq!(
                fake.members
                    .contents()
                    .into_iter()
                    .collect::<BTreeMap<_, _>>(),
                inverse(fake.slots.contents()),
                "the kernel's members, seed {seed}, step {step}"
            );
        }
    }
}
