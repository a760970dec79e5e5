//! `deploy/weir.yaml` against the code (no root needed): every document parses into its
//! `k8s-openapi` type with no unknown field; every flag of the DaemonSet's commands is in `weir
//! SUBCOMMAND --help` and every environment variable in `weir agent --help`; every path the agent
//! resolves from the DaemonSet's command and environment (`--dump-config`) lies on a hostPath
//! mount seen at the same path on the host, at the defaults of `agent/src/paths.rs`; the
//! ClusterRole grants exactly the resources and verbs of the Kubernetes datastore and source
//! (`ipam::store::kubernetes::{rbac_resources, RBAC_VERBS}`). Then copies broken one way each
//! (a wrong mount path, a missing RBAC rule, an unknown flag, …) are shown to fail.

use serde_json::Value;
use tests::manifests::{self, documents, problems};

fn committed() -> Vec<Value> {
    let text = std::fs::read_to_string(manifests::path()).expect("deploy/weir.yaml");
    documents(&text)
}

fn daemon_set(docs: &mut [Value]) -> &mut Value {
    docs.iter_mut()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet")
}

fn agent(docs: &mut [Value]) -> &mut Value {
    daemon_set(docs)["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .iter_mut()
        .find(|c| c["name"] == "agent")
        .expect("the agent container")
}

#[test]
fn the_committed_manifest_matches_the_code() {
    let docs = committed();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet"
        ]
    );
    let found = problems(&docs);
    assert!(found.is_empty(), "deploy/weir.yaml: {found:#?}");
}

#[test]
fn the_crds_parse_as_custom_resource_definitions_of_the_group() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let mut plurals = Vec::new();
    for entry in std::fs::read_dir(dir).expect("deploy/crds") {
        let text = std::fs::read_to_string(entry.expect("entry").path()).expect("read");
        for doc in documents(&text) {
            let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
                serde_json::from_value(doc).expect("a CustomResourceDefinition");
            assert_eq!(crd.spec.group, ipam::store::kubernetes::crd::GROUP);
            plurals.push(crd.spec.names.plural);
        }
    }
    plurals.sort();
    let mut want = ipam::store::kubernetes::rbac_resources();
    want.sort();
    assert_eq!(plurals, want, "one CRD per resource the ClusterRole grants");
}

/// Each broken copy is caught, by a finding that names what is wrong.
#[test]
fn a_broken_copy_fails_the_checks() {
    type Mutation = (&'static str, fn(&mut Vec<Value>), &'static str);
    let mutations: &[Mutation] = &[
        (
            "a wrong mount path",
            |d| agent(d)["volumeMounts"][2]["mountPath"] = "/var/lib/weir-state".into(),
            "state_dir /var/lib/weir is on no volume mount",
        ),
        (
            "a wrong hostPath",
            |d| {
                let volumes = daemon_set(d)["spec"]["template"]["spec"]["volumes"]
                    .as_array_mut()
                    .expect("volumes");
                let run = volumes
                    .iter_mut()
                    .find(|v| v["name"] == "run")
                    .expect("run volume");
                run["hostPath"]["path"] = "/run/weir-agent".into();
            },
            "hostPath /run/weir-agent does not match",
        ),
        (
            "a missing RBAC rule",
            |d| {
                let role = d
                    .iter_mut()
                    .find(|x| x["kind"] == "ClusterRole")
                    .expect("role");
                role["rules"][0]["resources"]
                    .as_array_mut()
                    .expect("resources")
                    .retain(|r| r != "ipamhandles");
            },
            "misses ipamhandles.ipam.weir.dev",
        ),
        (
            "a verb no code uses",
            |d| {
                let role = d
                    .iter_mut()
                    .find(|x| x["kind"] == "ClusterRole")
                    .expect("role");
                role["rules"][0]["verbs"]
                    .as_array_mut()
                    .expect("verbs")
                    .push("watch".into());
            },
            "grants verb watch on",
        ),
        (
            "a resource no code uses",
            |d| {
                let role = d
                    .iter_mut()
                    .find(|x| x["kind"] == "ClusterRole")
                    .expect("role");
                role["rules"]
                    .as_array_mut()
                    .expect("rules")
                    .push(serde_json::json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}));
            },
            "grants secrets, which no code uses",
        ),
        (
            "the Kubernetes source's policies not granted",
            |d| {
                let role = d
                    .iter_mut()
                    .find(|x| x["kind"] == "ClusterRole")
                    .expect("role");
                role["rules"]
                    .as_array_mut()
                    .expect("rules")
                    .retain(|r| r["apiGroups"][0] != "networking.k8s.io");
            },
            "misses networkpolicies.networking.k8s.io",
        ),
        (
            "an unknown flag",
            |d| {
                agent(d)["command"]
                    .as_array_mut()
                    .expect("command")
                    .push("--no-such-flag".into());
            },
            "flag --no-such-flag is not in `weir agent --help`",
        ),
        (
            "an unknown environment variable",
            |d| {
                let cm = d
                    .iter_mut()
                    .find(|x| x["kind"] == "ConfigMap")
                    .expect("config map");
                cm["data"]["WEIR_NO_SUCH_SETTING"] = "1".into();
            },
            "WEIR_NO_SUCH_SETTING is not one",
        ),
        (
            "a misspelt field",
            |d| daemon_set(d)["spec"]["template"]["spec"]["hostNetwrok"] = true.into(),
            "hostNetwrok",
        ),
        (
            "a privileged agent",
            |d| agent(d)["securityContext"]["privileged"] = true.into(),
            "must not be privileged",
        ),
        (
            "a missing toleration",
            |d| {
                daemon_set(d)["spec"]["template"]["spec"]["tolerations"] = serde_json::json!([
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
                ]);
            },
            "tolerate every taint",
        ),
    ];
    for (what, mutate, expected) in mutations {
        let mut docs = committed();
        mutate(&mut docs);
        let found = problems(&docs);
        assert!(
            found.iter().any(|p| p.contains(expected)),
            "{what}: expected a finding containing {expected:?}, got {found:#?}"
        );
    }
}
