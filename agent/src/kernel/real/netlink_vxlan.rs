//! The VXLAN device and its entries over rtnetlink, the real [`VxlanIo`]: `ip -d link` (the device),
//! `ip addr` (its VTEP address), `bridge fdb` (forwarding entries, `self permanent` with a `dst`) and
//! `ip neigh` (permanent neighbour entries). Requests run on a small runtime of this type's own, in the
//! network namespace the type was created in (the driver runs on the loop's thread).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use futures_util::TryStreamExt as _;
use ipnetwork::Ipv4Network;
use netlink_packet_route::{
    AddressFamily,
    address::{AddressAttribute, AddressMessage},
    link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
    neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
    },
};
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVxlan};

use crate::kernel::{Mac, Underlay, VxlanDevice, VxlanError, VxlanIo, VxlanLink};

/// The VXLAN side through a netlink socket of the calling thread's namespace.
pub struct NetlinkVxlan {
    runtime: tokio::runtime::Runtime,
    handle: rtnetlink::Handle,
}

fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

fn failed(
    op: &'static str,
    what: impl Into<String>,
) -> impl FnOnce(rtnetlink::Error) -> VxlanError {
    let what = what.into();
    move |e| VxlanError::Netlink {
        op,
        what,
        source: errno(&e).map_or_else(
            || std::io::Error::other(e.to_string()),
            std::io::Error::from_raw_os_error,
        ),
    }
}

fn mac_of(bytes: &[u8]) -> Option<Mac> {
    bytes.try_into().ok()
}

/// The link's index, up flag and, when it is a VXLAN device, its attributes and learning flag.
fn parse_link(msg: &LinkMessage) -> VxlanLink {
    let (mut mtu, mut mac, mut data, mut is_vxlan) = (0, None, Vec::new(), false);
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::Mtu(m) => mtu = *m,
            LinkAttribute::Address(a) => mac = mac_of(a),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(InfoKind::Vxlan) => is_vxlan = true,
                        LinkInfo::Data(InfoData::Vxlan(d)) => data.clone_from(d),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let mut device = VxlanDevice {
        vni: 0,
        port: 0,
        underlay_ifindex: 0,
        local: Ipv4Addr::UNSPECIFIED,
        mac: mac.unwrap_or_default(),
        mtu,
    };
    let mut learning = true;
    for d in &data {
        match d {
            InfoVxlan::Id(v) => device.vni = *v,
            InfoVxlan::Port(p) => device.port = *p,
            InfoVxlan::Link(i) => device.underlay_ifindex = *i,
            InfoVxlan::Local(a) => device.local = *a,
            InfoVxlan::Learning(l) => learning = *l,
            _ => {}
        }
    }
    VxlanLink {
        ifindex: msg.header.index,
        device: is_vxlan.then_some(device),
        up: msg.header.flags.contains(LinkFlags::Up),
        learning,
    }
}

impl NetlinkVxlan {
    /// Opens a netlink socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, VxlanError> {
        let failed = |source: std::io::Error| VxlanError::Netlink {
            op: "open a netlink socket for",
            what: "the VXLAN device".into(),
            source,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(failed)?;
        let (conn, handle, _) = runtime
            .block_on(async { rtnetlink::new_connection() })
            .map_err(failed)?;
        runtime.spawn(conn);
        Ok(Self { runtime, handle })
    }

    /// The link named `name`, `None` when there is none.
    fn link(&self, name: &str) -> Result<Option<LinkMessage>, VxlanError> {
        let found: Result<Vec<LinkMessage>, _> = self.runtime.block_on(
            self.handle
                .link()
                .get()
                .match_name(name.to_owned())
                .execute()
                .try_collect(),
        );
        match found {
            Ok(mut links) => Ok(links.pop()),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(failed("read", format!("link {name}"))(e)),
        }
    }

    fn address_messages(&self, ifindex: u32) -> Result<Vec<AddressMessage>, VxlanError> {
        let all: Vec<AddressMessage> = self
            .runtime
            .block_on(
                self.handle
                    .address()
                    .get()
                    .set_link_index_filter(ifindex)
                    .execute()
                    .try_collect(),
            )
            .map_err(failed("read the addresses of", format!("link {ifindex}")))?;
        Ok(all
            .into_iter()
            .filter(|m| m.header.index == ifindex && m.header.family == AddressFamily::Inet)
            .collect())
    }

    fn neighbour_messages(
        &self,
        family: AddressFamily,
        ifindex: u32,
    ) -> Result<Vec<NeighbourMessage>, VxlanError> {
        let all: Vec<NeighbourMessage> = self
            .runtime
            .block_on(
                self.handle
                    .neighbours()
                    .get()
                    .set_address_family(family)
                    .execute()
                    .try_collect(),
            )
            .map_err(failed(
                "read the neighbour entries of",
                format!("link {ifindex}"),
            ))?;
        Ok(all
            .into_iter()
            .filter(|m| m.header.ifindex == ifindex && m.header.state == NeighbourState::Permanent)
            .collect())
    }
}

fn v4_of(a: &AddressMessage) -> Option<Ipv4Network> {
    a.attributes.iter().find_map(|attr| match attr {
        AddressAttribute::Address(IpAddr::V4(v)) => Ipv4Network::new(*v, a.header.prefix_len).ok(),
        _ => None,
    })
}

/// A neighbour's IPv4 destination. Bridge-family (forwarding) entries carry it as raw bytes: the parser only
/// knows the address family of the message, which is `AF_BRIDGE` there.
fn neighbour_dst(m: &NeighbourMessage) -> Option<Ipv4Addr> {
    m.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => Some(*v),
        NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
            <[u8; 4]>::try_from(b.as_slice()).ok().map(Ipv4Addr::from)
        }
        _ => None,
    })
}

fn neighbour_mac(m: &NeighbourMessage) -> Option<Mac> {
    m.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(l) => mac_of(l),
        _ => None,
    })
}

impl VxlanIo for NetlinkVxlan {
    fn underlay(&mut self, name: &str) -> Result<Option<Underlay>, VxlanError> {
        Ok(self.link(name)?.map(|m| Underlay {
            ifindex: m.header.index,
            mtu: m
                .attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::Mtu(m) => Some(*m),
                    _ => None,
                })
                .unwrap_or(0),
        }))
    }

    fn device_with_address(&mut self, address: Ipv4Addr) -> Result<Option<String>, VxlanError> {
        let all: Vec<AddressMessage> = self
            .runtime
            .block_on(self.handle.address().get().execute().try_collect())
            .map_err(failed("read the addresses of", "every link".to_owned()))?;
        let Some(ifindex) = all
            .iter()
            .find(|m| v4_of(m).is_some_and(|n| n.ip() == address))
            .map(|m| m.header.index)
        else {
            return Ok(None);
        };
        let links: Vec<LinkMessage> = self
            .runtime
            .block_on(
                self.handle
                    .link()
                    .get()
                    .match_index(ifindex)
                    .execute()
                    .try_collect(),
            )
            .map_err(failed("read", format!("link {ifindex}")))?;
        Ok(links.iter().find_map(|l| {
            l.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(n) => Some(n.clone()),
                _ => None,
            })
        }))
    }

    fn vxlan(&mut self, name: &str) -> Result<Option<VxlanLink>, VxlanError> {
        Ok(self.link(name)?.as_ref().map(parse_link))
    }

    fn create(&mut self, name: &str, d: &VxlanDevice) -> Result<u32, VxlanError> {
        let msg = LinkVxlan::new(name, d.vni)
            .dev(d.underlay_ifindex)
            .port(d.port)
            .local(d.local)
            .learning(false)
            .mtu(d.mtu)
            .address(d.mac.to_vec())
            .up()
            .build();
        self.runtime
            .block_on(self.handle.link().add(msg).execute())
            .map_err(failed("create the VXLAN device", name))?;
        self.link(name)?
            .map(|m| m.header.index)
            .ok_or_else(|| VxlanError::Netlink {
                op: "find the created VXLAN device",
                what: name.to_owned(),
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
            })
    }

    fn delete(&mut self, ifindex: u32) -> Result<(), VxlanError> {
        self.runtime
            .block_on(self.handle.link().del(ifindex).execute())
            .map_err(failed("delete", format!("link {ifindex}")))
    }

    fn set_mtu(&mut self, ifindex: u32, mtu: u32) -> Result<(), VxlanError> {
        let msg = LinkUnspec::new_with_index(ifindex).mtu(mtu).build();
        self.runtime
            .block_on(self.handle.link().set(msg).execute())
            .map_err(failed("set the MTU of", format!("link {ifindex}")))
    }

    fn set_up(&mut self, ifindex: u32) -> Result<(), VxlanError> {
        let msg = LinkMessageBuilder::<LinkUnspec>::default()
            .index(ifindex)
            .up()
            .build();
        self.runtime
            .block_on(self.handle.link().set(msg).execute())
            .map_err(failed("set up", format!("link {ifindex}")))
    }

    fn addresses(&mut self, ifindex: u32) -> Result<BTreeSet<Ipv4Network>, VxlanError> {
        Ok(self
            .address_messages(ifindex)?
            .iter()
            .filter_map(v4_of)
            .collect())
    }

    fn add_address(&mut self, ifindex: u32, addr: Ipv4Network) -> Result<(), VxlanError> {
        self.runtime
            .block_on(
                self.handle
                    .address()
                    .add(ifindex, IpAddr::V4(addr.ip()), addr.prefix())
                    .replace()
                    .execute(),
            )
            .map_err(failed("add address", addr.to_string()))
    }

    fn delete_address(&mut self, ifindex: u32, addr: Ipv4Network) -> Result<(), VxlanError> {
        for msg in self.address_messages(ifindex)? {
            if v4_of(&msg) == Some(addr) {
                self.runtime
                    .block_on(self.handle.address().del(msg).execute())
                    .map_err(failed("delete address", addr.to_string()))?;
            }
        }
        Ok(())
    }

    fn fdb(&mut self, ifindex: u32) -> Result<BTreeMap<Mac, Ipv4Addr>, VxlanError> {
        Ok(self
            .neighbour_messages(AddressFamily::Bridge, ifindex)?
            .iter()
            .filter_map(|m| Some((neighbour_mac(m)?, neighbour_dst(m)?)))
            .collect())
    }

    fn fdb_replace(&mut self, ifindex: u32, mac: Mac, dst: Ipv4Addr) -> Result<(), VxlanError> {
        self.runtime
            .block_on(
                self.handle
                    .neighbours()
                    .add_bridge(ifindex, &mac)
                    .destination(IpAddr::V4(dst))
                    .flags(NeighbourFlags::Own)
                    .replace()
                    .execute(),
            )
            .map_err(failed("write the forwarding entry to", dst.to_string()))
    }

    fn fdb_delete(&mut self, ifindex: u32, mac: Mac, dst: Ipv4Addr) -> Result<(), VxlanError> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Bridge;
        msg.header.ifindex = ifindex;
        msg.header.state = NeighbourState::Permanent;
        msg.header.flags = NeighbourFlags::Own;
        msg.attributes = vec![
            NeighbourAttribute::LinkLayerAddress(mac.to_vec()),
            NeighbourAttribute::Destination(NeighbourAddress::Inet(dst)),
        ];
        self.runtime
            .block_on(self.handle.neighbours().del(msg).execute())
            .map_err(failed("delete the forwarding entry to", dst.to_string()))
    }

    fn neighbours(&mut self, ifindex: u32) -> Result<BTreeMap<Ipv4Addr, Mac>, VxlanError> {
        Ok(self
            .neighbour_messages(AddressFamily::Inet, ifindex)?
            .iter()
            .filter_map(|m| Some((neighbour_dst(m)?, neighbour_mac(m)?)))
            .collect())
    }

    fn neigh_replace(&mut self, ifindex: u32, ip: Ipv4Addr, mac: Mac) -> Result<(), VxlanError> {
        self.runtime
            .block_on(
                self.handle
                    .neighbours()
                    .add(ifindex, IpAddr::V4(ip))
                    .link_layer_address(&mac)
                    .replace()
                    .execute(),
            )
            .map_err(failed("write the neighbour entry of", ip.to_string()))
    }

    fn neigh_delete(&mut self, ifindex: u32, ip: Ipv4Addr) -> Result<(), VxlanError> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.ifindex = ifindex;
        msg.attributes = vec![NeighbourAttribute::Destination(NeighbourAddress::Inet(ip))];
        self.runtime
            .block_on(self.handle.neighbours().del(msg).execute())
            .map_err(failed("delete the neighbour entry of", ip.to_string()))
    }
}
