//! A real runtime: Debian's containerd 1.6 (`ctr run --cni`) starts a busybox container whose
//! network comes from weir — an address from the agent and TCP to the node — and removing the
//! container (its task exits, `ctr run --rm` runs DEL) releases the address within seconds, long
//! before the allocation could expire.
//!
//! `ctr` 1.6 reads `/etc/cni/net.d` and `/opt/cni/bin` and has no flags for them, and containerd
//! keeps shim sockets and FIFOs under `/run/containerd` and libcni caches under `/var/lib/cni`.
//! So containerd runs inside the test's node network namespace and in its own mount namespace
//! (`unshare -m`, private propagation) where `/etc`, `/opt`, `/run` and `/var` are overlays whose
//! upper layers live on a private tmpfs, and the two CNI directories are bind mounts of temporary
//! ones: the host's files are never written. Everything dies with the guard, also on panic.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    net::{SocketAddr, TcpListener},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{bin, cni::CniNode, names, netns::NetNs, privileged::require_root};

/// The node's own address the container connects to (on the node namespace's `lo`).
const NODE_IP: &str = "10.99.0.1";
const NODE_PORT: u16 = 18_081;
/// Bound of every wait and every `ctr` call.
const WAIT: Duration = Duration::from_secs(30);
/// Bound of the foreground `ctr run` (the container outlives the test's checks).
const RUN_BOUND: Duration = Duration::from_secs(180);

/// The mount namespace set-up, then containerd (run by `sh -c` with the temp dir as `$1`).
const SETUP: &str = r#"set -eu
T="$1"
mount --make-rprivate /
mount -t tmpfs wt-ctrd "$T/ovl"
for d in etc opt run var; do
  mkdir -p "$T/ovl/$d-up" "$T/ovl/$d-work"
  mount -t overlay wt-ctrd-$d -o "lowerdir=/$d,upperdir=$T/ovl/$d-up,workdir=$T/ovl/$d-work" "/$d"
done
mkdir -p /etc/cni/net.d /opt/cni/bin
mount --bind "$T/net.d" /etc/cni/net.d
mount --bind "$T/bin" /opt/cni/bin
exec containerd --config "$T/config.toml"
"#;

/// containerd in its own mount namespace inside a node network namespace; killed, with its shims
/// and containers, on drop (the mount namespace and its overlays go with the last process).
struct Containerd {
    dir: tempfile::TempDir,
    child: Child,
    containers: Vec<String>,
}

impl Containerd {
    /// Starts containerd with `conflist` as the only CNI config and weir-cni as the only plugin.
    fn start(node: &NetNs, conflist: &Value) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("wt-ctrd")
            .tempdir()
            .expect("temp dir");
        let t = dir.path();
        for sub in ["ovl", "net.d", "bin", "root", "state"] {
            fs::create_dir_all(t.join(sub)).expect("containerd dirs");
        }
        fs::write(t.join("net.d/10-weir.conflist"), conflist.to_string()).expect("conflist");
        symlink(bin::weir_cni(), t.join("bin/weir-cni")).expect("plugin link");
        fs::write(
            t.join("config.toml"),
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.internal.v1.opt\"]\n\
                 [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n",
                root = t.join("root").display(),
                state = t.join("state").display(),
                sock = t.join("containerd.sock").display(),
            ),
        )
        .expect("containerd config");
        let log = fs::File::create(t.join("containerd.log")).expect("containerd log");
        let child = Command::new("nsenter")
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
            .arg(SETUP)
            .arg("sh")
            .arg(t)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let mut ctrd = Self {
            dir,
            child,
            containers: Vec::new(),
        };
        let deadline = Instant::now() + WAIT;
        loop {
            if ctrd.ctr(&["version"]).status.success() {
                return ctrd;
            }
            if let Ok(Some(status)) = ctrd.child.try_wait() {
                panic!("containerd exited ({status}):\n{}", ctrd.log());
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not serve within {WAIT:?}:\n{}",
                ctrd.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.path().join("containerd.log")).unwrap_or_default()
    }

    /// `ctr` inside containerd's mount and network namespaces.
    fn ctr_command(&self, bound: Duration, args: &[&str]) -> Command {
        let mut cmd = Command::new("timeout");
        cmd.args(["-s", "KILL", &bound.as_secs().to_string()])
            .arg("nsenter")
            .args(["-t", &self.child.id().to_string(), "-m", "-n", "--"])
            .arg("ctr")
            .arg("--address")
            .arg(self.path().join("containerd.sock"))
            .args(args);
        cmd
    }

    fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_command(WAIT, args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr")
    }

    /// `ctr run --rm --cni` of `id` in the foreground (its DEL runs when the task exits).
    fn run(&mut self, id: &str, rootfs: &Path, script: &str) -> Child {
        self.containers.push(id.to_owned());
        let rootfs = rootfs.display().to_string();
        let log = fs::File::create(self.path().join(format!("{id}.log"))).expect("ctr log");
        let cgroup = format!("/{id}");
        self.ctr_command(
            RUN_BOUND,
            &[
                "run", "--rm", "--cni", "--cgroup", &cgroup, "--rootfs", &rootfs, id, "/bin/sh",
                "-c", script,
            ],
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("ctr run")
    }

    fn run_log(&self, id: &str) -> String {
        fs::read_to_string(self.path().join(format!("{id}.log"))).unwrap_or_default()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for id in &self.containers {
            let _ = self.ctr(&["task", "kill", "-s", "SIGKILL", id]);
            let _ = self.ctr(&["task", "delete", "--force", id]);
            let _ = self.ctr(&["container", "delete", id]);
        }
        let pids = tests::cri::mount_namespace_processes(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in pids {
            if pid != self.child.id() {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        // runc removes a container's cgroups when it is deleted; a killed run may leave them.
        if let Ok(controllers) = fs::read_dir("/sys/fs/cgroup") {
            for controller in controllers.filter_map(Result::ok) {
                for id in &self.containers {
                    let _ = fs::remove_dir(controller.path().join(id));
                }
            }
        }
    }
}

/// A rootfs holding Debian's static busybox and the mount points runc needs.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .expect("busybox is missing: install busybox-static (cargo xtask setup --apt)");
    let rootfs = dir.join("rootfs");
    for sub in ["bin", "proc", "sys", "dev", "tmp", "etc", "run"] {
        fs::create_dir_all(rootfs.join(sub)).expect("rootfs dirs");
    }
    fs::copy(busybox, rootfs.join("bin/busybox")).expect("copy busybox");
    for applet in ["sh", "nc", "ip", "sleep", "echo", "seq"] {
        symlink("busybox", rootfs.join("bin").join(applet)).expect("applet link");
    }
    rootfs
}

/// Waits (bounded) for `check` to hold.
fn wait_for(what: &str, check: impl FnMut() -> bool, context: impl Fn() -> String) {
    tests::wait::until_or_show(what, WAIT, check, context);
}

#[test]
fn containerd_runs_a_container_on_weir_and_del_releases_its_address() {
    if !require_root("containerd_runs_a_container_on_weir_and_del_releases_its_address") {
        return;
    }
    let node = CniNode::start(&["--pool", "10.244.0.0/16"]);
    node.ns
        .exec(&["ip", "addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"]);
    node.ns.exec(&["ip", "link", "set", "lo", "up"]);

    // The agent's own conflist — by default at the CNI version containerd 1.6's libcni reads
    // (up to 1.0.0) — with the plugin logging into the test's directory.
    let written = node.dirs.path("net.d/04-weir.conflist");
    let mut conflist: Value =
        serde_json::from_str(&fs::read_to_string(&written).expect("the agent wrote its conflist"))
            .expect("the agent's conflist is JSON");
    assert_eq!(conflist["cniVersion"], "1.0.0", "the agent's default");
    conflist["plugins"][0]["logFile"] = json!(node.log.path().join("weir-cni.log"));
    let network = conflist["name"].as_str().expect("network name").to_owned();

    let mut ctrd = Containerd::start(&node.ns, &conflist);
    let rootfs = busybox_rootfs(ctrd.path());
    let listen: SocketAddr = format!("{NODE_IP}:{NODE_PORT}").parse().expect("addr");
    let listener = node
        .ns
        .run(move || TcpListener::bind(listen))
        .expect("listener in the node");
    listener.set_nonblocking(true).expect("nonblocking");

    let id = names::unique("wtc");
    let script = format!(
        "ip -o addr show dev eth0; \
         for i in $(seq 1 100); do echo hello-from-container | nc -w 3 {NODE_IP} {NODE_PORT} && break; sleep 0.2; done; \
         exec sleep 600"
    );
    let mut run = ctrd.run(&id, &rootfs, &script);
    let plugin_log = || {
        format!(
            "ctr run:\n{}\nweir-cni:\n{}\ncontainerd:\n{}",
            ctrd.run_log(&id),
            fs::read_to_string(node.log.path().join("weir-cni.log")).unwrap_or_default(),
            ctrd.log()
        )
    };

    // Connectivity: the container reaches the node over TCP, from its weir address.
    let deadline = Instant::now() + WAIT;
    let (conn, peer) = loop {
        match listener.accept() {
            Ok(accepted) => break accepted,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    Instant::now() < deadline,
                    "the container never connected to the node within {WAIT:?}\n{}",
                    plugin_log()
                );
                if let Ok(Some(status)) = run.try_wait() {
                    panic!(
                        "ctr run exited ({status}) before connecting\n{}",
                        plugin_log()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).expect("blocking");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "hello-from-container");

    // The address: the agent holds it, confirmed, under `<network>.<ctr's container id>`.
    let handle = format!("{network}.default-{id}");
    let held = node.api_get(&format!("/v1/ipam/handles/{handle}"));
    assert_eq!(held["confirmed"], json!(true), "handle {handle}: {held}");
    let ips: Vec<String> = held["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        ips,
        vec![peer.ip().to_string()],
        "the container spoke from its weir address"
    );
    assert!(
        ctrd.run_log(&id).contains(&ips[0]),
        "eth0 inside the container carries {}:\n{}",
        ips[0],
        ctrd.run_log(&id)
    );
    let endpoints = node.api_get("/v1/endpoints");
    assert!(
        endpoints.to_string().contains(&format!("default-{id}")),
        "the endpoint is registered: {endpoints}"
    );

    // Removing the container: its task dies, `ctr run --rm` runs DEL and deletes it.
    let kill = ctrd.ctr(&["task", "kill", "-s", "SIGKILL", &id]);
    assert!(
        kill.status.success(),
        "ctr task kill: {}",
        String::from_utf8_lossy(&kill.stderr)
    );
    wait_for(
        "ctr run --rm finishes",
        || run.try_wait().ok().flatten().is_some(),
        plugin_log,
    );
    wait_for(
        "DEL releases the address (the allocation would only expire after minutes)",
        || {
            let answer = node.api_get(&format!("/v1/ipam/handles/{handle}"));
            // The agent answers a free handle with no addresses (or an error object).
            answer.is_object()
                && answer
                    .get("ips")
                    .is_none_or(|ips| ips.as_array().is_some_and(Vec::is_empty))
        },
        || {
            format!(
                "{}\n{}",
                node.api_get(&format!("/v1/ipam/handles/{handle}")),
                plugin_log()
            )
        },
    );
    let endpoints = node.api_get("/v1/endpoints");
    assert!(
        !endpoints.to_string().contains(&format!("default-{id}")),
        "the endpoint is gone: {endpoints}"
    );
    let containers = ctrd.ctr(&["containers", "list", "-q"]);
    assert!(
        !String::from_utf8_lossy(&containers.stdout).contains(&id),
        "the container is removed"
    );
}
