//! ADD: allocate through the agent, build the veth pair with the programs attached before the
//! link comes up, configure pod and host, register the endpoint (whose answer means its map
//! entries are written), and only then print the result. Any failure after the allocation undoes
//! everything: endpoint, link pins, veth, addresses.

use std::{
    fmt::Write as _,
    net::IpAddr,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{CommandError, host_netlink};
use crate::{
    agent::{AgentClient, AllocateRequest, EndpointRequest},
    attach,
    config::Config,
    env::Env,
    names,
    netlink::{Netlink, format_mac},
    netns::Netns,
    plumb::{self, Pair},
    result::{CniResult, Interface, IpConfig, Route},
};

/// What ADD needs to know about one attachment.
struct Attachment<'a> {
    container_id: &'a str,
    ifname: &'a str,
    host_ifname: String,
    handle: String,
}

pub(super) async fn add(
    env: &Env,
    config: &Config,
    client: &AgentClient,
) -> Result<Value, CommandError> {
    let att = Attachment {
        container_id: env.container_id(),
        ifname: env.ifname(),
        host_ifname: names::host_veth(env.container_id(), env.ifname()),
        handle: config.handle(env.container_id()),
    };
    // Refused before anything is created: silently ignoring them would mislabel the pod.
    if !config.labels.is_empty() {
        return Err(CommandError::LabelsInConfig);
    }
    let mut clock = Phases::start();
    let netns_path = env.netns.clone().unwrap_or_default();
    let netns = Netns::open(&netns_path)?;
    let prev = config
        .prev_result
        .as_ref()
        .map(CniResult::from_value)
        .transpose()
        .map_err(CommandError::BadPrevResult)?;
    // args.cni.ips / runtimeConfig.ips win over CNI_ARGS IP= (the conventions).
    let requested = if config.requested_ips.is_empty() {
        env.args.ips()?
    } else {
        config.requested_ips.clone()
    };
    let host_nl = host_netlink()?;
    let pod_nl = netns.netlink()?;
    // Refuse before allocating anything.
    if pod_nl.link(att.ifname).await?.is_some() {
        return Err(plumb::PlumbError::InterfaceExists {
            ifname: att.ifname.to_owned(),
        }
        .into());
    }
    clock.lap("netlink-open");

    let request = AllocateRequest {
        handle: att.handle.clone(),
        ipv4: u32::from(requested.is_empty() && config.families.ipv4),
        ipv6: u32::from(requested.is_empty() && config.families.ipv6),
        pools: config.pools.clone(),
        ips: requested.clone(),
        namespace: env.args.pod_namespace().unwrap_or_default().to_owned(),
        pod: env.args.pod_name().unwrap_or_default().to_owned(),
        container_id: att.container_id.to_owned(),
        expires_in_secs: config.allocation_expiry_secs,
    };
    let allocation = client.allocate(&request).await?;
    clock.lap("allocate");
    // The programs to attach are this agent's: its pin root, or a refusal when bpfRoot disagrees
    // (reported after the allocation, so the rollback below releases it).
    let mut adopted = config.clone();
    let pin_root = adopted.adopt_agent_pin_root(allocation.agent_pin_root());
    // Attach the way the agent does (its driver would otherwise replace or keep ours); an agent
    // that does not say leaves the conflist's `tcAttach`.
    if let Some(mechanism) = allocation.tc_attach {
        adopted.tc_attach = mechanism;
    }
    let config = &adopted;
    tracing::info!(handle = %att.handle, ips = ?allocation.allocation.ips, "allocated");
    if config.ip_masq {
        tracing::debug!(
            "ipMasq is set: weir-cni writes no masquerade rule; the agent's --masquerade-interfaces masquerades pod traffic"
        );
    }
    let ips = allocation.allocation.ips;
    failpoint("after-allocate").await;

    let mut endpoint_sent = false;
    let outcome = async {
        pin_root?;
        check_allocation(&request, &ips)?;
        let pair = plumb::create_pair(
            &host_nl,
            &pod_nl,
            netns.raw_fd(),
            &att.host_ifname,
            att.ifname,
            config.mtu,
        )
        .await?;
        clock.lap("create-pair");
        // Fail closed: the programs run before the host end is ever up.
        attach::attach_endpoint_programs(&config.bpf_root, &att.host_ifname, config.tc_attach)?;
        clock.lap("attach");
        plumb::configure_pod(&pod_nl, &pair.pod, &pair.host.mac, &ips).await?;
        clock.lap("configure-pod");
        plumb::configure_host(&host_nl, &pair.host, &ips).await?;
        clock.lap("configure-host");
        let endpoint = EndpointRequest {
            container_id: att.container_id.to_owned(),
            ifname: att.ifname.to_owned(),
            host_ifname: att.host_ifname.clone(),
            netns: netns_path.display().to_string(),
            namespace: env.args.pod_namespace().unwrap_or_default().to_owned(),
            pod: env.args.pod_name().unwrap_or_default().to_owned(),
            // The agent takes the labels from the pod's Pod object (namespace + pod name).
            labels: std::collections::BTreeMap::new(),
            handle: att.handle.clone(),
            ips: ips.clone(),
        };
        failpoint("before-endpoint").await;
        endpoint_sent = true;
        client.put_endpoint(&endpoint).await?;
        clock.lap("put-endpoint");
        Ok::<Pair, CommandError>(pair)
    }
    .await;

    match outcome {
        Ok(pair) => {
            tracing::info!(
                host_ifname = %att.host_ifname,
                timings = %clock.summary(),
                "endpoint registered"
            );
            let ours = result(config, &netns_path.display().to_string(), &pair, &ips);
            let full = match prev {
                Some(prev) => prev.chain(ours),
                None => ours,
            }
            .for_version(&config.cni_version);
            // Serialising a plain struct cannot fail.
            Ok(serde_json::to_value(full).unwrap_or_default())
        }
        Err(primary) => {
            tracing::warn!(error = %primary, "ADD failed; undoing it");
            let failures = rollback(client, &host_nl, config, &att, endpoint_sent).await;
            if failures.is_empty() {
                Err(primary)
            } else {
                Err(CommandError::RolledBack {
                    primary: Box::new(primary),
                    rollback: failures.join("; "),
                })
            }
        }
    }
}

/// Where an ADD's time goes (logged with the result, so a slow ADD can be read from the log):
/// `phase=ms` for each step since the previous one, then the total since the plugin started
/// this command.
struct Phases {
    started: Instant,
    last: Instant,
    laps: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn start() -> Self {
        let now = Instant::now();
        Self {
            started: now,
            last: now,
            laps: Vec::new(),
        }
    }

    fn lap(&mut self, phase: &'static str) {
        let now = Instant::now();
        self.laps.push((phase, now - self.last));
        self.last = now;
    }

    fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let mut out = String::new();
        for (phase, took) in &self.laps {
            let _ = write!(out, "{phase}={:.2}ms ", ms(*took));
        }
        let _ = write!(out, "total={:.2}ms", ms(self.started.elapsed()));
        out
    }
}

/// A dual-stack half-success (or any short answer) fails the ADD; the rollback releases it.
fn check_allocation(request: &AllocateRequest, ips: &[IpAddr]) -> Result<(), CommandError> {
    let v4 = ips.iter().filter(|ip| ip.is_ipv4()).count();
    let v6 = ips.len() - v4;
    let short = if request.ips.is_empty() {
        (request.ipv4 as usize > v4) || (request.ipv6 as usize > v6) || ips.is_empty()
    } else {
        request.ips.iter().any(|ip| !ips.contains(ip))
    };
    if short {
        let wanted = if request.ips.is_empty() {
            format!("{} IPv4 and {} IPv6", request.ipv4, request.ipv6)
        } else {
            format!("{:?}", request.ips)
        };
        return Err(CommandError::ShortAllocation {
            wanted,
            got: format!("{ips:?}"),
        });
    }
    Ok(())
}

/// Undoes a failed ADD; returns what could not be undone.
async fn rollback(
    client: &AgentClient,
    host_nl: &Netlink,
    config: &Config,
    att: &Attachment<'_>,
    endpoint_sent: bool,
) -> Vec<String> {
    let mut failures = Vec::new();
    if endpoint_sent && let Err(e) = client.delete_endpoint(att.container_id, att.ifname).await {
        failures.push(format!("removing the endpoint: {e}"));
    }
    if let Err(e) = attach::detach_endpoint_programs(&config.bpf_root, &att.host_ifname) {
        failures.push(e.to_string());
    }
    match host_nl.link(&att.host_ifname).await {
        Ok(Some(link)) => {
            if let Err(e) = host_nl.delete_link(link.index, &att.host_ifname).await {
                failures.push(e.to_string());
            }
        }
        Ok(None) => {}
        Err(e) => failures.push(e.to_string()),
    }
    if let Err(e) = client.release_handle(&att.handle).await {
        failures.push(format!(
            "releasing {}: {e} (the agent releases an unconfirmed allocation when it expires, and DEL releases it too)",
            att.handle
        ));
    }
    failures
}

fn result(config: &Config, sandbox: &str, pair: &Pair, ips: &[IpAddr]) -> CniResult {
    let interfaces = vec![
        Interface {
            name: pair.host.name.clone(),
            mac: Some(format_mac(&pair.host.mac)),
            mtu: Some(config.mtu),
            ..Interface::default()
        },
        Interface {
            name: pair.pod.name.clone(),
            mac: Some(format_mac(&pair.pod.mac)),
            mtu: Some(config.mtu),
            sandbox: Some(sandbox.to_owned()),
            ..Interface::default()
        },
    ];
    let ip_configs = ips
        .iter()
        .map(|ip| IpConfig {
            address: format!("{ip}/{}", plumb::host_prefix(*ip)),
            gateway: Some(plumb::gateway_for(*ip).to_string()),
            interface: Some(1),
            ..IpConfig::default()
        })
        .collect();
    let mut routes = Vec::new();
    if ips.iter().any(IpAddr::is_ipv4) {
        routes.push(Route {
            dst: "0.0.0.0/0".to_owned(),
            gw: Some(plumb::GATEWAY_V4.to_string()),
            ..Route::default()
        });
    }
    if ips.iter().any(IpAddr::is_ipv6) {
        routes.push(Route {
            dst: "::/0".to_owned(),
            gw: Some(plumb::GATEWAY_V6.to_string()),
            ..Route::default()
        });
    }
    CniResult {
        cni_version: config.cni_version.clone(),
        interfaces,
        ips: ip_configs,
        routes,
        dns: config.dns.clone(),
        extra: serde_json::Map::new(),
    }
}

/// Crash tests (`WEIR_CNI_FAILPOINT`): `abort-after-allocate` aborts the process right after the
/// allocation (a plugin killed mid-ADD); `pause-before-endpoint=<secs>` sleeps before the endpoint
/// registration (so a test can stop the agent there). Unset in production.
async fn failpoint(at: &str) {
    let Ok(spec) = std::env::var("WEIR_CNI_FAILPOINT") else {
        return;
    };
    let (name, arg) = spec.split_once('=').unwrap_or((spec.as_str(), ""));
    match name
        .strip_prefix("abort-")
        .or_else(|| name.strip_prefix("pause-"))
    {
        Some(point) if point == at => {
            if name.starts_with("abort-") {
                tracing::warn!(at, "failpoint: aborting");
                std::process::abort();
            }
            let secs = arg.parse().unwrap_or(5);
            tracing::warn!(at, secs, "failpoint: pausing");
            tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
        }
        _ => {}
    }
}
