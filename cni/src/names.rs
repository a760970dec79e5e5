//! Names weir-cni derives: the host veth (`weir` + 11 hex characters of SHA-256 over
//! `<container id>:<ifname>`, 15 characters in all) and the IPAM handles.

use sha2::{Digest as _, Sha256};

/// The prefix every workload veth has (and only workload veths have).
pub const HOST_VETH_PREFIX: &str = "weir";

/// The host-side veth of attachment (`container_id`, `ifname`).
#[must_use]
pub fn host_veth(container_id: &str, ifname: &str) -> String {
    let digest = Sha256::digest(format!("{container_id}:{ifname}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HOST_VETH_PREFIX}{}", &hex[..11])
}

/// The workload handle `<namespace>.<pod>` (holds only addresses an operator placed there).
#[must_use]
pub fn workload_handle(namespace: &str, pod: &str) -> String {
    format!("{namespace}.{pod}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_veth_names_are_stable_and_fit() {
        let a = host_veth("3f9a01", "eth0");
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("weir"));
        assert_eq!(a, host_veth("3f9a01", "eth0"));
        assert_ne!(a, host_veth("3f9a01", "eth1"));
        assert_ne!(a, host_veth("3f9a02", "eth0"));
        // Pinned: a later release must find the veths an earlier one made.
        assert_eq!(host_veth("abc", "eth0"), "weirb133159de54");
    }
}
