//! The agent's node routing at start: with an `etcd:` datastore, this node's record (its addresses from
//! `--node-address`, or the source address of its route to etcd) and the route driver in the node; under
//! `--source kubernetes` with a shared datastore (etcd or Kubernetes), the route driver with the Node
//! objects as records (kubelet writes this node's); with a node-local datastore, nothing (one node).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _, UdpSocket};

use ipam::{model::NodeRecord, store::AnyStore};

use super::{NodeSource, routing::NodeRoutes};
use crate::{
    config::{Config, RoutingMode, SourceMode},
    dataplane::{netlink_routes::NetlinkRoutes, routes::RouteDriver, routes::RouteError},
    node::Node,
};

/// Why node routing could not start.
#[derive(Debug, thiserror::Error)]
pub enum RoutingSetupError {
    /// `--routing vxlan` has no driver in this build.
    #[error("--routing vxlan (WEIR_ROUTING) is not available in this build: use --routing native")]
    VxlanUnavailable,
    /// No address was given and none could be found.
    #[error(
        "cannot find this node's address from its route to etcd at {endpoint}: {source}; pass --node-address"
    )]
    NoAddress {
        /// The etcd endpoint.
        endpoint: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Opening the route table panicked.
    #[error("opening the route table's netlink socket panicked; see the log above")]
    OpenPanicked,
    /// The route table could not be opened.
    #[error(transparent)]
    Routes(#[from] RouteError),
}

/// Where the routed node's records come from, for the nodes source to start.
#[derive(Debug)]
pub enum NodeRecords {
    /// This node's record in etcd (renewed by `sources::nodes`).
    Etcd(NodeRecord),
    /// The Node objects (`sources::kube::nodes`).
    Kubernetes,
}

/// Sets up routing on `node` when `store` is shared: a shared etcd, or under `--source kubernetes` etcd or
/// the Kubernetes datastore; returns where the node records come from.
pub fn routing(
    config: &Config,
    store: &AnyStore,
    node: &mut Node,
) -> Result<Option<NodeRecords>, RoutingSetupError> {
    let kube = config.source == SourceMode::Kubernetes;
    if kube && let Err(e) = super::store::shared(store) {
        tracing::info!(reason = %e, "node routing off");
        return Ok(None);
    }
    if !kube && !matches!(store, AnyStore::Etcd(_)) {
        return Ok(None);
    }
    if config.routing == RoutingMode::Vxlan {
        return Err(RoutingSetupError::VxlanUnavailable);
    }
    if kube {
        install(config, node, NodeSource::Kubernetes, &[])?;
        return Ok(Some(NodeRecords::Kubernetes));
    }
    let addresses = if config.node_addresses.is_empty() {
        let endpoint = first_etcd_endpoint(&config.datastore);
        vec![source_address(&endpoint)?]
    } else {
        config.node_addresses.clone()
    };
    install(config, node, NodeSource::Etcd, &addresses)?;
    Ok(Some(NodeRecords::Etcd(NodeRecord {
        name: config.node.clone(),
        addresses,
        labels: config.node_labels.iter().cloned().collect(),
        heartbeat: 0,
        expiry: config.node_expiry.as_secs(),
    })))
}

/// Puts the route driver in `node`, its records from `source`.
fn install(
    config: &Config,
    node: &mut Node,
    source: NodeSource,
    addresses: &[IpAddr],
) -> Result<(), RoutingSetupError> {
    // The route table's own runtime cannot start inside the agent's: open it on a thread of its own (same
    // network namespace); the loop's thread, outside any runtime, uses it from then on.
    let routes = std::thread::scope(|scope| scope.spawn(NetlinkRoutes::open).join())
        .map_err(|_| RoutingSetupError::OpenPanicked)??;
    let driver = RouteDriver::new(Box::new(routes));
    node.set_routing(NodeRoutes::new(&config.node, driver).with_source(source));
    tracing::info!(node = %config.node, addresses = ?addresses, routing = %config.routing, %source, "node routing on");
    Ok(())
}

/// `host:port` of the first URL of `etcd:URL[,URL…]`.
fn first_etcd_endpoint(datastore: &str) -> String {
    let urls = datastore.strip_prefix("etcd:").unwrap_or(datastore);
    let first = urls.split(',').next().unwrap_or_default();
    let rest = first.split_once("://").map_or(first, |(_, r)| r);
    let host_port = rest.split('/').next().unwrap_or_default();
    if host_port.contains(':') && !host_port.ends_with(']') {
        host_port.to_owned()
    } else {
        format!("{host_port}:2379")
    }
}

/// The source address this node uses towards `endpoint` (a connected UDP socket: nothing is sent).
fn source_address(endpoint: &str) -> Result<IpAddr, RoutingSetupError> {
    let failed = |source| RoutingSetupError::NoAddress {
        endpoint: endpoint.to_owned(),
        source,
    };
    let target: SocketAddr = endpoint
        .to_socket_addrs()
        .map_err(failed)?
        .next()
        .ok_or_else(|| failed(std::io::Error::other("the name resolves to no address")))?;
    let bind: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .map_err(|_| failed(std::io::Error::other("bad bind address")))?;
    let socket = UdpSocket::bind(bind).map_err(failed)?;
    socket.connect(target).map_err(failed)?;
    let local = socket.local_addr().map_err(failed)?.ip();
    if local.is_loopback() {
        return Err(failed(std::io::Error::other(
            "etcd is reached over loopback, which other nodes cannot route to",
        )));
    }
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_endpoint_is_found_in_the_datastore_spec() {
        assert_eq!(
            first_etcd_endpoint("etcd:http://10.0.0.1:2379,http://10.0.0.2:2379"),
            "10.0.0.1:2379"
        );
        assert_eq!(
            first_etcd_endpoint("etcd:https://etcd.example/"),
            "etcd.example:2379"
        );
        assert_eq!(first_etcd_endpoint("etcd:[fd00::1]:2379"), "[fd00::1]:2379");
    }
}
