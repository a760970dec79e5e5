//! The fake kernel's VXLAN side ([`VxlanIo`] for [`FakeKernel`]): underlay devices, links by name (a
//! non-VXLAN one stands for a foreign link), each link's addresses, forwarding and neighbour entries, a
//! count of every mutation, and failing operations by name.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use ipnetwork::Ipv4Network;

use crate::kernel::{Mac, Underlay, VxlanDevice, VxlanError, VxlanIo, VxlanLink, fake::FakeKernel};

/// The VXLAN side of one fake kernel.
#[derive(Default)]
pub(crate) struct VxlanTable {
    pub(crate) underlays: BTreeMap<String, Underlay>,
    /// Addresses on the underlays: address → device name.
    pub(crate) underlay_addresses: BTreeMap<Ipv4Addr, String>,
    pub(crate) links: BTreeMap<String, VxlanLink>,
    pub(crate) addresses: BTreeMap<u32, BTreeSet<Ipv4Network>>,
    pub(crate) fdb: BTreeMap<u32, BTreeMap<Mac, Ipv4Addr>>,
    pub(crate) neighbours: BTreeMap<u32, BTreeMap<Ipv4Addr, Mac>>,
    /// Every mutating call that succeeded.
    pub(crate) mutations: u32,
    /// Operations (`create`, `fdb_replace`, …) that fail.
    pub(crate) failing: BTreeSet<&'static str>,
    next_ifindex: u32,
}

impl VxlanTable {
    fn link_mut(&mut self, ifindex: u32) -> Option<&mut VxlanLink> {
        self.links.values_mut().find(|l| l.ifindex == ifindex)
    }

    /// Records a mutation `op` on `what`, or fails it when `op` is failing.
    fn mutate(&mut self, op: &'static str, what: String) -> Result<(), VxlanError> {
        if self.failing.contains(op) {
            return Err(VxlanError::Netlink {
                op,
                what,
                source: std::io::Error::other("injected fault"),
            });
        }
        self.mutations += 1;
        Ok(())
    }
}

fn no_link(op: &'static str, ifindex: u32) -> VxlanError {
    VxlanError::Netlink {
        op,
        what: format!("link {ifindex}"),
        source: std::io::Error::from_raw_os_error(libc::ENODEV),
    }
}

impl VxlanIo for FakeKernel {
    fn underlay(&mut self, name: &str) -> Result<Option<Underlay>, VxlanError> {
        Ok(self.vxlan_table().underlays.get(name).copied())
    }

    fn device_with_address(&mut self, address: Ipv4Addr) -> Result<Option<String>, VxlanError> {
        Ok(self.vxlan_table().underlay_addresses.get(&address).cloned())
    }

    fn vxlan(&mut self, name: &str) -> Result<Option<VxlanLink>, VxlanError> {
        Ok(self.vxlan_table().links.get(name).cloned())
    }

    fn create(&mut self, name: &str, device: &VxlanDevice) -> Result<u32, VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("create", name.to_owned())?;
        if t.links.contains_key(name) {
            return Err(VxlanError::Netlink {
                op: "create",
                what: name.to_owned(),
                source: std::io::Error::from_raw_os_error(libc::EEXIST),
            });
        }
        t.next_ifindex += 1;
        let ifindex = 100 + t.next_ifindex;
        t.links.insert(
            name.to_owned(),
            VxlanLink {
                ifindex,
                device: Some(device.clone()),
                up: true,
                learning: false,
            },
        );
        Ok(ifindex)
    }

    fn delete(&mut self, ifindex: u32) -> Result<(), VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("delete", format!("link {ifindex}"))?;
        let before = t.links.len();
        t.links.retain(|_, l| l.ifindex != ifindex);
        if t.links.len() == before {
            return Err(no_link("delete", ifindex));
        }
        t.addresses.remove(&ifindex);
        t.fdb.remove(&ifindex);
        t.neighbours.remove(&ifindex);
        Ok(())
    }

    fn set_mtu(&mut self, ifindex: u32, mtu: u32) -> Result<(), VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("set_mtu", format!("link {ifindex}"))?;
        let link = t
            .link_mut(ifindex)
            .ok_or_else(|| no_link("set_mtu", ifindex))?;
        if let Some(d) = link.device.as_mut() {
            d.mtu = mtu;
        }
        Ok(())
    }

    fn set_up(&mut self, ifindex: u32) -> Result<(), VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("set_up", format!("link {ifindex}"))?;
        t.link_mut(ifindex)
            .ok_or_else(|| no_link("set_up", ifindex))?
            .up = true;
        Ok(())
    }

    fn addresses(&mut self, ifindex: u32) -> Result<BTreeSet<Ipv4Network>, VxlanError> {
        Ok(self
            .vxlan_table()
            .addresses
            .get(&ifindex)
            .cloned()
            .unwrap_or_default())
    }

    fn add_address(&mut self, ifindex: u32, addr: Ipv4Network) -> Result<(), VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("add_address", addr.to_string())?;
        t.addresses.entry(ifindex).or_default().insert(addr);
        Ok(())
    }

    fn delete_address(&mut self, ifindex: u32, addr: Ipv4Network) -> Result<(), VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("delete_address", addr.to_string())?;
        t.addresses.entry(ifindex).or_default().remove(&addr);
        Ok(())
    }

    fn fdb(&mut self, ifindex: u32) -> Result<BTreeMap<Mac, Ipv4Addr>, VxlanError> {
        Ok(self
            .vxlan_table()
            .fdb
            .get(&ifindex)
            .cloned()
            .unwrap_or_default())
    }

    fn fdb_replace(&mut self, ifindex: u32, mac: Mac, dst: Ipv4Addr) -> Result<(), VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("fdb_replace", dst.to_string())?;
        t.fdb.entry(ifindex).or_default().insert(mac, dst);
        Ok(())
    }

    fn fdb_delete(&mut self, ifindex: u32, mac: Mac, dst: Ipv4Addr) -> Result<(), VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("fdb_delete", dst.to_string())?;
        t.fdb.entry(ifindex).or_default().remove(&mac);
        Ok(())
    }

    fn neighbours(&mut self, ifindex: u32) -> Result<BTreeMap<Ipv4Addr, Mac>, VxlanError> {
        Ok(self
            .vxlan_table()
            .neighbours
            .get(&ifindex)
            .cloned()
            .unwrap_or_default())
    }

    fn neigh_replace(&mut self, ifindex: u32, ip: Ipv4Addr, mac: Mac) -> Result<(), VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("neigh_replace", ip.to_string())?;
        t.neighbours.entry(ifindex).or_default().insert(ip, mac);
        Ok(())
    }

    fn neigh_delete(&mut self, ifindex: u32, ip: Ipv4Addr) -> Result<(), VxlanError> {
        let mut t = self.vxlan_table();
        t.mutate("neigh_delete", ip.to_string())?;
        t.neighbours.entry(ifindex).or_default().remove(&ip);
        Ok(())
    }
}
