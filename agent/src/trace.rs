//! `weir policy trace`: why would a packet from A to B pass or drop? Evaluated on the desired maps
//! (equal to the kernel's once applied) with the programs' own lookup order: the source
//! endpoint's egress, then the destination endpoint's ingress, each only when isolated.

use std::net::IpAddr;

use maps_schema::{
    IdentityInfo,
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    identity::{HOST, WORLD, reserved_name},
    policy::{EGRESS, INGRESS, VERDICT_ALLOW, decide},
};
use serde::{Deserialize, Serialize};

use crate::node::Node;

/// A trace request.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceRequest {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// `tcp`, `udp`, `sctp`, `icmp` or a protocol number.
    pub protocol: String,
    /// Destination port (ICMP: the message type).
    #[serde(default)]
    pub port: u16,
    /// Source port of the kernel trace's packet (ICMP: echo identifier); default 40000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_port: Option<u16>,
    /// TCP flags of the kernel trace's packet (`syn` by default, `ack` for an established packet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_flags: Option<String>,
    /// The endpoint whose interface the packet leaves (container id, host interface or
    /// namespace/pod), for a source address the endpoint does not own (a spoofed source).
    /// Default: the endpoint that owns `src`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_endpoint: Option<String>,
}

/// One side's decision.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Step {
    /// `egress of <endpoint>` or `ingress of <endpoint>`.
    pub stage: String,
    /// `allow` or `deny`.
    pub verdict: String,
    /// Why.
    pub reason: String,
}

/// The answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TraceResult {
    /// Identity of the source as the destination sees it.
    pub src_identity: String,
    /// Identity of the destination as the source sees it.
    pub dst_identity: String,
    /// Each side's decision, in packet order.
    pub steps: Vec<Step>,
    /// `allow` when every step allows.
    pub verdict: String,
    /// The same packet through the loaded programs (`crate::observe::ktrace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<crate::observe::ktrace::KernelTrace>,
    /// Why the kernel trace could not run, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_error: Option<String>,
}

/// Parses a protocol name or number.
pub fn protocol(name: &str) -> Option<u8> {
    match name.to_ascii_lowercase().as_str() {
        "tcp" => Some(6),
        "udp" => Some(17),
        "sctp" => Some(132),
        "icmp" => Some(1),
        "icmpv6" | "icmp6" => Some(58),
        other => other.parse().ok(),
    }
}

/// The identity the programs would give `ip` on the desired state (exact, else LPM, else world).
pub(crate) fn identity_of(node: &Node, ip: IpAddr) -> u32 {
    let dp = &node.dataplane;
    let exact = match ip {
        IpAddr::V4(a) => dp.ident4.desired(&a.octets()).copied(),
        IpAddr::V6(a) => dp.ident6.desired(&a.octets()).copied(),
    };
    let lpm = |best: Option<(u32, IdentityInfo)>, (len, info): (u32, IdentityInfo)| match best {
        Some((l, _)) if l >= len => best,
        _ => Some((len, info)),
    };
    let cidr = match ip {
        IpAddr::V4(a) => dp
            .ipcache4
            .entries()
            .filter(|(p, _)| covers(&p.data, p.len, &a.octets()))
            .map(|(p, i)| (p.len, *i))
            .fold(None, lpm),
        IpAddr::V6(a) => dp
            .ipcache6
            .entries()
            .filter(|(p, _)| covers(&p.data, p.len, &a.octets()))
            .map(|(p, i)| (p.len, *i))
            .fold(None, lpm),
    };
    exact.or(cidr.map(|(_, i)| i)).map_or(WORLD, |i| i.identity)
}

fn covers<const N: usize>(net: &[u8; N], len: u32, addr: &[u8; N]) -> bool {
    let full = (len / 8) as usize;
    if net[..full.min(N)] != addr[..full.min(N)] {
        return false;
    }
    let rest = len % 8;
    rest == 0 || full >= N || (net[full] ^ addr[full]) >> (8 - rest) == 0
}

fn name(identity: u32) -> String {
    reserved_name(identity).map_or_else(|| identity.to_string(), |r| format!("{identity} ({r})"))
}

/// The programs' policy lookup order (`maps_schema::policy::decide`) on the desired state:
/// returns (allowed, rule id).
fn lookup(
    node: &Node,
    endpoint_id: u32,
    direction: u8,
    peer: u32,
    proto: u8,
    port: u16,
) -> Option<(bool, u32)> {
    let policy = &node.dataplane.policy;
    decide(endpoint_id, direction, peer, proto, port, |key| {
        policy.desired(key)
    })
    .map(|v| (v.verdict == VERDICT_ALLOW, v.rule_id))
}

/// Traces `req` on `node`'s desired state.
pub fn trace(node: &Node, req: &TraceRequest, proto: u8) -> TraceResult {
    let src_identity = identity_of(node, req.src);
    let dst_identity = identity_of(node, req.dst);
    let mut steps = Vec::new();
    for (ip, flag, dir, peer, stage) in [
        (
            req.src,
            FLAG_ISOLATED_EGRESS,
            EGRESS,
            dst_identity,
            "egress",
        ),
        (
            req.dst,
            FLAG_ISOLATED_INGRESS,
            INGRESS,
            src_identity,
            "ingress",
        ),
    ] {
        let Some(endpoint) = node.endpoints().find(|e| e.ips.contains(&ip)) else {
            continue;
        };
        let who = format!(
            "{stage} of {} ({}/{})",
            endpoint.key(),
            endpoint.namespace,
            endpoint.pod
        );
        let flags = node
            .dataplane
            .endpoints_manager
            .entry_of(&endpoint.host_ifname)
            .map_or(0, |e| e.flags);
        let (allowed, reason) = if flags & flag == 0 {
            (
                true,
                format!("no policy selects this endpoint for {stage}: allowed"),
            )
        } else if dir == INGRESS && peer == HOST {
            (
                true,
                "the node itself (host identity) may always reach its pods".to_owned(),
            )
        } else {
            match lookup(node, endpoint.id, dir, peer, proto, req.port) {
                Some((allowed, rule)) => {
                    let origin = node.rule(rule).map_or_else(
                        || format!("rule {rule}"),
                        |r| format!("{} {}[{}]", r.policy, r.direction, r.index),
                    );
                    (allowed, format!("matched {origin}"))
                }
                None => (
                    false,
                    format!(
                        "isolated for {stage} and no rule admits peer {}",
                        name(peer)
                    ),
                ),
            }
        };
        steps.push(Step {
            stage: who,
            verdict: if allowed { "allow" } else { "deny" }.into(),
            reason,
        });
    }
    let verdict = if steps.iter().all(|s| s.verdict == "allow") {
        "allow"
    } else {
        "deny"
    };
    TraceResult {
        src_identity: name(src_identity),
        dst_identity: name(dst_identity),
        steps,
        verdict: verdict.into(),
        kernel: None,
        kernel_error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_cover_what_they_should() {
        assert!(covers(&[10, 0, 0, 0], 8, &[10, 1, 2, 3]));
        assert!(!covers(&[10, 0, 0, 0], 8, &[11, 1, 2, 3]));
        assert!(covers(&[10, 1, 128, 0], 17, &[10, 1, 200, 1]));
        assert!(!covers(&[10, 1, 128, 0], 17, &[10, 1, 100, 1]));
        assert!(covers(&[0; 4], 0, &[1, 2, 3, 4]));
        assert_eq!(protocol("TCP"), Some(6));
        assert_eq!(protocol("47"), Some(47));
        assert_eq!(protocol("nope"), None);
    }
}
