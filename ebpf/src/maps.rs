//! Every map the programs use. Names and sizes come from `maps_schema::maps` (the name literals must
//! match it; the verifier gate checks). Maps only the agent writes are `BPF_F_RDONLY_PROG`.

use aya_ebpf::{
    btf_maps::{
        Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, RingBuf, SkStorage,
    },
    macros::btf_map,
};
use maps_schema::{
    Backend4, ClockCache, CounterValue, Ct4Key, Ct6Key, DropEvent, EndpointInfo, IdentityInfo,
    MasqCidr, MasqInterface, Nat4Entry, Nat4Key, PolicyKey, PolicyValue, PrefilterEntry, RevNat4,
    SlotKey, SlotValue, Svc4Key, Svc4Value, SvcCt4Entry, SvcCt4Key, TraceConfig,
    maps::{
        BPF_F_NO_PREALLOC, BPF_F_RDONLY_PROG, COUNTERS_MAX, CT_CLOCK_MAX, CT_EVENTS_MAX, CT_MAX,
        DROP_EVENTS_BYTES, ENDPOINTS_MAX, HOST_FWD_MAX, IDENT_MAX, IPCACHE_MAX, MASQ_CIDR_MAX,
        MASQ_IF_MAX, NAT_EVENTS_MAX, NAT_MAX, POLICY_MAX, PREFILTER_MAX, RULE_HITS_MAX, TRACE_MAX,
    },
    service::{
        Affinity4, Affinity4Key, MemberKey, MemberValue, SVC_AFFINITY_MAX, SVC_BACKENDS_MAX,
        SVC_MAX,
    },
    service_ct::SVC_CT_MAX,
    socket_lb::{SOCK_DGRAM_MAX, SockAffinity4Key, SockDgram4Key, SockLbConfig, SockRevNat4},
};

/// Agent-written hash maps: read-only to programs, entries allocated on demand.
const AGENT_HASH: usize = BPF_F_RDONLY_PROG | BPF_F_NO_PREALLOC;
/// Agent-written LPM tries (LPM tries always need `BPF_F_NO_PREALLOC`).
const AGENT_LPM: usize = BPF_F_RDONLY_PROG | BPF_F_NO_PREALLOC;

/// ifindex → endpoint.
#[btf_map(name = "endpoints_v1", pin_by_name)]
pub(crate) static ENDPOINTS: HashMap<u32, EndpointInfo, { ENDPOINTS_MAX as usize }, AGENT_HASH> =
    HashMap::new();

/// Exact IPv4 address → identity.
#[btf_map(name = "ident4_v1", pin_by_name)]
pub(crate) static IDENT4: HashMap<[u8; 4], IdentityInfo, { IDENT_MAX as usize }, AGENT_HASH> =
    HashMap::new();

/// Exact IPv6 address → identity.
#[btf_map(name = "ident6_v1", pin_by_name)]
pub(crate) static IDENT6: HashMap<[u8; 16], IdentityInfo, { IDENT_MAX as usize }, AGENT_HASH> =
    HashMap::new();

/// IPv4 CIDR → identity.
#[btf_map(name = "ipcache4_v1", pin_by_name)]
pub(crate) static IPCACHE4: LpmTrie<[u8; 4], IdentityInfo, { IPCACHE_MAX as usize }, AGENT_LPM> =
    LpmTrie::new();

/// IPv6 CIDR → identity.
#[btf_map(name = "ipcache6_v1", pin_by_name)]
pub(crate) static IPCACHE6: LpmTrie<[u8; 16], IdentityInfo, { IPCACHE_MAX as usize }, AGENT_LPM> =
    LpmTrie::new();

/// (endpoint, direction, peer, protocol, port) → verdict.
#[btf_map(name = "policy_v1", pin_by_name)]
pub(crate) static POLICY: HashMap<PolicyKey, PolicyValue, { POLICY_MAX as usize }, AGENT_HASH> =
    HashMap::new();

/// The conntrack value this build writes: the current layout, or layout 2 in the test-only
/// `ct-v2` build (the "previous release" of the agent's migration tests).
#[cfg(not(feature = "ct-v2"))]
pub(crate) type Ct = maps_schema::CtEntry;
/// The conntrack value this build writes (layout 2: the test-only `ct-v2` build).
#[cfg(feature = "ct-v2")]
pub(crate) type Ct = maps_schema::CtEntryV2;

/// IPv4 conntrack, written by the programs.
#[cfg_attr(not(feature = "ct-v2"), btf_map(name = "ct4_v3", pin_by_name))]
#[cfg_attr(feature = "ct-v2", btf_map(name = "ct4_v2", pin_by_name))]
pub(crate) static CT4: LruHashMap<Ct4Key, Ct, { CT_MAX as usize }> = LruHashMap::new();

/// IPv6 conntrack, written by the programs.
#[cfg_attr(not(feature = "ct-v2"), btf_map(name = "ct6_v3", pin_by_name))]
#[cfg_attr(feature = "ct-v2", btf_map(name = "ct6_v2", pin_by_name))]
pub(crate) static CT6: LruHashMap<Ct6Key, Ct, { CT_MAX as usize }> = LruHashMap::new();

/// IPv4 prefilter deny CIDRs.
#[btf_map(name = "prefilter4_v1", pin_by_name)]
pub(crate) static PREFILTER4: LpmTrie<
    [u8; 4],
    PrefilterEntry,
    { PREFILTER_MAX as usize },
    AGENT_LPM,
> = LpmTrie::new();

/// IPv6 prefilter deny CIDRs.
#[btf_map(name = "prefilter6_v1", pin_by_name)]
pub(crate) static PREFILTER6: LpmTrie<
    [u8; 16],
    PrefilterEntry,
    { PREFILTER_MAX as usize },
    AGENT_LPM,
> = LpmTrie::new();

/// (reason, direction) → packets and bytes, per CPU.
#[btf_map(name = "counters_v1", pin_by_name)]
pub(crate) static COUNTERS: PerCpuArray<CounterValue, { COUNTERS_MAX as usize }> =
    PerCpuArray::new();

/// Conntrack entries created, per family and CPU (the agent derives LRU evictions from them).
#[btf_map(name = "ct_events_v1", pin_by_name)]
pub(crate) static CT_EVENTS: PerCpuArray<u64, { CT_EVENTS_MAX as usize }> = PerCpuArray::new();

/// The conntrack clock as each CPU last read it (`flow::now_ns`).
#[btf_map(name = "ct_clock_v1", pin_by_name)]
pub(crate) static CT_CLOCK: PerCpuArray<ClockCache, { CT_CLOCK_MAX as usize }> = PerCpuArray::new();

/// Sampled drop events.
#[btf_map(name = "drop_events_v1", pin_by_name)]
pub(crate) static DROP_EVENTS: RingBuf<DropEvent, { DROP_EVENTS_BYTES as usize }> = RingBuf::new();

/// Rule id → packets and bytes that rule decided, per CPU (`maps_schema::rules`).
#[btf_map(name = "rule_hits_v1", pin_by_name)]
pub(crate) static RULE_HITS: PerCpuArray<CounterValue, { RULE_HITS_MAX as usize }> =
    PerCpuArray::new();

/// The nonce of `weir policy trace`'s test runs (`maps_schema::trace`); agent-written.
#[btf_map(name = "trace_v1", pin_by_name)]
pub(crate) static TRACE: Array<TraceConfig, { TRACE_MAX as usize }, { BPF_F_RDONLY_PROG }> =
    Array::new();

/// Masquerade entries, both directions of each flow (`maps_schema::nat`); written by the programs.
#[btf_map(name = "nat4_v1", pin_by_name)]
pub(crate) static NAT4: LruHashMap<Nat4Key, Nat4Entry, { NAT_MAX as usize }> = LruHashMap::new();

/// ifindex → the address that masquerade interface translates to; agent-written.
#[btf_map(name = "masq_if_v1", pin_by_name)]
pub(crate) static MASQ_IF: HashMap<u32, MasqInterface, { MASQ_IF_MAX as usize }, AGENT_HASH> =
    HashMap::new();

/// IPv4 pool CIDRs: masqueraded sources, never-masqueraded destinations; agent-written.
#[btf_map(name = "masq_cidr4_v1", pin_by_name)]
pub(crate) static MASQ_CIDR4: LpmTrie<[u8; 4], MasqCidr, { MASQ_CIDR_MAX as usize }, AGENT_LPM> =
    LpmTrie::new();

/// NAT events (created, collisions, exhausted, insert failures), per CPU.
#[btf_map(name = "nat_events_v1", pin_by_name)]
pub(crate) static NAT_EVENTS: PerCpuArray<u64, { NAT_EVENTS_MAX as usize }> = PerCpuArray::new();

/// Service frontends (`maps_schema::service`); agent-written.
#[btf_map(name = "svc4_v1", pin_by_name)]
pub(crate) static SVC4: HashMap<Svc4Key, Svc4Value, { SVC_MAX as usize }, AGENT_HASH> =
    HashMap::new();

/// (service, slot) → backend id; agent-written.
#[btf_map(name = "svc_slots_v1", pin_by_name)]
pub(crate) static SVC_SLOTS: HashMap<
    SlotKey,
    SlotValue,
    { SVC_BACKENDS_MAX as usize },
    AGENT_HASH,
> = HashMap::new();

/// (service, backend) → the backend's slot (the inverse of `SVC_SLOTS`: affinity follows a
/// backend that moved to another slot); agent-written.
#[btf_map(name = "svc_members_v1", pin_by_name)]
pub(crate) static SVC_MEMBERS: HashMap<
    MemberKey,
    MemberValue,
    { SVC_BACKENDS_MAX as usize },
    AGENT_HASH,
> = HashMap::new();

/// Backend id → address and port; agent-written.
#[btf_map(name = "svc_backend4_v1", pin_by_name)]
pub(crate) static SVC_BACKENDS4: HashMap<u32, Backend4, { SVC_BACKENDS_MAX as usize }, AGENT_HASH> =
    HashMap::new();

/// Service id → frontend (reverse NAT); agent-written.
#[btf_map(name = "svc_revnat4_v1", pin_by_name)]
pub(crate) static SVC_REVNAT4: HashMap<u32, RevNat4, { SVC_MAX as usize }, AGENT_HASH> =
    HashMap::new();

/// Translated flows, both directions (`maps_schema::service_ct`); written by the programs.
#[btf_map(name = "svc_ct4_v1", pin_by_name)]
pub(crate) static SVC_CT4: LruHashMap<SvcCt4Key, SvcCt4Entry, { SVC_CT_MAX as usize }> =
    LruHashMap::new();

/// `sessionAffinity: ClientIP`: each client's backend per frontend (`maps_schema::service`);
/// written by the programs.
#[btf_map(name = "svc_affin4_v1", pin_by_name)]
pub(crate) static SVC_AFFINITY4: LruHashMap<
    Affinity4Key,
    Affinity4,
    { SVC_AFFINITY_MAX as usize },
> = LruHashMap::new();

/// Socket LB: each placed socket's frontend, in the socket's own storage
/// (`maps_schema::socket_lb`); written by the programs.
#[btf_map(name = "sock_rnat4_v2", pin_by_name)]
pub(crate) static SOCK_RNAT4: SkStorage<SockRevNat4> = SkStorage::new();

/// Socket LB: the frontend each unconnected UDP socket sent to, by socket and backend
/// (`maps_schema::socket_lb`); written by the programs.
#[btf_map(name = "sock_dgram4_v1", pin_by_name)]
pub(crate) static SOCK_DGRAM4: LruHashMap<SockDgram4Key, SockRevNat4, { SOCK_DGRAM_MAX as usize }> =
    LruHashMap::new();

/// Socket LB's `ClientIP` affinity by network namespace (`maps_schema::socket_lb`); written by
/// the programs.
#[btf_map(name = "sock_affin4_v1", pin_by_name)]
pub(crate) static SOCK_AFFIN4: LruHashMap<
    SockAffinity4Key,
    Affinity4,
    { SVC_AFFINITY_MAX as usize },
> = LruHashMap::new();

/// Socket LB's settings (`maps_schema::socket_lb::SockLbConfig`, slot 0); agent-written.
#[btf_map(name = "sock_cfg_v1", pin_by_name)]
pub(crate) static SOCK_CFG: Array<SockLbConfig, 1, { BPF_F_RDONLY_PROG }> = Array::new();

/// BPF host routing: slot `HOST_FWD_SLOT` holds `host_fwd` when the agent runs with
/// `--host-routing bpf`; agent-written.
#[btf_map(name = "host_fwd_v1", pin_by_name)]
pub(crate) static HOST_FWD: ProgramArray<{ HOST_FWD_MAX as usize }> = ProgramArray::new();
