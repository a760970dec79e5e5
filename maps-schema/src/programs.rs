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

/// Tail-called by `from_endpoint` (through the `host_fwd_v1` program array) for a packet it
/// passed: forwards it by a FIB lookup and a redirect instead of the kernel's IP forwarding.
pub const HOST_FWD: &str = "host_fwd";
/// Tail-called by `masq_ingress` (slot `HOST_FWD_IN_SLOT` of `host_fwd_v1`) for a packet arriving
/// on a host interface: forwards one bound for a pod on this node (or elsewhere) by a FIB lookup and
/// a redirect, so only the pod's `to_endpoint` runs between the wire and the pod.
pub const HOST_FWD_IN: &str = "host_fwd_in";

/// `cgroup/connect4` on the cgroup named by `--socket-lb-cgroup`: a TCP socket connecting to a
/// frontend gets a backend (`maps_schema::socket_lb`).
pub const SOCK_CONNECT4: &str = "sock_connect4";
/// `cgroup/getpeername4` there: such a socket's peer reads as the frontend.
pub const SOCK_GETPEER4: &str = "sock_getpeer4";

/// `cgroup/connect6` there: an IPv6 TCP socket connecting to a frontend's IPv4-mapped address
/// (`::ffff:a.b.c.d`, a dual-stack socket's IPv4 peer) gets a backend.
pub const SOCK_CONNECT6: &str = "sock_connect6";
/// `cgroup/getpeername6` there: such a socket's peer reads as the frontend.
pub const SOCK_GETPEER6: &str = "sock_getpeer6";

/// `cgroup/sendmsg4` there: a datagram an unconnected UDP socket sends to a frontend goes to a
/// backend (`maps_schema::socket_lb::SOCK_DGRAM4`).
pub const SOCK_SENDMSG4: &str = "sock_sendmsg4";
/// `cgroup/recvmsg4` there: a datagram from such a backend reads as from the frontend.
pub const SOCK_RECVMSG4: &str = "sock_recvmsg4";
/// `cgroup/sendmsg6` there: as `sock_sendmsg4`, for an IPv6 socket sending to an IPv4-mapped
/// frontend.
pub const SOCK_SENDMSG6: &str = "sock_sendmsg6";
/// `cgroup/recvmsg6` there: as `sock_recvmsg4`, for such a socket.
pub const SOCK_RECVMSG6: &str = "sock_recvmsg6";

/// The socket LB programs, attached to one cgroup together (links pinned as `links/<program>`).
pub const SOCKET_LB: &[&str] = &[
    SOCK_CONNECT4,
    SOCK_GETPEER4,
    SOCK_CONNECT6,
    SOCK_GETPEER6,
    SOCK_SENDMSG4,
    SOCK_RECVMSG4,
    SOCK_SENDMSG6,
    SOCK_RECVMSG6,
];

/// Every program in the object.
pub const ALL: &[&str] = &[
    FROM_ENDPOINT,
    TO_ENDPOINT,
    XDP_PREFILTER,
    MASQ_EGRESS,
    MASQ_INGRESS,
    HOST_FWD,
    HOST_FWD_IN,
    SOCK_CONNECT4,
    SOCK_GETPEER4,
    SOCK_CONNECT6,
    SOCK_GETPEER6,
    SOCK_SENDMSG4,
    SOCK_RECVMSG4,
    SOCK_SENDMSG6,
    SOCK_RECVMSG6,
];

/// Host-side workload veths start with this prefix; any such link is a workload interface.
pub const WORKLOAD_LINK_PREFIX: &str = "weir";
