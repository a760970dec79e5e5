//! Real traffic through the attached programs: three pod namespaces behind host-side veths in a
//! node namespace, routed as `weir-cni` does it (a /32 in the pod, a default route via the
//! link-local gateway 169.254.1.1 pinned as a static neighbour, a /32 route per pod on the node).
//! TCP, UDP and ICMP between pods follow the policy in both directions; every denial has a
//! passing positive control; the drops are checked from outside with `bpftool`.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use aya::programs::TcAttachType;
use maps_schema::{
    EndpointInfo, PolicyKey, PolicyValue,
    counters::counter_index,
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    identity::HOST,
    maps,
    policy::{EGRESS, INGRESS, VERDICT_ALLOW},
    programs::{FROM_ENDPOINT, TO_ENDPOINT},
    reason::{DIR_FROM_ENDPOINT, DIR_TO_ENDPOINT, DROP_POLICY_DENIED, PASS_ESTABLISHED},
};
use tests::{
    bpf::{PinRoot, bpftool, counter_from_bpftool, load_weir, tc},
    datapath::{write_endpoint, write_identity, write_policy},
    netns::{NetNs, VethPair},
    packet::{ICMP, TCP, UDP},
    privileged::require_root,
};

const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const GATEWAY: &str = "169.254.1.1";
const IDS: [u32; 3] = [21, 22, 23];
const IDENTITIES: [u32; 3] = [2001, 2002, 2003];
const DENY_WAIT: Duration = Duration::from_millis(1500);
const ALLOW_WAIT: Duration = Duration::from_secs(10);

fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 245, 0, 10 + u8::try_from(i).expect("pod index"))
}

/// Pod `i`: its namespace and its veth (host side `a` in the node namespace, `b` in the pod).
struct Pod<'a> {
    ns: &'a NetNs,
    veth: VethPair<'a>,
}

fn plumb<'a>(node: &'a NetNs, ns: &'a NetNs, i: usize) -> Pod<'a> {
    let veth = VethPair::new(node, &format!("h{i}"), ns, &format!("c{i}"));
    let ip = pod_ip(i).to_string();
    // `ip netns exec` mounts the namespace's own /sys.
    let out = node.exec(&["cat", &format!("/sys/class/net/{}/address", veth.a)]);
    let mac = String::from_utf8(out.stdout).expect("mac is text");
    ns.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", &veth.b]);
    ns.exec(&[
        "ip", "route", "add", GATEWAY, "dev", &veth.b, "scope", "link",
    ]);
    ns.exec(&[
        "ip", "route", "add", "default", "via", GATEWAY, "dev", &veth.b,
    ]);
    ns.exec(&[
        "ip",
        "neigh",
        "add",
        GATEWAY,
        "lladdr",
        mac.trim(),
        "dev",
        &veth.b,
        "nud",
        "permanent",
    ]);
    node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", &veth.a]);
    Pod { ns, veth }
}

fn tcp_exchange(client: &NetNs, server: &NetNs, to: Ipv4Addr, port: u16, wait: Duration) -> bool {
    let listener = server.run(move || TcpListener::bind((to, port)).expect("listen"));
    listener.set_nonblocking(true).expect("nonblocking");
    let connected = client.run(move || {
        let Ok(mut s) = TcpStream::connect_timeout(&SocketAddr::from((to, port)), wait) else {
            return false;
        };
        s.write_all(b"weir").is_ok()
    });
    if !connected {
        return false;
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Ok((mut s, _)) = listener.accept() {
            s.set_nonblocking(false).expect("blocking");
            s.set_read_timeout(Some(wait)).expect("timeout");
            let mut buf = [0u8; 4];
            return s.read_exact(&mut buf).is_ok() && &buf == b"weir";
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn udp_exchange(client: &NetNs, server: &NetNs, to: Ipv4Addr, port: u16, wait: Duration) -> usize {
    let rx = server.run(move || UdpSocket::bind((to, port)).expect("bind"));
    let tx = client.run(|| UdpSocket::bind("0.0.0.0:0").expect("bind"));
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let mut received = 0;
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 64];
    while Instant::now() < deadline && received < 3 {
        tx.send_to(b"weir", (to, port)).expect("send");
        if let Ok(n) = rx.recv(&mut buf) {
            received += usize::from(n == 4);
        }
    }
    received
}

/// Sends ICMP echo requests from `client` to `to` on a raw socket; true when a reply comes back.
fn ping(client: &NetNs, to: Ipv4Addr, wait: Duration) -> bool {
    client.run(move || {
        // SAFETY: plain socket syscalls on a descriptor this closure owns and closes.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP);
            assert!(fd >= 0, "raw socket");
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 200_000,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                size_of::<libc::timeval>() as u32,
            );
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as u16;
            addr.sin_addr.s_addr = u32::from_ne_bytes(to.octets());
            let id: u16 = 0x5754;
            let deadline = Instant::now() + wait;
            let mut seq: u16 = 0;
            let mut ok = false;
            while !ok && Instant::now() < deadline {
                seq += 1;
                let mut msg = [8u8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
                msg[4..6].copy_from_slice(&id.to_be_bytes());
                msg[6..8].copy_from_slice(&seq.to_be_bytes());
                let sum = checksum(&msg);
                msg[2..4].copy_from_slice(&sum.to_be_bytes());
                libc::sendto(
                    fd,
                    msg.as_ptr().cast(),
                    msg.len(),
                    0,
                    (&raw const addr).cast(),
                    size_of::<libc::sockaddr_in>() as u32,
                );
                let mut buf = [0u8; 256];
                let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
                if n >= 28 {
                    let ihl = usize::from(buf[0] & 0x0f) * 4;
                    let from = Ipv4Addr::new(buf[12], buf[13], buf[14], buf[15]);
                    ok = from == to && buf[ihl] == 0 && buf[ihl + 4..ihl + 6] == id.to_be_bytes();
                }
            }
            libc::close(fd);
            ok
        }
    })
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(u16::try_from(sum).expect("folded"))
}

fn allow(ebpf: &mut aya::Ebpf, pod: usize, direction: u8, peer: u32, proto: u8, port: u16) {
    let key = PolicyKey {
        endpoint_id: IDS[pod],
        peer_identity: peer,
        port,
        protocol: proto,
        direction,
    };
    write_policy(ebpf, &key, &PolicyValue::new(VERDICT_ALLOW, 1));
}

#[test]
fn pods_follow_policy_with_real_traffic() {
    if !require_root("pods_follow_policy_with_real_traffic") {
        return;
    }
    let root = PinRoot::new();
    let node = NetNs::new();
    let pod_ns = [NetNs::new(), NetNs::new(), NetNs::new()];
    node.exec(&["ip", "addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"]);
    for key in [
        "net.ipv4.ip_forward=1",
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.default.rp_filter=0",
    ] {
        node.exec(&["sysctl", "-qw", key]);
    }
    let pods: Vec<Pod<'_>> = pod_ns
        .iter()
        .enumerate()
        .map(|(i, ns)| plumb(&node, ns, i))
        .collect();
    let mut ebpf = load_weir(&root);
    let links = root.path().join("links");
    std::fs::create_dir_all(&links).expect("links dir");

    // Endpoints: pod 1 is isolated both ways, pods 0 and 2 are not isolated.
    for (i, pod) in pods.iter().enumerate() {
        let ifindex = node.ifindex(&pod.veth.a);
        let flags = if i == 1 {
            FLAG_ISOLATED_INGRESS | FLAG_ISOLATED_EGRESS
        } else {
            0
        };
        let info = EndpointInfo {
            endpoint_id: IDS[i],
            identity: IDENTITIES[i],
            flags,
            ipv4: [pod_ip(i).octets(), [0; 4]],
            ..EndpointInfo::default()
        };
        write_endpoint(&mut ebpf, ifindex, &info);
        write_identity(&mut ebpf, pod_ip(i).into(), IDENTITIES[i]);
    }
    write_identity(&mut ebpf, NODE_IP.into(), HOST);
    // Pod 1 accepts pod 0 on TCP 8080, UDP 5353 and ping; it may open TCP 8080 to pod 2 only.
    allow(&mut ebpf, 1, INGRESS, IDENTITIES[0], TCP, 8080);
    allow(&mut ebpf, 1, INGRESS, IDENTITIES[0], UDP, 5353);
    allow(&mut ebpf, 1, INGRESS, IDENTITIES[0], ICMP, 8);
    allow(&mut ebpf, 1, EGRESS, IDENTITIES[2], TCP, 8080);

    // Attach through the agent's own code, to the host-side veths (the programs are fail-closed
    // and the entries exist already, as weir-cni orders it).
    for (hook, program) in [
        (TcAttachType::Ingress, FROM_ENDPOINT),
        (TcAttachType::Egress, TO_ENDPOINT),
    ] {
        let prog = tc(&mut ebpf, program);
        for pod in &pods {
            let pin = links.join(format!("{}_{program}", pod.veth.a));
            node.run(|| agent::attach::attach_tc(prog, program, &pod.veth.a, hook, &pin))
                .unwrap_or_else(|e| panic!("attach {program} to {}: {e}", pod.veth.a));
        }
    }
    // From outside: every pinned link runs the program it was attached with.
    for (program, name) in [
        (FROM_ENDPOINT, "from_endpoint"),
        (TO_ENDPOINT, "to_endpoint"),
    ] {
        let prog_id = tc(&mut ebpf, program).info().expect("program info").id();
        for pod in &pods {
            let pin = links
                .join(format!("{}_{program}", pod.veth.a))
                .display()
                .to_string();
            let link = bpftool(&["link", "show", "pinned", &pin]);
            assert_eq!(
                link["prog_id"].as_u64(),
                Some(u64::from(prog_id)),
                "{pin} runs {name}"
            );
        }
    }

    let (p0, p1, p2) = (pods[0].ns, pods[1].ns, pods[2].ns);
    let ip1 = pod_ip(1);
    // TCP into pod 1: pod 0 allowed; pod 2 (peer) and port 8081 (port) denied.
    assert!(
        tcp_exchange(p0, p1, ip1, 8080, ALLOW_WAIT),
        "pod 0 -> pod 1 tcp/8080 is allowed"
    );
    assert!(
        !tcp_exchange(p2, p1, ip1, 8080, DENY_WAIT),
        "pod 2 -> pod 1 tcp/8080 is denied"
    );
    assert!(
        !tcp_exchange(p0, p1, ip1, 8081, DENY_WAIT),
        "pod 0 -> pod 1 tcp/8081 is denied"
    );
    // TCP out of pod 1: to pod 2 allowed, to pod 0 denied (pod 0's ingress is open: egress decides).
    assert!(
        tcp_exchange(p1, p2, pod_ip(2), 8080, ALLOW_WAIT),
        "pod 1 -> pod 2 tcp/8080 is allowed"
    );
    assert!(
        !tcp_exchange(p1, p0, pod_ip(0), 8080, DENY_WAIT),
        "pod 1 -> pod 0 tcp/8080 is denied"
    );
    // UDP.
    assert!(
        udp_exchange(p0, p1, ip1, 5353, ALLOW_WAIT) > 0,
        "pod 0 -> pod 1 udp/5353 is allowed"
    );
    assert_eq!(
        udp_exchange(p2, p1, ip1, 5353, DENY_WAIT),
        0,
        "pod 2 -> pod 1 udp/5353 is denied"
    );
    assert_eq!(
        udp_exchange(p1, p0, pod_ip(0), 5353, DENY_WAIT),
        0,
        "pod 1 -> pod 0 udp is denied"
    );
    // ICMP: pod 0 may ping pod 1 (the reply leaves pod 1 through conntrack); pod 2 may not; pod 1
    // may not ping pod 0.
    assert!(ping(p0, ip1, ALLOW_WAIT), "pod 0 pings pod 1");
    assert!(!ping(p2, ip1, DENY_WAIT), "pod 2 cannot ping pod 1");
    assert!(!ping(p1, pod_ip(0), DENY_WAIT), "pod 1 cannot ping pod 0");
    // The node (kubelet probes) reaches isolated pod 1.
    assert!(
        tcp_exchange(&node, p1, ip1, 9090, ALLOW_WAIT),
        "the node reaches pod 1 (host identity)"
    );

    // From outside: the drops and the conntrack replies are counted; conntrack holds flows.
    let counters = root.paths().map_pin(maps::COUNTERS);
    let (denied_in, _) = counter_from_bpftool(
        &counters,
        counter_index(DROP_POLICY_DENIED, DIR_TO_ENDPOINT),
    );
    let (denied_out, _) = counter_from_bpftool(
        &counters,
        counter_index(DROP_POLICY_DENIED, DIR_FROM_ENDPOINT),
    );
    let (established, _) = counter_from_bpftool(
        &counters,
        counter_index(PASS_ESTABLISHED, DIR_FROM_ENDPOINT),
    );
    assert!(
        denied_in > 0 && denied_out > 0,
        "policy drops counted both ways ({denied_in}, {denied_out})"
    );
    assert!(established > 0, "replies pass through conntrack");
    let ct = bpftool(&[
        "map",
        "dump",
        "pinned",
        &root.paths().map_pin(maps::CT4).display().to_string(),
    ]);
    assert!(
        ct.as_array().is_some_and(|e| !e.is_empty()),
        "conntrack has entries"
    );
}
