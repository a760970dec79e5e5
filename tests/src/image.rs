//! The container image (`cargo xtask image`) and its containers run as the kubelet would run the
//! DaemonSet's: a `k8s-openapi` [`Container`] and the pod's volumes turned into `ctr run` flags —
//! host networking, the command, the environment, hostPath binds with their propagation, and the
//! security context (privileged, or the default capabilities dropped and the named ones added, a
//! read-only root, no new privileges) — against the [`Cri`] harness's containerd.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Container, PodSpec};

use crate::{cri::Cri, names};

/// The containerd namespace the image and containers live in (the CRI's).
pub const CTR_NAMESPACE: &str = "k8s.io";

/// The capabilities containerd gives a container by default (what `drop: [ALL]` removes).
const DEFAULT_CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Builds the image with `cargo xtask image --debug` (incremental: seconds when nothing changed)
/// and returns (image name, OCI archive). `WEIR_IMAGE_ARCHIVE=NAME=PATH` uses a prebuilt one.
#[must_use]
pub fn build() -> (String, PathBuf) {
    if let Ok(spec) = std::env::var("WEIR_IMAGE_ARCHIVE")
        && let Some((name, path)) = spec.split_once('=')
    {
        return (name.to_owned(), PathBuf::from(path));
    }
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["xtask", "image", "--debug"])
        .current_dir(ws)
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .expect("run cargo xtask image");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo xtask image failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let (name, path) = last
        .split_once(' ')
        .unwrap_or_else(|| panic!("cargo xtask image printed {last:?}"));
    (name.to_owned(), PathBuf::from(path))
}

/// A container of the pod, run by `ctr`; killed and deleted on drop.
#[derive(Debug)]
pub struct CtrContainer<'a> {
    cri: &'a Cri,
    /// Its `ctr` id (`wt…`).
    pub id: String,
    /// Its combined stdout and stderr (`--log-uri`), for detached containers.
    pub log: PathBuf,
}

/// How [`run`] starts a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Wait for it to exit (an init container) and assert it succeeded.
    ToCompletion,
    /// Start it and return (the agent).
    Detached,
}

/// The `ctr run` arguments for `container` of `pod`, with `env` as its environment.
fn run_args(
    image: &str,
    id: &str,
    pod: &PodSpec,
    container: &Container,
    env: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    if pod.host_network == Some(true) {
        args.push("--net-host".into());
    }
    let sc = container.security_context.clone().unwrap_or_default();
    if sc.privileged == Some(true) {
        args.push("--privileged".into());
    } else if let Some(caps) = &sc.capabilities {
        let cap = |c: &str| {
            if c.starts_with("CAP_") {
                c.to_owned()
            } else {
                format!("CAP_{c}")
            }
        };
        for drop in caps.drop.iter().flatten() {
            if drop == "ALL" {
                args.extend(
                    DEFAULT_CAPABILITIES
                        .iter()
                        .map(|c| format!("--cap-drop={c}")),
                );
            } else {
                args.push(format!("--cap-drop={}", cap(drop)));
            }
        }
        for add in caps.add.iter().flatten() {
            args.push(format!("--cap-add={}", cap(add)));
        }
    }
    if sc.allow_privilege_escalation == Some(true) {
        args.push("--allow-new-privs".into());
    }
    if sc.read_only_root_filesystem == Some(true) {
        args.push("--read-only".into());
    }
    for (k, v) in env {
        args.push(format!("--env={k}={v}"));
    }
    for vm in container.volume_mounts.iter().flatten() {
        let host = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == vm.name)
            .and_then(|v| v.host_path.as_ref())
            .unwrap_or_else(|| panic!("volume {} is not a hostPath", vm.name));
        let propagation = match vm.mount_propagation.as_deref() {
            Some("Bidirectional") => "rshared",
            Some("HostToContainer") => "rslave",
            _ => "rprivate",
        };
        let mode = if vm.read_only == Some(true) {
            "ro"
        } else {
            "rw"
        };
        args.push(format!(
            "--mount=type=bind,src={},dst={},options=rbind:{mode}:{propagation}",
            host.path, vm.mount_path
        ));
    }
    args.push(image.to_owned());
    args.push(id.to_owned());
    args.extend(container.command.clone().unwrap_or_default());
    args.extend(container.args.clone().unwrap_or_default());
    args
}

/// Runs `container` of `pod` under `cri`'s containerd as the kubelet would: hostPath directories
/// of type `DirectoryOrCreate` are created first (inside containerd's mount namespace).
pub fn run<'a>(
    cri: &'a Cri,
    image: &str,
    pod: &PodSpec,
    container: &Container,
    env: &BTreeMap<String, String>,
    mode: Mode,
) -> CtrContainer<'a> {
    for vm in container.volume_mounts.iter().flatten() {
        if let Some(host) = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == vm.name)
            .and_then(|v| v.host_path.as_ref())
            && host.type_.as_deref() == Some("DirectoryOrCreate")
        {
            cri.run_inside(&format!("mkdir -p '{}'", host.path));
        }
    }
    let id = format!("{}-{}", names::unique("ctr"), container.name);
    let log = cri.path().join(format!("{id}.log"));
    let mut args: Vec<String> = vec!["-n".into(), CTR_NAMESPACE.into(), "run".into()];
    match mode {
        Mode::ToCompletion => args.push("--rm".into()),
        Mode::Detached => {
            args.push("--detach".into());
            args.push(format!("--log-uri=file://{}", log.display()));
        }
    }
    args.extend(run_args(image, &id, pod, container, env));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = cri.ctr(&argv);
    let guard = CtrContainer { cri, id, log };
    assert!(
        out.status.success(),
        "ctr run {} ({}) failed: {}{}",
        container.name,
        argv.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    guard
}

impl CtrContainer<'_> {
    /// The container's main process on the host (from `ctr task ls`), once it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        let out = self.cri.ctr(&["-n", CTR_NAMESPACE, "task", "ls"]);
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some(self.id.as_str()))
                .then(|| words.next()?.parse().ok())
                .flatten()
                .filter(|_| l.contains("RUNNING"))
        })
    }

    /// The log so far (stdout and stderr).
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `args` in the running container (`ctr task exec`), returning its output.
    #[must_use]
    pub fn exec(&self, args: &[&str]) -> std::process::Output {
        let exec_id = names::unique("exec");
        let mut argv = vec![
            "-n",
            CTR_NAMESPACE,
            "task",
            "exec",
            "--exec-id",
            &exec_id,
            &self.id,
        ];
        argv.extend(args);
        self.cri.ctr(&argv)
    }

    /// SIGTERM, then waits (bounded) for the task to end, as the kubelet stops a container.
    pub fn stop(&self) {
        let _ = self.cri.ctr(&[
            "-n",
            CTR_NAMESPACE,
            "task",
            "kill",
            "-s",
            "SIGTERM",
            &self.id,
        ]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.pid().is_some() {
            assert!(
                Instant::now() < deadline,
                "{} did not stop within 30 s of SIGTERM:\n{}",
                self.id,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for CtrContainer<'_> {
    fn drop(&mut self) {
        let ns = ["-n", CTR_NAMESPACE];
        let _ = self
            .cri
            .ctr(&[ns[0], ns[1], "task", "kill", "-s", "SIGKILL", &self.id]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.pid().is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.cri.ctr(&[ns[0], ns[1], "task", "delete", &self.id]);
        let _ = self
            .cri
            .ctr(&[ns[0], ns[1], "container", "delete", &self.id]);
    }
}

/// The effective capabilities of process `pid`, by name (`CapEff` of `/proc/PID/status`).
#[must_use]
pub fn effective_capabilities(pid: u32) -> Vec<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    // Bit numbers from linux/capability.h.
    let known = [
        (0, "CHOWN"),
        (1, "DAC_OVERRIDE"),
        (2, "DAC_READ_SEARCH"),
        (3, "FOWNER"),
        (4, "FSETID"),
        (5, "KILL"),
        (6, "SETGID"),
        (7, "SETUID"),
        (8, "SETPCAP"),
        (10, "NET_BIND_SERVICE"),
        (12, "NET_ADMIN"),
        (13, "NET_RAW"),
        (18, "SYS_CHROOT"),
        (19, "SYS_PTRACE"),
        (21, "SYS_ADMIN"),
        (24, "SYS_RESOURCE"),
        (27, "MKNOD"),
        (29, "AUDIT_WRITE"),
        (31, "SETFCAP"),
        (38, "PERFMON"),
        (39, "BPF"),
    ];
    (0..64)
        .filter(|bit| mask & (1 << bit) != 0)
        .map(|bit| {
            known
                .iter()
                .find(|(b, _)| *b == bit)
                .map_or_else(|| format!("cap{bit}"), |(_, n)| (*n).to_owned())
        })
        .collect()
}
