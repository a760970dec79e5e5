//! `kind: Pod` documents for the agent's policy directory (standalone mode): where a pod's labels
//! and named container ports come from (weir-cni passes only its namespace and name).

use std::{fmt::Write as _, path::Path};

/// A Pod document: `labels`, and named container ports `(name, protocol, port)`.
#[must_use]
pub fn pod_yaml(
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    named_ports: &[(&str, &str, u16)],
) -> String {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    let mut text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels: {{{}}}\nspec:\n  containers:\n  - name: main\n",
        labels.join(", ")
    );
    if !named_ports.is_empty() {
        text.push_str("    ports:\n");
        for (port_name, protocol, port) in named_ports {
            let _ = writeln!(
                text,
                "    - {{name: {port_name}, protocol: {protocol}, containerPort: {port}}}"
            );
        }
    }
    text
}

/// Writes (atomically: a temporary file renamed into place) the Pod document of
/// `namespace/name` into `policy_dir` as `pod-<namespace>-<name>.yaml`.
pub fn write_pod(
    policy_dir: &Path,
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    named_ports: &[(&str, &str, u16)],
) {
    write_atomically(
        policy_dir,
        &format!("pod-{namespace}-{name}.yaml"),
        &pod_yaml(namespace, name, labels, named_ports),
    );
}

/// Writes `text` to `policy_dir/file` through a rename, so the agent never reads it half-written.
pub fn write_atomically(policy_dir: &Path, file: &str, text: &str) {
    std::fs::create_dir_all(policy_dir).expect("policy dir");
    let tmp = policy_dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).expect("write the document");
    std::fs::rename(&tmp, policy_dir.join(file)).expect("rename the document into place");
}

/// A YAML single-quoted scalar (annotation values are JSON, full of double quotes).
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

fn annotations_yaml(annotations: &[(&str, &str)]) -> String {
    let entries: Vec<String> = annotations
        .iter()
        .map(|(k, v)| format!("{k}: {}", quoted(v)))
        .collect();
    format!("{{{}}}", entries.join(", "))
}

/// A Pod document with `labels` and `annotations` (the pool annotations `weir.dev/ipv4pools`,
/// `weir.dev/ipAddrs`, …), no ports.
#[must_use]
pub fn annotated_pod_yaml(
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> String {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels: {{{}}}\n  annotations: {}\nspec:\n  containers:\n  - name: main\n",
        labels.join(", "),
        annotations_yaml(annotations)
    )
}

/// A Namespace document with `labels` and `annotations`.
#[must_use]
pub fn namespace_yaml(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> String {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels: {{{}}}\n  annotations: {}\n",
        labels.join(", "),
        annotations_yaml(annotations)
    )
}
