//! The upstream NetworkPolicy conformance matrix (after kubernetes' `test/e2e/network/netpol`):
//! namespaces x, y, z with pods a, b, c; TCP and UDP on 80 and 81 and SCTP on 80 in every pod;
//! two hosts outside the cluster for `ipBlock`. Each case's expected connectivity is computed by
//! the model (`tests::netpol`), never written here, and every source × destination × port ×
//! protocol is probed with real packets through a real agent fed by its policy directory
//! (`tests::netpol_lab`). The first case of every test is the no-policy baseline (everything
//! passes: the positive control), and every case must change the expected matrix.
//!
//! The cases (`tests::netpol_cases`, shared with `netpol_conformance_api.rs`) follow upstream's
//! names where they have one. weir's documented semantics differ from a generic CNI in two places
//! the model encodes: the node may always enter a pod, and an ipBlock selects only addresses
//! outside the cluster (CIDR identities, as in Cilium) — upstream's ipBlock cases that name pod
//! addresses are therefore run against the outside hosts.

use tests::{
    netpol_cases::{self as cases, Case},
    netpol_lab::Lab,
    privileged::require_root,
};

/// Runs `cases` in order on a new lab (after its baseline), unless the test cannot run here.
fn run(test: &str, cases: impl IntoIterator<Item = Case>) {
    if require_root(test) {
        Lab::new().run(cases);
    }
}

#[test]
fn ingress_by_pod_and_namespace_selectors() {
    run(
        "ingress_by_pod_and_namespace_selectors",
        [
            cases::default_deny_ingress(),
            cases::default_deny_all(),
            cases::from_pods_in_server_namespace(),
            cases::ingress_for_a_target(),
            cases::from_pods_in_all_namespaces(),
            cases::only_from_another_namespace(),
            cases::pod_selector_match_expressions(),
            cases::namespace_selector_match_expressions(),
            cases::pod_selector_or_namespace_selector(),
            cases::pod_selector_and_namespace_selector(),
            cases::multiple_pod_and_namespace_selectors(),
            cases::any_pod_selectors(),
            cases::only_from_a_pod_in_another_namespace(),
            cases::deny_from_other_namespaces(),
            cases::no_namespace_matches(),
        ],
    );
}

#[test]
fn ports_and_protocols() {
    run(
        "ports_and_protocols",
        [
            cases::by_ports(),
            cases::one_port_any_peer(),
            cases::udp_only_refuses_tcp(),
            cases::sctp_is_not_tcp(),
            cases::end_port(),
            cases::ports_of_three_protocols(),
            cases::stacked_overlapping_policies(),
            cases::protocol_without_port(),
            cases::different_peers_per_port(),
        ],
    );
}

#[test]
fn egress_and_both_directions() {
    run(
        "egress_and_both_directions",
        [
            cases::default_deny_egress(),
            cases::egress_to_a_pod(),
            cases::egress_to_a_namespace(),
            cases::egress_to_a_pod_in_another_namespace(),
            cases::egress_on_ports(),
            cases::ingress_and_egress_together(),
            cases::egress_allow_all_takes_precedence(),
            cases::ingress_allow_all_takes_precedence(),
            cases::egress_ignored_when_ingress_only(),
            cases::types_defaulted_by_egress_list(),
            cases::namespace_egress_to_one_namespace(),
        ],
    );
}

#[test]
fn policy_update_and_delete() {
    let updated_port = cases::updated_port();
    let second = cases::second_policy_beside(&updated_port);
    run(
        "policy_update_and_delete",
        [
            cases::before_the_update(),
            cases::updated_peer(),
            updated_port,
            second,
            cases::first_of_two_deleted(),
            cases::all_deleted(),
        ],
    );
}

#[test]
fn label_changes_without_a_restart() {
    if !require_root("label_changes_without_a_restart") {
        return;
    }
    let mut lab = Lab::new();
    lab.run([cases::from_updated_namespace_before()]);
    lab.relabel_namespace("y", &[("ns2", "updated")]);
    lab.run([
        cases::from_updated_namespace(),
        cases::from_updated_pod_before(),
    ]);
    lab.relabel_pod("x", "b", &[("pod2", "updated")]);
    lab.run([cases::from_updated_pod(), cases::to_updated_pod_before()]);
    lab.relabel_pod("x", "c", &[("target", "isolated")]);
    lab.run([cases::to_updated_pod()]);
    lab.relabel_pod("x", "c", &[]);
    lab.run([cases::to_updated_pod_label_removed()]);
}

#[test]
fn ip_block_with_except() {
    run(
        "ip_block_with_except",
        [
            cases::egress_to_cidr(),
            cases::egress_to_cidr_except(),
            cases::cidr_and_except_overlap(),
            cases::ingress_from_cidr_and_pods(),
            cases::ingress_from_cidr_on_a_port(),
        ],
    );
}

#[test]
fn named_ports() {
    run(
        "named_ports",
        [
            cases::named_port(),
            cases::named_port_from_namespace(),
            cases::named_port_egress_udp(),
            cases::named_port_of_another_protocol(),
        ],
    );
}

#[test]
fn policy_types_defaulted_on_list_length() {
    run(
        "policy_types_defaulted_on_list_length",
        [cases::empty_egress_list_isolates_ingress_only()],
    );
}
