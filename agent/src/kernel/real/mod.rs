//! The real kernel: the seam's implementations over aya, netlink, bpffs and the `bpf()` batch calls, and
//! loading the object. bpffs and the pin directories (`bpffs`), loading the object with its maps pinned by
//! versioned name (`loader`), keeping or replacing the pinned programs (`programs`), BPF host routing's
//! program array (`host_fwd`), socket LB's cgroup links (`socket_lb`), what `weir uninstall` removes
//! (`uninstall`), batch map operations (`batch`), the conntrack maps (`ct`) and their pins (`ct_maps`), the
//! counter arrays (`counters`), the masquerade's programs on host interfaces (`host_tc`), the pin root read
//! on request (`inspect`), links and addresses (`netlink_links`), routes (`netlink_routes`), the VXLAN
//! device (`netlink_vxlan`), the endpoint programs on workload links (`tc_links`) and the XDP prefilter on
//! named interfaces (`xdp`).

pub mod batch;
pub mod bpffs;
pub mod counters;
pub mod ct;
pub mod ct_maps;
pub mod host_fwd;
pub mod host_tc;
pub mod inspect;
pub mod loader;
pub mod netlink_links;
pub mod netlink_routes;
pub mod netlink_vxlan;
pub mod programs;
pub mod socket_lb;
pub mod tc_links;
pub mod uninstall;
pub mod xdp;

/// Every link pin under the pin root's `links/` directory, as (interface, program): what the host
/// drivers (XDP prefilter, masquerade tc programs) read back. None when the directory is absent.
pub(crate) fn link_pins(
    paths: &crate::paths::Paths,
) -> Result<Vec<(String, String)>, crate::kernel::KernelError> {
    let dir = paths.links_dir();
    let list_err = |source| crate::kernel::KernelError::Io {
        op: "list",
        what: dir.display().to_string(),
        source,
    };
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(list_err(source)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(list_err)?;
        if let Some(pin) = crate::paths::parse_link_pin(&entry.file_name().to_string_lossy()) {
            out.push(pin);
        }
    }
    Ok(out)
}
