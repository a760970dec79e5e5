//! From `v1 Service` and `discovery.k8s.io/v1 EndpointSlice` to the model. Each refusal names the
//! field and how to fix it (the `policy::convert` error type, so the directory reports it the
//! same way); the caller adds where the object came from.

use k8s_openapi::{
    api::{core::v1::Service as K8sService, discovery::v1::EndpointSlice as K8sSlice},
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::model::{
    DEFAULT_AFFINITY_TIMEOUT_SECONDS, Endpoint, EndpointPort, EndpointSlice, Service, ServicePort,
    SessionAffinity, TargetPort,
};
use crate::calc::policy::convert::{
    ConvertError, DEFAULT_NAMESPACE, address, port_number, protocol, valid_port_name,
};

/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A Service: its cluster IPs, ports and session affinity. A headless Service (`clusterIP:
/// None`) converts with no cluster IP (nothing to translate).
pub fn service(s: &K8sService) -> Result<Service, ConvertError> {
    let name = s.metadata.name.clone().ok_or(ConvertError::Missing {
        field: "metadata.name".into(),
        hint: "give the Service a name",
    })?;
    let namespace = s
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    let spec = s.spec.clone().unwrap_or_default();
    let texts: Vec<(String, String)> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.clone()))
            .collect(),
        (_, Some(ip)) => vec![("spec.clusterIP".to_owned(), ip.clone())],
        _ => Vec::new(),
    };
    let mut cluster_ips = Vec::new();
    for (field, text) in texts {
        if text == "None" || text.is_empty() {
            continue;
        }
        let ip = address(&text, &field)?;
        if cluster_ips
            .iter()
            .any(|c: &std::net::IpAddr| c.is_ipv4() == ip.is_ipv4())
        {
            return Err(ConvertError::invalid(
                field,
                "a Service has at most one cluster IP per address family",
            ));
        }
        cluster_ips.push(ip);
    }
    let node_ports = match spec.type_.as_deref() {
        // An ExternalName Service is a DNS name: it has no cluster IP, so nothing is translated.
        None | Some("ClusterIP" | "ExternalName") => false,
        Some("NodePort" | "LoadBalancer") => true,
        Some(other) => {
            return Err(ConvertError::invalid(
                "spec.type",
                format!("{other:?} is not ClusterIP, NodePort, LoadBalancer or ExternalName"),
            ));
        }
    };
    let external_local = local_policy(
        spec.external_traffic_policy.as_deref(),
        "spec.externalTrafficPolicy",
    )?;
    let internal_local = local_policy(
        spec.internal_traffic_policy.as_deref(),
        "spec.internalTrafficPolicy",
    )?;
    let listed = spec.ports.clone().unwrap_or_default();
    let mut ports: Vec<ServicePort> = Vec::with_capacity(listed.len());
    for (i, p) in listed.iter().enumerate() {
        let at = format!("spec.ports[{i}]");
        let port = port_number(p.port, &format!("{at}.port"))?;
        let protocol = protocol(p.protocol.as_deref(), &format!("{at}.protocol"))?;
        let name = p.name.clone().unwrap_or_default();
        if listed.len() > 1 && name.is_empty() {
            return Err(ConvertError::invalid(
                format!("{at}.name"),
                "a Service with several ports must name each",
            ));
        }
        if ports.iter().any(|q| q.name == name) {
            return Err(ConvertError::invalid(
                format!("{at}.name"),
                format!("port name {name:?} is used twice; give each port its own name"),
            ));
        }
        if ports
            .iter()
            .any(|q| q.port == port && q.protocol == protocol)
        {
            return Err(ConvertError::invalid(
                format!("{at}.port"),
                format!("port {port} is listed twice for the same protocol"),
            ));
        }
        let target = target_port(p.target_port.as_ref(), port, &format!("{at}.targetPort"))?;
        let node_port = match (node_ports, p.node_port) {
            (false, _) => None,
            (true, Some(n)) => Some(port_number(n, &format!("{at}.nodePort"))?),
            (true, None) => {
                return Err(ConvertError::Missing {
                    field: format!("{at}.nodePort"),
                    hint: "give every port of a NodePort Service its nodePort (the API server allocates one; the directory has no allocator)",
                });
            }
        };
        if let Some(n) = node_port
            && ports
                .iter()
                .any(|q| q.node_port == Some(n) && q.protocol == protocol)
        {
            return Err(ConvertError::invalid(
                format!("{at}.nodePort"),
                format!("nodePort {n} is listed twice for the same protocol"),
            ));
        }
        if let Some(n) = node_port
            && !maps_schema::service::pod_nodeport(n)
        {
            tracing::warn!(
                service = %format!("{namespace}/{name}"),
                field = %format!("{at}.nodePort"),
                node_port = n,
                "this nodePort is outside 30000-32767: it is served on the NodePort interfaces, but pods cannot reach it on their own node's address; use the Service's cluster IP from pods"
            );
        }
        ports.push(ServicePort {
            name,
            protocol,
            port,
            target,
            node_port,
        });
    }
    let affinity = match spec.session_affinity.as_deref() {
        None | Some("None") => SessionAffinity::None,
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            let timeout_seconds = match timeout {
                None => DEFAULT_AFFINITY_TIMEOUT_SECONDS,
                Some(t) => u32::try_from(t)
                    .ok()
                    .filter(|t| (1..=86_400).contains(t))
                    .ok_or_else(|| {
                        ConvertError::invalid(
                            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                            format!("{t} is not between 1 and 86400 seconds"),
                        )
                    })?,
            };
            SessionAffinity::ClientIp { timeout_seconds }
        }
        Some(other) => {
            return Err(ConvertError::invalid(
                "spec.sessionAffinity",
                format!("{other:?} is not None or ClientIP"),
            ));
        }
    };
    let external_ips = external_ips(s)?;
    Ok(Service {
        namespace,
        name,
        cluster_ips,
        external_ips,
        ports,
        affinity,
        external_local,
        internal_local,
    })
}

/// `spec.externalIPs`, then (a `LoadBalancer`'s) the `ip`s of `status.loadBalancer.ingress` (a
/// hostname-only ingress has no address to serve), without repeats.
fn external_ips(s: &K8sService) -> Result<Vec<std::net::IpAddr>, ConvertError> {
    let spec = s.spec.as_ref();
    let mut texts: Vec<(String, String)> = spec
        .and_then(|spec| spec.external_ips.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, ip)| (format!("spec.externalIPs[{i}]"), ip.clone()))
        .collect();
    let is_lb = spec.and_then(|spec| spec.type_.as_deref()) == Some("LoadBalancer");
    if is_lb {
        let ingress = s
            .status
            .as_ref()
            .and_then(|st| st.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        for (i, entry) in ingress.into_iter().flatten().enumerate() {
            if let Some(ip) = &entry.ip {
                texts.push((format!("status.loadBalancer.ingress[{i}].ip"), ip.clone()));
            }
        }
    }
    let mut out = Vec::new();
    for (field, text) in texts {
        let ip = address(&text, &field)?;
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// A traffic policy (`Cluster`, the default, or `Local`): whether it is `Local`.
fn local_policy(value: Option<&str>, field: &'static str) -> Result<bool, ConvertError> {
    match value {
        None | Some("Cluster") => Ok(false),
        Some("Local") => Ok(true),
        Some(other) => Err(ConvertError::invalid(
            field,
            format!("{other:?} is not Cluster or Local"),
        )),
    }
}

fn target_port(
    target: Option<&IntOrString>,
    port: u16,
    field: &str,
) -> Result<TargetPort, ConvertError> {
    match target {
        None => Ok(TargetPort::Number(port)),
        Some(IntOrString::Int(n)) => Ok(TargetPort::Number(port_number(*n, field)?)),
        Some(IntOrString::String(text)) => {
            if let Ok(n) = text.parse::<i32>() {
                return Ok(TargetPort::Number(port_number(n, field)?));
            }
            valid_port_name(text).map_err(|e| ConvertError::invalid(field, e))?;
            Ok(TargetPort::Named(text.clone()))
        }
    }
}

/// An EndpointSlice: its Service (label `kubernetes.io/service-name`), ports and endpoints.
/// Only `IPv4` and `IPv6` slices are accepted (`FQDN` slices name no address to translate to).
pub fn endpoint_slice(s: &K8sSlice) -> Result<EndpointSlice, ConvertError> {
    let name = s.metadata.name.clone().ok_or(ConvertError::Missing {
        field: "metadata.name".into(),
        hint: "give the EndpointSlice a name",
    })?;
    let namespace = s
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    let service = s
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .cloned()
        .ok_or(ConvertError::Missing {
            field: format!("metadata.labels[{SERVICE_NAME_LABEL}]"),
            hint: "label the EndpointSlice with the name of its Service",
        })?;
    let want_v4 = match s.address_type.as_str() {
        "IPv4" => true,
        "IPv6" => false,
        other => {
            return Err(ConvertError::invalid(
                "addressType",
                format!("{other:?} is not IPv4 or IPv6"),
            ));
        }
    };
    let mut ports = Vec::new();
    for (i, p) in s.ports.iter().flatten().enumerate() {
        let at = format!("ports[{i}]");
        let Some(n) = p.port else {
            return Err(ConvertError::Missing {
                field: format!("{at}.port"),
                hint: "give every EndpointSlice port a number",
            });
        };
        ports.push(EndpointPort {
            name: p.name.clone().unwrap_or_default(),
            protocol: protocol(p.protocol.as_deref(), &format!("{at}.protocol"))?,
            port: port_number(n, &format!("{at}.port"))?,
        });
    }
    let mut endpoints = Vec::new();
    for (i, e) in s.endpoints.iter().flatten().enumerate() {
        let at = format!("endpoints[{i}]");
        let mut addresses = Vec::with_capacity(e.addresses.len());
        for (j, text) in e.addresses.iter().enumerate() {
            let field = format!("{at}.addresses[{j}]");
            let ip = address(text, &field)?;
            if ip.is_ipv4() != want_v4 {
                return Err(ConvertError::invalid(
                    field,
                    format!("{ip} is not of the slice's addressType {}", s.address_type),
                ));
            }
            addresses.push(ip);
        }
        let conditions = e.conditions.clone().unwrap_or_default();
        let ready = conditions.ready.unwrap_or(true);
        endpoints.push(Endpoint {
            addresses,
            ready,
            serving: conditions.serving.unwrap_or(ready),
            terminating: conditions.terminating.unwrap_or(false),
            node: e.node_name.clone(),
        });
    }
    Ok(EndpointSlice {
        namespace,
        name,
        service,
        ports,
        endpoints,
    })
}
