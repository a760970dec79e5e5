//! The services benchmark (issue 13), run by `cargo xtask bench services` (which builds the
//! `bench` variant of the eBPF object and `weir`, and passes them here):
//! - `testrun`: per-packet cost of `from_endpoint` through `BPF_PROG_TEST_RUN`: an established
//!   translated flow (a ClusterIP packet whose flow has its `svc_ct4_v1` entry) against an
//!   established plain pod→pod flow, a new translated flow (a SYN to a ClusterIP) against a new
//!   plain flow, at 10 / 1,000 / 10,000 Services;
//! - `traffic`: the added per-packet cost of weir, kube-proxy's iptables-mode layout and its
//!   nftables-mode layout on real UDP traffic between namespaces to a middle Service's ClusterIP,
//!   each packet a new flow, over the same traffic sent straight to the backend with no
//!   translation, at 1,000 and 10,000 Services; weir's Service alone as well (the ClusterIP over
//!   the same flows straight to the backend through weir's programs);
//! - `update`: one Service added to a real `weir agent` whose source holds 10,000 Services and
//!   EndpointSlices — the Kubernetes source (from the watch event) and the policy directory
//!   (from the file's rename) —, until its frontend is in the pinned `svc4_v1`; and
//!   `iptables-restore` of kube-proxy's full table at 10,000 Services;
//! - `socket`: socket LB (`--socket-lb-cgroup`) on real TCP connections to a ClusterIP against
//!   the same connections translated per packet and made straight to the backend: ns per
//!   connection, and the programs' own run time per run from the kernel's statistics;
//! - `sweep`: the agent's conntrack sweep over 100,000 translated flows on the real pinned maps,
//!   without and with their `svc_ct4_v1` entries, and removing 100,000 stale ones.
//!
//! Usage (root): `services-bench --object PATH --out PATH [--smoke]
//! [--only testrun|traffic|update|socket|sweep]`
//! (`WEIR_BIN` names the `weir` binary for `update`). Writes one flat JSON object.

mod rules;
mod socket;
mod sweep;
mod testrun;
mod traffic;
mod update;

use std::{collections::BTreeMap, net::Ipv4Addr, path::PathBuf};

use anyhow::{Context as _, Result, bail};

/// Run sizes: the method, or tiny counts for `--smoke`.
#[derive(Clone, Copy)]
pub struct Sizes {
    /// Service counts of the per-packet part.
    pub services: &'static [u32],
    /// Single test runs per established figure (each a fresh packet of the same flow).
    pub samples: usize,
    /// New flows per new-flow figure.
    pub flows: usize,
    /// Service counts of the traffic part.
    pub traffic_services: &'static [u32],
    /// Packets (each a new flow) per traffic run.
    pub traffic_packets: usize,
    pub traffic_runs: usize,
    /// Services in the agent's directory for the update part.
    pub update_services: u32,
    pub update_rounds: usize,
    /// Translated flows in the sweep part, and sweeps per figure.
    pub sweep_flows: usize,
    pub sweep_rounds: usize,
}

const FULL: Sizes = Sizes {
    services: &[10, 1_000, 10_000],
    samples: 20_000,
    flows: 10_000,
    traffic_services: &[1_000, 10_000],
    traffic_packets: 40_000,
    traffic_runs: 5,
    update_services: 10_000,
    update_rounds: 5,
    sweep_flows: 100_000,
    sweep_rounds: 5,
};

const SMOKE: Sizes = Sizes {
    services: &[10, 100],
    samples: 300,
    flows: 200,
    traffic_services: &[20, 100],
    traffic_packets: 2_000,
    traffic_runs: 2,
    update_services: 100,
    update_rounds: 2,
    sweep_flows: 2_000,
    sweep_rounds: 2,
};

/// The ClusterIP of filler Service `i` (10.96.0.0/16 and up).
#[must_use]
pub fn vip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 1)) + i)
}

/// Backend `j` of filler Service `i` (10.3.0.0/16 and up; no pod has it).
#[must_use]
pub fn filler_backend(i: u32, j: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 3, 0, 1)) + 2 * i + j)
}

/// The Service port of every frontend, and the backends' port.
pub const PORT: u16 = 80;
pub const TARGET: u16 = 8080;

fn main() -> Result<()> {
    let mut object = None;
    let mut out = None;
    let mut smoke = false;
    let mut only = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--object" => object = args.next().map(PathBuf::from),
            "--out" => out = args.next().map(PathBuf::from),
            "--smoke" => smoke = true,
            "--only" => only = args.next(),
            other => bail!(
                "unknown argument {other:?}; usage: --object PATH --out PATH [--smoke] \
                 [--only testrun|traffic|update|socket|sweep]"
            ),
        }
    }
    let object = object.context("--object PATH is required")?;
    let out = out.context("--out PATH is required")?;
    if !nix::unistd::geteuid().is_root() {
        bail!("the services benchmark loads BPF programs and builds namespaces: run it as root");
    }
    let sizes = if smoke { SMOKE } else { FULL };
    let bytes = std::fs::read(&object).with_context(|| format!("reading {}", object.display()))?;
    // ELF parsing wants the object 8-byte aligned.
    let mut aligned = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: the u64 buffer is at least as long as `bytes`; viewed as bytes it has no invalid values.
    let buf =
        unsafe { std::slice::from_raw_parts_mut(aligned.as_mut_ptr().cast::<u8>(), bytes.len()) };
    buf.copy_from_slice(&bytes);
    let parts: Vec<&str> = match only.as_deref() {
        None => vec!["testrun", "traffic", "update", "socket", "sweep"],
        Some(p @ ("testrun" | "traffic" | "update" | "socket" | "sweep")) => vec![p],
        Some(other) => {
            bail!("--only {other:?}: choose `testrun`, `traffic`, `update`, `socket` or `sweep`")
        }
    };
    let mut figures = BTreeMap::new();
    for part in parts {
        match part {
            "testrun" => testrun::run(buf, sizes, &mut figures)?,
            "traffic" => traffic::run(buf, sizes, &mut figures)?,
            "update" => update::run(sizes, &mut figures)?,
            "socket" => socket::run(sizes, &mut figures)?,
            _ => sweep::run(sizes, &mut figures)?,
        }
    }
    figures.insert("smoke".to_owned(), serde_json::json!(smoke));
    std::fs::write(&out, serde_json::to_string_pretty(&figures)?)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}
