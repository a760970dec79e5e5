//! Watches links and addresses over rtnetlink: workload links (`weir*`) as they appear and go, and
//! the node's own addresses (which carry the host identity): first a full dump (then `Synced`),
//! then live events.

use futures_util::{StreamExt as _, TryStreamExt as _};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkMessage},
};
use rtnetlink::{MulticastGroup, packet_core::NetlinkPayload};
use tokio::sync::mpsc;

/// A change of workload links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// A workload link exists with this index.
    Up {
        /// Name.
        ifname: String,
        /// Index.
        ifindex: u32,
        /// Administratively up (`IFF_UP`).
        up: bool,
    },
    /// A workload link is gone.
    Gone {
        /// Name.
        ifname: String,
    },
    /// A node address appeared on (or left) interface `ifindex`.
    Address {
        /// Interface.
        ifindex: u32,
        /// Address.
        addr: std::net::IpAddr,
        /// True when added, false when removed.
        present: bool,
    },
    /// The initial dump is complete.
    Synced,
}

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

/// Errors of the watcher.
#[derive(Debug, thiserror::Error)]
pub enum LinkWatchError {
    /// The netlink socket could not be opened.
    #[error("cannot open a netlink socket to watch links: {0}")]
    Socket(#[source] std::io::Error),
    /// The dump failed.
    #[error("cannot list links: {0}")]
    Dump(#[source] rtnetlink::Error),
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

/// Starts watching (in the caller's network namespace) and sends events to `tx` until it closes.
pub async fn watch(tx: mpsc::UnboundedSender<LinkEvent>) -> Result<(), LinkWatchError> {
    let (conn, handle, mut messages) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
    ])
    .map_err(LinkWatchError::Socket)?;
    tokio::spawn(conn);
    let mut dump = handle.link().get().execute();
    while let Some(msg) = dump.try_next().await.map_err(LinkWatchError::Dump)? {
        if let Some(name) = ifname(&msg).filter(|n| is_workload(n)) {
            let _ = tx.send(LinkEvent::Up {
                ifname: name.to_owned(),
                ifindex: msg.header.index,
                up: is_up(&msg),
            });
        }
    }
    let mut addrs = handle.address().get().execute();
    while let Some(msg) = addrs.try_next().await.map_err(LinkWatchError::Dump)? {
        if let Some(event) = address(&msg, true) {
            let _ = tx.send(event);
        }
    }
    if tx.send(LinkEvent::Synced).is_err() {
        return Ok(());
    }
    while let Some((message, _)) = messages.next().await {
        let event = match message.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(msg)) => ifname(&msg)
                .filter(|n| is_workload(n))
                .map(|n| LinkEvent::Up {
                    ifname: n.to_owned(),
                    ifindex: msg.header.index,
                    up: is_up(&msg),
                }),
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(msg)) => {
                address(&msg, true)
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(msg)) => {
                address(&msg, false)
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(msg)) => ifname(&msg)
                .filter(|n| is_workload(n))
                .map(|n| LinkEvent::Gone {
                    ifname: n.to_owned(),
                }),
            _ => None,
        };
        if let Some(event) = event
            && tx.send(event).is_err()
        {
            break;
        }
    }
    Ok(())
}
