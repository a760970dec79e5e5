use k8s_openapi::{
    api::{
        core::v1::{Namespace, Node, Pod as K8sPod},
        networking::v1::NetworkPolicy,
    },
    serde::de::DeserializeOwned,
};

use super::*;

fn object<T: DeserializeOwned>(yaml: &str) -> T {
    serde_norway::from_str(yaml).expect("valid test object")
}

fn np(spec: &str) -> NetworkPolicy {
    object(&format!(
        "kind: NetworkPolicy\nmetadata: {{name: p, namespace: prod}}\nspec: {spec}\n"
    ))
}

fn err(spec: &str) -> String {
    policy(&np(spec)).expect_err(spec).to_string()
}

#[test]
fn policy_types_default_as_the_api_server_does() {
    // SetDefaults_NetworkPolicy: Ingress always; Egress when len(egress) > 0.
    let types = |spec: &str| {
        let p = policy(&np(spec)).expect(spec);
        (p.ingress_isolated, p.egress_isolated)
    };
    assert_eq!(types("{podSelector: {}}"), (true, false));
    assert_eq!(
        types("{podSelector: {}, egress: []}"),
        (true, false),
        "an empty list is no egress"
    );
    assert_eq!(types("{podSelector: {}, egress: [{}]}"), (true, true));
    assert_eq!(
        types("{podSelector: {}, ingress: [], egress: [{}]}"),
        (true, true)
    );
    assert_eq!(
        types("{podSelector: {}, policyTypes: [], egress: [{}]}"),
        (true, true),
        "empty types are defaulted too"
    );
    assert_eq!(
        types("{podSelector: {}, policyTypes: [Egress]}"),
        (false, true)
    );
    assert_eq!(
        types("{podSelector: {}, policyTypes: [Ingress, Egress]}"),
        (true, true)
    );
    assert_eq!(
        types("{podSelector: {}, policyTypes: [Ingress], egress: [{}]}"),
        (true, false)
    );
}

#[test]
fn a_policy_converts_with_numbered_and_named_ports() {
    let p = policy(&np(
        "{podSelector: {matchLabels: {app: web}}, ingress: [{from: [{podSelector: {}}], ports: [{port: 80}, {protocol: UDP, port: 5000, endPort: 5010}, {port: http}, {protocol: SCTP, port: \"81\"}]}]}",
    ))
    .expect("valid");
    assert_eq!((p.namespace.as_str(), p.name.as_str()), ("prod", "p"));
    let rule = &p.ingress[0];
    assert_eq!(
        rule.ports,
        vec![
            PortSpec {
                protocol: 6,
                port: Some(80),
                end_port: None
            },
            PortSpec {
                protocol: 17,
                port: Some(5000),
                end_port: Some(5010)
            },
            PortSpec {
                protocol: 132,
                port: Some(81),
                end_port: None
            },
        ]
    );
    assert_eq!(
        rule.named_ports,
        vec![NamedPortRef {
            protocol: 6,
            name: "http".into()
        }]
    );
    assert!(!rule.all_ports());
    let open = policy(&np("{podSelector: {}, ingress: [{}]}")).expect("valid");
    assert!(open.ingress[0].all_ports() && open.ingress[0].peers.is_empty());
    let defaulted: NetworkPolicy =
        object("kind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}}\n");
    assert_eq!(policy(&defaulted).expect("valid").namespace, "default");
}

#[test]
fn bad_policies_name_the_field_and_the_fix() {
    let cases = [
        (
            "{podSelector: {}, ingress: [{ports: [{port: 0}]}]}",
            "spec.ingress[0].ports[0].port: port 0 is not between 1 and 65535",
        ),
        (
            "{podSelector: {}, egress: [{ports: [{port: 70000}]}]}",
            "spec.egress[0].ports[0].port: port 70000",
        ),
        (
            "{podSelector: {}, ingress: [{ports: [{port: 80, endPort: 79}]}]}",
            "spec.ingress[0].ports[0].endPort: endPort 79 must be between port",
        ),
        (
            "{podSelector: {}, ingress: [{ports: [{endPort: 79}]}]}",
            "endPort needs port",
        ),
        (
            "{podSelector: {}, ingress: [{ports: [{port: http, endPort: 90}]}]}",
            "endPort needs a numbered port",
        ),
        (
            "{podSelector: {}, ingress: [{ports: [{port: Http}]}]}",
            "may contain only a-z",
        ),
        (
            "{podSelector: {}, ingress: [{ports: [{port: a-very-long-port-name}]}]}",
            "1 to 15 characters",
        ),
        (
            "{podSelector: {}, ingress: [{ports: [{port: -web}]}]}",
            "must not begin or end",
        ),
        (
            "{podSelector: {}, ingress: [{ports: [{protocol: ICMP}]}]}",
            "spec.ingress[0].ports[0].protocol: \"ICMP\" is not TCP, UDP or SCTP",
        ),
        (
            "{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: nope}}]}]}",
            "spec.ingress[0].from[0].ipBlock.cidr: \"nope\" is not a CIDR",
        ),
        (
            "{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}",
            "except[0]: 11.0.0.0/16 must be a strictly smaller prefix inside 10.0.0.0/8",
        ),
        (
            "{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]}",
            "spec.egress[0].to[0]: ipBlock cannot be combined",
        ),
        (
            "{podSelector: {}, ingress: [{from: [{}]}]}",
            "spec.ingress[0].from[0]: a peer needs",
        ),
        (
            "{podSelector: {}, policyTypes: [Ingress, Sideways]}",
            "spec.policyTypes[1]: \"Sideways\" is not Ingress or Egress",
        ),
        (
            "{podSelector: {matchExpressions: [{key: a, operator: Near}]}}",
            "spec.podSelector: matchExpressions operator \"Near\"",
        ),
        (
            "{podSelector: {}, ingress: [{from: [{namespaceSelector: {matchExpressions: [{key: a, operator: In}]}}]}]}",
            "spec.ingress[0].from[0].namespaceSelector: matchExpressions on \"a\": operator In needs values",
        ),
    ];
    for (spec, needle) in cases {
        let message = err(spec);
        assert!(
            message.contains(needle),
            "{message:?} does not say {needle:?}"
        );
    }
    let nameless: NetworkPolicy =
        object("kind: NetworkPolicy\nmetadata: {}\nspec: {podSelector: {}}\n");
    assert_eq!(
        policy(&nameless).expect_err("no name").to_string(),
        "metadata.name is missing; give the NetworkPolicy a name"
    );
}

#[test]
fn a_namespace_converts() {
    let ns: Namespace = object("kind: Namespace\nmetadata: {name: prod, labels: {team: a}}\n");
    let (name, labels) = namespace(&ns).expect("valid");
    assert_eq!((name.as_str(), labels["team"].as_str()), ("prod", "a"));
    let bare: Namespace = object("kind: Namespace\nmetadata: {name: x}\n");
    assert!(namespace(&bare).expect("valid").1.is_empty());
    let nameless: Namespace = object("kind: Namespace\nmetadata: {labels: {a: b}}\n");
    assert!(
        namespace(&nameless)
            .expect_err("no name")
            .to_string()
            .contains("metadata.name is missing")
    );
}

const POD: &str = r#"
kind: Pod
metadata:
  name: web-1
  namespace: prod
  uid: 1234
  labels: {app: web}
  annotations: {weir.dev/ipv4pools: '["a"]', other.io/x: y}
spec:
  nodeName: node-b
  containers:
  - name: app
    ports:
    - {name: http, containerPort: 8080}
    - {containerPort: 9000}
  - name: side
    ports:
    - {name: dns, containerPort: 53, protocol: UDP}
    - {name: assoc, containerPort: 7000, protocol: SCTP}
status:
  podIP: 10.0.0.9
  podIPs: [{ip: 10.0.0.7}, {ip: "fd00::7"}]
"#;

#[test]
fn a_pod_converts() {
    let p = pod(&object::<K8sPod>(POD)).expect("valid");
    assert_eq!((p.namespace.as_str(), p.name.as_str()), ("prod", "web-1"));
    assert_eq!(p.uid.as_deref(), Some("1234"));
    assert_eq!(p.labels["app"], "web");
    assert_eq!(
        p.ips,
        vec![
            "10.0.0.7".parse::<IpAddr>().expect("ip"),
            "fd00::7".parse().expect("ip")
        ],
        "podIPs win over podIP"
    );
    assert_eq!(p.node.as_deref(), Some("node-b"));
    assert!(!p.host_network);
    assert_eq!(
        p.named_ports,
        vec![
            NamedPort {
                name: "http".into(),
                protocol: 6,
                port: 8080
            },
            NamedPort {
                name: "dns".into(),
                protocol: 17,
                port: 53
            },
            NamedPort {
                name: "assoc".into(),
                protocol: 132,
                port: 7000
            },
        ],
        "unnamed ports are not kept"
    );
    assert_eq!(
        p.annotations.keys().collect::<Vec<_>>(),
        ["weir.dev/ipv4pools"],
        "only weir.dev/ annotations"
    );
    assert_eq!(
        p.resolve(&NamedPortRef {
            protocol: 17,
            name: "dns".into()
        }),
        Some(53)
    );
    assert_eq!(
        p.resolve(&NamedPortRef {
            protocol: 6,
            name: "dns".into()
        }),
        None,
        "the protocol must match"
    );
    let minimal = pod(&object::<K8sPod>("kind: Pod\nmetadata: {name: a}\nspec: {hostNetwork: true, containers: []}\nstatus: {podIP: 10.1.1.1}\n")).expect("valid");
    assert_eq!(minimal.namespace, "default");
    assert!(minimal.host_network && minimal.labels.is_empty());
    assert_eq!(
        minimal.ips,
        vec!["10.1.1.1".parse::<IpAddr>().expect("ip")],
        "podIP when podIPs is absent"
    );
    assert!(
        pod(&object::<K8sPod>("kind: Pod\nmetadata: {name: a}\n"))
            .expect("valid")
            .ips
            .is_empty()
    );
}

#[test]
fn bad_pods_name_the_field() {
    let cases = [
        (
            "metadata: {labels: {a: b}}",
            "metadata.name is missing; give the Pod a name",
        ),
        (
            "metadata: {name: a}\nstatus: {podIP: nope}",
            "status.podIP: \"nope\" is not an IP address",
        ),
        (
            "metadata: {name: a}\nstatus: {podIPs: [{ip: 10.0.0.1}, {ip: 300.0.0.1}]}",
            "status.podIPs[1].ip",
        ),
        (
            "metadata: {name: a}\nspec: {containers: [{name: c, ports: [{containerPort: 0}]}]}",
            "spec.containers[0].ports[0].containerPort: port 0",
        ),
        (
            "metadata: {name: a}\nspec: {containers: [{name: c}, {name: d, ports: [{name: x, containerPort: 80, protocol: ICMP}]}]}",
            "spec.containers[1].ports[0].protocol",
        ),
        (
            "metadata: {name: a}\nspec: {containers: [{name: c, ports: [{name: HTTP, containerPort: 80}]}]}",
            "spec.containers[0].ports[0].name: port name \"HTTP\"",
        ),
    ];
    for (body, needle) in cases {
        let message = pod(&object::<K8sPod>(&format!("kind: Pod\n{body}\n")))
            .expect_err(body)
            .to_string();
        assert!(
            message.contains(needle),
            "{message:?} does not say {needle:?}"
        );
    }
}

#[test]
fn a_node_converts_and_bad_addresses_are_named() {
    let n = node(&object::<Node>(
        "kind: Node\nmetadata: {name: node-b, labels: {zone: z1}}\nstatus: {addresses: [{type: Hostname, address: node-b}, {type: InternalIP, address: 192.0.2.2}, {type: ExternalIP, address: \"2001:db8::2\"}, {type: InternalIP, address: 192.0.2.2}]}\n",
    ))
    .expect("valid");
    assert_eq!(n.name, "node-b");
    assert_eq!(n.labels["zone"], "z1");
    assert_eq!(
        n.addresses,
        vec![
            "192.0.2.2".parse::<IpAddr>().expect("ip"),
            "2001:db8::2".parse().expect("ip")
        ],
        "host names skipped, duplicates once"
    );
    let ordered = node(&object::<Node>(
        "kind: Node\nmetadata: {name: n}\nstatus: {addresses: [{type: ExternalIP, address: 198.51.100.7}, {type: InternalIP, address: \"fd00::7\"}, {type: InternalIP, address: 10.0.0.7}]}\n",
    ))
    .expect("valid");
    assert_eq!(
        ordered.addresses,
        vec![
            "fd00::7".parse::<IpAddr>().expect("ip"),
            "10.0.0.7".parse().expect("ip"),
            "198.51.100.7".parse().expect("ip")
        ],
        "InternalIPs (both families, in order) before ExternalIPs"
    );
    let message = node(&object::<Node>("kind: Node\nmetadata: {name: n}\nstatus: {addresses: [{type: InternalIP, address: bad}]}\n"))
        .expect_err("bad")
        .to_string();
    assert_eq!(
        message,
        "status.addresses[0].address: \"bad\" is not an IP address"
    );
    assert!(
        node(&object::<Node>("kind: Node\nmetadata: {}\n"))
            .expect_err("no name")
            .to_string()
            .contains("give the Node a name")
    );
}

#[test]
fn egress_named_ports_without_peers_go_to_every_pod() {
    let every_pod = Peer::Pods {
        namespaces: Some(Selector::everything()),
        pods: None,
    };
    // Only named ports: the rule's peer becomes every pod of every namespace.
    let p = policy(&np(
        "{podSelector: {}, policyTypes: [Egress], egress: [{ports: [{port: dns, protocol: UDP}]}]}",
    ))
    .expect("named only");
    assert_eq!(p.egress.len(), 1);
    assert_eq!(p.egress[0].peers, vec![every_pod.clone()]);
    // Numbered and named: the numbered stay toward every peer, the named move to an appended rule.
    let p = policy(&np(
        "{podSelector: {}, policyTypes: [Egress], egress: [{ports: [{port: 53, protocol: UDP}, {port: dns, protocol: UDP}]}, {to: [{podSelector: {}}], ports: [{port: http}]}]}",
    ))
    .expect("mixed");
    assert_eq!(p.egress.len(), 3);
    assert!(p.egress[0].peers.is_empty() && p.egress[0].named_ports.is_empty());
    assert_eq!(p.egress[0].ports.len(), 1);
    assert_eq!(
        p.egress[1].named_ports.len(),
        1,
        "a rule with peers is left alone"
    );
    assert_eq!(p.egress[2].peers, vec![every_pod]);
    assert_eq!(p.egress[2].named_ports.len(), 1);
    // Ingress named ports resolve on the selected pod itself: untouched.
    let p = policy(&np("{podSelector: {}, ingress: [{ports: [{port: http}]}]}")).expect("ingress");
    assert!(p.ingress[0].peers.is_empty());
}
