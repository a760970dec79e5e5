//! `cargo xtask demo` as a test: the demo checks every step itself; here its transcript must also
//! show the operator's view (rule hits, the denied flow by reason, both traces).

use tests::privileged::require_root;

#[test]
fn the_demo_runs_and_shows_the_denied_flow_counters_and_a_trace() {
    if !require_root("the_demo_runs_and_shows_the_denied_flow_counters_and_a_trace") {
        return;
    }
    let mut transcript = String::new();
    tests::demo::run(&mut |line| {
        transcript.push_str(line);
        transcript.push('\n');
    });
    for expected in [
        "pod web",
        "weir monitor: {",
        "default/web",
        "weir_drop_count_total{reason=\"policy-denied\"",
        "weir_policy_rule_packets_total{policy=\"default/web\"",
        "kernel (the loaded programs",
        "rule default/web ingress[0]",
    ] {
        assert!(
            transcript.contains(expected),
            "no {expected:?} in:\n{transcript}"
        );
    }
}
