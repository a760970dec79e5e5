//! The upstream NetworkPolicy conformance matrix (after kubernetes' `test/e2e/network/netpol`):
//! namespaces x, y, z with pods a, b, c; TCP and UDP on 80 and 81 and SCTP on 80 in every pod;
//! two hosts outside the cluster for `ipBlock`. Each case's expected connectivity is computed by
//! the model (`tests::netpol`), never written here, and every source × destination × port ×
//! protocol is probed with real packets through a real agent fed by its policy directory
//! (`tests::netpol_lab`). The first case of every test is the no-policy baseline (everything
//! passes: the positive control), and every case must change the expected matrix.
//!
//! Cases follow upstream's names where they have one. weir's documented semantics differ from a
//! generic CNI in two places the model encodes: the node may always enter a pod, and an ipBlock
//! selects only addresses outside the cluster (CIDR identities, as in Cilium) — upstream's ipBlock
//! cases that name pod addresses are therefore run against the outside hosts.

use tests::{
    netpol::Proto::{Sctp, Tcp, Udp},
    netpol_lab::Lab,
    netpol_policies::{
        all, expr, from_both, from_cidr, from_namespaces, from_pods, named, ns, pod, policy, port,
        port_range, protocol,
    },
    privileged::require_root,
};

fn lab(test: &str) -> Option<Lab> {
    require_root(test).then(Lab::new)
}

#[test]
fn ingress_by_pod_and_namespace_selectors() {
    let Some(mut lab) = lab("ingress_by_pod_and_namespace_selectors") else {
        return;
    };
    lab.case(
        "should support a 'default-deny-ingress' policy",
        &[policy("x", "deny-ingress", all()).ingress_none()],
    );
    lab.case(
        "should support a 'default-deny-all' policy",
        &[policy("x", "deny-all", all())
            .types(&["Ingress", "Egress"])
            .build()],
    );
    lab.case(
        "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
        &[policy("x", "x-a-allows-x-b", pod("a"))
            .ingress(vec![from_pods(pod("b"))], vec![])
            .build()],
    );
    lab.case(
        "should enforce policy to allow ingress traffic for a target",
        &[
            policy("x", "deny-all", all()).ingress_none(),
            policy("x", "allow-all-to-a", pod("a"))
                .ingress(vec![from_both(all(), all())], vec![])
                .build(),
        ],
    );
    lab.case(
        "should enforce policy to allow ingress traffic from pods in all namespaces",
        &[policy("x", "allow-from-another-ns", pod("a"))
            .ingress(vec![from_namespaces(all())], vec![])
            .build()],
    );
    lab.case(
        "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
        &[policy("x", "allow-client-a-via-ns-selector", pod("a"))
            .ingress(vec![from_namespaces(ns("y"))], vec![])
            .build()],
    );
    lab.case(
        "should enforce policy based on PodSelector with MatchExpressions",
        &[policy("x", "x-a-allows-x-b", pod("a"))
            .ingress(vec![from_pods(expr("pod", "In", &["b"]))], vec![])
            .build()],
    );
    lab.case(
        "should enforce policy based on NamespaceSelector with MatchExpressions",
        &[policy("x", "allow-ns-y-match-selector", pod("a"))
            .ingress(
                vec![from_namespaces(expr(
                    "kubernetes.io/metadata.name",
                    "In",
                    &["y"],
                ))],
                vec![],
            )
            .build()],
    );
    lab.case(
        "should enforce policy based on PodSelector or NamespaceSelector",
        &[policy("x", "allow-ns-or-pod", pod("a"))
            .ingress(
                vec![
                    from_namespaces(expr("ns", "NotIn", &["x"])),
                    from_pods(pod("b")),
                ],
                vec![],
            )
            .build()],
    );
    lab.case(
        "should enforce policy based on PodSelector and NamespaceSelector",
        &[policy("x", "allow-ns-and-pod", pod("a"))
            .ingress(
                vec![from_both(expr("ns", "NotIn", &["x"]), pod("b"))],
                vec![],
            )
            .build()],
    );
    lab.case(
        "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
        &[policy("x", "allow-ns-and-pods", pod("a"))
            .ingress(
                vec![from_both(
                    expr("ns", "NotIn", &["x"]),
                    expr("pod", "In", &["b", "c"]),
                )],
                vec![],
            )
            .build()],
    );
    lab.case(
        "should enforce policy based on any PodSelectors",
        &[policy("x", "allow-b-or-c", pod("a"))
            .ingress(vec![from_pods(pod("b")), from_pods(pod("c"))], vec![])
            .build()],
    );
    lab.case(
        "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector",
        &[policy("x", "allow-y-a", pod("a"))
            .ingress(vec![from_both(ns("y"), pod("a"))], vec![])
            .build()],
    );
    lab.case(
        "should deny ingress from pods on other namespaces",
        &[policy("x", "allow-same-ns", all())
            .ingress(vec![from_pods(all())], vec![])
            .build()],
    );
    lab.case(
        "should deny ingress when no namespace matches (Exists / DoesNotExist)",
        &[policy("x", "exists", expr("pod", "Exists", &[]))
            .ingress(
                vec![from_both(
                    expr("ns", "DoesNotExist", &[]),
                    expr("pod", "Exists", &[]),
                )],
                vec![],
            )
            .build()],
    );
}

#[test]
fn ports_and_protocols() {
    let Some(mut lab) = lab("ports_and_protocols") else {
        return;
    };
    lab.case(
        "should enforce policy based on Ports",
        &[policy("x", "allow-port-81-from-y", pod("a"))
            .ingress(vec![from_namespaces(ns("y"))], vec![port(Tcp, 81)])
            .build()],
    );
    lab.case(
        "should allow ingress access on one port (any peer)",
        &[policy("x", "allow-80", all())
            .ingress(vec![], vec![port(Tcp, 80)])
            .build()],
    );
    lab.case(
        "should not allow access by TCP when a policy specifies only UDP",
        &[policy("x", "allow-only-udp-81", pod("a"))
            .ingress(vec![], vec![port(Udp, 81)])
            .build()],
    );
    lab.case(
        "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP'",
        &[policy("x", "allow-only-sctp-80", pod("a"))
            .ingress(vec![], vec![port(Sctp, 80)])
            .build()],
    );
    lab.case(
        "should enforce policy with endPort (TCP 81-85, UDP 80-81)",
        &[policy("x", "port-ranges", pod("a"))
            .ingress(
                vec![from_namespaces(all())],
                vec![port_range(Tcp, 81, 85), port_range(Udp, 80, 81)],
            )
            .build()],
    );
    lab.case(
        "should enforce multiple ports in one rule, one per protocol",
        &[policy("x", "mixed-ports", all())
            .ingress(
                vec![from_namespaces(ns("z"))],
                vec![port(Tcp, 80), port(Udp, 81), port(Sctp, 80)],
            )
            .build()],
    );
    lab.case(
        "should enforce multiple, stacked policies with overlapping podSelectors",
        &[
            policy("x", "allow-y-80", pod("a"))
                .ingress(vec![from_namespaces(ns("y"))], vec![port(Tcp, 80)])
                .build(),
            policy("x", "allow-z-81", all())
                .ingress(vec![from_namespaces(ns("z"))], vec![port(Tcp, 81)])
                .build(),
        ],
    );
    lab.case(
        "should allow every port of one protocol (protocol without port)",
        &[policy("x", "all-udp", all())
            .ingress(vec![], vec![protocol(Udp)])
            .build()],
    );
    lab.case(
        "should enforce ingress rules per port: different peers on different ports",
        &[policy("y", "per-port", pod("b"))
            .ingress(vec![from_pods(pod("a"))], vec![port(Tcp, 80)])
            .ingress(vec![from_namespaces(ns("x"))], vec![port(Udp, 80)])
            .ingress(vec![from_both(ns("z"), pod("c"))], vec![port(Sctp, 80)])
            .build()],
    );
}

#[test]
fn egress_and_both_directions() {
    let Some(mut lab) = lab("egress_and_both_directions") else {
        return;
    };
    lab.case(
        "should support a 'default-deny-egress' policy",
        &[policy("x", "deny-egress", all()).types(&["Egress"]).build()],
    );
    lab.case(
        "should enforce egress policy allowing traffic to a pod (PodSelector)",
        &[policy("x", "x-a-to-x-b", pod("a"))
            .types(&["Egress"])
            .egress(vec![from_pods(pod("b"))], vec![])
            .build()],
    );
    lab.case(
        "should enforce egress policy allowing traffic to a namespace (NamespaceSelector)",
        &[policy("x", "x-a-to-y", pod("a"))
            .types(&["Egress"])
            .egress(vec![from_namespaces(ns("y"))], vec![])
            .build()],
    );
    lab.case(
        "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
        &[policy("x", "x-a-to-y-b", pod("a"))
            .types(&["Egress"])
            .egress(vec![from_both(ns("y"), pod("b"))], vec![])
            .build()],
    );
    lab.case(
        "should enforce egress policy on ports (TCP 80 and SCTP 80 to anyone)",
        &[policy("x", "egress-80", all())
            .types(&["Egress"])
            .egress(vec![], vec![port(Tcp, 80), port(Sctp, 80)])
            .build()],
    );
    lab.case(
        "should work with Ingress, Egress specified together",
        &[policy("x", "both", pod("a"))
            .types(&["Ingress", "Egress"])
            .ingress(vec![from_pods(pod("b"))], vec![])
            .egress(vec![from_namespaces(ns("y"))], vec![port(Udp, 81)])
            .build()],
    );
    lab.case(
        "should enforce multiple egress policies with egress allow-all policy taking precedence",
        &[
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
    );
    lab.case(
        "should enforce multiple ingress policies with ingress allow-all policy taking precedence",
        &[
            policy("x", "ingress-from-y-80", pod("a"))
                .ingress(vec![from_namespaces(ns("y"))], vec![port(Tcp, 80)])
                .build(),
            policy("x", "allow-all-ingress", pod("a"))
                .ingress(vec![], vec![])
                .build(),
        ],
    );
    lab.case(
        "should ignore egress rules when policyTypes is Ingress only",
        &[policy("x", "ingress-only", pod("a"))
            .types(&["Ingress"])
            .ingress(vec![from_namespaces(ns("z"))], vec![])
            .egress(vec![from_pods(pod("b"))], vec![])
            .build()],
    );
    lab.case(
        "should default policyTypes to Ingress and Egress when the egress list is non-empty",
        &[policy("y", "defaulted", pod("c"))
            .egress(vec![from_namespaces(ns("z"))], vec![])
            .build()],
    );
    lab.case(
        "should deny egress from all pods in a namespace except to one namespace, and ingress from z",
        &[
            policy("z", "z-egress-to-x", all())
                .types(&["Egress"])
                .egress(vec![from_namespaces(ns("x"))], vec![])
                .build(),
            policy("x", "x-ingress-from-z", all())
                .ingress(vec![from_namespaces(ns("z"))], vec![])
                .build(),
        ],
    );
}

#[test]
fn policy_update_and_delete() {
    let Some(mut lab) = lab("policy_update_and_delete") else {
        return;
    };
    let allow_from = |who: &str| {
        policy("x", "allow-client", pod("a"))
            .ingress(vec![from_pods(pod(who))], vec![])
            .build()
    };
    lab.case(
        "should enforce a policy (before the update)",
        &[allow_from("b")],
    );
    lab.case(
        "should enforce updated policy (same name, another peer)",
        &[allow_from("c")],
    );
    lab.case(
        "should enforce updated policy (a port added)",
        &[policy("x", "allow-client", pod("a"))
            .ingress(vec![from_pods(pod("c"))], vec![port(Udp, 80)])
            .build()],
    );
    lab.case(
        "should enforce a second policy added beside the first",
        &[
            policy("x", "allow-client", pod("a"))
                .ingress(vec![from_pods(pod("c"))], vec![port(Udp, 80)])
                .build(),
            policy("x", "deny-egress-b", pod("b"))
                .types(&["Egress"])
                .build(),
        ],
    );
    lab.case(
        "should stop enforcing the deleted one of two policies",
        &[policy("x", "deny-egress-b", pod("b"))
            .types(&["Egress"])
            .build()],
    );
    lab.case("should stop enforcing policies after they are deleted", &[]);
}

#[test]
fn label_changes_without_a_restart() {
    let Some(mut lab) = lab("label_changes_without_a_restart") else {
        return;
    };
    let from_updated_ns = policy("x", "allow-from-updated-ns", pod("a"))
        .ingress(
            vec![from_namespaces(expr("ns2", "In", &["updated"]))],
            vec![],
        )
        .build();
    lab.case(
        "should allow ingress access from updated namespace (before: no namespace matches)",
        std::slice::from_ref(&from_updated_ns),
    );
    lab.relabel_namespace("y", &[("ns2", "updated")]);
    lab.case(
        "should allow ingress access from updated namespace",
        std::slice::from_ref(&from_updated_ns),
    );
    let from_updated_pod = policy("x", "allow-from-updated-pod", pod("a"))
        .ingress(vec![from_pods(expr("pod2", "In", &["updated"]))], vec![])
        .build();
    lab.case(
        "should allow ingress access from updated pod (before: no pod matches)",
        std::slice::from_ref(&from_updated_pod),
    );
    lab.relabel_pod("x", "b", &[("pod2", "updated")]);
    lab.case(
        "should allow ingress access from updated pod",
        std::slice::from_ref(&from_updated_pod),
    );
    let isolate_target =
        policy("x", "deny-isolated", expr("target", "In", &["isolated"])).ingress_none();
    lab.case(
        "should deny ingress access to updated pod (before: it is not selected)",
        std::slice::from_ref(&isolate_target),
    );
    lab.relabel_pod("x", "c", &[("target", "isolated")]);
    lab.case(
        "should deny ingress access to updated pod",
        std::slice::from_ref(&isolate_target),
    );
    lab.relabel_pod("x", "c", &[]);
    lab.case(
        "should allow ingress access again once the label is removed",
        std::slice::from_ref(&isolate_target),
    );
}

#[test]
fn ip_block_with_except() {
    let Some(mut lab) = lab("ip_block_with_except") else {
        return;
    };
    lab.case(
        "should allow egress access to server in CIDR block",
        &[policy("x", "egress-cidr", pod("a"))
            .types(&["Egress"])
            .egress(vec![from_cidr("198.51.100.0/24", &[])], vec![])
            .build()],
    );
    lab.case(
        "should enforce except clause while egress access to server in CIDR block",
        &[policy("x", "egress-cidr-except", pod("a"))
            .types(&["Egress"])
            .egress(
                vec![from_cidr("198.51.100.0/24", &["198.51.100.128/25"])],
                vec![],
            )
            .build()],
    );
    lab.case(
        "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
        &[
            policy("x", "egress-cidr-except", pod("a"))
                .types(&["Egress"])
                .egress(
                    vec![from_cidr("198.51.100.0/24", &["198.51.100.128/25"])],
                    vec![],
                )
                .build(),
            policy("x", "egress-except-part", pod("a"))
                .types(&["Egress"])
                .egress(
                    vec![from_cidr("198.51.100.192/26", &[])],
                    vec![port(Tcp, 81)],
                )
                .build(),
        ],
    );
    lab.case(
        "should allow ingress from a CIDR block with except, and pods by selector beside it",
        &[policy("y", "ingress-cidr", all())
            .ingress(
                vec![
                    from_cidr("198.51.100.0/24", &["198.51.100.128/25"]),
                    from_pods(pod("a")),
                ],
                vec![],
            )
            .build()],
    );
    lab.case(
        "should allow ingress from a CIDR block on a port only",
        &[policy("y", "ingress-cidr-port", all())
            .ingress(
                vec![from_cidr("198.51.100.128/25", &[])],
                vec![port(Udp, 81)],
            )
            .build()],
    );
}

#[test]
fn named_ports() {
    let Some(mut lab) = lab("named_ports") else {
        return;
    };
    lab.case(
        "should allow ingress access on one named port",
        &[policy("x", "allow-named-80", all())
            .ingress(vec![], vec![named(Tcp, "serve-80-tcp")])
            .build()],
    );
    lab.case(
        "should allow ingress access from namespace on one named port",
        &[policy("x", "allow-y-named-81", all())
            .ingress(
                vec![from_namespaces(ns("y"))],
                vec![named(Tcp, "serve-81-tcp")],
            )
            .build()],
    );
    lab.case(
        "should allow egress access on one named port (UDP)",
        &[policy("x", "egress-named-udp", all())
            .types(&["Egress"])
            .egress(vec![], vec![named(Udp, "serve-81-udp")])
            .build()],
    );
    lab.case(
        "should not match a named port of another protocol",
        &[policy("x", "named-wrong-proto", pod("a"))
            .ingress(
                vec![],
                vec![named(Udp, "serve-80-tcp"), named(Sctp, "serve-80-sctp")],
            )
            .build()],
    );
}

#[test]
fn policy_types_defaulted_on_list_length() {
    let Some(mut lab) = lab("policy_types_defaulted_on_list_length") else {
        return;
    };
    lab.case(
        "an empty egress list without policyTypes isolates ingress only",
        &[policy("x", "empty-egress", pod("a"))
            .ingress(vec![from_pods(pod("b"))], vec![])
            .empty_egress()
            .build()],
    );
}
