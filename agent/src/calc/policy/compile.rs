//! From policies, endpoints and identities to map contents: isolation flags per endpoint, policy
//! entries, and ipcache entries for policy CIDRs. Pure: no I/O besides allocating identities.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    hash::BuildHasher,
};

use ipnetwork::IpNetwork;
use maps_schema::{
    IdentityInfo, PolicyKey, PolicyValue,
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    identity::ANY,
    policy::{
        ANY_PORT, ANY_PROTO, EGRESS, FLAG_ALL_PORTS, INGRESS, MAX_PORT_RANGES, NO_RANGE, PortRange,
        VERDICT_ALLOW,
    },
};
use serde::Serialize;

use super::{
    model::{Peer, PolicySet, PortSpec, Rule},
    pods::RemotePod,
};

use weir_api::Endpoint;

use crate::{
    calc::identity::{Identities, IdentityError, LabelSet},
    kernel::Prefix,
};

/// A local endpoint as the compiler sees it.
pub struct Subject<'a> {
    /// The endpoint.
    pub endpoint: &'a Endpoint,
    /// Its identity.
    pub identity: u32,
}

/// Where an allow came from (rule ids index this list).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct RuleRef {
    /// `namespace/name`.
    pub policy: String,
    /// `ingress` or `egress`.
    pub direction: &'static str,
    /// Index of the rule in its list.
    pub index: usize,
}

/// The compiled maps.
#[derive(Default)]
pub struct Compiled {
    /// Endpoint id → isolation flags.
    pub flags: BTreeMap<u32, u32>,
    /// `policy_v1` contents.
    pub policy: HashMap<PolicyKey, PolicyValue>,
    /// `ipcache4_v1` contents.
    pub ipcache4: HashMap<Prefix<[u8; 4]>, IdentityInfo>,
    /// `ipcache6_v1` contents.
    pub ipcache6: HashMap<Prefix<[u8; 16]>, IdentityInfo>,
    /// Rule id → origin (rule id = index + 1).
    pub rules: Vec<RuleRef>,
    /// Remote pods' addresses and identities (`ident4_v1`/`ident6_v1`, below local endpoints').
    pub remote: Vec<(std::net::IpAddr, u32)>,
}

/// True when `inner` lies inside `outer` (same family, at least as long a prefix).
pub(crate) fn contains(outer: &IpNetwork, inner: &IpNetwork) -> bool {
    outer.is_ipv4() == inner.is_ipv4()
        && outer.prefix() <= inner.prefix()
        && outer.contains(inner.network())
}

/// Compiles `set` for the local `subjects` (with their effective labels, `pods::effective`) from
/// scratch; the set's remote pods (`pods::remote`, no node name) are peers too. The agent keeps
/// the same maps up to date incrementally (`crate::calc`); this full compile is the reference its
/// tests compare against.
pub fn compile(
    set: &PolicySet,
    subjects: &[Subject<'_>],
    identities: &mut Identities,
) -> Result<Compiled, IdentityError> {
    let mut out = Compiled::default();
    let empty = BTreeMap::new();
    // Remote pods: peers by identity, never selected.
    let mut remote = Vec::new();
    for pod in super::pods::remote(set, subjects.iter().map(|s| s.endpoint), None) {
        let ns = set.namespaces.get(&pod.namespace).unwrap_or(&empty);
        let identity =
            identities.get_or_allocate(&LabelSet::for_pod(&pod.labels, &pod.namespace, ns))?;
        out.remote.extend(pod.ips.iter().map(|ip| (*ip, identity)));
        remote.push((pod, identity));
    }
    // Every CIDR named anywhere (blocks and exceptions) gets an identity and an ipcache entry.
    let mut cidrs: BTreeMap<IpNetwork, u32> = BTreeMap::new();
    for policy in set.policies.values() {
        for rule in policy.ingress.iter().chain(&policy.egress) {
            for peer in &rule.peers {
                if let Peer::Cidr { cidr, except } = peer {
                    for net in std::iter::once(cidr).chain(except) {
                        if !cidrs.contains_key(net) {
                            cidrs.insert(
                                *net,
                                identities.get_or_allocate(&LabelSet::for_cidr(net))?,
                            );
                        }
                    }
                }
            }
        }
    }
    for (net, identity) in &cidrs {
        let info = IdentityInfo {
            identity: *identity,
            flags: 0,
        };
        match net {
            IpNetwork::V4(n) => {
                out.ipcache4.insert(
                    Prefix {
                        len: u32::from(n.prefix()),
                        data: n.network().octets(),
                    },
                    info,
                );
            }
            IpNetwork::V6(n) => {
                out.ipcache6.insert(
                    Prefix {
                        len: u32::from(n.prefix()),
                        data: n.network().octets(),
                    },
                    info,
                );
            }
        }
    }
    for policy in set.policies.values() {
        let selected: Vec<&Subject<'_>> = subjects
            .iter()
            .filter(|s| {
                s.endpoint.namespace == policy.namespace
                    && policy.pod_selector.matches(&s.endpoint.labels)
            })
            .collect();
        if selected.is_empty() {
            continue;
        }
        for (isolated, rules, dir, flag, name) in [
            (
                policy.ingress_isolated,
                &policy.ingress,
                INGRESS,
                FLAG_ISOLATED_INGRESS,
                "ingress",
            ),
            (
                policy.egress_isolated,
                &policy.egress,
                EGRESS,
                FLAG_ISOLATED_EGRESS,
                "egress",
            ),
        ] {
            if !isolated {
                continue;
            }
            for subject in &selected {
                *out.flags.entry(subject.endpoint.id).or_default() |= flag;
            }
            for (index, rule) in rules.iter().enumerate() {
                out.rules.push(RuleRef {
                    policy: format!("{}/{}", policy.namespace, policy.name),
                    direction: name,
                    index,
                });
                let rule_id = u32::try_from(out.rules.len()).unwrap_or(u32::MAX);
                let peers = peer_identities(
                    rule,
                    &policy.namespace,
                    subjects,
                    &remote,
                    &set.namespaces,
                    &cidrs,
                );
                for subject in &selected {
                    for peer in &peers {
                        let mut ports = rule.ports.clone();
                        ports.extend(resolve_named(
                            rule, dir, subject, *peer, set, subjects, &remote,
                        ));
                        if ports.is_empty() && !rule.all_ports() {
                            // Named ports only, none resolved for this pair: nothing.
                            continue;
                        }
                        add_ports(
                            &mut out.policy,
                            subject.endpoint.id,
                            dir,
                            *peer,
                            &ports,
                            rule_id,
                        );
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A rule's named ports as port clauses for (subject, peer): on the subject's own pod for
/// ingress; for egress, on every pod (local or remote) of the peer identity (the union).
fn resolve_named(
    rule: &Rule,
    direction: u8,
    subject: &Subject<'_>,
    peer: u32,
    set: &PolicySet,
    subjects: &[Subject<'_>],
    remote: &[(RemotePod, u32)],
) -> Vec<PortSpec> {
    let mut out: Vec<PortSpec> = Vec::new();
    for named in &rule.named_ports {
        let mut ports: Vec<u16> = if direction == INGRESS {
            super::pods::pod_of(subject.endpoint, set)
                .and_then(|p| p.resolve(named))
                .into_iter()
                .collect()
        } else {
            let local = subjects
                .iter()
                .filter(|s| s.identity == peer)
                .filter_map(|s| super::pods::pod_of(s.endpoint, set)?.resolve(named));
            let remote = remote
                .iter()
                .filter(|(_, id)| *id == peer)
                .filter_map(|(p, _)| {
                    p.named_ports
                        .iter()
                        .find(|n| n.name == named.name && n.protocol == named.protocol)
                        .map(|n| n.port)
                });
            local.chain(remote).collect()
        };
        ports.sort_unstable();
        for port in ports {
            let spec = PortSpec {
                protocol: named.protocol,
                port: Some(port),
                end_port: None,
            };
            if !out.contains(&spec) {
                out.push(spec);
            }
        }
    }
    out
}

fn peer_identities(
    rule: &Rule,
    namespace: &str,
    subjects: &[Subject<'_>],
    remote: &[(RemotePod, u32)],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    cidrs: &BTreeMap<IpNetwork, u32>,
) -> BTreeSet<u32> {
    let empty = BTreeMap::new();
    if rule.peers.is_empty() {
        return BTreeSet::from([ANY]);
    }
    let mut ids = BTreeSet::new();
    for peer in &rule.peers {
        match peer {
            Peer::Pods {
                namespaces: ns_sel,
                pods,
            } => {
                let candidates = subjects
                    .iter()
                    .map(|s| (&s.endpoint.namespace, &s.endpoint.labels, s.identity))
                    .chain(remote.iter().map(|(p, id)| (&p.namespace, &p.labels, *id)));
                for (pod_namespace, labels, identity) in candidates {
                    let ns_ok = match ns_sel {
                        None => pod_namespace == namespace,
                        Some(sel) => sel.matches(namespaces.get(pod_namespace).unwrap_or(&empty)),
                    };
                    if ns_ok && pods.as_ref().is_none_or(|p| p.matches(labels)) {
                        ids.insert(identity);
                    }
                }
            }
            Peer::Cidr { cidr, except } => {
                // Every CIDR identity inside the block and outside its exceptions: so an address
                // whose longest match is a more specific block of another policy is still selected.
                for (net, id) in cidrs {
                    if contains(cidr, net) && !except.iter().any(|e| contains(e, net)) {
                        ids.insert(*id);
                    }
                }
            }
        }
    }
    ids
}

/// Adds one rule's entries for (endpoint, direction, peer) in the order rules are compiled: an
/// exact port keeps the first rule's value, an all-ports entry the last one's, ranges fill the
/// slots of the protocol's any-port entry (more ranges than slots become exact ports).
pub(crate) fn add_ports<S: BuildHasher>(
    map: &mut HashMap<PolicyKey, PolicyValue, S>,
    endpoint_id: u32,
    direction: u8,
    peer: u32,
    ports: &[PortSpec],
    rule_id: u32,
) {
    let key = |protocol, port| PolicyKey {
        endpoint_id,
        peer_identity: peer,
        port,
        protocol,
        direction,
    };
    if ports.is_empty() {
        map.insert(
            key(ANY_PROTO, ANY_PORT),
            PolicyValue::new(VERDICT_ALLOW, rule_id),
        );
        return;
    }
    for spec in ports {
        match (spec.port, spec.end_port) {
            (None, _) => {
                map.insert(
                    key(spec.protocol, ANY_PORT),
                    PolicyValue::new(VERDICT_ALLOW, rule_id),
                );
            }
            (Some(p), None) => {
                map.entry(key(spec.protocol, p))
                    .or_insert_with(|| PolicyValue::new(VERDICT_ALLOW, rule_id));
            }
            (Some(first), Some(last)) if first == last => {
                map.entry(key(spec.protocol, first))
                    .or_insert_with(|| PolicyValue::new(VERDICT_ALLOW, rule_id));
            }
            (Some(first), Some(last)) => {
                add_range(map, key(spec.protocol, ANY_PORT), first, last, rule_id);
            }
        }
    }
}

fn add_range<S: BuildHasher>(
    map: &mut HashMap<PolicyKey, PolicyValue, S>,
    range_key: PolicyKey,
    first: u16,
    last: u16,
    rule_id: u32,
) {
    let entry = map.entry(range_key).or_insert_with(|| PolicyValue {
        flags: 0,
        ranges: [NO_RANGE; MAX_PORT_RANGES],
        ..PolicyValue::new(VERDICT_ALLOW, rule_id)
    });
    if entry.flags & FLAG_ALL_PORTS != 0 {
        return;
    }
    if let Some(slot) = entry.ranges.iter_mut().find(|r| r.last < r.first) {
        *slot = PortRange { first, last };
        return;
    }
    // More ranges than a slot holds: the rest become exact-port entries.
    for port in first..=last {
        let exact = PolicyKey { port, ..range_key };
        map.entry(exact)
            .or_insert_with(|| PolicyValue::new(VERDICT_ALLOW, rule_id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calc::policy::load::parse_str;

    fn endpoint(id: u32, ns: &str, app: &str) -> Endpoint {
        Endpoint {
            id,
            container_id: format!("c{id}"),
            ifname: "eth0".into(),
            host_ifname: format!("weir{id:011}"),
            netns: String::new(),
            namespace: ns.into(),
            pod: format!("p{id}"),
            labels: BTreeMap::from([("app".into(), app.into())]),
            handle: String::new(),
            ips: vec![],
        }
    }

    #[test]
    fn selected_endpoints_are_isolated_and_get_their_allows() {
        let set = parse_str(
            "p.yaml",
            r"
kind: NetworkPolicy
metadata: {name: web, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}, {protocol: UDP, port: 5000, endPort: 5010}]
  - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]
",
        )
        .expect("valid");
        let (web, client, other) = (
            endpoint(1, "default", "web"),
            endpoint(2, "default", "client"),
            endpoint(3, "default", "db"),
        );
        let subjects = [
            Subject {
                endpoint: &web,
                identity: 300,
            },
            Subject {
                endpoint: &client,
                identity: 301,
            },
            Subject {
                endpoint: &other,
                identity: 302,
            },
        ];
        let dir = tempfile::tempdir().expect("tmp");
        let mut ids = Identities::load(&dir.path().join("i.json")).expect("ids");
        let c = compile(&set, &subjects, &mut ids).expect("compile");
        assert_eq!(c.flags.get(&1), Some(&FLAG_ISOLATED_INGRESS));
        assert_eq!(c.flags.get(&2), None, "unselected endpoints stay open");
        let k = |peer, proto, port| PolicyKey {
            endpoint_id: 1,
            peer_identity: peer,
            port,
            protocol: proto,
            direction: INGRESS,
        };
        assert!(c.policy.contains_key(&k(301, 6, 80)));
        let range = c.policy[&k(301, 17, ANY_PORT)];
        assert!(range.covers(5005) && !range.covers(5011) && !range.covers(80));
        assert!(
            !c.policy.keys().any(|k| k.peer_identity == 302),
            "db is not a peer"
        );
        // The block and its exception both get identities and ipcache entries; only the block is allowed.
        let block = ids
            .get(&LabelSet::for_cidr(&"10.0.0.0/8".parse().expect("cidr")))
            .expect("block id");
        let except = ids
            .get(&LabelSet::for_cidr(&"10.1.0.0/16".parse().expect("cidr")))
            .expect("except id");
        assert_eq!(c.ipcache4.len(), 2);
        assert!(c.policy.contains_key(&k(block, ANY_PROTO, ANY_PORT)));
        assert!(
            !c.policy.keys().any(|k| k.peer_identity == except),
            "the exception is carved out"
        );
    }

    #[test]
    fn overlapping_blocks_of_two_policies_are_a_union() {
        let set = parse_str(
            "p.yaml",
            r"
kind: NetworkPolicy
metadata: {name: a, namespace: default}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}}]}]
---
kind: NetworkPolicy
metadata: {name: b, namespace: default}
spec:
  podSelector: {matchLabels: {app: none}}
  ingress: [{from: [{ipBlock: {cidr: 10.2.0.0/16}}]}]
",
        )
        .expect("valid");
        let web = endpoint(1, "default", "web");
        let dir = tempfile::tempdir().expect("tmp");
        let mut ids = Identities::load(&dir.path().join("i.json")).expect("ids");
        let c = compile(
            &set,
            &[Subject {
                endpoint: &web,
                identity: 300,
            }],
            &mut ids,
        )
        .expect("compile");
        let inner = ids
            .get(&LabelSet::for_cidr(&"10.2.0.0/16".parse().expect("cidr")))
            .expect("id");
        assert!(
            c.policy
                .keys()
                .any(|k| k.endpoint_id == 1 && k.peer_identity == inner),
            "10.2.0.0/16 addresses (their own identity in the LPM) are still inside policy a's /8"
        );
    }

    #[test]
    fn named_ports_resolve_on_the_destination_pod() {
        let set = parse_str(
            "p.yaml",
            r"
kind: NetworkPolicy
metadata: {name: web, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{ports: [{port: http}, {protocol: UDP, port: dns}]}]
---
kind: NetworkPolicy
metadata: {name: out, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  egress: [{to: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: sql}]}]
---
kind: Pod
metadata: {name: p1, namespace: default, labels: {app: web}}
spec: {containers: [{name: a, ports: [{name: http, containerPort: 8080}]}]}
---
kind: Pod
metadata: {name: p4, namespace: default, labels: {app: web}}
spec: {containers: [{name: a, ports: [{name: http, containerPort: 9090}, {name: dns, containerPort: 53, protocol: UDP}]}]}
---
kind: Pod
metadata: {name: remote-db, namespace: default, labels: {app: db}}
spec: {containers: [{name: a, ports: [{name: sql, containerPort: 5432}]}]}
status: {podIP: 10.9.9.9}
---
kind: Pod
metadata: {name: p3, namespace: default, labels: {app: db}}
spec: {containers: [{name: a, ports: [{name: sql, containerPort: 3306}]}]}
",
        )
        .expect("valid");
        let (web1, client, db, web4) = (
            endpoint(1, "default", "web"),
            endpoint(2, "default", "client"),
            endpoint(3, "default", "db"),
            endpoint(4, "default", "web"),
        );
        let dir = tempfile::tempdir().expect("tmp");
        let mut ids = Identities::load(&dir.path().join("i.json")).expect("ids");
        // The local db pod has the remote db pod's label set, so its identity.
        let db_id = ids
            .get_or_allocate(&LabelSet::for_pod(&db.labels, "default", &BTreeMap::new()))
            .expect("db identity");
        let subjects = [
            Subject {
                endpoint: &web1,
                identity: 300,
            },
            Subject {
                endpoint: &client,
                identity: 301,
            },
            Subject {
                endpoint: &db,
                identity: db_id,
            },
            Subject {
                endpoint: &web4,
                identity: 300,
            },
        ];
        let c = compile(&set, &subjects, &mut ids).expect("compile");
        let ports = |endpoint_id: u32, direction: u8| {
            let mut v: Vec<(u8, u16, u32)> = c
                .policy
                .keys()
                .filter(|k| k.endpoint_id == endpoint_id && k.direction == direction)
                .map(|k| (k.protocol, k.port, k.peer_identity))
                .collect();
            v.sort_unstable();
            v
        };
        // Ingress: each web pod on its own number; p1 names no dns port, so nothing for UDP.
        assert_eq!(ports(1, INGRESS), vec![(6, 8080, ANY)]);
        assert_eq!(ports(4, INGRESS), vec![(6, 9090, ANY), (17, 53, ANY)]);
        // Egress: the db identity's pods (local p3 and the remote pod) name sql 3306 and 5432:
        // the union, for that identity; the remote pod's address carries it.
        assert_eq!(c.remote, vec![("10.9.9.9".parse().expect("ip"), db_id)]);
        assert_eq!(ports(2, EGRESS), vec![(6, 3306, db_id), (6, 5432, db_id)]);
    }
}
