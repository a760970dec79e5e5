//! A `weir agent` process for black-box tests: its own pin root, state directory and socket,
//! optionally inside a test namespace; killed on drop.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use crate::{bin, bpf::PinRoot, netns::NetNs};

/// A running agent.
#[derive(Debug)]
pub struct AgentProcess {
    child: Option<Child>,
    /// The agent's start report (its first stdout line).
    pub started: serde_json::Value,
    /// Its API socket.
    pub socket: PathBuf,
}

/// The log (stderr) lines of an agent started by [`AgentProcess::start_logged`], as they come.
pub type AgentLog = Arc<Mutex<Vec<String>>>;

/// Where an agent keeps its files (all temporary).
#[derive(Debug)]
pub struct AgentDirs {
    /// Temporary directory holding state, socket, CNI and policy directories.
    pub dir: tempfile::TempDir,
}

impl AgentDirs {
    /// Fresh directories.
    #[must_use]
    pub fn new() -> Self {
        Self {
            dir: tempfile::Builder::new()
                .prefix("wt-agent")
                .tempdir()
                .expect("temp dir"),
        }
    }

    /// A path inside.
    #[must_use]
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Default for AgentDirs {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentProcess {
    /// Starts `weir agent` with `extra` flags and waits (bounded) for its start report.
    #[must_use]
    pub fn start(root: &PinRoot, dirs: &AgentDirs, netns: Option<&NetNs>, extra: &[&str]) -> Self {
        Self::start_with_env(root, dirs, netns, extra, &[])
    }

    /// Runs `weir agent` with `extra` flags and `env` until it exits (bounded: 60 s), for runs
    /// that must fail (a failpoint, a refusal). Returns its exit status and stderr.
    #[must_use]
    pub fn run_to_exit(
        root: &PinRoot,
        dirs: &AgentDirs,
        netns: Option<&NetNs>,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (ExitStatus, String) {
        let mut cmd = Self::command(root, dirs, netns, extra);
        cmd.envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start weir agent");
        let stderr = child.stderr.take().expect("stderr piped");
        let reader = std::thread::spawn(move || {
            let mut out = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut out);
            out
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return (status, reader.join().unwrap_or_default());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("weir agent was expected to exit but ran for 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn command(root: &PinRoot, dirs: &AgentDirs, netns: Option<&NetNs>, extra: &[&str]) -> Command {
        let weir = bin::weir();
        let mut cmd = match netns {
            // nsenter switches only the network namespace; `ip netns exec` would also give the agent
            // a private mount namespace with a fresh /sys, hiding its bpffs pins from everyone else.
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{}", ns.name()))
                    .arg("--")
                    .arg(&weir);
                c
            }
            None => Command::new(&weir),
        };
        cmd.arg("agent");
        // A test naming its node (several agents sharing one datastore) says `--node` itself.
        if !extra.contains(&"--node") {
            cmd.args(["--node", "wt-node"]);
        }
        cmd.arg("--bpf-root")
            .arg(root.path())
            .arg("--state-dir")
            .arg(dirs.path("state"))
            .arg("--api-socket")
            .arg(dirs.path("weir.sock"))
            .arg("--policy-dir")
            .arg(dirs.path("policies"))
            .arg("--cni-conf-dir")
            .arg(dirs.path("net.d"))
            // Inside its own namespace the agent has loopback to itself: the default port is free.
            .args([
                "--metrics",
                if netns.is_some() {
                    "127.0.0.1:9972"
                } else {
                    "127.0.0.1:0"
                },
            ])
            .args(extra);
        cmd
    }

    /// As [`Self::start`], with extra environment variables.
    #[must_use]
    pub fn start_with_env(
        root: &PinRoot,
        dirs: &AgentDirs,
        netns: Option<&NetNs>,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn(root, dirs, netns, extra, env, None)
    }

    /// As [`Self::start`], with the agent's log (its stderr) kept for the test to read.
    #[must_use]
    pub fn start_logged(
        root: &PinRoot,
        dirs: &AgentDirs,
        netns: Option<&NetNs>,
        extra: &[&str],
    ) -> (Self, AgentLog) {
        let log = AgentLog::default();
        let agent = Self::spawn(root, dirs, netns, extra, &[], Some(&log));
        (agent, log)
    }

    fn spawn(
        root: &PinRoot,
        dirs: &AgentDirs,
        netns: Option<&NetNs>,
        extra: &[&str],
        env: &[(&str, &str)],
        log: Option<&AgentLog>,
    ) -> Self {
        let weir = bin::weir();
        let mut cmd = Self::command(root, dirs, netns, extra);
        cmd.envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(if log.is_some() {
                Stdio::piped()
            } else {
                Stdio::inherit()
            });
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", weir.display()));
        if let Some(log) = log {
            let stderr = child.stderr.take().expect("stderr piped");
            let sink = Arc::clone(log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    sink.lock().expect("log").push(line);
                }
            });
        }
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut agent = Self {
            child: Some(child),
            started: serde_json::Value::Null,
            socket: dirs.path("weir.sock"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let line = rx
                .recv_timeout(Duration::from_millis(200))
                .unwrap_or_default();
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line)
                && value["event"] == "started"
            {
                agent.started = value;
                return agent;
            }
            if let Some(status) = agent
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "weir agent exited before starting: {status}; log: {:?}",
                    log.map(|l| l.lock().expect("log").clone())
                );
            }
        }
        panic!("weir agent did not report start within 60 s");
    }

    /// The agent's process id (`nsenter` execs the agent, so it is the agent's own).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("weir agent did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Calls the agent's API (`docs/agent-api.md`) and decodes the answer.
    pub fn api<T: serde::de::DeserializeOwned>(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T, agent::api::client::ClientError> {
        call_api(&self.socket, method, path, body)
    }

    /// The repairs `weir status` counts for `driver` (`dataplane.repairs`; 0 when none).
    ///
    /// # Panics
    /// The status cannot be read or has no repairs list.
    #[must_use]
    pub fn repairs(&self, driver: &str) -> u64 {
        let status: serde_json::Value = self
            .api(hyper::Method::GET, "/v1/status", None)
            .expect("status");
        status["dataplane"]["repairs"]
            .as_array()
            .expect("repairs in the status")
            .iter()
            .find(|r| r[0] == driver)
            .and_then(|r| r[1].as_u64())
            .unwrap_or(0)
    }

    /// The map ids of the start report, by name.
    #[must_use]
    pub fn map_ids(&self) -> Vec<(String, u64)> {
        self.started["loaded"]["maps"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                (
                    m["name"].as_str().unwrap_or_default().to_owned(),
                    m["id"].as_u64().unwrap_or_default(),
                )
            })
            .collect()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `weir <args> --api-socket <socket> -o json`, which must succeed, and decodes what it
/// printed.
#[must_use]
pub fn weir_json(socket: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(bin::weir())
        .args(args)
        .arg("--api-socket")
        .arg(socket)
        .args(["-o", "json"])
        .output()
        .expect("run weir");
    assert!(
        out.status.success(),
        "weir {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "weir {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// True when `path` exists (pins are checked this way and with bpftool).
#[must_use]
pub fn pinned(path: &Path) -> bool {
    path.exists()
}

/// Calls an agent API socket and decodes the answer.
pub fn call_api<T: serde::de::DeserializeOwned>(
    socket: &Path,
    method: hyper::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<T, agent::api::client::ClientError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Generous: a test's request may wait for an apply of thousands of entries.
    let client = agent::api::client::Client::new(socket, std::time::Duration::from_secs(300));
    runtime.block_on(client.call(method, path, body, "the test's request"))
}

/// `GET path` on the agent's metrics address, 127.0.0.1:9972 (call inside the agent's namespace).
#[must_use]
pub fn metrics_get(path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect("127.0.0.1:9972").expect("metrics port");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: weir\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    out
}
