//! `weir service list`: every frontend of every Service with the service id the maps give it and
//! every endpoint its slices name, with its state (ready endpoints hold a slot; terminating and
//! not-ready ones take no new flow).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::desired::{Services, Slices};
use crate::dataplane::services::ServiceMaps;

/// One frontend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceView {
    /// `namespace/name` of the Service.
    pub service: String,
    /// `cluster-ip:port/protocol`.
    pub frontend: String,
    /// The id in the service maps (none: not an IPv4 frontend the maps hold).
    pub service_id: Option<u32>,
    /// Endpoints of the slices for this port.
    pub backends: Vec<BackendView>,
}

/// One endpoint address behind a frontend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendView {
    /// `address:port`.
    pub address: String,
    /// `ready` (holds a slot), `terminating` or `not-ready`.
    pub state: String,
    /// The backend id in the maps, for a ready one.
    pub backend_id: Option<u32>,
}

fn protocol(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        132 => "sctp".into(),
        other => other.to_string(),
    }
}

/// The views, from the sources' model and the maps' desired contents.
#[must_use]
pub fn views(services: &Services, slices: &Slices, maps: &ServiceMaps) -> Vec<ServiceView> {
    let frontends = maps.frontends();
    let mut out = Vec::new();
    for service in services.values() {
        for ip in &service.cluster_ips {
            for port in &service.ports {
                let entry = frontends.iter().find(|(k, _, _)| {
                    IpAddr::from(k.addr) == *ip
                        && k.port == port.port
                        && k.protocol == port.protocol
                });
                let mut backends = Vec::new();
                for slice in slices
                    .values()
                    .filter(|s| s.namespace == service.namespace && s.service == service.name)
                {
                    let target = slice
                        .ports
                        .iter()
                        .find(|p| p.name == port.name && p.protocol == port.protocol)
                        .map(|p| p.port);
                    for e in &slice.endpoints {
                        for addr in &e.addresses {
                            let state = if e.ready {
                                "ready"
                            } else if e.terminating {
                                "terminating"
                            } else {
                                "not-ready"
                            };
                            let backend_id = entry.and_then(|(_, _, bs)| {
                                bs.iter()
                                    .find(|(_, b)| {
                                        IpAddr::from(b.addr) == *addr && Some(b.port) == target
                                    })
                                    .map(|(id, _)| *id)
                            });
                            backends.push(BackendView {
                                address: match target {
                                    Some(p) => format!("{addr}:{p}"),
                                    None => format!("{addr}:?"),
                                },
                                state: state.into(),
                                backend_id,
                            });
                        }
                    }
                }
                out.push(ServiceView {
                    service: format!("{}/{}", service.namespace, service.name),
                    frontend: format!("{ip}:{}/{}", port.port, protocol(port.protocol)),
                    service_id: entry.map(|(_, v, _)| v.service_id),
                    backends,
                });
            }
        }
    }
    out
}
