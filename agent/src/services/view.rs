//! The Services as the source describes them, for operators (`GET /v1/services`, `weir service
//! list`): every frontend (cluster IP, port, protocol) of every Service with each endpoint of its
//! EndpointSlices and that endpoint's state. Only `ready` endpoints take new flows
//! (`services::desired` puts only those in the backend slots); `terminating` ones are listed so an
//! operator sees the flows they still carry; `not-ready` ones serve nothing. Computed from the
//! model alone (no kernel read): what weir wants, not what the maps hold.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{
    desired::{Services, Slices, backend_port},
    model::{Endpoint, Service, ServicePort, SessionAffinity},
};
use crate::policy::warnings::protocol_name;

/// One Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `sessionAffinity: ClientIP`'s timeout, when the Service has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_seconds: Option<u32>,
    /// One per (cluster IP, port); none for a headless Service.
    pub frontends: Vec<FrontendView>,
}

/// One frontend and what is behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontendView {
    /// The cluster IP.
    pub ip: IpAddr,
    /// The Service port.
    pub port: u16,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The Service port's name (empty for a Service's one unnamed port).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub port_name: String,
    /// Every endpoint of the Service's slices of the frontend's family that has this port, sorted
    /// by address and port.
    pub backends: Vec<BackendView>,
}

/// One endpoint address behind a frontend.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BackendView {
    /// The endpoint's address.
    pub ip: IpAddr,
    /// The backend port (the slice's port of the Service port's name).
    pub port: u16,
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
    /// The state of `e`.
    #[must_use]
    pub fn of(e: &Endpoint) -> Self {
        if e.serves_new_flows() {
            Self::Ready
        } else if e.terminating {
            Self::Terminating
        } else {
            Self::NotReady
        }
    }

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

fn backends(
    service: &Service,
    ip: IpAddr,
    port: &ServicePort,
    slices: &Slices,
) -> Vec<BackendView> {
    let mut out = Vec::new();
    for slice in slices
        .values()
        .filter(|s| s.namespace == service.namespace && s.service == service.name)
    {
        let Some(target) = backend_port(port, slice) else {
            continue;
        };
        for e in &slice.endpoints {
            let state = BackendState::of(e);
            for addr in e.addresses.iter().filter(|a| a.is_ipv4() == ip.is_ipv4()) {
                out.push(BackendView {
                    ip: *addr,
                    port: target,
                    state,
                    slice: slice.name.clone(),
                    node: e.node.clone(),
                });
            }
        }
    }
    out.sort();
    out
}

/// Every Service, by (namespace, name).
#[must_use]
pub fn views(services: &Services, slices: &Slices) -> Vec<ServiceView> {
    services
        .values()
        .map(|service| ServiceView {
            namespace: service.namespace.clone(),
            name: service.name.clone(),
            affinity_timeout_seconds: match service.affinity {
                SessionAffinity::None => None,
                SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
            },
            frontends: service
                .cluster_ips
                .iter()
                .flat_map(|ip| {
                    service.ports.iter().map(|port| FrontendView {
                        ip: *ip,
                        port: port.port,
                        protocol: protocol_name(port.protocol),
                        port_name: port.name.clone(),
                        backends: backends(service, *ip, port, slices),
                    })
                })
                .collect(),
        })
        .collect()
}
