//! The agent's IPAM: allocations for pods through the `ipam` library on the configured datastore,
//! handed out with an expiry. Creating the endpoint confirms an allocation; one never confirmed is
//! released when it expires. Pending allocations are persisted (`allocations.json`) so a restart
//! neither forgets them nor releases what an endpoint holds: the registry is restored first, and
//! every handle it references counts as confirmed.
//!
//! Per-host allocation is serialised here (one allocation at a time); a request's time budget
//! starts once it holds that lock.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ipam::{
    AssignArgs, Ipam, IpamError,
    model::pool::IpPool,
    store::any::{AnyStore, Datastore},
};
use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

/// Errors of the agent's IPAM.
#[derive(Debug, thiserror::Error)]
pub enum IpamServiceError {
    /// The library refused or failed.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// Fewer addresses than asked for: nothing was kept.
    #[error("{0}")]
    Exhausted(String),
    /// The request is invalid.
    #[error("{0}")]
    Invalid(String),
    /// Persisting pending allocations failed.
    #[error("cannot write {path}: {source}")]
    Persist {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The datastore spec or file could not be opened.
    #[error("cannot open the IPAM datastore {spec}: {detail}")]
    Open {
        /// The spec.
        spec: String,
        /// Why.
        detail: String,
    },
    /// The request waited too long for the per-host lock and the datastore.
    #[error("the allocation did not complete within {0} s; retry")]
    Timeout(u64),
}

/// An allocation request (see `docs/agent-api.md`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AllocateRequest {
    /// Owner handle.
    pub handle: String,
    /// IPv4 addresses wanted.
    #[serde(default)]
    pub ipv4: u32,
    /// IPv6 addresses wanted.
    #[serde(default)]
    pub ipv6: u32,
    /// Restrict to these pools.
    #[serde(default)]
    pub pools: Vec<String>,
    /// Exact addresses wanted (instead of counts).
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// Pod namespace.
    #[serde(default)]
    pub namespace: String,
    /// Pod name.
    #[serde(default)]
    pub pod: String,
    /// Container id.
    #[serde(default)]
    pub container_id: String,
    /// Seconds until an unconfirmed allocation is released.
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
}

/// An allocation's answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Allocation {
    /// The handle.
    pub handle: String,
    /// The addresses.
    pub ips: Vec<IpAddr>,
    /// Unix seconds after which it is released unless confirmed.
    pub expires_at: u64,
}

/// A handle as `GET /v1/ipam/handles/{handle}` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct HandleStatus {
    /// The handle.
    pub handle: String,
    /// Its addresses (empty: it holds none).
    pub ips: Vec<IpAddr>,
    /// True once an endpoint confirmed the allocation (it no longer expires).
    pub confirmed: bool,
    /// When an unconfirmed allocation is released.
    pub expires_at: Option<u64>,
}

/// A pool as `GET /v1/status` shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Name.
    pub name: String,
    /// CIDR.
    pub cidr: String,
    /// Free addresses.
    pub free: u64,
    /// Disabled pools hand out nothing.
    pub disabled: bool,
}

#[derive(Default, Serialize, Deserialize)]
struct PendingFile {
    pending: BTreeMap<String, Allocation>,
}

/// The agent's IPAM service.
pub struct IpamService {
    ipam: Ipam<AnyStore>,
    host: String,
    node_labels: BTreeMap<String, String>,
    default_expiry: Duration,
    pending_path: PathBuf,
    /// Serialises allocation and release for this host; guards the pending set.
    lock: Mutex<PendingFile>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl IpamService {
    /// Opens the datastore and makes sure the configured (or default) pools exist.
    pub async fn open(
        spec: &str,
        host: &str,
        node_labels: BTreeMap<String, String>,
        pools: &[String],
        block_sizes: (u8, u8),
        default_expiry: Duration,
        state_dir: &Path,
    ) -> Result<Self, IpamServiceError> {
        let open_err = |detail: String| IpamServiceError::Open {
            spec: spec.to_owned(),
            detail,
        };
        let datastore: Datastore = spec
            .parse()
            .map_err(|e: ipam::store::any::DatastoreParseError| open_err(e.to_string()))?;
        if let Datastore::Embedded(path) = &datastore
            && let Some(dir) = path.parent()
        {
            fs::create_dir_all(dir)
                .map_err(|e| open_err(format!("cannot create {}: {e}", dir.display())))?;
        }
        let store = datastore
            .open(Duration::from_secs(10))
            .await
            .map_err(|e| open_err(e.to_string()))?;
        let ipam = Ipam::new(store);
        let service = Self {
            ipam,
            host: host.to_owned(),
            node_labels,
            default_expiry,
            pending_path: state_dir.join("allocations.json"),
            lock: Mutex::new(load_pending(&state_dir.join("allocations.json"))),
        };
        service.ensure_pools(pools, block_sizes).await?;
        Ok(service)
    }

    async fn ensure_pools(
        &self,
        pools: &[String],
        (v4, v6): (u8, u8),
    ) -> Result<(), IpamServiceError> {
        let existing = self.ipam.pools().await?;
        let mut wanted: Vec<(String, IpNetwork, u8)> = Vec::new();
        for cidr in pools {
            let net: IpNetwork = cidr.parse().map_err(|_| {
                IpamServiceError::Invalid(format!(
                    "--pool {cidr:?} is not a CIDR such as 10.244.0.0/16"
                ))
            })?;
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

    /// Handles confirmed by existing endpoints: drop them from the pending set (restart path).
    pub async fn confirm_all(&self, handles: &BTreeSet<String>) -> Result<(), IpamServiceError> {
        let mut pending = self.lock.lock().await;
        let before = pending.pending.len();
        pending.pending.retain(|h, _| !handles.contains(h));
        if pending.pending.len() != before {
            persist(&self.pending_path, &pending)?;
        }
        Ok(())
    }

    /// Confirms one allocation (its endpoint exists now). Not written to disk: the endpoint
    /// registry, already durable, is what confirms a handle after a restart (`confirm_all`), so
    /// the hot path saves a file write.
    pub async fn confirm(&self, handle: &str) -> Result<(), IpamServiceError> {
        self.lock.lock().await.pending.remove(handle);
        Ok(())
    }

    /// Allocates with an expiry. All or nothing: a short result is released.
    pub async fn allocate(
        &self,
        req: &AllocateRequest,
        budget: Duration,
    ) -> Result<Allocation, IpamServiceError> {
        if req.handle.is_empty() {
            return Err(IpamServiceError::Invalid("handle must not be empty".into()));
        }
        if req.ips.is_empty() && req.ipv4 == 0 && req.ipv6 == 0 {
            return Err(IpamServiceError::Invalid(
                "ask for at least one address: ipv4, ipv6 or ips".into(),
            ));
        }
        if req.ipv4 > 16 || req.ipv6 > 16 || req.ips.len() > 16 {
            return Err(IpamServiceError::Invalid(
                "at most 16 addresses per family per request".into(),
            ));
        }
        // Lock, then clock: the budget starts once this host's allocations are ours.
        let mut pending = self.lock.lock().await;
        let work = self.allocate_locked(req);
        let allocation = tokio::time::timeout(budget, work)
            .await
            .map_err(|_| IpamServiceError::Timeout(budget.as_secs()))??;
        pending
            .pending
            .insert(allocation.handle.clone(), allocation.clone());
        if let Err(e) = persist(&self.pending_path, &pending) {
            pending.pending.remove(&allocation.handle);
            let _ = self.ipam.release_by_handle(&allocation.handle).await;
            return Err(e);
        }
        Ok(allocation)
    }

    async fn allocate_locked(&self, req: &AllocateRequest) -> Result<Allocation, IpamServiceError> {
        let attrs = BTreeMap::from([
            ("namespace".to_owned(), req.namespace.clone()),
            ("pod".to_owned(), req.pod.clone()),
            ("container_id".to_owned(), req.container_id.clone()),
            ("node".to_owned(), self.host.clone()),
        ]);
        let mut ips = Vec::new();
        if req.ips.is_empty() {
            let mut args = AssignArgs::new(&self.host, &req.handle, req.ipv4, req.ipv6);
            args.attrs = attrs;
            args.pools.clone_from(&req.pools);
            args.node_labels.clone_from(&self.node_labels);
            let result = self.ipam.auto_assign(&args).await?;
            ips = result.ips();
            if let Some(message) = result.partial_fulfilment(&args) {
                // A dual-stack half-success releases the family that succeeded.
                let _ = self.ipam.release_by_handle(&req.handle).await;
                return Err(IpamServiceError::Exhausted(message));
            }
        } else {
            for ip in &req.ips {
                match self
                    .ipam
                    .assign_ip(*ip, &req.handle, attrs.clone(), &self.host, None)
                    .await
                {
                    Ok(net) => ips.push(net.ip()),
                    Err(e) => {
                        let _ = self.ipam.release_by_handle(&req.handle).await;
                        return Err(e.into());
                    }
                }
            }
        }
        let expiry = req
            .expires_in_secs
            .map_or(self.default_expiry, Duration::from_secs);
        Ok(Allocation {
            handle: req.handle.clone(),
            ips,
            expires_at: now() + expiry.as_secs(),
        })
    }

    /// Releases a handle's addresses (idempotent) and forgets it as pending.
    pub async fn release_handle(&self, handle: &str) -> Result<Vec<IpAddr>, IpamServiceError> {
        let mut pending = self.lock.lock().await;
        let released = match self.ipam.release_by_handle(handle).await {
            Ok(ips) => ips,
            Err(IpamError::HandleNotFound { .. }) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        if pending.pending.remove(handle).is_some() {
            persist(&self.pending_path, &pending)?;
        }
        Ok(released)
    }

    /// Releases specific addresses (idempotent): (released, not allocated).
    pub async fn release_ips(
        &self,
        ips: &[IpAddr],
    ) -> Result<(Vec<IpAddr>, Vec<IpAddr>), IpamServiceError> {
        let _guard = self.lock.lock().await;
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
        let report = self.ipam.release_ips(&checks).await?;
        Ok((
            report.released.into_iter().map(|(ip, _)| ip).collect(),
            report.not_allocated,
        ))
    }

    /// Releases every pending allocation whose time is up; returns the handles released.
    pub async fn expire(&self) -> Result<Vec<String>, IpamServiceError> {
        let mut pending = self.lock.lock().await;
        let now = now();
        let due: Vec<String> = pending
            .pending
            .iter()
            .filter(|(_, a)| a.expires_at <= now)
            .map(|(h, _)| h.clone())
            .collect();
        for handle in &due {
            match self.ipam.release_by_handle(handle).await {
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
            persist(&self.pending_path, &pending)?;
        }
        Ok(due)
    }

    /// Addresses held under a handle (empty when none).
    pub async fn ips_of(&self, handle: &str) -> Result<Vec<IpAddr>, IpamServiceError> {
        match self.ipam.ips_by_handle(handle).await {
            Ok(nets) => Ok(nets.iter().map(IpNetwork::ip).collect()),
            Err(IpamError::HandleNotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// A handle's addresses and whether an endpoint confirmed them (`GET /v1/ipam/handles/{h}`).
    pub async fn handle(&self, handle: &str) -> Result<HandleStatus, IpamServiceError> {
        let ips = self.ips_of(handle).await?;
        let pending = self.lock.lock().await.pending.get(handle).cloned();
        Ok(HandleStatus {
            handle: handle.to_owned(),
            confirmed: pending.is_none() && !ips.is_empty(),
            expires_at: pending.map(|p| p.expires_at),
            ips,
        })
    }

    /// Pools with free addresses.
    pub async fn pools(&self) -> Result<Vec<PoolStatus>, IpamServiceError> {
        let util = self.ipam.utilization(false).await?;
        let pools = self.ipam.pools().await?;
        Ok(pools
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
            .collect())
    }
}

fn load_pending(path: &Path) -> PendingFile {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), error = %e, "pending allocations unreadable; treating none as pending");
            PendingFile::default()
        }),
        Err(_) => PendingFile::default(),
    }
}

fn persist(path: &Path, file: &PendingFile) -> Result<(), IpamServiceError> {
    let err = |source| IpamServiceError::Persist {
        path: path.to_owned(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(file).map_err(|e| err(io::Error::other(e)))?;
    crate::fsutil::write_atomic(path, &bytes).map_err(err)
}
