//! The route driver on a real routing table (inside a test namespace): routes to remote pod blocks under
//! weir's own protocol number are written, read back and swept; a driver restarted over unchanged state
//! writes nothing; a route of another protocol is never touched (positive control: it is still there at the
//! end); everything checked with `ip route` from outside the driver. A route of weir's deleted from outside
//! (`ip route del`) is heard by the agent's link watcher (`RTM_DELROUTE`), put back by the driver's read-back
//! and counted as a repair.

use std::{collections::BTreeMap, time::Duration};

use agent::{
    dataplane::routes::{NextHop, RouteDriver},
    kernel::Drift,
    kernel::real::netlink_routes::NetlinkRoutes,
    paths::ROUTE_PROTOCOL,
};
use ipnetwork::IpNetwork;
use tests::{
    netns::{NetNs, VethPair},
    node_lab::{DriftWatch, run_here},
    privileged::require_root,
};

fn routes(ns: &NetNs, proto: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for family in ["-4", "-6"] {
        let out = ns.exec(&["ip", family, "route", "show", "proto", proto]);
        lines.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .filter(|l| !l.is_empty()),
        );
    }
    lines.sort();
    lines
}

fn net(s: &str) -> IpNetwork {
    s.parse().expect("cidr")
}

fn via(s: &str) -> NextHop {
    NextHop::Via(s.parse().expect("ip"))
}

/// Runs one driver (a fresh netlink socket, as after a restart) to `desired` inside `ns`: (writes, deletes).
fn apply(ns: &NetNs, desired: &BTreeMap<IpNetwork, NextHop>) -> (u64, u64) {
    ns.run(|| {
        let mut driver = RouteDriver::new(Box::new(NetlinkRoutes::open().expect("netlink")));
        driver.set_desired(desired.clone());
        driver.apply().expect("apply routes");
        (driver.stats().writes, driver.stats().deletes)
    })
}

#[test]
fn routes_are_written_read_back_and_swept_and_a_restart_writes_nothing() {
    if !require_root("routes_are_written_read_back_and_swept_and_a_restart_writes_nothing") {
        return;
    }
    let ns = NetNs::new();
    let peer = NetNs::new();
    let link = VethPair::new(&ns, "rt", &peer, "rp");
    ns.exec(&["ip", "addr", "add", "192.0.2.1/24", "dev", &link.a]);
    ns.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd00:77::1/64",
        "dev",
        &link.a,
        "nodad",
    ]);
    // Not ours: a static route that must survive every apply.
    ns.exec(&[
        "ip",
        "route",
        "add",
        "10.77.0.0/24",
        "via",
        "192.0.2.9",
        "proto",
        "static",
    ]);
    let proto = ROUTE_PROTOCOL.to_string();

    let want = BTreeMap::from([
        (net("10.244.1.0/26"), via("192.0.2.2")),
        (net("10.244.2.0/26"), via("192.0.2.3")),
        (net("fd10:244:1::/80"), via("fd00:77::2")),
    ]);
    assert_eq!(apply(&ns, &want), (3, 0));
    assert_eq!(
        routes(&ns, &proto),
        vec![
            format!("10.244.1.0/26 via 192.0.2.2 dev {} metric 1024", link.a)
                .replace(" metric 1024", ""),
            format!("10.244.2.0/26 via 192.0.2.3 dev {}", link.a),
            format!(
                "fd10:244:1::/80 via fd00:77::2 dev {} metric 1024 pref medium",
                link.a
            ),
        ]
    );
    // Restarted over the same table: nothing written, nothing swept.
    assert_eq!(apply(&ns, &want), (0, 0));

    // A block moved to another node and one gone; an orphan of our protocol made behind the driver's back.
    ns.exec(&[
        "ip",
        "route",
        "add",
        "10.244.9.0/26",
        "via",
        "192.0.2.5",
        "proto",
        &proto,
    ]);
    let moved = BTreeMap::from([(net("10.244.2.0/26"), via("192.0.2.4"))]);
    assert_eq!(
        apply(&ns, &moved),
        (1, 3),
        "one replaced; the gone block, the v6 block and the orphan swept"
    );
    assert_eq!(
        routes(&ns, &proto),
        vec![format!("10.244.2.0/26 via 192.0.2.4 dev {}", link.a)]
    );
    assert_eq!(
        routes(&ns, "static"),
        vec![format!("10.77.0.0/24 via 192.0.2.9 dev {}", link.a)],
        "a route of another protocol is never touched"
    );
}

#[test]
fn a_route_deleted_from_outside_is_heard_put_back_and_counted_as_a_repair() {
    if !require_root("a_route_deleted_from_outside_is_heard_put_back_and_counted_as_a_repair") {
        return;
    }
    let ns = NetNs::new();
    let peer = NetNs::new();
    let link = VethPair::new(&ns, "rt", &peer, "rp");
    ns.exec(&["ip", "addr", "add", "192.0.2.1/24", "dev", &link.a]);
    let want = BTreeMap::from([
        (net("10.244.1.0/26"), via("192.0.2.2")),
        (net("10.244.2.0/26"), via("192.0.2.3")),
    ]);
    let proto = ROUTE_PROTOCOL.to_string();
    let (drift, repairs, writes) = ns.run(|| {
        // The agent's link watcher and a route driver in sync, both in the namespace.
        let mut watch = DriftWatch::open();
        let mut driver = RouteDriver::new(Box::new(NetlinkRoutes::open().expect("netlink")));
        driver.set_desired(want.clone());
        driver.apply().expect("apply routes");
        assert_eq!(driver.stats().repairs, 0, "the first apply repairs nothing");
        // An operator's stray command: the kernel tells the watcher.
        run_here(&["ip", "route", "del", "10.244.2.0/26", "proto", &proto]);
        let drift = watch.next_drift(Duration::from_secs(10));
        // What the agent's loop does with it: read back and repair.
        let writes = driver.stats().writes;
        driver.refresh();
        driver.apply().expect("apply routes");
        (
            drift,
            driver.stats().repairs,
            driver.stats().writes - writes,
        )
    });
    assert_eq!(drift, Some(Drift::Route), "the deletion is heard");
    assert_eq!((repairs, writes), (1, 1), "one repair, counted");
    assert_eq!(
        routes(&ns, &proto),
        vec![
            format!("10.244.1.0/26 via 192.0.2.2 dev {}", link.a),
            format!("10.244.2.0/26 via 192.0.2.3 dev {}", link.a),
        ],
        "the route is back"
    );
}
