//! The kubelet path: a containerd of the test's own with its CRI plugin, driven through the CRI
//! gRPC API (`k8s-cri`) exactly as kubelet drives it — `RunPodSandbox` with pod metadata and
//! kubelet's labels, `PodSandboxStatus`, `StopPodSandbox`, `RemovePodSandbox` — so containerd's
//! own libcni runs the CNI plugins of the conflist it finds, with the `K8S_POD_*` arguments.
//!
//! containerd gets its own root, state, sockets, `opt` path, runc root, CNI `bin_dir` and
//! `conf_dir`, and `restrict_oom_score_adj = true` (root here lacks `CAP_SYS_RESOURCE`). What it
//! writes outside those — shim sockets under `/run/containerd/s`, the `cni-*` network namespaces
//! under `/run/netns`, libcni's result cache under `/var/lib/cni`, the plugin's default log under
//! `/var/log` — lands on overlays of `/run` and `/var` in a private mount namespace held by a
//! process of the guard's, so the host's files are never written and everything goes with the
//! guard (also on panic). containerd runs in the node's network namespace, so pods' host-side
//! veths appear there, and can be restarted inside the same mount namespace while pods run.
//!
//! The sandbox image is a `pause` built here from a static C program and `buildah from scratch`
//! (nothing can be pulled on these machines), imported with `ctr images import`.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxState, PodSandboxStatusRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StopPodSandboxRequest, VersionRequest,
    runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{names, netns::NetNs};

/// The sandbox image containerd's CRI plugin runs (built and imported by [`Cri::start`]).
pub const PAUSE_IMAGE: &str = "localhost/wt-pause:1";
/// Bound of containerd's start and of every CRI call.
pub const CRI_WAIT: Duration = Duration::from_secs(60);

/// The pause program: sleeps until a signal ends it, and reaps children (PID 1 of the sandbox).
const PAUSE_C: &str = r#"#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, stop); signal(SIGTERM, stop); signal(SIGCHLD, reap);
  for (;;) pause();
}
"#;

/// The mount namespace: private propagation, overlays on `/run` and `/var` (and the directories
/// named in `$2`, e.g. `etc opt`) whose upper layers live on a tmpfs of the guard's, then a holder
/// process keeps it alive (run by `sh -c` with the guard's directory as `$1`).
const HOLDER: &str = r#"set -eu
T="$1"
mount --make-rprivate /
mount -t tmpfs wt-cri "$T/ovl"
for d in run var ${2:-}; do
  mkdir -p "$T/ovl/$d-up" "$T/ovl/$d-work"
  mount -t overlay wt-cri-$d -o "lowerdir=/$d,upperdir=$T/ovl/$d-up,workdir=$T/ovl/$d-work" "/$d"
done
echo ready
exec sleep 100000
"#;

/// A pod as kubelet describes it to the runtime.
#[derive(Debug, Clone)]
pub struct PodSpec {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// The pod's labels (kubelet copies them onto the sandbox).
    pub labels: HashMap<String, String>,
}

impl PodSpec {
    /// A pod `namespace/name` with a fresh UID and no labels.
    #[must_use]
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: format!("{}-{name}", names::unique("u")),
            labels: HashMap::new(),
        }
    }
}

/// A sandbox as `PodSandboxStatus` reports it.
#[derive(Debug, Clone)]
pub struct SandboxStatus {
    /// `SANDBOX_READY`.
    pub ready: bool,
    /// The pod's primary address (from the CNI result).
    pub ip: String,
    /// The pause process, whose network namespace is the pod's.
    pub pid: u32,
}

/// How [`Cri::start`] sets containerd up.
#[derive(Debug, Clone)]
pub struct CriSetup {
    /// containerd's CNI `conf_dir` (for weir: the agent's `--cni-conf-dir`, unedited).
    pub conf_dir: PathBuf,
    /// Plugins to place in containerd's CNI `bin_dir`, by type (`loopback` is always added).
    pub plugins: Vec<(String, PathBuf)>,
}

/// containerd with its CRI plugin, in its own mount namespace inside `node`'s network namespace.
#[derive(Debug)]
pub struct Cri {
    dir: tempfile::TempDir,
    holder: Child,
    containerd: Option<Child>,
    runtime: tokio::runtime::Runtime,
    client: Mutex<Option<RuntimeServiceClient<Channel>>>,
    cgroup_parent: String,
    sandboxes: Mutex<Vec<String>>,
    /// containerd's starts, for naming its log files.
    starts: u32,
}

fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Builds the pause image as an OCI archive in `dir` and returns its path.
pub fn build_pause_image(dir: &Path) -> PathBuf {
    let src = dir.join("pause.c");
    let bin = dir.join("pause");
    fs::write(&src, PAUSE_C).expect("write pause.c");
    run_ok(
        Command::new("cc")
            .args(["-static", "-Os", "-o"])
            .arg(&bin)
            .arg(&src),
        "cc -static pause.c (install libc6-dev: cargo xtask setup)",
    );
    let storage = dir.join("buildah");
    let buildah = |args: &[&str]| -> Output {
        run_ok(
            Command::new("buildah")
                .arg("--root")
                .arg(storage.join("root"))
                .arg("--runroot")
                .arg(storage.join("runroot"))
                .args(["--storage-driver", "vfs"])
                .args(args),
            &format!("buildah {args:?} (install buildah: cargo xtask setup)"),
        )
    };
    let container = String::from_utf8_lossy(&buildah(&["from", "scratch"]).stdout)
        .trim()
        .to_owned();
    buildah(&["copy", &container, &bin.display().to_string(), "/pause"]);
    buildah(&["config", "--entrypoint", r#"["/pause"]"#, &container]);
    buildah(&["commit", "--quiet", &container, PAUSE_IMAGE]);
    let archive = dir.join("pause.oci.tar");
    buildah(&[
        "push",
        "--quiet",
        PAUSE_IMAGE,
        &format!("oci-archive:{}:{PAUSE_IMAGE}", archive.display()),
    ]);
    // buildah's vfs layers are plain directories; nothing of it is needed past the archive.
    let _ = fs::remove_dir_all(&storage);
    archive
}

impl Cri {
    /// Starts containerd with its CRI plugin in `node`, imports the pause image, and connects.
    #[must_use]
    pub fn start(node: &NetNs, setup: &CriSetup) -> Self {
        Self::start_with_overlays(node, setup, &[])
    }

    /// [`Cri::start`], with overlays on these top-level directories too (e.g. `etc`, `opt`), so
    /// that host paths a container mounts (`/etc/cni/net.d`, `/opt/cni/bin`) can be created and
    /// bound inside the namespace without touching the host's.
    #[must_use]
    pub fn start_with_overlays(node: &NetNs, setup: &CriSetup, overlays: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("wt-cri")
            .tempdir()
            .expect("temp dir");
        let t = dir.path();
        for sub in [
            "ovl", "bin", "root", "state", "opt", "runc", "image", "logs",
        ] {
            fs::create_dir_all(t.join(sub)).expect("containerd dirs");
        }
        let loopback = ["/usr/lib/cni/loopback", "/opt/cni/bin/loopback"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .expect(
                "the loopback CNI plugin is missing: install containernetworking-plugins (cargo xtask setup)",
            );
        std::os::unix::fs::symlink(loopback, t.join("bin/loopback")).expect("loopback link");
        for (name, path) in &setup.plugins {
            std::os::unix::fs::symlink(path, t.join("bin").join(name)).expect("plugin link");
        }
        let cgroup_parent = format!("/{}", names::unique("cg"));
        fs::write(t.join("config.toml"), config_toml(t, &setup.conf_dir))
            .expect("containerd config");
        let archive = build_pause_image(&t.join("image"));

        let mut holder = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", node.name()))
            .args([
                "--",
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
            ])
            .arg(HOLDER)
            .arg("sh")
            .arg(t)
            .arg(overlays.join(" "))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the mount namespace holder");
        // Wait for "ready": the overlays are in place.
        {
            use std::io::BufRead as _;
            let out = holder.stdout.take().expect("holder stdout");
            let mut line = String::new();
            std::io::BufReader::new(out)
                .read_line(&mut line)
                .expect("read the holder's output");
            assert_eq!(line.trim(), "ready", "the mount namespace was not set up");
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let mut cri = Self {
            dir,
            holder,
            containerd: None,
            runtime,
            client: Mutex::new(None),
            cgroup_parent,
            sandboxes: Mutex::new(Vec::new()),
            starts: 0,
        };
        cri.start_containerd();
        let import = cri.ctr(&[
            "-n",
            "k8s.io",
            "images",
            "import",
            &archive.display().to_string(),
        ]);
        assert!(
            import.status.success(),
            "ctr images import: {}{}",
            String::from_utf8_lossy(&import.stdout),
            String::from_utf8_lossy(&import.stderr)
        );
        cri
    }

    /// The guard's directory (containerd's root, state and logs).
    #[must_use]
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn socket(&self) -> PathBuf {
        self.path().join("containerd.sock")
    }

    /// Starts containerd (again) inside the mount namespace and waits until its CRI answers.
    pub fn start_containerd(&mut self) {
        self.starts += 1;
        let log = fs::File::create(self.path().join(format!("containerd-{}.log", self.starts)))
            .expect("containerd log");
        let child = Command::new("nsenter")
            .args(["-t", &self.holder.id().to_string(), "-m", "-n", "--"])
            .arg("containerd")
            .arg("--config")
            .arg(self.path().join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start containerd");
        self.containerd = Some(child);
        let deadline = Instant::now() + CRI_WAIT;
        loop {
            if let Some(client) = self.connect() {
                let mut probe = client.clone();
                let answered = self
                    .runtime
                    .block_on(async {
                        tokio::time::timeout(
                            Duration::from_secs(5),
                            probe.version(VersionRequest::default()),
                        )
                        .await
                    })
                    .is_ok_and(|r| r.is_ok());
                if answered {
                    *self.client.lock().expect("client lock") = Some(client);
                    return;
                }
            }
            if let Some(Ok(Some(status))) = self.containerd.as_mut().map(Child::try_wait) {
                panic!("containerd exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "containerd's CRI did not answer within {CRI_WAIT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops containerd (SIGTERM, then SIGKILL after a bound); pods and their shims keep running.
    pub fn stop_containerd(&mut self) {
        *self.client.lock().expect("client lock") = None;
        if let Some(mut child) = self.containerd.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid")),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(15);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn connect(&self) -> Option<RuntimeServiceClient<Channel>> {
        let path = self.socket();
        if !path.exists() {
            return None;
        }
        let channel = self.runtime.block_on(async move {
            Endpoint::try_from("http://[::]:50051")
                .ok()?
                .connect_timeout(Duration::from_secs(5))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .ok()
        })?;
        Some(RuntimeServiceClient::new(channel))
    }

    fn client(&self) -> RuntimeServiceClient<Channel> {
        self.client
            .lock()
            .expect("client lock")
            .clone()
            .expect("containerd is not running")
    }

    /// containerd's log (every start's).
    #[must_use]
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                fs::read_to_string(self.path().join(format!("containerd-{n}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n--- containerd restarted ---\n")
    }

    /// A file as processes in containerd's mount namespace see it (e.g. the plugin's default log
    /// under `/var/log`, which lands on the overlay).
    #[must_use]
    pub fn read_inside(&self, path: &str) -> String {
        fs::read_to_string(format!("/proc/{}/root{path}", self.holder.id())).unwrap_or_default()
    }

    /// `path` as seen from the host through the namespace's holder (`/proc/PID/root/…`): files
    /// and sockets that processes in the namespace see at `path`.
    #[must_use]
    pub fn inside(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{path}", self.holder.id()))
    }

    /// Runs `sh -c script` inside the mount namespace (and `node`'s network namespace), asserting
    /// success.
    pub fn run_inside(&self, script: &str) -> Output {
        run_ok(
            Command::new("nsenter")
                .args(["-t", &self.holder.id().to_string(), "-m", "-n", "--"])
                .args(["sh", "-c", script]),
            &format!("sh -c {script:?} in the containerd namespace"),
        )
    }

    /// The version containerd itself reports (the server's, from `ctr version`).
    #[must_use]
    pub fn server_version(&self) -> String {
        let out = String::from_utf8_lossy(&self.ctr(&["version"]).stdout).into_owned();
        out.split("Server:")
            .nth(1)
            .and_then(|server| {
                server
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("Version:"))
                    .map(|v| v.trim().to_owned())
            })
            .unwrap_or_default()
    }

    /// `ctr` against this containerd.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("timeout")
            .args(["-s", "KILL", &CRI_WAIT.as_secs().to_string()])
            .arg("nsenter")
            .args(["-t", &self.holder.id().to_string(), "-m", "-n", "--"])
            .arg("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr")
    }

    fn sandbox_config(&self, pod: &PodSpec) -> PodSandboxConfig {
        let mut labels = pod.labels.clone();
        // The labels kubelet adds to every sandbox.
        labels.insert("io.kubernetes.pod.name".into(), pod.name.clone());
        labels.insert("io.kubernetes.pod.namespace".into(), pod.namespace.clone());
        labels.insert("io.kubernetes.pod.uid".into(), pod.uid.clone());
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                namespace: pod.namespace.clone(),
                attempt: 0,
            }),
            hostname: pod.name.clone(),
            log_directory: self
                .path()
                .join("logs")
                .join(&pod.uid)
                .display()
                .to_string(),
            labels,
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Pod.into(),
                        pid: NamespaceMode::Container.into(),
                        ipc: NamespaceMode::Pod.into(),
                        ..NamespaceOption::default()
                    }),
                    ..LinuxSandboxSecurityContext::default()
                }),
                ..LinuxPodSandboxConfig::default()
            }),
            ..PodSandboxConfig::default()
        }
    }

    /// `RunPodSandbox`: the sandbox id, or containerd's error (the CNI plugin's, for a network
    /// failure).
    pub fn run_pod(&self, pod: &PodSpec) -> Result<String, tonic::Status> {
        let request = RunPodSandboxRequest {
            config: Some(self.sandbox_config(pod)),
            runtime_handler: String::new(),
        };
        let mut client = self.client();
        let id = self.runtime.block_on(async move {
            tokio::time::timeout(CRI_WAIT, client.run_pod_sandbox(request))
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("RunPodSandbox took too long"))?
                .map(|r| r.into_inner().pod_sandbox_id)
        })?;
        self.sandboxes
            .lock()
            .expect("sandboxes lock")
            .push(id.clone());
        Ok(id)
    }

    /// `PodSandboxStatus` (verbose: the pause process id comes from its `info`).
    pub fn status(&self, id: &str) -> Result<SandboxStatus, tonic::Status> {
        let request = PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: true,
        };
        let mut client = self.client();
        let answer = self.runtime.block_on(async move {
            tokio::time::timeout(CRI_WAIT, client.pod_sandbox_status(request))
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("PodSandboxStatus took too long"))?
                .map(tonic::Response::into_inner)
        })?;
        let status = answer.status.unwrap_or_default();
        let info: serde_json::Value = answer
            .info
            .get("info")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or_default();
        Ok(SandboxStatus {
            ready: status.state == i32::from(PodSandboxState::SandboxReady),
            ip: status.network.map(|n| n.ip).unwrap_or_default(),
            pid: info["pid"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .unwrap_or(0),
        })
    }

    /// `StopPodSandbox` (containerd runs CNI DEL with the netns and the cached result).
    pub fn stop(&self, id: &str) -> Result<(), tonic::Status> {
        let request = StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        let mut client = self.client();
        self.runtime.block_on(async move {
            tokio::time::timeout(CRI_WAIT, client.stop_pod_sandbox(request))
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("StopPodSandbox took too long"))?
                .map(|_| ())
        })
    }

    /// `RemovePodSandbox` (containerd runs CNI DEL again, without a netns or prevResult).
    pub fn remove(&self, id: &str) -> Result<(), tonic::Status> {
        let request = RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        let mut client = self.client();
        self.runtime.block_on(async move {
            tokio::time::timeout(CRI_WAIT, client.remove_pod_sandbox(request))
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("RemovePodSandbox took too long"))?
                .map(|_| ())
        })?;
        self.sandboxes
            .lock()
            .expect("sandboxes lock")
            .retain(|s| s != id);
        Ok(())
    }

    /// Sandboxes run and not yet removed.
    #[must_use]
    pub fn sandboxes(&self) -> Vec<String> {
        self.sandboxes.lock().expect("sandboxes lock").clone()
    }

    /// Processes sharing containerd's mount namespace (the holder, containerd, shims, pauses).
    fn namespace_processes(&self) -> Vec<u32> {
        mount_namespace_processes(self.holder.id())
    }
}

/// Every process in the mount namespace of process `pid` (a runtime's, with its shims), so a
/// guard can end them all.
#[must_use]
pub fn mount_namespace_processes(pid: u32) -> Vec<u32> {
    let Ok(target) = fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| fs::read_link(format!("/proc/{p}/ns/mnt")).is_ok_and(|l| l == target))
        .collect()
}

fn config_toml(t: &Path, conf_dir: &Path) -> String {
    let p = |sub: &str| t.join(sub).display().to_string();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{runc}"
"#,
        root = p("root"),
        state = p("state"),
        sock = p("containerd.sock"),
        opt = p("opt"),
        bin = p("bin"),
        conf = conf_dir.display(),
        runc = p("runc"),
    )
}

impl Drop for Cri {
    fn drop(&mut self) {
        // As kubelet would: stop and remove what is left (bounded by the CRI calls' own bound),
        // so the plugin releases what it holds while the runtime still answers.
        if self.client.lock().map(|c| c.is_some()).unwrap_or(false) {
            for id in self.sandboxes() {
                let _ = self.stop(&id);
                let _ = self.remove(&id);
            }
        }
        let pids = self.namespace_processes();
        if let Some(mut child) = self.containerd.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in pids {
            if pid != self.holder.id()
                && let Ok(pid) = i32::try_from(pid)
            {
                // Gone already is fine: the shims exit with their containers.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        // The pods' cgroups under the test's own parent, leaves first.
        if let Ok(controllers) = fs::read_dir("/sys/fs/cgroup") {
            for controller in controllers.filter_map(Result::ok) {
                let parent = controller
                    .path()
                    .join(self.cgroup_parent.trim_start_matches('/'));
                remove_cgroup_tree(&parent);
            }
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}
