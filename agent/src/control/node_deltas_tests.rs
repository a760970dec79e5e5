//! Per-object deltas against the whole set: after any sequence of object changes, a node fed
//! deltas desires exactly the maps a node opened afresh over the same set desires (same
//! identities, rule ids compared by origin).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use maps_schema::PolicyValue;

use super::Node;
use crate::{
    calc::{
        policy::{
            compile::RuleRef,
            delta::{Delta, NamespaceObject, ObjectChange},
            model::{Labels, NamedPort, NodeInfo, Peer, Pod, Policy, PolicySet, PortSpec, Rule},
            selector::Selector,
        },
        testkit,
    },
    dataplane::plane::Dataplane,
    kernel::LinkEvent,
    paths::Paths,
};

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        usize::try_from(self.0 % u64::try_from(n.max(1)).unwrap_or(1)).unwrap_or(0)
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const NAMESPACES: [&str; 2] = ["default", "a"];
const LOCAL: u32 = 3;
const HERE: &str = "here";

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn selector(key: &str, value: &str) -> Selector {
    Selector::from_k8s(&LabelSelector {
        match_labels: Some(labels(&[(key, value)])),
        ..LabelSelector::default()
    })
    .expect("a selector")
}

fn random_pod(rng: &mut Rng, namespace: &str, name: &str, n: u8) -> Pod {
    Pod {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        labels: labels(&[("app", rng.pick(&["web", "db", "api"]))]),
        ips: if rng.chance(85) {
            vec![std::net::IpAddr::from([10, 9, 0, n])]
        } else {
            Vec::new()
        },
        node: {
            let name = (*rng.pick(&[HERE, "there"])).to_owned();
            rng.chance(90).then_some(name)
        },
        host_network: rng.chance(10),
        named_ports: if rng.chance(50) {
            vec![NamedPort {
                name: "http".into(),
                protocol: 6,
                port: *rng.pick(&[8080, 9090]),
            }]
        } else {
            Vec::new()
        },
        ..Pod::default()
    }
}

fn random_policy(rng: &mut Rng, namespace: &str, name: &str) -> Policy {
    let peer = if rng.chance(50) {
        Peer::Pods {
            namespaces: None,
            pods: Some(selector("app", rng.pick(&["web", "db", "api"]))),
        }
    } else {
        Peer::Pods {
            namespaces: Some(selector("team", rng.pick(&["x", "y"]))),
            pods: None,
        }
    };
    let rule = Rule {
        peers: vec![peer],
        ports: vec![PortSpec {
            protocol: 6,
            port: Some(*rng.pick(&[80, 81])),
            end_port: None,
        }],
        named_ports: if rng.chance(40) {
            vec![crate::calc::policy::model::NamedPortRef {
                protocol: 6,
                name: "http".into(),
            }]
        } else {
            Vec::new()
        },
    };
    let egress = rng.chance(30);
    Policy {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        pod_selector: selector("app", rng.pick(&["web", "db"])),
        ingress_isolated: true,
        egress_isolated: egress,
        ingress: vec![rule.clone()],
        egress: if egress { vec![rule] } else { Vec::new() },
    }
}

/// One random object change.
fn change(rng: &mut Rng, set: &mut PolicySet) {
    let ns = (*rng.pick(&NAMESPACES)).to_owned();
    match rng.below(4) {
        0 => {
            // A local endpoint's Pod (pod0..) or another pod (r0..).
            let n = u8::try_from(rng.below(8)).unwrap_or(0);
            let name = if n < 3 {
                format!("pod{n}")
            } else {
                format!("r{n}")
            };
            let key = (ns.clone(), name.clone());
            if rng.chance(20) {
                set.pods.remove(&key);
            } else {
                set.pods.insert(key, random_pod(rng, &ns, &name, n));
            }
        }
        1 => {
            if rng.chance(15) {
                set.namespaces.remove(&ns);
            } else {
                let team = *rng.pick(&["x", "y", "z"]);
                set.namespaces.insert(ns, labels(&[("team", team)]));
            }
        }
        2 => {
            let name = (*rng.pick(&["p", "q", "r"])).to_owned();
            let key = (ns.clone(), name.clone());
            if rng.chance(25) {
                set.policies.remove(&key);
            } else {
                set.policies.insert(key, random_policy(rng, &ns, &name));
            }
        }
        _ => {
            let name = (*rng.pick(&[HERE, "there"])).to_owned();
            set.nodes.insert(
                name.clone(),
                NodeInfo {
                    name,
                    addresses: vec![std::net::IpAddr::from([192, 0, 2, 1])],
                    labels: labels(&[("zone", rng.pick(&["a", "b"]))]),
                },
            );
        }
    }
}

/// The deltas that turn `old` into `new`, as the source sends them.
fn deltas(old: &PolicySet, new: &PolicySet) -> Vec<Delta> {
    fn diff<K: Ord + Clone, V: PartialEq + Clone>(
        old: &BTreeMap<K, V>,
        new: &BTreeMap<K, V>,
        mut make: impl FnMut(K, Option<V>) -> Delta,
        out: &mut Vec<Delta>,
    ) {
        let keys: BTreeSet<&K> = old.keys().chain(new.keys()).collect();
        for key in keys {
            if old.get(key) != new.get(key) {
                out.push(make(key.clone(), new.get(key).cloned()));
            }
        }
    }
    let named = |object: String, change| Delta {
        object,
        change,
        refused: None,
    };
    let mut out = Vec::new();
    diff(
        &old.pods,
        &new.pods,
        |k, v| named(format!("Pod {}/{}", k.0, k.1), ObjectChange::Pod(k, v)),
        &mut out,
    );
    diff(
        &old.namespaces,
        &new.namespaces,
        |k, v| {
            let ns = v.map(|labels| NamespaceObject {
                labels,
                annotations: new
                    .namespace_annotations
                    .get(&k)
                    .cloned()
                    .unwrap_or_default(),
            });
            named(format!("Namespace {k}"), ObjectChange::Namespace(k, ns))
        },
        &mut out,
    );
    diff(
        &old.policies,
        &new.policies,
        |k, v| {
            named(
                format!("NetworkPolicy {}/{}", k.0, k.1),
                ObjectChange::Policy(k, v),
            )
        },
        &mut out,
    );
    diff(
        &old.nodes,
        &new.nodes,
        |k, v| named(format!("Node {k}"), ObjectChange::Node(k, v)),
        &mut out,
    );
    out
}

struct Desired {
    ident4: HashMap<[u8; 4], maps_schema::IdentityInfo>,
    policy: HashMap<maps_schema::PolicyKey, (PolicyValue, Option<RuleRef>)>,
    endpoints: HashMap<u32, maps_schema::EndpointInfo>,
}

fn desired(node: &Node) -> Desired {
    let dp: &Dataplane = &node.dataplane;
    Desired {
        ident4: dp.ident4.entries().map(|(k, v)| (*k, *v)).collect(),
        policy: dp
            .policy
            .entries()
            .map(|(k, v)| {
                (
                    *k,
                    (
                        PolicyValue { rule_id: 0, ..*v },
                        node.rule(v.rule_id).cloned(),
                    ),
                )
            })
            .collect(),
        endpoints: dp.endpoints.entries().map(|(k, v)| (*k, *v)).collect(),
    }
}

fn link_up(node: &mut Node, n: u32) {
    node.on_link(&LinkEvent::Up {
        ifname: testkit::endpoint(n, "default", &[], &[]).host_ifname,
        ifindex: 100 + n,
        up: true,
    });
}

/// A node opened afresh over `set`, with `dir`'s registry and identities (so the same numbers).
fn reference(dir: &std::path::Path, set: &PolicySet) -> Node {
    let copy = tempfile::tempdir().expect("tmp");
    // The registry (with its journal) and the identities.
    for entry in std::fs::read_dir(dir).expect("the state dir") {
        let entry = entry.expect("an entry");
        if entry.file_type().expect("a type").is_file() {
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).expect("copy");
        }
    }
    let paths = Paths {
        state_dir: copy.path().to_owned(),
        ..Paths::default()
    };
    let (dataplane, _maps) = testkit::dataplane();
    let mut node = Node::open(&paths, dataplane, set.clone(), Vec::new()).expect("open");
    node.set_node_name(HERE).expect("node name");
    for n in 0..LOCAL {
        link_up(&mut node, n);
    }
    node
}

fn run(seed: u64, steps: usize) {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = Paths {
        state_dir: dir.path().to_owned(),
        ..Paths::default()
    };
    let (dataplane, _maps) = testkit::dataplane();
    let mut node = Node::open(&paths, dataplane, PolicySet::default(), Vec::new()).expect("open");
    node.set_node_name(HERE).expect("node name");
    for n in 0..LOCAL {
        link_up(&mut node, n);
        let ns = NAMESPACES[usize::try_from(n).unwrap_or(0) % NAMESPACES.len()];
        let ip = format!("10.0.0.{}", n + 1);
        let e = testkit::endpoint(n, ns, &[("app", "registered")], &[&ip]);
        node.upsert_endpoint(e).expect("register");
    }
    let mut rng = Rng::new(seed);
    let mut set = PolicySet::default();
    for step in 0..steps {
        let old = set.clone();
        for _ in 0..=rng.below(3) {
            change(&mut rng, &mut set);
        }
        node.apply_deltas(deltas(&old, &set));
        // The reference needs no identity the incremental node did not allocate; open it after.
        let want = desired(&reference(dir.path(), &set));
        let got = desired(&node);
        let context = format!("seed {seed} step {step}");
        assert_eq!(got.ident4, want.ident4, "ident4 after {context}");
        assert_eq!(got.endpoints, want.endpoints, "endpoints after {context}");
        assert_eq!(got.policy, want.policy, "policy entries after {context}");
    }
}

#[test]
fn object_deltas_desire_what_the_whole_set_desires() {
    for seed in 0..12 {
        run(seed, 60);
    }
}

#[test]
fn a_refused_object_is_listed_by_name_until_its_next_good_change() {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = Paths {
        state_dir: dir.path().to_owned(),
        ..Paths::default()
    };
    let (dataplane, _maps) = testkit::dataplane();
    let mut node = Node::open(&paths, dataplane, PolicySet::default(), Vec::new()).expect("open");
    let key = ("default".to_owned(), "p".to_owned());
    let mut rng = Rng::new(7);
    let good = random_policy(&mut rng, "default", "p");
    let object = "NetworkPolicy default/p".to_owned();
    let done = node.apply_deltas(vec![Delta {
        object: object.clone(),
        change: ObjectChange::Policy(key.clone(), Some(good.clone())),
        refused: None,
    }]);
    assert!(done.failed.is_empty() && done.policies);
    assert_eq!(node.summary().policies, 1);
    node.apply_deltas(vec![Delta {
        object: object.clone(),
        change: ObjectChange::Policy(key.clone(), None),
        refused: Some("port 70000 is out of range".into()),
    }]);
    let summary = node.summary();
    assert_eq!(summary.policies, 0, "the refused policy is left out");
    assert_eq!(
        summary.policy_errors,
        ["NetworkPolicy default/p:0: port 70000 is out of range"]
    );
    node.apply_deltas(vec![Delta {
        object,
        change: ObjectChange::Policy(key, Some(good)),
        refused: None,
    }]);
    let summary = node.summary();
    assert_eq!(summary.policies, 1);
    assert!(
        summary.policy_errors.is_empty(),
        "{:?}",
        summary.policy_errors
    );
}

/// Where a label event's time goes at the k8s benchmark's scale (5,000 pods, 1,000 policies,
/// 100 local endpoints): the whole-set path (`set_policies`) against one delta. A measurement,
/// not a check: `cargo test -p agent --lib label_event_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement; run it by name"]
fn label_event_cost_whole_set_against_a_delta() {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = Paths {
        state_dir: dir.path().to_owned(),
        ..Paths::default()
    };
    let mut set = PolicySet::default();
    for ns in 0..100_u32 {
        let namespace = format!("ns-{ns}");
        set.namespaces
            .insert(namespace.clone(), labels(&[("team", &namespace)]));
        for j in 0..50_u32 {
            let g = ns * 50 + j;
            let name = format!("p{j}");
            let pod = Pod {
                namespace: namespace.clone(),
                name: name.clone(),
                labels: labels(&[("app", &format!("app-{}", j % 10))]),
                ips: vec![std::net::IpAddr::from([
                    10,
                    200,
                    (g / 250) as u8,
                    (g % 250) as u8 + 1,
                ])],
                node: Some(if j == 0 { HERE.into() } else { "there".into() }),
                ..Pod::default()
            };
            set.pods.insert((namespace.clone(), name), pod);
        }
        for k in 0..10_u32 {
            let name = format!("np{k}");
            let policy = Policy {
                namespace: namespace.clone(),
                name: name.clone(),
                pod_selector: selector("app", &format!("app-{k}")),
                ingress_isolated: true,
                egress_isolated: false,
                ingress: vec![Rule {
                    peers: vec![
                        Peer::Pods {
                            namespaces: None,
                            pods: Some(selector("app", &format!("app-{}", (k + 1) % 10))),
                        },
                        Peer::Pods {
                            namespaces: Some(selector("team", &format!("ns-{}", (ns + 1) % 100))),
                            pods: None,
                        },
                    ],
                    ports: vec![PortSpec {
                        protocol: 6,
                        port: Some(8000),
                        end_port: None,
                    }],
                    named_ports: Vec::new(),
                }],
                egress: Vec::new(),
            };
            set.policies.insert((namespace.clone(), name), policy);
        }
    }
    let (dataplane, _maps) = testkit::dataplane();
    let mut node = Node::open(&paths, dataplane, set.clone(), Vec::new()).expect("open");
    node.set_node_name(HERE).expect("node name");
    for ns in 0..100_u32 {
        let mut e = testkit::endpoint(ns, &format!("ns-{ns}"), &[], &[]);
        e.pod = "p0".into();
        e.ips = vec![std::net::IpAddr::from([10, 150, 0, ns as u8 + 1])];
        link_up(&mut node, ns);
        node.upsert_endpoint(e).expect("register");
    }
    node.dataplane.apply().expect("apply");
    let rounds = 20_u32;
    let relabel = |set: &mut PolicySet, r: u32| {
        let key = (format!("ns-{}", r % 100), "p0".to_owned());
        let pod = set.pods.get_mut(&key).expect("pod");
        pod.labels.insert("rev".into(), format!("r{r}"));
        (key, pod.clone())
    };
    let started = std::time::Instant::now();
    let mut clone_time = std::time::Duration::ZERO;
    for r in 0..rounds {
        relabel(&mut set, r);
        let t = std::time::Instant::now();
        let whole = set.clone();
        clone_time += t.elapsed();
        node.set_policies(whole, Vec::new()).expect("whole set");
        node.dataplane.apply().expect("apply");
    }
    let whole = started.elapsed() / rounds;
    let started = std::time::Instant::now();
    let mut apply_time = std::time::Duration::ZERO;
    for r in rounds..2 * rounds {
        let (key, pod) = relabel(&mut set, r);
        node.apply_deltas(vec![Delta {
            object: format!("Pod {}/{}", key.0, key.1),
            change: ObjectChange::Pod(key, Some(pod)),
            refused: None,
        }]);
        let t = std::time::Instant::now();
        node.dataplane.apply().expect("apply");
        apply_time += t.elapsed();
    }
    let delta = started.elapsed() / rounds;
    // The same pod's labels back and forth: no new identity to persist.
    let started = std::time::Instant::now();
    for r in 0..rounds {
        let key = ("ns-7".to_owned(), "p0".to_owned());
        let pod = set.pods.get_mut(&key).expect("pod");
        pod.labels.insert("rev".into(), format!("r{}", r % 2));
        let pod = pod.clone();
        node.apply_deltas(vec![Delta {
            object: "Pod ns-7/p0".into(),
            change: ObjectChange::Pod(key, Some(pod)),
            refused: None,
        }]);
        node.dataplane.apply().expect("apply");
    }
    let known = started.elapsed() / rounds;
    eprintln!(
        "label event, 5,000 pods × 1,000 policies: whole set {whole:?} per event (of which the \
         set's clone {:?}); one delta {delta:?} (of which the map apply {:?}); one delta to a \
         known identity {known:?}",
        clone_time / rounds,
        apply_time / rounds
    );
}

/// Pool annotations and caveats follow per-object changes as they follow a whole set: a
/// namespace's and a pod's `weir.dev/` annotations reach the IPAM hints (and leave with their
/// object), and a policy in a namespace without a Namespace object is reported until it has one.
#[test]
fn deltas_keep_the_ipam_hints_and_the_caveats_current() {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = Paths {
        state_dir: dir.path().to_owned(),
        ..Paths::default()
    };
    let (dataplane, _maps) = testkit::dataplane();
    let mut node = Node::open(&paths, dataplane, PolicySet::default(), Vec::new()).expect("open");
    let pools: BTreeMap<String, String> = [(
        crate::calc::pod_ipam::IPV4_POOLS.to_owned(),
        r#"["blue"]"#.to_owned(),
    )]
    .into();
    let mut rng = Rng::new(3);
    let mut pod = random_pod(&mut rng, "ns1", "p", 1);
    pod.annotations = pools.clone();
    let policy = random_policy(&mut rng, "ns1", "deny");
    let delta = |object: &str, change| Delta {
        object: object.to_owned(),
        change,
        refused: None,
    };
    node.apply_deltas(vec![
        delta(
            "Pod ns1/p",
            ObjectChange::Pod(("ns1".into(), "p".into()), Some(pod.clone())),
        ),
        delta(
            "NetworkPolicy ns1/deny",
            ObjectChange::Policy(("ns1".into(), "deny".into()), Some(policy)),
        ),
    ]);
    let warnings = node.summary().policy_warnings;
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("NetworkPolicy ns1/deny ") && w.contains("no Namespace object")),
        "{warnings:?}"
    );
    assert!(
        warnings.iter().any(|w| w.starts_with("Pod ns1/p ")),
        "{warnings:?}"
    );
    node.apply_deltas(vec![delta(
        "Namespace ns1",
        ObjectChange::Namespace(
            "ns1".into(),
            Some(NamespaceObject {
                labels: labels(&[("team", "a")]),
                annotations: pools.clone(),
            }),
        ),
    )]);
    let mut expected = PolicySet::default();
    expected.pods.insert(("ns1".into(), "p".into()), pod);
    expected.namespace_annotations.insert("ns1".into(), pools);
    assert_eq!(
        *node.ipam_hints(),
        *crate::calc::pod_ipam::IpamHints::of(&expected)
    );
    assert!(
        !node
            .summary()
            .policy_warnings
            .iter()
            .any(|w| w.contains("no Namespace object")),
        "the namespace exists now: {:?}",
        node.summary().policy_warnings
    );
    // Both gone: no hints left (the positive control above had them).
    node.apply_deltas(vec![
        delta(
            "Pod ns1/p",
            ObjectChange::Pod(("ns1".into(), "p".into()), None),
        ),
        delta("Namespace ns1", ObjectChange::Namespace("ns1".into(), None)),
    ]);
    assert_eq!(
        *node.ipam_hints(),
        *crate::calc::pod_ipam::IpamHints::of(&PolicySet::default())
    );
}
