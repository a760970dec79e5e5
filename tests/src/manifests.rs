//! `deploy/weir.yaml` read as the API server would: every document parsed into its `k8s-openapi`
//! type (a field the type does not know is a finding, not silently dropped), and checked against
//! the code — the agent's flags and environment variables (`weir agent --help`), the paths it
//! resolves (`weir agent --dump-config` with the container's command and environment), and the
//! resources and verbs the Kubernetes datastore uses (`ipam::store::kubernetes`). [`problems`]
//! lists every mismatch; `tests/deploy_manifests.rs` expects none, and shows that a broken copy
//! is caught.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, Container, Namespace, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use serde_json::Value;

use crate::bin;

/// The capabilities the agent container adds (justified in the manifest and docs/install.md).
pub const AGENT_CAPABILITIES: &[&str] = &["BPF", "NET_ADMIN", "SYS_ADMIN"];

/// The manifest file.
#[must_use]
pub fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/weir.yaml")
}

/// The documents of a multi-document YAML text, as JSON values.
#[must_use]
pub fn documents(text: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("each document is YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// The typed documents of the manifest.
#[derive(Debug, Default)]
pub struct Manifest {
    /// Namespaces.
    pub namespaces: Vec<Namespace>,
    /// Service accounts.
    pub service_accounts: Vec<ServiceAccount>,
    /// Cluster roles.
    pub roles: Vec<ClusterRole>,
    /// Cluster role bindings.
    pub bindings: Vec<ClusterRoleBinding>,
    /// Config maps.
    pub config_maps: Vec<ConfigMap>,
    /// Daemon sets.
    pub daemon_sets: Vec<DaemonSet>,
}

fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    doc: &Value,
    problems: &mut Vec<String>,
) -> Option<T> {
    let kind = doc["kind"].as_str().unwrap_or("?");
    match serde_json::from_value::<T>(doc.clone()) {
        Ok(t) => {
            // k8s-openapi ignores fields it does not know: a round trip that loses one is a typo.
            let back = serde_json::to_value(&t).expect("typed objects serialise");
            if &back != doc {
                problems.push(format!(
                    "{kind} {}: fields the {kind} type does not know (misspelt?): {}",
                    doc["metadata"]["name"],
                    lost_fields(doc, &back).join(", ")
                ));
            }
            Some(t)
        }
        Err(e) => {
            problems.push(format!("{kind} does not parse as its type: {e}"));
            None
        }
    }
}

fn lost_fields(orig: &Value, back: &Value) -> Vec<String> {
    let mut lost = Vec::new();
    fn walk(path: &str, a: &Value, b: &Value, lost: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in a {
                    match b.get(k) {
                        Some(w) => walk(&format!("{path}.{k}"), v, w, lost),
                        None => lost.push(format!("{path}.{k}")),
                    }
                }
            }
            (Value::Array(a), Value::Array(b)) => {
                for (i, (v, w)) in a.iter().zip(b).enumerate() {
                    walk(&format!("{path}[{i}]"), v, w, lost);
                }
            }
            (a, b) if a != b => lost.push(format!("{path} ({a} became {b})")),
            _ => {}
        }
    }
    walk("", orig, back, &mut lost);
    lost
}

/// Parses every document into its type; unknown kinds and fields are problems.
pub fn parse(docs: &[Value], problems: &mut Vec<String>) -> Manifest {
    let mut m = Manifest::default();
    for doc in docs {
        match doc["kind"].as_str() {
            Some("Namespace") => m.namespaces.extend(typed(doc, problems)),
            Some("ServiceAccount") => m.service_accounts.extend(typed(doc, problems)),
            Some("ClusterRole") => m.roles.extend(typed(doc, problems)),
            Some("ClusterRoleBinding") => m.bindings.extend(typed(doc, problems)),
            Some("ConfigMap") => m.config_maps.extend(typed(doc, problems)),
            Some("DaemonSet") => m.daemon_sets.extend(typed(doc, problems)),
            other => problems.push(format!("unexpected document kind {other:?}")),
        }
    }
    m
}

/// `weir ARGS --help`, or `None` when there is no such subcommand.
fn help(args: &[&str]) -> Option<String> {
    let out = Command::new(bin::weir())
        .args(args)
        .arg("--help")
        .output()
        .expect("run weir --help");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The flags (`--x`) of a command line, without values.
fn flags(command: &[String]) -> Vec<String> {
    command
        .iter()
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_owned())
        .collect()
}

/// Checks that every flag of `command` (`/weir SUBCOMMAND …`) is in `weir SUBCOMMAND --help`.
fn check_flags(container: &Container, problems: &mut Vec<String>) {
    let command = container.command.clone().unwrap_or_default();
    let Some(sub) = command.get(1) else {
        problems.push(format!("container {}: no subcommand", container.name));
        return;
    };
    if command.first().map(String::as_str) != Some("/weir") {
        problems.push(format!(
            "container {}: the command must start with /weir (the image's binary)",
            container.name
        ));
    }
    let Some(text) = help(&[sub]) else {
        problems.push(format!(
            "container {}: `weir {sub}` is not a subcommand",
            container.name
        ));
        return;
    };
    for flag in flags(&command) {
        let listed = text
            .split(|c: char| c.is_whitespace() || c == ',')
            .any(|w| w == flag);
        if !listed {
            problems.push(format!(
                "container {}: flag {flag} is not in `weir {sub} --help`",
                container.name
            ));
        }
    }
}

/// The host address `status.hostIP` stands for in [`agent_env`] (a documentation address: the tests
/// run the agent with the embedded datastore, where node routing, its only user, is off).
pub const HOST_IP: &str = "192.0.2.10";

/// The agent container's environment as the kubelet would set it (`fieldRef: spec.nodeName` →
/// `node`, `status.hostIP` → [`HOST_IP`]), ConfigMap first, then `env`.
pub fn agent_env(m: &Manifest, container: &Container, node: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for from in container.env_from.iter().flatten() {
        if let Some(name) = from.config_map_ref.as_ref().map(|r| r.name.clone())
            && let Some(cm) = m
                .config_maps
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
        {
            env.extend(cm.data.clone().unwrap_or_default());
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from))
                if from.field_ref.as_ref().map(|f| f.field_path.as_str())
                    == Some("spec.nodeName") =>
            {
                node.to_owned()
            }
            (None, Some(from))
                if from.field_ref.as_ref().map(|f| f.field_path.as_str())
                    == Some("status.hostIP") =>
            {
                HOST_IP.to_owned()
            }
            _ => String::new(),
        };
        env.insert(var.name.clone(), value);
    }
    env
}

/// `weir agent --dump-config` with the container's command and environment.
fn dump_config(command: &[String], env: &BTreeMap<String, String>) -> Result<Value, String> {
    let mut cmd = Command::new(bin::weir());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("WEIR_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args(&command[1..])
        .arg("--dump-config")
        .envs(env)
        .output()
        .expect("run weir agent --dump-config");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

/// The one DaemonSet and its agent container.
#[must_use]
pub fn agent(m: &Manifest) -> Option<(&DaemonSet, &Container)> {
    let ds = m.daemon_sets.first()?;
    let spec = ds.spec.template.spec.as_ref()?;
    Some((ds, spec.containers.iter().find(|c| c.name == "agent")?))
}

/// Every mismatch between the manifest documents and the code.
#[must_use]
pub fn problems(docs: &[Value]) -> Vec<String> {
    let mut p = Vec::new();
    let m = parse(docs, &mut p);
    check_rbac(&m, &mut p);
    check_daemon_set(&m, &mut p);
    p
}

fn check_rbac(m: &Manifest, p: &mut Vec<String>) {
    // (group, resource) → verbs, from the code: the Kubernetes datastore's resources and the
    // Kubernetes source's.
    let mut want: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let group = ipam::store::kubernetes::crd::GROUP;
    for r in ipam::store::kubernetes::rbac_resources() {
        want.insert(
            (group.to_owned(), r),
            ipam::store::kubernetes::RBAC_VERBS
                .iter()
                .map(|v| (*v).to_owned())
                .collect(),
        );
    }
    for (g, r) in agent::sources::kube::RBAC_RESOURCES {
        want.insert(
            ((*g).to_owned(), (*r).to_owned()),
            agent::sources::kube::RBAC_VERBS
                .iter()
                .map(|v| (*v).to_owned())
                .collect(),
        );
    }
    let [role] = m.roles.as_slice() else {
        p.push(format!("expected one ClusterRole, found {}", m.roles.len()));
        return;
    };
    let mut granted: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for rule in role.rules.iter().flatten() {
        if rule.resource_names.is_some() || rule.non_resource_urls.is_some() {
            p.push(
                "the ClusterRole has resourceNames or nonResourceURLs, which no code needs".into(),
            );
        }
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                granted
                    .entry((g.clone(), r.clone()))
                    .or_default()
                    .extend(rule.verbs.iter().cloned());
            }
        }
    }
    let name = |(g, r): &(String, String)| {
        if g.is_empty() {
            r.clone()
        } else {
            format!("{r}.{g}")
        }
    };
    for (key, verbs_wanted) in &want {
        match granted.get(key) {
            None => p.push(format!(
                "the ClusterRole misses {}, which the agent uses",
                name(key)
            )),
            Some(verbs) => {
                for v in verbs_wanted.difference(verbs) {
                    p.push(format!("the ClusterRole misses verb {v} on {}", name(key)));
                }
                for v in verbs.difference(verbs_wanted) {
                    p.push(format!(
                        "the ClusterRole grants verb {v} on {}, which no code uses",
                        name(key)
                    ));
                }
            }
        }
    }
    for key in granted.keys().filter(|k| !want.contains_key(*k)) {
        p.push(format!(
            "the ClusterRole grants {}, which no code uses",
            name(key)
        ));
    }
    let role_name = role.metadata.name.clone().unwrap_or_default();
    let sa = m.service_accounts.first();
    let bound = m.bindings.iter().any(|b| {
        b.role_ref.kind == "ClusterRole"
            && b.role_ref.name == role_name
            && b.subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && Some(&s.name) == sa.and_then(|a| a.metadata.name.as_ref())
                    && s.namespace == sa.and_then(|a| a.metadata.namespace.clone())
            })
    });
    if !bound {
        p.push("no ClusterRoleBinding binds the ClusterRole to the ServiceAccount".into());
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one check per requirement of the DaemonSet, in reading order"
)]
fn check_daemon_set(m: &Manifest, p: &mut Vec<String>) {
    let Some((ds, agent)) = agent(m) else {
        p.push("no DaemonSet with an `agent` container".into());
        return;
    };
    let spec = &ds.spec;
    let pod = spec.template.spec.as_ref().expect("checked by agent()");
    if pod.host_network != Some(true) {
        p.push("the DaemonSet must use hostNetwork".into());
    }
    if pod.priority_class_name.as_deref() != Some("system-node-critical") {
        p.push("priorityClassName must be system-node-critical".into());
    }
    let tolerates_all =
        pod.tolerations.iter().flatten().any(|t| {
            t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()
        });
    if !tolerates_all {
        p.push(
            "the DaemonSet must tolerate every taint (operator: Exists, no key, no effect)".into(),
        );
    }
    let rolling = spec.update_strategy.as_ref().is_some_and(|s| {
        s.type_.as_deref() == Some("RollingUpdate")
            && s.rolling_update
                .as_ref()
                .and_then(|r| r.max_unavailable.clone())
                == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    });
    if !rolling {
        p.push("updateStrategy must be RollingUpdate with maxUnavailable 1".into());
    }
    if pod.service_account_name.as_deref()
        != m.service_accounts
            .first()
            .and_then(|s| s.metadata.name.as_deref())
    {
        p.push("the DaemonSet must run as the manifest's ServiceAccount".into());
    }

    // Flags and environment variables exist.
    let mut containers: Vec<&Container> = pod.init_containers.iter().flatten().collect();
    containers.extend(&pod.containers);
    for c in &containers {
        check_flags(c, p);
        if c.image.as_deref() != Some(concat!("localhost/weir:", env!("CARGO_PKG_VERSION"))) {
            p.push(format!(
                "container {}: image must be the one `cargo xtask image` builds",
                c.name
            ));
        }
    }
    let agent_help = help(&["agent"]).expect("weir agent --help");
    let env = agent_env(m, agent, "wt-node");
    for name in env.keys() {
        if !agent_help.contains(&format!("env: {name}"))
            && !agent_help.contains(&format!("env: {name}="))
        {
            p.push(format!(
                "environment variable {name} is not one `weir agent --help` lists"
            ));
        }
    }
    let command = agent.command.clone().unwrap_or_default();
    if !command
        .windows(2)
        .any(|w| w[0] == "--log-format" && w[1] == "json")
    {
        p.push("the agent must log JSON (--log-format json)".into());
    }

    // Paths: what the agent resolves lies on a mount, and the host sees it at the same path.
    let config = match dump_config(&command, &env) {
        Ok(c) => c,
        Err(e) => {
            p.push(format!(
                "the agent refuses the DaemonSet's configuration: {e}"
            ));
            return;
        }
    };
    let mounts: Vec<(String, String, Option<String>)> = agent
        .volume_mounts
        .iter()
        .flatten()
        .map(|vm| {
            (
                vm.name.clone(),
                vm.mount_path.clone(),
                vm.mount_propagation.clone(),
            )
        })
        .collect();
    let host_path = |volume: &str| -> Option<String> {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == volume)
            .and_then(|v| v.host_path.as_ref().map(|h| h.path.clone()))
    };
    let socket_dir = Path::new(agent::paths::DEFAULT_API_SOCKET)
        .parent()
        .expect("the socket has a directory")
        .display()
        .to_string();
    // (config field, the host path its mount must have: the directory itself for the pin root's
    // and the socket's mounts, the path for the others)
    let wanted = [
        ("bpf_root", agent::paths::BPFFS_MOUNT),
        ("api_socket", socket_dir.as_str()),
        ("state_dir", agent::paths::DEFAULT_STATE_DIR),
        ("policy_dir", agent::paths::DEFAULT_POLICY_DIR),
        ("cni_conf_dir", agent::paths::DEFAULT_CNI_CONF_DIR),
        ("proc_sys_net", agent::paths::DEFAULT_PROC_SYS_NET),
    ];
    let mut used = BTreeSet::new();
    for (field, default) in &wanted {
        let Some(value) = config["paths"][field].as_str() else {
            p.push(format!("--dump-config has no paths.{field}"));
            continue;
        };
        let Some((name, mount_path, _)) = mounts
            .iter()
            .filter(|(_, mp, _)| Path::new(value).starts_with(mp))
            .max_by_key(|(_, mp, _)| mp.len())
        else {
            p.push(format!(
                "the agent's {field} {value} is on no volume mount: it would not reach the host"
            ));
            continue;
        };
        used.insert(name.clone());
        let host = host_path(name).unwrap_or_default();
        // The host sees the agent's file at `host` + the part below the mount.
        let below = Path::new(value)
            .strip_prefix(mount_path)
            .expect("starts_with above");
        let on_host = Path::new(&host).join(below);
        let default_dir = if *field == "api_socket" || *field == "bpf_root" {
            Path::new(&host).to_path_buf()
        } else {
            on_host.clone()
        };
        if default_dir != Path::new(default) {
            p.push(format!(
                "volume {name}: hostPath {host} does not match the agent's default {default} ({field})"
            ));
        }
        if *field != "proc_sys_net" && on_host != Path::new(value) {
            p.push(format!(
                "volume {name}: the agent's {field} {value} is {} on the host; weir-cni and the \
                 runtime read the conflist's paths on the host, so mountPath must equal hostPath",
                on_host.display()
            ));
        }
    }
    for (name, path, propagation) in &mounts {
        if !used.contains(name) {
            p.push(format!(
                "volume mount {name} at {path} is used by no agent path"
            ));
        }
        if path == agent::paths::BPFFS_MOUNT
            && !matches!(
                propagation.as_deref(),
                Some("HostToContainer" | "Bidirectional")
            )
        {
            p.push("the agent must see bpffs mounted by the host (HostToContainer)".into());
        }
    }

    // Privileges: named capabilities; only an init step that mounts bpffs is privileged.
    let sc = agent.security_context.clone().unwrap_or_default();
    if sc.privileged == Some(true) {
        p.push(
            "the agent container must not be privileged: it runs with named capabilities".into(),
        );
    }
    let caps = sc.capabilities.unwrap_or_default();
    let added: BTreeSet<String> = caps.add.unwrap_or_default().into_iter().collect();
    let want: BTreeSet<String> = AGENT_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
    if added != want {
        p.push(format!(
            "the agent's capabilities are {added:?}, expected {want:?}"
        ));
    }
    if caps.drop != Some(vec!["ALL".to_owned()]) {
        p.push("the agent must drop every other capability (drop: [ALL])".into());
    }
    for c in &containers {
        let privileged = c
            .security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false);
        for vm in c.volume_mounts.iter().flatten() {
            if vm.mount_propagation.as_deref() == Some("Bidirectional") && !privileged {
                p.push(format!(
                    "container {}: Bidirectional propagation needs a privileged container (the API server refuses it otherwise)",
                    c.name
                ));
            }
        }
    }

    // Probes on the agent's health endpoints, at its metrics address.
    let metrics: std::net::SocketAddr = config["metrics"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("the dump names the metrics address");
    for (probe, path) in [
        (agent.readiness_probe.as_ref(), "/readyz"),
        (agent.liveness_probe.as_ref(), "/healthz"),
    ] {
        let ok = probe.and_then(|p| p.http_get.as_ref()).is_some_and(|g| {
            g.path.as_deref() == Some(path)
                && g.host.as_deref() == Some(&metrics.ip().to_string())
                && g.port
                    == k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(
                        metrics.port(),
                    ))
        });
        if !ok {
            p.push(format!(
                "a probe must GET {path} at the agent's --metrics address {metrics}"
            ));
        }
    }

    // install-cni writes into the CNI bin directory the host's runtime reads.
    let install = pod.init_containers.iter().flatten().find(|c| {
        c.command
            .as_ref()
            .is_some_and(|cmd| cmd.get(1).map(String::as_str) == Some("install-cni"))
    });
    match install {
        None => p.push("no init container runs `weir install-cni`".into()),
        Some(c) => {
            let cmd = c.command.clone().unwrap_or_default();
            let dir = cmd
                .windows(2)
                .find(|w| w[0] == "--cni-bin-dir")
                .map_or(agent::setup::install_cni::DEFAULT_CNI_BIN_DIR, |w| {
                    w[1].as_str()
                });
            let mount = c
                .volume_mounts
                .iter()
                .flatten()
                .find(|vm| vm.mount_path == dir);
            match mount.and_then(|vm| host_path(&vm.name)) {
                Some(host) if host == agent::setup::install_cni::DEFAULT_CNI_BIN_DIR => {}
                other => p.push(format!(
                    "install-cni writes {dir}, which must be the host's {} (found {other:?})",
                    agent::setup::install_cni::DEFAULT_CNI_BIN_DIR
                )),
            }
        }
    }
}
