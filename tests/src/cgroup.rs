//! A cgroup v2 directory of the test's own (`wt…`, under the host's cgroup2 mount, mounting one
//! when there is none), removed on drop: socket LB is attached to it, so only the processes the
//! test moves into it are affected.

use std::path::{Path, PathBuf};

use crate::names;

/// Where cgroup2 is mounted (the first `cgroup2` line of `/proc/self/mounts`).
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, dir, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (kind == "cgroup2").then(|| PathBuf::from(dir))
    })
}

/// A cgroup v2 directory, removed on drop (its processes must have exited by then).
#[derive(Debug)]
pub struct TestCgroup {
    path: PathBuf,
    /// A cgroup2 mount this test made (unmounted on drop).
    mounted: Option<PathBuf>,
}

impl TestCgroup {
    /// Creates `wt…` under the host's cgroup2 mount (mounting cgroup2 under `/run` if the host has
    /// none).
    #[must_use]
    pub fn new() -> Self {
        let (root, mounted) = match cgroup2_mount() {
            Some(root) => (root, None),
            None => {
                let dir = PathBuf::from("/run").join(names::unique("g"));
                std::fs::create_dir_all(&dir).expect("a mount point for cgroup2");
                crate::netns::run(&["mount", "-t", "cgroup2", "none", &dir.display().to_string()]);
                (dir.clone(), Some(dir))
            }
        };
        let path = root.join(names::unique("c"));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("cannot create the cgroup {}: {e}", path.display()));
        Self { path, mounted }
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The names of the BPF programs attached to it, sorted, read from outside with `bpftool
    /// cgroup show` (which prints nothing at all for a cgroup without programs).
    #[must_use]
    pub fn attached(&self) -> Vec<String> {
        let out = std::process::Command::new("bpftool")
            .args(["-j", "cgroup", "show", &self.path.display().to_string()])
            .output()
            .expect("run bpftool (install it with `cargo xtask setup`)");
        assert!(
            out.status.success(),
            "bpftool cgroup show failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Vec::new();
        }
        let shown: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("bpftool prints JSON");
        let mut names: Vec<String> = shown
            .as_array()
            .expect("a list of programs")
            .iter()
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }
}

impl Default for TestCgroup {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // A cgroup goes with `rmdir` once its processes have exited (which can lag their exit).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if let Some(dir) = &self.mounted {
            let _ = std::process::Command::new("umount").arg(dir).status();
            let _ = std::fs::remove_dir(dir);
        }
    }
}
