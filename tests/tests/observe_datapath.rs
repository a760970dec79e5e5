//! Datapath observability against real traffic through a real agent:
//! - a policy rule's hit counter rises by exactly the packets it decided (one per new flow on the
//!   isolated side; the established packets of a flow are not counted), in `weir policy get` and
//!   `/metrics`, and a denied attempt shows in `/metrics` as `weir_drop_count_total` by reason;
//! - `weir policy trace` through the loaded programs agrees with real traffic for 50 cases: 48
//!   generated from the policies (every ordered pod pair × every served port, IPv4 and IPv6, TCP
//!   and UDP) with each side's verdict and deciding rule computed by `tests::netpol`'s model and
//!   asserted, a spoofed source and a conntrack-established reply; it says when the user-space
//!   explanation disagrees, and leaves conntrack and the counters untouched.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;
use tests::{
    agent_proc::AgentProcess,
    netpol::{Labels, Model, ModelPod, Proto, Side, labels},
    observe::{Pod, metric, node_and_agent, pod, start_agent, weir, weir_json},
    privileged::require_root,
};

fn tcp_connects(from: &Pod<'_>, to: IpAddr, port: u16) -> bool {
    let addr = SocketAddr::new(to, port);
    from.ns
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(700)).is_ok())
}

/// Sends one datagram from a fresh socket (a new flow) and says whether `receiver` got it.
fn udp_delivers(
    from: &Pod<'_>,
    bind: Option<IpAddr>,
    to: SocketAddr,
    receiver: &UdpSocket,
) -> bool {
    let token: [u8; 10] = rand_token();
    let sent = from.ns.run(|| {
        let local = SocketAddr::new(
            bind.unwrap_or(if to.is_ipv4() {
                IpAddr::from([0, 0, 0, 0])
            } else {
                IpAddr::from([0u16; 8])
            }),
            0,
        );
        let s = UdpSocket::bind(local).expect("udp socket");
        s.send_to(&token, to).is_ok()
    });
    assert!(sent, "send to {to}");
    receiver
        .set_read_timeout(Some(Duration::from_millis(700)))
        .expect("timeout");
    let deadline = Instant::now() + Duration::from_millis(700);
    let mut buf = [0u8; 64];
    while Instant::now() < deadline {
        match receiver.recv_from(&mut buf) {
            Ok((n, _)) if buf[..n] == token => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

fn rand_token() -> [u8; 10] {
    let mut t = [0u8; 10];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut t))
        .expect("random");
    t
}

/// (packets, bytes) of `policy`'s rule `index` in `weir policy get`.
fn rule_hits(agent: &AgentProcess, policy: &str, direction: &str, index: u64) -> (u64, u64) {
    let rules = weir_json(agent, &["policy", "get", policy]);
    let r = rules
        .as_array()
        .expect("list")
        .iter()
        .find(|r| r["direction"] == direction && r["index"] == index)
        .unwrap_or_else(|| panic!("{policy} {direction}[{index}] in {rules}"))
        .clone();
    (
        r["packets"].as_u64().expect("packets"),
        r["bytes"].as_u64().expect("bytes"),
    )
}

fn wait_until(what: &str, ok: impl FnMut() -> bool) {
    tests::wait::until(what, Duration::from_secs(15), ok);
}

const WEB_POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}}]\n    ports: [{protocol: TCP, port: 8080}, {protocol: UDP, port: 9000}]\n";
const OTHER_POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: other-egress, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: other}}\n  policyTypes: [Egress]\n  egress:\n  - to: [{podSelector: {matchLabels: {app: web}}}]\n    ports: [{protocol: TCP, port: 8081}]\n";

#[test]
fn rule_hits_count_the_packets_a_rule_decided_and_metrics_show_drops_by_reason() {
    if !require_root("rule_hits_count_the_packets_a_rule_decided_and_metrics_show_drops_by_reason")
    {
        return;
    }
    let (root, dirs, node) = node_and_agent();
    let agent = start_agent(&root, &dirs, &node);
    let web = pod(&node, &agent, "web", "web");
    let client = pod(&node, &agent, "client", "client");
    let other = pod(&node, &agent, "other", "other");
    let receiver = web
        .ns
        .run(|| UdpSocket::bind("0.0.0.0:9000").expect("udp 9000"));
    let _tcp = web
        .ns
        .run(|| TcpListener::bind("[::]:8080").expect("tcp 8080"));
    std::fs::write(dirs.path("policies").join("web.yaml"), WEB_POLICY).expect("policy");
    let to = SocketAddr::new(web.ip, 9000);
    wait_until("web admits client's tcp 8080 and keeps other out", || {
        tcp_connects(&client, web.ip, 8080) && !tcp_connects(&other, web.ip, 8080)
    });

    let before = rule_hits(&agent, "default/web", "ingress", 0);
    // Seven new flows (a fresh socket each): each first packet is decided by the rule.
    const NEW_FLOWS: u64 = 7;
    for _ in 0..NEW_FLOWS {
        assert!(
            udp_delivers(&client, None, to, &receiver),
            "client's datagram reaches web"
        );
    }
    let after_new = rule_hits(&agent, "default/web", "ingress", 0);
    assert_eq!(
        after_new.0 - before.0,
        NEW_FLOWS,
        "one hit per new flow: before {before:?}, after {after_new:?}"
    );
    // 14 Ethernet + 20 IPv4 + 8 UDP + 10 payload bytes each, as to_endpoint sees them.
    assert_eq!(
        after_new.1 - before.1,
        NEW_FLOWS * 52,
        "bytes of the decided packets"
    );

    // One more flow carrying six datagrams: the rule decides its first only, conntrack the rest.
    let flow = client
        .ns
        .run(|| UdpSocket::bind("0.0.0.0:0").expect("udp socket"));
    receiver
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    for _ in 0..6 {
        flow.send_to(b"0123456789", to).expect("send");
        let mut buf = [0u8; 16];
        let (n, _) = receiver
            .recv_from(&mut buf)
            .expect("the flow's datagram arrives");
        assert_eq!(n, 10);
    }
    let after_flow = rule_hits(&agent, "default/web", "ingress", 0);
    assert_eq!(
        after_flow.0 - after_new.0,
        1,
        "an established flow's packets are not the rule's: {after_new:?} -> {after_flow:?}"
    );

    // /metrics: the same rule counter, and the drop of a denied attempt by reason.
    let rule_metric =
        "weir_policy_rule_packets_total{policy=\"default/web\",direction=\"ingress\",rule=\"0\"}";
    assert_eq!(
        metric(&node, rule_metric),
        after_flow.0,
        "/metrics carries the rule's hits"
    );
    let denied_metric = "weir_drop_count_total{reason=\"policy-denied\",direction=\"to-endpoint\"}";
    let denied_before = metric(&node, denied_metric);
    let forward_metric = "weir_forward_count_total{direction=\"to-endpoint\"}";
    let forward_before = metric(&node, forward_metric);
    assert!(
        forward_before > 0,
        "passed packets are counted as forwarded"
    );
    assert!(
        !udp_delivers(&other, None, to, &receiver),
        "other's datagram is denied"
    );
    wait_until("the denied datagram shows in /metrics by reason", || {
        metric(&node, denied_metric) > denied_before
    });
    assert_eq!(
        rule_hits(&agent, "default/web", "ingress", 0).0,
        after_flow.0,
        "a denial no rule decided is no rule's hit"
    );
    // Positive control for the text table too.
    let table = String::from_utf8_lossy(&weir(&agent, &["policy", "list"]).stdout).into_owned();
    assert!(table.contains("default/web"), "{table}");
    assert!(agent.terminate().success());
}

/// The model's view of a test pod (namespace `default`, label `app` = its name).
fn model_pod(p: &Pod<'_>) -> ModelPod {
    ModelPod {
        namespace: "default".into(),
        labels: labels(&[("app", p.name.as_str())]),
    }
}

fn verdict(allowed: bool) -> &'static str {
    if allowed { "allow" } else { "deny" }
}

/// Every (protocol, port) a rule of the model's policies names.
fn policy_ports(model: &Model) -> BTreeSet<(Proto, u16)> {
    let mut ports = BTreeSet::new();
    for policy in &model.policies {
        let spec = policy.spec.as_ref().expect("spec");
        let rules = spec
            .ingress
            .iter()
            .flatten()
            .filter_map(|r| r.ports.as_ref())
            .chain(
                spec.egress
                    .iter()
                    .flatten()
                    .filter_map(|r| r.ports.as_ref()),
            );
        for p in rules.flatten() {
            let proto = match p.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => Proto::Tcp,
                "UDP" => Proto::Udp,
                other => panic!("the test's policies name no {other} port"),
            };
            let Some(IntOrString::Int(port)) = p.port else {
                panic!("the test's policies name numeric ports");
            };
            ports.insert((proto, u16::try_from(port).expect("a port")));
        }
    }
    ports
}

/// One traced case and how real traffic went.
struct Case {
    what: String,
    real: bool,
    trace: Value,
}

#[expect(
    clippy::too_many_lines,
    reason = "one scenario: 50 cases in packet order"
)]
#[test]
fn kernel_trace_agrees_with_real_traffic() {
    if !require_root("kernel_trace_agrees_with_real_traffic") {
        return;
    }
    let (root, dirs, node) = node_and_agent();
    let agent = start_agent(&root, &dirs, &node);
    let web = pod(&node, &agent, "web", "web");
    let client = pod(&node, &agent, "client", "client");
    let other = pod(&node, &agent, "other", "other");
    let pods = [&web, &client, &other];
    // Every pod listens on TCP 8080, 8081 and UDP 9000, 9001 (IPv4 and IPv6).
    let mut listeners = Vec::new();
    let mut udp = std::collections::HashMap::new();
    for p in pods {
        for port in [8080u16, 8081] {
            listeners.push(p.ns.run(move || {
                TcpListener::bind(SocketAddr::new(IpAddr::from([0u16; 8]), port)).expect("tcp")
            }));
        }
        for port in [9000u16, 9001] {
            let s = p.ns.run(move || {
                UdpSocket::bind(SocketAddr::new(IpAddr::from([0u16; 8]), port)).expect("udp")
            });
            udp.insert((p.name.clone(), port), s);
        }
    }
    std::fs::write(dirs.path("policies").join("web.yaml"), WEB_POLICY).expect("policy");
    std::fs::write(dirs.path("policies").join("other.yaml"), OTHER_POLICY).expect("policy");
    wait_until("both policies are in force", || {
        tcp_connects(&client, web.ip, 8080)
            && !tcp_connects(&other, web.ip, 8080)
            && !tcp_connects(&other, client.ip, 8080)
    });

    let trace = |src: IpAddr, dst: IpAddr, proto: &str, port: u16, extra: &[&str]| -> Value {
        let (s, d, p) = (src.to_string(), dst.to_string(), port.to_string());
        let mut args = vec![
            "policy",
            "trace",
            "--src",
            &s,
            "--dst",
            &d,
            "--protocol",
            proto,
            "--port",
            &p,
        ];
        args.extend(extra);
        weir_json(&agent, &args)
    };
    // New flows generated from the policies: every ordered pod pair × every port the pods serve
    // (each port a policy names, and UDP 9001, which none names) × IPv4 and IPv6, each with the
    // verdict and the deciding rule of each side as the model computes them from the policies.
    let model = Model {
        namespaces: BTreeMap::from([("default".to_owned(), Labels::new())]),
        policies: [WEB_POLICY, OTHER_POLICY]
            .iter()
            .map(|text| serde_norway::from_str(text).expect("the test's policy parses"))
            .collect(),
        ..Model::default()
    };
    let served = [
        (Proto::Tcp, 8080u16),
        (Proto::Tcp, 8081),
        (Proto::Udp, 9000),
        (Proto::Udp, 9001),
    ];
    let named = policy_ports(&model);
    assert!(
        named.len() == 3 && named.iter().all(|p| served.contains(p)),
        "the pods serve every port the policies name: {named:?}"
    );
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    for v6 in [false, true] {
        for from in pods {
            for to in pods.iter().filter(|to| to.name != from.name) {
                for (proto, port) in served {
                    let (src, dst) = if v6 {
                        (from.ip6, to.ip6)
                    } else {
                        (from.ip, to.ip)
                    };
                    let tcp = proto == Proto::Tcp;
                    let real = if tcp {
                        tcp_connects(from, dst, port)
                    } else {
                        udp_delivers(
                            from,
                            None,
                            SocketAddr::new(dst, port),
                            &udp[&(to.name.clone(), port)],
                        )
                    };
                    let name = if tcp { "tcp" } else { "udp" };
                    cases.push(Case {
                        what: format!(
                            "{} -> {} {name} {port} ({src} -> {dst})",
                            from.name, to.name
                        ),
                        real,
                        trace: trace(src, dst, name, port, &[]),
                    });
                    expected.push(model.sides(&model_pod(from), &model_pod(to), proto, port));
                }
            }
        }
    }
    assert_eq!(cases.len(), 48);
    // A spoofed source: client sends from an address that is not its own, to `other`, which no
    // policy isolates for ingress (so policy alone would allow it).
    let spoofed: IpAddr = "10.99.0.5".parse().expect("ip");
    client
        .ns
        .exec(&["ip", "addr", "add", "10.99.0.5/32", "dev", "eth0"]);
    let real = udp_delivers(
        &client,
        Some(spoofed),
        SocketAddr::new(other.ip, 9000),
        &udp[&("other".to_owned(), 9000)],
    );
    let t = trace(
        spoofed,
        other.ip,
        "udp",
        9000,
        &["--from-endpoint", "default/client"],
    );
    cases.push(Case {
        what: "client -> other udp 9000 from a spoofed source".into(),
        real,
        trace: t.clone(),
    });
    assert_eq!(t["kernel"]["steps"][0]["reason"], "spoofed-source", "{t}");
    assert_eq!(
        t["kernel"]["agrees"], false,
        "user space does not model anti-spoofing: {t}"
    );

    // A conntrack-established reply: web opens TCP to other:8080; other's reply leaves other
    // (egress-isolated, no rule for it) and enters web (ingress-isolated, no rule for it).
    let stream = web
        .ns
        .run(|| {
            TcpStream::connect_timeout(&SocketAddr::new(other.ip, 8080), Duration::from_secs(2))
        })
        .expect("web reaches other");
    let web_port = stream.local_addr().expect("local").port();
    // other's 8080 backlog also holds the cases' earlier connections: take this one.
    let other_listener = &listeners[4];
    let mut server = loop {
        let (s, peer) = other_listener.accept().expect("accept");
        if peer.ip().to_canonical() == web.ip && peer.port() == web_port {
            break s;
        }
    };
    server.write_all(b"reply").expect("write reply");
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut buf = [0u8; 5];
    let real = (&stream).read_exact(&mut buf).is_ok() && &buf == b"reply";
    let sport = "8080";
    let t = trace(
        other.ip,
        web.ip,
        "tcp",
        web_port,
        &["--src-port", sport, "--tcp-flags", "ack"],
    );
    cases.push(Case {
        what: format!("other:8080 -> web:{web_port} reply of an established flow"),
        real,
        trace: t.clone(),
    });
    assert!(
        t["kernel"]["steps"]
            .as_array()
            .is_some_and(|s| s.len() == 2 && s.iter().all(|s| s["reason"] == "pass-established")),
        "the reply passes on conntrack on both sides: {t}"
    );
    assert_eq!(
        t["verdict"], "deny",
        "policy alone would deny the reply: {t}"
    );
    assert_eq!(t["kernel"]["agrees"], false, "{t}");

    // The kernel's verdict is real traffic's, case by case.
    assert_eq!(cases.len(), 50);
    let mut report = String::new();
    for c in &cases {
        let kernel = c.trace["kernel"]["verdict"].as_str().unwrap_or("none");
        report.push_str(&format!("{}: real {} kernel {kernel}\n", c.what, c.real));
    }
    eprintln!("{report}");
    for c in &cases {
        assert_eq!(
            c.trace["kernel"]["verdict"] == "allow",
            c.real,
            "{}: the kernel trace disagrees with real traffic:\n{}\nall cases:\n{report}",
            c.what,
            c.trace
        );
    }
    let allows = cases.iter().filter(|c| c.real).count();
    assert!(
        allows >= 6 && cases.len() - allows >= 6,
        "both outcomes are exercised:\n{report}"
    );
    // Each generated case: the model's verdict, and each program's step as the model has that
    // side decide it (the deciding rule named, or none), the user-space explanation agreeing.
    let mut outcomes = BTreeMap::new();
    for (c, sides) in cases.iter().zip(&expected) {
        let t = &c.trace;
        let allowed = sides.iter().all(|s| *s != Side::Denied);
        assert_eq!(
            c.real, allowed,
            "{}: the model disagrees with real traffic: {t}",
            c.what
        );
        assert_eq!(
            t["verdict"],
            verdict(allowed),
            "{}: user space: {t}",
            c.what
        );
        assert_eq!(t["kernel"]["agrees"], true, "{}: {t}", c.what);
        let steps = t["kernel"]["steps"].as_array().cloned().unwrap_or_default();
        // The programs stop at the first drop.
        let ran = if sides[0] == Side::Denied { 1 } else { 2 };
        assert_eq!(steps.len(), ran, "{}: steps: {t}", c.what);
        for ((step, side), program) in steps
            .iter()
            .zip(sides)
            .zip(["from_endpoint", "to_endpoint"])
        {
            assert_eq!(step["program"], program, "{}: {t}", c.what);
            let (want_verdict, want_reason) = match side {
                Side::NotIsolated => ("allow", "pass"),
                Side::Allowed(_) => ("allow", "pass-policy"),
                Side::Denied => ("deny", "policy-denied"),
            };
            assert_eq!(step["verdict"], want_verdict, "{}: {program}: {t}", c.what);
            assert_eq!(step["reason"], want_reason, "{}: {program}: {t}", c.what);
            match side {
                Side::Allowed(rules) => {
                    assert_eq!(rules.len(), 1, "{}: one rule admits it: {rules:?}", c.what);
                    assert_eq!(
                        step["rule"],
                        rules[0].as_str(),
                        "{}: {program}: {t}",
                        c.what
                    );
                    assert_ne!(step["rule_id"], 0, "{}: {program}: {t}", c.what);
                }
                Side::NotIsolated | Side::Denied => {
                    assert!(
                        step.get("rule").is_none(),
                        "{}: {program} names no rule: {t}",
                        c.what
                    );
                    assert_eq!(step["rule_id"], 0, "{}: {program}: {t}", c.what);
                }
            }
            *outcomes.entry((program, want_reason)).or_insert(0) += 1;
        }
    }
    // Every kind of step is exercised on both sides where the policies make it possible.
    for kind in [
        ("from_endpoint", "pass"),
        ("from_endpoint", "pass-policy"),
        ("from_endpoint", "policy-denied"),
        ("to_endpoint", "pass"),
        ("to_endpoint", "pass-policy"),
        ("to_endpoint", "policy-denied"),
    ] {
        assert!(
            outcomes.contains_key(&kind),
            "no case has {kind:?}: {outcomes:?}"
        );
    }

    // Trace runs write nothing: no conntrack entry with the trace's source port 40000, and the
    // denial counter moves only for a real denied packet (the positive control).
    let ct = weir_json(&agent, &["bpf", "ct", "list"]);
    assert!(
        !ct.to_string().contains(":40000"),
        "a trace run created a conntrack entry: {ct}"
    );
    assert!(
        ct.as_array().is_some_and(|a| !a.is_empty()),
        "real flows are in conntrack (control): {ct}"
    );
    let denied = "weir_drop_count_total{reason=\"policy-denied\",direction=\"to-endpoint\"}";
    let before = metric(&node, denied);
    for _ in 0..5 {
        let t = trace(other.ip, web.ip, "tcp", 8081, &[]);
        assert_eq!(t["kernel"]["verdict"], "deny");
    }
    assert_eq!(metric(&node, denied), before, "trace runs are not counted");
    assert!(!tcp_connects(&other, web.ip, 8081));
    wait_until("a real denied attempt is counted", || {
        metric(&node, denied) > before
    });

    // The table output shows both explanations and says when they disagree.
    let out = weir(
        &agent,
        &[
            "policy",
            "trace",
            "--src",
            "10.99.0.5",
            "--dst",
            &other.ip.to_string(),
            "--protocol",
            "udp",
            "--port",
            "9000",
            "--from-endpoint",
            "default/client",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("kernel (the loaded programs"), "{text}");
    assert!(
        text.contains("spoofed-source") && text.contains("DISAGREE"),
        "{text}"
    );
    drop(stream);
    drop(server);
    assert!(agent.terminate().success());
}
