//! Bad input in a policy directory file: an invalid selector, a port out of range, a missing
//! name or namespace. Each bad document is reported with its file and the line it starts on, and
//! the documents around it in the same file are still read (the rest applied).

use std::path::Path;

use agent::policy::{load::load_text, model::PolicySet};

/// A good Namespace, a good policy, the bad document, then another good policy.
fn file_with(bad: &str) -> (String, usize) {
    let head = "kind: Namespace\nmetadata: {name: prod, labels: {team: a}}\n---\n\
                kind: NetworkPolicy\nmetadata: {name: before, namespace: prod}\n\
                spec: {podSelector: {}, ingress: [{ports: [{port: 80}]}]}\n---\n";
    let bad_line = head.lines().count() + 1;
    let text = format!(
        "{head}{bad}---\nkind: NetworkPolicy\nmetadata: {{name: after, namespace: prod}}\n\
         spec: {{podSelector: {{}}, ingress: [{{ports: [{{protocol: UDP, port: 53}}]}}]}}\n"
    );
    (text, bad_line)
}

fn policy(spec: &str) -> String {
    format!("kind: NetworkPolicy\nmetadata: {{name: bad, namespace: prod}}\nspec: {spec}\n")
}

#[track_caller]
fn check(what: &str, bad: &str, needles: &[&str]) {
    let (text, line) = file_with(bad);
    let mut set = PolicySet::default();
    let mut errors = Vec::new();
    load_text(
        Path::new("/etc/weir/policies/team.yaml"),
        &text,
        &mut set,
        &mut errors,
    );
    assert_eq!(
        errors.len(),
        1,
        "{what}: exactly the bad document is reported: {errors:?}"
    );
    let message = errors[0].to_string();
    assert!(
        message.starts_with(&format!("/etc/weir/policies/team.yaml:{line}: ")),
        "{what}: file and the bad document's first line ({line}) lead the message: {message}"
    );
    for needle in needles {
        assert!(
            message.contains(needle),
            "{what}: {message} does not mention {needle:?}"
        );
    }
    assert!(
        set.policies
            .contains_key(&("prod".to_owned(), "before".to_owned()))
            && set
                .policies
                .contains_key(&("prod".to_owned(), "after".to_owned())),
        "{what}: the good documents before and after it are read: {:?}",
        set.policies.keys().collect::<Vec<_>>()
    );
    assert!(
        !set.policies
            .contains_key(&("prod".to_owned(), "bad".to_owned())),
        "{what}: the bad policy is not applied"
    );
    assert_eq!(
        set.namespaces["prod"]["team"], "a",
        "{what}: the namespace is read"
    );
}

#[test]
fn an_invalid_selector_is_reported_with_file_and_line() {
    check(
        "an unknown operator",
        &policy("{podSelector: {matchExpressions: [{key: app, operator: Near}]}}"),
        &["podSelector", "Near"],
    );
    check(
        "In without values",
        &policy("{podSelector: {matchExpressions: [{key: app, operator: In}]}}"),
        &["podSelector", "needs values"],
    );
    check(
        "a label key with a space, in a peer",
        &policy(
            "{podSelector: {}, ingress: [{from: [{podSelector: {matchLabels: {'bad key': x}}}]}]}",
        ),
        &["ingress[0]", "label key"],
    );
    check(
        "a namespace selector's label value too long",
        &policy(&format!(
            "{{podSelector: {{}}, egress: [{{to: [{{namespaceSelector: {{matchLabels: {{team: {}}}}}}}]}}]}}",
            "v".repeat(64)
        )),
        &["egress[0]", "namespaceSelector", "label value"],
    );
}

#[test]
fn a_port_out_of_range_is_reported_with_file_and_line() {
    for (what, ports, needle) in [
        ("port 0", "[{port: 0}]", "port 0"),
        ("port 65536", "[{port: 65536}]", "65536"),
        ("a negative port", "[{port: -1}]", "-1"),
        (
            "endPort below port",
            "[{port: 90, endPort: 80}]",
            "endPort 80",
        ),
        (
            "endPort above 65535",
            "[{port: 80, endPort: 70000}]",
            "endPort 70000",
        ),
        ("endPort without port", "[{endPort: 80}]", "endPort"),
    ] {
        check(
            what,
            &policy(&format!(
                "{{podSelector: {{}}, ingress: [{{ports: {ports}}}]}}"
            )),
            &["ingress[0]", needle],
        );
    }
}

#[test]
fn a_missing_name_or_namespace_is_reported_or_defaulted() {
    check(
        "a Namespace without a name",
        "kind: Namespace\nmetadata: {labels: {team: b}}\n",
        &["Namespace", "metadata.name"],
    );
    check(
        "a NetworkPolicy without a name",
        "kind: NetworkPolicy\nmetadata: {namespace: prod}\nspec: {podSelector: {}}\n",
        &["NetworkPolicy", "metadata.name"],
    );
    // No metadata.namespace: the policy is in `default`, as `kubectl apply` puts it.
    let mut set = PolicySet::default();
    let mut errors = Vec::new();
    load_text(
        Path::new("p.yaml"),
        "kind: NetworkPolicy\nmetadata: {name: web}\nspec: {podSelector: {}}\n",
        &mut set,
        &mut errors,
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert!(
        set.policies
            .contains_key(&("default".to_owned(), "web".to_owned()))
    );
}
