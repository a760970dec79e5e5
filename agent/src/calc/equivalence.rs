//! The correctness net of the incremental calculation: random sequences of changes (endpoints
//! with labels in namespaces, namespace labels, policies with pod and namespace selectors and
//! match expressions, ports and port ranges, CIDR blocks with exceptions, node addresses,
//! remote pods (Pod objects of other nodes, some sharing a local endpoint's name or address),
//! deletions), and after every step the desired maps equal a full compile of the same sources
//! (`policy::compile::compile`, the agent's previous whole-state rebuild), with policy entries
//! compared by the rule each one names rather than by its number.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    path::Path,
};

use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use maps_schema::{IdentityInfo, PolicyKey, PolicyValue, identity::HOST};

use super::{Calculation, testkit};

use weir_api::Endpoint;

use crate::{
    calc::{
        identity::{Identities, LabelSet},
        policy::{
            compile::{RuleRef, Subject, compile},
            model::{NamedPort, NamedPortRef, Peer, Pod, Policy, PolicySet, PortSpec, Rule},
            pods,
            selector::Selector,
        },
    },
    dataplane::{endpoints, plane::Dataplane},
    kernel::Prefix,
};

/// splitmix64: a seeded generator in plain code (no dependency), reproducible by seed.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0).
    pub(super) fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n).unwrap_or(1)).unwrap_or(0)
    }

    pub(super) fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub(super) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const NAMESPACES: [&str; 4] = ["a", "b", "c", "a-b"];
const POLICY_NAMES: [&str; 5] = ["p", "q", "r", "x/y", "z"];
const ENDPOINT_KEYS: u32 = 14;

fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn pod_labels(rng: &mut Rng) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if rng.chance(80) {
        labels.insert("app".into(), (*rng.pick(&["web", "db", "api"])).to_owned());
    }
    if rng.chance(50) {
        labels.insert("tier".into(), (*rng.pick(&["fe", "be"])).to_owned());
    }
    labels
}

fn namespace_labels(rng: &mut Rng) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if rng.chance(70) {
        labels.insert("team".into(), (*rng.pick(&["x", "y"])).to_owned());
    }
    if rng.chance(40) {
        labels.insert("env".into(), (*rng.pick(&["prod", "dev"])).to_owned());
    }
    labels
}

/// A random selector over `keys` (each with `values`): matchLabels and every operator.
fn selector(rng: &mut Rng, keys: &[(&str, &[&str])]) -> Selector {
    let mut s = LabelSelector::default();
    if rng.chance(50) {
        let (k, vs) = rng.pick(keys);
        s.match_labels = Some(string_map(&[(k, rng.pick(vs))]));
    }
    if rng.chance(50) {
        let mut expressions = Vec::new();
        for _ in 0..=rng.below(2) {
            let (k, vs) = rng.pick(keys);
            let op = *rng.pick(&["In", "NotIn", "Exists", "DoesNotExist"]);
            let values = match op {
                "In" | "NotIn" => {
                    let mut values: Vec<String> = vs
                        .iter()
                        .filter(|_| rng.chance(60))
                        .map(|v| (*v).to_owned())
                        .collect();
                    values.push((*rng.pick(vs)).to_owned());
                    Some(values)
                }
                _ => None,
            };
            expressions.push(LabelSelectorRequirement {
                key: (*k).to_owned(),
                operator: op.to_owned(),
                values,
            });
        }
        s.match_expressions = Some(expressions);
    }
    Selector::from_k8s(&s).unwrap_or_default()
}

const POD_KEYS: [(&str, &[&str]); 2] = [("app", &["web", "db", "api"]), ("tier", &["fe", "be"])];
const NS_KEYS: [(&str, &[&str]); 2] = [("team", &["x", "y"]), ("env", &["prod", "dev"])];

fn net(s: &str) -> IpNetwork {
    s.parse().expect("a CIDR")
}

fn peer(rng: &mut Rng) -> Peer {
    if rng.chance(30) {
        // Blocks with exceptions; `10.1.2.7/24` keeps host bits (the same ipcache prefix as
        // `10.1.2.0/24`), `10.1.0.0/16` is also a block of its own.
        let (cidr, excepts): (&str, &[&str]) = *rng.pick(&[
            (
                "10.0.0.0/8",
                &["10.1.0.0/16", "10.1.2.7/24", "10.9.0.0/16"][..],
            ),
            ("10.1.0.0/16", &["10.1.2.0/24"][..]),
            ("10.1.2.0/24", &[][..]),
            ("0.0.0.0/0", &["10.0.0.0/8", "192.168.0.0/16"][..]),
            ("fd00::/8", &["fd00:1::/32"][..]),
            ("fd00:1::/32", &[][..]),
        ]);
        return Peer::Cidr {
            cidr: net(cidr),
            except: excepts
                .iter()
                .filter(|_| rng.chance(50))
                .map(|e| net(e))
                .collect(),
        };
    }
    let namespaces = rng.chance(40).then(|| selector(rng, &NS_KEYS));
    let pods = (namespaces.is_none() || rng.chance(50)).then(|| selector(rng, &POD_KEYS));
    Peer::Pods { namespaces, pods }
}

fn port(rng: &mut Rng) -> PortSpec {
    let protocol = *rng.pick(&[6, 17, 132]);
    if rng.chance(15) {
        return PortSpec {
            protocol,
            port: None,
            end_port: None,
        };
    }
    let first = *rng.pick(&[80, 443, 1000, 1002, 1004, 1006, 1008]);
    let end_port = rng
        .chance(50)
        .then(|| first + u16::try_from(rng.below(3)).unwrap_or(0));
    PortSpec {
        protocol,
        port: Some(first),
        end_port,
    }
}

const PORT_NAMES: [&str; 3] = ["http", "dns", "metrics"];

fn named_port_ref(rng: &mut Rng) -> NamedPortRef {
    NamedPortRef {
        protocol: *rng.pick(&[6, 17]),
        name: (*rng.pick(&PORT_NAMES)).to_owned(),
    }
}

fn named_ports(rng: &mut Rng) -> Vec<NamedPort> {
    (0..rng.below(3))
        .map(|_| NamedPort {
            name: (*rng.pick(&PORT_NAMES)).to_owned(),
            protocol: *rng.pick(&[6, 17]),
            port: *rng.pick(&[80, 8080, 53, 9000]),
        })
        .collect()
}

fn rule(rng: &mut Rng) -> Rule {
    Rule {
        peers: (0..rng.below(3)).map(|_| peer(rng)).collect(),
        ports: (0..rng.below(7)).map(|_| port(rng)).collect(),
        named_ports: if rng.chance(30) {
            (0..=rng.below(2)).map(|_| named_port_ref(rng)).collect()
        } else {
            Vec::new()
        },
    }
}

fn policy(rng: &mut Rng, namespace: &str, name: &str) -> Policy {
    let (ingress_isolated, egress_isolated) =
        *rng.pick(&[(true, false), (true, true), (false, true)]);
    Policy {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        pod_selector: if rng.chance(30) {
            Selector::default()
        } else {
            selector(rng, &POD_KEYS)
        },
        ingress_isolated,
        egress_isolated,
        ingress: (0..rng.below(4)).map(|_| rule(rng)).collect(),
        egress: (0..rng.below(3)).map(|_| rule(rng)).collect(),
    }
}

fn ips(rng: &mut Rng, n: u32) -> Vec<IpAddr> {
    let mut ips = vec![format!("10.1.2.{}", 10 + n)];
    if rng.chance(15) {
        ips.push("10.1.2.99".into()); // shared with another endpoint
    }
    if rng.chance(10) {
        ips.push("10.0.0.1".into()); // also a node address
    }
    if rng.chance(30) {
        ips.push(format!("fd00:1::{n:x}"));
    }
    ips.iter().filter_map(|ip| ip.parse().ok()).collect()
}

/// The sources, as plain values.
#[derive(Default)]
struct Sources {
    endpoints: BTreeMap<String, Endpoint>,
    set: PolicySet,
    node_addresses: BTreeSet<IpAddr>,
}

fn random_endpoint(rng: &mut Rng) -> Endpoint {
    let n = u32::try_from(rng.below(ENDPOINT_KEYS as usize)).unwrap_or(0);
    let mut e = testkit::endpoint(n, rng.pick(&NAMESPACES), &[], &[]);
    e.id = n + 1;
    e.labels = pod_labels(rng);
    e.ips = ips(rng, n);
    e
}

/// A random Pod object of another node: sometimes with a local endpoint's name (so it is local,
/// not remote) or one of its addresses.
fn random_pod(rng: &mut Rng) -> Pod {
    let n = u32::try_from(rng.below(ENDPOINT_KEYS as usize)).unwrap_or(0);
    let name = if rng.chance(20) {
        format!("pod{n}")
    } else {
        format!("remote{n}")
    };
    let ips = if rng.chance(20) {
        ips(rng, n)
    } else {
        vec![IpAddr::from([10, 9, 0, u8::try_from(n).unwrap_or(0)])]
    };
    Pod {
        namespace: (*rng.pick(&NAMESPACES)).to_owned(),
        name,
        labels: pod_labels(rng),
        ips,
        host_network: rng.chance(10),
        named_ports: named_ports(rng),
        ..Pod::default()
    }
}

/// One random change, applied to both the sources and the calculation; the remote pods follow.
fn step(rng: &mut Rng, sources: &mut Sources, calc: &mut Calculation) {
    one_step(rng, sources, calc);
    let remote = pods::remote(&sources.set, sources.endpoints.values(), None);
    calc.set_remote_pods(&remote).expect("remote pods");
    // Local endpoints' named ports come from the Pod object of their name.
    for e in sources.endpoints.values() {
        calc.set_endpoint_ports(&e.key(), pods::named_ports_of(e, &sources.set));
    }
}

fn one_step(rng: &mut Rng, sources: &mut Sources, calc: &mut Calculation) {
    match rng.below(115) {
        100..=114 => {
            // A Pod object added, relabelled, moved or deleted.
            let pod = random_pod(rng);
            let key = (pod.namespace.clone(), pod.name.clone());
            if rng.chance(30) {
                sources.set.pods.remove(&key);
            } else {
                sources.set.pods.insert(key, pod);
            }
            calc.set_policies(&sources.set).expect("policies");
        }
        0..=29 => {
            let e = random_endpoint(rng);
            calc.upsert_endpoints(&[&e]).expect("upsert");
            sources.endpoints.insert(e.key(), e);
        }
        30..=44 => {
            // Only the labels of an existing endpoint.
            let keys: Vec<String> = sources.endpoints.keys().cloned().collect();
            if keys.is_empty() {
                return;
            }
            let key = rng.pick(&keys).clone();
            let Some(e) = sources.endpoints.get_mut(&key) else {
                return;
            };
            e.labels = pod_labels(rng);
            calc.upsert_endpoints(&[&*e]).expect("upsert");
        }
        45..=54 => {
            let keys: Vec<String> = sources.endpoints.keys().cloned().collect();
            if keys.is_empty() {
                return;
            }
            let key = rng.pick(&keys).clone();
            sources.endpoints.remove(&key);
            calc.remove_endpoint(&key);
        }
        55..=64 => {
            let ns = *rng.pick(&NAMESPACES);
            let labels = namespace_labels(rng);
            if labels.is_empty() && rng.chance(50) {
                sources.set.namespaces.remove(ns);
            } else {
                sources.set.namespaces.insert(ns.to_owned(), labels);
            }
            calc.set_policies(&sources.set).expect("policies");
        }
        65..=84 => {
            let (ns, name) = (*rng.pick(&NAMESPACES), *rng.pick(&POLICY_NAMES));
            let p = policy(rng, ns, name);
            sources.set.policies.insert((ns.into(), name.into()), p);
            calc.set_policies(&sources.set).expect("policies");
        }
        85..=89 => {
            // Edit one rule of an existing policy.
            let keys: Vec<(String, String)> = sources.set.policies.keys().cloned().collect();
            if keys.is_empty() {
                return;
            }
            let key = rng.pick(&keys).clone();
            if let Some(p) = sources.set.policies.get_mut(&key) {
                let new_rule = rule(rng);
                if p.ingress.is_empty() {
                    p.ingress.push(new_rule);
                } else {
                    let at = rng.below(p.ingress.len());
                    p.ingress[at] = new_rule;
                }
            }
            calc.set_policies(&sources.set).expect("policies");
        }
        90..=94 => {
            let keys: Vec<(String, String)> = sources.set.policies.keys().cloned().collect();
            if keys.is_empty() {
                return;
            }
            let key = rng.pick(&keys).clone();
            sources.set.policies.remove(&key);
            calc.set_policies(&sources.set).expect("policies");
        }
        _ => {
            let candidates = ["10.0.0.1", "10.0.0.2", "10.1.2.10", "fd00::1"];
            sources.node_addresses = candidates
                .iter()
                .filter(|_| rng.chance(50))
                .filter_map(|a| a.parse().ok())
                .collect();
            calc.set_node_addresses(&sources.node_addresses);
        }
    }
}

/// What a full rebuild from scratch (the agent's previous `recompute`) makes of `sources`.
struct Full {
    ident4: HashMap<[u8; 4], IdentityInfo>,
    ident6: HashMap<[u8; 16], IdentityInfo>,
    ipcache4: HashMap<Prefix<[u8; 4]>, IdentityInfo>,
    ipcache6: HashMap<Prefix<[u8; 16]>, IdentityInfo>,
    policy: HashMap<PolicyKey, (PolicyValue, Option<RuleRef>)>,
    endpoints: HashMap<u32, maps_schema::EndpointInfo>,
}

fn full(sources: &Sources, identities_file: &Path, scratch: &Path) -> Full {
    // A copy of the calculation's persisted identities: the full compile must need no new one.
    std::fs::copy(identities_file, scratch).expect("copy identities");
    let mut identities = Identities::load(scratch).expect("identities");
    let allocated = identities.len();
    let endpoints: Vec<&Endpoint> = sources.endpoints.values().collect();
    let empty = BTreeMap::new();
    let ids: Vec<u32> = endpoints
        .iter()
        .map(|e| {
            let labels = LabelSet::for_pod(
                &e.labels,
                &e.namespace,
                sources.set.namespaces.get(&e.namespace).unwrap_or(&empty),
            );
            identities
                .get(&labels)
                .expect("the endpoint's identity is allocated")
        })
        .collect();
    let subjects: Vec<Subject<'_>> = endpoints
        .iter()
        .zip(&ids)
        .map(|(endpoint, identity)| Subject {
            endpoint,
            identity: *identity,
        })
        .collect();
    let compiled = compile(&sources.set, &subjects, &mut identities).expect("compile");
    assert_eq!(
        identities.len(),
        allocated,
        "every identity the full compile uses was allocated by the calculation"
    );
    let (mut ident4, mut ident6) = (HashMap::new(), HashMap::new());
    let mut put = |ip: &IpAddr, identity| {
        let info = IdentityInfo { identity, flags: 0 };
        match ip {
            IpAddr::V4(a) => ident4.insert(a.octets(), info),
            IpAddr::V6(a) => ident6.insert(a.octets(), info),
        };
    };
    for a in &sources.node_addresses {
        put(a, HOST);
    }
    for (ip, id) in &compiled.remote {
        put(ip, *id);
    }
    for (e, id) in endpoints.iter().zip(&ids) {
        for ip in &e.ips {
            put(ip, *id);
        }
    }
    let policy = compiled
        .policy
        .iter()
        .map(|(k, v)| {
            let origin = usize::try_from(v.rule_id)
                .ok()
                .and_then(|i| compiled.rules.get(i.checked_sub(1)?))
                .cloned();
            (*k, (PolicyValue { rule_id: 0, ..*v }, origin))
        })
        .collect();
    let endpoints = endpoints
        .iter()
        .zip(&ids)
        .map(|(e, id)| {
            let flags = compiled.flags.get(&e.id).copied().unwrap_or(0);
            (e.id, endpoints::entry(e, *id, flags))
        })
        .collect();
    Full {
        ident4,
        ident6,
        ipcache4: compiled.ipcache4,
        ipcache6: compiled.ipcache6,
        policy,
        endpoints,
    }
}

fn desired<
    K: Clone + Eq + std::hash::Hash + Send + std::fmt::Debug,
    V: Clone + PartialEq + Send,
>(
    driver: &crate::dataplane::map_driver::MapDriver<K, V>,
) -> HashMap<K, V> {
    driver
        .entries()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn check(sources: &Sources, calc: &Calculation, dp: &Dataplane, dir: &Path, context: &str) {
    let want = full(
        sources,
        &dir.join("identities.json"),
        &dir.join("scratch.json"),
    );
    assert_eq!(desired(&dp.ident4), want.ident4, "ident4 after {context}");
    assert_eq!(desired(&dp.ident6), want.ident6, "ident6 after {context}");
    assert_eq!(
        desired(&dp.ipcache4),
        want.ipcache4,
        "ipcache4 after {context}"
    );
    assert_eq!(
        desired(&dp.ipcache6),
        want.ipcache6,
        "ipcache6 after {context}"
    );
    let policy: HashMap<PolicyKey, (PolicyValue, Option<RuleRef>)> = dp
        .policy
        .entries()
        .map(|(k, v)| {
            (
                *k,
                (
                    PolicyValue { rule_id: 0, ..*v },
                    calc.rule(v.rule_id).cloned(),
                ),
            )
        })
        .collect();
    if policy != want.policy {
        let extra: Vec<_> = policy
            .iter()
            .filter(|(k, v)| want.policy.get(k) != Some(v))
            .take(5)
            .collect();
        let missing: Vec<_> = want
            .policy
            .iter()
            .filter(|(k, v)| policy.get(k) != Some(v))
            .take(5)
            .collect();
        panic!(
            "policy entries differ after {context} ({} vs {} entries)\nincremental only: {extra:#?}\nfull only: {missing:#?}",
            policy.len(),
            want.policy.len()
        );
    }
    // Links exist for every endpoint key (ifindex = endpoint id), so the endpoint map holds
    // exactly the registered endpoints.
    assert_eq!(
        desired(&dp.endpoints),
        want.endpoints,
        "endpoints after {context}"
    );
    for e in sources.endpoints.values() {
        let empty = BTreeMap::new();
        let labels = LabelSet::for_pod(
            &e.labels,
            &e.namespace,
            sources.set.namespaces.get(&e.namespace).unwrap_or(&empty),
        );
        assert_eq!(
            calc.identity_of(e),
            calc.identities.get(&labels),
            "identity_of after {context}"
        );
    }
}

fn run(seed: u64, steps: usize) {
    let dir = tempfile::tempdir().expect("tmp");
    let identities = Identities::load(&dir.path().join("identities.json")).expect("ids");
    let mut calc = Calculation::new(identities);
    let (mut dp, _maps) = testkit::dataplane();
    for n in 0..ENDPOINT_KEYS {
        let e = testkit::endpoint(n, "a", &[], &[]);
        dp.endpoints_manager
            .link_up(&mut dp.endpoints, &e.host_ifname, n + 1);
    }
    // Persist the (empty) identity file the reference copies.
    calc.identities
        .get_or_allocate(&LabelSet::for_cidr(&net("127.0.0.0/8")))
        .expect("seed id");
    let mut rng = Rng::new(seed);
    let mut sources = Sources::default();
    for i in 0..steps {
        step(&mut rng, &mut sources, &mut calc);
        calc.flush(&mut dp);
        check(
            &sources,
            &calc,
            &dp,
            dir.path(),
            &format!("seed {seed} step {i}"),
        );
    }
}

#[test]
fn random_changes_keep_the_maps_equal_to_a_full_compile() {
    let seeds: u64 = std::env::var("WEIR_CALC_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    for seed in 0..seeds {
        run(seed, 120);
    }
}
