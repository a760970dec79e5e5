//! Policy: `POST /v1/policy/trace` (`weir policy trace`) and `GET /v1/policy/rules`
//! (`weir policy list|get`).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// `POST /v1/policy/trace` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// The Service translation of a packet to a frontend, as the programs make it for a new flow.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServiceStep {
    /// The frontend (`address:port/protocol`).
    pub frontend: String,
    /// The backend chosen (`address:port`); none without a ready backend.
    pub backend: Option<String>,
    /// How many ready backends the frontend has.
    pub backends: u16,
    /// How the backend was chosen, or why there is none.
    pub reason: String,
}

/// `POST /v1/policy/trace` answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TraceResult {
    /// Identity of the source as the destination sees it.
    pub src_identity: String,
    /// Identity of the destination as the source sees it.
    pub dst_identity: String,
    /// The Service translation, when the destination is a frontend (the steps then judge the
    /// backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceStep>,
    /// Each side's decision, in packet order.
    pub steps: Vec<Step>,
    /// `allow` when every step allows.
    pub verdict: String,
    /// The same packet through the loaded programs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelTrace>,
    /// Why the kernel trace could not run, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_error: Option<String>,
}

/// One program's answer in a kernel trace.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelStep {
    /// `from_endpoint` or `to_endpoint`.
    pub program: String,
    /// The host-side interface it ran for, and its endpoint.
    pub interface: String,
    /// `allow` or `deny`.
    pub verdict: String,
    /// The reason code's name (`maps_schema::reason`).
    pub reason: String,
    /// The deciding policy rule id (0: no rule decided).
    pub rule_id: u32,
    /// The deciding rule as `namespace/name direction[index]`, when a rule decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// What the loaded programs answered.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelTrace {
    /// The packet's source port (ICMP: echo identifier) and TCP flags used.
    pub src_port: u16,
    /// Each program run, in packet order (stops at the first drop).
    pub steps: Vec<KernelStep>,
    /// `allow` when every program passed the packet.
    pub verdict: String,
    /// True when the user-space explanation reaches the same verdict.
    pub agrees: bool,
    /// Why they disagree, when they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disagreement: Option<String>,
}

/// One rule's hits (`GET /v1/policy/rules`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RuleHitsView {
    /// The rule id in the policy map (0: ids beyond the counters array, summed).
    pub rule_id: u32,
    /// `namespace/name` of the policy (empty when the id is no longer known).
    pub policy: String,
    /// `ingress` or `egress`.
    pub direction: String,
    /// Index of the rule in the policy's list for that direction.
    pub index: usize,
    /// Packets the rule decided.
    pub packets: u64,
    /// Bytes of those packets.
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_trace_and_the_rule_hits_round_trip() {
        let request = json!({"src": "10.244.0.5", "dst": "10.96.0.10", "protocol": "tcp",
            "port": 80, "tcp_flags": "ack"});
        let parsed: TraceRequest = serde_json::from_value(request.clone()).expect("request");
        assert_eq!(serde_json::to_value(&parsed).expect("json"), request);
        assert!(
            serde_json::from_value::<TraceRequest>(json!({"src": "10.0.0.1", "dst": "10.0.0.2",
                "protocol": "tcp", "sport": 1}))
            .is_err(),
            "an unknown field is refused"
        );
        let result = json!({"src_identity": "7", "dst_identity": "8",
            "service": {"frontend": "10.96.0.10:80/tcp", "backend": "10.244.0.6:8080",
                        "backends": 1, "reason": "hash"},
            "steps": [{"stage": "egress of a", "verdict": "allow", "reason": "not isolated"}],
            "verdict": "allow",
            "kernel": {"src_port": 40000, "verdict": "allow", "agrees": true, "steps": [
                {"program": "from_endpoint", "interface": "weir1", "verdict": "allow",
                 "reason": "allowed", "rule_id": 3, "rule": "prod/p ingress[0]"}]}});
        let parsed: TraceResult = serde_json::from_value(result.clone()).expect("result");
        assert_eq!(serde_json::to_value(&parsed).expect("json"), result);
        let hits = json!({"rule_id": 3, "policy": "prod/p", "direction": "ingress", "index": 0,
            "packets": 2, "bytes": 120});
        let parsed: RuleHitsView = serde_json::from_value(hits.clone()).expect("hits");
        assert_eq!(serde_json::to_value(&parsed).expect("json"), hits);
    }
}
