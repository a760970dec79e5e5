//! Conntrack (`ct4`/`ct6`): one LRU entry per flow, written by the programs.
//!
//! The key is normalised (`(addr_a, port_a) <= (addr_b, port_b)`), so both directions of a flow
//! share one entry; [`FLAG_OPENER_IS_B`] records which end opened it. The entry records the
//! source's egress approval and the destination's ingress approval separately: a program only
//! bypasses policy for a packet when its own side of the flow approved the flow.

use crate::{assert_size, user_pod};

/// The flow was opened by `(addr_b, port_b)` (otherwise by `(addr_a, port_a)`).
pub const FLAG_OPENER_IS_B: u32 = 1;
/// The opener's egress approved the flow (its `from_endpoint`, or it is not a local endpoint).
pub const FLAG_SRC_EGRESS_APPROVED: u32 = 1 << 1;
/// The destination's ingress approved the flow (its `to_endpoint`).
pub const FLAG_DST_INGRESS_APPROVED: u32 = 1 << 2;
/// A packet went in the reply direction.
pub const FLAG_SEEN_REPLY: u32 = 1 << 3;
/// TCP: SYN seen from the opener.
pub const FLAG_TCP_SYN: u32 = 1 << 4;
/// TCP: SYN+ACK seen from the destination (the handshake completed).
pub const FLAG_TCP_SYN_ACK: u32 = 1 << 5;
/// TCP: FIN seen from the opener.
pub const FLAG_TCP_FIN_SRC: u32 = 1 << 6;
/// TCP: FIN seen from the destination.
pub const FLAG_TCP_FIN_DST: u32 = 1 << 7;
/// TCP: RST seen (either side).
pub const FLAG_TCP_RST: u32 = 1 << 8;

/// `ct_events` slot: IPv4 entries the programs created.
pub const EVENT_CREATED4: u32 = 0;
/// `ct_events` slot: IPv6 entries the programs created.
pub const EVENT_CREATED6: u32 = 1;

/// Default timeouts the agent's sweep applies (seconds since `last_seen_ns`); all are agent flags.
pub const TIMEOUT_TCP_SYN_SECS: u64 = 60;
/// TCP after the handshake.
pub const TIMEOUT_TCP_ESTABLISHED_SECS: u64 = 6 * 3600;
/// TCP after both FINs or an RST: closed flows go quickly.
pub const TIMEOUT_TCP_CLOSED_SECS: u64 = 10;
/// UDP and other protocols.
pub const TIMEOUT_OTHER_SECS: u64 = 60;
/// ICMP echo.
pub const TIMEOUT_ICMP_SECS: u64 = 10;

/// The clock of `last_seen_ns`: `bpf_ktime_get_coarse_ns`, i.e. `CLOCK_MONOTONIC_COARSE` in user space.
/// The programs read it at most once per tick and CPU (through [`ClockCache`]), so a stamp lags
/// that clock by at most [`CLOCK_LAG_TICKS`] kernel ticks (8 ms at `HZ=250`) — far below every
/// timeout and the migration's one-second margin.
pub const CLOCK: &str = "CLOCK_MONOTONIC_COARSE";
/// How many kernel ticks a `last_seen_ns` stamp may lag [`CLOCK`]: the coarse clock's own tick,
/// plus one when a CPU reads it between the tick's `jiffies` update and its timekeeping update.
pub const CLOCK_LAG_TICKS: u64 = 2;

/// `ct_clock` value (one slot per CPU, written by the programs only): the coarse clock as this CPU
/// last read it, and the `jiffies` it read it at. A packet costs one inlined `jiffies` load and
/// this slot; the clock helper runs only when `jiffies` moved on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ClockCache {
    /// `jiffies` when [`Self::now_ns`] was read.
    pub jiffies: u64,
    /// [`CLOCK`] nanoseconds then.
    pub now_ns: u64,
}
assert_size!(ClockCache, 16);
user_pod!(ClockCache);

/// IPv4 conntrack key (addresses in network byte order, ports in host byte order; an ICMP echo
/// request is `(identifier, 0)` and its reply `(0, identifier)`, so they share one flow).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Ct4Key {
    /// The lower address.
    pub addr_a: [u8; 4],
    /// The higher address.
    pub addr_b: [u8; 4],
    /// `addr_a`'s port.
    pub port_a: u16,
    /// `addr_b`'s port.
    pub port_b: u16,
    /// IP protocol.
    pub protocol: u8,
    /// Explicit padding; always zero.
    pub _pad: [u8; 3],
}
assert_size!(Ct4Key, 16);
user_pod!(Ct4Key);

impl Ct4Key {
    /// The key of the flow between `(addr, port)` and `(peer, peer_port)`, normalised as the
    /// programs do (the lower address and port, compared as numbers, is `a`), whichever end
    /// opened it.
    #[must_use]
    pub fn of(proto: u8, (addr, port): ([u8; 4], u16), (peer, peer_port): ([u8; 4], u16)) -> Self {
        let rank = |a: [u8; 4], p: u16| (u64::from(u32::from_be_bytes(a)) << 16) | u64::from(p);
        let ((addr_a, port_a), (addr_b, port_b)) = if rank(addr, port) > rank(peer, peer_port) {
            ((peer, peer_port), (addr, port))
        } else {
            ((addr, port), (peer, peer_port))
        };
        Self {
            addr_a,
            addr_b,
            port_a,
            port_b,
            protocol: proto,
            _pad: [0; 3],
        }
    }
}

/// IPv6 conntrack key (as [`Ct4Key`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Ct6Key {
    /// The lower address.
    pub addr_a: [u8; 16],
    /// The higher address.
    pub addr_b: [u8; 16],
    /// `addr_a`'s port.
    pub port_a: u16,
    /// `addr_b`'s port.
    pub port_b: u16,
    /// IP protocol (the upper-layer protocol after extension headers).
    pub protocol: u8,
    /// Explicit padding; always zero.
    pub _pad: [u8; 3],
}
assert_size!(Ct6Key, 40);
user_pod!(Ct6Key);

/// Conntrack value, both families, layout version 3 (the current one): layout 2 plus
/// `rev_nat`. Layouts only ever append fields, so a value of a newer layout starts with the
/// value of every older one (an older release can read the prefix it knows).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CtEntry {
    /// Last packet, `CLOCK_MONOTONIC_COARSE` nanoseconds (refreshed at the clock's tick granularity).
    pub last_seen_ns: u64,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Reserved; always zero.
    pub _reserved: u32,
    /// First packet, same clock (layout 2). An entry converted from layout 1 gets its
    /// `last_seen_ns`, the oldest time known for it.
    pub created_ns: u64,
    /// The service id (`svc_revnat4_v1` key) whose frontend the opener sent this flow to, or 0:
    /// a reply entering the opener gets that frontend as its source (layout 3). `from_endpoint`
    /// sets it on the flow's entry when it translates the flow. An entry converted from layout 2
    /// gets it from the flow's reply entry in `svc_ct4_v1`, where layout 2 kept it.
    pub rev_nat: u32,
    /// Explicit padding; always zero.
    pub _pad: u32,
}
assert_size!(CtEntry, 32);
user_pod!(CtEntry);

/// Conntrack value of layout version 2 (`ct4_v2`, `ct6_v2`): kept so the agent can convert
/// conntrack forward and back, and for the test-only `ct-v2` build of the programs (the previous
/// release), which keeps a translated flow's reverse NAT in `svc_ct4_v1` instead.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CtEntryV2 {
    /// As [`CtEntry::last_seen_ns`].
    pub last_seen_ns: u64,
    /// As [`CtEntry::flags`].
    pub flags: u32,
    /// Reserved; always zero.
    pub _reserved: u32,
    /// As [`CtEntry::created_ns`].
    pub created_ns: u64,
}
assert_size!(CtEntryV2, 24);
user_pod!(CtEntryV2);

/// Conntrack value of layout version 1 (`ct4_v1`, `ct6_v1`): kept so the agent can convert
/// conntrack forward and back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CtEntryV1 {
    /// As [`CtEntry::last_seen_ns`].
    pub last_seen_ns: u64,
    /// As [`CtEntry::flags`].
    pub flags: u32,
    /// Reserved; always zero.
    pub _reserved: u32,
}
assert_size!(CtEntryV1, 16);
user_pod!(CtEntryV1);

/// The conntrack layout version of [`CtEntry`] (the map names end in `_v3`).
pub const LAYOUT: u32 = 3;
/// The oldest conntrack layout this release converts from and back to.
pub const OLDEST_LAYOUT: u32 = 1;

/// Value size in bytes of conntrack layout `version`, if this release knows it.
#[must_use]
pub const fn value_size(version: u32) -> Option<u32> {
    match version {
        1 => Some(core::mem::size_of::<CtEntryV1>() as u32),
        2 => Some(core::mem::size_of::<CtEntryV2>() as u32),
        3 => Some(core::mem::size_of::<CtEntry>() as u32),
        _ => None,
    }
}

/// Whether a TCP entry's `flags` say its connection is over (a reset, or a FIN each way): its
/// tuple may be reused by a new connection.
#[inline(always)]
#[must_use]
pub const fn tcp_closed(flags: u32) -> bool {
    flags & FLAG_TCP_RST != 0 || (flags & FLAG_TCP_FIN_SRC != 0 && flags & FLAG_TCP_FIN_DST != 0)
}

impl CtEntryV1 {
    /// A new entry seen first at `now_ns`.
    #[must_use]
    pub const fn new(now_ns: u64, flags: u32) -> Self {
        Self {
            last_seen_ns: now_ns,
            flags,
            _reserved: 0,
        }
    }

    /// Converted to the current layout.
    #[must_use]
    pub const fn upgrade(self) -> CtEntry {
        CtEntry {
            last_seen_ns: self.last_seen_ns,
            flags: self.flags,
            _reserved: 0,
            created_ns: self.last_seen_ns,
            rev_nat: 0,
            _pad: 0,
        }
    }
}

impl CtEntryV2 {
    /// A new entry seen first at `now_ns`.
    #[must_use]
    pub const fn new(now_ns: u64, flags: u32) -> Self {
        Self {
            last_seen_ns: now_ns,
            flags,
            _reserved: 0,
            created_ns: now_ns,
        }
    }

    /// Converted to the current layout, with no reverse NAT (the migration fills it in from
    /// `svc_ct4_v1`).
    #[must_use]
    pub const fn upgrade(self) -> CtEntry {
        CtEntry {
            last_seen_ns: self.last_seen_ns,
            flags: self.flags,
            _reserved: 0,
            created_ns: self.created_ns,
            rev_nat: 0,
            _pad: 0,
        }
    }
}

impl CtEntry {
    /// A new entry seen first at `now_ns`.
    #[must_use]
    pub const fn new(now_ns: u64, flags: u32) -> Self {
        Self {
            last_seen_ns: now_ns,
            flags,
            _reserved: 0,
            created_ns: now_ns,
            rev_nat: 0,
            _pad: 0,
        }
    }

    /// Converted back to layout 1 (its prefix).
    #[must_use]
    pub const fn downgrade(self) -> CtEntryV1 {
        CtEntryV1 {
            last_seen_ns: self.last_seen_ns,
            flags: self.flags,
            _reserved: 0,
        }
    }

    /// Converted back to layout 2 (its prefix; the migration writes the reverse NAT into
    /// `svc_ct4_v1`, where layout 2 keeps it).
    #[must_use]
    pub const fn downgrade_v2(self) -> CtEntryV2 {
        CtEntryV2 {
            last_seen_ns: self.last_seen_ns,
            flags: self.flags,
            _reserved: 0,
            created_ns: self.created_ns,
        }
    }

    /// The sweep timeout of this entry, from its protocol and state.
    #[must_use]
    pub const fn timeout_secs(&self, protocol: u8) -> u64 {
        let f = self.flags;
        match protocol {
            6 => {
                if tcp_closed(f) {
                    TIMEOUT_TCP_CLOSED_SECS
                } else if f & FLAG_TCP_SYN_ACK != 0 {
                    TIMEOUT_TCP_ESTABLISHED_SECS
                } else {
                    TIMEOUT_TCP_SYN_SECS
                }
            }
            1 | 58 => TIMEOUT_ICMP_SECS,
            _ => TIMEOUT_OTHER_SECS,
        }
    }
}
