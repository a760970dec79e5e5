//! The NetworkPolicy conformance cases (after kubernetes' `test/e2e/network/netpol`), one copy
//! for every test that runs them: `netpol_conformance.rs` (policy directory) and
//! `netpol_conformance_api.rs` (the API server) pick their cases from here, in their own order.
//!
//! A case is its upstream name (where upstream has one) and the policies in force while it runs;
//! its expected connectivity is computed by the model (`tests::netpol`), never written here.
//! weir's documented semantics differ from a generic CNI in two places the model encodes: the
//! node may always enter a pod, and an ipBlock selects only addresses outside the cluster (CIDR
//! identities, as in Cilium) — upstream's ipBlock cases that name pod addresses therefore name
//! the outside hosts (198.51.100.0/24).

use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::{
    netpol::Proto::{Sctp, Tcp, Udp},
    netpol_policies::{
        all, expr, from_both, from_cidr, from_namespaces, from_pods, named, ns, pod, policy, port,
        port_range, protocol,
    },
};

/// One case: its name and the policies that replace the ones in force.
#[derive(Debug, Clone)]
pub struct Case {
    /// What the case checks (upstream's test name where it has one).
    pub name: &'static str,
    /// Every policy in force during the case.
    pub policies: Vec<NetworkPolicy>,
}

fn case(name: &'static str, policies: Vec<NetworkPolicy>) -> Case {
    Case { name, policies }
}

// Ingress by pod and namespace selectors.

#[must_use]
pub fn default_deny_ingress() -> Case {
    case(
        "should support a 'default-deny-ingress' policy",
        vec![policy("x", "deny-ingress", all()).ingress_none()],
    )
}

#[must_use]
pub fn default_deny_all() -> Case {
    case(
        "should support a 'default-deny-all' policy",
        vec![
            policy("x", "deny-all", all())
                .types(&["Ingress", "Egress"])
                .build(),
        ],
    )
}

#[must_use]
pub fn from_pods_in_server_namespace() -> Case {
    case(
        "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
        vec![
            policy("x", "x-a-allows-x-b", pod("a"))
                .ingress(vec![from_pods(pod("b"))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn ingress_for_a_target() -> Case {
    case(
        "should enforce policy to allow ingress traffic for a target",
        vec![
            policy("x", "deny-all", all()).ingress_none(),
            policy("x", "allow-all-to-a", pod("a"))
                .ingress(vec![from_both(all(), all())], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn from_pods_in_all_namespaces() -> Case {
    case(
        "should enforce policy to allow ingress traffic from pods in all namespaces",
        vec![
            policy("x", "allow-from-another-ns", pod("a"))
                .ingress(vec![from_namespaces(all())], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn only_from_another_namespace() -> Case {
    case(
        "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
        vec![
            policy("x", "allow-client-a-via-ns-selector", pod("a"))
                .ingress(vec![from_namespaces(ns("y"))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn pod_selector_match_expressions() -> Case {
    case(
        "should enforce policy based on PodSelector with MatchExpressions",
        vec![
            policy("x", "x-a-allows-x-b", pod("a"))
                .ingress(vec![from_pods(expr("pod", "In", &["b"]))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn namespace_selector_match_expressions() -> Case {
    case(
        "should enforce policy based on NamespaceSelector with MatchExpressions",
        vec![
            policy("x", "allow-ns-y-match-selector", pod("a"))
                .ingress(
                    vec![from_namespaces(expr(
                        "kubernetes.io/metadata.name",
                        "In",
                        &["y"],
                    ))],
                    vec![],
                )
                .build(),
        ],
    )
}

#[must_use]
pub fn pod_selector_or_namespace_selector() -> Case {
    case(
        "should enforce policy based on PodSelector or NamespaceSelector",
        vec![
            policy("x", "allow-ns-or-pod", pod("a"))
                .ingress(
                    vec![
                        from_namespaces(expr("ns", "NotIn", &["x"])),
                        from_pods(pod("b")),
                    ],
                    vec![],
                )
                .build(),
        ],
    )
}

#[must_use]
pub fn pod_selector_and_namespace_selector() -> Case {
    case(
        "should enforce policy based on PodSelector and NamespaceSelector",
        vec![
            policy("x", "allow-ns-and-pod", pod("a"))
                .ingress(
                    vec![from_both(expr("ns", "NotIn", &["x"]), pod("b"))],
                    vec![],
                )
                .build(),
        ],
    )
}

#[must_use]
pub fn multiple_pod_and_namespace_selectors() -> Case {
    case(
        "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
        vec![
            policy("x", "allow-ns-and-pods", pod("a"))
                .ingress(
                    vec![from_both(
                        expr("ns", "NotIn", &["x"]),
                        expr("pod", "In", &["b", "c"]),
                    )],
                    vec![],
                )
                .build(),
        ],
    )
}

#[must_use]
pub fn any_pod_selectors() -> Case {
    case(
        "should enforce policy based on any PodSelectors",
        vec![
            policy("x", "allow-b-or-c", pod("a"))
                .ingress(vec![from_pods(pod("b")), from_pods(pod("c"))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn only_from_a_pod_in_another_namespace() -> Case {
    case(
        "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
        vec![
            policy("x", "allow-y-a", pod("a"))
                .ingress(vec![from_both(ns("y"), pod("a"))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn deny_from_other_namespaces() -> Case {
    case(
        "should deny ingress from pods on other namespaces",
        vec![
            policy("x", "allow-same-ns", all())
                .ingress(vec![from_pods(all())], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn no_namespace_matches() -> Case {
    case(
        "should deny ingress when no namespace matches (Exists / DoesNotExist)",
        vec![
            policy("x", "exists", expr("pod", "Exists", &[]))
                .ingress(
                    vec![from_both(
                        expr("ns", "DoesNotExist", &[]),
                        expr("pod", "Exists", &[]),
                    )],
                    vec![],
                )
                .build(),
        ],
    )
}

// Ports and protocols.

#[must_use]
pub fn by_ports() -> Case {
    case(
        "should enforce policy based on Ports",
        vec![
            policy("x", "allow-port-81-from-y", pod("a"))
                .ingress(vec![from_namespaces(ns("y"))], vec![port(Tcp, 81)])
                .build(),
        ],
    )
}

#[must_use]
pub fn one_port_any_peer() -> Case {
    case(
        "should allow ingress access on one port (any peer)",
        vec![
            policy("x", "allow-80", all())
                .ingress(vec![], vec![port(Tcp, 80)])
                .build(),
        ],
    )
}

#[must_use]
pub fn udp_only_refuses_tcp() -> Case {
    case(
        "should not allow access by TCP when a policy specifies only UDP",
        vec![
            policy("x", "allow-only-udp-81", pod("a"))
                .ingress(vec![], vec![port(Udp, 81)])
                .build(),
        ],
    )
}

#[must_use]
pub fn sctp_is_not_tcp() -> Case {
    case(
        "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP'",
        vec![
            policy("x", "allow-only-sctp-80", pod("a"))
                .ingress(vec![], vec![port(Sctp, 80)])
                .build(),
        ],
    )
}

#[must_use]
pub fn end_port() -> Case {
    case(
        "should enforce policy with endPort (TCP 81-85, UDP 80-81)",
        vec![
            policy("x", "port-ranges", pod("a"))
                .ingress(
                    vec![from_namespaces(all())],
                    vec![port_range(Tcp, 81, 85), port_range(Udp, 80, 81)],
                )
                .build(),
        ],
    )
}

#[must_use]
pub fn ports_of_three_protocols() -> Case {
    case(
        "should enforce multiple ports in one rule, one per protocol",
        vec![
            policy("x", "mixed-ports", all())
                .ingress(
                    vec![from_namespaces(ns("z"))],
                    vec![port(Tcp, 80), port(Udp, 81), port(Sctp, 80)],
                )
                .build(),
        ],
    )
}

#[must_use]
pub fn stacked_overlapping_policies() -> Case {
    case(
        "should enforce multiple, stacked policies with overlapping podSelectors",
        vec![
            policy("x", "allow-y-80", pod("a"))
                .ingress(vec![from_namespaces(ns("y"))], vec![port(Tcp, 80)])
                .build(),
            policy("x", "allow-z-81", all())
                .ingress(vec![from_namespaces(ns("z"))], vec![port(Tcp, 81)])
                .build(),
        ],
    )
}

#[must_use]
pub fn protocol_without_port() -> Case {
    case(
        "should allow every port of one protocol (protocol without port)",
        vec![
            policy("x", "all-udp", all())
                .ingress(vec![], vec![protocol(Udp)])
                .build(),
        ],
    )
}

#[must_use]
pub fn different_peers_per_port() -> Case {
    case(
        "should enforce ingress rules per port: different peers on different ports",
        vec![
            policy("y", "per-port", pod("b"))
                .ingress(vec![from_pods(pod("a"))], vec![port(Tcp, 80)])
                .ingress(vec![from_namespaces(ns("x"))], vec![port(Udp, 80)])
                .ingress(vec![from_both(ns("z"), pod("c"))], vec![port(Sctp, 80)])
                .build(),
        ],
    )
}

// Egress and both directions.

#[must_use]
pub fn default_deny_egress() -> Case {
    case(
        "should support a 'default-deny-egress' policy",
        vec![policy("x", "deny-egress", all()).types(&["Egress"]).build()],
    )
}

#[must_use]
pub fn egress_to_a_pod() -> Case {
    case(
        "should enforce egress policy allowing traffic to a pod (PodSelector)",
        vec![
            policy("x", "x-a-to-x-b", pod("a"))
                .types(&["Egress"])
                .egress(vec![from_pods(pod("b"))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn egress_to_a_namespace() -> Case {
    case(
        "should enforce egress policy allowing traffic to a namespace (NamespaceSelector)",
        vec![
            policy("x", "x-a-to-y", pod("a"))
                .types(&["Egress"])
                .egress(vec![from_namespaces(ns("y"))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn egress_to_a_pod_in_another_namespace() -> Case {
    case(
        "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
        vec![
            policy("x", "x-a-to-y-b", pod("a"))
                .types(&["Egress"])
                .egress(vec![from_both(ns("y"), pod("b"))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn egress_on_ports() -> Case {
    case(
        "should enforce egress policy on ports (TCP 80 and SCTP 80 to anyone)",
        vec![
            policy("x", "egress-80", all())
                .types(&["Egress"])
                .egress(vec![], vec![port(Tcp, 80), port(Sctp, 80)])
                .build(),
        ],
    )
}

#[must_use]
pub fn ingress_and_egress_together() -> Case {
    case(
        "should work with Ingress, Egress specified together",
        vec![
            policy("x", "both", pod("a"))
                .types(&["Ingress", "Egress"])
                .ingress(vec![from_pods(pod("b"))], vec![])
                .egress(vec![from_namespaces(ns("y"))], vec![port(Udp, 81)])
                .build(),
        ],
    )
}

#[must_use]
pub fn egress_allow_all_takes_precedence() -> Case {
    case(
        "should enforce multiple egress policies with egress allow-all policy taking precedence",
        vec![
            policy("x", "egress-to-y-80", pod("a"))
                .types(&["Egress"])
                .egress(vec![from_namespaces(ns("y"))], vec![port(Tcp, 80)])
                .build(),
            policy("x", "allow-all-egress", pod("a"))
                .types(&["Egress"])
                .egress(vec![], vec![])
                .build(),
            policy("x", "deny-ingress-b", pod("b")).ingress_none(),
        ],
    )
}

#[must_use]
pub fn ingress_allow_all_takes_precedence() -> Case {
    case(
        "should enforce multiple ingress policies with ingress allow-all policy taking precedence",
        vec![
            policy("x", "ingress-from-y-80", pod("a"))
                .ingress(vec![from_namespaces(ns("y"))], vec![port(Tcp, 80)])
                .build(),
            policy("x", "allow-all-ingress", pod("a"))
                .ingress(vec![], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn egress_ignored_when_ingress_only() -> Case {
    case(
        "should ignore egress rules when policyTypes is Ingress only",
        vec![
            policy("x", "ingress-only", pod("a"))
                .types(&["Ingress"])
                .ingress(vec![from_namespaces(ns("z"))], vec![])
                .egress(vec![from_pods(pod("b"))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn types_defaulted_by_egress_list() -> Case {
    case(
        "should default policyTypes to Ingress and Egress when the egress list is non-empty",
        vec![
            policy("y", "defaulted", pod("c"))
                .egress(vec![from_namespaces(ns("z"))], vec![])
                .build(),
        ],
    )
}

#[must_use]
pub fn namespace_egress_to_one_namespace() -> Case {
    case(
        "should deny egress from all pods in a namespace except to one namespace, and ingress from z",
        vec![
            policy("z", "z-egress-to-x", all())
                .types(&["Egress"])
                .egress(vec![from_namespaces(ns("x"))], vec![])
                .build(),
            policy("x", "x-ingress-from-z", all())
                .ingress(vec![from_namespaces(ns("z"))], vec![])
                .build(),
        ],
    )
}

// Update and delete: each case follows the one named before it.

fn allow_client_from(who: &str) -> NetworkPolicy {
    policy("x", "allow-client", pod("a"))
        .ingress(vec![from_pods(pod(who))], vec![])
        .build()
}

fn deny_egress_b() -> NetworkPolicy {
    policy("x", "deny-egress-b", pod("b"))
        .types(&["Egress"])
        .build()
}

/// `allow-client` admitting x/b into x/a.
#[must_use]
pub fn before_the_update() -> Case {
    case(
        "should enforce a policy (before the update)",
        vec![allow_client_from("b")],
    )
}

/// `allow-client` (same name) admitting x/c instead.
#[must_use]
pub fn updated_peer() -> Case {
    case(
        "should enforce updated policy (same name, another peer)",
        vec![allow_client_from("c")],
    )
}

/// `allow-client` admitting x/c on UDP 80 only.
#[must_use]
pub fn updated_port() -> Case {
    case(
        "should enforce updated policy (a port added)",
        vec![
            policy("x", "allow-client", pod("a"))
                .ingress(vec![from_pods(pod("c"))], vec![port(Udp, 80)])
                .build(),
        ],
    )
}

/// The policies of `before` and `deny-egress-b` beside them.
#[must_use]
pub fn second_policy_beside(before: &Case) -> Case {
    let mut policies = before.policies.clone();
    policies.push(deny_egress_b());
    case(
        "should enforce a second policy added beside the first",
        policies,
    )
}

/// Only `deny-egress-b` left of [`second_policy_beside`]'s two.
#[must_use]
pub fn first_of_two_deleted() -> Case {
    case(
        "should stop enforcing the deleted one of two policies",
        vec![deny_egress_b()],
    )
}

#[must_use]
pub fn all_deleted() -> Case {
    case(
        "should stop enforcing policies after they are deleted",
        vec![],
    )
}

// Label changes: the same policy before and after a relabel (`Lab::relabel_pod`,
// `Lab::relabel_namespace`) the test makes between the cases.

fn from_updated_pod_policy() -> NetworkPolicy {
    policy("x", "allow-from-updated-pod", pod("a"))
        .ingress(vec![from_pods(expr("pod2", "In", &["updated"]))], vec![])
        .build()
}

fn isolate_target_policy() -> NetworkPolicy {
    policy("x", "deny-isolated", expr("target", "In", &["isolated"])).ingress_none()
}

fn from_updated_namespace_policy() -> NetworkPolicy {
    policy("x", "allow-from-updated-ns", pod("a"))
        .ingress(
            vec![from_namespaces(expr("ns2", "In", &["updated"]))],
            vec![],
        )
        .build()
}

/// Ingress into x/a from pods labelled `pod2: updated`, none labelled yet.
#[must_use]
pub fn from_updated_pod_before() -> Case {
    case(
        "should allow ingress access from updated pod (before: no pod matches)",
        vec![from_updated_pod_policy()],
    )
}

/// The same once x/b is labelled `pod2: updated`.
#[must_use]
pub fn from_updated_pod() -> Case {
    case(
        "should allow ingress access from updated pod",
        vec![from_updated_pod_policy()],
    )
}

/// The same once x/b's label is removed again.
#[must_use]
pub fn from_updated_pod_label_removed() -> Case {
    case(
        "should deny ingress access from the pod once its label is removed",
        vec![from_updated_pod_policy()],
    )
}

/// No ingress into pods labelled `target: isolated`, none labelled yet.
#[must_use]
pub fn to_updated_pod_before() -> Case {
    case(
        "should deny ingress access to updated pod (before: it is not selected)",
        vec![isolate_target_policy()],
    )
}

/// The same once x/c is labelled `target: isolated`.
#[must_use]
pub fn to_updated_pod() -> Case {
    case(
        "should deny ingress access to updated pod",
        vec![isolate_target_policy()],
    )
}

/// The same once x/c's label is removed again.
#[must_use]
pub fn to_updated_pod_label_removed() -> Case {
    case(
        "should allow ingress access again once the label is removed",
        vec![isolate_target_policy()],
    )
}

/// Ingress into x/a from namespaces labelled `ns2: updated`, none labelled yet.
#[must_use]
pub fn from_updated_namespace_before() -> Case {
    case(
        "should allow ingress access from updated namespace (before: no namespace matches)",
        vec![from_updated_namespace_policy()],
    )
}

/// The same once namespace y is labelled `ns2: updated`.
#[must_use]
pub fn from_updated_namespace() -> Case {
    case(
        "should allow ingress access from updated namespace",
        vec![from_updated_namespace_policy()],
    )
}

// ipBlock (the outside hosts: 198.51.100.10 and .200).

#[must_use]
pub fn egress_to_cidr() -> Case {
    case(
        "should allow egress access to server in CIDR block",
        vec![
            policy("x", "egress-cidr", pod("a"))
                .types(&["Egress"])
                .egress(vec![from_cidr("198.51.100.0/24", &[])], vec![])
                .build(),
        ],
    )
}

fn egress_cidr_except() -> NetworkPolicy {
    policy("x", "egress-cidr-except", pod("a"))
        .types(&["Egress"])
        .egress(
            vec![from_cidr("198.51.100.0/24", &["198.51.100.128/25"])],
            vec![],
        )
        .build()
}

#[must_use]
pub fn egress_to_cidr_except() -> Case {
    case(
        "should enforce except clause while egress access to server in CIDR block",
        vec![egress_cidr_except()],
    )
}

#[must_use]
pub fn cidr_and_except_overlap() -> Case {
    case(
        "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
        vec![
            egress_cidr_except(),
            policy("x", "egress-except-part", pod("a"))
                .types(&["Egress"])
                .egress(
                    vec![from_cidr("198.51.100.192/26", &[])],
                    vec![port(Tcp, 81)],
                )
                .build(),
        ],
    )
}

#[must_use]
pub fn ingress_from_cidr_and_pods() -> Case {
    case(
        "should allow ingress from a CIDR block with except, and pods by selector beside it",
        vec![
            policy("y", "ingress-cidr", all())
                .ingress(
                    vec![
                        from_cidr("198.51.100.0/24", &["198.51.100.128/25"]),
                        from_pods(pod("a")),
                    ],
                    vec![],
                )
                .build(),
        ],
    )
}

#[must_use]
pub fn ingress_from_cidr_on_a_port() -> Case {
    case(
        "should allow ingress from a CIDR block on a port only",
        vec![
            policy("y", "ingress-cidr-port", all())
                .ingress(
                    vec![from_cidr("198.51.100.128/25", &[])],
                    vec![port(Udp, 81)],
                )
                .build(),
        ],
    )
}

// Named ports (the lab's pods name theirs `serve-<port>-<protocol>`).

#[must_use]
pub fn named_port() -> Case {
    case(
        "should allow ingress access on one named port",
        vec![
            policy("x", "allow-named-80", all())
                .ingress(vec![], vec![named(Tcp, "serve-80-tcp")])
                .build(),
        ],
    )
}

#[must_use]
pub fn named_port_from_namespace() -> Case {
    case(
        "should allow ingress access from namespace on one named port",
        vec![
            policy("x", "allow-y-named-81", all())
                .ingress(
                    vec![from_namespaces(ns("y"))],
                    vec![named(Tcp, "serve-81-tcp")],
                )
                .build(),
        ],
    )
}

#[must_use]
pub fn named_port_egress_udp() -> Case {
    case(
        "should allow egress access on one named port (UDP)",
        vec![
            policy("x", "egress-named-udp", all())
                .types(&["Egress"])
                .egress(vec![], vec![named(Udp, "serve-81-udp")])
                .build(),
        ],
    )
}

#[must_use]
pub fn named_port_of_another_protocol() -> Case {
    case(
        "should not match a named port of another protocol",
        vec![
            policy("x", "named-wrong-proto", pod("a"))
                .ingress(
                    vec![],
                    vec![named(Udp, "serve-80-tcp"), named(Sctp, "serve-80-sctp")],
                )
                .build(),
        ],
    )
}

// policyTypes defaulted on the lists' lengths.

#[must_use]
pub fn empty_egress_list_isolates_ingress_only() -> Case {
    case(
        "an empty egress list without policyTypes isolates ingress only",
        vec![
            policy("x", "empty-egress", pod("a"))
                .ingress(vec![from_pods(pod("b"))], vec![])
                .empty_egress()
                .build(),
        ],
    )
}
