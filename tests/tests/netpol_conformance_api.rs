//! A subset of the upstream NetworkPolicy conformance matrix (`netpol_conformance.rs`; the cases
//! are `tests::netpol_cases`) through the Kubernetes source: the agent runs on `--source
//! kubernetes` against the test API server (`tests::kube_api`) through kube's real client stack,
//! and each case's policies, namespaces and pods are served by it — only the objects that changed since the case before are written, so
//! every case reaches the agent as watch events (per-object deltas in the agent), never as a
//! restart. The expected connectivity is computed by the same model, every source × destination
//! × port × protocol probed with real packets; the first case is the no-policy baseline (the
//! positive control) and every case must change the expected matrix.

use tests::{
    netpol_cases as cases,
    netpol_lab::{Lab, ObjectSource},
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
    let updated_peer = cases::updated_peer();
    let second = cases::second_policy_beside(&updated_peer);
    lab.run([
        cases::default_deny_ingress(),
        cases::default_deny_all(),
        cases::from_pods_in_server_namespace(),
        cases::only_from_another_namespace(),
        cases::pod_selector_and_namespace_selector(),
        cases::by_ports(),
        cases::sctp_is_not_tcp(),
        cases::named_port_from_namespace(),
        cases::egress_to_a_pod_in_another_namespace(),
        cases::before_the_update(),
        updated_peer,
        second,
        cases::first_of_two_deleted(),
        cases::udp_only_refuses_tcp(),
    ]);
    assert!(lab.cases >= 15, "the baseline and 14 cases ran");
}

#[test]
fn pod_and_namespace_label_changes_through_the_api_server() {
    let Some(mut lab) = lab("pod_and_namespace_label_changes_through_the_api_server") else {
        return;
    };
    lab.run([cases::from_updated_pod_before()]);
    // Only x/b's Pod object changes on the server: one MODIFIED event flips its traffic.
    lab.relabel_pod("x", "b", &[("pod2", "updated")]);
    lab.run([cases::from_updated_pod()]);
    lab.relabel_pod("x", "b", &[]);
    lab.run([
        cases::from_updated_pod_label_removed(),
        cases::to_updated_pod_before(),
    ]);
    lab.relabel_pod("x", "c", &[("target", "isolated")]);
    lab.run([
        cases::to_updated_pod(),
        cases::from_updated_namespace_before(),
    ]);
    lab.relabel_namespace("y", &[("ns2", "updated")]);
    lab.run([cases::from_updated_namespace()]);
}
