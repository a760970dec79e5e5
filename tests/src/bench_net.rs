//! Pieces the traffic benchmarks (`bench datapath`, `bench services`) share: pods plumbed to a
//! node namespace as the CNI plugin does, the sender pinned to one CPU, rule sets piped into a
//! tool inside a namespace, and the median.

use std::{
    io::Write as _,
    net::Ipv4Addr,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::netns::{NetNs, VethPair};

/// The pods' gateway (on every host-side veth, answered by its MAC).
pub const GATEWAY: &str = "169.254.1.1";

/// The median of `values` (sorted in place).
#[must_use]
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        f64::midpoint(values[n / 2 - 1], values[n / 2])
    }
}

/// A veth from `node` to `pod` (suffixes `h{i}` / `c{i}`), the pod holding `ip`/32 with a default
/// route via [`GATEWAY`] and the node a /32 route back; returns (host end, pod end). The
/// namespaces own the links (deleting them removes the pair).
#[must_use]
pub fn plumb(node: &NetNs, pod: &NetNs, i: usize, ip: Ipv4Addr) -> (String, String) {
    let veth = VethPair::new(node, &format!("h{i}"), pod, &format!("c{i}"));
    let (a, b) = (veth.a.clone(), veth.b.clone());
    // The namespaces own the links; dropping the pair here would delete them.
    std::mem::forget(veth);
    let out = node.exec(&["cat", &format!("/sys/class/net/{a}/address")]);
    let mac = String::from_utf8(out.stdout).expect("mac");
    let ip = ip.to_string();
    pod.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", &b]);
    pod.exec(&["ip", "route", "add", GATEWAY, "dev", &b, "scope", "link"]);
    pod.exec(&["ip", "route", "add", "default", "via", GATEWAY, "dev", &b]);
    pod.exec(&[
        "ip",
        "neigh",
        "add",
        GATEWAY,
        "lladdr",
        mac.trim(),
        "dev",
        &b,
        "nud",
        "permanent",
    ]);
    node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", &a]);
    (a, b)
}

/// Pins the calling thread to CPU 0.
pub fn pin_cpu() {
    // SAFETY: a zeroed cpu_set_t is valid; the calls only affect this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set);
    }
}

/// Runs `tool` (with `args`) inside `ns` with `input` on its stdin (`iptables-restore`,
/// `nft -f -`), failing when it does.
pub fn feed(ns: &NetNs, tool: &str, args: &[&str], input: &str) -> Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name(), tool])
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {tool} (install it with `cargo xtask setup`)"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(input.as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        bail!("{tool} failed ({status})");
    }
    Ok(())
}
