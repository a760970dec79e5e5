//! The validated Service model: a ClusterIP Service's frontends and the endpoints its
//! EndpointSlices list.

use std::net::IpAddr;

/// One Service: its ClusterIP frontends, its external ones (`spec.externalIPs` and a
/// `LoadBalancer`'s `status.loadBalancer.ingress` addresses) and, for `type: NodePort` and
/// `LoadBalancer`, its NodePorts (served on the host interfaces `--nodeport-interfaces` names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.clusterIPs` (else `spec.clusterIP`); empty for a headless Service (`None`).
    pub cluster_ips: Vec<IpAddr>,
    /// `spec.externalIPs`, then the addresses of `status.loadBalancer.ingress` (a `LoadBalancer`
    /// Service), without repeats: frontends like the cluster IPs, served to pods and on the host
    /// interfaces `--nodeport-interfaces` names.
    pub external_ips: Vec<IpAddr>,
    /// `spec.ports`, in order.
    pub ports: Vec<ServicePort>,
    /// `spec.sessionAffinity` with its timeout.
    pub affinity: SessionAffinity,
    /// `spec.externalTrafficPolicy: Local`: NodePort and external-address traffic goes to this
    /// node's endpoints only and keeps the client's address (else `Cluster`: any endpoint; another node's sees this
    /// node's address).
    pub external_local: bool,
    /// `spec.internalTrafficPolicy: Local`: traffic from this node's pods to the cluster IPs goes
    /// to this node's endpoints only (none here: rejected, as kube-proxy drops it).
    pub internal_local: bool,
}

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// `name` (empty when the Service has one unnamed port).
    pub name: String,
    /// IP protocol number (TCP 6, UDP 17, SCTP 132).
    pub protocol: u8,
    /// `port`: the frontend's port.
    pub port: u16,
    /// `targetPort` (absent: the same number as `port`).
    pub target: TargetPort,
    /// `nodePort` of a `NodePort` or `LoadBalancer` Service (`None` for other types).
    pub node_port: Option<u16>,
}

/// Where a Service port sends to on the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    /// A number.
    Number(u16),
    /// A container port name; the EndpointSlice's port of the Service port's name carries the
    /// resolved number (as the endpoint-slice controller resolves it per pod).
    Named(String),
}

/// `spec.sessionAffinity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAffinity {
    /// `None` (the default): each new flow picks by its own hash.
    None,
    /// `ClientIP`: a client's flows keep one backend for `timeout_seconds` after the last.
    ClientIp {
        /// `sessionAffinityConfig.clientIP.timeoutSeconds` (default 10800, as upstream).
        timeout_seconds: u32,
    },
}

/// The default `ClientIP` affinity timeout (`DefaultClientIPServiceAffinitySeconds`).
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

/// One `discovery.k8s.io/v1` EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSlice {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The Service it belongs to (label `kubernetes.io/service-name`).
    pub service: String,
    /// `ports`: by Service port name, the backend port number.
    pub ports: Vec<EndpointPort>,
    /// `endpoints`.
    pub endpoints: Vec<Endpoint>,
}

/// One port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPort {
    /// The Service port's name (empty for an unnamed one).
    pub name: String,
    /// IP protocol number.
    pub protocol: u8,
    /// The backend's port.
    pub port: u16,
}

/// One endpoint (a pod, usually).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `addresses` (one pod: one address per family of the slice).
    pub addresses: Vec<IpAddr>,
    /// `conditions.ready` (absent: ready, as upstream says consumers should read it).
    pub ready: bool,
    /// `conditions.serving` (absent: same as ready).
    pub serving: bool,
    /// `conditions.terminating` (absent: false).
    pub terminating: bool,
    /// `nodeName`.
    pub node: Option<String>,
}

impl Endpoint {
    /// Only ready endpoints take new flows (terminating ones keep established flows through
    /// conntrack).
    #[must_use]
    pub fn serves_new_flows(&self) -> bool {
        self.ready
    }

    /// A terminating endpoint that still serves (`serving` but not `ready`) keeps the flows it
    /// has, UDP ones included (kube-proxy leaves their conntrack entries alone); one that does
    /// not serve keeps only established TCP connections (conntrack) and gets no UDP datagram.
    #[must_use]
    pub fn keeps_flows(&self) -> bool {
        !self.ready && self.serving
    }
}
