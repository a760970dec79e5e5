//! Watches links and addresses over rtnetlink: workload links (`weir*`) as they appear and go, and
//! the node's own addresses (which carry the host identity): first a full dump (then `Synced`),
//! then live events: the real [`LinkIo`] of the kernel seam (`crate::kernel`), whose events
//! `link_source` turns into the loop's commands. The same socket hears the deletions that may undo
//! weir's work from outside (`RTM_DELTFILTER`, `RTM_DELQDISC`, `RTM_DELROUTE` of weir's protocol,
//! `RTM_DELNEIGH`): each becomes a [`LinkEvent::Drift`], and the loop reads that part back at once.

use futures_util::{StreamExt as _, TryStreamExt as _, future::BoxFuture};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkMessage},
};
use rtnetlink::{MulticastGroup, packet_core::NetlinkPayload};

use crate::kernel::{Drift, LinkEvent, LinkIo, LinkWatch, LinkWatchError};

fn address(
    msg: &netlink_packet_route::address::AddressMessage,
    present: bool,
) -> Option<LinkEvent> {
    use netlink_packet_route::address::AddressAttribute;
    let addr = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let addr = addr.or_else(|| {
        msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        })
    })?;
    Some(LinkEvent::Address {
        ifindex: msg.header.index,
        addr,
        present,
    })
}

fn ifname(msg: &LinkMessage) -> Option<&str> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(name) => Some(name.as_str()),
        _ => None,
    })
}

fn is_up(msg: &LinkMessage) -> bool {
    msg.header
        .flags
        .contains(netlink_packet_route::link::LinkFlags::Up)
}

fn is_workload(name: &str) -> bool {
    name.starts_with(maps_schema::programs::WORKLOAD_LINK_PREFIX)
}

/// The real [`LinkIo`]: rtnetlink in the agent's network namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct Netlink;

fn event(message: RouteNetlinkMessage) -> Option<LinkEvent> {
    match message {
        RouteNetlinkMessage::NewLink(msg) => {
            ifname(&msg)
                .filter(|n| is_workload(n))
                .map(|n| LinkEvent::Up {
                    ifname: n.to_owned(),
                    ifindex: msg.header.index,
                    up: is_up(&msg),
                })
        }
        RouteNetlinkMessage::NewAddress(msg) => address(&msg, true),
        RouteNetlinkMessage::DelAddress(msg) => address(&msg, false),
        RouteNetlinkMessage::DelTrafficFilter(msg)
        | RouteNetlinkMessage::DelQueueDiscipline(msg) => u32::try_from(msg.header.index)
            .ok()
            .map(|ifindex| LinkEvent::Drift(Drift::Tc { ifindex })),
        RouteNetlinkMessage::DelRoute(msg) => (msg.header.protocol
            == netlink_packet_route::route::RouteProtocol::from(crate::paths::ROUTE_PROTOCOL))
        .then_some(LinkEvent::Drift(Drift::Route)),
        // weir's forwarding and neighbour entries are permanent; the kernel's own garbage
        // collection removes only the others. A permanent neighbour entry deleted with `ip neigh
        // del` is announced in state `FAILED` (as a collected entry may be): taken too, since the
        // read-back it triggers is cheap and finds whether it was weir's.
        RouteNetlinkMessage::DelNeighbour(msg)
            if matches!(
                msg.header.state,
                netlink_packet_route::neighbour::NeighbourState::Permanent
                    | netlink_packet_route::neighbour::NeighbourState::Failed
            ) =>
        {
            Some(LinkEvent::Drift(Drift::Neighbour {
                ifindex: msg.header.ifindex,
            }))
        }
        RouteNetlinkMessage::DelLink(msg) => {
            ifname(&msg)
                .filter(|n| is_workload(n))
                .map(|n| LinkEvent::Gone {
                    ifname: n.to_owned(),
                })
        }
        _ => None,
    }
}

impl LinkIo for Netlink {
    fn watch(&self) -> BoxFuture<'_, Result<LinkWatch, LinkWatchError>> {
        Box::pin(async {
            let (conn, handle, messages) = rtnetlink::new_multicast_connection(&[
                MulticastGroup::Link,
                MulticastGroup::Ipv4Ifaddr,
                MulticastGroup::Ipv6Ifaddr,
                MulticastGroup::Tc,
                MulticastGroup::Ipv4Route,
                MulticastGroup::Ipv6Route,
                MulticastGroup::Neigh,
            ])
            .map_err(LinkWatchError::Socket)?;
            tokio::spawn(conn);
            let mut dump = Vec::new();
            let mut links = handle.link().get().execute();
            while let Some(msg) = links.try_next().await.map_err(LinkWatchError::Dump)? {
                if let Some(name) = ifname(&msg).filter(|n| is_workload(n)) {
                    dump.push(LinkEvent::Up {
                        ifname: name.to_owned(),
                        ifindex: msg.header.index,
                        up: is_up(&msg),
                    });
                }
            }
            let mut addrs = handle.address().get().execute();
            while let Some(msg) = addrs.try_next().await.map_err(LinkWatchError::Dump)? {
                dump.extend(address(&msg, true));
            }
            // The stream holds the handle: the connection lives as long as the watch.
            let events = messages
                .filter_map(move |(message, _)| {
                    let _connection = &handle;
                    std::future::ready(match message.payload {
                        NetlinkPayload::InnerMessage(m) => event(m).map(Ok),
                        _ => None,
                    })
                })
                .boxed();
            Ok(LinkWatch { dump, events })
        })
    }
}
