//! The datapath benchmark, run by `cargo xtask bench datapath` (which builds the `bench` variant of
//! the eBPF object, with the empty `wt_empty` tc program, and passes it here):
//! - `testrun`: per-packet cost through `BPF_PROG_TEST_RUN` against the empty program (the floor),
//!   at 10 / 1,000 / 10,000 endpoints × 100 / 10,000 / 100,000 policy entries, 100,000 conntrack
//!   entries present;
//! - `traffic`: the added per-packet cost of weir, iptables-nft and iptables-legacy (flat
//!   per-endpoint chains) on real UDP traffic between namespaces, over no filtering;
//! - `refresh`: the drift refresh's CPU over the agent's real maps at 10,000 endpoints and at least
//!   100,000 policy entries (issue 39);
//! - `differential`: the datapath against its model, 1,000,000 seeded cases (issue 39).
//!
//! Usage (root): `datapath-bench --object PATH --out PATH [--smoke]
//! [--only testrun|traffic|refresh|differential]`. Writes one flat JSON object.

mod differential;
mod refresh;
mod testrun;
mod traffic;

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{Context as _, Result, bail};

/// Run sizes: the method, or tiny counts for `--smoke`.
#[derive(Clone, Copy)]
pub struct Sizes {
    pub repeat: u32,
    pub runs: usize,
    pub flows: usize,
    pub ct_entries: u32,
    pub endpoints: &'static [u32],
    pub policies: &'static [u32],
    pub traffic_packets: usize,
    pub traffic_runs: usize,
    pub traffic_endpoints: usize,
    /// The synthetic node the drift refresh runs over.
    pub refresh: agent::synthetic::Sizes,
    pub differential_cases: u64,
}

const FULL: Sizes = Sizes {
    repeat: 1_000_000,
    runs: 5,
    flows: 10_000,
    ct_entries: 100_000,
    endpoints: &[10, 1_000, 10_000],
    policies: &[100, 10_000, 100_000],
    traffic_packets: 1_000_000,
    traffic_runs: 5,
    traffic_endpoints: 1_000,
    refresh: agent::synthetic::Sizes {
        endpoints: 10_000,
        namespaces: 50,
        policies: 50,
    },
    differential_cases: 1_000_000,
};

const SMOKE: Sizes = Sizes {
    repeat: 10_000,
    runs: 3,
    flows: 200,
    ct_entries: 1_000,
    endpoints: &[10, 100],
    policies: &[100, 1_000],
    traffic_packets: 20_000,
    traffic_runs: 2,
    traffic_endpoints: 100,
    refresh: agent::synthetic::Sizes {
        endpoints: 200,
        namespaces: 10,
        policies: 20,
    },
    differential_cases: 10_000,
};

pub fn main() -> Result<()> {
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
                 [--only testrun|traffic|refresh|differential]"
            ),
        }
    }
    let object = object.context("--object PATH is required")?;
    let out = out.context("--out PATH is required")?;
    if !nix::unistd::geteuid().is_root() {
        bail!("the datapath benchmark loads BPF programs and builds namespaces: run it as root");
    }
    let sizes = if smoke { SMOKE } else { FULL };
    let bytes = std::fs::read(&object).with_context(|| format!("reading {}", object.display()))?;
    // ELF parsing wants the object 8-byte aligned.
    let mut aligned = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: the u64 buffer is at least as long as `bytes`; viewed as bytes it has no invalid values.
    let buf =
        unsafe { std::slice::from_raw_parts_mut(aligned.as_mut_ptr().cast::<u8>(), bytes.len()) };
    buf.copy_from_slice(&bytes);
    const PARTS: [&str; 4] = ["testrun", "traffic", "refresh", "differential"];
    if let Some(part) = only.as_deref()
        && !PARTS.contains(&part)
    {
        bail!("--only {part:?}: choose one of {PARTS:?}");
    }
    let runs = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let mut figures = BTreeMap::new();
    if runs("testrun") {
        testrun::run(buf, sizes, &mut figures)?;
    }
    if runs("traffic") {
        traffic::run(buf, sizes, &mut figures)?;
    }
    if runs("refresh") {
        refresh::run(sizes, !smoke, &mut figures)?;
    }
    if runs("differential") {
        differential::run(sizes, &mut figures)?;
    }
    figures.insert("smoke".to_owned(), serde_json::json!(smoke));
    std::fs::write(&out, serde_json::to_string_pretty(&figures)?)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}
