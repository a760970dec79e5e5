//! Unit tests of `node.rs` over recording maps: each change writes exactly the keys it must.

use std::collections::BTreeSet;

use maps_schema::{
    IdentityInfo, PolicyKey,
    endpoint::FLAG_ISOLATED_INGRESS,
    identity::HOST,
    policy::{ANY_PORT, INGRESS},
};

use super::Node;

use weir_api::Endpoint;

use crate::{
    calc::{
        policy::{load::parse_str, model::PolicySet},
        testkit::{self, Maps, Op, Writes},
    },
    kernel::LinkEvent,
    paths::Paths,
};

const WEB: &str = r"
kind: NetworkPolicy
metadata: {name: web, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}]
";

fn policies(text: &str) -> PolicySet {
    parse_str("p.yaml", text).expect("valid policy")
}

struct Fixture {
    _dir: tempfile::TempDir,
    paths: Paths,
    node: Node,
    maps: Maps,
    next_ifindex: u32,
}

impl Fixture {
    fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let paths = Paths {
            state_dir: dir.path().to_owned(),
            ..Paths::default()
        };
        let (dataplane, maps) = testkit::dataplane();
        let mut node = Node::open(&paths, dataplane, policies(text), Vec::new()).expect("open");
        node.on_link(&LinkEvent::Synced);
        let mut fixture = Self {
            _dir: dir,
            paths,
            node,
            maps,
            next_ifindex: 100,
        };
        fixture.apply();
        fixture
    }

    /// Registers an endpoint on a link of its own; returns it as stored.
    fn add(&mut self, n: u32, app: &str, ip: &str) -> Endpoint {
        let e = testkit::endpoint(n, "default", &[("app", app)], &[ip]);
        self.next_ifindex += 1;
        self.node.on_link(&LinkEvent::Up {
            ifname: e.host_ifname.clone(),
            ifindex: self.next_ifindex,
            up: true,
        });
        self.node.upsert_endpoint(e).expect("upsert").0
    }

    fn relabel(&mut self, endpoint: &Endpoint, app: &str) -> u32 {
        let mut e = endpoint.clone();
        e.labels.insert("app".into(), app.into());
        self.node.upsert_endpoint(e).expect("upsert").1
    }

    /// Applies and returns what was written to the kernel.
    fn apply(&mut self) -> Writes {
        self.node.dataplane.apply().expect("apply");
        self.maps.take()
    }

    fn identity(&self, e: &Endpoint) -> u32 {
        self.node.identity(e).expect("identity")
    }
}

fn ident(ip: &str, identity: u32) -> Op<[u8; 4], IdentityInfo> {
    let ip: std::net::Ipv4Addr = ip.parse().expect("ip");
    (ip.octets(), Some(IdentityInfo { identity, flags: 0 }))
}

fn ingress(endpoint: u32, peer: u32, protocol: u8, port: u16) -> PolicyKey {
    PolicyKey {
        endpoint_id: endpoint,
        peer_identity: peer,
        port,
        protocol,
        direction: INGRESS,
    }
}

/// The policy keys written (`true`) and deleted (`false`), sorted.
fn policy_ops(w: &Writes) -> Vec<(bool, PolicyKey)> {
    let mut ops: Vec<(bool, PolicyKey)> = w.policy.iter().map(|(k, v)| (v.is_some(), *k)).collect();
    ops.sort_by_key(|(written, k)| (*written, k.endpoint_id, k.peer_identity, k.protocol, k.port));
    ops
}

#[test]
fn a_label_change_writes_only_the_endpoint_its_address_and_the_entries_of_its_identity() {
    let mut f = Fixture::new(WEB);
    let web = f.add(1, "web", "10.0.0.1");
    let client = f.add(2, "client", "10.0.0.2");
    let other = f.add(3, "other", "10.0.0.3");
    let initial = f.apply();
    let client_id = f.identity(&client);
    assert_eq!(
        policy_ops(&initial),
        vec![(true, ingress(web.id, client_id, 6, 80))]
    );
    assert_eq!(initial.endpoints.len(), 3);

    // `other` takes the label set `client` has: same identity, already a peer. Exactly its
    // endpoint entry and its address change; no policy entry.
    f.relabel(&other, "client");
    let w = f.apply();
    assert_eq!(w.ident4, vec![ident("10.0.0.3", client_id)]);
    assert_eq!(w.endpoints.len(), 1, "only its own endpoint entry: {w:?}");
    assert_eq!(w.endpoints[0].1.map(|e| e.identity), Some(client_id));
    assert!(
        w.policy.is_empty(),
        "its identity was a peer already: {w:?}"
    );
    assert_eq!(w.len(), 2);

    // `client` moves to a new label set: the peer identity still has a member (`other`).
    let client_moved = f.relabel(&client, "client2");
    assert_ne!(client_moved, client_id);
    let w = f.apply();
    assert_eq!(w.ident4, vec![ident("10.0.0.2", client_moved)]);
    assert_eq!(w.endpoints.len(), 1);
    assert!(w.policy.is_empty());

    // `other` leaves too: the last member of the peer identity, so web's entry for it goes.
    let other_id = f.relabel(&other, "other");
    let w = f.apply();
    assert_eq!(w.ident4, vec![ident("10.0.0.3", other_id)]);
    assert_eq!(w.endpoints.len(), 1);
    assert_eq!(
        policy_ops(&w),
        vec![(false, ingress(web.id, client_id, 6, 80))]
    );
    assert_eq!(w.len(), 3);
}

#[test]
fn a_policy_edit_rewrites_only_its_own_entries_and_keeps_other_rule_ids() {
    let mut f = Fixture::new(WEB);
    let web = f.add(1, "web", "10.0.0.1");
    let client = f.add(2, "client", "10.0.0.2");
    let other = f.add(3, "other", "10.0.0.3");
    f.apply();
    let (client_id, other_id) = (f.identity(&client), f.identity(&other));
    let web_rule = f.maps.policy.contents()[&ingress(web.id, client_id, 6, 80)].rule_id;

    // A second policy (sorting before `web`) selecting the same pod: its entries only; the
    // existing entry keeps its rule id (not rewritten).
    let two = format!(
        "{WEB}---\n{}",
        r"
kind: NetworkPolicy
metadata: {name: aaa, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: other}}}]
    ports: [{port: 9090}, {protocol: UDP, port: 5000, endPort: 5010}]
"
    );
    f.node
        .set_policies(policies(&two), Vec::new())
        .expect("policies");
    let w = f.apply();
    assert_eq!(
        policy_ops(&w),
        vec![
            (true, ingress(web.id, other_id, 6, 9090)),
            (true, ingress(web.id, other_id, 17, ANY_PORT)),
        ]
    );
    assert!(w.endpoints.is_empty(), "web was isolated already");
    assert_eq!(w.len(), 2);
    let contents = f.maps.policy.contents();
    assert_eq!(
        contents[&ingress(web.id, client_id, 6, 80)].rule_id,
        web_rule
    );
    let aaa_rule = contents[&ingress(web.id, other_id, 6, 9090)].rule_id;
    let origin = f.node.rule(aaa_rule).expect("rule");
    assert_eq!(
        (origin.policy.as_str(), origin.direction, origin.index),
        ("default/aaa", "ingress", 0)
    );

    // Edit `web`'s port: exactly its old entry goes and its new one comes.
    let edited = two.replace("ports: [{port: 80}]", "ports: [{port: 8080}]");
    f.node
        .set_policies(policies(&edited), Vec::new())
        .expect("policies");
    let w = f.apply();
    assert_eq!(
        policy_ops(&w),
        vec![
            (false, ingress(web.id, client_id, 6, 80)),
            (true, ingress(web.id, client_id, 6, 8080)),
        ]
    );
    assert_eq!(w.len(), 2);
    assert_eq!(
        f.maps.policy.contents()[&ingress(web.id, client_id, 6, 8080)].rule_id,
        web_rule
    );

    // The same set again, and a policy selecting nothing: no write at all.
    let idle = format!(
        "{edited}---\n{}",
        "kind: NetworkPolicy\nmetadata: {name: none, namespace: default}\nspec: {podSelector: {matchLabels: {app: nobody}}}\n"
    );
    f.node
        .set_policies(policies(&idle), Vec::new())
        .expect("policies");
    assert_eq!(f.apply().len(), 0);

    // Deleting `aaa` removes its entries only.
    let web_only = WEB.replace("ports: [{port: 80}]", "ports: [{port: 8080}]");
    f.node
        .set_policies(policies(&web_only), Vec::new())
        .expect("policies");
    let w = f.apply();
    assert_eq!(
        policy_ops(&w),
        vec![
            (false, ingress(web.id, other_id, 6, 9090)),
            (false, ingress(web.id, other_id, 17, ANY_PORT)),
        ]
    );
    assert_eq!(w.len(), 2);
}

#[test]
fn a_new_endpoint_writes_its_own_entries_and_the_peers_that_now_match_it() {
    let mut f = Fixture::new(WEB);
    let web = f.add(1, "web", "10.0.0.1");
    f.apply();
    assert!(
        f.maps.policy.contents().is_empty(),
        "no client yet: web is isolated with no entry"
    );

    // A second web pod: its endpoint entry (isolated), its address; no peer yet, no entry.
    let web2 = f.add(4, "web", "10.0.0.4");
    let w = f.apply();
    assert_eq!(w.endpoints.len(), 1);
    assert_eq!(
        w.endpoints[0].1.map(|e| e.flags),
        Some(FLAG_ISOLATED_INGRESS)
    );
    assert_eq!(w.ident4, vec![ident("10.0.0.4", f.identity(&web))]);
    assert!(w.policy.is_empty());
    assert_eq!(w.len(), 2);

    // A client: a new identity both web pods admit, so their two entries; and its own.
    let client = f.add(2, "client", "10.0.0.2");
    let client_id = f.identity(&client);
    let w = f.apply();
    assert_eq!(
        policy_ops(&w),
        vec![
            (true, ingress(web.id, client_id, 6, 80)),
            (true, ingress(web2.id, client_id, 6, 80)),
        ]
    );
    assert_eq!(w.endpoints.len(), 1);
    assert_eq!(
        w.endpoints[0].1.map(|e| e.flags),
        Some(0),
        "the client is not isolated"
    );
    assert_eq!(w.ident4, vec![ident("10.0.0.2", client_id)]);
    assert_eq!(w.len(), 4);

    // Deleting the second web pod removes exactly what it had.
    f.node.delete_endpoint(&web2.key()).expect("delete");
    let w = f.apply();
    assert_eq!(
        policy_ops(&w),
        vec![(false, ingress(web2.id, client_id, 6, 80))]
    );
    assert_eq!(w.endpoints.len(), 1);
    assert!(w.endpoints[0].1.is_none());
    assert_eq!(w.ident4.len(), 1);
    assert!(w.ident4[0].1.is_none());
    assert_eq!(w.len(), 3);
}

#[test]
fn node_addresses_write_their_ident_entries_only_and_a_restart_writes_nothing() {
    let mut f = Fixture::new(WEB);
    f.add(1, "web", "10.0.0.1");
    f.add(2, "client", "10.0.0.2");
    f.apply();
    let addresses: BTreeSet<std::net::IpAddr> = ["10.9.9.9".parse().expect("ip")].into();
    f.node.set_node_addresses(addresses).expect("addresses");
    let w = f.apply();
    assert_eq!(w.ident4, vec![ident("10.9.9.9", HOST)]);
    assert_eq!(w.len(), 1);

    // An edit history (a policy added and edited), then a restart over the same kernel maps:
    // rule ids come out the same, so nothing is written.
    let more = format!(
        "{WEB}---\n{}",
        "kind: NetworkPolicy\nmetadata: {name: aaa, namespace: default}\nspec:\n  podSelector: {}\n  ingress: [{from: [{podSelector: {}}], ports: [{port: 22}]}]\n"
    );
    f.node
        .set_policies(policies(&more), Vec::new())
        .expect("policies");
    f.node
        .set_policies(
            policies(&more.replace("port: 22", "port: 2222")),
            Vec::new(),
        )
        .expect("policies");
    assert!(!f.apply().policy.is_empty());
    let dataplane = testkit::dataplane_over(&f.maps);
    let restarted = Node::open(
        &f.paths,
        dataplane,
        policies(&more.replace("port: 22", "port: 2222")),
        Vec::new(),
    )
    .expect("reopen");
    let mut f2 = Fixture {
        node: restarted,
        maps: f.maps.clone(),
        ..f
    };
    f2.node
        .set_node_addresses(["10.9.9.9".parse().expect("ip")].into())
        .expect("addresses");
    for (ifname, ifindex) in [("weir00000000001", 101), ("weir00000000002", 102)] {
        f2.node.on_link(&LinkEvent::Up {
            ifname: ifname.into(),
            ifindex,
            up: true,
        });
    }
    f2.node.on_link(&LinkEvent::Synced);
    let w = f2.apply();
    assert_eq!(
        w.len(),
        0,
        "a restart over unchanged state writes nothing: {w:?}"
    );
}

#[test]
fn status_lists_the_caveats_of_the_source_objects_by_name_for_every_source() {
    const GHOST: &str = "kind: NetworkPolicy\nmetadata: {name: deny, namespace: ghost}\n\
                         spec: {podSelector: {}, ingress: [{ports: [{port: http}]}]}\n";
    let mut f = Fixture::new(WEB);
    assert!(
        f.node.summary().policy_warnings.is_empty(),
        "`default` always exists and WEB names no port: {:?}",
        f.node.summary().policy_warnings
    );
    f.node
        .set_policies(policies(GHOST), Vec::new())
        .expect("set");
    let warnings = f.node.summary().policy_warnings;
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("NetworkPolicy ghost/deny") && w.contains("no Namespace object")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("\"http\" (TCP)") && w.contains("no Pod declares")),
        "{warnings:?}"
    );
    assert_eq!(
        f.node.summary().policy_errors,
        Vec::<String>::new(),
        "a caveat is no refusal"
    );
    // Positive control: with the Namespace and a pod declaring the port, none.
    let fixed = format!(
        "{GHOST}---\nkind: Namespace\nmetadata: {{name: ghost}}\n---\n\
         kind: Pod\nmetadata: {{name: p, namespace: ghost}}\n\
         spec: {{containers: [{{name: main, ports: [{{name: http, containerPort: 80}}]}}]}}\n"
    );
    f.node
        .set_policies(policies(&fixed), Vec::new())
        .expect("set");
    assert!(
        f.node.summary().policy_warnings.is_empty(),
        "{:?}",
        f.node.summary().policy_warnings
    );
}

/// A Pod of the source is remote until an endpoint registers it, and remote again once that
/// endpoint goes; an endpoint of a pod the source does not have leaves the remote pods alone.
#[test]
fn registering_a_pod_takes_it_out_of_the_remote_pods_and_removing_it_brings_it_back() {
    let pod = "kind: Pod\nmetadata: {name: pod7, namespace: default, labels: {app: web}}\nspec: {nodeName: other-node, containers: []}\nstatus: {podIP: 10.250.0.7}\n";
    let mut f = Fixture::new(&format!("{WEB}---\n{pod}"));
    let remote: std::net::Ipv4Addr = "10.250.0.7".parse().expect("ip");
    assert!(
        f.maps.ident4.contents().contains_key(&remote.octets()),
        "the Pod is remote before any endpoint registers it"
    );

    // Another pod's endpoint: the remote pod keeps its address.
    f.add(1, "client", "10.0.0.1");
    f.apply();
    assert!(f.maps.ident4.contents().contains_key(&remote.octets()));

    // Its own endpoint (`pod7`, at another address): no longer remote.
    let local = f.add(7, "web", "10.0.0.7");
    let w = f.apply();
    assert!(
        !f.maps.ident4.contents().contains_key(&remote.octets()),
        "a registered pod is not remote"
    );
    assert!(w.ident4.contains(&(remote.octets(), None)));

    // Its endpoint removed: remote again, with its identity.
    f.node.delete_endpoint(&local.key()).expect("delete");
    f.apply();
    assert!(
        f.maps.ident4.contents().contains_key(&remote.octets()),
        "the Pod is remote again once its endpoint is gone"
    );
}

#[path = "node_remote_tests.rs"]
mod remote_nodes;
