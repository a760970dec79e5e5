//! A subset of the upstream NetworkPolicy conformance matrix (`netpol_conformance.rs`) through
//! the Kubernetes source: the agent runs on `--source kubernetes` against the test API server
//! (`tests::kube_api`) through kube's real client stack, and each case's policies, namespaces and
//! pods are served by it — only the objects that changed since the case before are written, so
//! every case reaches the agent as watch events (per-object deltas in the agent), never as a
//! restart. The expected connectivity is computed by the same model, every source × destination
//! × port × protocol probed with real packets; the first case is the no-policy baseline (the
//! positive control) and every case must change the expected matrix.

use tests::{
    netpol::Proto::{Sctp, Tcp, Udp},
    netpol_lab::{Lab, ObjectSource},
    netpol_policies::{
        all, expr, from_both, from_namespaces, from_pods, named, ns, pod, policy, port,
    },
    privileged::require_root,
};

fn lab(test: &str) -> Option<Lab> {
    require_root(test).then(|| Lab::with_source(ObjectSource::ApiServer))
}

#[test]
fn conformance_subset_through_the_api_server() {
    let Some(mut lab) = lab("conformance_subset_through_the_api_server") else {
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
        "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
        &[policy("x", "allow-client-a-via-ns-selector", pod("a"))
            .ingress(vec![from_namespaces(ns("y"))], vec![])
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
        "should enforce policy based on Ports",
        &[policy("x", "allow-port-81-from-y", pod("a"))
            .ingress(vec![from_namespaces(ns("y"))], vec![port(Tcp, 81)])
            .build()],
    );
    lab.case(
        "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP'",
        &[policy("x", "allow-only-sctp-80", pod("a"))
            .ingress(vec![], vec![port(Sctp, 80)])
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
        "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
        &[policy("x", "x-a-to-y-b", pod("a"))
            .types(&["Egress"])
            .egress(vec![from_both(ns("y"), pod("b"))], vec![])
            .build()],
    );
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
        "should enforce a second policy added beside the first",
        &[
            allow_from("c"),
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
    lab.case(
        "should not allow access by TCP when a policy specifies only UDP",
        &[policy("x", "allow-only-udp-81", pod("a"))
            .ingress(vec![], vec![port(Udp, 81)])
            .build()],
    );
    assert!(lab.cases >= 15, "the baseline and 14 cases ran");
}

#[test]
fn pod_and_namespace_label_changes_through_the_api_server() {
    let Some(mut lab) = lab("pod_and_namespace_label_changes_through_the_api_server") else {
        return;
    };
    let from_updated_pod = policy("x", "allow-from-updated-pod", pod("a"))
        .ingress(vec![from_pods(expr("pod2", "In", &["updated"]))], vec![])
        .build();
    lab.case(
        "should allow ingress access from updated pod (before: no pod matches)",
        std::slice::from_ref(&from_updated_pod),
    );
    // Only x/b's Pod object changes on the server: one MODIFIED event flips its traffic.
    lab.relabel_pod("x", "b", &[("pod2", "updated")]);
    lab.case(
        "should allow ingress access from updated pod",
        std::slice::from_ref(&from_updated_pod),
    );
    lab.relabel_pod("x", "b", &[]);
    lab.case(
        "should deny ingress access from the pod once its label is removed",
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
}
