//! RAII network namespaces and veth pairs. Everything is named `wt…` and removed on drop, also when
//! a test panics.

use std::{
    fs::File,
    io,
    process::{Command, Output},
};

use nix::sched::{CloneFlags, setns};

use crate::names;

/// Runs a command and fails with its output when it does not succeed.
pub fn run(args: &[&str]) -> Output {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        output.status.success(),
        "{args:?} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A named network namespace (`ip netns add`), deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates a namespace with loopback up.
    #[must_use]
    pub fn new() -> Self {
        let name = names::unique("n");
        run(&["ip", "netns", "add", &name]);
        let ns = Self { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// The namespace's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs a command inside the namespace, failing on a non-zero exit.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Runs a command inside the namespace and returns its output whatever the exit status.
    pub fn try_exec(&self, args: &[&str]) -> io::Result<Output> {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
    }

    /// Runs `f` on a new thread that has entered the namespace, and returns its value. A panic in
    /// `f` propagates.
    pub fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file =
                        File::open(&path).unwrap_or_else(|e| panic!("cannot open {path}: {e}"));
                    setns(&file, CloneFlags::CLONE_NEWNET)
                        .unwrap_or_else(|e| panic!("setns {path}: {e}"));
                    f()
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// The index of link `ifname` inside the namespace.
    #[must_use]
    pub fn ifindex(&self, ifname: &str) -> u32 {
        let owned = ifname.to_owned();
        self.run(move || nix::net::if_::if_nametoindex(owned.as_str()))
            .unwrap_or_else(|e| panic!("no link {ifname} in {}: {e}", self.name))
    }
}

impl Default for NetNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace removes every link inside it (a veth takes its peer with it).
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
    }
}

/// A veth pair whose ends live in the given namespaces. Dropping the namespaces removes it; it
/// also removes itself on drop in case the namespaces outlive it.
#[derive(Debug)]
pub struct VethPair<'a> {
    /// The first end's name.
    pub a: String,
    /// The second end's name.
    pub b: String,
    ns_a: &'a NetNs,
}

impl<'a> VethPair<'a> {
    /// Creates `a` in `ns_a` and `b` in `ns_b`, both up. `suffix_*` (≤ 4 chars) end their names.
    #[must_use]
    pub fn new(ns_a: &'a NetNs, suffix_a: &str, ns_b: &NetNs, suffix_b: &str) -> Self {
        Self::named(
            ns_a,
            &names::unique(suffix_a),
            ns_b,
            &names::unique(suffix_b),
        )
    }

    /// [`VethPair::new`] with address `addr_a` on `a` and `addr_b` on `b` (`address/prefix`).
    #[must_use]
    pub fn addressed(
        ns_a: &'a NetNs,
        suffix_a: &str,
        addr_a: &str,
        ns_b: &NetNs,
        suffix_b: &str,
        addr_b: &str,
    ) -> Self {
        let pair = Self::new(ns_a, suffix_a, ns_b, suffix_b);
        ns_a.exec(&["ip", "addr", "add", addr_a, "dev", &pair.a]);
        ns_b.exec(&["ip", "addr", "add", addr_b, "dev", &pair.b]);
        pair
    }

    /// Creates a pair with explicit names (a test that means a `weir*` workload link uses this).
    #[must_use]
    pub fn named(ns_a: &'a NetNs, a: &str, ns_b: &NetNs, b: &str) -> Self {
        assert!(
            a.len() <= 15 && b.len() <= 15,
            "link names {a} / {b} exceed 15 characters"
        );
        ns_a.exec(&[
            "ip",
            "link",
            "add",
            a,
            "type",
            "veth",
            "peer",
            "name",
            b,
            "netns",
            ns_b.name(),
        ]);
        let pair = Self {
            a: a.to_owned(),
            b: b.to_owned(),
            ns_a,
        };
        ns_a.exec(&["ip", "link", "set", a, "up"]);
        ns_b.exec(&["ip", "link", "set", b, "up"]);
        pair
    }
}

impl Drop for VethPair<'_> {
    fn drop(&mut self) {
        let _ = self.ns_a.try_exec(&["ip", "link", "del", &self.a]);
    }
}
