//! Bad input in a policy directory file: an invalid selector, a port out of range, a missing
//! name or namespace. Each bad document is reported with its file and the line it starts on, and
//! the documents around it in the same file are still read (the rest applied). Two kinds of input
//! apply with a caveat instead of being refused, as upstream applies them: an object in a
//! namespace with no Namespace document, and a named port no Pod declares; they are reported as
//! warnings with file and line (`Loaded::warnings`; the agent logs them, and its status lists
//! them by object name: `node_tests.rs`).

use std::path::Path;

use agent::calc::policy::{
    load::{Loaded, load_dir_full, load_text},
    model::PolicySet,
};

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

#[test]
fn an_invalid_named_port_is_refused_with_file_and_line() {
    for (what, name, needle) in [
        ("upper case", "HTTP", "a-z"),
        ("too long", "a-very-long-port-name", "1 to 15"),
        ("digits only", "8080x", ""),
        ("a double dash", "we--b", "'--'"),
    ] {
        if needle.is_empty() {
            // Positive control: a valid name is no error (it has a letter).
            let (text, _) = file_with(&policy(&format!(
                "{{podSelector: {{}}, ingress: [{{ports: [{{port: {name}}}]}}]}}"
            )));
            let mut set = PolicySet::default();
            let mut errors = Vec::new();
            load_text(Path::new("p.yaml"), &text, &mut set, &mut errors);
            assert!(errors.is_empty(), "{what}: {errors:?}");
            continue;
        }
        check(
            what,
            &policy(&format!(
                "{{podSelector: {{}}, ingress: [{{ports: [{{port: {name}}}]}}]}}"
            )),
            &["ingress[0]", name, needle],
        );
    }
}

/// Writes `files` into a fresh directory and reads it as the agent does.
fn load(files: &[(&str, &str)]) -> (tempfile::TempDir, Loaded) {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    let loaded = load_dir_full(dir.path());
    (dir, loaded)
}

const GHOSTLY: &str = "kind: NetworkPolicy\nmetadata: {name: deny, namespace: ghost}\n\
                       spec: {podSelector: {}}\n---\n\
                       kind: Pod\nmetadata: {name: web, namespace: ghost, labels: {app: web}}\n\
                       spec: {containers: [{name: main}]}\n---\n\
                       kind: NetworkPolicy\nmetadata: {name: deny}\nspec: {podSelector: {}}\n";

#[test]
fn a_missing_namespace_is_reported_with_file_and_line_and_the_objects_still_apply() {
    let (dir, loaded) = load(&[("ghost.yaml", GHOSTLY)]);
    assert!(
        loaded.errors.is_empty(),
        "nothing is refused: {:?}",
        loaded.errors
    );
    let set = &loaded.set;
    assert!(
        set.policies
            .contains_key(&("ghost".to_owned(), "deny".to_owned()))
            && set
                .pods
                .contains_key(&("ghost".to_owned(), "web".to_owned())),
        "the policy and the pod apply: {set:?}"
    );
    let file = dir.path().join("ghost.yaml");
    let messages: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages.len(),
        2,
        "the policy and the pod; `default` always exists: {messages:?}"
    );
    for (line, kind) in [(1, "NetworkPolicy ghost/deny"), (5, "Pod ghost/web")] {
        let lead = format!("{}:{line}: {kind}", file.display());
        assert!(
            messages.iter().any(|m| m.starts_with(&lead)
                && m.contains("no Namespace")
                && m.contains("kind: Namespace")),
            "{lead} is reported: {messages:?}"
        );
    }
    // Positive control: with its Namespace document nothing is reported.
    let (_dir, loaded) = load(&[
        ("ghost.yaml", GHOSTLY),
        ("ns.yaml", "kind: Namespace\nmetadata: {name: ghost}\n"),
    ]);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(loaded.set.policies.len(), 2);
}

#[test]
fn an_unknown_named_port_is_reported_with_file_and_line_and_the_policy_still_applies() {
    let policy = "kind: Namespace\nmetadata: {name: prod}\n---\n\
                  kind: NetworkPolicy\nmetadata: {name: web, namespace: prod}\n\
                  spec: {podSelector: {}, ingress: [{ports: [{port: http}, {port: 80}]}]}\n";
    let pod = |port: &str| {
        format!(
            "kind: Pod\nmetadata: {{name: web, namespace: prod}}\n\
             spec: {{containers: [{{name: main, ports: [{{name: {port}, containerPort: 8080}}]}}]}}\n"
        )
    };
    let (dir, loaded) = load(&[("policy.yaml", policy), ("pod.yaml", &pod("metrics"))]);
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    assert!(
        loaded
            .set
            .policies
            .contains_key(&("prod".to_owned(), "web".to_owned())),
        "the policy applies"
    );
    let messages: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 1, "{messages:?}");
    let lead = format!(
        "{}:4: NetworkPolicy prod/web",
        dir.path().join("policy.yaml").display()
    );
    assert!(
        messages[0].starts_with(&lead)
            && messages[0].contains("\"http\" (TCP)")
            && messages[0].contains("no Pod declares"),
        "{messages:?}"
    );
    // Positive control: once a pod declares it, nothing is reported.
    let (_dir, loaded) = load(&[("policy.yaml", policy), ("pod.yaml", &pod("http"))]);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}
