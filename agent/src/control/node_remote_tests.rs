//! Other nodes' addresses: the remote-node identity, exact entries that come and go with the
//! node record, left to a policy CIDR that covers them (an ipBlock selects node addresses).

use std::net::IpAddr;

use maps_schema::identity::REMOTE_NODE;

use super::{Fixture, ident};
use crate::cluster::{ClusterNode, NodeDelta};

const BLOCK: &str = r"
kind: NetworkPolicy
metadata: {name: nodes, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{ipBlock: {cidr: 10.9.0.0/24}}]
";

fn record(name: &str, addresses: &[&str]) -> NodeDelta {
    NodeDelta::Upsert(ClusterNode {
        name: name.to_owned(),
        addresses: addresses
            .iter()
            .map(|a| a.parse::<IpAddr>().expect("ip"))
            .collect(),
        labels: std::collections::BTreeMap::new(),
        blocks: Vec::new(),
        alive: true,
        heartbeat: 0,
    })
}

#[test]
fn a_node_joining_and_leaving_writes_exactly_its_address_entries() {
    let mut f = Fixture::new("");
    f.node.set_node_name("a").expect("name");
    f.apply();
    // The local node's own record: its addresses are host (link watcher), nothing here.
    f.node.on_node_delta(record("a", &["10.9.0.1"]));
    assert_eq!(f.apply().len(), 0, "the local node's record writes nothing");

    f.node.on_node_delta(record("b", &["10.9.0.2", "fd00::2"]));
    let w = f.apply();
    assert_eq!(w.ident4, vec![ident("10.9.0.2", REMOTE_NODE)]);
    assert_eq!(w.ident6.len(), 1);
    assert_eq!(w.ident6[0].1.map(|i| i.identity), Some(REMOTE_NODE));
    assert_eq!(w.len(), 2);

    f.node.on_node_delta(record("b", &["10.9.0.2", "fd00::2"]));
    assert_eq!(f.apply().len(), 0, "an unchanged record writes nothing");

    f.node.on_node_delta(record("b", &["10.9.0.3", "fd00::2"]));
    let mut w = f.apply();
    w.ident4.sort_by_key(|(k, _)| *k);
    assert_eq!(
        w.ident4,
        vec![
            (
                "10.9.0.2"
                    .parse::<std::net::Ipv4Addr>()
                    .expect("ip")
                    .octets(),
                None
            ),
            ident("10.9.0.3", REMOTE_NODE)
        ]
    );
    assert_eq!(w.len(), 2);

    f.node.on_node_delta(NodeDelta::Gone("b".into()));
    let w = f.apply();
    assert_eq!(w.ident4.len(), 1);
    assert!(w.ident4[0].1.is_none());
    assert_eq!(w.ident6.len(), 1);
    assert!(w.ident6[0].1.is_none());
    assert_eq!(w.len(), 2);
}

#[test]
fn a_policy_cidr_covering_a_node_address_takes_it_and_gives_it_back() {
    let mut f = Fixture::new("");
    f.node.set_node_name("a").expect("name");
    f.node.on_node_delta(record("b", &["10.9.0.2"]));
    f.node.on_node_delta(record("c", &["10.8.0.3"]));
    f.apply();

    f.node
        .set_policies(super::policies(BLOCK), Vec::new())
        .expect("policy");
    let w = f.apply();
    // b's address (inside the block) leaves the exact map: the LPM entry gives it the CIDR's
    // identity; c's (outside) keeps remote-node.
    let b = "10.9.0.2"
        .parse::<std::net::Ipv4Addr>()
        .expect("ip")
        .octets();
    assert_eq!(w.ident4, vec![(b, None)]);
    assert_eq!(w.ipcache4.len(), 1);
    let trace = |f: &Fixture, ip: &str| {
        crate::observe::trace::identity_of(&f.node, ip.parse().expect("ip"))
    };
    let cidr = w.ipcache4[0].1.expect("written").identity;
    assert_eq!(trace(&f, "10.9.0.2"), cidr);
    assert_eq!(trace(&f, "10.8.0.3"), REMOTE_NODE);

    f.node
        .set_policies(super::policies(""), Vec::new())
        .expect("no policy");
    let w = f.apply();
    assert_eq!(w.ident4, vec![ident("10.9.0.2", REMOTE_NODE)]);
    assert_eq!(trace(&f, "10.9.0.2"), REMOTE_NODE);
}
