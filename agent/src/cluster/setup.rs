//! The agent's node routing at start: with an `etcd:` datastore, this node's record (its addresses from
//! `--node-address`, or the source address of its route to etcd) and the route driver for the node; under
//! `--source kubernetes` with a shared datastore (etcd or Kubernetes), the route driver with the Node
//! objects as records (kubelet writes this node's); with a node-local datastore, nothing (one node).
//! `--routing vxlan` also finds the VXLAN device's underlay (`--vxlan-underlay`, or the device holding
//! this node's IPv4 address) and the pods' MTU (the underlay's less the encapsulation), which the conflist
//! carries.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs as _, UdpSocket};

use ipam::{model::NodeRecord, store::AnyStore};

use super::{NodeSource, routing::NodeRoutes};
use crate::{
    config::{Config, ConfigError, RoutingMode, SourceMode},
    dataplane::{
        node_routes::{self, NodeRoutes as Routes},
        routes::RouteError,
        vxlan::{VXLAN_OVERHEAD_V4, VxlanError},
    },
    kernel::real::{netlink_routes::NetlinkRoutes, netlink_vxlan::NetlinkVxlan},
};

/// Why node routing could not start.
#[derive(Debug, thiserror::Error)]
pub enum RoutingSetupError {
    /// vxlan mode without an IPv4 address of this node to find the underlay by.
    #[error(
        "--routing vxlan needs this node's IPv4 address to find the VXLAN underlay device: pass --node-address with an IPv4 address or --vxlan-underlay DEVICE"
    )]
    NoUnderlayAddress,
    /// No device holds this node's address.
    #[error(
        "no device holds this node's address {address}, the VXLAN underlay by default: pass --vxlan-underlay DEVICE or the right --node-address"
    )]
    NoUnderlayDevice {
        /// The node's address.
        address: Ipv4Addr,
    },
    /// The underlay device does not exist.
    #[error(
        "the VXLAN underlay device {device} does not exist: fix --vxlan-underlay (WEIR_VXLAN_UNDERLAY)"
    )]
    UnderlayMissing {
        /// The device.
        device: String,
    },
    /// The underlay's MTU leaves no room for the encapsulation.
    #[error(
        "the VXLAN underlay device {device} has MTU {mtu}, too small for VXLAN's {VXLAN_OVERHEAD_V4} bytes: raise it or use --routing native"
    )]
    UnderlayMtu {
        /// The device.
        device: String,
        /// Its MTU.
        mtu: u32,
    },
    /// A VXLAN flag's value cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The VXLAN side of netlink failed.
    #[error(transparent)]
    Vxlan(#[from] VxlanError),
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
    /// Opening the netlink sockets panicked.
    #[error(
        "opening the route table's or the VXLAN device's netlink socket panicked; see the log above"
    )]
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

/// Node routing as set up: the routing to give the node, where the records come from, and the pods' MTU
/// when routing lowers it.
pub struct Routing {
    /// The route driver over the cluster's nodes, for `control::node::Node::set_routing`.
    pub routes: NodeRoutes,
    /// Where the node records come from.
    pub records: NodeRecords,
    /// The MTU the conflist gives pods (vxlan mode: the VXLAN device's), `None` for weir-cni's default.
    pub pod_mtu: Option<u32>,
    /// The device holding this node's first IPv4 address (what other nodes' pod traffic arrives on in
    /// native mode), when one does.
    pub underlay: Option<String>,
}

/// Sets up the node's routing when `store` is shared: a shared etcd, or under `--source kubernetes` etcd or
/// the Kubernetes datastore; returns the routing, where the node records come from and the pods' MTU.
pub fn routing(config: &Config, store: &AnyStore) -> Result<Option<Routing>, RoutingSetupError> {
    let kube = config.source == SourceMode::Kubernetes;
    if kube && let Err(e) = super::store::shared(store) {
        tracing::info!(reason = %e, "node routing off");
        return Ok(None);
    }
    if !kube && !matches!(store, AnyStore::Etcd(_)) {
        return Ok(None);
    }
    if kube {
        // This node's own address (the VXLAN underlay's, the host-routing underlay's): the flag's, else its
        // source address towards etcd when etcd is the datastore; otherwise unknown here (its Node object
        // names it to the other nodes).
        let addresses = if config.node_addresses.is_empty() && matches!(store, AnyStore::Etcd(_)) {
            vec![source_address(&first_etcd_endpoint(&config.datastore))?]
        } else {
            config.node_addresses.clone()
        };
        let (routes, pod_mtu, underlay) = install(config, NodeSource::Kubernetes, &addresses)?;
        return Ok(Some(Routing {
            routes,
            records: NodeRecords::Kubernetes,
            pod_mtu,
            underlay,
        }));
    }
    let addresses = if config.node_addresses.is_empty() {
        let endpoint = first_etcd_endpoint(&config.datastore);
        vec![source_address(&endpoint)?]
    } else {
        config.node_addresses.clone()
    };
    let (routes, pod_mtu, underlay) = install(config, NodeSource::Etcd, &addresses)?;
    Ok(Some(Routing {
        routes,
        records: NodeRecords::Etcd(NodeRecord {
            name: config.node.clone(),
            addresses,
            labels: config.node_labels.iter().cloned().collect(),
            heartbeat: 0,
            expiry: config.node_expiry.as_secs(),
        }),
        pod_mtu,
        underlay,
    }))
}

/// The node's routing (its records from `source`, this node's `addresses` if known), the pods' MTU and the
/// device holding this node's first IPv4 address.
fn install(
    config: &Config,
    source: NodeSource,
    addresses: &[IpAddr],
) -> Result<(NodeRoutes, Option<u32>, Option<String>), RoutingSetupError> {
    // The netlink sockets' own runtimes cannot start inside the agent's: open and query them on a thread of
    // its own (same network namespace); the loop's thread, outside any runtime, uses them from then on.
    let (routes, vxlan, mode, pod_mtu, underlay) = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let routes = NetlinkRoutes::open()?;
                let mut vxlan = NetlinkVxlan::open()?;
                let (mode, pod_mtu) = match config.routing {
                    RoutingMode::Native => (node_routes::RoutingMode::Native, None),
                    RoutingMode::Vxlan => {
                        let (c, mtu) = vxlan_setup(config, addresses, &mut vxlan)?;
                        (node_routes::RoutingMode::Vxlan(c), Some(mtu))
                    }
                };
                let underlay = match super::routing::vtep_of(addresses) {
                    Some(address) => {
                        crate::kernel::VxlanIo::device_with_address(&mut vxlan, address)?
                    }
                    None => None,
                };
                Ok::<_, RoutingSetupError>((routes, vxlan, mode, pod_mtu, underlay))
            })
            .join()
    })
    .map_err(|_| RoutingSetupError::OpenPanicked)??;
    let device = Some(config.vxlan.device.clone());
    let routes = Routes::new(mode, Box::new(routes), Box::new(vxlan), device);
    let node_routes = NodeRoutes::new(&config.node, routes).with_source(source);
    tracing::info!(node = %config.node, addresses = ?addresses, routing = %config.routing, %source, ?pod_mtu, ?underlay, "node routing on");
    Ok((node_routes, pod_mtu, underlay))
}

/// The VXLAN device's settings (its underlay: `--vxlan-underlay`, or the device holding this node's first
/// IPv4 address) and the pods' MTU (the underlay's less the encapsulation).
fn vxlan_setup(
    config: &Config,
    addresses: &[IpAddr],
    io: &mut dyn crate::kernel::VxlanIo,
) -> Result<(crate::dataplane::vxlan::VxlanConfig, u32), RoutingSetupError> {
    let found = match &config.vxlan.underlay {
        Some(_) => None,
        None => {
            let address =
                super::routing::vtep_of(addresses).ok_or(RoutingSetupError::NoUnderlayAddress)?;
            Some(
                io.device_with_address(address)?
                    .ok_or(RoutingSetupError::NoUnderlayDevice { address })?,
            )
        }
    };
    let vxlan = config.vxlan.validate(found.as_deref())?;
    let underlay =
        io.underlay(&vxlan.underlay)?
            .ok_or_else(|| RoutingSetupError::UnderlayMissing {
                device: vxlan.underlay.clone(),
            })?;
    let mtu = underlay
        .mtu
        .checked_sub(VXLAN_OVERHEAD_V4)
        .filter(|m| *m >= 68)
        .ok_or_else(|| RoutingSetupError::UnderlayMtu {
            device: vxlan.underlay.clone(),
            mtu: underlay.mtu,
        })?;
    Ok((vxlan, mtu))
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
    use clap::Parser as _;

    use super::*;
    use crate::kernel::{Underlay, fake::FakeKernel};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        agent: crate::config::AgentArgs,
    }

    fn config(extra: &[&str]) -> Config {
        let argv = ["weir", "--node", "n1", "--routing", "vxlan"];
        Cli::parse_from(argv.iter().chain(extra))
            .agent
            .validate()
            .expect("valid")
    }

    fn kernel() -> FakeKernel {
        let k = FakeKernel::default();
        let mut t = k.vxlan_table();
        t.underlays.insert(
            "eth0".into(),
            Underlay {
                ifindex: 2,
                mtu: 1500,
            },
        );
        t.underlays.insert(
            "tiny".into(),
            Underlay {
                ifindex: 3,
                mtu: 100,
            },
        );
        t.underlay_addresses
            .insert("192.0.2.1".parse().expect("ip"), "eth0".into());
        drop(t);
        k
    }

    fn addrs(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|a| a.parse().expect("ip")).collect()
    }

    #[test]
    fn the_underlay_is_the_device_of_the_nodes_ipv4_address_and_pods_get_its_mtu_less_50() {
        let k = kernel();
        let (vx, mtu) = vxlan_setup(
            &config(&[]),
            &addrs(&["2001:db8::1", "192.0.2.1"]),
            &mut k.clone(),
        )
        .expect("found");
        assert_eq!(
            (vx.underlay.as_str(), mtu),
            ("eth0", 1500 - VXLAN_OVERHEAD_V4)
        );
        assert_eq!(vx.device, crate::paths::DEFAULT_VXLAN_DEVICE);
        let (vx, _) = vxlan_setup(
            &config(&["--vxlan-underlay", "eth0", "--vxlan-vni", "5"]),
            &[],
            &mut k.clone(),
        )
        .expect("given");
        assert_eq!((vx.underlay.as_str(), vx.vni), ("eth0", 5));
    }

    #[test]
    fn a_missing_or_unusable_underlay_says_which_flag_fixes_it() {
        let k = kernel();
        for (extra, addresses, want) in [
            (&[][..], &["2001:db8::1"][..], "--node-address"),
            (&[][..], &["192.0.2.9"][..], "--vxlan-underlay"),
            (
                &["--vxlan-underlay", "nope"][..],
                &[][..],
                "--vxlan-underlay",
            ),
            (
                &["--vxlan-underlay", "tiny"][..],
                &[][..],
                "--routing native",
            ),
        ] {
            let err = vxlan_setup(&config(extra), &addrs(addresses), &mut k.clone())
                .expect_err("refused")
                .to_string();
            assert!(err.contains(want), "{extra:?} {addresses:?}: {err}");
        }
    }

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
