//! What runs on the tc hooks of workload veths, read from outside whichever mechanism attached
//! it: `bpftool net show` inside the namespace lists `cls_bpf` filters (name, program id); tcx
//! links are found through their pins under the pin root (bpftool 7.1 lists tcx links without
//! their interface). Program ids, per link: `[from_endpoint at ingress, to_endpoint at egress]`.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::{
    bpf::{PinRoot, bpftool},
    netns::NetNs,
};

/// The endpoint programs, in hook order (ingress, egress).
pub const PROGRAMS: [&str; 2] = [
    maps_schema::programs::FROM_ENDPOINT,
    maps_schema::programs::TO_ENDPOINT,
];

/// Program ids on both hooks of every link in `ns` that has one (filters in `ns`, or tcx link pins
/// under `root`).
#[must_use]
pub fn hook_programs(ns: &NetNs, root: &PinRoot) -> BTreeMap<String, [Option<u64>; 2]> {
    let mut out: BTreeMap<String, [Option<u64>; 2]> = BTreeMap::new();
    let shown = ns.exec(&["bpftool", "-j", "net", "show"]);
    assert!(
        shown.status.success(),
        "bpftool net show in {}: {}",
        ns.name(),
        String::from_utf8_lossy(&shown.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&shown.stdout).expect("bpftool net show prints JSON");
    for dev in json.as_array().into_iter().flatten() {
        for f in dev["tc"].as_array().into_iter().flatten() {
            let (Some(ifname), Some(kind), Some(name), Some(id)) = (
                f["devname"].as_str(),
                f["kind"].as_str(),
                f["name"].as_str(),
                f["prog_id"].as_u64().or_else(|| f["id"].as_u64()),
            ) else {
                continue;
            };
            let slot = match (kind, name) {
                ("clsact/ingress", n) if n == PROGRAMS[0] => 0,
                ("clsact/egress", n) if n == PROGRAMS[1] => 1,
                _ => continue,
            };
            out.entry(ifname.to_owned()).or_default()[slot] = Some(id);
        }
    }
    let links = root.paths().links_dir();
    for entry in std::fs::read_dir(&links).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((ifname, program)) = agent::paths::parse_link_pin(&name) else {
            continue;
        };
        let Some(slot) = PROGRAMS.iter().position(|p| *p == program) else {
            continue;
        };
        let shown = bpftool(&[
            "link",
            "show",
            "pinned",
            &entry.path().display().to_string(),
        ]);
        let hooks = out.entry(ifname).or_default();
        if hooks[slot].is_none() {
            hooks[slot] = shown["prog_id"].as_u64();
        }
    }
    out
}

/// Program ids on both hooks of `ifname` in `ns`.
#[must_use]
pub fn programs_on(ns: &NetNs, root: &PinRoot, ifname: &str) -> [Option<u64>; 2] {
    hook_programs(ns, root)
        .get(ifname)
        .copied()
        .unwrap_or_default()
}

/// The links in `ns` that run something on both hooks.
#[must_use]
pub fn attached_links(ns: &NetNs, root: &PinRoot) -> Vec<String> {
    hook_programs(ns, root)
        .into_iter()
        .filter(|(_, h)| h.iter().all(Option::is_some))
        .map(|(l, _)| l)
        .collect()
}

/// Waits (bounded, `within`) until every link in `links` runs programs on both hooks.
pub fn wait_attached(ns: &NetNs, root: &PinRoot, links: &[&str], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let attached = attached_links(ns, root);
        if links.iter().all(|l| attached.iter().any(|a| a == l)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "links {links:?} do not all run both programs within {within:?}; attached: {attached:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (bounded) until at least `n` links in `ns` run programs on both hooks.
pub fn wait_attached_count(ns: &NetNs, root: &PinRoot, n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let count = attached_links(ns, root).len();
        if count >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{count} links run both programs, {n} expected within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
