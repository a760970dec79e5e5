//! `weir policy trace`: why would a packet from A to B pass or drop? Evaluated on the desired maps
//! (equal to the kernel's once applied) with the programs' own lookup order: a destination that is
//! a Service frontend is first translated to the backend the programs would choose for a new flow
//! (`maps_schema::service::{flow_hash, backend_slot}`, shared with them), then the source
//! endpoint's egress and the destination endpoint's ingress judge the backend, each only when
//! isolated.

use std::net::IpAddr;

use maps_schema::{
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    identity::{HOST, reserved_name},
    policy::{EGRESS, INGRESS, VERDICT_ALLOW, decide},
    service::{
        SCOPE_ALL, SCOPE_PODS, SVC_FLAG_AFFINITY, SVC_FLAG_EXTERNAL_LOCAL, SlotKey, Svc4Key,
        backend_slot, flow_hash,
    },
};

use crate::control::node::Node;

/// A trace request, each side's decision, the Service translation and the answer (the API
/// contract's).
pub use weir_api::{ServiceStep, Step, TraceRequest, TraceResult};

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

/// The identity the programs would give `ip` on the node's desired state (`Dataplane::identity_of`).
pub(crate) fn identity_of(node: &Node, ip: IpAddr) -> u32 {
    node.dataplane.identity_of(ip)
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

/// The default source port of a traced packet (as the kernel trace's).
const DEFAULT_SRC_PORT: u16 = 40_000;

/// The frontend `req` is addressed to, if any, with the backend the programs would choose for a
/// new flow: `(step, Some((backend address, backend port)))`.
fn translate(
    node: &Node,
    req: &TraceRequest,
    proto: u8,
) -> Option<(ServiceStep, Option<(IpAddr, u16)>)> {
    let IpAddr::V4(dst) = req.dst else {
        return None;
    };
    let IpAddr::V4(src) = req.src else {
        return None;
    };
    let maps = &node.dataplane.services;
    let key = Svc4Key {
        addr: dst.octets(),
        port: req.port,
        protocol: proto,
        scope: SCOPE_ALL,
    };
    let mut svc = maps.frontends.desired(&key)?;
    // A pod gets every backend of a `Local` external frontend, as `from_endpoint` gives it.
    if svc.flags & SVC_FLAG_EXTERNAL_LOCAL != 0
        && let Some(all) = maps.frontends.desired(&Svc4Key {
            scope: SCOPE_PODS,
            ..key
        })
    {
        svc = all;
    }
    let frontend = format!("{dst}:{}/{}", req.port, req.protocol.to_ascii_lowercase());
    let sport = req.src_port.unwrap_or(DEFAULT_SRC_PORT);
    let affinity = svc.flags & SVC_FLAG_AFFINITY != 0;
    let hash = flow_hash(src.octets(), sport, dst.octets(), req.port, proto, affinity);
    let Some(slot) = backend_slot(hash, svc.backend_count) else {
        let step = ServiceStep {
            frontend,
            backend: None,
            backends: 0,
            reason: "no ready backend: rejected with an ICMP port unreachable (service-no-backend)"
                .into(),
        };
        return Some((step, None));
    };
    let backend = maps
        .slots
        .desired(&SlotKey {
            service_id: svc.service_id,
            slot,
            pad: 0,
        })
        .and_then(|v| maps.backends.desired(&v.backend_id));
    let Some(b) = backend else {
        let step = ServiceStep {
            frontend,
            backend: None,
            backends: svc.backend_count,
            reason: format!("slot {slot} has no backend yet (service-no-backend)"),
        };
        return Some((step, None));
    };
    let addr = IpAddr::from(b.addr);
    let how = if affinity {
        "by the client address (sessionAffinity: ClientIP; a client whose last new flow went to a backend still in its slot within the timeout goes there instead)".to_owned()
    } else {
        format!("by the flow's hash (source port {sport})")
    };
    let step = ServiceStep {
        frontend,
        backend: Some(format!("{addr}:{}", b.port)),
        backends: svc.backend_count,
        reason: format!(
            "slot {slot} of {} {how}; an established flow keeps its backend",
            svc.backend_count
        ),
    };
    Some((step, Some((addr, b.port))))
}

/// Traces `req` on `node`'s desired state.
pub fn trace(node: &Node, req: &TraceRequest, proto: u8) -> TraceResult {
    let service = translate(node, req, proto);
    let (dst, port) = match &service {
        Some((_, Some(backend))) => *backend,
        _ => (req.dst, req.port),
    };
    if let Some((step, None)) = &service {
        return TraceResult {
            src_identity: name(identity_of(node, req.src)),
            dst_identity: name(identity_of(node, req.dst)),
            service: Some(step.clone()),
            steps: Vec::new(),
            verdict: "deny".into(),
            kernel: None,
            kernel_error: None,
        };
    }
    let src_identity = identity_of(node, req.src);
    let dst_identity = identity_of(node, dst);
    let mut steps = Vec::new();
    for (ip, flag, dir, peer, stage) in [
        (
            req.src,
            FLAG_ISOLATED_EGRESS,
            EGRESS,
            dst_identity,
            "egress",
        ),
        (dst, FLAG_ISOLATED_INGRESS, INGRESS, src_identity, "ingress"),
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
            match lookup(node, endpoint.id, dir, peer, proto, port) {
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
        service: service.map(|(step, _)| step),
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
        use crate::dataplane::plane::covers;
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
