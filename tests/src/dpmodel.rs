//! A model of `from_endpoint`/`to_endpoint` in plain Rust, for the differential test
//! (`tests/tests/datapath_differential.rs`, [docs/differential.md](../../docs/differential.md)).
//!
//! It follows `ebpf/src` step by step — dispatch, the IPv4/IPv6/L4 parsers, conntrack, policy
//! (`maps_schema::policy::decide`), Service translation and its replies, ICMP errors about
//! translated flows, the hairpin and the no-backend answer — over plain maps, and writes the
//! packet's bytes as the kernel's helpers would in a `BPF_PROG_TEST_RUN` (an skb whose checksum
//! state is `CHECKSUM_NONE`). Time is one value per map state (`now`): a stamp the programs write
//! is "now" within the state's run.

use std::collections::HashMap;

use maps_schema::{
    Backend4, Ct4Key, Ct6Key, CtEntry, EndpointInfo, PolicyKey, PolicyValue, RevNat4, SlotKey,
    Svc4Key, Svc4Value, SvcCt4Entry, SvcCt4Key, checksum,
    conntrack::{
        FLAG_DST_INGRESS_APPROVED, FLAG_OPENER_IS_B, FLAG_SEEN_REPLY, FLAG_SRC_EGRESS_APPROVED,
        FLAG_TCP_FIN_DST, FLAG_TCP_FIN_SRC, FLAG_TCP_RST, FLAG_TCP_SYN, FLAG_TCP_SYN_ACK,
    },
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    identity::{HOST, WORLD},
    policy::{EGRESS, INGRESS, VERDICT_ALLOW},
    reason::{
        DIR_FROM_ENDPOINT, DIR_TO_ENDPOINT, DROP_EXT_HEADER_LIMIT, DROP_FRAGMENT,
        DROP_INVALID_HEADER, DROP_INVALID_TCP_FLAGS, DROP_IPV6_ROUTING_HEADER, DROP_MALFORMED,
        DROP_POLICY_DENIED, DROP_SERVICE_NO_BACKEND, DROP_SPOOFED_SOURCE, DROP_UNKNOWN_ENDPOINT,
        DROP_UNSUPPORTED_ETHERTYPE, MAX_IPV6_EXT_HEADERS, NOTE_IPV4_OPTIONS, NOTE_IPV6_EXT_HEADERS,
        PASS, PASS_ESTABLISHED, PASS_NEIGHBOUR, PASS_POLICY, PASS_RELATED, is_pass,
    },
    service::{
        Affinity4, Affinity4Key, BACKEND_FLAG_TERMINATING, HAIRPIN4, MemberKey, NODEPORT_ANY,
        SCOPE_ALL, SCOPE_PODS, SVC_FLAG_AFFINITY, SVC_FLAG_EXTERNAL_LOCAL, affinity_holds,
        backend_slot, flow_hash, pod_nodeport, tuple_taken,
    },
    service_ct::{DIR_ORIGINAL, DIR_REPLY},
};

/// tc actions.
pub const TC_ACT_OK: i32 = 0;
/// `TC_ACT_SHOT`.
pub const TC_ACT_SHOT: i32 = 2;
/// `TC_ACT_REDIRECT`.
pub const TC_ACT_REDIRECT: i32 = 7;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_ARP: u16 = 0x0806;
const ICMP: u8 = 1;
const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;
const ICMPV6: u8 = 58;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

/// The maps the two programs read and write, as plain maps (LPM tries as lists).
#[derive(Clone, Debug, Default)]
pub struct Maps {
    /// `endpoints`: ifindex → endpoint.
    pub endpoints: HashMap<u32, EndpointInfo>,
    /// `ident4`: exact address → identity.
    pub ident4: HashMap<[u8; 4], u32>,
    /// `ident6`.
    pub ident6: HashMap<[u8; 16], u32>,
    /// `ipcache4`: (prefix, length) → identity.
    pub ipcache4: Vec<([u8; 4], u32, u32)>,
    /// `ipcache6`.
    pub ipcache6: Vec<([u8; 16], u32, u32)>,
    /// `policy`.
    pub policy: HashMap<PolicyKey, PolicyValue>,
    /// `svc4`.
    pub svc4: HashMap<Svc4Key, Svc4Value>,
    /// `svc_slots`: (service, slot) → backend id.
    pub slots: HashMap<SlotKey, u32>,
    /// `svc_members`: (service, backend) → slot.
    pub members: HashMap<MemberKey, u16>,
    /// `svc_backend4`.
    pub backends4: HashMap<u32, Backend4>,
    /// `svc_revnat4`.
    pub revnat4: HashMap<u32, RevNat4>,
    /// `svc_affin4`.
    pub affinity4: HashMap<Affinity4Key, Affinity4>,
    /// `ct4`.
    pub ct4: HashMap<Ct4Key, CtEntry>,
    /// `ct6`.
    pub ct6: HashMap<Ct6Key, CtEntry>,
    /// `svc_ct4`.
    pub svc_ct4: HashMap<SvcCt4Key, SvcCt4Entry>,
}

/// Which program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prog {
    /// `from_endpoint` (tc ingress of the workload veth: leaving the pod).
    From,
    /// `to_endpoint` (tc egress: entering the pod).
    To,
}

impl Prog {
    /// The counters' direction.
    #[must_use]
    pub fn direction(self) -> u32 {
        match self {
            Self::From => DIR_FROM_ENDPOINT,
            Self::To => DIR_TO_ENDPOINT,
        }
    }
}

/// What a run did, beside the maps it changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// The tc action.
    pub action: i32,
    /// The verdict reason counted.
    pub reason: u32,
    /// A note counted beside it (IPv4 options, IPv6 extension headers).
    pub note: Option<u32>,
    /// The policy rule counted in `rule_hits` (0: none).
    pub rule: u32,
    /// The packet as the program left it.
    pub out: Vec<u8>,
    /// What happened, for the test's class counts.
    pub trail: Trail,
}

/// Paths a run took (for coverage counts, not compared).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trail {
    /// A packet to a frontend was translated to a backend.
    pub translated: bool,
    /// A reply's source was translated back to its frontend.
    pub reply_translated: bool,
    /// An ICMP error about a translated flow was translated back.
    pub related_translated: bool,
    /// A hairpin packet was sent back into its pod.
    pub hairpin: bool,
    /// A no-backend packet was answered with a port unreachable.
    pub unreachable: bool,
    /// A conntrack entry was created.
    pub ct_created: bool,
    /// An existing conntrack entry was found for a flow packet.
    pub ct_hit: bool,
    /// A translated flow kept the backend its `svc_ct4` entry names.
    pub kept_backend: bool,
    /// A new flow went to the backend its client's affinity entry remembers.
    pub affinity: bool,
    /// A new flow's translated tuple was taken: it went to the next slot's backend.
    pub taken: bool,
    /// A pod's packet to a NodePort on the node's address.
    pub node_port: bool,
    /// Checksum state `Unknown` (the port's change through the helper).
    pub csum_unknown: bool,
}

/// An address of either family: IPv4 in the first four bytes.
type Addr = [u8; 16];

#[derive(Clone, Copy, Debug, Default)]
struct Tuple {
    src: Addr,
    dst: Addr,
    sport: u16,
    dport: u16,
    proto: u8,
}

impl Tuple {
    fn reversed(&self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Flow,
    Related,
    Neighbour,
    Stateless,
}

#[derive(Clone, Copy, Debug)]
struct Parsed {
    tuple: Tuple,
    policy_port: u16,
    tcp_flags: u8,
    class: Class,
    inner: Tuple,
    note: Option<u32>,
    rev_nat: u32,
}

fn v4(a: &Addr) -> [u8; 4] {
    [a[0], a[1], a[2], a[3]]
}

fn from4(a: [u8; 4]) -> Addr {
    let mut out = [0; 16];
    out[..4].copy_from_slice(&a);
    out
}

/// The packet's bytes with the program's bounds checks (`Packet::ptr`).
fn has(pkt: &[u8], off: usize, len: usize) -> bool {
    off + len <= pkt.len()
}

fn be16(pkt: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([pkt[off], pkt[off + 1]])
}

fn ethertype(pkt: &[u8]) -> Option<u16> {
    has(pkt, 0, ETH_HLEN).then(|| be16(pkt, 12))
}

fn tcp_flags_invalid(flags: u8) -> bool {
    let syn = flags & TCP_SYN != 0;
    (syn && flags & (TCP_FIN | TCP_RST) != 0)
        || flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == 0
        || (flags & TCP_FIN != 0 && flags & TCP_ACK == 0)
}

fn has_ports(proto: u8) -> bool {
    proto == TCP || proto == UDP || proto == SCTP
}

fn echo_ports(request: bool, id: u16) -> (u16, u16) {
    if request { (id, 0) } else { (0, id) }
}

fn icmp_header(pkt: &[u8], off: usize) -> Option<(u8, u16)> {
    has(pkt, off, 8).then(|| (pkt[off], be16(pkt, off + 4)))
}

/// `l4::transport`: (sport, dport, tcp flags).
fn transport(pkt: &[u8], off: usize, proto: u8) -> Result<(u16, u16, u8), u32> {
    let need = match proto {
        TCP => 20,
        UDP => 8,
        SCTP => 12,
        _ => return Ok((0, 0, 0)),
    };
    if !has(pkt, off, need) {
        return Err(DROP_MALFORMED);
    }
    let (sport, dport) = (be16(pkt, off), be16(pkt, off + 2));
    if proto != TCP {
        return Ok((sport, dport, 0));
    }
    let doff = usize::from(pkt[off + 12] >> 4);
    if doff < 5 {
        return Err(DROP_INVALID_HEADER);
    }
    if doff > 5 && !has(pkt, off + doff * 4 - 1, 1) {
        return Err(DROP_MALFORMED);
    }
    let flags = pkt[off + 13];
    if tcp_flags_invalid(flags) {
        return Err(DROP_INVALID_TCP_FLAGS);
    }
    Ok((sport, dport, flags))
}

/// An IPv4 base header: (proto, src, dst, header length, fragment field).
type Header4 = (u8, [u8; 4], [u8; 4], usize, u16);

/// `ipv4::header`.
fn header4(pkt: &[u8], off: usize) -> Result<Header4, u32> {
    if !has(pkt, off, 20) {
        return Err(DROP_MALFORMED);
    }
    let vi = pkt[off];
    let ihl = usize::from(vi & 0x0f);
    if vi >> 4 != 4 || ihl < 5 {
        return Err(DROP_INVALID_HEADER);
    }
    let hlen = ihl * 4;
    if ihl > 5 && !has(pkt, off + hlen - 1, 1) {
        return Err(DROP_MALFORMED);
    }
    let src = pkt[off + 12..off + 16].try_into().expect("4 bytes");
    let dst = pkt[off + 16..off + 20].try_into().expect("4 bytes");
    Ok((pkt[off + 9], src, dst, hlen, be16(pkt, off + 6)))
}

fn empty(tuple: Tuple, note: Option<u32>) -> Parsed {
    Parsed {
        tuple,
        policy_port: 0,
        tcp_flags: 0,
        class: Class::Flow,
        inner: Tuple::default(),
        note,
        rev_nat: 0,
    }
}

fn parse4(pkt: &[u8]) -> Result<Parsed, u32> {
    let (proto, src, dst, hlen, frag) = header4(pkt, ETH_HLEN)?;
    if frag & 0x3fff != 0 {
        return Err(DROP_FRAGMENT);
    }
    let note = (hlen > 20).then_some(NOTE_IPV4_OPTIONS);
    let off = ETH_HLEN + hlen;
    let tuple = Tuple {
        src: from4(src),
        dst: from4(dst),
        proto,
        ..Tuple::default()
    };
    let mut p = empty(tuple, note);
    if proto == ICMP {
        let (ty, id) = icmp_header(pkt, off).ok_or(DROP_MALFORMED)?;
        p.policy_port = u16::from(ty);
        match ty {
            8 | 0 => (p.tuple.sport, p.tuple.dport) = echo_ports(ty == 8, id),
            3 | 11 | 12 => {
                p.inner = inner4(pkt, off + 8)?;
                p.class = Class::Related;
            }
            _ => p.class = Class::Stateless,
        }
        return Ok(p);
    }
    let (sport, dport, flags) = transport(pkt, off, proto)?;
    (p.tuple.sport, p.tuple.dport, p.policy_port, p.tcp_flags) = (sport, dport, dport, flags);
    Ok(p)
}

fn inner4(pkt: &[u8], off: usize) -> Result<Tuple, u32> {
    let (proto, src, dst, hlen, _) = header4(pkt, off)?;
    let l4 = off + hlen;
    let (sport, dport) = if has_ports(proto) {
        if !has(pkt, l4, 4) {
            return Err(DROP_MALFORMED);
        }
        (be16(pkt, l4), be16(pkt, l4 + 2))
    } else if proto == ICMP {
        let (ty, id) = icmp_header(pkt, l4).ok_or(DROP_MALFORMED)?;
        echo_ports(ty == 8, id)
    } else {
        (0, 0)
    };
    Ok(Tuple {
        src: from4(src),
        dst: from4(dst),
        sport,
        dport,
        proto,
    })
}

fn header6(pkt: &[u8], off: usize) -> Result<(u8, Addr, Addr), u32> {
    if !has(pkt, off, 40) {
        return Err(DROP_MALFORMED);
    }
    if pkt[off] >> 4 != 6 {
        return Err(DROP_INVALID_HEADER);
    }
    let src = pkt[off + 8..off + 24].try_into().expect("16 bytes");
    let dst = pkt[off + 24..off + 40].try_into().expect("16 bytes");
    Ok((pkt[off + 6], src, dst))
}

fn walk6(pkt: &[u8], mut next: u8, mut off: usize) -> Result<(u8, usize, bool), u32> {
    let mut seen = false;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        let len = match next {
            0 | 60 => {
                if !has(pkt, off, 2) {
                    return Err(DROP_MALFORMED);
                }
                next = pkt[off];
                (usize::from(pkt[off + 1]) + 1) * 8
            }
            43 => {
                if !has(pkt, off, 4) {
                    return Err(DROP_MALFORMED);
                }
                if pkt[off + 3] != 0 {
                    return Err(DROP_IPV6_ROUTING_HEADER);
                }
                next = pkt[off];
                (usize::from(pkt[off + 1]) + 1) * 8
            }
            51 => {
                if !has(pkt, off, 2) {
                    return Err(DROP_MALFORMED);
                }
                next = pkt[off];
                (usize::from(pkt[off + 1]) + 2) * 4
            }
            44 => return Err(DROP_FRAGMENT),
            _ => return Ok((next, off, seen)),
        };
        seen = true;
        off += len;
    }
    match next {
        0 | 60 | 43 | 51 => Err(DROP_EXT_HEADER_LIMIT),
        44 => Err(DROP_FRAGMENT),
        _ => Ok((next, off, seen)),
    }
}

fn parse6(pkt: &[u8]) -> Result<Parsed, u32> {
    let (first, src, dst) = header6(pkt, ETH_HLEN)?;
    let (proto, off, seen) = walk6(pkt, first, ETH_HLEN + 40)?;
    let tuple = Tuple {
        src,
        dst,
        proto,
        ..Tuple::default()
    };
    let mut p = empty(tuple, seen.then_some(NOTE_IPV6_EXT_HEADERS));
    if proto == ICMPV6 {
        let (ty, id) = icmp_header(pkt, off).ok_or(DROP_MALFORMED)?;
        p.policy_port = u16::from(ty);
        match ty {
            128 | 129 => (p.tuple.sport, p.tuple.dport) = echo_ports(ty == 128, id),
            1..=4 => {
                p.inner = inner6(pkt, off + 8)?;
                p.class = Class::Related;
            }
            130..=132 | 133..=137 | 143 => p.class = Class::Neighbour,
            _ => p.class = Class::Stateless,
        }
        return Ok(p);
    }
    let (sport, dport, flags) = transport(pkt, off, proto)?;
    (p.tuple.sport, p.tuple.dport, p.policy_port, p.tcp_flags) = (sport, dport, dport, flags);
    Ok(p)
}

fn inner6(pkt: &[u8], off: usize) -> Result<Tuple, u32> {
    let (proto, src, dst) = header6(pkt, off)?;
    let l4 = off + 40;
    let (sport, dport) = if has_ports(proto) {
        if !has(pkt, l4, 4) {
            return Err(DROP_MALFORMED);
        }
        (be16(pkt, l4), be16(pkt, l4 + 2))
    } else if proto == ICMPV6 {
        let (ty, id) = icmp_header(pkt, l4).ok_or(DROP_MALFORMED)?;
        echo_ports(ty == 128, id)
    } else {
        (0, 0)
    };
    Ok(Tuple {
        src,
        dst,
        sport,
        dport,
        proto,
    })
}

/// A conntrack key of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtKey {
    /// `ct4`.
    V4(Ct4Key),
    /// `ct6`.
    V6(Ct6Key),
}

/// What a run changed in the maps the programs write (checked one by one after the run).
#[derive(Clone, Debug, Default)]
pub struct Writes {
    /// Conntrack entries created or updated.
    pub ct: Vec<CtKey>,
    /// `svc_ct4` entries written.
    pub svc_ct: Vec<SvcCt4Key>,
    /// `svc_affin4` entries written.
    pub affinity: Vec<Affinity4Key>,
}

/// The model of one program run over `maps` at time `now` (the state's clock).
pub struct Model<'a> {
    /// The maps (changed in place as the programs change theirs).
    pub maps: &'a mut Maps,
    /// The conntrack clock's "now" for this state.
    pub now: u64,
    /// What the run wrote.
    pub writes: Writes,
    v6: bool,
    direction: u32,
    rule: u32,
    trail: Trail,
}

const HAIRPIN_TO_SELF: u32 = 1 << 16;
const HAIRPIN_REPLY: u32 = 1 << 17;

/// Runs `frame` through `prog` on `ifindex` (the model of `entry.rs` and `endpoint.rs`).
pub fn run(maps: &mut Maps, now: u64, prog: Prog, ifindex: u32, frame: &[u8]) -> (Run, Writes) {
    let mut m = Model {
        maps,
        now,
        writes: Writes::default(),
        v6: false,
        direction: prog.direction(),
        rule: 0,
        trail: Trail::default(),
    };
    let mut pkt = frame.to_vec();
    let mut note = None;
    let answer = match m.maps.endpoints.get(&ifindex).copied() {
        None => DROP_UNKNOWN_ENDPOINT,
        Some(ep) => m.dispatch(&ep, &mut pkt, &mut note),
    };
    let reason = answer & !(HAIRPIN_TO_SELF | HAIRPIN_REPLY);
    let hairpin = if answer & HAIRPIN_TO_SELF != 0 {
        Some(true)
    } else if answer & HAIRPIN_REPLY != 0 {
        Some(false)
    } else {
        None
    };
    let mut action = if is_pass(reason) {
        TC_ACT_OK
    } else {
        TC_ACT_SHOT
    };
    if let Some(to_self) = hairpin
        && is_pass(reason)
    {
        m.trail.hairpin = true;
        action = if send_back(&mut pkt, to_self) {
            TC_ACT_REDIRECT
        } else {
            TC_ACT_SHOT
        };
    } else if reason == DROP_SERVICE_NO_BACKEND
        && prog == Prog::From
        && unreachable_answer(&mut pkt)
    {
        m.trail.unreachable = true;
        action = TC_ACT_REDIRECT;
    }
    let run = Run {
        action,
        reason,
        note,
        rule: m.rule,
        out: pkt,
        trail: m.trail,
    };
    (run, m.writes)
}

impl Model<'_> {
    fn dispatch(&mut self, ep: &EndpointInfo, pkt: &mut [u8], note: &mut Option<u32>) -> u32 {
        match ethertype(pkt) {
            None => DROP_MALFORMED,
            Some(ETH_P_ARP) => PASS_NEIGHBOUR,
            Some(ETH_P_IP) => match parse4(pkt) {
                Err(r) => r,
                Ok(p) => {
                    *note = p.note;
                    self.decide_v4(ep, pkt, p)
                }
            },
            Some(ETH_P_IPV6) => match parse6(pkt) {
                Err(r) => r,
                Ok(mut p) => {
                    *note = p.note;
                    self.v6 = true;
                    self.decide(ep, &mut p)
                }
            },
            Some(_) => DROP_UNSUPPORTED_ETHERTYPE,
        }
    }

    fn owns(&self, ep: &EndpointInfo, addr: &Addr) -> bool {
        if self.v6 {
            *addr != [0; 16] && (ep.ipv6[0] == *addr || ep.ipv6[1] == *addr)
        } else {
            let a = v4(addr);
            a != [0; 4] && (ep.ipv4[0] == a || ep.ipv4[1] == a)
        }
    }

    fn identity(&self, addr: &Addr) -> u32 {
        if self.v6 {
            if let Some(id) = self.maps.ident6.get(addr) {
                return *id;
            }
            lpm(&self.maps.ipcache6, addr)
        } else {
            let a = v4(addr);
            if let Some(id) = self.maps.ident4.get(&a) {
                return *id;
            }
            lpm(&self.maps.ipcache4, &a)
        }
    }

    fn peer_identity(&self, ep: &EndpointInfo, addr: &Addr) -> u32 {
        if !self.v6 && v4(addr) == HAIRPIN4 {
            return ep.identity;
        }
        self.identity(addr)
    }

    /// `ct_key`: the normalised key and whether the source is its `b` end.
    fn ct_key(&self, t: &Tuple) -> (CtKey, bool) {
        if self.v6 {
            let w = |a: &Addr| {
                (
                    u64::from_le_bytes(a[..8].try_into().expect("8")),
                    u64::from_le_bytes(a[8..].try_into().expect("8")),
                )
            };
            let (s, d) = (w(&t.src), w(&t.dst));
            let src_is_b = (s.0, s.1, t.sport) > (d.0, d.1, t.dport);
            let (a, pa, b, pb) = if src_is_b {
                (t.dst, t.dport, t.src, t.sport)
            } else {
                (t.src, t.sport, t.dst, t.dport)
            };
            let key = Ct6Key {
                addr_a: a,
                addr_b: b,
                port_a: pa,
                port_b: pb,
                protocol: t.proto,
                _pad: [0; 3],
            };
            (CtKey::V6(key), src_is_b)
        } else {
            let rank =
                |a: &Addr, p: u16| (u64::from(u32::from_be_bytes(v4(a))) << 16) | u64::from(p);
            let src_is_b = rank(&t.src, t.sport) > rank(&t.dst, t.dport);
            let key = Ct4Key::of(t.proto, (v4(&t.src), t.sport), (v4(&t.dst), t.dport));
            (CtKey::V4(key), src_is_b)
        }
    }

    fn ct_get(&self, key: &CtKey) -> Option<CtEntry> {
        match key {
            CtKey::V4(k) => self.maps.ct4.get(k).copied(),
            CtKey::V6(k) => self.maps.ct6.get(k).copied(),
        }
    }

    fn ct_put(&mut self, key: CtKey, e: CtEntry) {
        match key {
            CtKey::V4(k) => self.maps.ct4.insert(k, e),
            CtKey::V6(k) => self.maps.ct6.insert(k, e),
        };
        if !self.writes.ct.contains(&key) {
            self.writes.ct.push(key);
        }
    }

    fn evaluate(&mut self, ep: &EndpointInfo, peer: &Addr, proto: u8, port: u16) -> u32 {
        let (flag, dir) = if self.direction == DIR_FROM_ENDPOINT {
            (FLAG_ISOLATED_EGRESS, EGRESS)
        } else {
            (FLAG_ISOLATED_INGRESS, INGRESS)
        };
        if ep.flags & flag == 0 {
            return PASS;
        }
        let peer = self.peer_identity(ep, peer);
        if dir == INGRESS && peer == HOST {
            return PASS_POLICY;
        }
        let policy = &self.maps.policy;
        match maps_schema::policy::decide(ep.endpoint_id, dir, peer, proto, port, |k| policy.get(k))
        {
            Some(v) => {
                self.rule = v.rule_id;
                if v.verdict == VERDICT_ALLOW {
                    PASS_POLICY
                } else {
                    DROP_POLICY_DENIED
                }
            }
            None => DROP_POLICY_DENIED,
        }
    }

    fn side_bit(&self, original: bool) -> u32 {
        if (self.direction == DIR_FROM_ENDPOINT) == original {
            FLAG_SRC_EGRESS_APPROVED
        } else {
            FLAG_DST_INGRESS_APPROVED
        }
    }

    /// `flow::decide`.
    fn decide(&mut self, ep: &EndpointInfo, p: &mut Parsed) -> u32 {
        let t = p.tuple;
        if p.class == Class::Neighbour {
            return PASS_NEIGHBOUR;
        }
        let from = self.direction == DIR_FROM_ENDPOINT;
        if from && !self.owns(ep, &t.src) {
            return DROP_SPOOFED_SOURCE;
        }
        let peer = if from { t.dst } else { t.src };
        match p.class {
            Class::Flow => self.stateful(ep, &peer, p),
            Class::Related => {
                let (key, src_is_b) = self.ct_key(&p.inner.reversed());
                if let Some(e) = self.ct_get(&key) {
                    let original = (e.flags & FLAG_OPENER_IS_B != 0) == src_is_b;
                    if e.flags & self.side_bit(original) != 0 {
                        return PASS_RELATED;
                    }
                }
                self.evaluate(ep, &peer, t.proto, p.policy_port)
            }
            Class::Stateless | Class::Neighbour => self.evaluate(ep, &peer, t.proto, p.policy_port),
        }
    }

    fn stateful(&mut self, ep: &EndpointInfo, peer: &Addr, p: &mut Parsed) -> u32 {
        let (key, src_is_b) = self.ct_key(&p.tuple);
        let tcp = p.tuple.proto == TCP;
        let (proto, port) = (p.tuple.proto, p.policy_port);
        let Some(old) = self.ct_get(&key) else {
            let reason = self.evaluate(ep, peer, proto, port);
            if !is_pass(reason) {
                return reason;
            }
            let mut flags = self.side_bit(true);
            if src_is_b {
                flags |= FLAG_OPENER_IS_B;
            }
            if tcp {
                flags |= tcp_state(p.tcp_flags, true);
            }
            let e = CtEntry {
                rev_nat: p.rev_nat,
                ..CtEntry::new(self.now, flags)
            };
            self.ct_put(key, e);
            self.trail.ct_created = true;
            return reason;
        };
        self.trail.ct_hit = true;
        let original = (old.flags & FLAG_OPENER_IS_B != 0) == src_is_b;
        let from = self.direction == DIR_FROM_ENDPOINT;
        if !from && !original {
            p.rev_nat = old.rev_nat;
        }
        let side = self.side_bit(original);
        let (reason, approve) = if old.flags & side != 0 {
            (PASS_ESTABLISHED, 0)
        } else {
            let reason = self.evaluate(ep, peer, proto, port);
            if !is_pass(reason) {
                return reason;
            }
            (reason, if original { side } else { 0 })
        };
        let mut e = old;
        let mut written = false;
        if from && original {
            e.rev_nat = p.rev_nat;
            written = e.rev_nat != old.rev_nat;
        }
        let mut flags = old.flags | approve;
        if !original {
            flags |= FLAG_SEEN_REPLY;
        }
        if tcp {
            if p.tcp_flags & TCP_SYN != 0 && p.tcp_flags & TCP_ACK == 0 && original {
                flags &= !(FLAG_TCP_SYN_ACK | FLAG_TCP_FIN_SRC | FLAG_TCP_FIN_DST | FLAG_TCP_RST);
            }
            flags |= tcp_state(p.tcp_flags, original);
        }
        if flags != old.flags || self.now > old.last_seen_ns {
            e.flags = flags;
            e.last_seen_ns = self.now.max(old.last_seen_ns);
            written = true;
        }
        if written {
            self.ct_put(key, e);
        }
        reason
    }

    /// `service::decide_v4`.
    fn decide_v4(&mut self, ep: &EndpointInfo, pkt: &mut [u8], mut p: Parsed) -> u32 {
        let proto = p.tuple.proto;
        let served = p.class == Class::Flow && (proto == TCP || proto == UDP);
        let from = self.direction == DIR_FROM_ENDPOINT;
        if !served {
            let reason = self.decide(ep, &mut p);
            if p.class == Class::Related && !from && is_pass(reason) {
                return self.translate_back(pkt, &p, reason);
            }
            return reason;
        }
        if !from {
            let reason = self.decide(ep, &mut p);
            if !is_pass(reason) {
                return reason;
            }
            return self.reply(pkt, &p.tuple, p.rev_nat, reason);
        }
        if !self.owns(ep, &p.tuple.src) {
            return self.decide(ep, &mut p);
        }
        if v4(&p.tuple.dst) == HAIRPIN4 {
            let reason = self.decide(ep, &mut p);
            return if is_pass(reason) {
                reason | HAIRPIN_REPLY
            } else {
                reason
            };
        }
        let node_port =
            pod_nodeport(p.tuple.dport) && self.maps.ident4.get(&v4(&p.tuple.dst)) == Some(&HOST);
        let fe = if node_port {
            NODEPORT_ANY
        } else {
            v4(&p.tuple.dst)
        };
        self.trail.node_port = node_port;
        let tr = match self.frontend(&p.tuple, fe, p.tcp_flags) {
            Ok(None) => return self.decide(ep, &mut p),
            Ok(Some(tr)) => tr,
            Err(reason) => return reason,
        };
        let (vip, vport) = (v4(&p.tuple.dst), p.tuple.dport);
        p.tuple.dst = from4(tr.addr);
        p.tuple.dport = tr.port;
        p.policy_port = tr.port;
        p.rev_nat = tr.service_id;
        let reason = self.decide(ep, &mut p);
        if !is_pass(reason) {
            return reason;
        }
        let t = p.tuple;
        if tr.new != 0 {
            // `record_flow`: the original entry, then the client's affinity.
            let client = self.client_entry(&t, &tr);
            let original = SvcCt4Entry {
                addr: v4(&t.dst),
                port: t.dport,
                ..client
            };
            let key = svc_key(
                &Tuple {
                    dst: from4(vip),
                    dport: vport,
                    ..t
                },
                DIR_ORIGINAL,
            );
            self.svc_put(key, original);
            if tr.affinity {
                let key = Affinity4Key {
                    service_id: tr.service_id,
                    client: v4(&t.src),
                };
                let value = Affinity4 {
                    backend_id: tr.backend_id,
                    slot: tr.slot,
                    _pad: 0,
                    last_used_ns: self.now,
                };
                self.maps.affinity4.insert(key, value);
                if !self.writes.affinity.contains(&key) {
                    self.writes.affinity.push(key);
                }
            }
            if node_port {
                let entry = SvcCt4Entry {
                    addr: vip,
                    port: vport,
                    ..client
                };
                self.svc_put(svc_key(&t.reversed(), DIR_REPLY), entry);
            }
        }
        let Some(f) = masq_parse(pkt, 8) else {
            return DROP_MALFORMED;
        };
        match rewrite(pkt, &f, false, (vip, tr.addr), (vport, tr.port)) {
            Ok(unknown) => self.trail.csum_unknown |= unknown,
            Err(()) => return DROP_MALFORMED,
        }
        self.trail.translated = true;
        if tr.addr == v4(&t.src) {
            return reason | HAIRPIN_TO_SELF;
        }
        reason
    }

    fn client_entry(&self, t: &Tuple, tr: &Translation) -> SvcCt4Entry {
        SvcCt4Entry {
            addr: v4(&t.src),
            port: t.sport,
            _pad: 0,
            service_id: tr.service_id,
            backend_id: tr.backend_id,
            last_seen_ns: self.now,
        }
    }

    fn svc_put(&mut self, key: SvcCt4Key, e: SvcCt4Entry) {
        self.maps.svc_ct4.insert(key, e);
        if !self.writes.svc_ct.contains(&key) {
            self.writes.svc_ct.push(key);
        }
    }

    /// `service::frontend`: `Ok(None)` for no frontend.
    fn frontend(
        &mut self,
        t: &Tuple,
        fe: [u8; 4],
        tcp_flags: u8,
    ) -> Result<Option<Translation>, u32> {
        let mut fk = Svc4Key {
            addr: fe,
            port: t.dport,
            protocol: t.proto,
            scope: SCOPE_ALL,
        };
        let mut found = self.maps.svc4.get(&fk).copied();
        if found.is_none() && fe == NODEPORT_ANY {
            fk.addr = v4(&t.dst);
            found = self.maps.svc4.get(&fk).copied();
        }
        let Some(mut svc) = found else {
            return Ok(None);
        };
        if svc.flags & SVC_FLAG_EXTERNAL_LOCAL != 0 {
            fk.scope = SCOPE_PODS;
            if let Some(all) = self.maps.svc4.get(&fk) {
                svc = *all;
            }
        }
        let (service_id, count, flags, timeout) = (
            svc.service_id,
            svc.backend_count,
            svc.flags,
            svc.affinity_timeout_secs,
        );
        let syn = t.proto == TCP && tcp_flags & TCP_SYN != 0 && tcp_flags & TCP_ACK == 0;
        if let Some(e) = self.maps.svc_ct4.get(&svc_key(t, DIR_ORIGINAL)) {
            let gone = (syn || t.proto == UDP)
                && self.maps.backends4.get(&e.backend_id).is_none_or(|b| {
                    b.addr != e.addr
                        || b.port != e.port
                        || (syn && b.flags & BACKEND_FLAG_TERMINATING != 0)
                });
            if !gone {
                self.trail.kept_backend = true;
                return Ok(Some(Translation {
                    addr: e.addr,
                    service_id,
                    backend_id: e.backend_id,
                    port: e.port,
                    new: 0,
                    affinity: false,
                    slot: 0,
                }));
            }
        }
        let affinity = flags & SVC_FLAG_AFFINITY != 0;
        let remembered = if affinity {
            self.remembered(service_id, v4(&t.src), count, timeout)
        } else {
            None
        };
        let (backend_id, slot) = match remembered {
            Some(chosen) => {
                self.trail.affinity = true;
                chosen
            }
            None => {
                let hash = flow_hash(v4(&t.src), t.sport, v4(&t.dst), t.dport, t.proto, affinity);
                let slot = backend_slot(hash, count).ok_or(DROP_SERVICE_NO_BACKEND)?;
                let id = *self
                    .maps
                    .slots
                    .get(&slot_key(service_id, slot))
                    .ok_or(DROP_SERVICE_NO_BACKEND)?;
                (id, slot)
            }
        };
        let mut b = *self
            .maps
            .backends4
            .get(&backend_id)
            .ok_or(DROP_SERVICE_NO_BACKEND)?;
        let (mut backend_id, mut slot) = (backend_id, slot);
        if remembered.is_none() && count > 1 && self.taken(t, b.addr, b.port, service_id) {
            let next = if slot + 1 >= count { 0 } else { slot + 1 };
            if let Some(id) = self.maps.slots.get(&slot_key(service_id, next))
                && let Some(other) = self.maps.backends4.get(id)
            {
                (backend_id, slot, b) = (*id, next, *other);
                self.trail.taken = true;
            }
        }
        Ok(Some(Translation {
            addr: b.addr,
            service_id,
            backend_id,
            port: b.port,
            new: 1,
            affinity,
            slot,
        }))
    }

    fn taken(&self, t: &Tuple, addr: [u8; 4], port: u16, service_id: u32) -> bool {
        let translated = Tuple {
            dst: from4(addr),
            dport: port,
            ..*t
        };
        let (key, _) = self.ct_key(&translated);
        self.ct_get(&key)
            .is_some_and(|e| tuple_taken(e.rev_nat, e.flags, t.proto, service_id))
    }

    fn remembered(
        &self,
        service_id: u32,
        client: [u8; 4],
        count: u16,
        timeout: u32,
    ) -> Option<(u32, u16)> {
        let a = self
            .maps
            .affinity4
            .get(&Affinity4Key { service_id, client })?;
        if !affinity_holds(a.last_used_ns, self.now, timeout) {
            return None;
        }
        if self.holds_slot(service_id, a.backend_id, a.slot, count) {
            return Some((a.backend_id, a.slot));
        }
        let moved = *self.maps.members.get(&MemberKey {
            service_id,
            backend_id: a.backend_id,
        })?;
        self.holds_slot(service_id, a.backend_id, moved, count)
            .then_some((a.backend_id, moved))
    }

    fn holds_slot(&self, service_id: u32, backend_id: u32, slot: u16, count: u16) -> bool {
        slot < count && self.maps.slots.get(&slot_key(service_id, slot)) == Some(&backend_id)
    }

    fn reply_frontend(&self, reply: &Tuple, service_id: u32) -> Option<([u8; 4], u16)> {
        let rev = self.maps.revnat4.get(&service_id)?;
        if rev.addr != NODEPORT_ANY {
            return Some((rev.addr, rev.port));
        }
        let e = self.maps.svc_ct4.get(&svc_key(reply, DIR_REPLY))?;
        Some((e.addr, e.port))
    }

    /// `service::reply`.
    fn reply(&mut self, pkt: &mut [u8], t: &Tuple, rev_nat: u32, reason: u32) -> u32 {
        if rev_nat == 0 {
            return reason;
        }
        let Some((addr, port)) = self.reply_frontend(t, rev_nat) else {
            return reason;
        };
        let Some(f) = masq_parse(pkt, 8) else {
            return DROP_MALFORMED;
        };
        match rewrite(pkt, &f, true, (v4(&t.src), addr), (t.sport, port)) {
            Ok(unknown) => {
                self.trail.csum_unknown |= unknown;
                self.trail.reply_translated = true;
                reason
            }
            Err(()) => DROP_MALFORMED,
        }
    }

    /// `service_related::translate_back`.
    fn translate_back(&mut self, pkt: &mut [u8], p: &Parsed, reason: u32) -> u32 {
        let inner = p.inner;
        if inner.proto != TCP && inner.proto != UDP {
            return reason;
        }
        let (key, src_is_b) = self.ct_key(&inner);
        let service_id = match self.ct_get(&key) {
            Some(e) if (e.flags & FLAG_OPENER_IS_B != 0) == src_is_b => e.rev_nat,
            _ => 0,
        };
        if service_id == 0 {
            return reason;
        }
        let Some((vip, vport)) = self.reply_frontend(&inner.reversed(), service_id) else {
            return reason;
        };
        match related_rewrite(pkt, vip, vport) {
            Ok(()) => {
                self.trail.related_translated = true;
                reason
            }
            Err(()) => DROP_MALFORMED,
        }
    }
}

struct Translation {
    addr: [u8; 4],
    service_id: u32,
    backend_id: u32,
    port: u16,
    new: u32,
    affinity: bool,
    slot: u16,
}

fn slot_key(service_id: u32, slot: u16) -> SlotKey {
    SlotKey {
        service_id,
        slot,
        pad: 0,
    }
}

fn svc_key(t: &Tuple, direction: u8) -> SvcCt4Key {
    SvcCt4Key {
        saddr: v4(&t.src),
        daddr: v4(&t.dst),
        sport: t.sport,
        dport: t.dport,
        protocol: t.proto,
        direction,
        _pad: [0; 2],
    }
}

fn lpm<const N: usize>(trie: &[([u8; N], u32, u32)], addr: &[u8; N]) -> u32 {
    let mut best: Option<(u32, u32)> = None;
    for (prefix, len, identity) in trie {
        let bits = *len as usize;
        let matches = (0..bits).all(|i| {
            let mask = 0x80 >> (i % 8);
            prefix[i / 8] & mask == addr[i / 8] & mask
        });
        if matches && best.is_none_or(|(l, _)| *len > l) {
            best = Some((*len, *identity));
        }
    }
    best.map_or(WORLD, |(_, id)| id)
}

fn tcp_state(tcp_flags: u8, original: bool) -> u32 {
    let mut state = 0;
    if tcp_flags & TCP_SYN != 0 {
        state |= if original && tcp_flags & TCP_ACK == 0 {
            FLAG_TCP_SYN
        } else if !original && tcp_flags & TCP_ACK != 0 {
            FLAG_TCP_SYN_ACK
        } else {
            0
        };
    }
    if tcp_flags & TCP_FIN != 0 {
        state |= if original {
            FLAG_TCP_FIN_SRC
        } else {
            FLAG_TCP_FIN_DST
        };
    }
    if tcp_flags & TCP_RST != 0 {
        state |= FLAG_TCP_RST;
    }
    state
}

/// `masq::Flow`.
struct Flow {
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    proto: u8,
    l4: usize,
}

fn masq_parse(pkt: &[u8], echo_type: u8) -> Option<Flow> {
    if ethertype(pkt)? != ETH_P_IP || !has(pkt, ETH_HLEN, 20) {
        return None;
    }
    let vi = pkt[ETH_HLEN];
    let ihl = usize::from(vi & 0x0f);
    if vi >> 4 != 4 || ihl < 5 || be16(pkt, ETH_HLEN + 6) & 0x3fff != 0 {
        return None;
    }
    let proto = pkt[ETH_HLEN + 9];
    let l4 = ETH_HLEN + ihl * 4;
    let (sport, dport) = match proto {
        TCP if has(pkt, l4, 20) => (be16(pkt, l4), be16(pkt, l4 + 2)),
        UDP if has(pkt, l4, 8) => (be16(pkt, l4), be16(pkt, l4 + 2)),
        ICMP => {
            let (ty, id) = icmp_header(pkt, l4)?;
            if ty != echo_type {
                return None;
            }
            echo_ports(ty == 8, id)
        }
        _ => return None,
    };
    Some(Flow {
        src: pkt[ETH_HLEN + 12..ETH_HLEN + 16].try_into().expect("4"),
        dst: pkt[ETH_HLEN + 16..ETH_HLEN + 20].try_into().expect("4"),
        sport,
        dport,
        proto,
        l4,
    })
}

/// A value as the programs load it: the packet's bytes in a native word.
fn ld16(pkt: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([pkt[off], pkt[off + 1]])
}

fn ld32(pkt: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(pkt[off..off + 4].try_into().expect("4"))
}

fn st16(pkt: &mut [u8], off: usize, v: u16) {
    pkt[off..off + 2].copy_from_slice(&v.to_ne_bytes());
}

fn st32(pkt: &mut [u8], off: usize, v: u32) {
    pkt[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn csum_add(a: u32, b: u32) -> u32 {
    let (s, c) = a.overflowing_add(b);
    s + u32::from(c)
}

fn csum_fold(s: u32) -> u16 {
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// The kernel's `csum_replace4` (a checksum not in `CHECKSUM_PARTIAL` state).
fn csum_replace4(check: u16, from: u32, to: u32) -> u16 {
    csum_fold(csum_add(csum_add(!u32::from(check), !from), to))
}

/// The kernel's `csum_replace2` (what `bpf_l3_csum_replace` does for a 2-byte field).
fn csum_replace2(check: u16, old: u16, new: u16) -> u16 {
    fn add16(a: u16, b: u16) -> u16 {
        let (r, c) = a.overflowing_add(b);
        r + u16::from(c)
    }
    !add16(add16(!check, !old), new)
}

const BPF_F_PSEUDO_HDR: u64 = 1 << 4;
const BPF_F_MARK_MANGLED_0: u64 = 1 << 5;

/// `bpf_l4_csum_replace` on an skb without `CHECKSUM_PARTIAL`.
fn l4_csum_replace(pkt: &mut [u8], off: usize, from: u32, to: u32, flags: u64) -> Result<(), ()> {
    if off & 1 != 0 || !has(pkt, off, 2) {
        return Err(());
    }
    let mmzero = flags & BPF_F_MARK_MANGLED_0 != 0;
    let check = ld16(pkt, off);
    if mmzero && check == 0 {
        return Ok(());
    }
    // Size 2 and 4 both go through `inet_proto_csum_replace4`.
    let mut new = csum_replace4(check, from, to);
    if mmzero && new == 0 {
        new = 0xffff;
    }
    st16(pkt, off, new);
    Ok(())
}

/// `bpf_l3_csum_replace`.
fn l3_csum_replace(pkt: &mut [u8], off: usize, from: u32, to: u32, size: u64) -> Result<(), ()> {
    if off & 1 != 0 || !has(pkt, off, 2) {
        return Err(());
    }
    let check = ld16(pkt, off);
    let new = if size == 2 {
        csum_replace2(check, from as u16, to as u16)
    } else {
        csum_replace4(check, from, to)
    };
    st16(pkt, off, new);
    Ok(())
}

/// `masq::rewrite`: one address and one port with the checksums that cover them.
fn rewrite(
    pkt: &mut [u8],
    f: &Flow,
    egress: bool,
    (old_addr, new_addr): ([u8; 4], [u8; 4]),
    (old_port, new_port): (u16, u16),
) -> Result<bool, ()> {
    let (port_off, csum_off, addr_flags, port_flags) = match f.proto {
        TCP => (
            f.l4 + if egress { 0 } else { 2 },
            f.l4 + 16,
            BPF_F_PSEUDO_HDR,
            0,
        ),
        UDP => (
            f.l4 + if egress { 0 } else { 2 },
            f.l4 + 6,
            BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0,
            BPF_F_MARK_MANGLED_0,
        ),
        _ => (f.l4 + 4, f.l4 + 2, 0, 0),
    };
    if !has(pkt, ETH_HLEN, 20) || !has(pkt, port_off, 2) {
        return Err(());
    }
    let (old_addr, new_addr) = (u32::from_ne_bytes(old_addr), u32::from_ne_bytes(new_addr));
    let change = checksum::change4(old_addr, new_addr);
    let check = ld16(pkt, ETH_HLEN + 10);
    st16(pkt, ETH_HLEN + 10, checksum::apply(check, change));
    st32(pkt, ETH_HLEN + if egress { 12 } else { 16 }, new_addr);
    if old_port != new_port {
        pkt[port_off..port_off + 2].copy_from_slice(&new_port.to_be_bytes());
    }
    let (old_port, new_port) = (
        u16::from_ne_bytes(old_port.to_be_bytes()),
        u16::from_ne_bytes(new_port.to_be_bytes()),
    );
    let by_helper = |pkt: &mut [u8]| {
        l4_csum_replace(
            pkt,
            csum_off,
            u32::from(old_port),
            u32::from(new_port),
            port_flags | 2,
        )
    };
    if f.proto == ICMP {
        if old_port != new_port {
            by_helper(pkt)?;
        }
        return Ok(false);
    }
    if !has(pkt, csum_off, 2) {
        return Err(());
    }
    let before = ld16(pkt, csum_off);
    l4_csum_replace(pkt, csum_off, old_addr, new_addr, addr_flags | 4)?;
    if old_port == new_port || (f.proto == UDP && before == 0) {
        return Ok(false);
    }
    let after = ld16(pkt, csum_off);
    match checksum::state(before, after, change) {
        checksum::State::Partial => Ok(false),
        checksum::State::Full => {
            let mut check = checksum::replace2(after, old_port, new_port);
            if f.proto == UDP && check == 0 {
                check = 0xffff;
            }
            st16(pkt, csum_off, check);
            Ok(false)
        }
        checksum::State::Unknown => by_helper(pkt).map(|()| true),
    }
}

/// `service::send_back`: the hairpin rewrite and the Ethernet addresses swapped.
fn send_back(pkt: &mut [u8], to_self: bool) -> bool {
    let Some(f) = masq_parse(pkt, 8) else {
        return false;
    };
    let rewritten = if to_self {
        rewrite(pkt, &f, true, (f.src, HAIRPIN4), (f.sport, f.sport))
    } else {
        rewrite(pkt, &f, false, (f.dst, f.src), (f.dport, f.dport))
    };
    if rewritten.is_err() || !has(pkt, 0, 12) {
        return false;
    }
    let (dst, src) = (pkt[0..6].to_vec(), pkt[6..12].to_vec());
    pkt[0..6].copy_from_slice(&src);
    pkt[6..12].copy_from_slice(&dst);
    true
}

/// `service_related::rewrite`: the quoted destination and port back to the frontend.
fn related_rewrite(pkt: &mut [u8], vip: [u8; 4], vport: u16) -> Result<(), ()> {
    let load = |pkt: &[u8], off: usize, n: usize| has(pkt, off, n).then_some(()).ok_or(());
    load(pkt, ETH_HLEN, 1)?;
    let icmp = ETH_HLEN + usize::from(pkt[ETH_HLEN] & 0x0f) * 4;
    let inner = icmp + 8;
    load(pkt, inner, 1)?;
    let inner_l4 = inner + usize::from(pkt[inner] & 0x0f) * 4;
    load(pkt, inner + 16, 4)?;
    let old_dst = ld32(pkt, inner + 16);
    load(pkt, inner + 10, 2)?;
    let old_check = ld16(pkt, inner + 10);
    load(pkt, inner_l4 + 2, 2)?;
    let old_port = ld16(pkt, inner_l4 + 2);
    let new_port = u16::from_ne_bytes(vport.to_be_bytes());
    let vip = u32::from_ne_bytes(vip);
    st32(pkt, inner + 16, vip);
    l3_csum_replace(pkt, inner + 10, old_dst, vip, 4)?;
    let new_check = ld16(pkt, inner + 10);
    st16(pkt, inner_l4 + 2, new_port);
    let c = icmp + 2;
    l4_csum_replace(pkt, c, old_dst, vip, 4)?;
    l4_csum_replace(pkt, c, u32::from(old_check), u32::from(new_check), 2)?;
    l4_csum_replace(pkt, c, u32::from(old_port), u32::from(new_port), 2)?;
    let outer_src = ld32(pkt, ETH_HLEN + 12);
    if outer_src == old_dst {
        st32(pkt, ETH_HLEN + 12, vip);
        l3_csum_replace(pkt, ETH_HLEN + 10, outer_src, vip, 4)?;
    }
    Ok(())
}

/// `unreachable::rewrite`: the packet becomes a port unreachable from its destination.
fn unreachable_answer(pkt: &mut Vec<u8>) -> bool {
    const QUOTE: usize = 28;
    const LEN: usize = ETH_HLEN + 20 + 8 + QUOTE;
    if pkt.len() < ETH_HLEN + QUOTE || pkt[ETH_HLEN] != 0x45 {
        return false;
    }
    pkt.resize(LEN, 0);
    let quote: Vec<u8> = pkt[ETH_HLEN..ETH_HLEN + QUOTE].to_vec();
    pkt[42..LEN].copy_from_slice(&quote);
    let (dst, src) = (pkt[0..6].to_vec(), pkt[6..12].to_vec());
    pkt[0..6].copy_from_slice(&src);
    pkt[6..12].copy_from_slice(&dst);
    let ip = ETH_HLEN;
    let head = [0x45, 0xc0, 0, 56, 0, 0, 0, 0, 64, ICMP, 0, 0];
    pkt[ip..ip + 12].copy_from_slice(&head);
    pkt[ip + 12..ip + 16].copy_from_slice(&quote[16..20]);
    pkt[ip + 16..ip + 20].copy_from_slice(&quote[12..16]);
    let sum = !fold_be(&pkt[ip..ip + 20]);
    pkt[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
    let icmp = ip + 20;
    pkt[icmp..icmp + 8].copy_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
    let sum = !fold_be(&pkt[icmp..LEN]);
    pkt[icmp + 2..icmp + 4].copy_from_slice(&sum.to_be_bytes());
    true
}

fn fold_be(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_replace2_and_replace4_agree_up_to_the_zero_representation() {
        let mut x: u32 = 0x1234_5678;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let (check, old, new) = (x as u16, (x >> 8) as u16, (x >> 16) as u16);
            let a = csum_replace2(check, old, new);
            let b = csum_replace4(check, u32::from(old), u32::from(new));
            assert!(
                checksum::same(a, b),
                "{check:#x} {old:#x} {new:#x}: {a:#x} {b:#x}"
            );
        }
    }

    #[test]
    fn an_unknown_endpoint_drops_and_arp_passes() {
        let mut maps = Maps::default();
        let frame = [0u8; 60];
        let (run_, _) = run(&mut maps, 1, Prog::From, 5, &frame);
        assert_eq!(
            (run_.action, run_.reason),
            (TC_ACT_SHOT, DROP_UNKNOWN_ENDPOINT)
        );
        maps.endpoints.insert(5, EndpointInfo::default());
        let mut arp = frame;
        arp[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
        let (run_, _) = run(&mut maps, 1, Prog::To, 5, &arp);
        assert_eq!((run_.action, run_.reason), (TC_ACT_OK, PASS_NEIGHBOUR));
    }
}
