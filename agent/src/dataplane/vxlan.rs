//! The VXLAN driver (DESIGN.md → "Nodes and routing", vxlan mode): one kernel VXLAN device per node
//! (name from [`crate::paths::DEFAULT_VXLAN_DEVICE`], never starting with `weir`), learning off, its MTU the
//! underlay's less [`VXLAN_OVERHEAD_V4`], the local VTEP address on it as a host prefix, and per remote node
//! one permanent forwarding entry (the remote VTEP's MAC → the remote's underlay address) and one permanent
//! neighbour entry (the remote VTEP address → its MAC), as Flannel's `vxlan` backend and Calico's VXLAN mode
//! do. A VTEP's MAC is derived from its address ([`vtep_mac`]), so no node has to publish it.
//!
//! Like every driver it reads everything back, writes what is missing or different and sweeps the rest: the
//! device is weir's, so every address, forwarding and neighbour entry on it that nothing wants is removed. A
//! device whose fixed attributes (VNI, port, underlay, local address, MAC) differ is recreated; a link of that
//! name that is not a VXLAN device is never touched ([`VxlanError::NotVxlan`]). A restart over unchanged state
//! writes nothing. The routes through the device are the route driver's (`node_routes`).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use ipnetwork::Ipv4Network;

use super::map_driver::DriverStats;
pub use crate::kernel::{Mac, Underlay, VxlanDevice, VxlanError, VxlanIo, VxlanLink};

/// Bytes VXLAN adds over an IPv4 underlay: outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
pub const VXLAN_OVERHEAD_V4: u32 = 50;

/// The MAC of the VTEP whose address is `vtep`: `0a:58:` and the address's four bytes (locally
/// administered, unicast), as OVN-Kubernetes derives its port MACs.
#[must_use]
pub fn vtep_mac(vtep: Ipv4Addr) -> Mac {
    let [a, b, c, d] = vtep.octets();
    [0x0a, 0x58, a, b, c, d]
}

/// `aa:bb:cc:dd:ee:ff`, as `ip` and `bridge` print it.
#[must_use]
pub fn format_mac(mac: Mac) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The fixed settings of the device (from flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanConfig {
    /// The device name (never `weir…`).
    pub device: String,
    /// The VNI.
    pub vni: u32,
    /// The UDP port.
    pub port: u16,
    /// The underlay device the encapsulated packets leave through.
    pub underlay: String,
}

/// The local end: this node's VTEP address (on the device) and its underlay address (the tunnel's source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Vtep {
    /// The address on the VXLAN device (the routes' next hop on the remote nodes).
    pub vtep: Ipv4Addr,
    /// The node's underlay address.
    pub underlay: Ipv4Addr,
}

/// The device, its address and entries, reconciled.
pub struct VxlanDriver {
    io: Box<dyn VxlanIo>,
    config: VxlanConfig,
    local: Option<Vtep>,
    peers: BTreeSet<Vtep>,
    ifindex: Option<u32>,
    mtu: Option<u32>,
    stats: DriverStats,
    dirty: bool,
    /// The last apply succeeded and nothing desired changed since: whatever a read back finds
    /// different now was done from outside (drift, counted in `DriverStats::repairs`).
    in_sync: bool,
}

/// Tries one write, counting it; keeps the first failure.
fn count(
    stats: &mut DriverStats,
    first: &mut Option<VxlanError>,
    delete: bool,
    r: Result<(), VxlanError>,
) {
    match r {
        Ok(()) if delete => stats.deletes += 1,
        Ok(()) => stats.writes += 1,
        Err(e) => {
            stats.errors += 1;
            first.get_or_insert(e);
        }
    }
}

impl VxlanDriver {
    /// A driver whose first apply reads everything back.
    #[must_use]
    pub fn new(io: Box<dyn VxlanIo>, config: VxlanConfig) -> Self {
        Self {
            io,
            config,
            local: None,
            peers: BTreeSet::new(),
            ifindex: None,
            mtu: None,
            stats: DriverStats::default(),
            dirty: true,
            in_sync: false,
        }
    }

    /// The fixed settings.
    #[must_use]
    pub fn config(&self) -> &VxlanConfig {
        &self.config
    }

    /// Sets this node's end and the remote nodes' ends.
    pub fn set_desired(&mut self, local: Vtep, peers: BTreeSet<Vtep>) {
        if self.local != Some(local) || peers != self.peers {
            self.local = Some(local);
            self.peers = peers;
            self.dirty = true;
            self.in_sync = false;
        }
    }

    /// The device's index once an apply has found or made it.
    #[must_use]
    pub fn ifindex(&self) -> Option<u32> {
        self.ifindex
    }

    /// The device MTU once an apply has found or made it: the MTU pods get (the CNI's MTU follows it).
    #[must_use]
    pub fn mtu(&self) -> Option<u32> {
        self.mtu
    }

    /// What it wrote and swept so far (device changes, addresses, forwarding and neighbour entries).
    #[must_use]
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Marks everything for a read-back on the next apply (a periodic resync).
    pub fn resync(&mut self) {
        self.dirty = true;
    }

    /// Reads back and reconciles the device, its address and its entries; returns the device's index. Every
    /// entry is tried; the first failure is returned and the driver stays dirty, so the next apply retries.
    /// Before [`set_desired`](Self::set_desired) it does nothing and returns `None`.
    pub fn apply(&mut self) -> Result<Option<u32>, VxlanError> {
        let Some(local) = self.local else {
            return Ok(None);
        };
        if !self.dirty {
            return Ok(self.ifindex);
        }
        self.stats.resyncs += 1;
        let before = self.stats.writes + self.stats.deletes;
        let result = self.reconcile(local);
        let fixed = self.stats.writes + self.stats.deletes - before;
        if self.in_sync && fixed > 0 {
            self.stats.repairs += fixed;
            tracing::warn!(driver = "vxlan", device = %self.config.device, fixed, "drift found on the VXLAN device (its address, forwarding or neighbour entries); repaired");
        }
        match &result {
            Ok(_) => {
                self.dirty = false;
                self.in_sync = true;
            }
            Err(_) => {
                self.stats.errors += 1;
                self.in_sync = false;
            }
        }
        result.map(Some)
    }

    fn reconcile(&mut self, local: Vtep) -> Result<u32, VxlanError> {
        let ifindex = self.device(local)?;
        let mut first = None;
        let stats = &mut self.stats;

        let want_addr = Ipv4Network::from(local.vtep);
        let present = self.io.addresses(ifindex)?;
        if !present.contains(&want_addr) {
            count(
                stats,
                &mut first,
                false,
                self.io.add_address(ifindex, want_addr),
            );
        }
        for addr in present.into_iter().filter(|a| *a != want_addr) {
            count(
                stats,
                &mut first,
                true,
                self.io.delete_address(ifindex, addr),
            );
        }

        let want_fdb: BTreeMap<Mac, Ipv4Addr> = self
            .peers
            .iter()
            .map(|p| (vtep_mac(p.vtep), p.underlay))
            .collect();
        let present = self.io.fdb(ifindex)?;
        for (mac, dst) in &want_fdb {
            if present.get(mac) != Some(dst) {
                count(
                    stats,
                    &mut first,
                    false,
                    self.io.fdb_replace(ifindex, *mac, *dst),
                );
            }
        }
        for (mac, dst) in present.iter().filter(|(m, _)| !want_fdb.contains_key(*m)) {
            count(
                stats,
                &mut first,
                true,
                self.io.fdb_delete(ifindex, *mac, *dst),
            );
        }

        let want_neigh: BTreeMap<Ipv4Addr, Mac> = self
            .peers
            .iter()
            .map(|p| (p.vtep, vtep_mac(p.vtep)))
            .collect();
        let present = self.io.neighbours(ifindex)?;
        for (ip, mac) in &want_neigh {
            if present.get(ip) != Some(mac) {
                count(
                    stats,
                    &mut first,
                    false,
                    self.io.neigh_replace(ifindex, *ip, *mac),
                );
            }
        }
        for ip in present.keys().filter(|ip| !want_neigh.contains_key(*ip)) {
            count(stats, &mut first, true, self.io.neigh_delete(ifindex, *ip));
        }
        first.map_or(Ok(ifindex), Err)
    }

    /// Finds, fixes or makes the device; its index.
    fn device(&mut self, local: Vtep) -> Result<u32, VxlanError> {
        let name = self.config.device.clone();
        let underlay_name = &self.config.underlay;
        let underlay = self
            .io
            .underlay(underlay_name)?
            .ok_or_else(|| VxlanError::NoUnderlay {
                name: underlay_name.clone(),
            })?;
        let mtu = underlay
            .mtu
            .checked_sub(VXLAN_OVERHEAD_V4)
            .filter(|m| *m >= 68)
            .ok_or_else(|| VxlanError::MtuTooSmall {
                name: underlay_name.clone(),
                mtu: underlay.mtu,
                overhead: VXLAN_OVERHEAD_V4,
            })?;
        let want = VxlanDevice {
            vni: self.config.vni,
            port: self.config.port,
            underlay_ifindex: underlay.ifindex,
            local: local.underlay,
            mac: vtep_mac(local.vtep),
            mtu,
        };
        let ifindex = match self.io.vxlan(&name)? {
            None => self.create(&name, &want)?,
            Some(VxlanLink { device: None, .. }) => return Err(VxlanError::NotVxlan { name }),
            Some(link) => {
                let have = link
                    .device
                    .as_ref()
                    .map(|d| VxlanDevice { mtu, ..d.clone() });
                if have.as_ref() != Some(&want) || link.learning {
                    tracing::info!(device = %name, ifindex = link.ifindex, "recreating the VXLAN device: its settings changed");
                    self.io.delete(link.ifindex)?;
                    self.stats.deletes += 1;
                    self.create(&name, &want)?
                } else {
                    if link.device.as_ref().map(|d| d.mtu) != Some(mtu) {
                        self.io.set_mtu(link.ifindex, mtu)?;
                        self.stats.writes += 1;
                    }
                    if !link.up {
                        self.io.set_up(link.ifindex)?;
                        self.stats.writes += 1;
                    }
                    link.ifindex
                }
            }
        };
        self.ifindex = Some(ifindex);
        self.mtu = Some(mtu);
        Ok(ifindex)
    }

    fn create(&mut self, name: &str, want: &VxlanDevice) -> Result<u32, VxlanError> {
        let ifindex = self.io.create(name, want)?;
        self.stats.writes += 1;
        tracing::info!(device = %name, ifindex, vni = want.vni, port = want.port, mtu = want.mtu, "created the VXLAN device");
        Ok(ifindex)
    }

    /// Removes weir's VXLAN device (routing switched to native, or VXLAN turned off); a link of that name
    /// that is not a VXLAN device is left alone. True when a device was removed.
    pub fn teardown(&mut self) -> Result<bool, VxlanError> {
        let removed = match self.io.vxlan(&self.config.device)? {
            Some(VxlanLink {
                ifindex,
                device: Some(_),
                ..
            }) => {
                self.io.delete(ifindex)?;
                self.stats.deletes += 1;
                true
            }
            _ => false,
        };
        self.ifindex = None;
        self.mtu = None;
        self.dirty = true;
        self.in_sync = false;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::fake::FakeKernel;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().expect("ip")
    }

    fn config() -> VxlanConfig {
        VxlanConfig {
            device: "wvx0".into(),
            vni: 87,
            port: 4789,
            underlay: "eth0".into(),
        }
    }

    fn kernel() -> FakeKernel {
        let k = FakeKernel::default();
        k.vxlan_table().underlays.insert(
            "eth0".into(),
            Underlay {
                ifindex: 2,
                mtu: 1500,
            },
        );
        k
    }

    fn local() -> Vtep {
        Vtep {
            vtep: ip("10.244.0.1"),
            underlay: ip("192.0.2.1"),
        }
    }

    fn peers(n: u8) -> BTreeSet<Vtep> {
        (2..2 + n)
            .map(|i| Vtep {
                vtep: Ipv4Addr::new(10, 244, i, 1),
                underlay: Ipv4Addr::new(192, 0, 2, i),
            })
            .collect()
    }

    #[test]
    fn makes_the_device_and_entries_and_a_restart_writes_nothing() {
        let k = kernel();
        let mut d = VxlanDriver::new(Box::new(k.clone()), config());
        assert_eq!(d.apply().expect("nothing desired yet"), None);
        d.set_desired(local(), peers(3));
        let ifindex = d.apply().expect("apply").expect("a device");
        let t = k.vxlan_table();
        let dev = t.links["wvx0"].device.clone().expect("vxlan");
        assert_eq!(
            (dev.vni, dev.port, dev.underlay_ifindex, dev.local, dev.mtu),
            (87, 4789, 2, ip("192.0.2.1"), 1500 - VXLAN_OVERHEAD_V4)
        );
        assert_eq!(dev.mac, [0x0a, 0x58, 10, 244, 0, 1]);
        assert_eq!(
            t.addresses[&ifindex],
            BTreeSet::from([Ipv4Network::from(ip("10.244.0.1"))])
        );
        let want_fdb: BTreeMap<_, _> = peers(3)
            .iter()
            .map(|p| (vtep_mac(p.vtep), p.underlay))
            .collect();
        assert_eq!(t.fdb[&ifindex], want_fdb);
        assert_eq!(t.neighbours[&ifindex].len(), 3);
        assert_eq!(
            t.neighbours[&ifindex][&ip("10.244.3.1")],
            vtep_mac(ip("10.244.3.1"))
        );
        let mutations = t.mutations;
        drop(t);
        // device + address + 3 fdb + 3 neighbours
        assert_eq!(d.stats().writes, 8);
        assert_eq!(u64::from(mutations), d.stats().writes);

        let mut restarted = VxlanDriver::new(Box::new(k.clone()), config());
        restarted.set_desired(local(), peers(3));
        assert_eq!(restarted.apply().expect("apply"), Some(ifindex));
        assert_eq!(
            (restarted.stats().writes, restarted.stats().deletes),
            (0, 0)
        );
        assert_eq!(k.vxlan_table().mutations, mutations, "nothing written");
        assert_eq!(restarted.mtu(), Some(1450));
    }

    #[test]
    fn a_gone_peer_is_swept_a_moved_one_replaced_and_strays_removed() {
        let k = kernel();
        let mut d = VxlanDriver::new(Box::new(k.clone()), config());
        d.set_desired(local(), peers(3));
        let ifindex = d.apply().expect("apply").expect("device");
        {
            let mut t = k.vxlan_table();
            t.fdb
                .get_mut(&ifindex)
                .expect("fdb")
                .insert([2, 0, 0, 0, 0, 9], ip("192.0.2.99"));
            t.neighbours
                .get_mut(&ifindex)
                .expect("neigh")
                .insert(ip("10.99.0.1"), [2, 0, 0, 0, 0, 9]);
            t.addresses
                .get_mut(&ifindex)
                .expect("addr")
                .insert(Ipv4Network::from(ip("10.99.0.2")));
        }
        // Peer 10.244.4.1 gone, 10.244.3.1 moved to a new underlay address.
        let mut want: BTreeSet<Vtep> = peers(2);
        want.insert(Vtep {
            vtep: ip("10.244.3.1"),
            underlay: ip("192.0.2.33"),
        });
        let before = d.stats();
        d.set_desired(local(), want.clone());
        d.apply().expect("apply");
        let t = k.vxlan_table();
        let want_fdb: BTreeMap<_, _> = want
            .iter()
            .map(|p| (vtep_mac(p.vtep), p.underlay))
            .collect();
        assert_eq!(t.fdb[&ifindex], want_fdb);
        assert_eq!(
            t.neighbours[&ifindex].keys().copied().collect::<Vec<_>>(),
            vec![ip("10.244.2.1"), ip("10.244.3.1")]
        );
        assert_eq!(
            t.addresses[&ifindex].len(),
            1,
            "the stray address is removed"
        );
        // writes: fdb of the moved peer; deletes: gone fdb + stray fdb, gone neigh + stray neigh, address.
        assert_eq!(d.stats().writes - before.writes, 1);
        assert_eq!(d.stats().deletes - before.deletes, 5);
    }

    #[test]
    fn changed_settings_recreate_the_device_and_mtu_and_state_are_fixed_in_place() {
        let k = kernel();
        let mut d = VxlanDriver::new(Box::new(k.clone()), config());
        d.set_desired(local(), peers(1));
        let first = d.apply().expect("apply").expect("device");
        // Someone set it down and changed its MTU: fixed in place.
        {
            let mut t = k.vxlan_table();
            let link = t.links.get_mut("wvx0").expect("link");
            link.up = false;
            link.device.as_mut().expect("vxlan").mtu = 1400;
        }
        d.resync();
        assert_eq!(d.apply().expect("apply"), Some(first));
        let link = k.vxlan_table().links["wvx0"].clone();
        assert!(link.up);
        assert_eq!(link.device.expect("vxlan").mtu, 1450);
        // A new VNI: recreated, entries written again on the new device.
        let mut cfg = config();
        cfg.vni = 88;
        let mut d = VxlanDriver::new(Box::new(k.clone()), cfg);
        d.set_desired(local(), peers(1));
        let second = d.apply().expect("apply").expect("device");
        assert_ne!(first, second);
        let t = k.vxlan_table();
        assert_eq!(t.links["wvx0"].device.as_ref().map(|d| d.vni), Some(88));
        assert_eq!(t.fdb[&second].len(), 1);
        assert!(!t.fdb.contains_key(&first));
    }

    #[test]
    fn a_foreign_link_is_never_touched_and_a_small_underlay_is_refused() {
        let k = kernel();
        k.vxlan_table().links.insert(
            "wvx0".into(),
            VxlanLink {
                ifindex: 7,
                device: None,
                up: true,
                learning: false,
            },
        );
        let mut d = VxlanDriver::new(Box::new(k.clone()), config());
        d.set_desired(local(), peers(1));
        let err = d.apply().expect_err("not ours").to_string();
        assert!(err.contains("--vxlan-device"), "{err}");
        assert!(!d.teardown().expect("teardown"), "a foreign link stays");
        assert_eq!(k.vxlan_table().mutations, 0);
        // Positive control: without the foreign link the same driver works.
        k.vxlan_table().links.clear();
        d.resync();
        assert!(d.apply().expect("apply").is_some());
        assert!(d.teardown().expect("teardown"));
        assert!(k.vxlan_table().links.is_empty());

        k.vxlan_table().underlays.insert(
            "eth0".into(),
            Underlay {
                ifindex: 2,
                mtu: 100,
            },
        );
        d.resync();
        let err = d.apply().expect_err("too small").to_string();
        assert!(err.contains("too small"), "{err}");
        k.vxlan_table().underlays.clear();
        let err = d.apply().expect_err("no underlay").to_string();
        assert!(err.contains("--vxlan-underlay"), "{err}");
    }

    #[test]
    fn a_failing_entry_stays_dirty_while_the_others_are_written() {
        let k = kernel();
        k.vxlan_table().failing.insert("neigh_replace");
        let mut d = VxlanDriver::new(Box::new(k.clone()), config());
        d.set_desired(local(), peers(2));
        assert!(d.apply().is_err());
        let ifindex = d.ifindex().expect("the device was made");
        assert_eq!(
            k.vxlan_table().fdb[&ifindex].len(),
            2,
            "the other entries are written"
        );
        k.vxlan_table().failing.clear();
        d.apply().expect("the retry succeeds");
        assert_eq!(k.vxlan_table().neighbours[&ifindex].len(), 2);
    }
}
