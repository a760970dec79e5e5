//! Runtime-style harness for `weir-cni`: a node namespace running a real `weir agent`, pod
//! namespaces, and the plugin exec'd with the CNI environment and a config on stdin inside the
//! node namespace (as kubelet/containerd run it). Everything is `wt…` and removed on drop; the
//! host-side `weir…` veths live only inside the node namespace.

use std::{
    io::Write as _,
    path::PathBuf,
    process::{Command, ExitStatus, Stdio},
};

use serde_json::{Value, json};

use crate::{
    agent_proc::{AgentDirs, AgentProcess},
    bin,
    bpf::PinRoot,
    names,
    netns::NetNs,
};

/// The network name the tests use (handles are `wt-net.<container id>`).
pub const NETWORK: &str = "wt-net";

/// A node: its namespace, pin root, agent directories and (while running) its agent.
#[derive(Debug)]
pub struct CniNode {
    /// The agent (dropped first: field order).
    pub agent: Option<AgentProcess>,
    /// Agent directories (socket, state, policies, conflist).
    pub dirs: AgentDirs,
    /// The pin root.
    pub root: PinRoot,
    /// The node's network namespace (the "host" side of every pod).
    pub ns: NetNs,
    /// Where weir-cni logs.
    pub log: tempfile::TempDir,
    extra: Vec<String>,
}

impl CniNode {
    /// A node with forwarding on and an agent started with `extra` flags.
    #[must_use]
    pub fn start(extra: &[&str]) -> Self {
        Self::start_in(NetNs::new(), extra)
    }

    /// [`Self::start`] in a namespace the caller prepared (a node joined to an underlay first).
    #[must_use]
    pub fn start_in(ns: NetNs, extra: &[&str]) -> Self {
        Self::start_with_dirs(ns, AgentDirs::new(), extra)
    }

    /// [`Self::start_in`] with agent directories the caller prepared (a state directory on a
    /// filesystem of its own).
    #[must_use]
    pub fn start_with_dirs(ns: NetNs, dirs: AgentDirs, extra: &[&str]) -> Self {
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
        let root = PinRoot::new();
        let agent = AgentProcess::start(&root, &dirs, Some(&ns), extra);
        Self {
            agent: Some(agent),
            dirs,
            root,
            ns,
            log: tempfile::Builder::new()
                .prefix("wt-cnilog")
                .tempdir()
                .expect("temp dir"),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Stops the agent (SIGTERM).
    pub fn stop_agent(&mut self) {
        if let Some(agent) = self.agent.take() {
            let _ = agent.terminate();
        }
    }

    /// Kills the agent (SIGKILL).
    pub fn kill_agent(&mut self) {
        self.agent = None;
    }

    /// Starts the agent again with the same flags and directories.
    pub fn restart_agent(&mut self) {
        self.stop_agent();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.agent = Some(AgentProcess::start(
            &self.root,
            &self.dirs,
            Some(&self.ns),
            &extra,
        ));
    }

    /// Starts the agent again with other flags (an upgrade: another `--ebpf-object`), which
    /// later restarts keep.
    pub fn restart_agent_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| (*s).to_owned()).collect();
        self.restart_agent();
    }

    /// The agent's flags (what a restart starts it with).
    #[must_use]
    pub fn flags(&self) -> &[String] {
        &self.extra
    }

    /// The agent's socket.
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dirs.path("weir.sock")
    }

    /// The plugin config for this node, with `extra` keys merged in.
    #[must_use]
    pub fn conf(&self, extra: &Value) -> Value {
        let mut conf = json!({
            "cniVersion": "1.1.0",
            "name": NETWORK,
            "type": "weir-cni",
            "agentSocket": self.socket(),
            "bpfRoot": self.root.path(),
            "logFile": self.log.path().join("weir-cni.log"),
            "agentTimeoutSecs": 30,
        });
        if let (Some(conf), Some(extra)) = (conf.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                conf.insert(k.clone(), v.clone());
            }
        }
        conf
    }

    /// Runs `weir-cni` inside the node namespace.
    #[must_use]
    pub fn exec(&self, call: &Call<'_>, stdin: &Value) -> CniOutput {
        exec_in(Some(&self.ns), call, stdin)
    }

    /// ADD of `pod` as `eth0`, asserting success; returns the result.
    pub fn add(&self, pod: &Pod, conf: &Value) -> Value {
        let out = self.exec(&pod.call("ADD"), conf);
        out.ok("ADD").clone()
    }

    /// DEL of `pod` (with the ADD result as prevResult when given), asserting success.
    pub fn del(&self, pod: &Pod, conf: &Value, prev: Option<&Value>) {
        let out = self.exec(&pod.call("DEL"), &with_prev(conf, prev));
        out.ok("DEL");
    }

    /// Addresses in use in the node's datastore, as `weir ipam utilization -o json` reads them
    /// (through the running agent, which holds the embedded file, as an operator would).
    #[must_use]
    pub fn addresses_in_use(&self) -> u64 {
        let out = Command::new(bin::weir())
            .args(["ipam", "utilization", "-o", "json", "--datastore"])
            .arg(format!(
                "embedded:{}",
                self.dirs.path("state/ipam.redb").display()
            ))
            .arg("--api-socket")
            .arg(self.socket())
            .output()
            .expect("weir ipam utilization");
        let pools: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "weir ipam utilization -o json: {e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        pools
            .as_array()
            .expect("a list of pools")
            .iter()
            .map(|p| p["in_use"].as_u64().expect("in_use"))
            .sum()
    }

    /// The agent's status (`GET /v1/status`), through `curl` inside the node.
    #[must_use]
    pub fn api_get(&self, path: &str) -> Value {
        let socket = self.socket();
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10", "--unix-socket"])
            .arg(&socket)
            .arg(format!("http://weir{path}"))
            .output()
            .expect("curl");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }
}

/// `conf` with `prevResult` set (or unchanged).
#[must_use]
pub fn with_prev(conf: &Value, prev: Option<&Value>) -> Value {
    let mut conf = conf.clone();
    if let Some(prev) = prev {
        conf["prevResult"] = prev.clone();
    }
    conf
}

/// A pod: a network namespace and a container id.
#[derive(Debug)]
pub struct Pod {
    /// Its namespace.
    pub ns: NetNs,
    /// `CNI_CONTAINERID`.
    pub id: String,
    /// `CNI_ARGS`.
    pub args: Option<String>,
}

impl Pod {
    /// A fresh pod namespace with a unique container id.
    #[must_use]
    pub fn new() -> Self {
        let ns = NetNs::new();
        let id = format!("{}-{}", ns.name(), names::unique("c"));
        Self { ns, id, args: None }
    }

    /// A pod with Kubernetes arguments.
    #[must_use]
    pub fn k8s(namespace: &str, name: &str) -> Self {
        let mut pod = Self::new();
        pod.args = Some(format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"
        ));
        pod
    }

    /// `CNI_NETNS`.
    #[must_use]
    pub fn netns_path(&self) -> String {
        format!("/run/netns/{}", self.ns.name())
    }

    /// A call of `command` for this pod as `eth0`.
    #[must_use]
    pub fn call(&self, command: &'static str) -> Call<'_> {
        Call {
            command,
            container_id: Some(&self.id),
            netns: Some(self.netns_path()),
            ifname: Some("eth0"),
            args: self.args.as_deref(),
        }
    }

    /// The pod's IPv4 address from an ADD result.
    #[must_use]
    pub fn ipv4(result: &Value) -> String {
        Self::address(result, false)
    }

    /// The pod's address of a family from an ADD result.
    #[must_use]
    pub fn address(result: &Value, ipv6: bool) -> String {
        result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str())
            .find(|a| a.contains(':') == ipv6)
            .and_then(|a| a.split('/').next())
            .unwrap_or_else(|| panic!("no address in {result}"))
            .to_owned()
    }
}

impl Default for Pod {
    fn default() -> Self {
        Self::new()
    }
}

/// The CNI environment of one call.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    /// `CNI_COMMAND`.
    pub command: &'a str,
    /// `CNI_CONTAINERID`.
    pub container_id: Option<&'a str>,
    /// `CNI_NETNS`.
    pub netns: Option<String>,
    /// `CNI_IFNAME`.
    pub ifname: Option<&'a str>,
    /// `CNI_ARGS`.
    pub args: Option<&'a str>,
}

/// What the plugin did.
#[derive(Debug)]
pub struct CniOutput {
    /// Exit status.
    pub status: ExitStatus,
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
    /// stdout as JSON (Null when empty or not JSON).
    pub json: Value,
}

impl CniOutput {
    /// Asserts success and returns the JSON.
    pub fn ok(&self, what: &str) -> &Value {
        assert!(
            self.status.success(),
            "{what} failed ({}): {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        &self.json
    }

    /// Asserts failure with `code` and returns the message.
    pub fn err(&self, code: u64, what: &str) -> String {
        assert!(
            !self.status.success(),
            "{what} succeeded but should fail with {code}: {}",
            self.stdout
        );
        assert_eq!(
            self.json["code"].as_u64(),
            Some(code),
            "{what}: wrong code: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self.json["msg"].as_str().unwrap_or_default().to_owned()
    }
}

/// Runs `weir-cni` with `call` and `stdin`, inside `node` when given, with a clean environment.
#[must_use]
pub fn exec_in(node: Option<&NetNs>, call: &Call<'_>, stdin: &Value) -> CniOutput {
    exec_raw(node, call, stdin.to_string().as_bytes())
}

/// Like [`exec_in`], with raw stdin bytes.
#[must_use]
pub fn exec_raw(node: Option<&NetNs>, call: &Call<'_>, stdin: &[u8]) -> CniOutput {
    exec_plugin(node, &bin::weir_cni(), call, stdin)
}

/// Runs any CNI plugin binary (Debian's chained plugins) the same way.
#[must_use]
pub fn exec_plugin(
    node: Option<&NetNs>,
    plugin: &std::path::Path,
    call: &Call<'_>,
    stdin: &[u8],
) -> CniOutput {
    exec_plugin_env(node, plugin, call, stdin, &[])
}

/// Like [`exec_plugin`], with extra environment variables (`WEIR_CNI_FAILPOINT`).
#[must_use]
pub fn exec_plugin_env(
    node: Option<&NetNs>,
    plugin: &std::path::Path,
    call: &Call<'_>,
    stdin: &[u8],
    extra_env: &[(&str, &str)],
) -> CniOutput {
    let mut cmd = match node {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{}", ns.name()))
                .arg("--")
                .arg(plugin);
            c
        }
        None => Command::new(plugin),
    };
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", call.command)
        .env("CNI_PATH", "/usr/lib/cni")
        .envs(extra_env.iter().copied());
    if let Some(v) = call.container_id {
        cmd.env("CNI_CONTAINERID", v);
    }
    if let Some(v) = &call.netns {
        cmd.env("CNI_NETNS", v);
    }
    if let Some(v) = call.ifname {
        cmd.env("CNI_IFNAME", v);
    }
    if let Some(v) = call.args {
        cmd.env("CNI_ARGS", v);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", plugin.display()));
    if let Some(mut input) = child.stdin.take() {
        let _ = input.write_all(stdin);
    }
    let out = child.wait_with_output().expect("weir-cni output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    CniOutput {
        status: out.status,
        json: serde_json::from_str(stdout.trim()).unwrap_or(Value::Null),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
