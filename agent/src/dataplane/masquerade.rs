//! BPF masquerade, a driver the dataplane loop applies: `masq_egress`/`masq_ingress` on exactly the
//! interfaces `--masquerade-interfaces` names (a masquerade link on any other interface is an orphan:
//! its pin is removed, which detaches it), `masq_if_v1` (each named interface's index → the address it
//! masquerades to: the flag's, or the interface's first IPv4 address) and `masq_cidr4_v1` (the IPv4
//! pool CIDRs, sent by `sources::pools`) through map drivers. A failing interface stays dirty and is
//! retried with backoff; the others proceed. The sweep of idle `nat4_v1` pairs ([`sweep_nat`]) is a
//! periodic task (`upkeep`).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::Ipv4Addr,
    time::Instant,
};

use attach::AttachMode;
use ipnetwork::Ipv4Network;
use maps_schema::{
    MasqCidr, MasqInterface, Nat4Entry, Nat4Key,
    nat::{DIR_EGRESS, DIR_INGRESS, IF_HOST_ROUTING, IF_NO_MASQUERADE, IF_NODEPORT, timeout_secs},
};

use super::{
    map_driver::{MapDriver, Pending},
    plane::ApplyError,
    retry::Backoff,
};
use crate::kernel::{HostTcIo, KernelError, MASQ_PROGRAMS, MapIo, Prefix};
use crate::paths::Paths;

/// One `--masquerade-interfaces` or `--nodeport-interfaces` item: `IFNAME` or `IFNAME=ADDRESS`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MasqSpec {
    /// The interface.
    pub ifname: String,
    /// The address to masquerade to and serve NodePorts on; `None`: the interface's first IPv4
    /// address.
    pub address: Option<Ipv4Addr>,
    /// Its roles (`masq_if` flags: `IF_NODEPORT`, `IF_NO_MASQUERADE`); from which flag named it,
    /// so not dumped.
    #[serde(skip)]
    pub flags: u32,
}

/// Parses `IFNAME` or `IFNAME=ADDRESS` (an IPv4 address) of `--masquerade-interfaces`; `None` when
/// malformed.
#[must_use]
pub fn parse_spec(text: &str) -> Option<MasqSpec> {
    let (ifname, address) = match text.split_once('=') {
        Some((i, a)) => (i, Some(a.parse().ok()?)),
        None => (text, None),
    };
    let valid = !ifname.is_empty() && ifname.len() <= 15 && !ifname.contains(['/', ' ', '\0']);
    valid.then(|| MasqSpec {
        ifname: ifname.to_owned(),
        address,
        flags: 0,
    })
}

/// The host interfaces the programs serve: every masquerade interface, and every NodePort one
/// (`IF_NODEPORT`; `IF_NO_MASQUERADE` unless it masquerades too). An interface in both lists
/// must not name two different addresses: `Err` names it.
pub fn host_interfaces(
    masquerade: &[MasqSpec],
    nodeport: &[MasqSpec],
) -> Result<Vec<MasqSpec>, String> {
    let mut out: BTreeMap<String, MasqSpec> = masquerade
        .iter()
        .map(|s| {
            (
                s.ifname.clone(),
                MasqSpec {
                    flags: 0,
                    ..s.clone()
                },
            )
        })
        .collect();
    for s in nodeport {
        match out.get_mut(&s.ifname) {
            Some(both) => {
                if both.address.is_some() && s.address.is_some() && both.address != s.address {
                    return Err(s.ifname.clone());
                }
                both.address = both.address.or(s.address);
                both.flags = IF_NODEPORT;
            }
            None => {
                out.insert(
                    s.ifname.clone(),
                    MasqSpec {
                        flags: IF_NODEPORT | IF_NO_MASQUERADE,
                        ..s.clone()
                    },
                );
            }
        }
    }
    Ok(out.into_values().collect())
}

/// `interfaces` with the node's `underlay` served for BPF host routing (`IF_HOST_ROUTING`): added
/// (not masquerading, no NodePorts) or, when already named, with that role too.
#[must_use]
pub fn with_underlay(interfaces: &[MasqSpec], underlay: Option<String>) -> Vec<MasqSpec> {
    let mut out = interfaces.to_vec();
    let Some(ifname) = underlay else {
        return out;
    };
    match out.iter_mut().find(|s| s.ifname == ifname) {
        Some(named) => named.flags |= IF_HOST_ROUTING,
        None => out.push(MasqSpec {
            ifname,
            address: None,
            flags: IF_HOST_ROUTING | IF_NO_MASQUERADE,
        }),
    }
    out
}

/// Why a named interface cannot masquerade (yet).
#[derive(Debug, thiserror::Error)]
pub enum MasqInterfaceError {
    /// No such interface in the agent's namespace.
    #[error("masquerade interface {0} does not exist; check --masquerade-interfaces")]
    Missing(String),
    /// It has no IPv4 address and the flag names none.
    #[error(
        "masquerade interface {0} has no IPv4 address; give it one or name the address as {0}=ADDRESS in --masquerade-interfaces"
    )]
    NoAddress(String),
}

impl From<MasqInterfaceError> for KernelError {
    fn from(e: MasqInterfaceError) -> Self {
        let ifname = match &e {
            MasqInterfaceError::Missing(i) | MasqInterfaceError::NoAddress(i) => i.clone(),
        };
        Self::Attach {
            op: "masquerade on",
            what: ifname,
            source: Box::new(e),
        }
    }
}

/// (interface, program, how it was attached).
pub type AttachedMode = (String, String, AttachMode);

/// The masquerade's drivers: the interface and CIDR maps, and the program attachments.
pub struct MasqDriver {
    io: Box<dyn HostTcIo>,
    interfaces: BTreeMap<String, (Option<Ipv4Addr>, u32)>,
    dirty: BTreeSet<String>,
    resync: bool,
    backoff: Backoff<String>,
    resolved: BTreeMap<String, (u32, Ipv4Addr, u32)>,
    ifaces: MapDriver<u32, MasqInterface>,
    cidrs: MapDriver<Prefix<[u8; 4]>, MasqCidr>,
    modes: BTreeMap<(String, String), AttachMode>,
}

impl MasqDriver {
    /// Drivers over the seam; the first apply reads everything back.
    pub fn new(
        io: Box<dyn HostTcIo>,
        ifaces: Box<dyn MapIo<u32, MasqInterface>>,
        cidrs: Box<dyn MapIo<Prefix<[u8; 4]>, MasqCidr>>,
    ) -> Self {
        Self {
            io,
            interfaces: BTreeMap::new(),
            dirty: BTreeSet::new(),
            resync: true,
            backoff: Backoff::default(),
            resolved: BTreeMap::new(),
            ifaces: MapDriver::new(ifaces),
            cidrs: MapDriver::new(cidrs),
            modes: BTreeMap::new(),
        }
    }

    /// Over the real kernel: the pinned programs and maps, opened (nothing attached or written
    /// until the loop applies).
    pub fn open(paths: &Paths) -> Result<Self, KernelError> {
        use crate::kernel::{PinnedHash, PinnedLpm};
        use maps_schema::maps::{MASQ_CIDR4, MASQ_IF};
        Ok(Self::new(
            Box::new(crate::kernel::real::host_tc::PinnedHostTc::open(paths)?),
            Box::new(PinnedHash::open(MASQ_IF, &paths.map_pin(MASQ_IF))?),
            Box::new(PinnedLpm::open(MASQ_CIDR4, &paths.map_pin(MASQ_CIDR4))?),
        ))
    }

    /// The host interfaces served (masquerade, NodePorts: [`host_interfaces`]). No kernel I/O.
    pub fn set_interfaces(&mut self, specs: impl IntoIterator<Item = MasqSpec>) {
        let new: BTreeMap<String, (Option<Ipv4Addr>, u32)> = specs
            .into_iter()
            .map(|s| (s.ifname, (s.address, s.flags)))
            .collect();
        for (ifname, address) in self.interfaces.iter().chain(&new) {
            if self.interfaces.get(ifname) != new.get(ifname) || new.get(ifname) != Some(address) {
                self.dirty.insert(ifname.clone());
            }
        }
        self.interfaces = new;
    }

    /// The pool CIDRs (IPv4: the masquerade is IPv4 only). No kernel I/O.
    pub fn set_pools(&mut self, pools: impl IntoIterator<Item = Ipv4Network>) {
        let desired: HashMap<Prefix<[u8; 4]>, MasqCidr> = pools
            .into_iter()
            .map(|net| {
                let net = Ipv4Network::new(net.network(), net.prefix()).unwrap_or(net);
                (
                    Prefix {
                        len: u32::from(net.prefix()),
                        data: net.network().octets(),
                    },
                    MasqCidr::default(),
                )
            })
            .collect();
        self.cidrs.replace_all(desired);
    }

    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.resync || !self.dirty.is_empty() || self.cidrs.is_dirty() || self.ifaces.is_dirty()
    }

    /// The next apply reads the maps, the interfaces and the link pins back in full.
    pub fn request_resync(&mut self) {
        self.resync = true;
        self.cidrs.request_resync();
        self.ifaces.request_resync();
    }

    /// How each (interface, program) was attached by the applies so far.
    pub fn modes(&self) -> Vec<AttachedMode> {
        self.modes
            .iter()
            .map(|((i, p), m)| (i.clone(), p.clone(), *m))
            .collect()
    }

    /// Reconciles: the CIDR map first, then each interface (resolved, attached or detached),
    /// then the interface map from what resolved.
    pub fn apply(&mut self) -> Result<(), ApplyError> {
        let now = Instant::now();
        let cidrs = self.cidrs.apply_due(now, &|_, _| true);
        let links = self.apply_links(now);
        let desired = self
            .resolved
            .values()
            .map(|(ifindex, addr, flags)| {
                (
                    *ifindex,
                    MasqInterface {
                        addr: addr.octets(),
                        flags: *flags,
                    },
                )
            })
            .collect();
        self.ifaces.replace_all(desired);
        let ifaces = self.ifaces.apply_due(now, &|_, _| true);
        ApplyError::from_pending(vec![cidrs, links, ifaces])
    }

    fn apply_links(&mut self, now: Instant) -> Pending {
        let mut pending = Pending {
            driver: "masquerade attachments".to_owned(),
            ..Pending::default()
        };
        let mut todo = std::mem::take(&mut self.dirty);
        if self.resync {
            match self.io.pinned() {
                Ok(pinned) => {
                    todo.extend(pinned.into_iter().map(|(ifname, _)| ifname));
                    todo.extend(self.interfaces.keys().cloned());
                    self.resync = false;
                }
                Err(e) => {
                    pending.failed += 1;
                    pending.error = Some(e);
                    todo.extend(self.interfaces.keys().cloned());
                }
            }
        }
        for ifname in todo {
            if !self.backoff.is_due(&ifname, now) {
                pending.waiting += 1;
                self.dirty.insert(ifname);
                continue;
            }
            match self.reconcile(&ifname) {
                Ok(()) => self.backoff.succeeded(&ifname),
                Err(e) => {
                    tracing::warn!(ifname, error = %e, "masquerade attachment failed; retrying with backoff");
                    pending.failed += 1;
                    pending.error.get_or_insert(e);
                    self.backoff.failed(&ifname, now);
                    self.dirty.insert(ifname);
                }
            }
        }
        pending.retry_at = self.backoff.next_due();
        pending
    }

    fn reconcile(&mut self, ifname: &str) -> Result<(), KernelError> {
        let Some((configured, flags)) = self.interfaces.get(ifname).copied() else {
            self.resolved.remove(ifname);
            let pinned = self.io.pinned()?;
            for (program, _) in MASQ_PROGRAMS {
                if pinned.iter().any(|(i, p)| i == ifname && p == program) {
                    self.io.unpin(ifname, program)?;
                    tracing::info!(
                        ifname,
                        program,
                        "detached a masquerade program from an interface no longer named"
                    );
                }
                self.modes.remove(&(ifname.to_owned(), program.to_owned()));
            }
            return Ok(());
        };
        let Some((ifindex, primary)) = self.io.interface(ifname) else {
            self.resolved.remove(ifname);
            return Err(MasqInterfaceError::Missing(ifname.to_owned()).into());
        };
        let Some(addr) = configured.or(primary) else {
            self.resolved.remove(ifname);
            return Err(MasqInterfaceError::NoAddress(ifname.to_owned()).into());
        };
        self.resolved
            .insert(ifname.to_owned(), (ifindex, addr, flags));
        for (program, _) in MASQ_PROGRAMS {
            let key = (ifname.to_owned(), program.to_owned());
            let current = self.io.current(program);
            let pinned = self.io.pinned_program(ifname, program);
            let live = self.io.pin_is_live(ifname, program);
            if pinned == Some(current) && live {
                self.modes.entry(key).or_insert(AttachMode::Unchanged);
                continue;
            }
            if pinned.is_some() && !live {
                // The interface was recreated under this name: the pin holds a defunct link.
                self.io.unpin(ifname, program)?;
            }
            let mode = self.io.attach(ifname, program)?;
            tracing::info!(ifname, program, ?mode, %addr, "attached a masquerade program");
            self.modes.insert(key, mode);
        }
        Ok(())
    }
}

/// What one NAT sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NatSweep {
    /// Entries read.
    pub entries: u64,
    /// Entries deleted (idle pairs, and halves whose other half is gone and that are idle).
    pub deleted: u64,
}

/// Deletes the NAT pairs idle past their protocol's timeout at `now_ns` (the programs' clock).
/// A pair is idle when both its entries are: the later `last_seen_ns` counts, and the closing
/// flag of either. An entry whose partner is gone (an LRU eviction) is judged by itself.
pub fn sweep_nat(
    io: &mut dyn MapIo<Nat4Key, Nat4Entry>,
    now_ns: u64,
) -> Result<NatSweep, KernelError> {
    let entries = io.read_all()?;
    let index: HashMap<Nat4Key, Nat4Entry> = entries.iter().copied().collect();
    let mut doomed = Vec::new();
    for (key, value) in &entries {
        let partner = index.get(&partner_key(key, value));
        let (last, flags) = match partner {
            Some(p) => (
                value.last_seen_ns.max(p.last_seen_ns),
                value.flags | p.flags,
            ),
            None => (value.last_seen_ns, value.flags),
        };
        let idle = now_ns.saturating_sub(last) / 1_000_000_000;
        if idle >= timeout_secs(key.protocol, flags) {
            doomed.push(*key);
        }
    }
    for key in &doomed {
        io.delete(key)?;
    }
    Ok(NatSweep {
        entries: entries.len() as u64,
        deleted: doomed.len() as u64,
    })
}

/// The key of the other direction's entry of a NAT pair.
#[must_use]
pub fn partner_key(key: &Nat4Key, value: &Nat4Entry) -> Nat4Key {
    if key.direction == DIR_EGRESS {
        // pod:sport → remote:dport became node:port → remote:dport; the reply comes back as
        // remote:dport → node:port.
        Nat4Key {
            saddr: key.daddr,
            daddr: value.addr,
            sport: key.dport,
            dport: value.port,
            protocol: key.protocol,
            direction: DIR_INGRESS,
            _pad: [0; 2],
        }
    } else {
        Nat4Key {
            saddr: value.addr,
            daddr: key.saddr,
            sport: value.port,
            dport: key.sport,
            protocol: key.protocol,
            direction: DIR_EGRESS,
            _pad: [0; 2],
        }
    }
}

/// One masqueraded flow as operators read it (the API contract's).
pub use weir_api::NatView;

/// The masqueraded flows of the NAT map at `now_ns`, ordered by pod then remote.
pub fn list_nat(
    io: &dyn MapIo<Nat4Key, Nat4Entry>,
    now_ns: u64,
) -> Result<Vec<NatView>, KernelError> {
    let entries = io.read_all()?;
    let index: HashMap<Nat4Key, Nat4Entry> = entries.iter().copied().collect();
    let secs = |ns: u64| now_ns.saturating_sub(ns) / 1_000_000_000;
    let mut out: Vec<(Nat4Key, NatView)> = entries
        .iter()
        .filter(|(k, _)| k.direction == DIR_EGRESS)
        .map(|(k, v)| {
            let partner = index.get(&partner_key(k, v));
            let last = partner.map_or(v.last_seen_ns, |p| p.last_seen_ns.max(v.last_seen_ns));
            let end = |a: [u8; 4], p: u16| format!("{}:{p}", Ipv4Addr::from(a));
            (
                *k,
                NatView {
                    protocol: k.protocol,
                    pod: end(k.saddr, k.sport),
                    remote: end(k.daddr, k.dport),
                    translated: end(v.addr, v.port),
                    reverse: partner.is_some(),
                    flags: v.flags | partner.map_or(0, |p| p.flags),
                    idle_secs: secs(last),
                    age_secs: secs(v.created_ns),
                },
            )
        })
        .collect();
    out.sort_by_key(|a| a.0);
    Ok(out.into_iter().map(|(_, v)| v).collect())
}

#[cfg(test)]
mod tests {
    use maps_schema::programs::{MASQ_EGRESS, MASQ_INGRESS};

    use super::*;
    use crate::kernel::fake::{FakeKernel, FakeMap};

    type Maps = (
        FakeMap<u32, MasqInterface>,
        FakeMap<Prefix<[u8; 4]>, MasqCidr>,
    );

    fn driver(k: &FakeKernel) -> (MasqDriver, Maps) {
        restarted(k, &(k.map("masq_if_v1"), k.map("masq_cidr4_v1")))
    }

    /// A new driver (an agent restart) over the same kernel and maps.
    fn restarted(k: &FakeKernel, maps: &Maps) -> (MasqDriver, Maps) {
        let (ifaces, cidrs) = (maps.0.clone(), maps.1.clone());
        let d = MasqDriver::new(
            Box::new(k.clone()),
            Box::new(ifaces.clone()),
            Box::new(cidrs.clone()),
        );
        (d, (ifaces, cidrs))
    }

    fn spec(text: &str) -> MasqSpec {
        parse_spec(text).expect("valid spec")
    }

    fn pins(k: &FakeKernel) -> Vec<(String, String)> {
        k.masq_table().pins.keys().cloned().collect()
    }

    fn both(ifname: &str) -> Vec<(String, String)> {
        let mut v = vec![
            (ifname.to_owned(), MASQ_EGRESS.to_owned()),
            (ifname.to_owned(), MASQ_INGRESS.to_owned()),
        ];
        v.sort();
        v
    }

    #[test]
    fn host_interfaces_merge_the_roles_and_refuse_two_addresses() {
        let merged = host_interfaces(
            &[spec("eth0"), spec("eth1=192.0.2.1")],
            &[spec("eth1"), spec("eth2=198.51.100.2")],
        )
        .expect("compatible");
        let roles: Vec<(&str, Option<Ipv4Addr>, u32)> = merged
            .iter()
            .map(|s| (s.ifname.as_str(), s.address, s.flags))
            .collect();
        assert_eq!(
            roles,
            vec![
                ("eth0", None, 0),
                ("eth1", Some(Ipv4Addr::new(192, 0, 2, 1)), IF_NODEPORT),
                (
                    "eth2",
                    Some(Ipv4Addr::new(198, 51, 100, 2)),
                    IF_NODEPORT | IF_NO_MASQUERADE
                ),
            ]
        );
        assert_eq!(
            host_interfaces(&[spec("eth1=192.0.2.1")], &[spec("eth1=192.0.2.2")]),
            Err("eth1".to_owned())
        );
    }

    #[test]
    fn the_underlay_joins_the_host_interfaces_for_host_routing_only() {
        let named = host_interfaces(&[spec("eth1")], &[]).expect("one interface");
        let roles = |v: Vec<MasqSpec>| -> Vec<(String, u32)> {
            v.into_iter().map(|s| (s.ifname, s.flags)).collect()
        };
        assert_eq!(roles(with_underlay(&named, None)), vec![("eth1".into(), 0)]);
        assert_eq!(
            roles(with_underlay(&named, Some("eth0".into()))),
            vec![
                ("eth1".into(), 0),
                ("eth0".into(), IF_HOST_ROUTING | IF_NO_MASQUERADE)
            ],
            "an underlay nobody named neither masquerades nor serves NodePorts"
        );
        assert_eq!(
            roles(with_underlay(&named, Some("eth1".into()))),
            vec![("eth1".into(), IF_HOST_ROUTING)],
            "a named underlay keeps its roles"
        );
    }

    #[test]
    fn specs_parse_names_and_addresses() {
        assert_eq!(
            parse_spec("eth0"),
            Some(MasqSpec {
                ifname: "eth0".into(),
                address: None,
                flags: 0,
            })
        );
        assert_eq!(
            parse_spec("eth0.100=192.0.2.1").map(|s| s.address),
            Some(Some(Ipv4Addr::new(192, 0, 2, 1)))
        );
        for bad in [
            "",
            "=192.0.2.1",
            "eth0=",
            "eth0=2001:db8::1",
            "a/b",
            "sixteen-chars-xx",
        ] {
            assert_eq!(parse_spec(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_cidr_map_holds_the_pools_normalised_and_a_restart_writes_nothing() {
        let k = FakeKernel::default();
        let (mut d, maps) = driver(&k);
        let cidrs = maps.1.clone();
        let stale = Prefix {
            len: 8,
            data: [172, 0, 0, 0],
        };
        cidrs.preload(&[(stale, MasqCidr::default())]);
        d.set_pools(["10.244.3.7/16".parse().expect("net")]);
        d.apply().expect("apply");
        assert_eq!(
            cidrs.contents(),
            vec![(
                Prefix {
                    len: 16,
                    data: [10, 244, 0, 0]
                },
                MasqCidr::default()
            )],
            "the pool written at its network address, the stale CIDR swept"
        );
        let writes = cidrs.mutations();
        let (mut again, _) = restarted(&k, &maps);
        again.set_pools(["10.244.0.0/16".parse().expect("net")]);
        again.apply().expect("apply");
        assert_eq!(
            cidrs.mutations(),
            writes,
            "a restart over the same pools writes nothing"
        );
    }

    #[test]
    fn exactly_the_named_interfaces_masquerade_and_a_restart_writes_nothing() {
        let k = FakeKernel::default();
        {
            let mut t = k.masq_table();
            t.interfaces
                .insert("eth1".into(), (7, Some(Ipv4Addr::new(192, 0, 2, 7))));
            t.interfaces.insert("eth2".into(), (8, None));
            // A link of an earlier run on an interface no longer named.
            t.pins.insert(("eth9".into(), MASQ_EGRESS.into()), 1);
            t.pins.insert(("eth9".into(), MASQ_INGRESS.into()), 1);
        }
        let (mut d, maps) = driver(&k);
        let ifaces = maps.0.clone();
        d.set_interfaces([spec("eth1"), spec("eth2=198.51.100.2"), spec("eth3")]);
        let err = d.apply().expect_err("eth3 does not exist");
        assert!(err.to_string().contains("eth3 does not exist"), "{err}");
        let mut expected = both("eth1");
        expected.extend(both("eth2"));
        assert_eq!(
            pins(&k),
            expected,
            "named interfaces attached, the orphan detached"
        );
        assert_eq!(
            ifaces.contents(),
            vec![
                (
                    7,
                    MasqInterface {
                        addr: [192, 0, 2, 7],
                        flags: 0
                    }
                ),
                (
                    8,
                    MasqInterface {
                        addr: [198, 51, 100, 2],
                        flags: 0
                    }
                ),
            ],
            "the interface's own address, or the one the flag names"
        );

        // A restart naming the same: nothing written.
        let before = (k.masq_table().mutations, ifaces.mutations());
        let (mut again, _) = restarted(&k, &maps);
        again.set_interfaces([spec("eth1"), spec("eth2=198.51.100.2")]);
        again.apply().expect("apply");
        assert_eq!((k.masq_table().mutations, ifaces.mutations()), before);
        assert!(
            again
                .modes()
                .iter()
                .all(|(_, _, m)| *m == AttachMode::Unchanged)
        );

        // Naming only eth1: eth2 loses weir's programs and its map entry.
        let (mut fewer, _) = restarted(&k, &maps);
        fewer.set_interfaces([spec("eth1")]);
        fewer.apply().expect("apply");
        assert_eq!(pins(&k), both("eth1"));
        assert_eq!(ifaces.contents().len(), 1);

        // eth1 recreated: its pins are defunct and get new links; a new program replaces.
        k.masq_table().defunct.extend(both("eth1"));
        k.masq_table().current.insert(MASQ_EGRESS.into(), 2);
        let (mut recreated, _) = restarted(&k, &maps);
        recreated.set_interfaces([spec("eth1")]);
        recreated.apply().expect("apply");
        assert!(
            recreated
                .modes()
                .iter()
                .all(|(_, _, m)| *m == AttachMode::NewLink)
        );
        assert_eq!(k.masq_table().pins[&("eth1".into(), MASQ_EGRESS.into())], 2);
    }

    #[test]
    fn an_interface_without_an_address_is_refused_until_it_has_one() {
        let k = FakeKernel::default();
        k.masq_table().interfaces.insert("eth1".into(), (7, None));
        let (mut d, (ifaces, _)) = driver(&k);
        d.set_interfaces([spec("eth1")]);
        let err = d.apply().expect_err("no address");
        assert!(err.to_string().contains("has no IPv4 address"), "{err}");
        assert!(pins(&k).is_empty() && ifaces.contents().is_empty());
        k.masq_table()
            .interfaces
            .insert("eth1".into(), (7, Some(Ipv4Addr::new(192, 0, 2, 9))));
        d.request_resync();
        d.backoff = Backoff::default();
        d.apply().expect("apply");
        assert_eq!(pins(&k), both("eth1"));
    }

    fn entry(addr: [u8; 4], port: u16, last_seen_s: u64, flags: u16) -> Nat4Entry {
        Nat4Entry {
            addr,
            port,
            flags,
            created_ns: 0,
            last_seen_ns: last_seen_s * 1_000_000_000,
        }
    }

    /// An egress/ingress pair of a TCP flow pod:sport → 198.51.100.1:80 through node:port.
    fn pair(
        sport: u16,
        port: u16,
        egress_s: u64,
        ingress_s: u64,
        flags: u16,
    ) -> [(Nat4Key, Nat4Entry); 2] {
        let pod = [10, 244, 0, 5];
        let node = [192, 0, 2, 7];
        let remote = [198, 51, 100, 1];
        let egress = Nat4Key {
            saddr: pod,
            daddr: remote,
            sport,
            dport: 80,
            protocol: 6,
            direction: DIR_EGRESS,
            _pad: [0; 2],
        };
        let fwd = entry(node, port, egress_s, flags);
        let reverse = partner_key(&egress, &fwd);
        let rev = entry(pod, sport, ingress_s, 0);
        assert_eq!(
            partner_key(&reverse, &rev),
            egress,
            "partners find each other"
        );
        [(egress, fwd), (reverse, rev)]
    }

    #[test]
    fn the_list_shows_each_flow_once_with_its_translation() {
        let nat: FakeMap<Nat4Key, Nat4Entry> = FakeMap::new("nat4_v1");
        let [egress, ingress] = pair(40_000, 61_234, 90, 95, 0);
        let [lonely, _] = pair(40_001, 61_235, 80, 0, 0);
        nat.preload(&[egress, ingress, lonely]);
        let got = list_nat(&nat, 100 * 1_000_000_000).expect("list");
        assert_eq!(
            got,
            vec![
                NatView {
                    protocol: 6,
                    pod: "10.244.0.5:40000".into(),
                    remote: "198.51.100.1:80".into(),
                    translated: "192.0.2.7:61234".into(),
                    reverse: true,
                    flags: 0,
                    idle_secs: 5,
                    age_secs: 100,
                },
                NatView {
                    protocol: 6,
                    pod: "10.244.0.5:40001".into(),
                    remote: "198.51.100.1:80".into(),
                    translated: "192.0.2.7:61235".into(),
                    reverse: false,
                    flags: 0,
                    idle_secs: 20,
                    age_secs: 100,
                },
            ]
        );
    }

    #[test]
    fn the_sweep_removes_pairs_idle_on_both_sides_only() {
        use maps_schema::nat::{FLAG_TCP_CLOSING, TIMEOUT_TCP_CLOSING_SECS, TIMEOUT_TCP_SECS};
        let k = FakeKernel::default();
        let nat: FakeMap<Nat4Key, Nat4Entry> = k.map("nat4_v1");
        let now = TIMEOUT_TCP_SECS + 1_000;
        let idle = pair(1, 61_001, 100, 200, 0);
        // Old on egress, fresh on ingress (a download): kept.
        let busy = pair(2, 61_002, 100, now - 1, 0);
        // Closing, idle past the closing timeout: removed.
        let closed = pair(
            3,
            61_003,
            now - TIMEOUT_TCP_CLOSING_SECS - 1,
            now - TIMEOUT_TCP_CLOSING_SECS - 1,
            FLAG_TCP_CLOSING,
        );
        // Half a pair (the other evicted), fresh: kept.
        let [half, _] = pair(4, 61_004, now - 5, 0, 0);
        let mut all: Vec<_> = [idle, busy, closed].into_iter().flatten().collect();
        all.push(half);
        nat.preload(&all);
        let mut io = nat.clone();
        let swept = sweep_nat(&mut io, now * 1_000_000_000).expect("sweep");
        assert_eq!(
            swept,
            NatSweep {
                entries: 7,
                deleted: 4
            }
        );
        let mut left: Vec<u16> = nat
            .contents()
            .iter()
            .filter(|(key, _)| key.direction == DIR_EGRESS)
            .map(|(key, _)| key.sport)
            .collect();
        left.sort_unstable();
        assert_eq!(left, vec![2, 4]);
        assert_eq!(nat.contents().len(), 3);
    }
}
