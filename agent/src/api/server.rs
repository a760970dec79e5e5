//! The API server: axum over the agent's unix socket (mode 0600). Reads come from the snapshot
//! the dataplane loop publishes; writes are commands to the loop that answer once the generation
//! carrying them is applied. No handler takes a lock the loop holds across kernel I/O.

use std::{
    collections::BTreeSet, os::unix::fs::PermissionsExt as _, path::Path, sync::Arc, time::Duration,
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path as UrlPath, Query, State},
    http::StatusCode,
    routing::{get, post},
};
use serde::{Deserialize, de::DeserializeOwned};
use tokio::net::UnixListener;
use weir_api::code;

use super::{
    error::ApiError,
    types::{
        AllocateResponse, DeleteResponse, EndpointRequest, EndpointView, IpamOpsRequest,
        NOT_THIS_DATASTORE, ReleaseRequest, ReleaseResponse, Status, StatusDetail,
        conntrack_status, dataplane_status, socket_lb_scope,
    },
};
use crate::{
    calc::ipam_service::{AllocateRequest, IpamService, IpamServiceError},
    control::applier::{LoopError, LoopHandle, WriteError},
    dataplane::conntrack::{self, CtStats, CtView},
    kernel::InspectIo,
    sources::registry::{self, Endpoint},
};

/// How long a request may wait for the dataplane to apply its change.
const APPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request waits for a host link the CNI just created to be seen.
const LINK_TIMEOUT: Duration = Duration::from_secs(10);
/// With `--source kubernetes`, how long a CNI request waits for the watch to deliver its Pod
/// (kubelet creates the sandbox right after the pod is scheduled; the watch is usually ahead).
pub const POD_WAIT: Duration = Duration::from_secs(10);
/// Time budget of an allocation once it holds the per-host lock.
const ALLOCATE_BUDGET: Duration = Duration::from_secs(30);

/// What the handlers share.
pub struct Api {
    /// The dataplane loop: its snapshot for reads, its commands for writes.
    pub dataplane: LoopHandle,
    /// IPAM.
    pub ipam: Arc<IpamService>,
    /// Node name.
    pub node: String,
    /// Paths (pins for `weir bpf`).
    pub paths: crate::paths::Paths,
    /// Conntrack sweep counters.
    pub ct: Arc<std::sync::Mutex<CtStats>>,
    /// The NAT map's pressure, kept by the NAT sweep.
    pub nat: Arc<std::sync::Mutex<crate::dataplane::nat_stats::NatStats>>,
    /// Held by each conntrack sweep and flush for its whole run: a flush in the middle of a sweep
    /// would be overwritten by the sweep's stats and its entries counted as evictions.
    pub ct_ops: Arc<std::sync::Mutex<()>>,
    /// The conntrack layout in use.
    pub ct_layout: u32,
    /// How the endpoint programs attach (told to weir-cni in allocate answers).
    pub tc_attach: attach::Mechanism,
    /// The kernel reads operators ask for (`weir bpf`, `weir policy rules`, `weir monitor`),
    /// through the one seam: no handler opens a pin itself.
    pub kernel: Arc<dyn InspectIo>,
    /// The one reader of the drop events ring.
    pub monitor: crate::observe::monitor::Monitor,
    /// With a cluster source (`--source kubernetes`), how long a CNI request waits for the source
    /// to deliver the Pod it names before it is refused (as cilium-cni waits): a pod's labels and
    /// pool annotations come from its Pod object, never from the CNI. `None`: the standalone
    /// source, where a pod without a Pod document takes its namespace's identity.
    pub pod_wait: Option<Duration>,
    /// The cgroup socket LB is attached to (`--socket-lb-cgroup`; None: off).
    pub socket_lb: Option<std::path::PathBuf>,
    /// Which sockets socket LB places (None: off).
    pub socket_lb_scope: Option<crate::config::SocketLbScope>,
}

/// Waits (bounded by `api.pod_wait`) until the source has the Pod `namespace/pod` the request
/// names; answers 503
/// `pod-unknown` (weir-cni: try again later) when it does not arrive.
async fn wait_for_pod(api: &Api, namespace: &str, pod: &str) -> Result<(), ApiError> {
    // A request that names no pod (a runtime other than kubelet, `weir ipam`) has no Pod to wait
    // for: it takes its namespace's identity, as with the standalone source.
    let Some(limit) = api.pod_wait.filter(|_| !pod.is_empty()) else {
        return Ok(());
    };
    let mut snapshots = api.dataplane.subscribe();
    let known = snapshots.wait_for(|s| s.ipam_hints.knows_pod(namespace, pod));
    match tokio::time::timeout(limit, known).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err(loop_error(LoopError::Stopped)),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::POD_UNKNOWN,
            format!(
                "pod {namespace}/{pod} is not known to the Kubernetes source after {} s: its labels and pool annotations come from its Pod object, so the agent gives it no address or identity before the watch delivers it; check `weir status` (is the source stale?) and that the Pod exists on the API server",
                limit.as_secs()
            ),
        )),
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid: {e}")))
}

/// The router.
pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/endpoints", get(list_endpoints))
        .route("/v1/nodes", get(list_nodes))
        .route("/v1/addresses", get(list_addresses))
        .route("/v1/services", get(super::services::list))
        .route("/v1/services/flows", get(super::services::flows))
        .route(
            "/v1/endpoints/{key}",
            get(get_endpoint).put(put_endpoint).delete(delete_endpoint),
        )
        .route("/v1/ipam/allocate", post(allocate))
        .route("/v1/ipam/release", post(release))
        .route("/v1/ipam/handles/{handle}", get(handle))
        .route("/v1/ipam/ops", post(ipam_ops))
        .route("/v1/bpf/maps", get(bpf_maps))
        .route("/v1/bpf/ct", get(ct_list).delete(ct_flush))
        .route("/v1/bpf/nat", get(nat_list))
        .route("/v1/bpf/counters", get(counters))
        .route("/v1/policy/trace", post(policy_trace))
        .route("/v1/policy/rules", get(crate::api::observe::rules))
        .route("/v1/monitor", get(monitor))
        .route("/v1/log-level", post(super::log_level::set))
        .with_state(api)
}

/// Binds the socket (replacing a stale one) with mode 0600 and serves until the task is dropped.
pub async fn serve(path: &Path, api: Arc<Api>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    axum::serve(listener, router(api)).await
}

fn loop_error(e: LoopError) -> ApiError {
    ApiError::unavailable(e.to_string())
}

fn write_error(e: WriteError) -> ApiError {
    match e {
        WriteError::Refused(e) => e.into(),
        WriteError::Loop(e) => loop_error(e),
    }
}

async fn status(State(api): State<Arc<Api>>) -> ApiResult<Status> {
    let snapshot = api.dataplane.snapshot();
    let summary = snapshot.summary.clone();
    let dataplane = dataplane_status(&snapshot.stats);
    let applied = snapshot.applied.clone();
    // A datastore that cannot be read is the caller's error to see, not an empty pool list; but an
    // embedded store the agent knows to be degraded answers with the pools last read, beside the
    // fault in `storage` (what an operator needs to see then).
    let pools = match api.ipam.pools().await {
        Ok(pools) => pools,
        Err(e) if api.ipam.storage().datastore_degraded() => {
            tracing::debug!(error = %e, "status: the degraded datastore cannot be read; showing the pools last read");
            api.ipam.last_pools()
        }
        Err(e) => return Err(e.into()),
    };
    let storage = api.ipam.storage().status();
    Ok(Json(Status {
        ready: applied.ready,
        node: api.node.clone(),
        bpf_root: api.paths.bpf_root.clone(),
        endpoints: summary.endpoints,
        pools,
        detail: StatusDetail {
            state: summary,
            applied,
            dataplane,
            conntrack: conntrack_status(
                &api.ct
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            ),
            nodes: crate::cluster::routing::seen_now(&snapshot.nodes),
            socket_lb: api.socket_lb.clone(),
            socket_lb_scope: api.socket_lb_scope.map(socket_lb_scope),
            nat: *api
                .nat
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            storage,
        },
    }))
}

/// One pinned map, for `weir bpf maps` (the API contract's).
pub use weir_api::MapView;

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

/// Runs a kernel read off the runtime's threads (each is a few syscalls, a conntrack listing
/// many).
pub(super) async fn blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| internal(format!("the kernel read did not finish: {e}")))?
        .map_err(internal)
}

async fn bpf_maps(State(api): State<Arc<Api>>) -> ApiResult<Vec<MapView>> {
    let (kernel, layout, paths) = (Arc::clone(&api.kernel), api.ct_layout, api.paths.clone());
    let maps = blocking(move || {
        crate::kernel::real::loader::map_names(layout)
            .into_iter()
            .map(|name| {
                let meta = kernel.map_meta(&name)?;
                Ok::<_, crate::kernel::KernelError>(MapView {
                    pin: paths.map_pin(&name).display().to_string(),
                    name,
                    id: meta.id,
                    map_type: meta.map_type,
                    key_size: meta.key_size,
                    value_size: meta.value_size,
                    max_entries: meta.max_entries,
                    flags: meta.flags,
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    Ok(Json(maps))
}

async fn ct_list(State(api): State<Arc<Api>>) -> ApiResult<Vec<CtView>> {
    let ct = api.kernel.conntrack(api.ct_layout);
    Ok(Json(blocking(move || conntrack::list_with(&*ct)).await?))
}

async fn nat_list(
    State(api): State<Arc<Api>>,
) -> ApiResult<Vec<crate::dataplane::masquerade::NatView>> {
    let kernel = Arc::clone(&api.kernel);
    Ok(Json(
        blocking(move || {
            let nat = kernel.nat()?;
            crate::dataplane::masquerade::list_nat(&*nat, crate::kernel::real::ct::now_ns())
        })
        .await?,
    ))
}

async fn monitor(State(api): State<Arc<Api>>) -> Result<axum::response::Response, ApiError> {
    api.monitor.response(&*api.kernel).map_err(internal)
}

async fn policy_trace(
    State(api): State<Arc<Api>>,
    body: Bytes,
) -> ApiResult<crate::observe::trace::TraceResult> {
    let req: crate::observe::trace::TraceRequest = parse(&body)?;
    let proto = crate::observe::trace::protocol(&req.protocol).ok_or_else(|| {
        ApiError::invalid(format!(
            "protocol {:?} is not tcp, udp, sctp, icmp, icmpv6 or a number",
            req.protocol
        ))
    })?;
    let result = api
        .dataplane
        .trace(req, proto, Some(Arc::clone(&api.kernel) as _))
        .await
        .map_err(loop_error)?;
    Ok(Json(result))
}

async fn counters(
    State(api): State<Arc<Api>>,
) -> ApiResult<Vec<crate::dataplane::counters::CounterView>> {
    let kernel = Arc::clone(&api.kernel);
    Ok(Json(
        blocking(move || crate::dataplane::counters::read(&*kernel)).await?,
    ))
}

async fn ct_flush(State(api): State<Arc<Api>>) -> ApiResult<weir_api::CtFlushResponse> {
    let mut ct = api.kernel.conntrack(api.ct_layout);
    // Never inside a sweep, and kept out of its eviction count (see `Api::ct_ops`).
    let upkeep = conntrack::CtUpkeep::new(Arc::clone(&api.ct_ops), Arc::clone(&api.ct));
    let n = blocking(move || upkeep.flush(&mut *ct)).await?;
    Ok(Json(weir_api::CtFlushResponse { flushed: n }))
}

/// `GET /v1/nodes`: the cluster's nodes as the loop knows them (no datastore read).
async fn list_nodes(
    State(api): State<Arc<Api>>,
) -> ApiResult<Vec<crate::cluster::routing::NodeStatus>> {
    Ok(Json(crate::cluster::routing::seen_now(
        &api.dataplane.snapshot().nodes,
    )))
}

/// `GET /v1/addresses`: every pod address known cluster-wide, with its identity and node.
async fn list_addresses(
    State(api): State<Arc<Api>>,
) -> ApiResult<Vec<crate::cluster::AddressView>> {
    Ok(Json(api.dataplane.addresses().await.map_err(loop_error)?))
}

async fn list_endpoints(State(api): State<Arc<Api>>) -> ApiResult<Vec<EndpointView>> {
    let snapshot = api.dataplane.snapshot();
    Ok(Json(
        snapshot
            .endpoints
            .values()
            .map(|v| EndpointView::clone(v))
            .collect(),
    ))
}

async fn get_endpoint(
    State(api): State<Arc<Api>>,
    UrlPath(key): UrlPath<String>,
) -> ApiResult<EndpointView> {
    let snapshot = api.dataplane.snapshot();
    match snapshot.endpoint(&key) {
        Some(view) => Ok(Json(view.clone())),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no endpoint {key}"),
        )),
    }
}

async fn put_endpoint(
    State(api): State<Arc<Api>>,
    UrlPath(key): UrlPath<String>,
    body: Bytes,
) -> ApiResult<EndpointView> {
    let req: EndpointRequest = parse(&body)?;
    if registry::key(&req.container_id, &req.ifname) != key {
        return Err(ApiError::invalid(format!(
            "the path names endpoint {key} but the body is {}:{}",
            req.container_id, req.ifname
        )));
    }
    if req.handle.is_empty() {
        return Err(ApiError::invalid(
            "handle must name the IPAM handle that holds the endpoint's addresses",
        ));
    }
    let held: BTreeSet<_> = api.ipam.ips_of(&req.handle).await?.into_iter().collect();
    if let Some(ip) = req.ips.iter().find(|ip| !held.contains(ip)) {
        return Err(ApiError::invalid(format!(
            "address {ip} is not allocated under handle {}; allocate it first",
            req.handle
        )));
    }
    // The CNI created the host link just before: wait (bounded) until the link watcher saw it.
    if !api
        .dataplane
        .wait_link(&req.host_ifname, LINK_TIMEOUT)
        .await
    {
        return Err(ApiError::invalid(format!(
            "host interface {} does not exist on this node; create the veth before registering",
            req.host_ifname
        )));
    }
    let namespace = if req.namespace.is_empty() {
        "default".to_owned()
    } else {
        req.namespace
    };
    wait_for_pod(&api, &namespace, &req.pod).await?;
    let endpoint = Endpoint {
        id: 0,
        container_id: req.container_id,
        ifname: req.ifname,
        host_ifname: req.host_ifname,
        netns: req.netns,
        // A pod always has a namespace; without Kubernetes arguments it is `default`.
        namespace,
        pod: req.pod,
        labels: req.labels,
        handle: req.handle,
        ips: req.ips,
    };
    let pending = api
        .dataplane
        .upsert_endpoint(endpoint, APPLY_TIMEOUT)
        .await
        .map_err(write_error)?;
    api.ipam.confirm(&pending.value.endpoint.handle).await?;
    let view = pending.value.clone();
    pending.applied().await.map_err(loop_error)?;
    Ok(Json(view))
}

#[derive(Deserialize)]
struct DeleteQuery {
    #[serde(default)]
    release: bool,
}

async fn delete_endpoint(
    State(api): State<Arc<Api>>,
    UrlPath(key): UrlPath<String>,
    Query(query): Query<DeleteQuery>,
) -> ApiResult<DeleteResponse> {
    let pending = api
        .dataplane
        .delete_endpoint(key, APPLY_TIMEOUT)
        .await
        .map_err(write_error)?;
    let removed = pending.value.clone();
    pending.applied().await.map_err(loop_error)?;
    let mut released = Vec::new();
    if query.release
        && let Some(endpoint) = &removed
        && !endpoint.handle.is_empty()
    {
        released = api.ipam.release_handle(&endpoint.handle).await?;
    }
    Ok(Json(DeleteResponse {
        deleted: removed.is_some(),
        released,
        bpf_root: api.paths.bpf_root.clone(),
    }))
}

async fn allocate(State(api): State<Arc<Api>>, body: Bytes) -> ApiResult<AllocateResponse> {
    let req: AllocateRequest = parse(&body)?;
    // The pod's pool and address annotations (and its namespace's), as the source last gave them.
    let namespace = if req.namespace.is_empty() {
        "default"
    } else {
        req.namespace.as_str()
    };
    wait_for_pod(&api, namespace, &req.pod).await?;
    let hints = api
        .dataplane
        .snapshot()
        .ipam_hints
        .for_pod(namespace, &req.pod);
    Ok(Json(AllocateResponse {
        allocation: api
            .ipam
            .allocate_for_pod(&req, &hints, ALLOCATE_BUDGET)
            .await?,
        bpf_root: api.paths.bpf_root.clone(),
        tc_attach: Some(api.tc_attach),
    }))
}

/// A `weir ipam` operation, run on the agent's datastore when it is the one the command names.
async fn ipam_ops(State(api): State<Arc<Api>>, body: Bytes) -> ApiResult<ipam::ops::Outcome> {
    let req: IpamOpsRequest = parse(&body)?;
    let named: ipam::store::Datastore = req
        .datastore
        .parse()
        .map_err(|e: ipam::store::any::DatastoreParseError| ApiError::invalid(e.to_string()))?;
    if !api.ipam.holds(&named) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            NOT_THIS_DATASTORE,
            format!(
                "this agent does not hold {}: open that datastore directly",
                req.datastore
            ),
        ));
    }
    let outcome = ipam::ops::execute(api.ipam.ipam(), req.operation)
        .await
        .map_err(IpamServiceError::from)?;
    Ok(Json(outcome))
}

async fn handle(
    State(api): State<Arc<Api>>,
    UrlPath(handle): UrlPath<String>,
) -> ApiResult<crate::calc::ipam_service::HandleStatus> {
    Ok(Json(api.ipam.handle(&handle).await?))
}

async fn release(State(api): State<Arc<Api>>, body: Bytes) -> ApiResult<ReleaseResponse> {
    let req: ReleaseRequest = parse(&body)?;
    match (req.handle, req.ips.is_empty()) {
        (Some(handle), true) => {
            let released = api.ipam.release_handle(&handle).await?;
            Ok(Json(ReleaseResponse {
                released,
                not_allocated: Vec::new(),
            }))
        }
        (None, false) => {
            let (released, not_allocated) = api.ipam.release_ips(&req.ips).await?;
            Ok(Json(ReleaseResponse {
                released,
                not_allocated,
            }))
        }
        _ => Err(ApiError::invalid(
            "give either handle or ips, not both and not neither",
        )),
    }
}
