//! The desired service maps: frontends, slot order, stable ids, only ready endpoints, and that a
//! change to one Service touches only its keys.

use std::collections::BTreeSet;

use maps_schema::service::{
    BACKEND_FLAG_TERMINATING, Backend4, SVC_FLAG_AFFINITY, SlotKey, Svc4Key,
};

use super::desired::{Desired, Ids, compute};
use crate::calc::policy::{load::parse_str, model::PolicySet};

fn service(name: &str, vip: &str) -> String {
    format!(
        "kind: Service\nmetadata: {{name: {name}, namespace: prod}}\nspec: {{clusterIP: {vip}, ports: [{{name: http, port: 80, targetPort: http}}]}}\n"
    )
}

fn slice(service: &str, endpoints: &[(&str, bool)]) -> String {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|(a, ready)| format!("- {{addresses: [{a}], conditions: {{ready: {ready}}}}}\n"))
        .collect();
    format!(
        "kind: EndpointSlice\nmetadata: {{name: {service}-1, namespace: prod, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n{}",
        eps.concat()
    )
}

fn set(docs: &[String]) -> PolicySet {
    parse_str("s.yaml", &docs.join("---\n")).expect("valid")
}

fn run(set: &PolicySet, ids: &mut Ids) -> Desired {
    compute(&set.services, &set.endpoint_slices, ids, "")
}

fn key(vip: [u8; 4]) -> Svc4Key {
    Svc4Key {
        addr: vip,
        port: 80,
        protocol: 6,
        scope: 0,
    }
}

/// The backends of a frontend in slot order.
fn slot_backends(d: &Desired, vip: [u8; 4]) -> Vec<Backend4> {
    let f = d.frontends[&key(vip)];
    (0..f.backend_count)
        .map(|slot| {
            let id = d.slots[&SlotKey {
                service_id: f.service_id,
                slot,
                pad: 0,
            }]
                .backend_id;
            d.backends[&id]
        })
        .collect()
}

#[test]
fn ready_endpoints_fill_the_slots_in_address_order() {
    let s = set(&[
        service("web", "10.96.0.10"),
        slice(
            "web",
            &[("10.0.0.3", true), ("10.0.0.1", true), ("10.0.0.2", false)],
        ),
    ]);
    let d = run(&s, &mut Ids::default());
    let got: Vec<([u8; 4], u16)> = slot_backends(&d, [10, 96, 0, 10])
        .iter()
        .map(|b| (b.addr, b.port))
        .collect();
    assert_eq!(got, [([10, 0, 0, 1], 8080), ([10, 0, 0, 3], 8080)]);
    let f = d.frontends[&key([10, 96, 0, 10])];
    assert_eq!(d.revnat[&f.service_id].addr, [10, 96, 0, 10]);
    assert_eq!(d.revnat[&f.service_id].port, 80);
    assert_eq!(d.slots.len(), 2, "only ready endpoints serve");
}

#[test]
fn a_service_without_ready_backends_keeps_a_frontend_with_none() {
    let s = set(&[
        service("web", "10.96.0.10"),
        slice("web", &[("10.0.0.1", false)]),
    ]);
    let d = run(&s, &mut Ids::default());
    assert_eq!(d.frontends[&key([10, 96, 0, 10])].backend_count, 0);
    assert!(d.slots.is_empty() && d.backends.is_empty());
}

#[test]
fn one_service_changing_changes_only_its_keys_and_ids_stay() {
    let before = set(&[
        service("web", "10.96.0.10"),
        slice("web", &[("10.0.0.1", true), ("10.0.0.2", true)]),
        service("db", "10.96.0.20"),
        slice("db", &[("10.0.1.1", true), ("10.0.1.2", true)]),
    ]);
    let mut ids = Ids::default();
    let a = run(&before, &mut ids);
    let again = run(&before, &mut ids);
    assert_eq!(a, again, "unchanged input: identical maps");
    // web loses a backend; db is untouched.
    let after = set(&[
        service("web", "10.96.0.10"),
        slice("web", &[("10.0.0.2", true)]),
        service("db", "10.96.0.20"),
        slice("db", &[("10.0.1.1", true), ("10.0.1.2", true)]),
    ]);
    let b = run(&after, &mut ids);
    let db = a.frontends[&key([10, 96, 0, 20])];
    assert_eq!(
        b.frontends[&key([10, 96, 0, 20])],
        db,
        "db's frontend as it was"
    );
    assert_eq!(
        slot_backends(&a, [10, 96, 0, 20]),
        slot_backends(&b, [10, 96, 0, 20])
    );
    let changed_slots: BTreeSet<u32> = a
        .slots
        .iter()
        .filter(|(k, v)| b.slots.get(k) != Some(v))
        .chain(b.slots.iter().filter(|(k, v)| a.slots.get(k) != Some(v)))
        .map(|(k, _)| k.service_id)
        .collect();
    let web_id = a.frontends[&key([10, 96, 0, 10])].service_id;
    assert_eq!(
        changed_slots,
        BTreeSet::from([web_id]),
        "only web's slots change"
    );
    // The surviving web backend keeps its backend id.
    let id_of = |d: &Desired, addr: [u8; 4]| {
        d.backends
            .iter()
            .find(|(_, b)| b.addr == addr)
            .map(|(id, _)| *id)
    };
    assert_eq!(id_of(&a, [10, 0, 0, 2]), id_of(&b, [10, 0, 0, 2]));
    assert_eq!(
        id_of(&b, [10, 0, 0, 1]),
        None,
        "the removed backend is gone"
    );
    assert_eq!(b.frontends[&key([10, 96, 0, 10])].service_id, web_id);
}

#[test]
fn affinity_is_carried_and_a_slice_of_another_service_is_ignored() {
    let s = set(&[
        "kind: Service\nmetadata: {name: web, namespace: prod}\nspec: {clusterIP: 10.96.0.10, sessionAffinity: ClientIP, ports: [{port: 80}]}\n".to_owned(),
        "kind: EndpointSlice\nmetadata: {name: w, namespace: prod, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.0.0.1]}]\n".to_owned(),
        "kind: EndpointSlice\nmetadata: {name: o, namespace: other, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.0.9.9]}]\n".to_owned(),
    ]);
    let d = run(&s, &mut Ids::default());
    let f = d.frontends[&key([10, 96, 0, 10])];
    assert_eq!(f.flags & SVC_FLAG_AFFINITY, SVC_FLAG_AFFINITY);
    assert_eq!(f.affinity_timeout_secs, 10_800);
    let backends = slot_backends(&d, [10, 96, 0, 10]);
    assert_eq!(
        backends.len(),
        1,
        "the other namespace's slice is not web's"
    );
    assert_eq!(
        (backends[0].addr, backends[0].port),
        ([10, 0, 0, 1], 80),
        "a portless slice: the numbered targetPort"
    );
}

#[test]
fn a_node_port_serves_every_ready_backend_or_only_this_nodes_under_local() {
    use maps_schema::service::{
        BACKEND_FLAG_LOCAL, NODEPORT_ANY, SCOPE_ALL, SCOPE_PODS, SVC_FLAG_EXTERNAL_LOCAL,
    };
    let doc = |name: &str, vip: &str, node_port: u16, policy: &str| {
        format!(
            "kind: Service\nmetadata: {{name: {name}, namespace: prod}}\nspec: {{type: NodePort, externalTrafficPolicy: {policy}, clusterIP: {vip}, ports: [{{name: http, port: 80, targetPort: http, nodePort: {node_port}}}]}}\n---\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: prod, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n- {{addresses: [10.0.0.1], nodeName: n1}}\n- {{addresses: [10.0.1.1], nodeName: n2}}\n- {{addresses: [10.0.1.2], nodeName: n2, conditions: {{ready: false}}}}\n"
        )
    };
    let set = set(&[
        doc("cluster", "10.96.0.1", 30080, "Cluster"),
        doc("local", "10.96.0.2", 30081, "Local"),
    ]);
    let d = compute(
        &set.services,
        &set.endpoint_slices,
        &mut Ids::default(),
        "n1",
    );
    let frontend = |port: u16, scope: u8| {
        let k = Svc4Key {
            addr: NODEPORT_ANY,
            port,
            protocol: 6,
            scope,
        };
        let f = d.frontends[&k];
        let backends: Vec<([u8; 4], u8)> = (0..f.backend_count)
            .map(|slot| {
                let id = d.slots[&SlotKey {
                    service_id: f.service_id,
                    slot,
                    pad: 0,
                }]
                    .backend_id;
                (d.backends[&id].addr, d.backends[&id].flags)
            })
            .collect();
        (f, backends, d.revnat[&f.service_id])
    };
    let (cluster, backends, revnat) = frontend(30080, SCOPE_ALL);
    assert_eq!(
        backends,
        vec![([10, 0, 0, 1], BACKEND_FLAG_LOCAL), ([10, 0, 1, 1], 0)],
        "Cluster: every ready endpoint, this node's flagged local"
    );
    assert_eq!(cluster.flags & SVC_FLAG_EXTERNAL_LOCAL, 0);
    assert_eq!((revnat.addr, revnat.port), (NODEPORT_ANY, 30080));
    let (local, backends, _) = frontend(30081, SCOPE_ALL);
    assert_eq!(
        backends,
        vec![([10, 0, 0, 1], BACKEND_FLAG_LOCAL)],
        "Local: this node's ready endpoints only"
    );
    assert_ne!(local.flags & SVC_FLAG_EXTERNAL_LOCAL, 0);
    // Its pods' variant: every ready endpoint, the same reverse NAT, no Local flag; a Cluster
    // NodePort has none.
    let (pods, backends, revnat) = frontend(30081, SCOPE_PODS);
    assert_eq!(
        backends,
        vec![([10, 0, 0, 1], BACKEND_FLAG_LOCAL), ([10, 0, 1, 1], 0)],
        "Local, for this node's pods: every ready endpoint"
    );
    assert_eq!(pods.flags & SVC_FLAG_EXTERNAL_LOCAL, 0);
    assert_eq!((revnat.addr, revnat.port), (NODEPORT_ANY, 30081));
    assert!(!d.frontends.contains_key(&Svc4Key {
        addr: NODEPORT_ANY,
        port: 30080,
        protocol: 6,
        scope: SCOPE_PODS,
    }));
    // The ClusterIP frontend of a NodePort Service keeps every ready backend.
    assert_eq!(slot_backends(&d, [10, 96, 0, 2]).len(), 2);
    // A node that is neither: under Local nothing serves, so the NodePort rejects.
    let other = compute(
        &set.services,
        &set.endpoint_slices,
        &mut Ids::default(),
        "n3",
    );
    let k = Svc4Key {
        addr: NODEPORT_ANY,
        port: 30081,
        protocol: 6,
        scope: 0,
    };
    assert_eq!(other.frontends[&k].backend_count, 0);
}

#[test]
fn a_frontend_two_services_claim_goes_to_the_first() {
    let set = set(&[
        service("a", "10.96.0.9"),
        slice("a", &[("10.0.0.1", true)]),
        service("b", "10.96.0.9"),
        slice("b", &[("10.0.0.2", true)]),
    ]);
    let d = run(&set, &mut Ids::default());
    let backends: Vec<[u8; 4]> = slot_backends(&d, [10, 96, 0, 9])
        .iter()
        .map(|b| b.addr)
        .collect();
    assert_eq!(backends, vec![[10, 0, 0, 1]], "prod/a, not a mix of both");
}

#[test]
fn a_terminating_endpoint_that_serves_keeps_its_backend_id_flagged_and_no_slot() {
    let ready = set(&[
        service("web", "10.96.0.10"),
        slice("web", &[("10.0.0.1", true), ("10.0.0.2", true)]),
    ]);
    let mut ids = Ids::default();
    let before = run(&ready, &mut ids);
    let id_of = |d: &Desired, last: u8| {
        d.backends
            .iter()
            .find(|(_, b)| b.addr == [10, 0, 0, last])
            .map(|(id, b)| (*id, b.flags))
    };
    let (id2, flags2) = id_of(&before, 2).expect("10.0.0.2 is a backend");
    assert_eq!(flags2 & BACKEND_FLAG_TERMINATING, 0);

    // 10.0.0.2 terminates but still serves; a third endpoint terminates and serves no more.
    let terminating = set(&[
        service("web", "10.96.0.10"),
        "kind: EndpointSlice\nmetadata: {name: web-1, namespace: prod, labels: {kubernetes.io/service-name: web}}\n\
         addressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n\
         - {addresses: [10.0.0.1], conditions: {ready: true}}\n\
         - {addresses: [10.0.0.2], conditions: {ready: false, serving: true, terminating: true}}\n\
         - {addresses: [10.0.0.3], conditions: {ready: false, serving: false, terminating: true}}\n"
            .to_owned(),
    ]);
    let after = run(&terminating, &mut ids);
    let got: Vec<[u8; 4]> = slot_backends(&after, [10, 96, 0, 10])
        .iter()
        .map(|b| b.addr)
        .collect();
    assert_eq!(
        got,
        [[10, 0, 0, 1]],
        "only the ready endpoint takes new flows"
    );
    let (id2_after, flags2_after) =
        id_of(&after, 2).expect("the draining backend stays in the map");
    assert_eq!(id2_after, id2, "its flows' backend id still finds it");
    assert_ne!(
        flags2_after & BACKEND_FLAG_TERMINATING,
        0,
        "flagged terminating"
    );
    assert_eq!(
        id_of(&after, 3),
        None,
        "a terminating endpoint that does not serve is not kept"
    );
    assert_eq!(after.backends.len(), 2);
}
