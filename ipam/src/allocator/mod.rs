//! IPAM operations over any [`Store`].

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{
    IpamError,
    model::{Block, IpPool, IpUse, IpamConfig, Reservation},
    store::{Key, Kind, Store, StoreError},
};

mod assign;
mod check;
mod claim;
mod hints;
mod nodes;
mod pools;
mod release;
mod report;

pub use check::CheckReport;
pub use nodes::NodeRelease;
pub use pools::parse_pool_cidr;
pub use release::ReleaseReport;
pub use report::{AddressInfo, BlockSummary, Utilization};

/// Name of the config singleton.
pub const CONFIG_NAME: &str = "default";

/// Seconds an empty block must have been claimed before another host may reclaim it.
pub const EMPTY_BLOCK_MIN_RECLAIM_AGE: u64 = 60;

/// Wall clock, with an offset tests can advance.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    offset: Arc<AtomicU64>,
}

impl Clock {
    /// Unix seconds.
    pub fn now(&self) -> u64 {
        let real = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        real + self.offset.load(Ordering::Relaxed)
    }

    /// Moves the clock forward.
    pub fn advance(&self, secs: u64) {
        self.offset.fetch_add(secs, Ordering::Relaxed);
    }

    /// A seed for a new block's sequence number: nanoseconds, so a recreated block never repeats old numbers.
    pub fn seq_seed(&self) -> u64 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        u64::try_from(nanos).unwrap_or(u64::MAX)
            + self.offset.load(Ordering::Relaxed) * 1_000_000_000
    }
}

/// An auto-assign request.
#[derive(Clone, Debug)]
pub struct AssignArgs {
    /// The host the addresses are for.
    pub host: String,
    /// The handle to allocate under.
    pub handle: String,
    /// IPv4 addresses wanted.
    pub num_v4: u32,
    /// IPv6 addresses wanted.
    pub num_v6: u32,
    /// Owner attributes recorded with the addresses.
    pub attrs: BTreeMap<String, String>,
    /// Pools to use, by name (empty: every enabled pool selecting the host).
    pub pools: Vec<String>,
    /// What the addresses are for.
    pub intended_use: IpUse,
    /// Per-request block limit (0: none).
    pub max_blocks: u32,
    /// The host's labels, for pool node selectors.
    pub node_labels: BTreeMap<String, String>,
    /// The namespace's labels, for pool namespace selectors.
    pub namespace_labels: BTreeMap<String, String>,
    /// At most this many addresses per family under this handle (re-asking returns the held ones).
    pub max_per_handle: Option<u32>,
}

impl AssignArgs {
    /// A workload request for `v4` and `v6` addresses.
    pub fn new(host: &str, handle: &str, v4: u32, v6: u32) -> Self {
        Self {
            host: host.to_owned(),
            handle: handle.to_owned(),
            num_v4: v4,
            num_v6: v6,
            attrs: BTreeMap::new(),
            pools: Vec::new(),
            intended_use: IpUse::Workload,
            max_blocks: 0,
            node_labels: BTreeMap::new(),
            namespace_labels: BTreeMap::new(),
            max_per_handle: None,
        }
    }
}

/// What an auto-assign handed out. Fewer addresses than asked for is not an error: `messages` says why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignResult {
    /// IPv4 addresses, with their block's mask.
    pub ipv4: Vec<IpNetwork>,
    /// IPv6 addresses, with their block's mask.
    pub ipv6: Vec<IpNetwork>,
    /// Why fewer addresses than asked for came back.
    pub messages: Vec<String>,
}

impl AssignResult {
    /// Every address.
    pub fn ips(&self) -> Vec<IpAddr> {
        self.ipv4
            .iter()
            .chain(&self.ipv6)
            .map(IpNetwork::ip)
            .collect()
    }

    /// `Some(message)` when fewer than asked for were assigned.
    pub fn partial_fulfilment(&self, args: &AssignArgs) -> Option<String> {
        let short4 = (self.ipv4.len() as u32) < args.num_v4;
        let short6 = (self.ipv6.len() as u32) < args.num_v6;
        (short4 || short6).then(|| {
            format!(
                "assigned {} of {} requested ipv4 and {} of {} requested ipv6 addresses; {}",
                self.ipv4.len(),
                args.num_v4,
                self.ipv6.len(),
                args.num_v6,
                self.messages.join("; ")
            )
        })
    }
}

/// What every allocation reads first.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub config: IpamConfig,
    pub pools: Vec<IpPool>,
    pub reservations: Arc<Vec<Reservation>>,
}

/// The IPAM over a datastore.
#[derive(Clone, Debug)]
pub struct Ipam<S> {
    store: S,
    clock: Clock,
    hints: hints::Hints,
}

pub(crate) fn decode<T: DeserializeOwned>(key: &Key, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
        key: key.to_string(),
        source,
    })
}

/// Decodes a block for an operation that changes it, refusing one whose structure is unsound (a free
/// ordinal out of range, fewer ordinals than its CIDR holds, …): those operations index its ordinals.
/// Reads keep [`decode`], so that `weir ipam check` can still list such a block's problems.
pub(crate) fn decode_block(key: &Key, bytes: &[u8]) -> Result<Block, StoreError> {
    let block: Block = decode(key, bytes)?;
    match block.problems().into_iter().next() {
        None => Ok(block),
        Some(problem) => Err(StoreError::Corrupt {
            key: key.to_string(),
            source: serde::de::Error::custom(format!(
                "{problem}; repair or delete the record (`weir ipam check` lists every problem)"
            )),
        }),
    }
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing these plain structs cannot fail (no maps with non-string keys, no custom serializers).
    serde_json::to_vec(v).unwrap_or_default()
}

impl<S: Store + Clone> Ipam<S> {
    /// The IPAM over `store`.
    pub fn new(store: S) -> Self {
        Self {
            store,
            clock: Clock::default(),
            hints: hints::Hints::default(),
        }
    }

    /// The IPAM over `store` with a given clock.
    pub fn with_clock(store: S, clock: Clock) -> Self {
        Self {
            store,
            clock,
            hints: hints::Hints::default(),
        }
    }

    /// The datastore.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub(crate) async fn get_obj<T: DeserializeOwned>(
        &self,
        key: &Key,
    ) -> Result<Option<(T, crate::store::Revision)>, IpamError> {
        match self.store.get(key).await? {
            Some(v) => Ok(Some((decode(key, &v.value)?, v.revision))),
            None => Ok(None),
        }
    }

    pub(crate) async fn list_objs<T: DeserializeOwned>(
        &self,
        kind: Kind,
        prefix: &str,
    ) -> Result<Vec<(T, crate::store::Revision)>, IpamError> {
        let rows = self.store.list(kind, prefix).await?;
        let mut out = Vec::with_capacity(rows.len());
        for (name, v) in rows {
            out.push((decode(&Key::new(kind, name), &v.value)?, v.revision));
        }
        Ok(out)
    }

    /// The config (defaults when none is stored; reading never writes).
    pub async fn config(&self) -> Result<IpamConfig, IpamError> {
        Ok(self
            .get_obj(&Key::new(Kind::Config, CONFIG_NAME))
            .await?
            .map(|(c, _)| c)
            .unwrap_or_default())
    }

    /// Validates and stores the config.
    pub async fn set_config(&self, config: IpamConfig) -> Result<(), IpamError> {
        config.validate()?;
        let value = encode(&config);
        self.store
            .read_modify_write(vec![Key::new(Kind::Config, CONFIG_NAME)], move |_| {
                (vec![crate::store::Write::Put(value.clone())], ())
            })
            .await?;
        Ok(())
    }

    pub(crate) async fn snapshot(&self) -> Result<Snapshot, IpamError> {
        let config = self.config().await?;
        let pools = self.pools().await?;
        let reservations = self.reservations().await?;
        Ok(Snapshot {
            config,
            pools,
            reservations: Arc::new(reservations),
        })
    }

    /// Every reservation.
    pub async fn reservations(&self) -> Result<Vec<Reservation>, IpamError> {
        Ok(self
            .list_objs(Kind::Reservation, "")
            .await?
            .into_iter()
            .map(|(r, _)| r)
            .collect())
    }

    /// Adds or replaces a reservation.
    pub async fn put_reservation(&self, r: Reservation) -> Result<(), IpamError> {
        let value = encode(&r);
        self.store
            .read_modify_write(
                vec![Key::new(Kind::Reservation, r.name.clone())],
                move |_| (vec![crate::store::Write::Put(value.clone())], ()),
            )
            .await?;
        Ok(())
    }
}
