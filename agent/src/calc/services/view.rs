//! The Services as the source describes them, for operators (`GET /v1/services`, `weir service
//! list`): one entry per frontend (cluster IP, port, protocol) of every Service with each endpoint
//! of its EndpointSlices and that endpoint's state. Only `ready` endpoints take new flows
//! (`services::desired` puts only those in the backend slots); `terminating` ones are listed so an
//! operator sees the flows they still carry; `not-ready` ones serve nothing. Computed from the
//! model alone (no kernel read): what weir wants, not what the maps hold.

use std::net::{IpAddr, SocketAddr};

use super::{
    desired::{Services, Slices, backend_port, slices_by_service},
    model::{Endpoint, EndpointSlice, Service, ServicePort, SessionAffinity},
};
use crate::calc::policy::warnings::protocol_name;

/// One frontend of one Service and what is behind it, one endpoint address behind a frontend
/// and its state (the API contract's).
pub use weir_api::{BackendState, BackendView, ServiceView};

/// The state of `e`, from its slice's conditions.
#[must_use]
pub fn backend_state(e: &Endpoint) -> BackendState {
    if e.serves_new_flows() {
        BackendState::Ready
    } else if e.terminating {
        BackendState::Terminating
    } else {
        BackendState::NotReady
    }
}

fn backends(ip: IpAddr, port: &ServicePort, slices: &[&EndpointSlice]) -> Vec<BackendView> {
    let mut found: Vec<(IpAddr, u16, BackendState, &str, Option<&String>)> = Vec::new();
    for slice in slices {
        let Some(target) = backend_port(port, slice) else {
            continue;
        };
        for e in &slice.endpoints {
            let state = backend_state(e);
            for addr in e.addresses.iter().filter(|a| a.is_ipv4() == ip.is_ipv4()) {
                found.push((*addr, target, state, &slice.name, e.node.as_ref()));
            }
        }
    }
    found.sort();
    found
        .into_iter()
        .map(|(addr, port, state, slice, node)| BackendView {
            address: SocketAddr::new(addr, port).to_string(),
            state,
            slice: slice.to_owned(),
            node: node.cloned(),
        })
        .collect()
}

/// Every frontend of every Service, by (namespace, name), then cluster IP, then port, then its
/// NodePorts; a headless ClusterIP Service has none.
#[must_use]
pub fn views(services: &Services, slices: &Slices) -> Vec<ServiceView> {
    let by_service = slices_by_service(slices);
    let none = Vec::new();
    services
        .iter()
        .flat_map(|(key, service)| views_of(service, by_service.get(key).unwrap_or(&none)))
        .collect()
}

/// The views of each Service, in (namespace, name) order: what a snapshot publishes (a change
/// replaces only its own Services' parts).
pub type ServiceViews = Vec<std::sync::Arc<Vec<ServiceView>>>;

/// The frontends of one Service (cluster IP, then external address, then port, then its
/// NodePorts) with the endpoints
/// of `slices` (its own EndpointSlices).
#[must_use]
pub fn views_of(service: &Service, slices: &[&EndpointSlice]) -> Vec<ServiceView> {
    let mut out = Vec::new();
    let affinity_timeout_seconds = match service.affinity {
        SessionAffinity::None => None,
        SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
    };
    let external = service.external_local.then(|| "Local".to_owned());
    let internal = service.internal_local.then(|| "Local".to_owned());
    let addresses = service
        .cluster_ips
        .iter()
        .map(|ip| (ip, None, internal.clone()))
        .chain(
            service
                .external_ips
                .iter()
                .map(|ip| (ip, external.clone(), None)),
        );
    for (ip, policy, internal_policy) in addresses {
        for port in &service.ports {
            out.push(ServiceView {
                service: format!("{}/{}", service.namespace, service.name),
                frontend: format!(
                    "{}/{}",
                    SocketAddr::new(*ip, port.port),
                    protocol_name(port.protocol).to_lowercase()
                ),
                port_name: port.name.clone(),
                external_traffic_policy: policy.clone(),
                internal_traffic_policy: internal_policy.clone(),
                affinity_timeout_seconds,
                backends: backends(*ip, port, slices),
            });
        }
    }
    for port in &service.ports {
        let Some(node_port) = port.node_port else {
            continue;
        };
        out.push(ServiceView {
            service: format!("{}/{}", service.namespace, service.name),
            frontend: format!(
                "*:{node_port}/{}",
                protocol_name(port.protocol).to_lowercase()
            ),
            port_name: port.name.clone(),
            external_traffic_policy: external.clone(),
            internal_traffic_policy: None,
            affinity_timeout_seconds,
            backends: backends(IpAddr::from([0u8; 4]), port, slices),
        });
    }
    out
}
