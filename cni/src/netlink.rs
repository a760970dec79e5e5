//! Netlink plumbing through `rtnetlink`: veth pairs, link state, addresses, routes and neighbour
//! entries, in whichever namespace the connection was opened in (see `netns`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures_util::TryStreamExt as _;
use netlink_packet_route::{
    address::{AddressAttribute, AddressFlags},
    link::{InfoData, InfoVeth, LinkAttribute, LinkFlags, LinkMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState},
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope},
};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::error::{CniCode, Code};

/// A netlink operation failed.
#[derive(Debug, thiserror::Error)]
#[error("netlink: cannot {op}: {source}")]
pub struct NetlinkError {
    /// What was being done.
    pub op: String,
    /// The cause.
    #[source]
    pub source: rtnetlink::Error,
}

impl CniCode for NetlinkError {
    fn code(&self) -> Code {
        Code::Netlink
    }
}

impl NetlinkError {
    /// The errno, when the kernel answered with one.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match &self.source {
            rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
            _ => None,
        }
    }

    /// True when the object does not exist (ENODEV, ENOENT, ESRCH, EADDRNOTAVAIL).
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::ENODEV | libc::ENOENT | libc::ESRCH | libc::EADDRNOTAVAIL)
        )
    }
}

fn failed(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    let op = op.into();
    move |source| NetlinkError { op, source }
}

/// What CNI needs to know about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    /// Index.
    pub index: u32,
    /// Name.
    pub name: String,
    /// MAC address.
    pub mac: Vec<u8>,
    /// MTU.
    pub mtu: u32,
    /// Administratively up.
    pub up: bool,
}

impl LinkState {
    fn from_message(message: &LinkMessage) -> Self {
        let mut state = Self {
            index: message.header.index,
            name: String::new(),
            mac: Vec::new(),
            mtu: 0,
            up: message.header.flags.contains(LinkFlags::Up),
        };
        for attr in &message.attributes {
            match attr {
                LinkAttribute::IfName(name) => state.name.clone_from(name),
                LinkAttribute::Address(mac) => state.mac.clone_from(mac),
                LinkAttribute::Mtu(mtu) => state.mtu = *mtu,
                _ => {}
            }
        }
        state
    }

    /// The MAC as `aa:bb:…`.
    #[must_use]
    pub fn mac_string(&self) -> String {
        format_mac(&self.mac)
    }
}

/// `aa:bb:cc:dd:ee:ff`.
#[must_use]
pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A route as read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    /// Destination.
    pub dst: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// Gateway.
    pub gateway: Option<IpAddr>,
    /// Output interface.
    pub oif: Option<u32>,
}

/// A neighbour entry as read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeighbourEntry {
    /// Address.
    pub ip: IpAddr,
    /// MAC.
    pub mac: Vec<u8>,
    /// Permanent (static).
    pub permanent: bool,
}

/// A netlink connection in one namespace.
#[derive(Debug, Clone)]
pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// Wraps a connected handle.
    #[must_use]
    pub fn new(handle: Handle) -> Self {
        Self { handle }
    }

    /// A connection in the current thread's namespace.
    pub fn here() -> std::io::Result<Self> {
        let (connection, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(connection);
        Ok(Self::new(handle))
    }

    /// The link called `name`, if there is one.
    pub async fn link(&self, name: &str) -> Result<Option<LinkState>, NetlinkError> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match stream.try_next().await {
            Ok(Some(message)) => Ok(Some(LinkState::from_message(&message))),
            Ok(None) => Ok(None),
            Err(source) => {
                let e = NetlinkError {
                    op: format!("look up link {name}"),
                    source,
                };
                if e.is_not_found() { Ok(None) } else { Err(e) }
            }
        }
    }

    /// Creates a veth pair: `host` here, `peer` in the namespace `peer_netns_fd` with `mtu`
    /// (the host end gets the same MTU). Both ends stay down.
    pub async fn create_veth(
        &self,
        host: &str,
        peer: &str,
        peer_netns_fd: i32,
        mtu: u32,
    ) -> Result<(), NetlinkError> {
        let peer_message = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer.to_owned())
            .mtu(mtu)
            .setns_by_fd(peer_netns_fd)
            .build();
        let message = LinkVeth::new(host, peer)
            .mtu(mtu)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_message)))
            .build();
        self.handle
            .link()
            .add(message)
            .execute()
            .await
            .map_err(failed(format!("create the veth pair {host} / {peer}")))
    }

    /// Brings link `index` up.
    pub async fn set_up(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        let message = LinkUnspec::new_with_index(index).up().build();
        self.handle
            .link()
            .set(message)
            .execute()
            .await
            .map_err(failed(format!("bring {name} up")))
    }

    /// Deletes link `index`; a link already gone is fine.
    pub async fn delete_link(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(source) => {
                let e = NetlinkError {
                    op: format!("delete link {name}"),
                    source,
                };
                if e.is_not_found() { Ok(()) } else { Err(e) }
            }
        }
    }

    /// Adds (or replaces) `ip/prefix` on link `index`; IPv6 addresses skip duplicate address
    /// detection, so they are usable at once.
    pub async fn add_address(
        &self,
        index: u32,
        ip: IpAddr,
        prefix: u8,
    ) -> Result<(), NetlinkError> {
        let mut request = self.handle.address().add(index, ip, prefix).replace();
        if ip.is_ipv6() {
            request
                .message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        request
            .execute()
            .await
            .map_err(failed(format!("add address {ip}/{prefix}")))
    }

    /// The addresses of link `index`.
    pub async fn addresses(&self, index: u32) -> Result<Vec<(IpAddr, u8)>, NetlinkError> {
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        let mut out = Vec::new();
        while let Some(message) = stream.try_next().await.map_err(failed("list addresses"))? {
            for attr in &message.attributes {
                if let AddressAttribute::Address(ip) = attr {
                    out.push((*ip, message.header.prefix_len));
                }
            }
        }
        Ok(out)
    }

    /// Adds (or replaces) a route to `dst/prefix` out of `oif`, via `gateway` when given, with
    /// link scope when there is no gateway.
    pub async fn add_route(
        &self,
        dst: IpAddr,
        prefix: u8,
        gateway: Option<IpAddr>,
        oif: u32,
    ) -> Result<(), NetlinkError> {
        let scope = if gateway.is_some() {
            RouteScope::Universe
        } else {
            RouteScope::Link
        };
        let message = route_message(dst, prefix, gateway, oif, scope);
        let op = match gateway {
            Some(gw) => format!("add route {dst}/{prefix} via {gw}"),
            None => format!("add route {dst}/{prefix}"),
        };
        self.handle
            .route()
            .add(message)
            .replace()
            .execute()
            .await
            .map_err(failed(op))
    }

    /// The main table's routes of one family.
    pub async fn routes(&self, ipv6: bool) -> Result<Vec<RouteEntry>, NetlinkError> {
        let query = if ipv6 {
            RouteMessageBuilder::<Ipv6Addr>::new().build()
        } else {
            RouteMessageBuilder::<Ipv4Addr>::new().build()
        };
        let mut stream = self.handle.route().get(query).execute();
        let mut out = Vec::new();
        while let Some(message) = stream.try_next().await.map_err(failed("list routes"))? {
            if message.header.table != RouteMessage::default().header.table
                && message.header.table != 254
            {
                continue;
            }
            out.push(route_entry(&message, ipv6));
        }
        Ok(out)
    }

    /// Adds (or replaces) a permanent neighbour entry `ip` → `mac` on link `index`.
    pub async fn add_neighbour(
        &self,
        index: u32,
        ip: IpAddr,
        mac: &[u8],
    ) -> Result<(), NetlinkError> {
        self.handle
            .neighbours()
            .add(index, ip)
            .link_layer_address(mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(failed(format!("add neighbour {ip}")))
    }

    /// The neighbour entries of link `index`.
    pub async fn neighbours(&self, index: u32) -> Result<Vec<NeighbourEntry>, NetlinkError> {
        let mut stream = self.handle.neighbours().get().execute();
        let mut out = Vec::new();
        while let Some(message) = stream.try_next().await.map_err(failed("list neighbours"))? {
            if message.header.ifindex != index {
                continue;
            }
            let mut ip = None;
            let mut mac = Vec::new();
            for attr in &message.attributes {
                match attr {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                        ip = Some(IpAddr::V4(*a));
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                        ip = Some(IpAddr::V6(*a));
                    }
                    NeighbourAttribute::LinkLayerAddress(m) => mac.clone_from(m),
                    _ => {}
                }
            }
            if let Some(ip) = ip {
                out.push(NeighbourEntry {
                    ip,
                    mac,
                    permanent: message.header.state == NeighbourState::Permanent,
                });
            }
        }
        Ok(out)
    }
}

fn route_message(
    dst: IpAddr,
    prefix: u8,
    gateway: Option<IpAddr>,
    oif: u32,
    scope: RouteScope,
) -> RouteMessage {
    match dst {
        IpAddr::V4(dst) => {
            let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(dst, prefix)
                .output_interface(oif)
                .scope(scope);
            if let Some(IpAddr::V4(gw)) = gateway {
                b = b.gateway(gw);
            }
            b.build()
        }
        IpAddr::V6(dst) => {
            let mut b = RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(dst, prefix)
                .output_interface(oif)
                .scope(scope);
            if let Some(IpAddr::V6(gw)) = gateway {
                b = b.gateway(gw);
            }
            b.build()
        }
    }
}

fn route_entry(message: &RouteMessage, ipv6: bool) -> RouteEntry {
    let unspecified = if ipv6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let mut entry = RouteEntry {
        dst: unspecified,
        prefix: message.header.destination_prefix_length,
        gateway: None,
        oif: None,
    };
    for attr in &message.attributes {
        match attr {
            RouteAttribute::Destination(a) => entry.dst = route_ip(a).unwrap_or(unspecified),
            RouteAttribute::Gateway(a) => entry.gateway = route_ip(a),
            RouteAttribute::Oif(i) => entry.oif = Some(*i),
            _ => {}
        }
    }
    entry
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}
