//! Verdict reasons and directions, shared with user space so an operator can read every drop.
//!
//! A reason is a small number; `name()` gives its stable, operator-facing name. Codes are
//! append-only: never renumber one. Ranges: `0` and `32..48` pass, `1..32` drop, `48..64` are
//! notes — counted *in addition to* the verdict for unusual packets that still get one.

/// Directions a counter is kept for.
pub const DIR_FROM_ENDPOINT: u32 = 0;
/// Packets entering a pod (tc egress of its host-side veth).
pub const DIR_TO_ENDPOINT: u32 = 1;
/// Packets seen by `xdp_prefilter`.
pub const DIR_PREFILTER: u32 = 2;
/// Packets seen by `masq_egress` and `masq_ingress` (the masquerade interfaces).
pub const DIR_MASQUERADE: u32 = 3;
/// Number of directions.
pub const DIRECTIONS: u32 = 4;

/// Passed: a new flow (or a packet its side had not approved yet) on an endpoint that is not
/// isolated in this direction; for `xdp_prefilter`, no deny CIDR matched.
pub const PASS: u32 = 0;
/// Dropped: the interface has no entry in the endpoints map (fail closed).
pub const DROP_UNKNOWN_ENDPOINT: u32 = 1;
/// Dropped: a header is truncated (the packet ends inside the Ethernet, IP, extension or L4 header).
pub const DROP_MALFORMED: u32 = 2;
/// Dropped: an ethertype other than IPv4, IPv6 or ARP.
pub const DROP_UNSUPPORTED_ETHERTYPE: u32 = 3;
/// Dropped: the source address is not one of the endpoint's own addresses.
pub const DROP_SPOOFED_SOURCE: u32 = 4;
/// Dropped: policy denied it.
pub const DROP_POLICY_DENIED: u32 = 5;
/// Dropped: the source is in a prefilter deny CIDR.
pub const DROP_PREFILTER_DENY: u32 = 6;
/// Dropped: an IPv4 or IPv6 fragment (weir does not reassemble or track fragments).
pub const DROP_FRAGMENT: u32 = 7;
/// Dropped: a header field is invalid (IP version, IPv4 IHL < 5, TCP data offset < 5).
pub const DROP_INVALID_HEADER: u32 = 8;
/// Dropped: a TCP flag combination no real stack sends (SYN+FIN, SYN+RST, no flags, FIN without ACK).
pub const DROP_INVALID_TCP_FLAGS: u32 = 9;
/// Dropped: an IPv6 routing header with segments left (the real destination is not the header's).
pub const DROP_IPV6_ROUTING_HEADER: u32 = 10;
/// Dropped: more IPv6 extension headers than the programs walk ([`MAX_IPV6_EXT_HEADERS`]).
pub const DROP_EXT_HEADER_LIMIT: u32 = 11;
/// Dropped: a new flow could not be recorded in conntrack (map full or busy).
pub const DROP_CT_INSERT_FAILED: u32 = 12;
/// Dropped: a new masqueraded flow found no free NAT port in [`crate::nat::PORT_RETRIES`] tries.
pub const DROP_NAT_PORT_EXHAUSTED: u32 = 13;
/// Dropped: a new masqueraded flow could not be recorded in the NAT map (full or busy).
pub const DROP_NAT_INSERT_FAILED: u32 = 14;
/// Dropped: a packet to a Service frontend with no ready backend (`backend_count` 0); an IPv4
/// packet that can be quoted is answered with an ICMP port unreachable into the client pod.
pub const DROP_SERVICE_NO_BACKEND: u32 = 15;
/// Dropped: a NodePort packet (or its reply) translated on a host interface that the kernel's
/// FIB cannot forward (no route, forwarding disabled, or the way out is no NodePort interface,
/// whose address a translation to another node's backend needs as its source).
pub const DROP_NODEPORT_NO_ROUTE: u32 = 16;

/// Passed: a packet of a flow this side already approved (conntrack).
pub const PASS_ESTABLISHED: u32 = 32;
/// Passed: an ICMP error about a flow this side approved (conntrack).
pub const PASS_RELATED: u32 = 33;
/// Passed: ARP, IPv6 neighbour discovery, router solicitation/advertisement, DAD or MLD.
pub const PASS_NEIGHBOUR: u32 = 34;
/// Passed: the endpoint is isolated in this direction and a policy entry allowed the new flow
/// (or the peer is the node itself, whose traffic may always enter a pod).
pub const PASS_POLICY: u32 = 35;
/// Passed: a pod's packet to outside the pools, its source translated to the node address.
pub const PASS_MASQUERADED: u32 = 36;
/// Passed: a reply to a masqueraded flow, its destination translated back to the pod.
pub const PASS_REVERSE_NAT: u32 = 37;
/// Passed: a packet to a NodePort, its destination translated to a backend (and, for another
/// node's backend, its source to this node's address).
pub const PASS_NODEPORT: u32 = 38;
/// Passed: a reply of a NodePort flow, its source translated back to the node's address and
/// NodePort.
pub const PASS_NODEPORT_REPLY: u32 = 39;

/// Note: an IPv4 header with options (the packet still gets its verdict).
pub const NOTE_IPV4_OPTIONS: u32 = 48;
/// Note: IPv6 extension headers were walked (the packet still gets its verdict).
pub const NOTE_IPV6_EXT_HEADERS: u32 = 49;
/// Note: a new masqueraded flow's first NAT port candidate was taken (another was tried).
pub const NOTE_NAT_PORT_COLLISION: u32 = 50;

/// IPv6 extension headers walked before the upper-layer header.
pub const MAX_IPV6_EXT_HEADERS: u32 = 4;
/// Slots reserved for reasons (codes are `< MAX_REASONS`).
pub const MAX_REASONS: u32 = 64;

/// True for a reason that passes the packet.
#[inline(always)]
#[must_use]
pub const fn is_pass(reason: u32) -> bool {
    reason == PASS || (reason >= 32 && reason < 48)
}

/// True for a reason that drops the packet.
#[inline(always)]
#[must_use]
pub const fn is_drop(reason: u32) -> bool {
    reason >= 1 && reason < 32
}

/// Operator-facing name of a reason code.
#[must_use]
pub const fn name(reason: u32) -> &'static str {
    match reason {
        PASS => "pass",
        DROP_UNKNOWN_ENDPOINT => "unknown-endpoint",
        DROP_MALFORMED => "malformed",
        DROP_UNSUPPORTED_ETHERTYPE => "unsupported-ethertype",
        DROP_SPOOFED_SOURCE => "spoofed-source",
        DROP_POLICY_DENIED => "policy-denied",
        DROP_PREFILTER_DENY => "prefilter-deny",
        DROP_FRAGMENT => "fragment",
        DROP_INVALID_HEADER => "invalid-header",
        DROP_INVALID_TCP_FLAGS => "invalid-tcp-flags",
        DROP_IPV6_ROUTING_HEADER => "ipv6-routing-header",
        DROP_EXT_HEADER_LIMIT => "too-many-extension-headers",
        DROP_CT_INSERT_FAILED => "conntrack-insert-failed",
        DROP_NAT_PORT_EXHAUSTED => "nat-port-exhausted",
        DROP_NAT_INSERT_FAILED => "nat-insert-failed",
        DROP_SERVICE_NO_BACKEND => "service-no-backend",
        DROP_NODEPORT_NO_ROUTE => "nodeport-no-route",
        PASS_ESTABLISHED => "pass-established",
        PASS_RELATED => "pass-related",
        PASS_NEIGHBOUR => "pass-neighbour",
        PASS_POLICY => "pass-policy",
        PASS_MASQUERADED => "pass-masqueraded",
        PASS_REVERSE_NAT => "pass-reverse-nat",
        PASS_NODEPORT => "pass-nodeport",
        PASS_NODEPORT_REPLY => "pass-nodeport-reply",
        NOTE_IPV4_OPTIONS => "note-ipv4-options",
        NOTE_IPV6_EXT_HEADERS => "note-ipv6-extension-headers",
        NOTE_NAT_PORT_COLLISION => "note-nat-port-collision",
        _ => "unknown-reason",
    }
}

/// Operator-facing name of a direction.
#[must_use]
pub const fn direction_name(direction: u32) -> &'static str {
    match direction {
        DIR_FROM_ENDPOINT => "from-endpoint",
        DIR_TO_ENDPOINT => "to-endpoint",
        DIR_PREFILTER => "prefilter",
        DIR_MASQUERADE => "masquerade",
        _ => "unknown-direction",
    }
}

/// Every reason code in use, for listing.
pub const ALL: &[u32] = &[
    PASS,
    DROP_UNKNOWN_ENDPOINT,
    DROP_MALFORMED,
    DROP_UNSUPPORTED_ETHERTYPE,
    DROP_SPOOFED_SOURCE,
    DROP_POLICY_DENIED,
    DROP_PREFILTER_DENY,
    DROP_FRAGMENT,
    DROP_INVALID_HEADER,
    DROP_INVALID_TCP_FLAGS,
    DROP_IPV6_ROUTING_HEADER,
    DROP_EXT_HEADER_LIMIT,
    DROP_CT_INSERT_FAILED,
    DROP_NAT_PORT_EXHAUSTED,
    DROP_NAT_INSERT_FAILED,
    DROP_SERVICE_NO_BACKEND,
    DROP_NODEPORT_NO_ROUTE,
    PASS_ESTABLISHED,
    PASS_RELATED,
    PASS_NEIGHBOUR,
    PASS_POLICY,
    PASS_MASQUERADED,
    PASS_REVERSE_NAT,
    PASS_NODEPORT,
    PASS_NODEPORT_REPLY,
    NOTE_IPV4_OPTIONS,
    NOTE_IPV6_EXT_HEADERS,
    NOTE_NAT_PORT_COLLISION,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_a_distinct_name_and_fits() {
        for (i, a) in ALL.iter().enumerate() {
            assert!(*a < MAX_REASONS);
            assert_ne!(name(*a), "unknown-reason");
            for b in &ALL[i + 1..] {
                assert_ne!(name(*a), name(*b));
            }
        }
    }

    #[test]
    fn every_reason_is_exactly_one_of_pass_drop_note() {
        for r in ALL {
            let note = name(*r).starts_with("note-");
            assert_eq!(
                u8::from(is_pass(*r)) + u8::from(is_drop(*r)) + u8::from(note),
                1,
                "{}",
                name(*r)
            );
            assert_eq!(is_pass(*r), *r == PASS || name(*r).starts_with("pass-"));
        }
    }
}
