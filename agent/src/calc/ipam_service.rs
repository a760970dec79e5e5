//! The agent's IPAM: allocations for pods through the `ipam` library on the configured datastore,
//! handed out with an expiry. Creating the endpoint confirms an allocation; one never confirmed is
//! released when it expires. Pending allocations are persisted (`allocations.json`) so a restart
//! neither forgets them nor releases what an endpoint holds: the registry is restored first, and
//! every handle it references counts as confirmed.
//!
//! Per-host allocation is serialised here, and batched: one allocator task takes every request
//! waiting and runs them one after another, each seeing the ones before it, on an overlay of the
//! datastore (`ipam::batch`), so they share one durable commit and one write of the pending set
//! instead of paying one each. A request's time budget starts once its batch holds the host lock.
//! On a datastore without multi-key transactions (Kubernetes) the batch runs one allocation after
//! another, each with its own writes.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex as StdMutex, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ipam::{
    AssignArgs, Ipam, IpamError,
    model::pool::IpPool,
    store::{
        Store,
        any::{AnyStore, Datastore},
        embedded::Sharing,
    },
};
use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::calc::pod_ipam::{self, AnnotationError, PodHints};

/// One IPAM pool's usage, as IPAM last computed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// The pool's name.
    pub pool: String,
    /// Addresses allocated.
    pub allocated: u128,
    /// Addresses in the pool's CIDR.
    pub capacity: u128,
}

/// The pools' usage, refreshed by IPAM whenever it lists its pools (`IpamService::pools`).
pub type PoolUsageCache = Arc<StdMutex<Vec<PoolUsage>>>;

/// Errors of the agent's IPAM.
#[derive(Debug, thiserror::Error)]
pub enum IpamServiceError {
    /// The library refused or failed.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// Fewer addresses than asked for: nothing was kept.
    #[error("{shortfall}")]
    Exhausted {
        /// The handle the allocation was for.
        handle: String,
        /// What was assigned of what was asked, and why (the IPAM library's account, naming
        /// the pools).
        shortfall: String,
    },
    /// The request is invalid.
    #[error("{0}")]
    Invalid(&'static str),
    /// A `--pool` flag is not a CIDR.
    #[error("--pool {cidr:?} is not a CIDR such as 10.244.0.0/16")]
    PoolFlag {
        /// The flag's value.
        cidr: String,
    },
    /// The pending allocations cannot be read.
    #[error("cannot read the pending allocations {}: {source}; fix its permissions or move it aside", path.display())]
    LoadPending {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Persisting pending allocations failed.
    #[error("cannot write {path}: {source}")]
    Persist {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The datastore spec does not parse.
    #[error("cannot open the IPAM datastore {spec}: {source}")]
    Spec {
        /// The spec.
        spec: String,
        /// Why.
        #[source]
        source: ipam::store::any::DatastoreParseError,
    },
    /// The embedded datastore's directory cannot be created.
    #[error("cannot open the IPAM datastore {spec}: cannot create {}: {source}", dir.display())]
    CreateDir {
        /// The spec.
        spec: String,
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The datastore cannot be opened.
    #[error("cannot open the IPAM datastore {spec}: {source}")]
    Open {
        /// The spec.
        spec: String,
        /// Why.
        #[source]
        source: ipam::store::StoreError,
    },
    /// The request waited too long for the per-host lock and the datastore.
    #[error("the allocation did not complete within {0} s; retry")]
    Timeout(u64),
    /// The allocator task has stopped (the agent is shutting down).
    #[error("the agent's allocator has stopped; retry once the agent runs again")]
    Stopped,
    /// A pool or address annotation of the pod or its namespace cannot be used.
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    /// The allocation the annotations asked for failed.
    #[error("{annotations}: {}; fix or remove the annotation", chain(source))]
    Annotated {
        /// The annotations in force (`annotation X of pod Y`).
        annotations: String,
        /// Why the allocation failed.
        #[source]
        source: Box<IpamServiceError>,
    },
}

/// An error and its causes, as one line (`a: b: c`).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// The API's allocation request, allocation (also what `allocations.json` records), handle and
/// pool views: the contract crate's types.
pub use weir_api::{AllocateRequest, Allocation, HandleStatus, PoolStatus};

#[derive(Default, Serialize, Deserialize)]
struct PendingFile {
    pending: BTreeMap<String, Allocation>,
}

/// Requests one allocation batch takes at most.
const MAX_BATCH: usize = 512;

/// An allocation request waiting for the allocator.
struct Waiting {
    req: AllocateRequest,
    budget: Duration,
    reply: oneshot::Sender<Result<Allocation, IpamServiceError>>,
}

/// What the allocator task and the API share.
struct Core {
    ipam: Ipam<AnyStore>,
    datastore: Datastore,
    host: String,
    node_labels: BTreeMap<String, String>,
    default_expiry: Duration,
    pending_path: PathBuf,
    /// Serialises allocation and release for this host; guards the pending set.
    lock: Mutex<PendingFile>,
    /// Requests handed to the allocator and not yet taken into a batch.
    queued: AtomicUsize,
    /// Allocation batches run, and the commits they took.
    batches: AtomicU64,
    commits: AtomicU64,
    /// The pools' usage as [`IpamService::pools`] last computed it (`/metrics`).
    usage: PoolUsageCache,
    /// The pools as [`IpamService::pools`] last read them (the status while the store is degraded).
    last_pools: StdMutex<Vec<PoolStatus>>,
}

/// The agent's IPAM service.
pub struct IpamService {
    core: Arc<Core>,
    queue: mpsc::UnboundedSender<Waiting>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Allocation counters (`allocation_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocationStats {
    /// Batches of queued requests the allocator ran.
    pub batches: u64,
    /// Datastore commits those batches took.
    pub commits: u64,
}

impl IpamService {
    /// Opens the datastore and makes sure the configured (or default) pools exist. An embedded file is held
    /// exclusively (one fsync per commit); `weir ipam` reaches it through the agent's socket.
    pub async fn open(
        spec: &str,
        host: &str,
        node_labels: BTreeMap<String, String>,
        pools: &[String],
        block_sizes: (u8, u8),
        default_expiry: Duration,
        state_dir: &Path,
    ) -> Result<Self, IpamServiceError> {
        let datastore: Datastore = spec.parse().map_err(|source| IpamServiceError::Spec {
            spec: spec.to_owned(),
            source,
        })?;
        if let Datastore::Embedded(path) = &datastore
            && let Some(dir) = path.parent()
        {
            fs::create_dir_all(dir).map_err(|source| IpamServiceError::CreateDir {
                spec: spec.to_owned(),
                dir: dir.to_owned(),
                source,
            })?;
        }
        let store = datastore
            .open_with(Duration::from_secs(10), Sharing::Exclusive)
            .await
            .map_err(|source| IpamServiceError::Open {
                spec: spec.to_owned(),
                source,
            })?;
        let core = Arc::new(Core {
            ipam: Ipam::new(store),
            datastore,
            host: host.to_owned(),
            node_labels,
            default_expiry,
            pending_path: state_dir.join("allocations.json"),
            lock: Mutex::new(load_pending(&state_dir.join("allocations.json"))?),
            queued: AtomicUsize::new(0),
            batches: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            usage: PoolUsageCache::default(),
            last_pools: StdMutex::new(Vec::new()),
        });
        core.ensure_pools(pools, block_sizes).await?;
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(allocator(Arc::clone(&core), rx));
        Ok(Self { core, queue })
    }

    /// The IPAM library over the agent's datastore (for `weir ipam` requests made through the agent).
    pub fn ipam(&self) -> &Ipam<AnyStore> {
        &self.core.ipam
    }

    /// Whether `datastore` is the one this agent holds: the same embedded file (paths compared once resolved).
    pub fn holds(&self, datastore: &Datastore) -> bool {
        match (&self.core.datastore, datastore) {
            (Datastore::Embedded(ours), Datastore::Embedded(theirs)) => {
                let resolve = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
                resolve(ours) == resolve(theirs)
            }
            _ => false,
        }
    }

    /// How many allocation batches ran and how many commits they took.
    pub fn allocation_stats(&self) -> AllocationStats {
        AllocationStats {
            batches: self.core.batches.load(Ordering::Relaxed),
            commits: self.core.commits.load(Ordering::Relaxed),
        }
    }

    /// Handles confirmed by existing endpoints: drop them from the pending set (restart path).
    pub async fn confirm_all(&self, handles: &BTreeSet<String>) -> Result<(), IpamServiceError> {
        let mut pending = self.core.lock.lock().await;
        let before = pending.pending.len();
        pending.pending.retain(|h, _| !handles.contains(h));
        if pending.pending.len() != before {
            persist(&self.core.pending_path, &pending)?;
        }
        Ok(())
    }

    /// Confirms one allocation (its endpoint exists now). Not written to disk: the endpoint
    /// registry, already durable, is what confirms a handle after a restart (`confirm_all`), so
    /// the hot path saves a file write.
    pub async fn confirm(&self, handle: &str) -> Result<(), IpamServiceError> {
        self.core.lock.lock().await.pending.remove(handle);
        Ok(())
    }

    /// Allocates with an expiry. All or nothing: a short result keeps nothing. Requests that arrive while
    /// another batch runs wait for the next one, which commits them together.
    pub async fn allocate(
        &self,
        req: &AllocateRequest,
        budget: Duration,
    ) -> Result<Allocation, IpamServiceError> {
        validate(req)?;
        let (reply, answer) = oneshot::channel();
        self.core.queued.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting {
            req: req.clone(),
            budget,
            reply,
        };
        if self.queue.send(waiting).is_err() {
            self.core.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(IpamServiceError::Stopped);
        }
        answer.await.map_err(|_| IpamServiceError::Stopped)?
    }

    /// Allocates for a pod with its pool and address annotations (and its namespace's) applied
    /// (`pod_ipam`): a bad annotation, or an allocation the annotations made fail, is an error
    /// naming the annotation; nothing is kept.
    pub async fn allocate_for_pod(
        &self,
        req: &AllocateRequest,
        hints: &PodHints,
        budget: Duration,
    ) -> Result<Allocation, IpamServiceError> {
        let wanted = hints.wanted()?;
        if wanted.is_empty() {
            return self.allocate(req, budget).await;
        }
        let pools = self.core.ipam.pools().await?;
        let annotated = pod_ipam::apply(req, &wanted, &pools, &self.core.node_labels)?;
        tracing::debug!(handle = %req.handle, annotations = %wanted.describe(), pools = ?annotated.pools, ips = ?annotated.ips, "allocation follows the pod's annotations");
        self.allocate(&annotated, budget)
            .await
            .map_err(|source| IpamServiceError::Annotated {
                annotations: wanted.describe(),
                source: Box::new(source),
            })
    }

    /// Releases a handle's addresses (idempotent) and forgets it as pending.
    pub async fn release_handle(&self, handle: &str) -> Result<Vec<IpAddr>, IpamServiceError> {
        let mut pending = self.core.lock.lock().await;
        let released = match self.core.ipam.release_by_handle(handle).await {
            Ok(ips) => ips,
            Err(IpamError::HandleNotFound { .. }) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        if pending.pending.remove(handle).is_some() {
            persist(&self.core.pending_path, &pending)?;
        }
        Ok(released)
    }

    /// Releases specific addresses (idempotent): (released, not allocated).
    pub async fn release_ips(
        &self,
        ips: &[IpAddr],
    ) -> Result<(Vec<IpAddr>, Vec<IpAddr>), IpamServiceError> {
        let _guard = self.core.lock.lock().await;
        let checks: Vec<_> = ips
            .iter()
            .map(|ip| {
                (
                    *ip,
                    ipam::model::ReleaseCheck {
                        sequence_number: None,
                        handle: None,
                    },
                )
            })
            .collect();
        let report = self.core.ipam.release_ips(&checks).await?;
        Ok((
            report.released.into_iter().map(|(ip, _)| ip).collect(),
            report.not_allocated,
        ))
    }

    /// Releases every pending allocation whose time is up; returns the handles released.
    pub async fn expire(&self) -> Result<Vec<String>, IpamServiceError> {
        let mut pending = self.core.lock.lock().await;
        let now = now();
        let due: Vec<String> = pending
            .pending
            .iter()
            .filter(|(_, a)| a.expires_at <= now)
            .map(|(h, _)| h.clone())
            .collect();
        for handle in &due {
            match self.core.ipam.release_by_handle(handle).await {
                Ok(_) | Err(IpamError::HandleNotFound { .. }) => {
                    pending.pending.remove(handle);
                    tracing::info!(%handle, "released an allocation no endpoint confirmed before it expired");
                }
                Err(e) => {
                    tracing::warn!(%handle, error = %e, "cannot release an expired allocation; will retry");
                }
            }
        }
        if !due.is_empty() {
            persist(&self.core.pending_path, &pending)?;
        }
        Ok(due)
    }

    /// Addresses held under a handle (empty when none).
    pub async fn ips_of(&self, handle: &str) -> Result<Vec<IpAddr>, IpamServiceError> {
        match self.core.ipam.ips_by_handle(handle).await {
            Ok(nets) => Ok(nets.iter().map(IpNetwork::ip).collect()),
            Err(IpamError::HandleNotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// A handle's addresses and whether an endpoint confirmed them (`GET /v1/ipam/handles/{h}`).
    pub async fn handle(&self, handle: &str) -> Result<HandleStatus, IpamServiceError> {
        let ips = self.ips_of(handle).await?;
        let pending = self.core.lock.lock().await.pending.get(handle).cloned();
        Ok(HandleStatus {
            handle: handle.to_owned(),
            confirmed: pending.is_none() && !ips.is_empty(),
            expires_at: pending.map(|p| p.expires_at),
            ips,
        })
    }

    /// The pools' usage for `/metrics`, refreshed by every [`Self::pools`].
    pub fn pool_usage(&self) -> PoolUsageCache {
        Arc::clone(&self.core.usage)
    }

    /// Pools with free addresses.
    pub async fn pools(&self) -> Result<Vec<PoolStatus>, IpamServiceError> {
        let util = self.core.ipam.utilization(false).await?;
        *self
            .core
            .usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = util
            .iter()
            .map(|u| PoolUsage {
                pool: u.pool.clone(),
                allocated: u.in_use,
                capacity: u.capacity,
            })
            .collect();
        let pools = self.core.ipam.pools().await?;
        let pools: Vec<PoolStatus> = pools
            .iter()
            .map(|p| PoolStatus {
                name: p.name.clone(),
                cidr: p.cidr.to_string(),
                free: util
                    .iter()
                    .find(|u| u.pool == p.name)
                    .map_or(0, |u| u64::try_from(u.available).unwrap_or(u64::MAX)),
                disabled: p.disabled,
            })
            .collect();
        self.core
            .last_pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone_from(&pools);
        Ok(pools)
    }

    /// The pools as [`Self::pools`] last read them (the status shows these while the embedded
    /// store cannot be read, beside the fault).
    pub fn last_pools(&self) -> Vec<PoolStatus> {
        self.core
            .last_pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The agent's storage: the embedded datastore's health and the state files' faults (`storage` in the
    /// status, `weir_storage_*` in `/metrics`).
    pub fn storage(&self) -> Storage {
        Storage {
            datastore: self.core.ipam.store().health(),
            files: crate::fsutil::faults(),
            file_counts: crate::fsutil::fault_counts(),
        }
    }
}

/// The agent's storage as [`IpamService::storage`] reads it.
#[derive(Clone, Debug, Default)]
pub struct Storage {
    /// The embedded datastore's health (`None`: another backend).
    pub datastore: Option<ipam::store::embedded::StoreHealth>,
    /// The state files whose last write failed.
    pub files: Vec<crate::fsutil::FileFault>,
    /// State-file faults begun and cleared.
    pub file_counts: (u64, u64),
}

impl Storage {
    /// True while the datastore is degraded.
    #[must_use]
    pub fn datastore_degraded(&self) -> bool {
        self.datastore.as_ref().is_some_and(|h| h.fault.is_some())
    }

    /// As the status shows it.
    #[must_use]
    pub fn status(&self) -> weir_api::StorageStatus {
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut faults: Vec<weir_api::StorageFault> = self
            .datastore
            .iter()
            .filter_map(|h| h.fault.as_ref())
            .map(|f| weir_api::StorageFault {
                store: "ipam-datastore".into(),
                path: f.path.clone(),
                cause: f.cause.clone(),
                full_disk: f.full_disk,
                since: secs(f.since),
                attempts: f.attempts,
            })
            .collect();
        faults.extend(self.files.iter().map(|f| weir_api::StorageFault {
            store: "state-file".into(),
            path: f.path.clone(),
            cause: f.cause.clone(),
            full_disk: f.full_disk,
            since: secs(f.since),
            attempts: f.attempts,
        }));
        let (store_faults, store_recoveries) = self
            .datastore
            .as_ref()
            .map_or((0, 0), |h| (h.faults, h.recoveries));
        weir_api::StorageStatus {
            degraded: !faults.is_empty(),
            faults,
            faults_total: store_faults + self.file_counts.0,
            recoveries: store_recoveries + self.file_counts.1,
        }
    }
}

fn validate(req: &AllocateRequest) -> Result<(), IpamServiceError> {
    if req.handle.is_empty() {
        return Err(IpamServiceError::Invalid("handle must not be empty"));
    }
    if req.ips.is_empty() && req.ipv4 == 0 && req.ipv6 == 0 {
        return Err(IpamServiceError::Invalid(
            "ask for at least one address: ipv4, ipv6 or ips",
        ));
    }
    if req.ipv4 > 16 || req.ipv6 > 16 || req.ips.len() > 16 {
        return Err(IpamServiceError::Invalid(
            "at most 16 addresses per family per request",
        ));
    }
    Ok(())
}

/// The allocator task: takes every request waiting, runs them as one batch under the host lock, and answers
/// each once its allocation is durable. Ends when the service is dropped.
async fn allocator(core: Arc<Core>, mut rx: mpsc::UnboundedReceiver<Waiting>) {
    while let Some(first) = rx.recv().await {
        // Lock, then take the queue: everything that arrived while the last batch ran (or while a release
        // held the lock) joins this one.
        let mut pending = core.lock.lock().await;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        core.queued.fetch_sub(batch.len(), Ordering::SeqCst);
        let answers = core.allocate_batch(&mut pending, &batch).await;
        drop(pending);
        for (w, answer) in batch.into_iter().zip(answers) {
            // A caller that gave up is gone; its allocation, if any, expires unconfirmed.
            let _ = w.reply.send(answer);
        }
    }
}

impl Core {
    async fn ensure_pools(
        &self,
        pools: &[String],
        (v4, v6): (u8, u8),
    ) -> Result<(), IpamServiceError> {
        let existing = self.ipam.pools().await?;
        let mut wanted: Vec<(String, IpNetwork, u8)> = Vec::new();
        for cidr in pools {
            let net: IpNetwork = cidr
                .parse()
                .map_err(|_| IpamServiceError::PoolFlag { cidr: cidr.clone() })?;
            let (name, size) = if net.is_ipv4() {
                ("default-ipv4", v4)
            } else {
                ("default-ipv6", v6)
            };
            wanted.push((name.to_owned(), net, size));
        }
        if pools.is_empty() && existing.is_empty() {
            wanted.push((
                "default-ipv4".to_owned(),
                "10.244.0.0/16".parse().expect("literal CIDR"),
                v4,
            ));
        }
        for (name, cidr, block_size) in wanted {
            if existing.iter().any(|p| p.name == name) {
                continue;
            }
            let pool = IpPool {
                name: name.clone(),
                cidr,
                block_size,
                node_selector: String::new(),
                namespace_selector: String::new(),
                allowed_uses: IpPool::default_allowed_uses(),
                disabled: false,
            };
            self.ipam.add_pool(pool).await?;
            tracing::info!(pool = %name, %cidr, "created pool");
        }
        Ok(())
    }

    /// Runs one batch: every allocation in order, as one commit where the datastore's transactions allow it
    /// (each sees the ones before it, as if serialised), then one write of the pending set.
    async fn allocate_batch(
        &self,
        pending: &mut PendingFile,
        batch: &[Waiting],
    ) -> Vec<Result<Allocation, IpamServiceError>> {
        // Lock, then clock: the budget starts once this host's allocations are ours.
        let budget = batch.iter().map(|w| w.budget).min().unwrap_or_default();
        let reqs: Vec<AllocateRequest> = batch.iter().map(|w| w.req.clone()).collect();
        let leftovers = StdMutex::new(Vec::new());
        let expiry = self.default_expiry;
        let (host, labels, left) = (self.host.as_str(), &self.node_labels, &leftovers);
        let work = async {
            if self.ipam.store().atomic_txn_limit().is_some() {
                // A failed job is rolled back inside the overlay, so nothing of it is left to give back.
                let rolled_back = StdMutex::new(Vec::new());
                let rolled_back = &rolled_back;
                let (results, stats) =
                    ipam::batch::run(&self.ipam, &reqs, |ipam, req| async move {
                        allocate_on(&ipam, host, labels, expiry, &req, rolled_back).await
                    })
                    .await;
                (results, stats.commits)
            } else {
                // No multi-key transactions (Kubernetes): one allocation after another, each its own writes.
                let mut results = Vec::with_capacity(reqs.len());
                for req in &reqs {
                    results.push(allocate_on(&self.ipam, host, labels, expiry, req, left).await);
                }
                (results, reqs.len())
            }
        };
        let mut results = match tokio::time::timeout(budget, work).await {
            Ok((results, commits)) => {
                self.batches.fetch_add(1, Ordering::Relaxed);
                self.commits.fetch_add(commits as u64, Ordering::Relaxed);
                tracing::debug!(
                    allocations = reqs.len(),
                    commits,
                    "allocation batch committed"
                );
                results
            }
            Err(_) => reqs
                .iter()
                .map(|_| Err(IpamServiceError::Timeout(budget.as_secs())))
                .collect(),
        };
        let leftovers = leftovers
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        for a in results.iter().flatten() {
            pending.pending.insert(a.handle.clone(), a.clone());
        }
        for handle in &leftovers {
            // A failed allocation whose addresses could not be given back: expiry retries the release.
            pending.pending.insert(
                handle.clone(),
                Allocation {
                    handle: handle.clone(),
                    ips: Vec::new(),
                    expires_at: now(),
                },
            );
        }
        // A batch that added nothing (every allocation failed: a degraded datastore, say) has
        // nothing to record.
        let changed = results.iter().any(Result::is_ok) || !leftovers.is_empty();
        let recorded = if changed {
            persist(&self.pending_path, pending)
        } else {
            Ok(())
        };
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "cannot record pending allocations; undoing this batch");
            let cause = match &e {
                IpamServiceError::Persist { source, .. } => (source.kind(), source.to_string()),
                other => (io::ErrorKind::Other, other.to_string()),
            };
            for a in results.iter_mut() {
                let Ok(allocation) = a else { continue };
                let handle = allocation.handle.clone();
                *a = Err(IpamServiceError::Persist {
                    path: self.pending_path.clone(),
                    source: io::Error::new(cause.0, cause.1.clone()),
                });
                if let Err(release) = self.ipam.release_by_handle(&handle).await {
                    // Still pending in memory with its expiry: the expiry loop releases it.
                    tracing::warn!(%handle, error = %release, "cannot release an allocation that could not be recorded; it expires unconfirmed");
                } else {
                    pending.pending.remove(&handle);
                }
            }
        }
        results
    }
}

/// One allocation for `host` on `ipam` (the store, or an overlay of it). A short result is given back; when
/// that release fails, the handle is put in `leftovers` for the expiry loop.
async fn allocate_on<S: Store + Clone>(
    ipam: &Ipam<S>,
    host: &str,
    node_labels: &BTreeMap<String, String>,
    default_expiry: Duration,
    req: &AllocateRequest,
    leftovers: &StdMutex<Vec<String>>,
) -> Result<Allocation, IpamServiceError> {
    let attrs = BTreeMap::from([
        ("namespace".to_owned(), req.namespace.clone()),
        ("pod".to_owned(), req.pod.clone()),
        ("container_id".to_owned(), req.container_id.clone()),
        ("node".to_owned(), host.to_owned()),
    ]);
    let give_back = || async {
        // Nothing held (the first address failed) is nothing to give back.
        if let Err(e) = ipam
            .release_by_handle(&req.handle)
            .await
            .or_else(|e| match e {
                IpamError::HandleNotFound { .. } => Ok(Vec::new()),
                e => Err(e),
            })
        {
            tracing::warn!(handle = %req.handle, error = %e, "cannot give back the addresses of a failed allocation; they expire unconfirmed");
            leftovers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(req.handle.clone());
        }
    };
    let mut ips = Vec::new();
    if req.ips.is_empty() {
        let mut args = AssignArgs::new(host, &req.handle, req.ipv4, req.ipv6);
        args.attrs = attrs;
        args.pools.clone_from(&req.pools);
        args.node_labels.clone_from(node_labels);
        let result = ipam.auto_assign(&args).await?;
        ips = result.ips();
        if let Some(message) = result.partial_fulfilment(&args) {
            // A dual-stack half-success gives back the family that succeeded.
            give_back().await;
            return Err(IpamServiceError::Exhausted {
                handle: req.handle.clone(),
                shortfall: message,
            });
        }
    } else {
        for ip in &req.ips {
            match ipam
                .assign_ip(*ip, &req.handle, attrs.clone(), host, None)
                .await
            {
                Ok(net) => ips.push(net.ip()),
                Err(e) => {
                    give_back().await;
                    return Err(e.into());
                }
            }
        }
    }
    let expiry = req
        .expires_in_secs
        .map_or(default_expiry, Duration::from_secs);
    Ok(Allocation {
        handle: req.handle.clone(),
        ips,
        expires_at: now() + expiry.as_secs(),
    })
}

/// The pending allocations recorded at `path` (none when the file does not exist). A file that
/// cannot be read is an error: starting without it would never release what it records.
fn load_pending(path: &Path) -> Result<PendingFile, IpamServiceError> {
    match fs::read(path) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            // Its allocations stay in the datastore under their handles, unconfirmed: `weir ipam
            // show` lists them and `weir ipam release --handle` (or a CNI DEL) frees them.
            tracing::warn!(path = %path.display(), error = %e, "pending allocations do not parse; they will not expire on their own: release them by handle (weir ipam show lists them)");
            PendingFile::default()
        })),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(PendingFile::default()),
        Err(source) => Err(IpamServiceError::LoadPending {
            path: path.to_owned(),
            source,
        }),
    }
}

fn persist(path: &Path, file: &PendingFile) -> Result<(), IpamServiceError> {
    let err = |source| IpamServiceError::Persist {
        path: path.to_owned(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(file).map_err(|e| err(io::Error::other(e)))?;
    crate::fsutil::write_state(path, &bytes).map_err(err)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use ipam::store::AnyStore;

    use super::*;

    async fn service(dir: &Path) -> IpamService {
        IpamService::open(
            &format!("embedded:{}", dir.join("ipam.redb").display()),
            "n1",
            BTreeMap::new(),
            &["10.50.0.0/24".to_owned()],
            (26, 122),
            Duration::from_secs(600),
            dir,
        )
        .await
        .expect("open")
    }

    fn request(handle: &str) -> AllocateRequest {
        AllocateRequest {
            handle: handle.to_owned(),
            ipv4: 1,
            ..AllocateRequest::default()
        }
    }

    fn commits(svc: &IpamService) -> u64 {
        match svc.ipam().store() {
            AnyStore::Embedded(s) => s.commit_stats().commits,
            other => panic!("not embedded: {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_waiting_for_the_host_lock_share_one_commit_and_are_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let svc = Arc::new(service(dir.path()).await);
        // Hold the host lock (as a release or a running batch would) while 50 requests arrive.
        let guard = svc.core.lock.lock().await;
        let mut tasks = Vec::new();
        for i in 0..50 {
            let svc = Arc::clone(&svc);
            let handle = if i == 13 {
                // One request fails (an unknown pool): it must not take the others down.
                "bad".to_owned()
            } else {
                format!("h{i}")
            };
            tasks.push(tokio::spawn(async move {
                let mut req = request(&handle);
                if handle == "bad" {
                    req.pools = vec!["nosuch".into()];
                }
                (handle, svc.allocate(&req, Duration::from_secs(30)).await)
            }));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while svc.core.queued.load(Ordering::SeqCst) < 50 {
            assert!(
                std::time::Instant::now() < deadline,
                "requests did not queue"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let before = (commits(&svc), svc.allocation_stats());
        drop(guard);
        let mut allocated = BTreeMap::new();
        for t in tasks {
            let (handle, r) = t.await.expect("task");
            match r {
                Ok(a) => {
                    allocated.insert(handle, a.ips);
                }
                Err(e) => assert_eq!(handle, "bad", "{handle}: {e}"),
            }
        }
        assert_eq!(allocated.len(), 49);
        let distinct: BTreeSet<IpAddr> = allocated.values().flatten().copied().collect();
        assert_eq!(distinct.len(), 49, "no address handed out twice");
        let after = (commits(&svc), svc.allocation_stats());
        assert_eq!(after.1.batches - before.1.batches, 1, "one batch");
        assert_eq!(
            after.0 - before.0,
            1,
            "one datastore commit for 49 allocations"
        );
        // Every allocation is pending (recorded once for the batch) and in the datastore after a reopen.
        let pending: PendingFile =
            serde_json::from_slice(&fs::read(dir.path().join("allocations.json")).expect("read"))
                .expect("parse");
        assert_eq!(pending.pending.len(), 49);
        drop(svc);
        let reopened = Datastore::Embedded(dir.path().join("ipam.redb"))
            .open_with(Duration::from_secs(10), Sharing::Exclusive)
            .await
            .expect("reopen");
        let ipam = Ipam::new(reopened);
        for (handle, ips) in &allocated {
            let held: Vec<IpAddr> = ipam
                .ips_by_handle(handle)
                .await
                .expect("handle")
                .iter()
                .map(IpNetwork::ip)
                .collect();
            assert_eq!(&held, ips, "{handle}");
        }
        assert!(matches!(
            ipam.ips_by_handle("bad").await,
            Err(IpamError::HandleNotFound { .. })
        ));
        assert!(ipam.check().await.expect("check").ok());
    }

    async fn held(svc: &IpamService, handle: &str) -> Vec<IpAddr> {
        svc.ips_of(handle).await.expect("ips_of")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pods_annotation_chooses_its_address_and_a_failure_names_the_annotation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let svc = service(dir.path()).await;
        let set = crate::calc::policy::load::parse_str(
            "t.yaml",
            "kind: Pod\nmetadata: {name: web, namespace: prod, annotations: {weir.dev/ipAddrs: '[\"10.50.0.9\"]'}}\nspec: {containers: [{name: main}]}\n",
        )
        .expect("valid");
        let hints = pod_ipam::IpamHints::of(&set).for_pod("prod", "web");
        let budget = Duration::from_secs(30);
        let first = svc
            .allocate_for_pod(&request("first"), &hints, budget)
            .await
            .expect("the annotated address");
        let wanted: IpAddr = "10.50.0.9".parse().expect("ip");
        assert_eq!(first.ips, [wanted]);
        let err = svc
            .allocate_for_pod(&request("second"), &hints, budget)
            .await
            .expect_err("in use");
        assert!(
            matches!(&err, IpamServiceError::Annotated { source, .. }
                if matches!(**source, IpamServiceError::Ipam(IpamError::Block { .. }))),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("annotation weir.dev/ipAddrs of pod prod/web")
                && message.contains("already allocated"),
            "{message}"
        );
        assert!(held(&svc, "second").await.is_empty(), "nothing kept");
        // Positive control: without annotations the count is served from the pool.
        let plain = pod_ipam::IpamHints::default().for_pod("prod", "web");
        let third = svc
            .allocate_for_pod(&request("third"), &plain, budget)
            .await
            .expect("plain");
        assert_eq!(third.ips.len(), 1);
        assert_ne!(third.ips[0], wanted);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dual_stack_half_success_gives_back_the_family_that_succeeded() {
        let dir = tempfile::tempdir().expect("tempdir");
        // An IPv6 pool of one /126 block, filled first: the IPv6 half cannot succeed.
        let svc = IpamService::open(
            &format!("embedded:{}", dir.path().join("ipam.redb").display()),
            "n1",
            BTreeMap::new(),
            &["10.50.0.0/24".to_owned(), "fd00:50::/126".to_owned()],
            (26, 126),
            Duration::from_secs(600),
            dir.path(),
        )
        .await
        .expect("open");
        let mut filler = request("filler");
        (filler.ipv4, filler.ipv6) = (0, 4);
        let filled = svc
            .allocate(&filler, Duration::from_secs(30))
            .await
            .expect("fill the IPv6 pool");
        assert_eq!(filled.ips.len(), 4);
        let mut req = request("half");
        req.ipv6 = 1;
        let err = svc
            .allocate(&req, Duration::from_secs(30))
            .await
            .expect_err("no IPv6 pool");
        assert!(
            matches!(&err, IpamServiceError::Exhausted { handle, .. } if handle == "half"),
            "{err:?}"
        );
        assert!(
            held(&svc, "half").await.is_empty(),
            "the IPv4 address was given back"
        );
        assert!(svc.ipam().check().await.expect("check").ok());
        // Positive control: the same request for IPv4 alone is served.
        let ok = svc
            .allocate(&request("half"), Duration::from_secs(30))
            .await
            .expect("IPv4 alone");
        assert_eq!(held(&svc, "half").await, ok.ips);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_allocation_that_cannot_be_recorded_is_given_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let svc = service(dir.path()).await;
        // Positive control: recorded and held.
        let first = svc
            .allocate(&request("ok"), Duration::from_secs(30))
            .await
            .expect("recorded");
        assert_eq!(held(&svc, "ok").await, first.ips);
        // The pending file can no longer be replaced (a directory stands at its path).
        let pending = dir.path().join("allocations.json");
        fs::remove_file(&pending).expect("remove");
        fs::create_dir_all(pending.join("blocker")).expect("dir");
        let err = svc
            .allocate(&request("lost"), Duration::from_secs(30))
            .await
            .expect_err("cannot be recorded");
        assert!(matches!(err, IpamServiceError::Persist { .. }), "{err:?}");
        assert!(
            held(&svc, "lost").await.is_empty(),
            "an allocation nobody could expire is not kept"
        );
        assert!(!svc.core.lock.lock().await.pending.contains_key("lost"));
        assert_eq!(
            held(&svc, "ok").await,
            first.ips,
            "the earlier one is untouched"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unconfirmed_allocation_is_released_when_it_expires_and_a_confirmed_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let svc = service(dir.path()).await;
        let mut req = request("unconfirmed");
        req.expires_in_secs = Some(0);
        let a = svc
            .allocate(&req, Duration::from_secs(30))
            .await
            .expect("a");
        let mut req = request("confirmed");
        req.expires_in_secs = Some(0);
        let b = svc
            .allocate(&req, Duration::from_secs(30))
            .await
            .expect("b");
        svc.confirm("confirmed").await.expect("confirm");
        assert_eq!(held(&svc, "unconfirmed").await, a.ips);
        let released = svc.expire().await.expect("expire");
        assert_eq!(released, vec!["unconfirmed".to_owned()]);
        assert!(held(&svc, "unconfirmed").await.is_empty());
        assert_eq!(held(&svc, "confirmed").await, b.ips);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreadable_pending_file_refuses_to_start_rather_than_forget_allocations() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(service(dir.path()).await);
        // Positive control: a missing file is an empty pending set.
        drop(service(dir.path()).await);
        fs::create_dir_all(dir.path().join("allocations.json")).expect("dir");
        let err = IpamService::open(
            &format!("embedded:{}", dir.path().join("ipam.redb").display()),
            "n1",
            BTreeMap::new(),
            &[],
            (26, 122),
            Duration::from_secs(600),
            dir.path(),
        )
        .await
        .err()
        .expect("refused");
        assert!(
            matches!(err, IpamServiceError::LoadPending { .. }),
            "{err:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreadable_datastore_is_an_error_not_empty_pools() {
        let dir = tempfile::tempdir().expect("tempdir");
        let svc = service(dir.path()).await;
        assert_eq!(svc.pools().await.expect("pools").len(), 1);
        // Corrupt the pool record: reading pools must fail, not look like no pools.
        match svc.ipam().store() {
            AnyStore::Embedded(s) => {
                let key = ipam::store::Key::new(ipam::store::Kind::Pool, "default-ipv4");
                s.read_modify_write(vec![key], |_| {
                    (vec![ipam::store::Write::Put(b"not json".to_vec())], ())
                })
                .await
                .expect("write");
            }
            other => panic!("not embedded: {other:?}"),
        }
        assert!(svc.pools().await.is_err());
    }
}
