//! A real `weir agent` for the benchmarks that measure through one (`cni`, `ipam`): started in a
//! test namespace with `nsenter --net` (so its pins stay visible outside), every path under the
//! benchmark's own directory and pin root, and killed when the guard drops.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// The agent, killed on drop (before the benchmark's namespace and pin root go).
pub(crate) struct AgentGuard(Child);

impl Drop for AgentGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `weir` as `weir agent` in network namespace `netns` with its state, socket, policies
/// and conflist under `dir` and its pins under `pin_root`; returns once it reports `started`.
pub(crate) fn start(weir: &Path, netns: &str, dir: &Path, pin_root: &Path) -> Result<AgentGuard> {
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .arg("--")
        .arg(weir)
        .args(["agent", "--node", "wt-bench", "--metrics", "127.0.0.1:0"])
        .arg("--bpf-root")
        .arg(pin_root)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--api-socket")
        .arg(dir.join("weir.sock"))
        .arg("--policy-dir")
        .arg(dir.join("policies"))
        .arg("--cni-conf-dir")
        .arg(dir.join("net.d"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start weir agent")?;
    let stdout = child.stdout.take().context("agent stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut guard = AgentGuard(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200))
            && line.contains("\"started\"")
        {
            return Ok(guard);
        }
        if let Ok(Some(status)) = guard.0.try_wait() {
            bail!("weir agent exited before starting: {status}");
        }
    }
    bail!("weir agent did not start within 60 s")
}
