//! Pods as the agent tests build them by hand (the CNI builds them for real in the `cni_*` tests):
//! a workload veth (`weir` + 11 hex characters, so the agent treats it as one) from a node namespace
//! into a pod namespace, the pod's /32 address with a default route via a link-local gateway the
//! node side owns, and the node's host route back.

use crate::{
    names,
    netns::{NetNs, VethPair},
};

/// The link-local gateway pods route through.
pub const GATEWAY: &str = "169.254.1.1";

/// A fresh workload link name: `weir` + 11 hex characters (15 in all).
#[must_use]
pub fn workload_name() -> String {
    let digits: String = names::unique("").chars().skip(2).collect();
    format!("weir{digits:0>11}").chars().take(15).collect()
}

/// Routes a pod behind `veth` (`veth.a` in `node`, `veth.b` in `pod`) with address `ip`.
pub fn plumb(node: &NetNs, pod: &NetNs, veth: &VethPair<'_>, ip: &str) {
    node.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{GATEWAY}/32"),
        "dev",
        &veth.a,
    ]);
    node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", &veth.a]);
    pod.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", &veth.b]);
    pod.exec(&["ip", "route", "add", GATEWAY, "dev", &veth.b]);
    pod.exec(&[
        "ip", "route", "add", "default", "via", GATEWAY, "dev", &veth.b,
    ]);
}
