//! The pod's network: a veth pair whose host end is `weir…`, the pod end `CNI_IFNAME` inside
//! `CNI_NETNS`; the pod's addresses as /32 and /128; default routes through link-local gateways
//! (`169.254.1.1`, `fe80::1`) that resolve to the host veth's MAC through permanent neighbour
//! entries in the pod (so no ARP or ND is needed for them), backed by `proxy_arp` and an
//! `fe80::1` address on the host veth; and host routes to the pod's addresses via the host veth.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{
    error::{CniCode, Code},
    netlink::{LinkState, Netlink, NetlinkError},
};

/// The pod's IPv4 gateway (link-local, answered by the host veth).
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pod's IPv6 gateway (link-local, an address of the host veth).
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Errors building the pod's network.
#[derive(Debug, thiserror::Error)]
pub enum PlumbError {
    /// The pod already has an interface of that name.
    #[error(
        "the network namespace already has an interface {ifname}; pick another CNI_IFNAME or DEL the old attachment first"
    )]
    InterfaceExists {
        /// The name.
        ifname: String,
    },
    /// A link vanished right after being created.
    #[error("the link {name} disappeared while it was being set up; retry the ADD")]
    Vanished {
        /// The link.
        name: String,
    },
    /// A netlink operation failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

impl CniCode for PlumbError {
    fn code(&self) -> Code {
        match self {
            Self::InterfaceExists { .. } => Code::InterfaceExists,
            Self::Vanished { .. } | Self::Netlink(_) => Code::Netlink,
        }
    }
}

/// The two ends of a created pair.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The host end.
    pub host: LinkState,
    /// The pod end.
    pub pod: LinkState,
}

/// Creates the pair (both ends down). A stale host veth of the same name (an ADD that failed
/// without a DEL) is removed first; an existing pod interface of the same name is an error.
pub async fn create_pair(
    host_nl: &Netlink,
    pod_nl: &Netlink,
    pod_netns_fd: i32,
    host_ifname: &str,
    ifname: &str,
    mtu: u32,
) -> Result<Pair, PlumbError> {
    if pod_nl.link(ifname).await?.is_some() {
        return Err(PlumbError::InterfaceExists {
            ifname: ifname.to_owned(),
        });
    }
    if let Some(stale) = host_nl.link(host_ifname).await? {
        tracing::warn!(
            host_ifname,
            "removing a stale host veth left by an earlier ADD"
        );
        host_nl.delete_link(stale.index, host_ifname).await?;
    }
    host_nl
        .create_veth(host_ifname, ifname, pod_netns_fd, mtu)
        .await?;
    let vanished = |name: &str| PlumbError::Vanished {
        name: name.to_owned(),
    };
    let host = host_nl
        .link(host_ifname)
        .await?
        .ok_or_else(|| vanished(host_ifname))?;
    let pod = pod_nl.link(ifname).await?.ok_or_else(|| vanished(ifname))?;
    Ok(Pair { host, pod })
}

/// Addresses, link, gateway neighbours and routes inside the pod.
pub async fn configure_pod(
    pod_nl: &Netlink,
    pod: &LinkState,
    host_mac: &[u8],
    ips: &[IpAddr],
) -> Result<(), PlumbError> {
    for ip in ips {
        pod_nl.add_address(pod.index, *ip, host_prefix(*ip)).await?;
    }
    pod_nl.set_up(pod.index, &pod.name).await?;
    if ips.iter().any(IpAddr::is_ipv4) {
        let gw = IpAddr::V4(GATEWAY_V4);
        pod_nl.add_neighbour(pod.index, gw, host_mac).await?;
        pod_nl.add_route(gw, 32, None, pod.index).await?;
        pod_nl
            .add_route(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0, Some(gw), pod.index)
            .await?;
    }
    if ips.iter().any(IpAddr::is_ipv6) {
        let gw = IpAddr::V6(GATEWAY_V6);
        pod_nl.add_neighbour(pod.index, gw, host_mac).await?;
        pod_nl
            .add_route(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0, Some(gw), pod.index)
            .await?;
    }
    Ok(())
}

/// The host side: gateway answers, link up (the programs are already attached), routes to the
/// pod's addresses.
pub async fn configure_host(
    host_nl: &Netlink,
    host: &LinkState,
    ips: &[IpAddr],
) -> Result<(), PlumbError> {
    if ips.iter().any(IpAddr::is_ipv4) {
        // A fallback for a pod whose static neighbour entry was flushed.
        for (path, value) in [
            (
                format!("/proc/sys/net/ipv4/conf/{}/proxy_arp", host.name),
                "1",
            ),
            (
                format!("/proc/sys/net/ipv4/neigh/{}/proxy_delay", host.name),
                "0",
            ),
        ] {
            if let Err(e) = std::fs::write(&path, value) {
                tracing::warn!(path, error = %e, "cannot set a sysctl; the pod's static gateway entry still works");
            }
        }
    }
    if ips.iter().any(IpAddr::is_ipv6) {
        host_nl
            .add_address(host.index, IpAddr::V6(GATEWAY_V6), 64)
            .await?;
    }
    host_nl.set_up(host.index, &host.name).await?;
    for ip in ips {
        host_nl
            .add_route(*ip, host_prefix(*ip), None, host.index)
            .await?;
    }
    Ok(())
}

/// 32 for IPv4, 128 for IPv6 (the boundary narrowing).
#[must_use]
pub const fn host_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// The gateway of `ip`'s family.
#[must_use]
pub const fn gateway_for(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(GATEWAY_V4),
        IpAddr::V6(_) => IpAddr::V6(GATEWAY_V6),
    }
}
