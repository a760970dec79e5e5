//! CHECK: compares the pod with prevResult — weir's own interfaces, addresses, routes, gateway
//! entries, program attachments, the endpoint, and the allocation itself (`GET
//! /v1/ipam/handles/…`: held, confirmed, the same addresses) — and fails listing every difference.
//! Things later plugins in the chain added are not weir's and are not checked.

use std::net::IpAddr;

use super::{CommandError, host_netlink};
use crate::{
    agent::AgentClient,
    attach,
    config::Config,
    env::Env,
    names,
    netlink::{LinkState, Netlink, format_mac},
    netns::Netns,
    plumb,
    result::CniResult,
};

pub(super) async fn check(
    env: &Env,
    config: &Config,
    client: &AgentClient,
) -> Result<(), CommandError> {
    let prev = config
        .prev_result
        .as_ref()
        .ok_or(CommandError::NoPrevResult)?;
    let prev = CniResult::from_value(prev).map_err(CommandError::BadPrevResult)?;
    let config = &super::with_agent_pin_root(config, client).await?;
    let container_id = env.container_id();
    let ifname = env.ifname();
    let host_ifname = names::host_veth(container_id, ifname);
    let netns_path = env.netns.clone().unwrap_or_default();
    let sandbox = netns_path.display().to_string();
    let mut drift = Vec::new();

    let Some(pod_index) = prev.interface_index(ifname, Some(&sandbox)) else {
        return Err(CommandError::Drift(vec![format!(
            "prevResult has no interface {ifname} in sandbox {sandbox}"
        )]));
    };
    let Some(host_index) = prev.interface_index(&host_ifname, None) else {
        return Err(CommandError::Drift(vec![format!(
            "prevResult has no host interface {host_ifname}"
        )]));
    };
    let mut ips = Vec::new();
    for ip in prev.ips.iter().filter(|i| i.interface == Some(pod_index)) {
        let addr = ip
            .address
            .split_once('/')
            .map_or(ip.address.as_str(), |(a, _)| a);
        match addr.parse::<IpAddr>() {
            Ok(a) => ips.push(a),
            Err(_) => drift.push(format!(
                "prevResult has an unreadable address {:?}",
                ip.address
            )),
        }
    }

    let netns = Netns::open(&netns_path)?;
    let pod_nl = netns.netlink()?;
    let host_nl = host_netlink()?;
    let pod = check_link(
        &pod_nl,
        ifname,
        config.mtu,
        prev.interfaces[pod_index].mac.as_deref(),
        &mut drift,
    )
    .await?;
    let host = check_link(
        &host_nl,
        &host_ifname,
        config.mtu,
        prev.interfaces[host_index].mac.as_deref(),
        &mut drift,
    )
    .await?;
    if let (Some(pod), Some(host)) = (&pod, &host) {
        check_pod(&pod_nl, pod, host, &ips, &mut drift).await?;
        check_host(&host_nl, host, &ips, &mut drift).await?;
        for program in attach::missing_programs(&config.bpf_root, host.index)? {
            drift.push(format!("{program} is not attached to {host_ifname}"));
        }
    }
    match client.get_endpoint(container_id, ifname).await? {
        None => drift.push(format!("the agent has no endpoint {container_id}:{ifname}")),
        Some(view) => {
            let ep = &view.endpoint;
            let mut have = ep.ips.clone();
            let mut want = ips.clone();
            have.sort();
            want.sort();
            if have != want {
                drift.push(format!(
                    "the endpoint's addresses are {have:?}, the ADD result's {want:?}"
                ));
            }
            if ep.handle != config.handle(container_id) {
                drift.push(format!(
                    "the endpoint's allocation is under handle {}, not {}",
                    ep.handle,
                    config.handle(container_id)
                ));
            }
            if ep.host_ifname != host_ifname {
                drift.push(format!(
                    "the endpoint's host interface is {}, not {host_ifname}",
                    ep.host_ifname
                ));
            }
        }
    }
    check_allocation(client, &config.handle(container_id), &ips, &mut drift).await?;
    if drift.is_empty() {
        Ok(())
    } else {
        Err(CommandError::Drift(drift))
    }
}

/// The allocation itself (`GET /v1/ipam/handles/{handle}`): held, confirmed, and exactly the ADD
/// result's addresses.
async fn check_allocation(
    client: &AgentClient,
    handle: &str,
    ips: &[IpAddr],
    drift: &mut Vec<String>,
) -> Result<(), CommandError> {
    let held = client.get_handle(handle).await?;
    if held.ips.is_empty() {
        drift.push(format!(
            "the agent holds no addresses under handle {handle}; they were released"
        ));
        return Ok(());
    }
    let mut have = held.ips.clone();
    let mut want = ips.to_vec();
    have.sort();
    want.sort();
    if have != want {
        drift.push(format!(
            "the allocation under handle {handle} holds {have:?}, the ADD result {want:?}"
        ));
    }
    if !held.confirmed {
        drift.push(format!(
            "the allocation under handle {handle} is not confirmed by an endpoint and will expire"
        ));
    }
    Ok(())
}

async fn check_link(
    nl: &Netlink,
    name: &str,
    mtu: u32,
    mac: Option<&str>,
    drift: &mut Vec<String>,
) -> Result<Option<LinkState>, CommandError> {
    let Some(link) = nl.link(name).await? else {
        drift.push(format!("interface {name} is missing"));
        return Ok(None);
    };
    if !link.up {
        drift.push(format!("interface {name} is down"));
    }
    if link.mtu != mtu {
        drift.push(format!("interface {name} has MTU {}, not {mtu}", link.mtu));
    }
    if let Some(mac) = mac
        && !mac.eq_ignore_ascii_case(&link.mac_string())
    {
        drift.push(format!(
            "interface {name} has MAC {}, not {mac}",
            link.mac_string()
        ));
    }
    Ok(Some(link))
}

async fn check_pod(
    pod_nl: &Netlink,
    pod: &LinkState,
    host: &LinkState,
    ips: &[IpAddr],
    drift: &mut Vec<String>,
) -> Result<(), CommandError> {
    let addresses = pod_nl.addresses(pod.index).await?;
    for ip in ips {
        let prefix = plumb::host_prefix(*ip);
        if !addresses.contains(&(*ip, prefix)) {
            drift.push(format!(
                "address {ip}/{prefix} is missing from {}",
                pod.name
            ));
        }
    }
    let neighbours = pod_nl.neighbours(pod.index).await?;
    for ipv6 in [false, true] {
        let Some(ip) = ips.iter().find(|i| i.is_ipv6() == ipv6) else {
            continue;
        };
        let gw = plumb::gateway_for(*ip);
        let routes = pod_nl.routes(ipv6).await?;
        let has_default = routes.iter().any(|r| {
            r.prefix == 0
                && r.dst.is_unspecified()
                && r.gateway == Some(gw)
                && r.oif == Some(pod.index)
        });
        if !has_default {
            drift.push(format!("the default route via {gw} is missing in the pod"));
        }
        if !ipv6
            && !routes
                .iter()
                .any(|r| r.dst == gw && r.prefix == 32 && r.oif == Some(pod.index))
        {
            drift.push(format!(
                "the on-link route to the gateway {gw} is missing in the pod"
            ));
        }
        if !neighbours.iter().any(|n| n.ip == gw && n.mac == host.mac) {
            drift.push(format!(
                "the gateway {gw} does not resolve to the host veth's MAC {}",
                format_mac(&host.mac)
            ));
        }
    }
    Ok(())
}

async fn check_host(
    host_nl: &Netlink,
    host: &LinkState,
    ips: &[IpAddr],
    drift: &mut Vec<String>,
) -> Result<(), CommandError> {
    for ipv6 in [false, true] {
        if !ips.iter().any(|i| i.is_ipv6() == ipv6) {
            continue;
        }
        let routes = host_nl.routes(ipv6).await?;
        for ip in ips.iter().filter(|i| i.is_ipv6() == ipv6) {
            let prefix = plumb::host_prefix(*ip);
            if !routes
                .iter()
                .any(|r| r.dst == *ip && r.prefix == prefix && r.oif == Some(host.index))
            {
                drift.push(format!(
                    "the host route to {ip}/{prefix} via {} is missing",
                    host.name
                ));
            }
        }
    }
    Ok(())
}
