//! `weir agent`: load (reusing unchanged pinned programs), restore the registry, start the
//! dataplane loop (which owns the node) and its sources (link watcher, policy files, the API),
//! serve the API and metrics from the loop's snapshots; on SIGTERM exit leaving every pin and
//! attachment in place so traffic keeps its verdicts while the agent is away.

use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use serde::Serialize;

use ipam::store::AnyStore;

use crate::{
    EBPF_OBJECT,
    api::server::{self, Api},
    attach::{AttachError, AttachMode},
    calc::{
        identity::Identities,
        identity_store::ClusterIdentities,
        ipam_service::{IpamService, IpamServiceError},
    },
    cluster::setup::NodeRecords,
    config::{Config, SourceMode},
    control::{
        applier::{self, LoopError, LoopHandle, MAX_FAILURES},
        node::{Node, NodeError},
    },
    dataplane::{
        attachments::AttachDriver,
        conntrack::{self, CtStats},
        endpoints::EndpointsManager,
        map_driver::MapDriver,
        masquerade::MasqDriver,
        pins,
        plane::Dataplane,
        prefilter::{Prefilter, PrefilterError},
    },
    kernel::{
        KernelError, PinnedHash, PinnedLpm,
        migrate::{self, MigrateError, MigrationReport},
        real::{
            loader::{self, LoadReport},
            netlink_links,
            programs::{Programs, ProgramsError},
            tc_links::TcLinks,
        },
    },
    observe::metrics_server,
    setup::host,
    sources::{link_source, policy_dir, pools::masquerade_pools, prefilter_file::DenyFile},
};

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Loading failed.
    #[error(transparent)]
    Programs(#[from] ProgramsError),
    /// BPF host routing could not be set.
    #[error(transparent)]
    HostRouting(#[from] crate::dataplane::host_routing::HostRoutingError),
    /// Socket LB could not be attached or detached.
    #[error(transparent)]
    SocketLb(#[from] crate::dataplane::socket_lb::SocketLbError),
    /// The conntrack maps could not be migrated (or are newer than this agent).
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    /// The pin root is unusable.
    #[error(transparent)]
    Bpffs(#[from] crate::kernel::real::bpffs::BpffsError),
    /// `WEIR_FAILPOINT` names no failpoint.
    #[error(transparent)]
    Failpoint(#[from] migrate::failpoint::UnknownFailpoint),
    /// Attaching the prefilter failed.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// A pinned map could not be opened.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The prefilter could not be set up.
    #[error(transparent)]
    Prefilter(#[from] PrefilterError),
    /// The persisted state could not be restored.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The IPAM datastore could not be opened.
    #[error(transparent)]
    Ipam(#[from] IpamServiceError),
    /// Forwarding or the CNI configuration could not be set up.
    #[error(transparent)]
    Setup(#[from] host::SetupError),
    /// A socket or signal could not be set up.
    #[error("cannot {what}: {source}")]
    Io {
        /// What.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The dataplane kept failing.
    #[error(
        "the dataplane failed {0} times in a row; exiting so the agent is restarted (traffic stays fail-closed)"
    )]
    Failing(u32),
    /// The dataplane loop could not be started.
    #[error(transparent)]
    Loop(#[from] LoopError),
    /// The Kubernetes source could not be set up.
    #[error(transparent)]
    Kube(#[from] crate::sources::kube::KubeError),
    /// Node routing could not be set up.
    #[error(transparent)]
    Routing(#[from] crate::cluster::setup::RoutingSetupError),
    /// The first apply did not complete.
    #[error("the first dataplane apply did not complete within {0} s: {1}")]
    NotReady(u64, String),
}

/// What the agent prints once ready (one JSON line on stdout).
#[derive(Debug, Serialize)]
pub struct Started<'a> {
    /// Always `"started"`.
    pub event: &'static str,
    /// The node.
    pub node: &'a str,
    /// Programs and maps, read from their pins.
    pub loaded: LoadReport,
    /// Program name → (id, reused from its pin).
    pub programs: Vec<(String, u32, bool)>,
    /// Prefilter attachments.
    pub prefilter: Vec<(String, AttachMode)>,
    /// Masquerade attachments: (interface, program, how).
    pub masquerade: Vec<(String, String, AttachMode)>,
    /// Socket LB: the cgroup its programs are attached to (none: off), links removed.
    pub socket_lb: crate::dataplane::socket_lb::SocketLbReport,
    /// Endpoints restored from the registry.
    pub endpoints: usize,
    /// The conntrack layout in use.
    pub ct_layout: u32,
    /// What the conntrack migration did (empty when nothing was owed).
    pub migration: MigrationReport,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// Runs the agent until SIGTERM or SIGINT.
/// The kernel side loaded: the eBPF object, the conntrack layout and its migration, the programs,
/// socket LB, and the prefilter opened with the deny file's first read (the loop applies it).
struct Loaded {
    object: std::borrow::Cow<'static, [u8]>,
    ct_layout: u32,
    pending: migrate::Pending,
    migration: MigrationReport,
    programs: Programs,
    socket_lb: crate::dataplane::socket_lb::SocketLbReport,
    prefilter: Prefilter,
    deny_file: Option<DenyFile>,
}

/// Step 1: conntrack first (refuse a newer layout, copy an older one), then the programs, BPF
/// host routing, socket LB, the eBPF log, and the XDP prefilter's program and maps opened.
fn load_kernel(config: &Config) -> Result<Loaded, DaemonError> {
    let paths = &config.paths;
    migrate::failpoint::validate().map_err(DaemonError::Failpoint)?;
    let object: std::borrow::Cow<'static, [u8]> = match &config.ebpf_object {
        Some(path) => std::fs::read(path)
            .map_err(io_err(format!("read the eBPF object {}", path.display())))?
            .into(),
        None => EBPF_OBJECT.into(),
    };
    let ct_layout = migrate::object_layout(&object)?;
    crate::kernel::real::bpffs::ensure_mounted(std::path::Path::new(crate::paths::BPFFS_MOUNT))?;
    crate::kernel::real::bpffs::ensure_pin_dir(&paths.bpf_root)?;
    crate::kernel::real::bpffs::ensure_pin_dir(&paths.maps_dir())?;
    let pending = migrate::prepare(&paths.maps_dir(), ct_layout, config.ct_max_entries)?;
    let migration = pending.report.clone();
    let programs = Programs::load(paths, &object, &pending.sizes)?;
    crate::dataplane::host_routing::reconcile(
        &mut crate::kernel::real::host_fwd::PinnedHostFwd::new(paths),
        config.host_routing == crate::config::HostRouting::Bpf,
    )?;
    let socket_lb = crate::dataplane::socket_lb::reconcile(
        &mut crate::kernel::real::socket_lb::PinnedSocketLb::new(paths),
        config.socket_lb_cgroup.as_deref(),
        config.socket_lb_scope,
    )?;
    crate::observe::ebpf_log::start(paths);
    // The XDP prefilter: a driver the loop applies from its first pass, with the deny file's
    // first read (later reads come from its source).
    let (deny_file, first) = config
        .prefilter_deny_file
        .clone()
        .map(DenyFile::first_read)
        .unzip();
    let prefilter = Prefilter::open(
        paths,
        &config.prefilter_interfaces,
        &config.prefilter_deny,
        first.as_ref(),
    )?;
    Ok(Loaded {
        object,
        ct_layout,
        pending,
        migration,
        programs,
        socket_lb,
        prefilter,
        deny_file,
    })
}

/// Step 2: the drivers and managers over the pinned maps and the loaded programs.
fn dataplane(config: &Config, programs: Programs) -> Result<Dataplane, DaemonError> {
    let paths = &config.paths;
    let maps = |name: &str| paths.map_pin(name);
    use maps_schema::maps::{ENDPOINTS, IDENT4, IDENT6, IPCACHE4, IPCACHE6, POLICY};
    Ok(Dataplane {
        attachments: AttachDriver::new(Box::new(TcLinks::new(
            paths.clone(),
            programs,
            config.tc_attach,
        )?)),
        endpoints: MapDriver::new(Box::new(PinnedHash::open(ENDPOINTS, &maps(ENDPOINTS))?)),
        endpoints_manager: EndpointsManager::new(),
        ident4: MapDriver::new(Box::new(PinnedHash::open(IDENT4, &maps(IDENT4))?)),
        ident6: MapDriver::new(Box::new(PinnedHash::open(IDENT6, &maps(IDENT6))?)),
        ipcache4: MapDriver::new(Box::new(PinnedLpm::open(IPCACHE4, &maps(IPCACHE4))?)),
        ipcache6: MapDriver::new(Box::new(PinnedLpm::open(IPCACHE6, &maps(IPCACHE6))?)),
        policy: MapDriver::new(Box::new(PinnedHash::open(POLICY, &maps(POLICY))?)),
        services: crate::dataplane::services::ServiceMaps::open(paths)?.for_node(&config.node),
    })
}

/// What the node needs from the cluster beside its own state: the datastore, cluster-wide
/// identities, node records and what routing found.
struct Opened {
    node: Node,
    ipam: IpamService,
    cluster_identities: Option<Arc<ClusterIdentities>>,
    node_records: Option<NodeRecords>,
    pod_mtu: Option<u32>,
    underlay: Option<String>,
}

/// Step 3: the datastore (with etcd or Kubernetes, identities are allocated cluster-wide through
/// it), the node over `dataplane` with the first policy read, and node routing.
async fn open_node(
    config: &Config,
    dataplane: Dataplane,
    first_read: Option<&policy_dir::FirstRead>,
) -> Result<Opened, DaemonError> {
    let paths = &config.paths;
    let (policies, policy_errors) = first_read.map_or_else(Default::default, |first| {
        (first.loaded.set.clone(), first.loaded.errors.clone())
    });
    for e in &policy_errors {
        tracing::warn!(error = %e, "policy document refused");
    }
    let ipam = IpamService::open(
        &config.datastore,
        &config.node,
        config.node_labels.iter().cloned().collect(),
        &config.pools,
        (config.block_size_v4, config.block_size_v6),
        config.allocation_expiry,
        &paths.state_dir,
    )
    .await?;
    let cluster_identities = match ipam.ipam().store() {
        store @ (AnyStore::Etcd(_) | AnyStore::Kubernetes(_)) => Some(ClusterIdentities::new(
            store.clone(),
            &config.node,
            config.identity_gc_grace,
            tokio::runtime::Handle::current(),
        )),
        AnyStore::Embedded(_) | AnyStore::Memory(_) => None,
    };
    let identities = match &cluster_identities {
        Some(cluster) => Identities::cluster(Arc::clone(cluster)),
        None => Identities::load(&paths.identities()).map_err(NodeError::from)?,
    };
    let mut node =
        Node::open_with_identities(paths, dataplane, policies, policy_errors, identities)?;
    node.set_node_name(&config.node)?;
    // With a shared etcd (or Node objects and a shared datastore): node records, and routes to the other
    // nodes' blocks.
    let (node_records, pod_mtu, underlay) =
        match crate::cluster::setup::routing(config, ipam.ipam().store())? {
            Some(r) => {
                node.set_routing(r.routes);
                (Some(r.records), r.pod_mtu, r.underlay)
            }
            None => (None, None, None),
        };
    Ok(Opened {
        node,
        ipam,
        cluster_identities,
        node_records,
        pod_mtu,
        underlay,
    })
}

/// Step 3b: the host interfaces' drivers, held by the node and applied by the loop: the prefilter
/// from its first pass, the masquerade (programs on the named interfaces, the pools' CIDRs) once in
/// sync.
fn host_drivers(
    config: &Config,
    node: &mut Node,
    prefilter: Prefilter,
    underlay: Option<String>,
    pools: &[crate::calc::ipam_service::PoolStatus],
) -> Result<(), DaemonError> {
    // BPF host routing the other way: what other nodes send this node's pods arrives on the
    // underlay, whose `masq_ingress` hands it to `host_fwd_in` (native routing only: VXLAN traffic
    // arrives on the VXLAN device, encapsulated for the node itself).
    let host_interfaces = crate::dataplane::masquerade::with_underlay(
        &config.host_interfaces,
        underlay.filter(|_| {
            config.host_routing == crate::config::HostRouting::Bpf
                && config.routing == crate::config::RoutingMode::Native
        }),
    );
    let mut masquerade = MasqDriver::open(&config.paths)?;
    masquerade.set_interfaces(host_interfaces);
    masquerade.set_pools(masquerade_pools(pools));
    node.host.prefilter = Some(prefilter);
    node.host.masquerade = Some(masquerade);
    Ok(())
}

/// Step 4: the sources that feed the loop: node records, the link watcher (restarted with
/// backoff when it dies), and the API server's objects or the policy files.
fn start_sources(
    config: &Config,
    dataplane_loop: &LoopHandle,
    ipam: &IpamService,
    node_records: Option<NodeRecords>,
    kube_client: Option<kube::Client>,
    first_read: Option<policy_dir::FirstRead>,
) {
    let paths = &config.paths;
    let mut node_feed = None;
    match node_records {
        Some(NodeRecords::Etcd(record)) => {
            tokio::spawn(crate::sources::nodes::run(
                dataplane_loop.clone(),
                ipam.ipam().clone(),
                record,
            ));
        }
        Some(NodeRecords::Kubernetes) => {
            let (feed, objects) = crate::sources::kube::nodes::feed();
            node_feed = Some(feed);
            tokio::spawn(crate::sources::kube::nodes::run(
                dataplane_loop.clone(),
                ipam.ipam().clone(),
                objects,
                config.node_expiry,
            ));
        }
        None => {}
    }
    let sysctl_paths = paths.clone();
    tokio::spawn(link_source::supervise(
        dataplane_loop.clone(),
        netlink_links::Netlink,
        move |ifname| {
            if let Err(e) = host::workload_link_sysctls(&sysctl_paths, ifname) {
                tracing::warn!(error = %e, "workload link sysctl");
            }
        },
    ));
    if let Some(client) = kube_client {
        // The API server's objects → loop: per-object deltas after the initial lists.
        tokio::spawn(crate::sources::kube::run(
            dataplane_loop.clone(),
            client,
            node_feed,
        ));
    } else if let Some(first) = first_read {
        // Policy files → loop: hot reload (inotify, with a cheap stat of the directory as backstop).
        tokio::spawn(policy_dir::run(
            dataplane_loop.clone(),
            paths.policy_dir.clone(),
            first,
        ));
    }
}

/// Step 5: waits for the first in-sync apply; its generation.
async fn wait_ready(config: &Config, dataplane_loop: &LoopHandle) -> Result<u64, DaemonError> {
    let ready_timeout = Duration::from_secs(60);
    let mut watch = dataplane_loop.subscribe();
    let first = tokio::time::timeout(
        ready_timeout,
        watch.wait_for(|s| s.applied.ready || s.applied.failures >= MAX_FAILURES),
    )
    .await
    .map(|r| r.map(|s| s.applied.clone()));
    match first {
        Ok(Ok(a)) if a.ready => Ok(a.generation),
        Ok(Ok(a)) => Err(DaemonError::Failing(a.failures)),
        _ => {
            let applied = dataplane_loop.snapshot().applied.clone();
            let error = applied
                .error
                .or(applied.source_error)
                .unwrap_or_else(|| match config.source {
                    SourceMode::Kubernetes => "links not synced, or a Kubernetes watcher has not delivered its initial list".into(),
                    SourceMode::Standalone => "links not synced".into(),
                });
            Err(DaemonError::NotReady(ready_timeout.as_secs(), error))
        }
    }
}

/// Step 6, once every link runs this object's programs: merge the conntrack delta and drop
/// the pins of other layout versions.
async fn finish_upgrade(
    config: &Config,
    object: &[u8],
    mut pending: migrate::Pending,
    migration: &mut MigrationReport,
) -> Result<(), DaemonError> {
    if !pending.is_empty() {
        let finished = tokio::task::spawn_blocking(move || migrate::finish(&mut pending))
            .await
            .map_err(|e| io_err("finish the conntrack migration")(std::io::Error::other(e)))??;
        migration.steps.extend(finished.steps);
    }
    match pins::sweep_stale(&mut pins::BpffsPins::new(&config.paths), |present| {
        loader::stale_map_pins(object, present)
    }) {
        Ok((removed, failed)) => {
            for name in removed {
                tracing::info!(pin = %name, "removed a map pin of another layout version");
            }
            for e in failed {
                tracing::warn!(error = %e, "cannot remove a stale map pin");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot list the map pins"),
    }
    Ok(())
}

/// What upkeep shares with the API and the metrics: the conntrack sweep's figures and its lock
/// (a flush waits for the sweep, and it for a flush), and the NAT map's pressure.
struct Upkeep {
    ct_stats: Arc<std::sync::Mutex<CtStats>>,
    ct_ops: Arc<std::sync::Mutex<()>>,
    nat_stats: Arc<std::sync::Mutex<crate::dataplane::nat_stats::NatStats>>,
}

/// Step 7: upkeep beside the loop, until `stop`: the conntrack sweep and the NAT sweep.
fn start_upkeep(
    config: &Config,
    ct_layout: u32,
    inspect: &Arc<dyn crate::kernel::InspectIo>,
    stop: &Arc<AtomicBool>,
) -> Result<Upkeep, DaemonError> {
    let paths = &config.paths;
    let ct_stats = Arc::new(std::sync::Mutex::new(CtStats::default()));
    let ct_ops = Arc::new(std::sync::Mutex::new(()));
    crate::upkeep::spawn_ct_sweep(
        conntrack::CtUpkeep::new(Arc::clone(&ct_ops), Arc::clone(&ct_stats)),
        crate::kernel::real::ct::PinnedCt::new(paths, ct_layout),
        config.ct_sweep_interval,
        config.ct_timeouts,
        Arc::clone(stop),
    )
    .map_err(io_err("start the conntrack sweep thread"))?;
    let nat_stats = Arc::new(std::sync::Mutex::new(
        crate::dataplane::nat_stats::NatStats::default(),
    ));
    use maps_schema::maps::NAT4;
    crate::upkeep::spawn_nat_sweep(
        Box::new(PinnedHash::open(NAT4, &paths.map_pin(NAT4))?),
        crate::dataplane::nat_stats::NatPressure {
            stats: Arc::clone(&nat_stats),
            kernel: Arc::clone(inspect),
        },
        Arc::clone(stop),
    )
    .map_err(io_err("start the nat sweep thread"))?;
    Ok(Upkeep {
        ct_stats,
        ct_ops,
        nat_stats,
    })
}

/// The address families the pools serve (what the CNI configuration offers).
fn families(pools: &[crate::calc::ipam_service::PoolStatus]) -> Vec<&'static str> {
    [("ipv4", true), ("ipv6", false)]
        .into_iter()
        .filter(|(_, v4)| {
            pools
                .iter()
                .any(|p| !p.disabled && p.cidr.contains('.') == *v4)
        })
        .map(|(family, _)| family)
        .collect()
}

/// Runs the agent: load, open the node, start the loop and its sources, wait for the first
/// in-sync apply, start upkeep, serve the API and metrics, write the CNI configuration, report,
/// and on SIGTERM leave every pin and attachment in place.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let paths = config.paths.clone();
    let Loaded {
        object,
        ct_layout,
        pending,
        mut migration,
        programs,
        socket_lb,
        prefilter,
        deny_file,
    } = load_kernel(&config)?;
    let program_report = programs.report.programs.clone();
    let dataplane = dataplane(&config, programs)?;
    // Standalone: the policy files are read now; Kubernetes: the watchers' initial lists gate the
    // first write (the node is not in sync until their first set).
    let kube_client = match config.source {
        SourceMode::Kubernetes => {
            Some(crate::sources::kube::client(config.kubeconfig.as_deref()).await?)
        }
        SourceMode::Standalone => None,
    };
    let first_read = kube_client
        .is_none()
        .then(|| policy_dir::first_read(&paths.policy_dir));
    let Opened {
        mut node,
        ipam,
        cluster_identities,
        node_records,
        pod_mtu,
        underlay,
    } = open_node(&config, dataplane, first_read.as_ref()).await?;
    if kube_client.is_some() {
        node.await_policy_source();
    }
    let pools = ipam.pools().await?;
    host_drivers(&config, &mut node, prefilter, underlay, &pools)?;
    let handles: BTreeSet<String> = node.endpoints().map(|e| e.handle.clone()).collect();
    let restored = node.summary().endpoints;
    node.set_refresh_interval(Some(config.refresh_interval).filter(|interval| !interval.is_zero()));
    // The dataplane loop on its own thread: it owns the node from now on.
    let (dataplane_loop, loop_thread) = applier::spawn(node)?;
    if let Some(cluster) = cluster_identities {
        tokio::spawn(crate::calc::identity_store::upkeep(
            cluster,
            dataplane_loop.subscribe(),
            |s: &Arc<crate::control::snapshot::Snapshot>| {
                s.endpoints.values().filter_map(|e| e.identity).collect()
            },
            config.identity_gc_grace,
        ));
    }
    start_sources(
        &config,
        &dataplane_loop,
        &ipam,
        node_records,
        kube_client,
        first_read,
    );
    // IPAM: restore confirmations (every handle an endpoint holds) before anything can expire.
    ipam.confirm_all(&handles).await?;
    let ipam = Arc::new(ipam);
    tokio::spawn(crate::upkeep::ipam(Arc::clone(&ipam)));

    let generation = wait_ready(&config, &dataplane_loop).await?;
    tracing::info!(generation, "dataplane in sync");
    let host_status = Arc::clone(&dataplane_loop.snapshot().host);
    if let Some(error) = &host_status.prefilter_error {
        return Err(PrefilterError::Apply(error.clone()).into());
    }
    finish_upgrade(&config, &object, pending, &mut migration).await?;
    host::enable_forwarding(&paths)?;

    let inspect: Arc<dyn crate::kernel::InspectIo> =
        Arc::new(crate::kernel::real::inspect::PinnedInspect::new(&paths));
    let stop = Arc::new(AtomicBool::new(false));
    let upkeep = start_upkeep(&config, ct_layout, &inspect, &stop)?;
    let prefilter_reads = start_host_sources(deny_file, &ipam, &pools, &dataplane_loop);
    let api_task = serve(
        &config,
        &dataplane_loop,
        &ipam,
        &upkeep,
        Served {
            ct_layout,
            inspect: Arc::clone(&inspect),
            socket_lb: &socket_lb,
            programs: program_report.clone(),
            prefilter_reads,
        },
    )
    .await?;
    // Ready: tell the runtime how to use us. The conflist sends runtimes to weir-cni, which calls
    // this socket: it answers first.
    await_api_socket(&paths).await?;
    let conflist = host::write_conflist_with_mtu(
        &paths,
        &families(&pools),
        &config.cni_version,
        config.tc_attach,
        pod_mtu,
    )?;
    tracing::info!(path = %conflist.display(), "wrote the CNI configuration");
    // Handlers before the start report: whoever reads it may send SIGTERM at once.
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate()).map_err(io_err("install a SIGTERM handler"))?;
    let int = signal(SignalKind::interrupt()).map_err(io_err("install a SIGINT handler"))?;
    let started = Started {
        event: "started",
        node: &config.node,
        loaded: loader::report(&*inspect, &paths, ct_layout),
        programs: program_report,
        prefilter: host_status.prefilter.clone(),
        masquerade: host_status.masquerade.clone(),
        socket_lb,
        endpoints: restored,
        ct_layout,
        migration,
    };
    match serde_json::to_string(&started) {
        Ok(line) => println!("{line}"),
        Err(e) => tracing::warn!(error = %e, "cannot serialise the start report"),
    }

    let result = wait_for_shutdown(&dataplane_loop, api_task, term, int).await;
    shut_down(&stop, &dataplane_loop, loop_thread, &paths);
    result
}

/// Step 8: the host drivers' sources, the prefilter's deny file and the pools (for the
/// masquerade); returns the deny file's read counts for the metrics.
fn start_host_sources(
    deny_file: Option<DenyFile>,
    ipam: &Arc<IpamService>,
    pools: &[crate::calc::ipam_service::PoolStatus],
    dataplane_loop: &LoopHandle,
) -> Arc<crate::sources::prefilter_file::DenyFileReads> {
    let reads = deny_file
        .as_ref()
        .map_or_else(Arc::default, DenyFile::reads);
    if let Some(deny_file) = deny_file {
        tokio::spawn(deny_file.run(dataplane_loop.clone()));
    }
    tokio::spawn(crate::sources::pools::run(
        Arc::clone(ipam),
        masquerade_pools(pools),
        dataplane_loop.clone(),
    ));
    reads
}

/// What [`serve`] hands the API and the metrics besides the loop, IPAM and upkeep.
struct Served<'a> {
    ct_layout: u32,
    inspect: Arc<dyn crate::kernel::InspectIo>,
    socket_lb: &'a crate::dataplane::socket_lb::SocketLbReport,
    programs: Vec<(String, u32, bool)>,
    prefilter_reads: Arc<crate::sources::prefilter_file::DenyFileReads>,
}

/// Step 9: the API on its unix socket and `/metrics`, both reading the loop's snapshots.
/// Returns the API server's task.
async fn serve(
    config: &Config,
    dataplane_loop: &LoopHandle,
    ipam: &Arc<IpamService>,
    upkeep: &Upkeep,
    served: Served<'_>,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>, DaemonError> {
    let api = Arc::new(Api {
        dataplane: dataplane_loop.clone(),
        ipam: Arc::clone(ipam),
        node: config.node.clone(),
        paths: config.paths.clone(),
        ct: Arc::clone(&upkeep.ct_stats),
        ct_ops: Arc::clone(&upkeep.ct_ops),
        ct_layout: served.ct_layout,
        tc_attach: config.tc_attach,
        kernel: Arc::clone(&served.inspect),
        monitor: crate::observe::monitor::Monitor::default(),
        pod_wait: (config.source == crate::config::SourceMode::Kubernetes)
            .then_some(server::POD_WAIT),
        socket_lb: served.socket_lb.cgroup.clone(),
        socket_lb_scope: served.socket_lb.scope,
        nat: Arc::clone(&upkeep.nat_stats),
    });
    let socket = config.paths.api_socket.clone();
    let api_task = tokio::spawn(async move { server::serve(&socket, api).await });
    let metrics_listener = tokio::net::TcpListener::bind(config.metrics)
        .await
        .map_err(io_err(format!("listen on {}", config.metrics)))?;
    let metrics_state = metrics_server::MetricsState::new(
        dataplane_loop.subscribe(),
        Arc::clone(&upkeep.ct_stats),
        Arc::clone(&upkeep.nat_stats),
        served.programs,
        served.inspect,
    )
    .with_pool_usage(ipam.pool_usage())
    .with_storage(Arc::clone(ipam))
    .with_prefilter(served.prefilter_reads);
    tokio::spawn(metrics_server::serve(
        metrics_listener,
        Arc::new(metrics_state),
    ));
    Ok(api_task)
}

/// The last step: upkeep and the loop stopped, the API socket removed; programs, maps and
/// attachments stay pinned (the datapath runs on without the agent).
fn shut_down(
    stop: &AtomicBool,
    dataplane_loop: &LoopHandle,
    loop_thread: std::thread::JoinHandle<()>,
    paths: &crate::paths::Paths,
) {
    stop.store(true, Ordering::Relaxed);
    dataplane_loop.stop();
    if loop_thread.join().is_err() {
        tracing::error!("the dataplane loop thread panicked");
    }
    match std::fs::remove_file(&paths.api_socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!(error = %e, path = %paths.api_socket.display(), "cannot remove the API socket; the next start replaces it");
        }
        _ => {}
    }
    tracing::info!("shutting down; programs, maps and attachments stay pinned");
}

/// Waits (bounded) until the API socket answers.
async fn await_api_socket(paths: &crate::paths::Paths) -> Result<(), DaemonError> {
    let answering = tokio::time::timeout(Duration::from_secs(10), async {
        while tokio::net::UnixStream::connect(&paths.api_socket)
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    answering
        .await
        .map_err(|_| DaemonError::NotReady(10, "the API socket does not answer".into()))
}

async fn wait_for_shutdown(
    dataplane_loop: &LoopHandle,
    api_task: tokio::task::JoinHandle<std::io::Result<()>>,
    mut term: tokio::signal::unix::Signal,
    mut int: tokio::signal::unix::Signal,
) -> Result<(), DaemonError> {
    let mut watch = dataplane_loop.subscribe();
    tokio::select! {
        _ = term.recv() => { tracing::info!("SIGTERM"); Ok(()) }
        _ = int.recv() => { tracing::info!("SIGINT"); Ok(()) }
        result = api_task => match result {
            Ok(Err(e)) => Err(DaemonError::Io { what: "serve the API socket".into(), source: e }),
            _ => Err(DaemonError::Io { what: "serve the API socket".into(), source: std::io::Error::other("the server stopped") }),
        },
        failing = watch.wait_for(|s| s.applied.failures >= MAX_FAILURES) => {
            Err(DaemonError::Failing(failing.map(|s| s.applied.failures).unwrap_or(MAX_FAILURES)))
        }
    }
}
