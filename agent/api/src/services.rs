//! Services: `GET /v1/services` (`weir service list`) and `GET /v1/services/flows`
//! (`weir service flows`).

use serde::{Deserialize, Serialize};

/// One frontend of one Service and what is behind it (`weir service list -o json` prints one
/// object per frontend).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceView {
    /// `namespace/name` of the Service.
    pub service: String,
    /// `cluster-ip:port/protocol` (`10.96.0.10:80/tcp`, `[fd00::10]:80/tcp`); a NodePort is
    /// `*:node-port/protocol` (served on the addresses of `--nodeport-interfaces`).
    pub frontend: String,
    /// `Local` for a NodePort or an external address (`externalIPs`, a load balancer's) of a
    /// Service with `externalTrafficPolicy: Local` (only this node's endpoints serve it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<String>,
    /// `Local` for a cluster IP of a Service with `internalTrafficPolicy: Local` (only this
    /// node's endpoints serve this node's pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
    /// The Service port's name (empty for a Service's one unnamed port).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub port_name: String,
    /// `sessionAffinity: ClientIP`'s timeout, when the Service has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_seconds: Option<u32>,
    /// Every endpoint of the Service's slices of the frontend's family that has this port, sorted
    /// by address and port.
    pub backends: Vec<BackendView>,
}

/// One endpoint address behind a frontend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendView {
    /// `address:port` (the port is the slice's port of the Service port's name).
    pub address: String,
    /// Whether it takes new flows.
    pub state: BackendState,
    /// The EndpointSlice that lists it.
    pub slice: String,
    /// The endpoint's `nodeName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// An endpoint's state, from its slice's conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendState {
    /// `ready`: takes new flows.
    Ready,
    /// `terminating` (and not ready): no new flows; its established flows finish.
    Terminating,
    /// Neither: serves nothing.
    NotReady,
}

impl BackendState {
    /// As the table and the JSON write it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Terminating => "terminating",
            Self::NotReady => "not-ready",
        }
    }
}

/// One translated flow as operators read it (`weir service flows`): a client's flow to a
/// frontend and the backend it was given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowView {
    /// IP protocol number.
    pub protocol: u8,
    /// The client's end (`address:port`).
    pub client: String,
    /// The frontend it sent to (`address:port`).
    pub frontend: String,
    /// The backend its packets go to (`address:port`).
    pub backend: String,
    /// The Service of that frontend (`namespace/name`), when the agent's source names it.
    pub service: Option<String>,
    /// Its conntrack entry's idle time in seconds; `None` when the flow is not in this node's
    /// conntrack: a NodePort flow sent on to another node's backend (`nat4` carries it), or one
    /// whose entry the agent's sweep took once it was over its grace period.
    pub idle_secs: Option<u64>,
    /// Seconds since the backend was chosen.
    pub age_secs: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn services_and_flows_round_trip_with_their_optional_parts_off_the_wire() {
        let view = json!({"service": "prod/web", "frontend": "*:30080/tcp",
            "external_traffic_policy": "Local", "backends": [
                {"address": "10.244.0.5:8080", "state": "not-ready", "slice": "web-abc"}]});
        let parsed: ServiceView = serde_json::from_value(view.clone()).expect("view");
        assert_eq!(parsed.backends[0].state.name(), "not-ready");
        assert_eq!(serde_json::to_value(&parsed).expect("json"), view);
        for state in [
            BackendState::Ready,
            BackendState::Terminating,
            BackendState::NotReady,
        ] {
            assert_eq!(
                serde_json::to_value(state).expect("json"),
                json!(state.name())
            );
        }
        let flow = json!({"protocol": 6, "client": "10.244.0.7:40000", "frontend": "10.96.0.10:80",
            "backend": "10.244.0.5:8080", "service": null, "idle_secs": 3, "age_secs": 4});
        let parsed: FlowView = serde_json::from_value(flow.clone()).expect("flow");
        assert_eq!(serde_json::to_value(&parsed).expect("json"), flow);
    }
}
