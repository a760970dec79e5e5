//! Policy evaluation: isolation flags, the host exception and the policy map's wildcard lookups.

use maps_schema::{
    EndpointInfo, PolicyKey,
    endpoint::{FLAG_ISOLATED_EGRESS, FLAG_ISOLATED_INGRESS},
    identity::HOST,
    policy::{EGRESS, INGRESS, VERDICT_ALLOW, decide},
    reason::{DIR_FROM_ENDPOINT, DROP_POLICY_DENIED, PASS, PASS_POLICY},
};

use crate::{maps::POLICY, parse::Reason};

/// The reason for a packet of a new flow (or of a flow this side has not approved yet).
/// `peer` is only called when the endpoint is isolated in this direction. `rule` receives the
/// rule id of the policy entry that decided (allow or deny).
#[inline(always)]
pub(crate) fn evaluate(
    ep: &EndpointInfo,
    direction: u32,
    peer: impl FnOnce() -> u32,
    proto: u8,
    port: u16,
    rule: &mut u32,
) -> Reason {
    let (flag, dir) = if direction == DIR_FROM_ENDPOINT {
        (FLAG_ISOLATED_EGRESS, EGRESS)
    } else {
        (FLAG_ISOLATED_INGRESS, INGRESS)
    };
    if ep.flags & flag == 0 {
        return PASS;
    }
    let peer = peer();
    // The node's own traffic (kubelet probes) may always enter a pod, as Cilium's
    // allow-localhost=always.
    if dir == INGRESS && peer == HOST {
        return PASS_POLICY;
    }
    // SAFETY: read-only to programs; the agent replaces entries whole.
    let get = |key: &PolicyKey| unsafe { POLICY.get(key) };
    // The policy map's verdict, most specific entry first (`maps_schema::policy::decide`).
    match decide(ep.endpoint_id, dir, peer, proto, port, get) {
        Some(v) => {
            *rule = v.rule_id;
            if v.verdict == VERDICT_ALLOW {
                PASS_POLICY
            } else {
                DROP_POLICY_DENIED
            }
        }
        None => DROP_POLICY_DENIED,
    }
}
