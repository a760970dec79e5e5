//! ClusterIP Services carrying real traffic between pods of one node, from `--policy-dir`
//! documents (the standalone source): 300 new TCP connections from a client spread over the three
//! backends (each at least 50), every UDP reply comes from the ClusterIP (read with `recv_from`),
//! a Service without a ready backend refuses TCP and UDP at once (ICMP port unreachable), a
//! backend's own ICMP error reaches the client's socket connected to the ClusterIP,
//! a backend turned terminating and then removed from the EndpointSlice gets no new connection
//! while its established one keeps carrying data, and a UDP flow held on it stays while it
//! terminates (still serving) and moves to another backend with its next datagram once it is
//! removed; with `sessionAffinity: ClientIP` every new
//! connection lands on one backend, and stays there when a backend coming back before it in
//! address order moves it to another slot. Egress policy judges the backend, not the
//! ClusterIP: a client allowed to `app=db` reaches the db Service and not the web one, an
//! egress-isolated client reaches neither, an unrestricted client reaches both (the positive
//! control) — every expectation computed by `tests::netpol`'s model from the policies — and
//! `weir policy trace` names the backend and the same verdict, in user space and in the kernel.
//! The conntrack sweep takes a translated flow's `svc_ct4_v1` entry with its conntrack entry, and
//! `weir service flows` lists the flow left with its backend and Service.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicySpec,
};
use serde_json::Value;
use tests::{
    agent_pod::{Pod, pod},
    agent_proc::{AgentDirs, AgentProcess},
    bpf::PinRoot,
    netns::NetNs,
    netpol::{Model, ModelPod, Source, labels, match_labels},
    privileged::require_root,
};

/// The port every backend serves TCP on (its name, then an echo of each line).
const TCP_PORT: u16 = 8080;
/// The port every backend answers UDP datagrams on (with its name).
const UDP_PORT: u16 = 8081;
/// A UDP port no backend listens on: its kernel answers with an ICMP port unreachable.
const CLOSED_PORT: u16 = 8099;

/// A Service `name` at `cluster_ip` with a TCP port 80, a UDP port 53 and a UDP port 54 (onto a
/// port nothing listens on) onto the backends' ports, and its EndpointSlice: each backend with its
/// conditions.
fn service_docs(name: &str, cluster_ip: &str, backends: &[(&str, &str)]) -> String {
    let mut endpoints = String::new();
    for (ip, conditions) in backends {
        endpoints.push_str(&format!(
            "- {{addresses: [{ip}], conditions: {conditions}, nodeName: wt-node}}\n"
        ));
    }
    if endpoints.is_empty() {
        endpoints.push_str("[]\n");
    }
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  clusterIP: {cluster_ip}\n  ports:\n\
         \x20 - {{name: tcp, port: 80, protocol: TCP, targetPort: {TCP_PORT}}}\n\
         \x20 - {{name: udp, port: 53, protocol: UDP, targetPort: {UDP_PORT}}}\n\
         \x20 - {{name: closed, port: 54, protocol: UDP, targetPort: {CLOSED_PORT}}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\n\
         ports: [{{name: tcp, port: {TCP_PORT}, protocol: TCP}}, {{name: udp, port: {UDP_PORT}, protocol: UDP}}, {{name: closed, port: {CLOSED_PORT}, protocol: UDP}}]\n\
         endpoints:{}{endpoints}",
        if backends.is_empty() { " " } else { "\n" }
    )
}

const READY: &str = "{ready: true}";
const TERMINATING: &str = "{ready: false, serving: true, terminating: true}";

/// Replaces `file` atomically (the agent's reloader never reads half a file).
fn write_atomically(file: &std::path::Path, text: &str) {
    let tmp = file.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).expect("write the document");
    std::fs::rename(&tmp, file).expect("rename the document into place");
}

/// Serves `name` in `pod`: on TCP, the name as a first line, then every line echoed; on UDP, the
/// name as the answer to every datagram. The serving threads live as long as the test process.
fn serve(pod: &Pod<'_>, name: &str) {
    let (tcp, udp) = pod.ns.run(|| {
        (
            TcpListener::bind(("0.0.0.0", TCP_PORT)).expect("listen on TCP"),
            UdpSocket::bind(("0.0.0.0", UDP_PORT)).expect("bind UDP"),
        )
    });
    let tcp_name = name.to_owned();
    std::thread::spawn(move || {
        for conn in tcp.incoming() {
            let Ok(mut conn) = conn else { continue };
            let name = tcp_name.clone();
            std::thread::spawn(move || {
                if writeln!(conn, "{name}").is_err() {
                    return;
                }
                let mut reader = BufReader::new(conn.try_clone().expect("clone the stream"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if conn.write_all(line.as_bytes()).is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
    let udp_name = name.to_owned();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((_, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(udp_name.as_bytes(), from);
        }
    });
}

/// A TCP connection through the Service: the stream and the backend's name (its first line).
struct Conn {
    reader: BufReader<TcpStream>,
    backend: String,
}

impl Conn {
    /// Writes a line and reads its echo back.
    fn echo(&mut self, line: &str) -> std::io::Result<String> {
        self.reader
            .get_mut()
            .write_all(format!("{line}\n").as_bytes())?;
        let mut back = String::new();
        self.reader.read_line(&mut back)?;
        Ok(back.trim_end().to_owned())
    }
}

fn connect(client: &Pod<'_>, to: SocketAddr, timeout: Duration) -> Option<Conn> {
    let stream = client
        .ns
        .run(|| TcpStream::connect_timeout(&to, timeout).ok())?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(stream);
    let mut backend = String::new();
    reader.read_line(&mut backend).ok()?;
    let backend = backend.trim_end().to_owned();
    (!backend.is_empty()).then_some(Conn { reader, backend })
}

/// Every frontend the agent lists (`GET /v1/services`): "service frontend" → (address, state) of each backend.
fn listed(agent: &AgentProcess) -> BTreeMap<String, Vec<(String, String)>> {
    let services: Value = agent
        .api(hyper::Method::GET, "/v1/services", None)
        .expect("GET /v1/services");
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut out = BTreeMap::new();
    for f in services.as_array().expect("a list of frontends") {
        let mut backends: Vec<(String, String)> = f["backends"]
            .as_array()
            .expect("backends")
            .iter()
            .map(|b| (text(&b["address"]), text(&b["state"])))
            .collect();
        backends.sort();
        out.insert(
            format!("{} {}", text(&f["service"]), text(&f["frontend"])),
            backends,
        );
    }
    out
}

fn wait_for(what: &str, ok: impl FnMut() -> bool) {
    tests::wait::until(what, Duration::from_secs(20), ok);
}

/// Waits until the TCP frontend of `service` lists exactly `want` (address:port, state).
fn wait_listed(agent: &AgentProcess, service: &str, cluster_ip: &str, want: &[(String, &str)]) {
    let key = format!("default/{service} {cluster_ip}:80/tcp");
    let mut want: Vec<(String, String)> = want
        .iter()
        .map(|(a, s)| (format!("{a}:{TCP_PORT}"), (*s).to_owned()))
        .collect();
    want.sort();
    tests::wait::until_ok(
        &format!("{key}: the agent lists {want:?}"),
        Duration::from_secs(20),
        || {
            let got = listed(agent);
            if got.get(&key) == Some(&want) {
                Ok(())
            } else {
                Err(format!("it lists {got:#?}"))
            }
        },
    );
}

fn node_with_agent(root: &PinRoot, dirs: &AgentDirs) -> (NetNs, AgentProcess) {
    std::fs::create_dir_all(dirs.path("policies")).expect("policy dir");
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let agent = AgentProcess::start(root, dirs, Some(&node), &[]);
    (node, agent)
}

#[test]
fn a_cluster_ip_spreads_new_connections_answers_from_itself_and_drains_a_removed_backend() {
    if !require_root(
        "a_cluster_ip_spreads_new_connections_answers_from_itself_and_drains_a_removed_backend",
    ) {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let (node, agent) = node_with_agent(&root, &dirs);
    let names = ["web-a", "web-b", "web-c"];
    let backends: Vec<Pod<'_>> = names.iter().map(|n| pod(&node, &agent, n, "web")).collect();
    for (p, n) in backends.iter().zip(names) {
        serve(p, n);
    }
    let client = pod(&node, &agent, "client", "client");
    let cluster_ip = "10.96.0.10";
    let frontend: SocketAddr = format!("{cluster_ip}:80").parse().expect("frontend");
    let file = dirs.path("policies").join("web.yaml");

    // Positive control first: each backend answers its own address.
    for (p, n) in backends.iter().zip(names) {
        let to: SocketAddr = format!("{}:{TCP_PORT}", p.ip).parse().expect("addr");
        let conn = connect(&client, to, Duration::from_secs(2))
            .unwrap_or_else(|| panic!("the client reaches backend {n} at {to} directly"));
        assert_eq!(conn.backend, n);
    }
    // Before the Service exists nothing answers the ClusterIP.
    assert!(
        connect(&client, frontend, Duration::from_millis(700)).is_none(),
        "nothing answers {frontend} before the Service exists"
    );

    // No ready backend yet: refused at once, as kube-proxy's REJECT refuses (an ICMP port
    // unreachable from the ClusterIP), on TCP and on UDP.
    write_atomically(&file, &service_docs("web", cluster_ip, &[]));
    wait_listed(&agent, "web", cluster_ip, &[]);
    let udp_frontend: SocketAddr = format!("{cluster_ip}:53").parse().expect("udp frontend");
    wait_for("the frontend without a backend refuses", || {
        let (tcp, udp) = client.ns.run(|| {
            let tcp = TcpStream::connect_timeout(&frontend, Duration::from_secs(2)).map(|_| ());
            let s = UdpSocket::bind("0.0.0.0:0").expect("bind the client's UDP socket");
            s.connect(udp_frontend).expect("connect the UDP socket");
            s.set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            s.send(b"who").expect("send");
            let mut buf = [0u8; 64];
            (tcp, s.recv(&mut buf).map(|_| ()))
        });
        let refused = |r: &std::io::Result<()>| {
            r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        };
        eprintln!("without a backend: TCP {tcp:?}, UDP {udp:?}");
        refused(&tcp) && refused(&udp)
    });

    let all_ready: Vec<(&str, &str)> = backends.iter().map(|p| (p.ip.as_str(), READY)).collect();
    write_atomically(&file, &service_docs("web", cluster_ip, &all_ready));
    let want: Vec<(String, &str)> = backends.iter().map(|p| (p.ip.clone(), "ready")).collect();
    wait_listed(&agent, "web", cluster_ip, &want);
    wait_for("the ClusterIP answers", || {
        connect(&client, frontend, Duration::from_millis(700)).is_some()
    });

    // 300 new connections: every one answered by a backend through the ClusterIP; one of each
    // backend's kept open for later.
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    let mut held: BTreeMap<String, Conn> = BTreeMap::new();
    for i in 0..300 {
        let conn = connect(&client, frontend, Duration::from_secs(2))
            .unwrap_or_else(|| panic!("connection {i} to {frontend} failed"));
        assert_eq!(
            conn.reader.get_ref().peer_addr().expect("peer"),
            frontend,
            "the connection's peer is the ClusterIP"
        );
        *counts.entry(conn.backend.clone()).or_default() += 1;
        held.entry(conn.backend.clone()).or_insert(conn);
    }
    eprintln!("300 connections over the backends: {counts:?}");
    for n in names {
        let got = counts.get(n).copied().unwrap_or(0);
        assert!(
            got >= 50,
            "backend {n} got {got} of 300 connections: {counts:?}"
        );
    }
    assert_eq!(
        counts.len(),
        3,
        "only the three backends answer: {counts:?}"
    );

    // UDP: every reply's source is the ClusterIP's port 53, never a backend's address.
    let mut udp_seen: BTreeMap<String, u32> = BTreeMap::new();
    for i in 0..60 {
        let (from, name) = client.ns.run(|| {
            let s = UdpSocket::bind("0.0.0.0:0").expect("bind the client's UDP socket");
            s.set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            s.send_to(b"who", udp_frontend).expect("send");
            let mut buf = [0u8; 64];
            let (n, from) = s
                .recv_from(&mut buf)
                .unwrap_or_else(|e| panic!("UDP query {i} to {udp_frontend} got no answer: {e}"));
            (from, String::from_utf8_lossy(&buf[..n]).into_owned())
        });
        assert_eq!(
            from, udp_frontend,
            "UDP reply {i} ({name}) came from {from}"
        );
        *udp_seen.entry(name).or_default() += 1;
    }
    eprintln!("60 UDP queries over the backends: {udp_seen:?}");
    // A backend's own ICMP port unreachable (nothing listens on the target port) reaches the
    // client's socket, connected to the ClusterIP: the error is translated back.
    let closed: SocketAddr = format!("{cluster_ip}:54").parse().expect("closed frontend");
    let refused = client.ns.run(|| {
        (0..5).any(|_| {
            let s = UdpSocket::bind("0.0.0.0:0").expect("bind the client's UDP socket");
            s.connect(closed).expect("connect the UDP socket");
            s.set_read_timeout(Some(Duration::from_secs(1)))
                .expect("timeout");
            s.send(b"anyone?").expect("send");
            let mut buf = [0u8; 64];
            let r = s.recv(&mut buf);
            eprintln!("UDP to {closed} (no listener behind it): {r:?}");
            r.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        })
    });
    assert!(
        refused,
        "the backend's port unreachable reaches the client as ECONNREFUSED"
    );
    assert!(
        udp_seen.len() >= 2,
        "new UDP flows spread over the backends: {udp_seen:?}"
    );

    // A UDP flow (one socket, one source port) on web-a, held across its removal below.
    let gone = "web-a";
    let held_udp = client.ns.run(|| {
        (0..100)
            .find_map(|_| {
                let s = UdpSocket::bind("0.0.0.0:0").expect("bind the client's UDP socket");
                s.set_read_timeout(Some(Duration::from_secs(2)))
                    .expect("timeout");
                (udp_ask(&s, udp_frontend).as_deref() == Some(gone)).then_some(s)
            })
            .unwrap_or_else(|| panic!("no UDP flow of 100 landed on {gone}"))
    });

    // web-a terminating: no new connection reaches it, its established one carries on.
    let others: Vec<(&str, &str)> = backends
        .iter()
        .zip(names)
        .map(|(p, n)| (p.ip.as_str(), if n == gone { TERMINATING } else { READY }))
        .collect();
    write_atomically(&file, &service_docs("web", cluster_ip, &others));
    let want: Vec<(String, &str)> = backends
        .iter()
        .zip(names)
        .map(|(p, n)| {
            (
                p.ip.clone(),
                if n == gone { "terminating" } else { "ready" },
            )
        })
        .collect();
    wait_listed(&agent, "web", cluster_ip, &want);
    let check_drained = |held: &mut BTreeMap<String, Conn>, what: &str| {
        let mut after: BTreeMap<String, u32> = BTreeMap::new();
        for i in 0..60 {
            let conn = connect(&client, frontend, Duration::from_secs(2))
                .unwrap_or_else(|| panic!("{what}: connection {i} to {frontend} failed"));
            *after.entry(conn.backend).or_default() += 1;
        }
        eprintln!("{what}: 60 connections over the backends: {after:?}");
        assert!(
            !after.contains_key(gone),
            "{what}: {gone} got new connections: {after:?}"
        );
        assert_eq!(
            after.len(),
            2,
            "{what}: both other backends serve: {after:?}"
        );
        for (n, conn) in held.iter_mut() {
            let line = format!("still {n} after {what}");
            let back = conn
                .echo(&line)
                .unwrap_or_else(|e| panic!("{what}: the established flow to {n} broke: {e}"));
            assert_eq!(back, line, "{what}: the established flow to {n} echoes");
        }
    };
    check_drained(&mut held, "web-a terminating");
    // The held UDP flow stays on web-a while it terminates and still serves (as under
    // kube-proxy, whose conntrack entry outlives the endpoint's readiness).
    let stayed = client.ns.run(|| udp_ask(&held_udp, udp_frontend));
    assert_eq!(
        stayed.as_deref(),
        Some(gone),
        "the UDP flow of the terminating, serving backend {gone} stays on it"
    );

    // web-a removed from the slice: the same.
    let ready_others: Vec<(&str, &str)> = backends
        .iter()
        .zip(names)
        .filter(|(_, n)| *n != gone)
        .map(|(p, _)| (p.ip.as_str(), READY))
        .collect();
    write_atomically(&file, &service_docs("web", cluster_ip, &ready_others));
    let want: Vec<(String, &str)> = backends
        .iter()
        .zip(names)
        .filter(|(_, n)| *n != gone)
        .map(|(p, _)| (p.ip.clone(), "ready"))
        .collect();
    wait_listed(&agent, "web", cluster_ip, &want);
    check_drained(&mut held, "web-a removed from the slice");
    // Removed, web-a keeps no UDP flow: the held one moves with its next datagram (web-a's pod
    // still answers UDP: only the service stopped sending there).
    let moved_to = client.ns.run(|| udp_ask(&held_udp, udp_frontend));
    eprintln!("the UDP flow held on {gone} now answers from {moved_to:?}");
    assert!(
        moved_to.as_deref().is_some_and(|n| n != gone),
        "the UDP flow of the removed backend {gone} moved to another one: {moved_to:?}"
    );

    // `sessionAffinity: ClientIP`: every new connection from the client lands on one backend (the
    // spread above, without it, is the positive control).
    let sticky = service_docs("web", cluster_ip, &ready_others).replacen(
        "spec:\n",
        "spec:\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n",
        1,
    );
    write_atomically(&file, &sticky);
    wait_for("the agent lists the Service's affinity", || {
        let services: Value = agent
            .api(hyper::Method::GET, "/v1/services", None)
            .expect("GET /v1/services");
        services.as_array().is_some_and(|a| {
            a.iter()
                .any(|f| f["affinity_timeout_seconds"].as_u64() == Some(600))
        })
    });
    // The maps follow the view: wait until new connections stop spreading, then count.
    let one_backend = |n: usize| -> BTreeMap<String, u32> {
        let mut seen: BTreeMap<String, u32> = BTreeMap::new();
        for i in 0..n {
            let conn = connect(&client, frontend, Duration::from_secs(2))
                .unwrap_or_else(|| panic!("affinity: connection {i} to {frontend} failed"));
            *seen.entry(conn.backend).or_default() += 1;
        }
        seen
    };
    wait_for("new connections stick to one backend", || {
        one_backend(10).len() == 1
    });
    let seen = one_backend(40);
    eprintln!("sessionAffinity ClientIP: 40 connections over the backends: {seen:?}");
    assert_eq!(seen.len(), 1, "every connection on one backend: {seen:?}");

    // web-a back in the slice: its address sorts first, so the backends after it move to other
    // slots (the slots follow address order). The client stays on its backend, as under
    // kube-proxy (the programs find the backend's new slot in `svc_members_v1`). This client's
    // hash may name the same backend anyway: `datapath_svc_testrun`'s
    // `client_ip_affinity_follows_its_backend_to_another_slot` is where it names another one.
    let stuck = seen.keys().next().expect("one backend").clone();
    let slot_of = |ready: &[&str]| {
        let mut ips: Vec<(std::net::Ipv4Addr, &str)> = backends
            .iter()
            .zip(names)
            .filter(|(_, n)| ready.contains(n))
            .map(|(p, n)| (p.ip.parse().expect("an IPv4 pod address"), n))
            .collect();
        ips.sort();
        ips.iter().position(|(_, n)| *n == stuck.as_str())
    };
    let others: Vec<&str> = names.iter().copied().filter(|n| *n != gone).collect();
    let (before, after) = (slot_of(&others), slot_of(&names));
    assert!(
        before.is_some() && before != after,
        "{stuck} moves to another slot when {gone} comes back: {before:?} → {after:?}"
    );
    let all_ready: Vec<(&str, &str)> = backends.iter().map(|p| (p.ip.as_str(), READY)).collect();
    let sticky_all = service_docs("web", cluster_ip, &all_ready).replacen(
        "spec:\n",
        "spec:\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n",
        1,
    );
    write_atomically(&file, &sticky_all);
    let want: Vec<(String, &str)> = backends.iter().map(|p| (p.ip.clone(), "ready")).collect();
    wait_listed(&agent, "web", cluster_ip, &want);
    let seen = one_backend(40);
    eprintln!("sessionAffinity ClientIP after {gone} came back: {seen:?}");
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        [&stuck],
        "every connection still on {stuck}, now in slot {after:?}: {seen:?}"
    );
}

/// Sends one query on `s` to the UDP frontend `to`: the answering backend's name (`None`: no
/// answer, or one from another source than `to`).
fn udp_ask(s: &UdpSocket, to: SocketAddr) -> Option<String> {
    s.send_to(b"who", to).expect("send");
    let mut buf = [0u8; 64];
    let (n, from) = s.recv_from(&mut buf).ok()?;
    (from == to).then(|| String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// An egress policy for pods labelled `app` allowing only `to_app` pods (none: egress-isolated).
fn egress_policy(app: &str, to_app: Option<&str>) -> NetworkPolicy {
    NetworkPolicy {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(format!("{app}-egress")),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(match_labels(&[("app", app)])),
            policy_types: Some(vec!["Egress".into()]),
            egress: Some(
                to_app
                    .map(|to| NetworkPolicyEgressRule {
                        to: Some(vec![NetworkPolicyPeer {
                            pod_selector: Some(match_labels(&[("app", to)])),
                            ..Default::default()
                        }]),
                        ports: None,
                    })
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        }),
    }
}

#[test]
fn egress_policy_toward_a_service_is_decided_by_its_backends_identities() {
    if !require_root("egress_policy_toward_a_service_is_decided_by_its_backends_identities") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let (node, agent) = node_with_agent(&root, &dirs);
    // Backends: two db pods and two web pods; clients: `client` (egress to db only), `iso`
    // (egress-isolated, no rule) and `free` (no policy: the positive control).
    let servers = [
        ("db-1", "db"),
        ("db-2", "db"),
        ("web-1", "web"),
        ("web-2", "web"),
    ];
    let server_pods: Vec<(Pod<'_>, &str)> = servers
        .iter()
        .map(|(n, app)| (pod(&node, &agent, n, app), *app))
        .collect();
    for ((p, _), (n, _)) in server_pods.iter().zip(servers) {
        serve(p, n);
    }
    let clients = ["client", "iso", "free"];
    let client_pods: Vec<Pod<'_>> = clients.iter().map(|c| pod(&node, &agent, c, c)).collect();
    let model = Model {
        namespaces: [("default".to_owned(), labels(&[]))].into_iter().collect(),
        policies: vec![
            egress_policy("client", Some("db")),
            egress_policy("iso", None),
        ],
        ..Model::default()
    };
    let model_pod = |app: &str| ModelPod {
        namespace: "default".into(),
        labels: labels(&[("app", app)]),
    };
    let services = [("db", "10.96.0.20"), ("web", "10.96.0.21")];
    let mut docs = vec![model.manifest()];
    for (svc, ip) in services {
        let backends: Vec<(&str, &str)> = server_pods
            .iter()
            .filter(|(_, app)| *app == svc)
            .map(|(p, _)| (p.ip.as_str(), READY))
            .collect();
        docs.push(service_docs(svc, ip, &backends));
    }
    write_atomically(
        &dirs.path("policies").join("all.yaml"),
        &docs.join("\n---\n"),
    );
    for (svc, ip) in services {
        let want: Vec<(String, &str)> = server_pods
            .iter()
            .filter(|(_, app)| *app == svc)
            .map(|(p, _)| (p.ip.clone(), "ready"))
            .collect();
        wait_listed(&agent, svc, ip, &want);
    }

    // Expected: a Service is reachable when the model lets the client reach its backends' pods
    // (all of one Service's backends carry the same labels).
    let mut expected = Vec::new();
    for (c, cp) in clients.iter().zip(&client_pods) {
        for (svc, ip) in services {
            let allowed = model.allows(Source::Pod(&model_pod(c)), &model_pod(svc), TCP_PORT);
            let frontend: SocketAddr = format!("{ip}:80").parse().expect("frontend");
            expected.push((*c, cp, svc, frontend, allowed));
        }
    }
    assert!(
        expected.iter().any(|e| e.4) && expected.iter().any(|e| !e.4),
        "the matrix holds both allowed and denied pairs"
    );
    let observe = || -> Vec<(String, bool, bool)> {
        expected
            .iter()
            .map(|(c, cp, svc, frontend, allowed)| {
                // Several new connections: each may land on another backend, all must agree.
                let got: Vec<bool> = (0..4)
                    .map(|_| connect(cp, *frontend, Duration::from_millis(700)).is_some())
                    .collect();
                let ok = if *allowed {
                    got.iter().all(|g| *g)
                } else {
                    got.iter().all(|g| !*g)
                };
                (
                    format!("{c} → {svc} ({frontend}): got {got:?}"),
                    *allowed,
                    ok,
                )
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = observe();
        if seen.iter().all(|(_, _, ok)| *ok) {
            for (what, allowed, _) in &seen {
                eprintln!("{what}, expected {allowed}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "connectivity through the Services differs from the model: {seen:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // `weir policy trace` (the agent's `POST /v1/policy/trace`) follows the same path: the
    // frontend's backend, then policy on it, in user space and through the loaded programs.
    for (c, cp, svc, frontend, allowed) in &expected {
        let req =
            serde_json::json!({"src": cp.ip, "dst": frontend.ip(), "protocol": "tcp", "port": 80});
        let result: Value = agent
            .api(hyper::Method::POST, "/v1/policy/trace", Some(&req))
            .expect("POST /v1/policy/trace");
        let want = if *allowed { "allow" } else { "deny" };
        assert_eq!(result["verdict"], want, "trace {c} → {svc}: {result:#}");
        assert_eq!(
            result["kernel"]["verdict"], want,
            "kernel trace {c} → {svc}: {result:#}"
        );
        let backend = result["service"]["backend"].as_str().unwrap_or_default();
        assert!(
            server_pods
                .iter()
                .any(|(p, app)| app == svc && backend == format!("{}:{TCP_PORT}", p.ip)),
            "trace {c} → {svc}: the backend {backend:?} is one of the Service's: {result:#}"
        );
    }
    // The ClusterIP is not what policy judges: the denied client reaches no web pod directly
    // either, and reaches a db pod directly as it does through the Service.
    let (client_pod, free_pod) = (&client_pods[0], &client_pods[2]);
    for (p, app) in &server_pods {
        let to: SocketAddr = format!("{}:{TCP_PORT}", p.ip).parse().expect("addr");
        let allowed = model.allows(Source::Pod(&model_pod("client")), &model_pod(app), TCP_PORT);
        let got = connect(client_pod, to, Duration::from_millis(700)).is_some();
        assert_eq!(got, allowed, "client → {app} pod {to} directly");
        assert!(
            connect(free_pod, to, Duration::from_millis(700)).is_some(),
            "free → {app} pod {to} directly (positive control)"
        );
    }
}

/// An ingress policy for pods labelled `app` allowing only `from_app` pods.
fn ingress_policy(app: &str, from_app: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(format!("{app}-ingress")),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(match_labels(&[("app", app)])),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(match_labels(&[("app", from_app)])),
                    ..Default::default()
                }]),
                ports: None,
            }]),
            ..Default::default()
        }),
    }
}

/// One UDP query from `pod` to `to`: the answer's source and text, if one came.
fn udp_query(pod: &Pod<'_>, to: SocketAddr) -> Option<(SocketAddr, String)> {
    pod.ns.run(|| {
        let s = UdpSocket::bind("0.0.0.0:0").expect("bind the UDP socket");
        s.set_read_timeout(Some(Duration::from_secs(1)))
            .expect("timeout");
        s.send_to(b"who", to).expect("send");
        let mut buf = [0u8; 64];
        let (n, from) = s.recv_from(&mut buf).ok()?;
        Some((from, String::from_utf8_lossy(&buf[..n]).into_owned()))
    })
}

#[test]
fn a_pod_reaches_itself_through_its_service_judged_as_itself() {
    if !require_root("a_pod_reaches_itself_through_its_service_judged_as_itself") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let (node, agent) = node_with_agent(&root, &dirs);
    // `echo` is the Service's only backend and its own client (hairpin); `other` is a client
    // with other labels, whose reach shows each policy is in force.
    let echo = pod(&node, &agent, "echo", "echo");
    serve(&echo, "echo");
    let other = pod(&node, &agent, "other", "other");
    let cluster_ip = "10.96.0.30";
    let frontend: SocketAddr = format!("{cluster_ip}:80").parse().expect("frontend");
    let udp_frontend: SocketAddr = format!("{cluster_ip}:53").parse().expect("udp frontend");
    let service = service_docs("echo", cluster_ip, &[(echo.ip.as_str(), READY)]);
    let file = dirs.path("policies").join("all.yaml");
    let model_pod = |app: &str| ModelPod {
        namespace: "default".into(),
        labels: labels(&[("app", app)]),
    };

    // No policy, then ingress to `echo` from itself only, then from `other` only: each time
    // both clients connect (several new connections each) as the model says.
    for from in [None, Some("echo"), Some("other")] {
        let model = Model {
            namespaces: [("default".to_owned(), labels(&[]))].into_iter().collect(),
            policies: from
                .map(|f| ingress_policy("echo", f))
                .into_iter()
                .collect(),
            ..Model::default()
        };
        write_atomically(&file, &format!("{}\n---\n{service}", model.manifest()));
        wait_listed(&agent, "echo", cluster_ip, &[(echo.ip.clone(), "ready")]);
        let expect = |client: &str| {
            model.allows(
                Source::Pod(&model_pod(client)),
                &model_pod("echo"),
                TCP_PORT,
            )
        };
        let (self_allowed, other_allowed) = (expect("echo"), expect("other"));
        let what = format!("ingress to echo from {from:?}");
        // The agent applies the policy file a moment after it lists the Service.
        wait_for(&format!("{what}: the clients' reach settles"), || {
            let hairpin = connect(&echo, frontend, Duration::from_millis(700)).is_some();
            let across = connect(&other, frontend, Duration::from_millis(700)).is_some();
            hairpin == self_allowed && across == other_allowed
        });
        for i in 0..5 {
            let conn = connect(&echo, frontend, Duration::from_millis(700));
            assert_eq!(
                conn.is_some(),
                self_allowed,
                "{what}: hairpin connection {i} (model: {self_allowed})"
            );
            if let Some(mut conn) = conn {
                assert_eq!(conn.backend, "echo");
                assert_eq!(
                    conn.reader.get_ref().peer_addr().expect("peer"),
                    frontend,
                    "{what}: the hairpin connection's peer is the ClusterIP"
                );
                let line = format!("hairpin {i}");
                assert_eq!(conn.echo(&line).expect("echo"), line, "{what}: data flows");
            }
            let across = connect(&other, frontend, Duration::from_millis(700)).is_some();
            assert_eq!(across, other_allowed, "{what}: other → echo {i}");
            let answer = udp_query(&echo, udp_frontend);
            if self_allowed {
                assert_eq!(
                    answer,
                    Some((udp_frontend, "echo".to_owned())),
                    "{what}: a hairpin UDP query is answered from the ClusterIP"
                );
            } else {
                assert_eq!(answer, None, "{what}: a hairpin UDP query is refused");
            }
        }
    }
}

/// How many `svc_ct4_v1` entries (original direction) hold a flow of IP `protocol` from `client` to
/// `frontend`: the flows `from_endpoint` translated per packet. Read through the bpf syscall from
/// the pin.
fn translated_flows(root: &PinRoot, client: &str, frontend: &str, protocol: u8) -> usize {
    use maps_schema::{SvcCt4Entry, SvcCt4Key, service_ct::DIR_ORIGINAL};
    let pin = root.paths().map_pin(maps_schema::service_ct::SVC_CT4);
    let data = aya::maps::MapData::from_pin(&pin)
        .unwrap_or_else(|e| panic!("open {}: {e}", pin.display()));
    let map: aya::maps::HashMap<_, SvcCt4Key, SvcCt4Entry> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data)).expect("svc_ct4 is a hash");
    let (client, frontend): (std::net::Ipv4Addr, std::net::Ipv4Addr) = (
        client.parse().expect("client address"),
        frontend.parse().expect("frontend address"),
    );
    map.keys()
        .filter_map(Result::ok)
        .filter(|k| {
            k.direction == DIR_ORIGINAL
                && k.protocol == protocol
                && k.saddr == client.octets()
                && k.daddr == frontend.octets()
        })
        .count()
}

/// The conntrack sweep takes a translated flow's `svc_ct4_v1` entry with the flow: five closed
/// TCP connections through a ClusterIP leave entries (the positive control: read from the pin
/// right after), which are gone once their closed conntrack entries expire (1 s here), while the
/// entry of a connection still open stays and the connection keeps carrying data; the agent
/// counts what it swept.
#[test]
fn a_translated_flow_s_entry_leaves_with_its_conntrack_entry() {
    if !require_root("a_translated_flow_s_entry_leaves_with_its_conntrack_entry") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    std::fs::create_dir_all(dirs.path("policies")).expect("policy dir");
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&node),
        &["--ct-sweep-interval", "1", "--ct-timeout-tcp-closed", "1"],
    );
    let backend = pod(&node, &agent, "swept", "web");
    serve(&backend, "swept");
    let client = pod(&node, &agent, "client", "client");
    let cluster_ip = "10.96.0.40";
    write_atomically(
        &dirs.path("policies").join("web.yaml"),
        &service_docs("web", cluster_ip, &[(backend.ip.as_str(), READY)]),
    );
    wait_listed(&agent, "web", cluster_ip, &[(backend.ip.clone(), "ready")]);
    let frontend: SocketAddr = format!("{cluster_ip}:80").parse().expect("frontend");
    const TCP: u8 = 6;

    let mut open = connect(&client, frontend, Duration::from_secs(5)).expect("an open connection");
    for i in 0..5 {
        let mut closed = connect(&client, frontend, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("connection {i} through the ClusterIP"));
        assert_eq!(closed.echo("bye").expect("echo"), "bye");
    }
    assert!(
        translated_flows(&root, &client.ip, cluster_ip, TCP) >= 6,
        "every connection has its entry"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while translated_flows(&root, &client.ip, cluster_ip, TCP) > 1 {
        assert!(
            Instant::now() < deadline,
            "the closed connections' entries are swept within 60 s ({} left)",
            translated_flows(&root, &client.ip, cluster_ip, TCP)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        translated_flows(&root, &client.ip, cluster_ip, TCP),
        1,
        "the open connection keeps its entry"
    );
    assert_eq!(
        open.echo("still here")
            .expect("the open connection carries data"),
        "still here"
    );
    // `weir service flows` (`GET /v1/services/flows`) shows it: client, frontend, backend,
    // Service, and its conntrack entry.
    let weir_flows = |args: &[&str]| {
        let out = std::process::Command::new(tests::bin::weir())
            .args(["service", "flows", "--api-socket"])
            .arg(&agent.socket)
            .args(args)
            .output()
            .expect("run weir service flows");
        assert!(
            out.status.success(),
            "weir service flows failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let flows: Value = serde_json::from_str(&weir_flows(&["-o", "json"])).expect("JSON");
    let prefix = format!("{}:", client.ip);
    let mine: Vec<&Value> = flows
        .as_array()
        .expect("a list of flows")
        .iter()
        .filter(|f| f["client"].as_str().is_some_and(|c| c.starts_with(&prefix)))
        .collect();
    assert_eq!(mine.len(), 1, "one translated flow listed: {flows}");
    let f = mine[0];
    assert_eq!(f["frontend"], frontend.to_string().as_str(), "{f}");
    assert_eq!(
        f["backend"],
        format!("{}:{TCP_PORT}", backend.ip).as_str(),
        "{f}"
    );
    assert_eq!(f["service"], "default/web", "{f}");
    assert!(f["idle_secs"].is_u64(), "its conntrack entry is found: {f}");
    let table = weir_flows(&[]);
    assert!(
        table.lines().any(|l| l.contains(&format!("{}:{TCP_PORT}", backend.ip))
            && l.contains("default/web")),
        "the table lists the flow:\n{table}"
    );
    let status: Value = agent
        .api(hyper::Method::GET, "/v1/status", None)
        .expect("GET /v1/status");
    assert!(
        status["conntrack"]["service_flows_expired4"].as_u64() >= Some(5),
        "the agent counts the swept entries: {}",
        status["conntrack"]
    );
}

/// `wt-sockclient` in `cgroup` (`None`: the test's own) and network namespace `ns`: its output
/// lines.
fn sockclient(
    cgroup: Option<&std::path::Path>,
    ns: &NetNs,
    kind: &str,
    n: u32,
    to: SocketAddr,
) -> Vec<String> {
    let cgroup = cgroup.map_or_else(|| "-".to_owned(), |c| c.display().to_string());
    let netns = format!("/var/run/netns/{}", ns.name());
    let out = std::process::Command::new(tests::bin::wt_sockclient())
        .args([&cgroup, &netns, kind, &n.to_string(), &to.to_string()])
        .output()
        .expect("run wt-sockclient");
    assert!(
        out.status.success(),
        "wt-sockclient failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// IPv4 address `ip`, IPv4-mapped (`::ffff:a.b.c.d`), with `port`.
fn v4_mapped(ip: &str, port: u16) -> SocketAddr {
    let v4: std::net::Ipv4Addr = ip.parse().expect("an IPv4 address");
    SocketAddr::new(std::net::IpAddr::V6(v4.to_ipv6_mapped()), port)
}

/// A `wt-sockclient` `udp-sendto` line's answers and sources.
fn datagram_answers(line: &str) -> (Vec<String>, Vec<String>) {
    let fields: Vec<&str> = line.split(' ').collect();
    assert!(
        fields.len() == 3 && fields[0] == "udp",
        "an unconnected socket got no answers: {line}"
    );
    let split = |f: &str| f.split(',').map(str::to_owned).collect::<Vec<_>>();
    let (answers, sources) = (split(fields[1]), split(fields[2]));
    assert_eq!(answers.len(), 3, "{line}");
    (answers, sources)
}

/// How many of `sock_dgram4_v1`'s entries (read from the pin) remember `frontend` as a socket's
/// frontend.
fn remembered_datagrams(root: &PinRoot, frontend: &str) -> usize {
    use maps_schema::socket_lb::{SOCK_DGRAM4, SockDgram4Key, SockRevNat4};
    let pin = root.paths().map_pin(SOCK_DGRAM4);
    let data = aya::maps::MapData::from_pin(&pin)
        .unwrap_or_else(|e| panic!("open {}: {e}", pin.display()));
    let map: aya::maps::HashMap<_, SockDgram4Key, SockRevNat4> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data))
            .expect("sock_dgram4 is a hash");
    let frontend: std::net::Ipv4Addr = frontend.parse().expect("frontend address");
    map.iter()
        .filter_map(Result::ok)
        .filter(|(_, v)| v.frontend == frontend.octets())
        .count()
}

/// How many entries `sock_affin4_v1` (read from the pin) holds.
fn remembered_affinities(root: &PinRoot) -> usize {
    use maps_schema::{
        service::Affinity4,
        socket_lb::{SOCK_AFFIN4, SockAffinity4Key},
    };
    let pin = root.paths().map_pin(SOCK_AFFIN4);
    let data = aya::maps::MapData::from_pin(&pin)
        .unwrap_or_else(|e| panic!("open {}: {e}", pin.display()));
    let map: aya::maps::HashMap<_, SockAffinity4Key, Affinity4> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data))
            .expect("sock_affin4 is a hash");
    map.keys().filter_map(Result::ok).count()
}

/// The network namespace cookie `sock_cfg_v1` (read from the pin) restricts socket LB to; 0:
/// every socket.
fn socket_lb_netns_cookie(root: &PinRoot) -> u64 {
    use maps_schema::socket_lb::{SOCK_CFG, SockLbConfig};
    let pin = root.paths().map_pin(SOCK_CFG);
    let data = aya::maps::MapData::from_pin(&pin)
        .unwrap_or_else(|e| panic!("open {}: {e}", pin.display()));
    let array: aya::maps::Array<_, SockLbConfig> =
        aya::maps::Array::try_from(aya::maps::Map::Array(data)).expect("sock_cfg is an array");
    array.get(&0, 0).expect("slot 0").netns_cookie
}

/// Every `wt-sockclient` TCP line is a backend's answer (`sock-…`) with the frontend as the peer.
fn reaches_a_backend_through(lines: Vec<String>, frontend: SocketAddr, when: &str) {
    assert!(!lines.is_empty(), "{when}: no connection made");
    for line in lines {
        assert!(line.starts_with("tcp sock-"), "{when}: {line}");
        assert!(line.ends_with(&frontend.to_string()), "{when}: {line}");
    }
}

/// Socket LB (`--socket-lb-cgroup`): a process in the cgroup whose TCP socket connects to a
/// ClusterIP is given a backend at `connect` — every connection reaches a backend, both backends
/// are used, `getpeername` shows the ClusterIP, an IPv6 socket to the IPv4-mapped ClusterIP is
/// placed too — and none of its TCP flows is translated per packet (no `svc_ct4_v1` entry), while the same client outside the cgroup (the positive control
/// of that check) is translated per packet. Its UDP stays translated per packet (a connected
/// socket would keep a removed backend), answered from the ClusterIP. The node's own processes in
/// the cgroup reach the Service too; outside it they do not. So do they, and a pod in the
/// cgroup, a NodePort on the node's own address and on loopback (controls: outside the cgroup
/// the node's stack refuses it, and a pod's flows there are translated per packet; a port in the
/// range that no Service has stays refused). Attachment is checked from outside
/// (`bpftool cgroup show`): a restart with the flag replaces the links (each program attached
/// once, connections still placed at connect); one with `--socket-lb-scope host` places the
/// node's connections and leaves a pod's to the per-packet path; one without the flag detaches
/// them, and the cgroup's connections are then translated per packet.
/// An address of the socket LB test's node (on its loopback link: the `host` identity).
const NODE_ADDR: &str = "192.0.2.77";

#[test]
fn socket_lb_gives_a_backend_at_connect_and_shows_the_frontend() {
    if !require_root("socket_lb_gives_a_backend_at_connect_and_shows_the_frontend") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let cgroup = tests::cgroup::TestCgroup::new();
    std::fs::create_dir_all(dirs.path("policies")).expect("policy dir");
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let cgroup_arg = cgroup.path().display().to_string();
    // The closed connections' `svc_ct4_v1` entries are counted across restarts: their conntrack
    // entries (and so their entries, which the sweep takes with them) must outlive the test.
    let keep_closed = ["--ct-timeout-tcp-closed", "3600"];
    let socket_lb_flags = [
        &["--socket-lb-cgroup", cgroup_arg.as_str()][..],
        &keep_closed,
    ]
    .concat();
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &socket_lb_flags);
    let mut programs: Vec<String> = maps_schema::programs::SOCKET_LB
        .iter()
        .map(|p| (*p).to_owned())
        .collect();
    programs.sort();
    assert_eq!(
        cgroup.attached(),
        programs,
        "the socket LB programs on the cgroup"
    );
    let status: Value = agent
        .api(hyper::Method::GET, "/v1/status", None)
        .expect("GET /v1/status");
    assert_eq!(
        status["socket_lb"],
        cgroup_arg.as_str(),
        "the status names the cgroup"
    );

    let names = ["sock-a", "sock-b"];
    let backends: Vec<Pod<'_>> = names.iter().map(|n| pod(&node, &agent, n, "web")).collect();
    for (p, n) in backends.iter().zip(names) {
        serve(p, n);
    }
    let client = pod(&node, &agent, "client", "client");
    let cluster_ip = "10.96.0.30";
    let ready: Vec<(&str, &str)> = backends.iter().map(|p| (p.ip.as_str(), READY)).collect();
    write_atomically(
        &dirs.path("policies").join("web.yaml"),
        &service_docs("web", cluster_ip, &ready),
    );
    let want: Vec<(String, &str)> = backends.iter().map(|p| (p.ip.clone(), "ready")).collect();
    wait_listed(&agent, "web", cluster_ip, &want);
    let tcp_frontend: SocketAddr = format!("{cluster_ip}:80").parse().expect("frontend");
    let udp_frontend: SocketAddr = format!("{cluster_ip}:53").parse().expect("frontend");
    // A load balancer's address with `externalTrafficPolicy: Local` onto the same pods.
    let lb_ip = "10.200.0.60";
    let mut lb_endpoints = String::new();
    for p in &backends {
        lb_endpoints.push_str(&format!(
            "- {{addresses: [{}], conditions: {READY}, nodeName: wt-node}}\n",
            p.ip
        ));
    }
    write_atomically(
        &dirs.path("policies").join("web-lb.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: web-lb, namespace: default}}\n\
             spec:\n  type: LoadBalancer\n  externalTrafficPolicy: Local\n  clusterIP: 10.96.0.31\n\
             \x20 ports: [{{name: tcp, port: 80, protocol: TCP, targetPort: {TCP_PORT}, nodePort: 30480}}]\n\
             status: {{loadBalancer: {{ingress: [{{ip: {lb_ip}}}]}}}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: web-lb-1, namespace: default, labels: {{kubernetes.io/service-name: web-lb}}}}\n\
             addressType: IPv4\nports: [{{name: tcp, port: {TCP_PORT}, protocol: TCP}}]\n\
             endpoints:\n{lb_endpoints}"
        ),
    );
    wait_listed(&agent, "web-lb", "10.96.0.31", &want);
    let lb_frontend: SocketAddr = format!("{lb_ip}:80").parse().expect("frontend");

    // In the cgroup: placed at connect.
    let lines = sockclient(Some(cgroup.path()), &client.ns, "tcp", 40, tcp_frontend);
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for line in &lines {
        let fields: Vec<&str> = line.split(' ').collect();
        assert!(
            fields.len() == 3 && fields[0] == "tcp",
            "a connection through socket LB failed: {line}"
        );
        assert!(names.contains(&fields[1]), "answered by a backend: {line}");
        assert_eq!(
            fields[2],
            tcp_frontend.to_string(),
            "getpeername shows the ClusterIP: {line}"
        );
        *counts.entry(fields[1].to_owned()).or_default() += 1;
    }
    assert_eq!(lines.len(), 40);
    assert_eq!(counts.len(), 2, "both backends get connections: {counts:?}");
    // A dual-stack socket to the ClusterIP's IPv4-mapped address is placed the same way (the
    // IPv6 hooks), and its peer reads as the mapped ClusterIP.
    let mapped = v4_mapped(cluster_ip, 80);
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &client.ns, "tcp6", 10, tcp_frontend),
        mapped,
        "an IPv6 socket to the IPv4-mapped ClusterIP",
    );
    const TCP: u8 = 6;
    const UDP: u8 = 17;
    assert_eq!(
        translated_flows(&root, &client.ip, cluster_ip, TCP),
        0,
        "no TCP flow of the cgroup's sockets is translated per packet"
    );
    for line in sockclient(Some(cgroup.path()), &client.ns, "udp", 10, udp_frontend) {
        let fields: Vec<&str> = line.split(' ').collect();
        assert!(
            fields.len() == 4 && fields[0] == "udp" && names.contains(&fields[1]),
            "a datagram from the cgroup got no backend's answer: {line}"
        );
        assert_eq!(
            fields[2],
            udp_frontend.to_string(),
            "recvfrom shows the ClusterIP: {line}"
        );
        assert_eq!(
            fields[3],
            udp_frontend.to_string(),
            "getpeername shows the ClusterIP: {line}"
        );
    }
    let connected_udp = translated_flows(&root, &client.ip, cluster_ip, UDP);
    assert!(
        connected_udp >= 10,
        "the cgroup's connected UDP is translated per packet"
    );
    // Unconnected UDP sockets in the cgroup (`sendto`/`recvfrom`, as musl's resolver asks DNS):
    // each datagram placed at `sendmsg`, one backend for all of a socket's datagrams, the answers
    // read as from the ClusterIP, both backends used over the sockets, nothing translated per
    // packet; each socket's backend is remembered in `sock_dgram4_v1` (read from the pin).
    let mut used = BTreeSet::new();
    for line in sockclient(
        Some(cgroup.path()),
        &client.ns,
        "udp-sendto",
        20,
        udp_frontend,
    ) {
        let (answers, sources) = datagram_answers(&line);
        assert!(
            names.contains(&answers[0].as_str()) && answers.iter().all(|a| *a == answers[0]),
            "one backend answers all of a socket's datagrams: {line}"
        );
        assert!(
            sources.iter().all(|s| *s == udp_frontend.to_string()),
            "recvfrom shows the ClusterIP: {line}"
        );
        used.insert(answers[0].clone());
    }
    assert_eq!(used.len(), 2, "both backends answer the sockets: {used:?}");
    let mapped_udp = v4_mapped(cluster_ip, 53);
    for line in sockclient(
        Some(cgroup.path()),
        &client.ns,
        "udp6-sendto",
        5,
        udp_frontend,
    ) {
        let (answers, sources) = datagram_answers(&line);
        assert!(names.contains(&answers[0].as_str()), "{line}");
        assert!(
            sources.iter().all(|s| *s == mapped_udp.to_string()),
            "an IPv6 socket's recvfrom shows the mapped ClusterIP: {line}"
        );
    }
    assert_eq!(
        translated_flows(&root, &client.ip, cluster_ip, UDP),
        connected_udp,
        "no datagram of the cgroup's unconnected sockets is translated per packet"
    );
    assert!(
        remembered_datagrams(&root, cluster_ip) >= 25,
        "each unconnected socket's backend is in sock_dgram4_v1"
    );
    // The node's own unconnected socket in the cgroup reaches the UDP Service; outside the cgroup
    // nothing answers it (the control), and the pod's datagrams outside the cgroup are translated
    // per packet (the control of the count above), answered from the ClusterIP too.
    let from_node = sockclient(Some(cgroup.path()), &node, "udp-sendto", 2, udp_frontend);
    assert!(
        from_node.iter().all(|l| l.starts_with("udp sock-")) && from_node.len() == 2,
        "the node's unconnected socket in the cgroup: {from_node:?}"
    );
    let outside = sockclient(None, &node, "udp-sendto", 1, udp_frontend);
    assert!(
        outside.len() == 1 && outside[0].starts_with("udp-error"),
        "outside the cgroup nothing answers the node's datagram: {outside:?}"
    );
    for line in sockclient(None, &client.ns, "udp-sendto", 2, udp_frontend) {
        let (_, sources) = datagram_answers(&line);
        assert!(
            sources.iter().all(|s| *s == udp_frontend.to_string()),
            "{line}"
        );
    }
    assert!(
        translated_flows(&root, &client.ip, cluster_ip, UDP) >= connected_udp + 2,
        "the pod's unconnected sockets outside the cgroup are translated per packet"
    );

    // `sessionAffinity: ClientIP`: placed at connect by the client's network namespace — all of
    // a pod's connections on one backend (the plain frontend above spread over both: the
    // control), none translated per packet, the memory in `sock_affin4_v1` (read from the pin).
    let sticky_ip = "10.96.0.32";
    write_atomically(
        &dirs.path("policies").join("web-sticky.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: web-sticky, namespace: default}}\n\
             spec:\n  clusterIP: {sticky_ip}\n  sessionAffinity: ClientIP\n\
             \x20 ports: [{{name: tcp, port: 80, protocol: TCP, targetPort: {TCP_PORT}}}]\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: web-sticky-1, namespace: default, labels: {{kubernetes.io/service-name: web-sticky}}}}\n\
             addressType: IPv4\nports: [{{name: tcp, port: {TCP_PORT}, protocol: TCP}}]\n\
             endpoints:\n{lb_endpoints}"
        ),
    );
    wait_listed(&agent, "web-sticky", sticky_ip, &want);
    let sticky: SocketAddr = format!("{sticky_ip}:80").parse().expect("frontend");
    let lines = sockclient(Some(cgroup.path()), &client.ns, "tcp", 20, sticky);
    let answered: BTreeSet<&str> = lines
        .iter()
        .map(|l| l.split(' ').nth(1).unwrap_or("none"))
        .collect();
    assert!(
        answered.len() == 1 && names.iter().any(|n| answered.contains(n)),
        "a pod's connections to a ClientIP frontend all reach one backend: {lines:?}"
    );
    reaches_a_backend_through(lines, sticky, "a ClientIP frontend from the cgroup");
    assert_eq!(
        translated_flows(&root, &client.ip, sticky_ip, TCP),
        0,
        "no connection to the ClientIP frontend from the cgroup is translated per packet"
    );
    assert_eq!(
        remembered_affinities(&root),
        1,
        "the pod's namespace's choice is in sock_affin4_v1"
    );

    // The `Local` load balancer's address: placed at connect over every ready backend (the
    // frontend's pods' scope), from a pod and from the node.
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &client.ns, "tcp", 10, lb_frontend),
        lb_frontend,
        "a pod to a Local load balancer's address",
    );
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &node, "tcp", 3, lb_frontend),
        lb_frontend,
        "the node to a Local load balancer's address",
    );
    assert_eq!(
        translated_flows(&root, &client.ip, lb_ip, TCP),
        0,
        "no TCP flow to the Local address from the cgroup is translated per packet"
    );

    // The web-lb NodePort on one of the node's own addresses and on loopback, from the node's
    // processes in the cgroup (host networking: kube-proxy serves them, and no program sees what
    // the node sends itself) and from a pod in it: placed at connect over every ready backend
    // (the NodePort is `Local`; local processes get the pods' scope, as kube-proxy gives them),
    // the peer shown as the address and NodePort dialled.
    node.exec(&["ip", "addr", "add", &format!("{NODE_ADDR}/32"), "dev", "lo"]);
    let node_port: SocketAddr = format!("{NODE_ADDR}:30480").parse().expect("NodePort");
    let loopback_port: SocketAddr = "127.0.0.1:30480".parse().expect("NodePort");
    // Control first (and the wait for the address to be the node's): outside the cgroup the
    // node's connection reaches its own stack, where nothing listens.
    let lines = sockclient(None, &node, "tcp", 1, node_port);
    assert!(
        lines.len() == 1 && lines[0].starts_with("tcp-error"),
        "from the node outside the cgroup nothing answers its NodePort: {lines:?}"
    );
    wait_for("the node's new address to be served as a NodePort", || {
        sockclient(Some(cgroup.path()), &node, "tcp", 1, node_port)
            .first()
            .is_some_and(|l| l.starts_with("tcp sock-"))
    });
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &node, "tcp", 5, node_port),
        node_port,
        "the node to a NodePort on its own address",
    );
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &node, "tcp", 5, loopback_port),
        loopback_port,
        "the node to a NodePort on loopback",
    );
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &client.ns, "tcp", 5, node_port),
        node_port,
        "a pod to a NodePort on its node's address",
    );
    assert_eq!(
        translated_flows(&root, &client.ip, NODE_ADDR, TCP),
        0,
        "no TCP flow of the cgroup's sockets to the NodePort is translated per packet"
    );
    // A port in the NodePort range that no Service has stays the node's own (refused).
    let lines = sockclient(
        Some(cgroup.path()),
        &node,
        "tcp",
        1,
        format!("{NODE_ADDR}:30481").parse().expect("address"),
    );
    assert!(
        lines.len() == 1 && lines[0].starts_with("tcp-error"),
        "a port no NodePort has is not placed: {lines:?}"
    );
    // Positive control of the count: the pod outside the cgroup is translated per packet.
    reaches_a_backend_through(
        sockclient(None, &client.ns, "tcp", 2, node_port),
        node_port,
        "a pod to a NodePort on its node's address outside the cgroup",
    );
    assert!(
        translated_flows(&root, &client.ip, NODE_ADDR, TCP) >= 2,
        "the pod's flows to the NodePort outside the cgroup are translated per packet"
    );

    // The node's own processes (host networking) in the cgroup reach the Service as well, which
    // the per-packet path never served (no program translates what the node itself sends); from
    // outside the cgroup the node's connection finds no route to the ClusterIP (the control).
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &node, "tcp", 5, tcp_frontend),
        tcp_frontend,
        "from the node in the cgroup",
    );
    let lines = sockclient(None, &node, "tcp", 1, tcp_frontend);
    assert!(
        lines.len() == 1 && lines[0].starts_with("tcp-error"),
        "from the node outside the cgroup nothing answers the ClusterIP: {lines:?}"
    );

    // Positive control: the same client outside the cgroup is translated per packet.
    reaches_a_backend_through(
        sockclient(None, &client.ns, "tcp", 5, tcp_frontend),
        tcp_frontend,
        "outside the cgroup",
    );
    let outside = translated_flows(&root, &client.ip, cluster_ip, TCP);
    assert!(
        outside >= 5,
        "the client's flows outside the cgroup are translated per packet ({outside})"
    );
    reaches_a_backend_through(
        sockclient(None, &client.ns, "tcp", 2, lb_frontend),
        lb_frontend,
        "to the Local address outside the cgroup",
    );
    assert!(
        translated_flows(&root, &client.ip, lb_ip, TCP) >= 2,
        "the client's flows to the Local address outside the cgroup are translated per packet"
    );

    // Restarted with the flag: the new links replace the old ones (each program attached once)
    // and the cgroup's connections are still placed at connect.
    drop(agent);
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &socket_lb_flags);
    assert_eq!(
        cgroup.attached(),
        programs,
        "each socket LB program attached once after a restart"
    );
    wait_listed(&agent, "web", cluster_ip, &want);
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &client.ns, "tcp", 5, tcp_frontend),
        tcp_frontend,
        "after a restart",
    );
    assert_eq!(
        translated_flows(&root, &client.ip, cluster_ip, TCP),
        outside,
        "after a restart the cgroup's TCP flows are still placed at connect"
    );

    // Restarted with `--socket-lb-scope host`: only the node's own namespace's sockets are
    // placed (read from outside: `sock_cfg_v1` holds a namespace cookie); a pod's connections in
    // the cgroup are translated per packet, as for a service mesh's sidecar; the node's own in
    // the cgroup still reach the Service (the per-packet path never serves them).
    drop(agent);
    let host_only = [&socket_lb_flags[..], &["--socket-lb-scope", "host"]].concat();
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &host_only);
    let status: Value = agent
        .api(hyper::Method::GET, "/v1/status", None)
        .expect("GET /v1/status");
    assert_eq!(
        status["socket_lb_scope"], "host",
        "the status names the scope"
    );
    assert_ne!(
        socket_lb_netns_cookie(&root),
        0,
        "sock_cfg_v1 names the node's network namespace"
    );
    wait_listed(&agent, "web", cluster_ip, &want);
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &client.ns, "tcp", 5, tcp_frontend),
        tcp_frontend,
        "a pod in the cgroup, host scope",
    );
    let pods_per_packet = translated_flows(&root, &client.ip, cluster_ip, TCP);
    assert!(
        pods_per_packet >= outside + 5,
        "with the host scope a pod's flows are translated per packet ({outside} → {pods_per_packet})"
    );
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &node, "tcp", 3, tcp_frontend),
        tcp_frontend,
        "the node in the cgroup, host scope",
    );

    // Restarted without the flag: detached, and the cgroup's connections translated per packet.
    drop(agent);
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &keep_closed);
    assert!(
        cgroup.attached().is_empty(),
        "socket LB detached without the flag"
    );
    let status: Value = agent
        .api(hyper::Method::GET, "/v1/status", None)
        .expect("GET /v1/status");
    assert!(
        status["socket_lb"].is_null(),
        "the status says socket LB is off"
    );
    wait_listed(&agent, "web", cluster_ip, &want);
    reaches_a_backend_through(
        sockclient(Some(cgroup.path()), &client.ns, "tcp", 5, tcp_frontend),
        tcp_frontend,
        "without socket LB",
    );
    let after = translated_flows(&root, &client.ip, cluster_ip, TCP);
    assert!(
        after >= pods_per_packet + 5,
        "without socket LB the cgroup's flows are translated per packet ({pods_per_packet} → {after})"
    );
}
