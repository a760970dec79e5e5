//! Map names (each carries its layout version), default sizes and map flags.
//!
//! The eBPF crate declares each map with the same name literal (`#[btf_map(name = "...")]`);
//! the verifier gate in `tests/` checks that the object's maps are exactly [`ALL`].

/// `BPF_F_NO_PREALLOC`: allocate hash entries on demand (required for LPM tries).
pub const BPF_F_NO_PREALLOC: usize = 1;
/// `BPF_F_RDONLY_PROG`: programs may read but never write the map; only the agent writes it.
pub const BPF_F_RDONLY_PROG: usize = 1 << 7;

/// ifindex → [`crate::EndpointInfo`]. Written by the agent (and `weir-cni` through it).
pub const ENDPOINTS: &str = "endpoints_v1";
/// Default size of [`ENDPOINTS`].
pub const ENDPOINTS_MAX: u32 = 65_536;

/// Exact IPv4 address (`[u8; 4]`, network order) → [`crate::IdentityInfo`]: pods, the node's own
/// addresses (host identity). Written by the agent.
pub const IDENT4: &str = "ident4_v1";
/// Exact IPv6 address (`[u8; 16]`) → [`crate::IdentityInfo`]. Written by the agent.
pub const IDENT6: &str = "ident6_v1";
/// Default size of [`IDENT4`] and [`IDENT6`].
pub const IDENT_MAX: u32 = 65_536;

/// IPv4 CIDR (LPM key: prefix length + `[u8; 4]`) → [`crate::IdentityInfo`] (CIDR identities).
pub const IPCACHE4: &str = "ipcache4_v1";
/// IPv6 CIDR (LPM key: prefix length + `[u8; 16]`) → [`crate::IdentityInfo`].
pub const IPCACHE6: &str = "ipcache6_v1";
/// Default size of [`IPCACHE4`] and [`IPCACHE6`].
pub const IPCACHE_MAX: u32 = 65_536;

/// [`crate::PolicyKey`] → [`crate::PolicyValue`]. Written by the agent.
pub const POLICY: &str = "policy_v1";
/// Default size of [`POLICY`].
pub const POLICY_MAX: u32 = 262_144;

/// [`crate::Ct4Key`] → [`crate::CtEntry`], LRU. Written by the programs, swept by the agent.
/// Conntrack layout [`crate::conntrack::LAYOUT`]; the agent migrates older layouts' entries.
pub const CT4: &str = "ct4_v3";
/// [`crate::Ct6Key`] → [`crate::CtEntry`], LRU. Written by the programs, swept by the agent.
pub const CT6: &str = "ct6_v3";
/// Name stem of the IPv4 conntrack map (`ct4_v<layout>`).
pub const CT4_STEM: &str = "ct4";
/// Name stem of the IPv6 conntrack map (`ct6_v<layout>`).
pub const CT6_STEM: &str = "ct6";
/// Default size of [`CT4`] and [`CT6`].
pub const CT_MAX: u32 = 262_144;

/// IPv4 deny CIDR (LPM) → [`crate::PrefilterEntry`] for `xdp_prefilter`. Written by the agent.
pub const PREFILTER4: &str = "prefilter4_v1";
/// IPv6 deny CIDR (LPM) → [`crate::PrefilterEntry`] for `xdp_prefilter`. Written by the agent.
pub const PREFILTER6: &str = "prefilter6_v1";
/// Default size of [`PREFILTER4`] and [`PREFILTER6`].
pub const PREFILTER_MAX: u32 = 16_384;

/// [`crate::CounterKey`] → per-CPU [`crate::CounterValue`] (packets and bytes by reason and direction).
pub const COUNTERS: &str = "counters_v1";
/// Slots in [`COUNTERS`]: every reason × every direction.
pub const COUNTERS_MAX: u32 = crate::reason::MAX_REASONS * crate::reason::DIRECTIONS;

/// Conntrack events by [`crate::conntrack::EVENT_CREATED4`]/[`crate::conntrack::EVENT_CREATED6`]
/// → per-CPU `u64` count, written by the programs. With the agent's own deletes and the entry
/// count, the created counts give the LRU evictions the kernel does not count.
pub const CT_EVENTS: &str = "ct_events_v1";
/// Slots in [`CT_EVENTS`].
pub const CT_EVENTS_MAX: u32 = 2;

/// Per-CPU [`crate::ClockCache`] (slot 0): the conntrack clock as each CPU last read it, written by
/// the programs only (scratch state: never migrated, an empty one is correct).
pub const CT_CLOCK: &str = "ct_clock_v1";
/// Slots in [`CT_CLOCK`].
pub const CT_CLOCK_MAX: u32 = 1;

/// Ring buffer of sampled [`crate::DropEvent`]s. Written by the programs, read by the agent.
pub const DROP_EVENTS: &str = "drop_events_v1";
/// Size of [`DROP_EVENTS`] in bytes (a power of two, a multiple of the page size).
pub const DROP_EVENTS_BYTES: u32 = 256 * 1024;

/// Rule id ([`crate::rules::rule_slot`]) → per-CPU [`crate::rules::RuleHits`]: packets and bytes
/// each policy rule decided (see [`crate::rules`] for which packets count). Written by the programs.
pub const RULE_HITS: &str = "rule_hits_v1";
/// Slots in [`RULE_HITS`] (rule ids beyond it are counted in slot 0).
pub const RULE_HITS_MAX: u32 = 16_384;

/// Slot 0 → [`crate::TraceConfig`]: the nonce of `weir policy trace`'s test runs
/// ([`crate::trace`]). Written by the agent, read-only to programs.
pub const TRACE: &str = "trace_v1";
/// Slots in [`TRACE`].
pub const TRACE_MAX: u32 = 1;

/// [`crate::Nat4Key`] → [`crate::Nat4Entry`], LRU: masquerade entries, both directions of each
/// flow ([`crate::nat`]). Written by the programs, swept by the agent.
pub const NAT4: &str = "nat4_v1";
/// Default size of [`NAT4`] (two entries per masqueraded flow).
pub const NAT_MAX: u32 = 131_072;
/// ifindex → [`crate::MasqInterface`]: the interfaces `masq_egress`/`masq_ingress` run on and
/// the address each masquerades to. Written by the agent.
pub const MASQ_IF: &str = "masq_if_v1";
/// Default size of [`MASQ_IF`].
pub const MASQ_IF_MAX: u32 = 64;
/// IPv4 pool CIDR (LPM) → [`crate::MasqCidr`]: masqueraded sources, never-masqueraded
/// destinations. Written by the agent from the IPAM pools.
pub const MASQ_CIDR4: &str = "masq_cidr4_v1";
/// Default size of [`MASQ_CIDR4`].
pub const MASQ_CIDR_MAX: u32 = 1_024;
/// NAT events by [`crate::nat::EVENT_CREATED`] … → per-CPU `u64` count, written by the programs.
pub const NAT_EVENTS: &str = "nat_events_v1";
/// Slots in [`NAT_EVENTS`].
pub const NAT_EVENTS_MAX: u32 = 4;

/// BPF host routing (a `BPF_MAP_TYPE_PROG_ARRAY`): slot [`HOST_FWD_SLOT`] → `host_fwd`, which
/// `from_endpoint` tail-calls for a packet it passed; slot [`HOST_FWD_IN_SLOT`] → `host_fwd_in`,
/// which `masq_ingress` tail-calls for a packet arriving on a host interface it passed. An empty
/// slot (`--host-routing kernel`, or a test object nobody filled) leaves the packet to the
/// kernel's forwarding. Written by the agent.
pub const HOST_FWD: &str = "host_fwd_v1";
/// Slots in [`HOST_FWD`].
pub const HOST_FWD_MAX: u32 = 3;
/// The slot of [`HOST_FWD`] that holds `host_fwd`.
pub const HOST_FWD_SLOT: u32 = 0;
/// The slot of [`HOST_FWD`] that holds `host_fwd_in`.
pub const HOST_FWD_IN_SLOT: u32 = 1;
/// The slot of [`HOST_FWD`] that holds `to_endpoint`: `host_fwd_in` tail-calls it for a packet
/// bound for a pod on this node, with [`PEER_CB`] in the context's `cb[0..2]` and the pod's host
/// veth's ifindex in `cb[2]`; `to_endpoint` judges the packet for that endpoint and, if it
/// passes, hands it straight to the pod's side of the veth (`bpf_redirect_peer`).
pub const TO_ENDPOINT_SLOT: u32 = 2;
/// The two `cb` words that mark a `to_endpoint` run tail-called by `host_fwd_in`.
pub const PEER_CB: [u32; 2] = [0x7065_6572, 0x6877_6972];

/// Every map in the object, in the order `weir bpf maps` lists them.
pub const ALL: &[&str] = &[
    ENDPOINTS,
    IDENT4,
    IDENT6,
    IPCACHE4,
    IPCACHE6,
    POLICY,
    CT4,
    CT6,
    PREFILTER4,
    PREFILTER6,
    COUNTERS,
    CT_EVENTS,
    CT_CLOCK,
    DROP_EVENTS,
    RULE_HITS,
    TRACE,
    NAT4,
    MASQ_IF,
    MASQ_CIDR4,
    NAT_EVENTS,
    crate::service::SVC4,
    crate::service::SVC_SLOTS,
    crate::service::SVC_MEMBERS,
    crate::service::SVC_BACKENDS4,
    crate::service::SVC_REVNAT4,
    crate::service_ct::SVC_CT4,
    crate::service::SVC_AFFINITY4,
    crate::socket_lb::SOCK_RNAT4,
    crate::socket_lb::SOCK_DGRAM4,
    crate::socket_lb::SOCK_CFG,
    crate::socket_lb::SOCK_AFFIN4,
    HOST_FWD,
];

/// The pin name of map `name` at version `version` (`ct4`, 2 → `ct4_v2`).
#[must_use]
pub const fn layout_version(name: &str) -> Option<u32> {
    let bytes = name.as_bytes();
    let mut i = bytes.len();
    let mut version = 0u32;
    let mut scale = 1u32;
    while i > 0 {
        let b = bytes[i - 1];
        if b.is_ascii_digit() {
            version += (b - b'0') as u32 * scale;
            scale *= 10;
            i -= 1;
        } else if b == b'v' && i >= 2 && bytes[i - 2] == b'_' && scale > 1 {
            return Some(version);
        } else {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_map_name_carries_a_version_and_fits_the_kernel_name_limit() {
        for name in ALL {
            assert!(layout_version(name).is_some(), "{name} has no _vN suffix");
            assert!(
                name.len() <= 15,
                "{name} is longer than BPF_OBJ_NAME_LEN - 1"
            );
        }
        assert_eq!(layout_version("ct4_v2"), Some(2));
        assert_eq!(layout_version("ct4_v12"), Some(12));
        assert_eq!(layout_version("ct4"), None);
        assert_eq!(layout_version("ct4_v"), None);
    }
}
