//! Program names as the kernel sees them (≤ 15 characters) and their pin names.

/// tc ingress of a host-side workload veth: packets leaving the pod.
pub const FROM_ENDPOINT: &str = "from_endpoint";
/// tc egress of a host-side workload veth: packets entering the pod.
pub const TO_ENDPOINT: &str = "to_endpoint";
/// XDP on the interfaces named by `--prefilter-interfaces`.
pub const XDP_PREFILTER: &str = "xdp_prefilter";

/// tc egress of the interfaces named by `--masquerade-interfaces`: SNAT of pod traffic.
pub const MASQ_EGRESS: &str = "masq_egress";
/// tc ingress of the same interfaces: replies translated back.
pub const MASQ_INGRESS: &str = "masq_ingress";

/// Every program in the object.
pub const ALL: &[&str] = &[
    FROM_ENDPOINT,
    TO_ENDPOINT,
    XDP_PREFILTER,
    MASQ_EGRESS,
    MASQ_INGRESS,
];

/// Host-side workload veths start with this prefix; any such link is a workload interface.
pub const WORKLOAD_LINK_PREFIX: &str = "weir";
