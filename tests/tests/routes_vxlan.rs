//! The route driver's vxlan mode on real kernels' worth of namespaces: two node namespaces on an underlay
//! bridge, each with a "pod" behind a veth and the driver run in process inside it. Before the drivers run
//! nothing connects the pods (control); after, TCP data flows pod → pod across the nodes and the VXLAN
//! device's counters show it went through the tunnel. The device, forwarding entries, neighbour entries and
//! routes are checked from outside with `ip -d link`, `bridge fdb`, `ip neigh` and `ip route`; a driver
//! restarted over unchanged state writes nothing (same ifindex); a removed node is swept; native mode then
//! removes the device and routes via the node addresses. A forwarding entry deleted from outside (`bridge fdb
//! del`) is heard by the agent's link watcher (`RTM_DELNEIGH`), put back and counted as a repair; so is a
//! permanent neighbour entry deleted with `ip neigh del` (which the kernel announces in state `FAILED`).

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, TcpListener, TcpStream},
    thread,
    time::Duration,
};

use agent::{
    dataplane::{
        node_routes::{LocalNode, NodeRoutes, RemoteNode, RoutingMode},
        vxlan::{VXLAN_OVERHEAD_V4, VxlanConfig, format_mac, vtep_mac},
    },
    kernel::{
        Drift,
        real::{netlink_routes::NetlinkRoutes, netlink_vxlan::NetlinkVxlan},
    },
    paths::ROUTE_PROTOCOL,
};
use tests::{
    names,
    netns::NetNs,
    node_lab::{DriftWatch, LabNode, NodeLab, eventually, run_here, tcp_connects},
    privileged::require_root,
};

const PORT: u16 = 7070;

fn out(ns: &NetNs, args: &[&str]) -> String {
    let o = ns.exec(args);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn mode(device: &str, node: &LabNode) -> RoutingMode {
    RoutingMode::Vxlan(VxlanConfig {
        device: device.to_owned(),
        vni: 4242,
        port: 4789,
        underlay: node.underlay.clone(),
    })
}

/// The nodes and the VXLAN device's name.
struct Lab {
    nodes: NodeLab,
    device: String,
}

fn remotes(lab: &Lab, i: usize) -> Vec<RemoteNode> {
    lab.nodes
        .remotes_of(i)
        .into_iter()
        .enumerate()
        .map(|(j, (address, vtep, blocks))| RemoteNode {
            name: format!("peer{j}"),
            address,
            vtep: Some(vtep),
            blocks,
        })
        .collect()
}

/// One driver run (a fresh netlink socket, as after a restart) inside node `i`:
/// (route writes + deletes, vxlan writes + deletes, pod MTU).
fn apply(
    lab: &Lab,
    i: usize,
    mode: RoutingMode,
    remotes: Vec<RemoteNode>,
) -> (u64, u64, Option<u32>) {
    let node = &lab.nodes.nodes[i];
    let local = LocalNode {
        name: format!("node{i}"),
        address: IpAddr::V4(node.address),
        vtep: Some(node.vtep),
    };
    let device = Some(match &mode {
        RoutingMode::Vxlan(c) => c.device.clone(),
        RoutingMode::Native => lab.device.clone(),
    });
    node.ns.run(move || {
        let mut d = NodeRoutes::new(
            mode,
            Box::new(NetlinkRoutes::open().expect("netlink")),
            Box::new(NetlinkVxlan::open().expect("netlink")),
            device,
        );
        d.set_nodes(local, remotes);
        d.apply().expect("apply");
        let (r, v) = d.stats();
        (r.writes + r.deletes, v.writes + v.deletes, d.pod_mtu())
    })
}

/// An echo server in `pod` that answers every connection's first line, until the process ends.
fn echo(pod: &NetNs) {
    let listener = pod
        .run(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT)))
        .expect("listen");
    thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 64];
            if let Ok(n) = conn.read(&mut buf) {
                let _ = conn.write_all(&buf[..n]);
            }
        }
    });
}

fn exchange(from: &NetNs, to: Ipv4Addr) -> Vec<u8> {
    from.run(move || {
        let mut s = TcpStream::connect_timeout(&(to, PORT).into(), Duration::from_secs(3))
            .expect("connect across the tunnel");
        s.set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        s.write_all(b"across the tunnel").expect("write");
        let mut got = vec![0u8; 17];
        s.read_exact(&mut got).expect("read the echo");
        got
    })
}

fn tx_packets(ns: &NetNs, dev: &str) -> u64 {
    let o = out(
        ns,
        &[
            "cat",
            &format!("/sys/class/net/{dev}/statistics/tx_packets"),
        ],
    );
    o.trim().parse().expect("a counter")
}

#[test]
fn vxlan_mode_carries_pod_traffic_between_nodes_and_a_restart_writes_nothing() {
    if !require_root("vxlan_mode_carries_pod_traffic_between_nodes_and_a_restart_writes_nothing") {
        return;
    }
    let lab = Lab {
        nodes: NodeLab::new(2, |_| None),
        device: names::unique("vx"),
    };
    let device = lab.device.clone();
    let (a, b) = (&lab.nodes.nodes[0], &lab.nodes.nodes[1]);
    echo(&b.pod);
    echo(&a.pod);
    // Control: no routes between the blocks yet, so nothing connects.
    assert!(!tcp_connects(
        &a.pod,
        b.pod_ip,
        PORT,
        Duration::from_millis(500)
    ));

    let underlay_mtu: u32 = out(
        &a.ns,
        &["cat", &format!("/sys/class/net/{}/mtu", a.underlay)],
    )
    .parse()
    .expect("mtu");
    for i in 0..2 {
        let (routes, vxlan, mtu) = apply(
            &lab,
            i,
            mode(&device, &lab.nodes.nodes[i]),
            remotes(&lab, i),
        );
        // One route; device + address + one forwarding + one neighbour entry.
        assert_eq!((routes, vxlan), (1, 4), "node {i}");
        assert_eq!(mtu, Some(underlay_mtu - VXLAN_OVERHEAD_V4));
    }

    // What the kernel holds, read from outside the driver.
    let link = out(&a.ns, &["ip", "-d", "link", "show", &device]);
    for want in [
        format!("mtu {}", underlay_mtu - VXLAN_OVERHEAD_V4),
        "vxlan id 4242".to_owned(),
        format!("local {}", a.address),
        format!("dev {}", a.underlay),
        "dstport 4789".to_owned(),
        "nolearning".to_owned(),
        format!("link/ether {}", format_mac(vtep_mac(a.vtep))),
    ] {
        assert!(link.contains(&want), "{want:?} not in {link}");
    }
    assert!(
        link.contains("state UNKNOWN") || link.contains(",UP"),
        "{link}"
    );
    let b_mac = format_mac(vtep_mac(b.vtep));
    assert_eq!(
        out(&a.ns, &["bridge", "fdb", "show", "dev", &device])
            .lines()
            .filter(|l| l.contains(" dst "))
            .collect::<Vec<_>>(),
        vec![format!("{b_mac} dst {} self permanent", b.address)]
    );
    assert_eq!(
        out(&a.ns, &["ip", "neigh", "show", "dev", &device]),
        format!("{} lladdr {b_mac} PERMANENT", b.vtep)
    );
    assert_eq!(
        out(
            &a.ns,
            &["ip", "route", "show", "proto", &ROUTE_PROTOCOL.to_string()]
        ),
        format!("{} via {} dev {device} onlink", b.block, b.vtep)
    );
    assert_eq!(
        out(&a.ns, &["ip", "-4", "-o", "addr", "show", "dev", &device])
            .split_whitespace()
            .nth(3)
            .map(str::to_owned),
        Some(format!("{}/32", a.vtep))
    );

    // Real traffic both ways, through the tunnel.
    let before = tx_packets(&a.ns, &device);
    assert_eq!(exchange(&a.pod, b.pod_ip), b"across the tunnel");
    assert_eq!(exchange(&b.pod, a.pod_ip), b"across the tunnel");
    assert!(
        tx_packets(&a.ns, &device) > before,
        "the pods' packets left through the VXLAN device"
    );

    // A restart over unchanged state writes nothing and keeps the device.
    let ifindex = a.ns.ifindex(&device);
    assert_eq!(
        apply(&lab, 0, mode(&device, a), remotes(&lab, 0)),
        (0, 0, Some(underlay_mtu - 50))
    );
    assert_eq!(a.ns.ifindex(&device), ifindex);

    // Node b removed: a sweeps its route and entries, and b's pod is unreachable again.
    assert_eq!(apply(&lab, 0, mode(&device, a), Vec::new()).0, 1);
    assert_eq!(
        out(
            &a.ns,
            &["ip", "route", "show", "proto", &ROUTE_PROTOCOL.to_string()]
        ),
        ""
    );
    assert!(!out(&a.ns, &["bridge", "fdb", "show", "dev", &device]).contains(" dst "));
    assert_eq!(out(&a.ns, &["ip", "neigh", "show", "dev", &device]), "");
    assert!(!tcp_connects(
        &a.pod,
        b.pod_ip,
        PORT,
        Duration::from_millis(500)
    ));

    // Native mode: the device goes, the routes go via the node addresses, and the pods connect natively.
    for i in 0..2 {
        let (routes, vxlan, mtu) = apply(&lab, i, RoutingMode::Native, remotes(&lab, i));
        assert_eq!((vxlan, mtu), (1, None), "node {i}: the device is removed");
        assert!(routes >= 1);
    }
    assert!(
        a.ns.try_exec(&["ip", "link", "show", &device])
            .is_ok_and(|o| !o.status.success())
    );
    assert_eq!(
        out(
            &a.ns,
            &["ip", "route", "show", "proto", &ROUTE_PROTOCOL.to_string()]
        ),
        format!("{} via {} dev {}", b.block, b.address, a.underlay)
    );
    assert!(eventually(Duration::from_secs(3), || tcp_connects(
        &a.pod,
        b.pod_ip,
        PORT,
        Duration::from_millis(500)
    )));
}

#[test]
fn a_forwarding_or_neighbour_entry_deleted_from_outside_is_heard_put_back_and_counted_as_a_repair()
{
    if !require_root(
        "a_forwarding_or_neighbour_entry_deleted_from_outside_is_heard_put_back_and_counted_as_a_repair",
    ) {
        return;
    }
    let lab = Lab {
        nodes: NodeLab::new(2, |_| None),
        device: names::unique("vx"),
    };
    let device = lab.device.clone();
    let (a, b) = (&lab.nodes.nodes[0], &lab.nodes.nodes[1]);
    let b_mac = format_mac(vtep_mac(b.vtep));
    let entry = format!("{b_mac} dst {} self permanent", b.address);
    let local = LocalNode {
        name: "node0".into(),
        address: IpAddr::V4(a.address),
        vtep: Some(a.vtep),
    };
    let (mode, remotes) = (mode(&device, a), remotes(&lab, 0));
    let b_address = b.address.to_string();
    let b_vtep = b.vtep.to_string();
    let neighbour = format!("{} lladdr {b_mac} PERMANENT", b.vtep);
    let (drift, (routes, vxlan), fdb_gone, neigh) = a.ns.run(|| {
        // The agent's link watcher and the drivers in sync, all in node a.
        let mut watch = DriftWatch::open();
        let mut d = NodeRoutes::new(
            mode,
            Box::new(NetlinkRoutes::open().expect("netlink")),
            Box::new(NetlinkVxlan::open().expect("netlink")),
            None,
        );
        d.set_nodes(local, remotes);
        d.apply().expect("apply");
        // An operator's stray command: the kernel tells the watcher.
        run_here(&[
            "bridge", "fdb", "del", &b_mac, "dev", &device, "dst", &b_address,
        ]);
        let fdb = std::process::Command::new("bridge")
            .args(["fdb", "show", "dev", &device])
            .output()
            .expect("bridge");
        let fdb_gone = !String::from_utf8_lossy(&fdb.stdout).contains(" dst ");
        let drift = watch.next_drift(Duration::from_secs(10));
        // What the agent's loop does with it: read back and repair.
        d.resync();
        d.apply().expect("apply");
        let (r, v) = d.stats();
        // The neighbour entry, deleted as an operator would: heard too, and put back by the read-back.
        let shown = || {
            let o = std::process::Command::new("ip")
                .args(["neigh", "show", "dev", &device])
                .output()
                .expect("ip");
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        let neigh_before = shown();
        run_here(&["ip", "neigh", "del", &b_vtep, "dev", &device]);
        let neigh_gone = shown();
        let neigh_heard = watch.next_drift(Duration::from_secs(10));
        d.resync();
        d.apply().expect("apply");
        let neigh_repairs = d.stats().1.repairs - v.repairs;
        (
            drift,
            (r.repairs, v.repairs),
            fdb_gone,
            (neigh_before, neigh_gone, neigh_heard, neigh_repairs),
        )
    });
    assert!(fdb_gone, "the entry was deleted (the precondition)");
    assert_eq!(
        drift,
        Some(Drift::Neighbour {
            ifindex: a.ns.ifindex(&lab.device)
        }),
        "the deletion is heard"
    );
    assert_eq!(
        (routes, vxlan),
        (0, 1),
        "one repair, counted by the VXLAN driver"
    );
    assert_eq!(
        out(&a.ns, &["bridge", "fdb", "show", "dev", &lab.device])
            .lines()
            .filter(|l| l.contains(" dst "))
            .collect::<Vec<_>>(),
        vec![entry],
        "the entry is back"
    );

    let (neigh_before, neigh_gone, neigh_heard, neigh_repairs) = neigh;
    assert_eq!(
        neigh_before, neighbour,
        "the neighbour entry is there first"
    );
    assert_eq!(
        neigh_gone, "",
        "the neighbour entry was deleted (the precondition)"
    );
    assert_eq!(
        neigh_heard,
        Some(Drift::Neighbour {
            ifindex: a.ns.ifindex(&lab.device)
        }),
        "the neighbour entry's deletion is heard"
    );
    assert_eq!(
        neigh_repairs, 1,
        "one more repair, counted by the VXLAN driver"
    );
    assert_eq!(
        out(&a.ns, &["ip", "neigh", "show", "dev", &lab.device]),
        neighbour,
        "the neighbour entry is back"
    );
}
