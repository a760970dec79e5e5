//! Per-test pin roots, loading weir's object, `BPF_PROG_TEST_RUN`, and `bpftool` from outside.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use aya::{
    Ebpf,
    programs::{SchedClassifier, TestRun as _, TestRunOptions, TestRunResult, Xdp},
};

use crate::names;

/// Makes sure bpffs is mounted at `/sys/fs/bpf` (a fresh machine has it unmounted).
pub fn ensure_bpffs() {
    agent::kernel::real::bpffs::ensure_mounted(Path::new(agent::paths::BPFFS_MOUNT))
        .unwrap_or_else(|e| panic!("bpffs: {e}"));
}

/// A pin root of its own under `/sys/fs/bpf` (`wt…`), removed with everything in it on drop.
#[derive(Debug)]
pub struct PinRoot {
    path: PathBuf,
}

impl PinRoot {
    /// Creates the directory (mounting bpffs first if needed).
    #[must_use]
    pub fn new() -> Self {
        ensure_bpffs();
        let path = Path::new(agent::paths::BPFFS_MOUNT).join(names::unique("p"));
        agent::kernel::real::bpffs::ensure_pin_dir(&path)
            .unwrap_or_else(|e| panic!("pin root: {e}"));
        Self { path }
    }

    /// The root.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The agent's paths for this root.
    #[must_use]
    pub fn paths(&self) -> agent::paths::Paths {
        agent::paths::Paths::with_bpf_root(&self.path)
    }

    /// Creates `maps/` (as the agent would) and returns the agent's paths, for tests that pin
    /// maps before an agent starts.
    #[must_use]
    pub fn with_maps_dir(&self) -> agent::paths::Paths {
        let paths = self.paths();
        agent::kernel::real::bpffs::ensure_pin_dir(&paths.maps_dir())
            .unwrap_or_else(|e| panic!("maps dir: {e}"));
        paths
    }
}

impl Default for PinRoot {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PinRoot {
    fn drop(&mut self) {
        // Unpinning a link detaches it once no process holds it; bpffs has no recursive rmdir
        // semantics beyond what remove_dir_all does with unlink/rmdir, which is what we want.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Loads `object` with its maps pinned under `root/maps` and every program loaded.
#[must_use]
pub fn load(object: &[u8], root: &PinRoot) -> Ebpf {
    agent::kernel::real::loader::load_object(object, &root.paths().maps_dir())
        .unwrap_or_else(|e| panic!("load: {e}"))
}

/// Loads weir's own object (the one the agent embeds).
#[must_use]
pub fn load_weir(root: &PinRoot) -> Ebpf {
    load(agent::EBPF_OBJECT, root)
}

/// The tc program `name` of a loaded object.
pub fn tc<'a>(ebpf: &'a mut Ebpf, name: &str) -> &'a mut SchedClassifier {
    ebpf.program_mut(name)
        .unwrap_or_else(|| panic!("no program {name}"))
        .try_into()
        .unwrap_or_else(|e| panic!("{name} is not a tc program: {e}"))
}

/// The XDP program `name` of a loaded object.
pub fn xdp<'a>(ebpf: &'a mut Ebpf, name: &str) -> &'a mut Xdp {
    ebpf.program_mut(name)
        .unwrap_or_else(|| panic!("no program {name}"))
        .try_into()
        .unwrap_or_else(|e| panic!("{name} is not an XDP program: {e}"))
}

/// Size of the kernel's `struct __sk_buff`, and the offset of its `ifindex` field.
const SK_BUFF_SIZE: usize = 192;
const SK_BUFF_IFINDEX: usize = 40;

/// Runs a tc program on `packet` through `BPF_PROG_TEST_RUN`. With `ifindex`, the kernel runs it as
/// if the packet were on that device (which must exist in the calling thread's namespace);
/// without, on loopback.
pub fn test_run_tc(
    program: &SchedClassifier,
    packet: &[u8],
    ifindex: Option<u32>,
    repeat: u32,
) -> TestRunResult {
    test_run_tc_out(program, packet, ifindex, repeat, None)
}

/// [`test_run_tc`], also copying the packet as the program left it into `out` (the result's
/// `data_size_out` says how much of it).
pub fn test_run_tc_out(
    program: &SchedClassifier,
    packet: &[u8],
    ifindex: Option<u32>,
    repeat: u32,
    out: Option<&mut [u8]>,
) -> TestRunResult {
    let mut ctx = [0u8; SK_BUFF_SIZE];
    let mut opts = TestRunOptions {
        data_in: Some(packet),
        data_out: out,
        repeat,
        ..TestRunOptions::default()
    };
    if let Some(ifindex) = ifindex {
        ctx[SK_BUFF_IFINDEX..SK_BUFF_IFINDEX + 4].copy_from_slice(&ifindex.to_ne_bytes());
        opts.ctx_in = Some(&ctx);
    }
    program
        .test_run(opts)
        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN: {e}"))
}

/// Runs an XDP program on `packet` through `BPF_PROG_TEST_RUN`.
pub fn test_run_xdp(program: &Xdp, packet: &[u8], repeat: u32) -> TestRunResult {
    let opts = TestRunOptions {
        data_in: Some(packet),
        repeat,
        ..TestRunOptions::default()
    };
    program
        .test_run(opts)
        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN: {e}"))
}

/// Runs `bpftool -j ARGS` and parses its JSON (claims about kernel state checked from outside).
#[must_use]
pub fn bpftool(args: &[&str]) -> serde_json::Value {
    let output = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run bpftool (install it with `cargo xtask setup`): {e}")
        });
    assert!(
        output.status.success(),
        "bpftool {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("bpftool {args:?} printed no JSON: {e}"))
}

/// Sum of a per-CPU counters slot as `bpftool map dump` shows it: (packets, bytes).
#[must_use]
pub fn counter_from_bpftool(map_pin: &Path, index: u32) -> (u64, u64) {
    let dump = bpftool(&["map", "dump", "pinned", &map_pin.display().to_string()]);
    let entries = dump
        .as_array()
        .unwrap_or_else(|| panic!("map dump is not a list: {dump}"));
    for entry in entries {
        // With BTF, bpftool prints {"key": N, "values": [{"cpu": c, "value": {"packets": .., "bytes": ..}}]}.
        let formatted = entry.get("formatted").unwrap_or(entry);
        if formatted["key"].as_u64() != Some(u64::from(index)) {
            continue;
        }
        let mut sum = (0, 0);
        for per_cpu in formatted["values"].as_array().into_iter().flatten() {
            sum.0 += per_cpu["value"]["packets"].as_u64().unwrap_or(0);
            sum.1 += per_cpu["value"]["bytes"].as_u64().unwrap_or(0);
        }
        return sum;
    }
    panic!("counter slot {index} not found in {}", map_pin.display())
}

/// One tc attachment as `bpftool net show` lists it inside a namespace (clsact filters; this
/// bpftool predates tcx, whose links are checked through their pins and `bpftool link`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TcAttachment {
    /// The interface.
    pub dev: String,
    /// Where: `clsact/ingress` or `clsact/egress`.
    pub kind: String,
    /// The program's kernel id.
    pub prog_id: u64,
}

/// Every tc attachment in `ns`, read with `bpftool -j net show` there.
#[must_use]
pub fn tc_attachments(ns: &crate::netns::NetNs) -> Vec<TcAttachment> {
    let out = ns.exec(&["bpftool", "-j", "net", "show"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bpftool net printed no JSON: {e}"));
    shown
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|entry| entry["tc"].as_array().cloned().unwrap_or_default())
        .map(|tc| TcAttachment {
            dev: tc["devname"].as_str().unwrap_or_default().to_owned(),
            kind: tc["kind"].as_str().unwrap_or_default().to_owned(),
            prog_id: tc["id"]
                .as_u64()
                .or_else(|| tc["prog_id"].as_u64())
                .unwrap_or_else(|| panic!("bpftool net lists a tc entry with no id: {tc}")),
        })
        .collect()
}

/// The kernel id of the program pinned at `pin`, read with bpftool.
#[must_use]
pub fn pinned_prog_id(pin: &Path) -> u64 {
    let shown = bpftool(&["prog", "show", "pinned", &pin.display().to_string()]);
    shown["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("bpftool shows no id for {}: {shown}", pin.display()))
}

/// `(pin, id)` of every map and program pinned in `paths`' `maps/` and `progs/`, each read with
/// `bpftool map|prog show pinned`, sorted: what a restart over unchanged state must keep.
#[must_use]
pub fn pinned_ids(paths: &agent::paths::Paths) -> Vec<(String, u64)> {
    let mut ids = Vec::new();
    for (dir, kind) in [(paths.maps_dir(), "map"), (paths.progs_dir(), "prog")] {
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in entries.map(|e| e.expect("a directory entry")) {
            if !entry.file_type().expect("file type").is_file() {
                continue;
            }
            let pin = entry.path();
            let shown = bpftool(&[kind, "show", "pinned", &pin.display().to_string()]);
            let id = shown["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("bpftool shows no id for {}: {shown}", pin.display()));
            ids.push((format!("{kind} {}", pin.display()), id));
        }
    }
    ids.sort();
    ids
}
