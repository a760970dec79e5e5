//! `cargo xtask bench NAME [--smoke] [--only PART]` (parts: `datapath`, `services`): every benchmark prints a table and writes
//! `target/weir-bench/NAME.json`, a flat object of named figures.

mod agent;
mod agent_proc;
mod attach;
mod cni;
mod cri;
mod datapath;
mod ipam;
mod k8s;
mod multinode;
mod policy;
mod services;

use std::path::Path;

use anyhow::{Result, bail};

type Bench = fn(&Path, bool) -> Result<()>;

/// Every benchmark, by name.
const BENCHES: &[(&str, Bench)] = &[
    ("datapath", datapath::run),
    ("ipam", ipam::run),
    ("cni", cni::run),
    ("agent", agent::run),
    ("attach", attach::run),
    ("cri", cri::run),
    ("policy", policy::run),
    ("k8s", k8s::run),
    ("multinode", multinode::run),
    ("services", services::run),
];

pub(crate) fn run(ws: &Path, name: &str, smoke: bool, only: Option<&str>) -> Result<()> {
    if let Some(part) = only {
        return match name {
            "datapath" => datapath::run_part(ws, smoke, Some(part)),
            "services" => services::run_part(ws, smoke, Some(part)),
            _ => bail!(
                "--only selects a part of the datapath or services benchmark; {name:?} has no parts"
            ),
        };
    }
    if name == "all" {
        for (bench, run) in BENCHES {
            crate::util::step(
                &format!("bench {bench}{}", if smoke { " --smoke" } else { "" }),
                || run(ws, smoke),
            )?;
        }
        return Ok(());
    }
    match BENCHES.iter().find(|(bench, _)| *bench == name) {
        Some((_, run)) => run(ws, smoke),
        None => {
            let names: Vec<&str> = BENCHES.iter().map(|(n, _)| *n).collect();
            bail!("unknown benchmark {name:?}; choose one of {names:?} or `all`")
        }
    }
}
