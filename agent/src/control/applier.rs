//! The one dataplane loop (Felix's `InternalDataplane`): one thread owns the [`Node`] — the
//! calculation, the managers and the drivers (the host interfaces' prefilter and masquerade too).
//! Sources (the API, the policy files, the link watcher, the prefilter's deny file, the pools; the
//! registry is read when the node opens) send typed [`Command`]s over a channel. The
//! loop takes everything queued as one batch, updates the node, applies when anything is dirty
//! (at once after an idle wait, throttled while commands keep coming; a failure keeps the state
//! dirty and retries with backoff), and publishes a [`Snapshot`] that every reader uses instead
//! of the node. A write resolves once the generation carrying it is applied; it fails only when
//! its own generation is not applied within its timeout. Before the first in-sync only new
//! workload links get the deny-by-default programs. After [`MAX_FAILURES`] failed applies in a
//! row the agent turns not-ready and asks to exit.
//!
//! The kernel I/O of an apply runs on this thread, never on the async runtime: while it runs,
//! commands queue (they form the next batch) and readers keep reading the last snapshot.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, oneshot, watch};
use weir_api::{Endpoint, EndpointView};

use crate::{
    calc::policy::{delta::Delta, load::PolicyFileError, model::PolicySet},
    control::{
        node::{Node, NodeError},
        snapshot::{self, Snapshot},
    },
    kernel::LinkEvent,
    observe::trace::{TraceRequest, TraceResult},
};

#[cfg(test)]
mod tests;

/// What the loop has achieved, published in every snapshot (the API contract's).
pub use weir_api::Applied;

/// Consecutive failures after which the agent gives up (the DaemonSet restarts it).
pub const MAX_FAILURES: u32 = 20;
const MIN_INTERVAL: Duration = Duration::from_millis(2);
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The loop wakes at least this often, queued commands or not.
const IDLE: Duration = Duration::from_millis(500);
/// Routes that could not be written are tried again after this long.
const ROUTES_RETRY: Duration = Duration::from_secs(1);
/// At most this many commands form one batch (the next batch follows at once).
const MAX_BATCH: usize = 4096;

/// Errors of the loop as its callers see them.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// The loop is gone (shutting down, or it failed).
    #[error(
        "the dataplane loop has stopped (the agent is shutting down or failed); retry once it is back"
    )]
    Stopped,
    /// This write's generation was not applied in time.
    #[error("the dataplane did not apply the change within {seconds} s: {reason}")]
    NotApplied {
        /// The caller's timeout.
        seconds: u64,
        /// The last apply error, or that the apply is still under way.
        reason: String,
    },
    /// The loop thread could not be started.
    #[error("cannot start the dataplane loop thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// A write that failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The node refused it (bad input, or its state could not be persisted).
    #[error(transparent)]
    Refused(#[from] NodeError),
    /// The loop did not take it or did not apply it.
    #[error(transparent)]
    Loop(#[from] LoopError),
}

/// A write's two answers: accepted or refused at once, then applied (or not, by its deadline).
pub struct Done<T> {
    accepted: oneshot::Sender<Result<T, NodeError>>,
    applied: oneshot::Sender<Result<u64, LoopError>>,
    timeout: Duration,
}

/// The accepted write, waiting for its generation.
pub struct Pending<T> {
    /// What the node answered (the stored endpoint, the removed one, …).
    pub value: T,
    applied: oneshot::Receiver<Result<u64, LoopError>>,
}

impl<T> Pending<T> {
    /// Resolves with the applied generation once the write's generation is in the kernel.
    pub async fn applied(self) -> Result<u64, LoopError> {
        self.applied.await.unwrap_or(Err(LoopError::Stopped))
    }
}

/// A typed delta or request for the loop.
pub enum Command {
    /// A link or node-address event from the link watcher.
    Link(LinkEvent),
    /// The link watcher stopped and is being restarted: not ready until it has synced again.
    LinkWatcherDown(crate::kernel::LinkWatcherStopped),
    /// The source's objects (policies, namespaces, pods, nodes): every valid document, with
    /// refused ones in their last good form.
    Policies {
        /// The policies, namespaces, pods and nodes.
        set: PolicySet,
        /// Refused documents (reported in status).
        errors: Vec<PolicyFileError>,
    },
    /// Per-object changes from the cluster source once its first whole set was sent (each object
    /// in its new form, gone, or refused); only what each object affects is recomputed.
    ClusterDeltas(Vec<Delta>),
    /// The cluster source (the Kubernetes API server) is unreachable (`Some`: why; the last known
    /// state stays in force and the agent reports not ready) or reachable again (`None`).
    SourceStale(Option<String>),
    /// Register (or replace) an endpoint.
    UpsertEndpoint(Endpoint, Done<EndpointView>),
    /// Remove an endpoint (by key); answers the removed one.
    DeleteEndpoint(String, Done<Option<Endpoint>>),
    /// `weir policy trace` on the desired state.
    /// A trace on the desired state; given the kernel, also through the loaded programs.
    Trace(
        TraceRequest,
        u8,
        Option<Arc<dyn crate::kernel::TraceIo>>,
        oneshot::Sender<TraceResult>,
    ),
    /// A change of the cluster's nodes (their records and blocks), from the nodes source.
    Node(crate::cluster::NodeDelta),
    /// The pods of other nodes from their endpoint records (the whole set), from the nodes source.
    ClusterPods(Vec<crate::cluster::ClusterPod>),
    /// Every pod address known cluster-wide with its identity and node (`weir status --all-addresses`).
    Addresses(oneshot::Sender<Vec<crate::cluster::AddressView>>),
    /// A new read of `--prefilter-deny-file` (its CIDRs, or why it was refused: the last good set
    /// stays), from `sources::prefilter_file`.
    PrefilterDenyFile(crate::dataplane::prefilter::DenyFileRead),
    /// The pools' IPv4 CIDRs for the masquerade, from `sources::pools`.
    MasqueradePools(Vec<ipnetwork::Ipv4Network>),
    /// Every Service frontend with its backends (`weir service list`).
    /// End the loop.
    Stop,
}

/// How the sources and readers reach the loop. Cheap to clone.
#[derive(Clone)]
pub struct LoopHandle {
    tx: mpsc::UnboundedSender<Command>,
    snapshot: watch::Receiver<Arc<Snapshot>>,
    /// Workload links as sent to the loop (ahead of the snapshot while an apply runs): a CNI
    /// that just created its veth waits for it here, and its endpoint command follows the
    /// link's in the channel.
    links: Arc<watch::Sender<BTreeMap<String, u32>>>,
}

impl LoopHandle {
    /// Sends a delta.
    pub fn send(&self, command: Command) -> Result<(), LoopError> {
        let link = match &command {
            Command::Link(LinkEvent::Up {
                ifname, ifindex, ..
            }) => Some((ifname.clone(), Some(*ifindex))),
            Command::Link(LinkEvent::Gone { ifname }) => Some((ifname.clone(), None)),
            _ => None,
        };
        self.tx.send(command).map_err(|_| LoopError::Stopped)?;
        if let Some((ifname, ifindex)) = link {
            self.links.send_if_modified(|links| match ifindex {
                Some(ifindex) => links.insert(ifname, ifindex) != Some(ifindex),
                None => links.remove(&ifname).is_some(),
            });
        }
        Ok(())
    }

    /// The latest snapshot.
    #[must_use]
    pub fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.snapshot.borrow())
    }

    /// Follows the snapshots.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshot.clone()
    }

    /// Registers an endpoint; the answer carries its view, and resolves once applied.
    pub async fn upsert_endpoint(
        &self,
        endpoint: Endpoint,
        timeout: Duration,
    ) -> Result<Pending<EndpointView>, WriteError> {
        self.write(timeout, |done| Command::UpsertEndpoint(endpoint, done))
            .await
    }

    /// Removes an endpoint; the answer carries the removed one, and resolves once applied.
    pub async fn delete_endpoint(
        &self,
        key: String,
        timeout: Duration,
    ) -> Result<Pending<Option<Endpoint>>, WriteError> {
        self.write(timeout, |done| Command::DeleteEndpoint(key, done))
            .await
    }

    async fn write<T>(
        &self,
        timeout: Duration,
        command: impl FnOnce(Done<T>) -> Command,
    ) -> Result<Pending<T>, WriteError> {
        let (accepted, accepted_rx) = oneshot::channel();
        let (applied, applied_rx) = oneshot::channel();
        self.send(command(Done {
            accepted,
            applied,
            timeout,
        }))?;
        let value = accepted_rx.await.map_err(|_| LoopError::Stopped)??;
        Ok(Pending {
            value,
            applied: applied_rx,
        })
    }

    /// Traces a packet on the desired state and, given the kernel, through the loaded programs
    /// with `BPF_PROG_TEST_RUN` beside it (`observe::ktrace`).
    pub async fn trace(
        &self,
        request: TraceRequest,
        protocol: u8,
        kernel: Option<Arc<dyn crate::kernel::TraceIo>>,
    ) -> Result<TraceResult, LoopError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Trace(request, protocol, kernel, tx))?;
        rx.await.map_err(|_| LoopError::Stopped)
    }

    /// Every pod address known cluster-wide (this node's endpoints and other nodes' pods).
    pub async fn addresses(&self) -> Result<Vec<crate::cluster::AddressView>, LoopError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Addresses(tx))?;
        rx.await.map_err(|_| LoopError::Stopped)
    }

    /// Waits (bounded) until the link watcher has reported workload link `ifname` to the loop.
    pub async fn wait_link(&self, ifname: &str, timeout: Duration) -> bool {
        let mut rx = self.links.subscribe();
        let seen = rx.wait_for(|links| links.contains_key(ifname));
        matches!(tokio::time::timeout(timeout, seen).await, Ok(Ok(_)))
    }

    /// Asks the loop to end (it finishes the apply under way first).
    pub fn stop(&self) {
        // A loop that is already gone needs no stop.
        if self.send(Command::Stop).is_err() {
            tracing::debug!("the dataplane loop had already stopped");
        }
    }
}

/// Starts the loop on its own thread; it owns `node` from now on.
pub fn spawn(node: Node) -> Result<(LoopHandle, std::thread::JoinHandle<()>), LoopError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let links = BTreeMap::new();
    let first = Snapshot::of(&node, &links, Applied::default());
    let measured = first.measured.clone();
    let (publish, snapshot) = watch::channel(Arc::new(first));
    let dataplane_loop = DataplaneLoop {
        measured,
        node,
        rx,
        publish,
        applied: Applied::default(),
        links,
        waiters: Vec::new(),
        changed: Changed::default(),
        link_watcher_down: false,
        source_stale: None,
        retry_at: None,
        backoff: Duration::ZERO,
        last_apply: Instant::now() - MIN_INTERVAL,
        routes_retry_at: None,
        refresh_at: None,
    };
    let thread = std::thread::Builder::new()
        .name("weir-dataplane".into())
        .spawn(move || dataplane_loop.run())
        .map_err(LoopError::Spawn)?;
    let links = Arc::new(watch::Sender::new(BTreeMap::new()));
    Ok((
        LoopHandle {
            tx,
            snapshot,
            links,
        },
        thread,
    ))
}

struct Waiter {
    generation: u64,
    deadline: Instant,
    timeout: Duration,
    tx: oneshot::Sender<Result<u64, LoopError>>,
}

/// What changed since the last snapshot (the parts of a snapshot that are rebuilt).
#[derive(Default)]
struct Changed {
    any: bool,
    /// Endpoints whose view must be rebuilt (by key): an endpoint's identity follows its
    /// labels and its namespace's labels, its ifindex its link.
    endpoints: BTreeSet<String>,
    /// Host links that came or went: their endpoints' views follow (resolved once per batch).
    ifnames: BTreeSet<String>,
    links: bool,
    rules: bool,
    nodes: bool,
    services: bool,
}

struct DataplaneLoop {
    node: Node,
    rx: mpsc::UnboundedReceiver<Command>,
    publish: watch::Sender<Arc<Snapshot>>,
    applied: Applied,
    /// Workload links the watcher reported (the API waits for a CNI's link to appear here).
    links: BTreeMap<String, u32>,
    waiters: Vec<Waiter>,
    changed: Changed,
    link_watcher_down: bool,
    /// Why the cluster source is stale, while it is.
    source_stale: Option<String>,
    retry_at: Option<Instant>,
    backoff: Duration,
    last_apply: Instant,
    /// When routes that failed are tried again.
    routes_retry_at: Option<Instant>,
    /// When every driver next reads its kernel state back (`--refresh-interval`).
    refresh_at: Option<Instant>,
    /// Apply durations and the sources' sync state, for `/metrics`.
    measured: crate::control::snapshot::LoopMeasures,
}

impl DataplaneLoop {
    fn run(mut self) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the dataplane loop's timer; the loop ends");
                return;
            }
        };
        let mut stop = false;
        while !stop {
            // Idle: nothing was queued when the loop looked, so a change that arrives now is
            // applied at once; the throttle only spaces applies while commands keep coming.
            let (first, idle) = match self.rx.try_recv() {
                Ok(command) => (Ok(Some(command)), false),
                Err(mpsc::error::TryRecvError::Disconnected) => (Ok(None), false),
                Err(mpsc::error::TryRecvError::Empty) => {
                    let wait = self.next_wake();
                    let rx = &mut self.rx;
                    let first =
                        runtime.block_on(async { tokio::time::timeout(wait, rx.recv()).await });
                    (first, true)
                }
            };
            let mut batch = 0;
            match first {
                Ok(Some(command)) => {
                    stop |= self.handle(command);
                    batch += 1;
                }
                // Every sender is gone: nothing can reach the loop any more.
                Ok(None) => stop = true,
                Err(_) => {}
            }
            while !stop && batch < MAX_BATCH {
                let Ok(command) = self.rx.try_recv() else {
                    break;
                };
                stop |= self.handle(command);
                batch += 1;
            }
            if stop {
                break;
            }
            self.refresh_if_due();
            self.apply_if_due(idle);
            self.apply_host_if_due();
            // Readers first: a write that resolves finds its change in the snapshot.
            self.publish();
            self.resolve_waiters();
            self.expire_waiters();
            // After the answers: freeing a replaced policy set is nobody's latency.
            self.node.drop_retired();
        }
        tracing::info!("dataplane loop stopped");
    }

    /// When the loop must look again even if no command arrives: a retry after backoff, a
    /// waiter's deadline, or the idle tick.
    fn next_wake(&self) -> Duration {
        let now = Instant::now();
        let mut at = now + IDLE;
        if let Some(retry) = self.retry_at {
            at = at.min(retry);
        }
        if let Some(retry) = self.routes_retry_at {
            at = at.min(retry);
        }
        // A host retry already due is taken at the next apply or waits for the idle tick (the
        // masquerade waits for in-sync): never a wake in the past.
        if let Some(retry) = self.node.host.retry_at()
            && retry > now
        {
            at = at.min(retry);
        }
        if let Some(refresh) = self.refresh_at {
            at = at.min(refresh);
        }
        for w in &self.waiters {
            at = at.min(w.deadline);
        }
        at.saturating_duration_since(now)
    }

    /// Takes one command into the node (no kernel I/O); true for `Stop`.
    fn handle(&mut self, command: Command) -> bool {
        self.changed.any = true;
        match command {
            Command::Link(event) => self.on_link(&event),
            Command::LinkWatcherDown(error) => {
                self.link_watcher_down = true;
                self.applied.ready = false;
                self.applied.source_error = Some(format!(
                    "the link watcher stopped ({error}); it is being restarted"
                ));
            }
            Command::SourceStale(stale) => self.on_source_stale(stale),
            Command::Policies { set, errors } => {
                for e in &errors {
                    tracing::warn!(error = %e, "policy document refused; the object it names keeps its last good form");
                }
                // Only a namespace's or a Pod's labels change an endpoint's view (its identity).
                let relabelled = self.node.relabelled_endpoints(&set);
                self.changed.endpoints.extend(relabelled);
                match self.node.set_policies(set, errors) {
                    Ok(_) => tracing::info!(
                        policies = self.node.summary().policies,
                        "policy files reloaded"
                    ),
                    Err(e) => tracing::error!(error = %e, "cannot apply the policy files"),
                }
                self.changed.rules = true;
                self.changed.services = true;
            }
            Command::ClusterDeltas(deltas) => {
                let objects = deltas.len();
                let done = self.node.apply_deltas(deltas);
                for (object, e) in &done.failed {
                    tracing::error!(%object, error = %e, "cannot apply the object's change; it keeps its previous form until its next change");
                }
                tracing::debug!(
                    objects,
                    generation = done.generation,
                    "cluster changes taken"
                );
                self.changed.endpoints.extend(done.relabelled);
                self.changed.rules |= done.policies;
                self.changed.services |= done.services;
            }
            Command::UpsertEndpoint(endpoint, done) => {
                let result = self
                    .node
                    .upsert_endpoint(endpoint)
                    .map(|(stored, _, generation)| {
                        (snapshot::view(&self.node, &stored), generation)
                    });
                if let Ok((view, _)) = &result {
                    self.changed.endpoints.insert(view.endpoint.key());
                }
                self.accept(done, result);
            }
            Command::DeleteEndpoint(key, done) => {
                let result = self.node.delete_endpoint(&key);
                self.changed.endpoints.insert(key.clone());
                self.accept(done, result);
            }
            Command::Trace(request, protocol, kernel, reply) => {
                let mut result = crate::observe::trace::trace(&self.node, &request, protocol);
                if let Some(kernel) = &kernel {
                    crate::observe::ktrace::add_kernel_trace(
                        &**kernel,
                        &self.node,
                        &request,
                        protocol,
                        &mut result,
                    );
                }
                // A caller that went away needs no answer.
                let _unanswered = reply.send(result);
            }
            Command::ClusterPods(pods) => {
                if let Err(e) = self.node.set_cluster_pods(pods) {
                    tracing::error!(error = %e, "cannot take the other nodes' pods");
                }
            }
            Command::Addresses(reply) => {
                // A caller that went away needs no answer.
                let _unanswered = reply.send(self.node.addresses());
            }
            Command::Node(delta) => {
                self.node.on_node_delta(delta);
                self.changed.nodes = true;
            }
            Command::PrefilterDenyFile(read) => self.node.host.set_deny_file(read),
            Command::MasqueradePools(pools) => self.node.host.set_pools(pools),
            Command::Stop => return true,
        }
        false
    }

    fn on_link(&mut self, event: &LinkEvent) {
        match event {
            LinkEvent::Up {
                ifname, ifindex, ..
            } => {
                if self.links.insert(ifname.clone(), *ifindex) != Some(*ifindex) {
                    self.changed.links = true;
                    self.endpoints_on_link(ifname);
                }
            }
            LinkEvent::Gone { ifname } => {
                if self.links.remove(ifname).is_some() {
                    self.changed.links = true;
                    self.endpoints_on_link(ifname);
                }
            }
            // Node addresses change ident entries only: no endpoint view, no rule.
            LinkEvent::Address { .. } => {}
            LinkEvent::Synced => {
                if std::mem::take(&mut self.link_watcher_down) {
                    self.measured.sources.links_resyncs += 1;
                    tracing::info!("the link watcher is back and synced");
                }
                self.applied.source_error = self.source_stale.clone();
            }
            LinkEvent::Drift(drift) => {
                tracing::debug!(
                    ?drift,
                    "the kernel reported a deletion; reading that part back"
                );
            }
        }
        self.node.on_link(event);
    }

    /// The cluster source went stale or came back: readiness says so; the dataplane keeps what
    /// it has (fail static).
    fn on_source_stale(&mut self, stale: Option<String>) {
        match &stale {
            Some(why) => {
                tracing::warn!(reason = %why, "the cluster source is stale; the last known state stays in force");
                self.applied.ready = false;
            }
            None => {
                self.measured.sources.cluster_resyncs += u64::from(self.source_stale.is_some());
                tracing::info!("the cluster source is reachable again");
                // Ready again when it was before: the last apply succeeded after in-sync.
                self.applied.ready = !self.link_watcher_down
                    && self.applied.error.is_none()
                    && self.applied.generation > 0;
            }
        }
        if !self.link_watcher_down {
            self.applied.source_error.clone_from(&stale);
        }
        self.source_stale = stale;
    }

    /// Answers a write at once; once accepted, it waits for its generation.
    fn accept<T>(&mut self, done: Done<T>, result: Result<(T, u64), NodeError>) {
        match result {
            Ok((value, generation)) => {
                if done.accepted.send(Ok(value)).is_ok() {
                    self.waiters.push(Waiter {
                        generation,
                        deadline: Instant::now() + done.timeout,
                        timeout: done.timeout,
                        tx: done.applied,
                    });
                }
            }
            Err(e) => {
                // The caller may have gone; the refusal is logged by nobody else.
                if let Err(Err(e)) = done.accepted.send(Err(e)) {
                    tracing::debug!(error = %e, "a refused write's caller went away");
                }
            }
        }
    }

    /// Felix's refresh timer: once in sync, every `--refresh-interval` each driver reads its
    /// kernel state back at the next apply and repairs what was changed from outside.
    fn refresh_if_due(&mut self) {
        let Some(interval) = self.node.refresh_interval() else {
            return;
        };
        if !self.node.in_sync() || self.applied.generation == 0 {
            return;
        }
        let now = Instant::now();
        match self.refresh_at {
            None => self.refresh_at = Some(now + interval),
            Some(at) if now >= at => {
                self.node.refresh();
                self.refresh_at = Some(now + interval);
                self.measured.refreshes += 1;
            }
            Some(_) => {}
        }
    }

    fn needs_apply(&self) -> bool {
        self.node.generation() > self.applied.generation
            || self.applied.error.is_some()
            || self.node.dataplane.is_dirty()
            || (self.node.routes_dirty()
                && self.routes_retry_at.is_none_or(|at| Instant::now() >= at))
    }

    /// Applies when anything is owed and no retry is pending; spaced by [`MIN_INTERVAL`] unless
    /// the loop was `idle` before this batch (a lone change goes to the kernel at once).
    fn apply_if_due(&mut self, idle: bool) {
        if !self.needs_apply() {
            return;
        }
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let since = self.last_apply.elapsed();
        if !idle && since < MIN_INTERVAL {
            std::thread::sleep(MIN_INTERVAL - since);
        }
        let generation = self.node.generation();
        let in_sync = self.node.in_sync();
        let started = Instant::now();
        let result = if in_sync {
            self.node.dataplane.apply()
        } else {
            self.node.dataplane.apply_before_in_sync()
        };
        // Routes to other nodes' blocks: after the maps, once in sync (their own source gates them too). A
        // route that cannot be written (an unreachable next hop) is reported and retried, and holds back
        // nothing of this node's own.
        if in_sync && self.routes_retry_at.is_none_or(|at| Instant::now() >= at) {
            let routes = self.node.apply_routes();
            self.routes_retry_at = routes.is_err().then(|| Instant::now() + ROUTES_RETRY);
            if let Err(e) = &routes {
                if self.applied.routes_error.is_none() {
                    tracing::warn!(error = %e, "routes to other nodes' blocks are not all written; retrying");
                }
            } else if self.applied.routes_error.is_some() {
                tracing::info!("routes to other nodes' blocks are written");
            }
            self.applied.routes_error = routes.err().map(|e| e.to_string());
        }
        self.last_apply = Instant::now();
        self.measured
            .apply_durations
            .observe(started.elapsed().as_secs_f64());
        self.changed.any = true;
        let a = &mut self.applied;
        a.applies += 1;
        match result {
            Ok(()) => {
                self.backoff = Duration::ZERO;
                self.retry_at = None;
                if in_sync {
                    a.generation = generation;
                    a.ready = !self.link_watcher_down && self.source_stale.is_none();
                    a.error = None;
                    a.failures = 0;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, failures = a.failures + 1, "dataplane apply failed; retrying");
                a.failures += 1;
                a.error = Some(e.to_string());
                a.ready = false;
                self.backoff = (self.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
                self.retry_at = Some(self.last_apply + self.backoff);
            }
        }
    }

    /// The host interfaces' drivers (prefilter, masquerade) when they have work due: after the
    /// maps, on this thread; their failures are theirs (published in the snapshot, retried with
    /// their backoff) and fail nothing of the pods' dataplane.
    fn apply_host_if_due(&mut self) {
        let in_sync = self.node.in_sync();
        if !self.node.host.is_due(in_sync, Instant::now()) {
            return;
        }
        self.node.host.apply(in_sync);
        self.changed.any = true;
    }

    fn resolve_waiters(&mut self) {
        let applied = self.applied.generation;
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|w| w.generation <= applied);
        self.waiters = waiting;
        for w in done {
            // A caller that went away needs no answer.
            let _unanswered = w.tx.send(Ok(applied));
        }
    }

    fn expire_waiters(&mut self) {
        let now = Instant::now();
        let reason = self
            .applied
            .error
            .clone()
            .unwrap_or_else(|| "the apply is still under way".to_owned());
        let (expired, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiters)
            .into_iter()
            .filter(|w| !w.tx.is_closed())
            .partition(|w| w.deadline <= now);
        self.waiters = waiting;
        for w in expired {
            let _unanswered = w.tx.send(Err(LoopError::NotApplied {
                seconds: w.timeout.as_secs(),
                reason: reason.clone(),
            }));
        }
    }

    /// The endpoints on host link `ifname` need their views rebuilt (their ifindex); found in
    /// one pass over the endpoints when the batch is published.
    fn endpoints_on_link(&mut self, ifname: &str) {
        self.changed.ifnames.insert(ifname.to_owned());
    }

    fn publish(&mut self) {
        let mut changed = std::mem::take(&mut self.changed);
        if !changed.ifnames.is_empty() {
            let on_links = self
                .node
                .endpoints()
                .filter(|e| changed.ifnames.contains(&e.host_ifname))
                .map(Endpoint::key);
            changed.endpoints.extend(on_links);
        }
        if !changed.any {
            return;
        }
        let previous = Arc::clone(&self.publish.borrow());
        let (links, cluster) = self.node.sources_synced();
        self.measured.sources.links = links && !self.link_watcher_down;
        self.measured.sources.cluster = cluster && self.source_stale.is_none();
        let snapshot = Snapshot {
            applied: self.applied.clone(),
            summary: self.node.summary(),
            endpoints: if changed.endpoints.is_empty() {
                Arc::clone(&previous.endpoints)
            } else {
                let mut views = (*previous.endpoints).clone();
                for key in &changed.endpoints {
                    match self.node.endpoint(key) {
                        Some(e) => {
                            views.insert(key.clone(), Arc::new(snapshot::view(&self.node, e)));
                        }
                        None => {
                            views.remove(key);
                        }
                    }
                }
                Arc::new(views)
            },
            links: if changed.links {
                Arc::new(self.links.clone())
            } else {
                Arc::clone(&previous.links)
            },
            rules: if changed.rules {
                snapshot::rules_since(&self.node, &previous.rules)
            } else {
                Arc::clone(&previous.rules)
            },
            stats: self.node.dataplane_stats(),
            nodes: if changed.nodes {
                Arc::new(self.node.node_status())
            } else {
                Arc::clone(&previous.nodes)
            },
            ipam_hints: self.node.ipam_hints(),
            services: if changed.services {
                self.node.service_view_parts()
            } else {
                Arc::clone(&previous.services)
            },
            measured: self.measured.clone(),
            host: if *self.node.host.status() == *previous.host {
                Arc::clone(&previous.host)
            } else {
                Arc::new(self.node.host.status().clone())
            },
        };
        self.publish.send_replace(Arc::new(snapshot));
    }
}
