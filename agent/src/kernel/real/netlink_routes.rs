//! The route table over rtnetlink, the real [`RouteIo`]: weir's protocol ([`ROUTE_PROTOCOL`]) in the main
//! table, both families. The driver runs on the loop's thread, so requests run on a small runtime of this
//! type's own, in the network namespace the type was created in.

use std::{collections::BTreeMap, net::IpAddr};

use futures_util::TryStreamExt as _;
use ipnetwork::IpNetwork;
use netlink_packet_route::{
    AddressFamily,
    route::{RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol},
};
use rtnetlink::RouteMessageBuilder;

use crate::kernel::{NextHop, RouteError, RouteIo};
use crate::paths::ROUTE_PROTOCOL;

/// Routes through a netlink socket of the calling thread's namespace.
pub struct NetlinkRoutes {
    runtime: tokio::runtime::Runtime,
    handle: rtnetlink::Handle,
}

fn io_err(op: &'static str, dest: String) -> impl FnOnce(rtnetlink::Error) -> RouteError {
    move |e| RouteError::Netlink {
        op,
        dest,
        source: std::io::Error::other(e.to_string()),
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// A dumped route of weir's protocol as (destination, next hop); `None` for anything else.
fn ours(msg: &RouteMessage) -> Option<(IpNetwork, NextHop)> {
    if msg.header.protocol != RouteProtocol::from(ROUTE_PROTOCOL)
        || msg.header.table != RouteHeader::RT_TABLE_MAIN
    {
        return None;
    }
    let (mut dest, mut gateway, mut oif) = (None, None, None);
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(a) => dest = ip_of(a),
            RouteAttribute::Gateway(a) => gateway = ip_of(a),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    let dest = IpNetwork::new(dest?, msg.header.destination_prefix_length).ok()?;
    let hop = match (msg.header.flags.contains(RouteFlags::Onlink), oif, gateway) {
        (true, Some(ifindex), Some(via)) => NextHop::Device { ifindex, via },
        (_, _, Some(via)) => NextHop::Via(via),
        _ => return None,
    };
    Some((dest, hop))
}

fn message(dest: IpNetwork, hop: NextHop) -> Result<RouteMessage, RouteError> {
    let bad = |e: &dyn std::fmt::Display| RouteError::Netlink {
        op: "build",
        dest: dest.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
    };
    let via = match hop {
        NextHop::Via(via) | NextHop::Device { via, .. } => via,
    };
    let mut builder = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dest.ip(), dest.prefix())
        .map_err(|e| bad(&e))?
        .gateway(via)
        .map_err(|e| bad(&e))?
        .protocol(RouteProtocol::from(ROUTE_PROTOCOL));
    if let NextHop::Device { ifindex, .. } = hop {
        builder = builder.output_interface(ifindex).onlink();
    }
    Ok(builder.build())
}

impl NetlinkRoutes {
    /// Opens a netlink socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, RouteError> {
        let failed = |source: std::io::Error| RouteError::Netlink {
            op: "open a netlink socket for",
            dest: "*".into(),
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
}

impl RouteIo for NetlinkRoutes {
    fn dump(&mut self) -> Result<BTreeMap<IpNetwork, NextHop>, RouteError> {
        let mut routes = BTreeMap::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut query = RouteMessageBuilder::<IpAddr>::new().build();
            query.header.address_family = family;
            let found: Vec<RouteMessage> = self
                .runtime
                .block_on(self.handle.route().get(query).execute().try_collect())
                .map_err(io_err("dump", "*".into()))?;
            routes.extend(found.iter().filter_map(ours));
        }
        Ok(routes)
    }

    fn replace(&mut self, dest: IpNetwork, hop: NextHop) -> Result<(), RouteError> {
        let msg = message(dest, hop)?;
        self.runtime
            .block_on(self.handle.route().add(msg).replace().execute())
            .map_err(io_err("replace", dest.to_string()))
    }

    fn delete(&mut self, dest: IpNetwork, hop: NextHop) -> Result<(), RouteError> {
        let msg = message(dest, hop)?;
        self.runtime
            .block_on(self.handle.route().del(msg).execute())
            .map_err(io_err("delete", dest.to_string()))
    }
}
