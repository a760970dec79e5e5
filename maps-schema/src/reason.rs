//! Verdict reasons and directions, shared with user space so an operator can read every drop.
//!
//! A reason is a small number; `name()` gives its stable, operator-facing name.
//! Codes are append-only: never renumber one.

/// Directions a counter is kept for.
pub const DIR_FROM_ENDPOINT: u32 = 0;
/// Packets entering a pod (tc egress of its host-side veth).
pub const DIR_TO_ENDPOINT: u32 = 1;
/// Packets seen by `xdp_prefilter`.
pub const DIR_PREFILTER: u32 = 2;
/// Number of directions.
pub const DIRECTIONS: u32 = 4;

/// Passed: the packet was allowed.
pub const PASS: u32 = 0;
/// Dropped: the interface has no entry in the endpoints map (fail closed).
pub const DROP_UNKNOWN_ENDPOINT: u32 = 1;
/// Dropped: the packet could not be parsed (truncated header).
pub const DROP_MALFORMED: u32 = 2;
/// Dropped: an ethertype other than IPv4, IPv6 or ARP.
pub const DROP_UNSUPPORTED_ETHERTYPE: u32 = 3;
/// Dropped: the source address is not one of the endpoint's own addresses.
pub const DROP_SPOOFED_SOURCE: u32 = 4;
/// Dropped: policy denied it.
pub const DROP_POLICY_DENIED: u32 = 5;
/// Dropped: the source is in a prefilter deny CIDR.
pub const DROP_PREFILTER_DENY: u32 = 6;

/// Slots reserved for reasons (codes are `< MAX_REASONS`).
pub const MAX_REASONS: u32 = 64;

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
}
