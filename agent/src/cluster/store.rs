//! Where node records and blocks live, behind two small traits: the nodes source heartbeats this node's
//! record and lists every node with its blocks ([`NodeStore`]); the Kubernetes nodes source, whose records
//! are Node objects, lists only the blocks ([`BlockStore`]). The real store is the IPAM's datastore
//! (`ipam::Ipam` over any store: etcd, Kubernetes custom resources); tests use the same code over the
//! IPAM's memory store.
//!
//! Following: [`NodeStore::list_records`] reads every record at one revision and [`NodeStore::watch_records`]
//! follows their changes from there (etcd); a store without a watch answers `None` and is listed again.

use std::{collections::BTreeMap, future::Future};

use ipam::{
    Ipam, IpamError,
    model::{AffinityState, BlockAffinity, EndpointRecord, NodeRecord},
    store::{
        AnyStore, Key, Kind, Revision, Store, StoreError,
        watch::{Change, WatchStore},
    },
};
use tokio::sync::mpsc;

use super::{
    ClusterNode,
    records::{RecordChange, Records},
};
use ipnetwork::IpNetwork;

/// The kinds the nodes source follows.
const FOLLOWED: [Kind; 3] = [Kind::Node, Kind::Affinity, Kind::Endpoint];

/// Every followed record, and the revision they were read at (`None`: the store cannot watch from it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordListing {
    /// The records.
    pub records: Records,
    /// The revision of the read.
    pub revision: Option<u64>,
}

/// The changes after a listing, one batch per watch response; an error ends the watch.
pub type RecordChanges = mpsc::Receiver<Result<Vec<RecordChange>, NodeStoreError>>;

/// A node-store failure.
#[derive(Debug, thiserror::Error)]
pub enum NodeStoreError {
    /// The datastore failed.
    #[error("cannot {what} in the datastore: {source}; routes stay as they are until it answers")]
    Datastore {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: IpamError,
    },
    /// The datastore is this node's own: other nodes' affinities are not in it.
    #[error(
        "the {backend} datastore is this node's own and holds no other node's block affinities, so no route to another node's pods can be made; use --datastore etcd:URL or --datastore kubernetes (WEIR_DATASTORE) on every node"
    )]
    NodeLocal {
        /// The datastore's backend.
        backend: &'static str,
    },
    /// The datastore's watch stopped without saying why.
    #[error("the datastore's watch of the node records ended; listing them again")]
    WatchEnded,
}

/// Whether `store` is shared by the cluster's nodes (so its affinities say where every node's blocks are).
pub fn shared(store: &AnyStore) -> Result<(), NodeStoreError> {
    match store {
        AnyStore::Etcd(_) | AnyStore::Kubernetes(_) => Ok(()),
        AnyStore::Embedded(_) | AnyStore::Memory(_) => Err(NodeStoreError::NodeLocal {
            backend: store.backend(),
        }),
    }
}

/// Every node's pod blocks: its confirmed IPAM block affinities.
pub trait BlockStore: Send + Sync + 'static {
    /// Every host's blocks, by host name, each list sorted.
    fn blocks(
        &self,
    ) -> impl Future<Output = Result<BTreeMap<String, Vec<IpNetwork>>, NodeStoreError>> + Send;
}

impl<S: Store + Clone> BlockStore for Ipam<S> {
    async fn blocks(&self) -> Result<BTreeMap<String, Vec<IpNetwork>>, NodeStoreError> {
        let mut hosts =
            self.blocks_by_host()
                .await
                .map_err(|source| NodeStoreError::Datastore {
                    what: "list the block affinities",
                    source,
                })?;
        for blocks in hosts.values_mut() {
            blocks.sort();
        }
        Ok(hosts)
    }
}

impl NodeStoreError {
    /// Whether a watch ended because the revision it followed from was compacted (list again at once).
    #[must_use]
    pub fn is_compacted(&self) -> bool {
        matches!(
            self,
            Self::Datastore {
                source: IpamError::Store(StoreError::Compacted { .. }),
                ..
            }
        )
    }
}

/// Node records and block affinities.
pub trait NodeStore: Send + Sync + 'static {
    /// Writes this node's record (its heartbeat).
    fn heartbeat(
        &self,
        record: &NodeRecord,
    ) -> impl Future<Output = Result<(), NodeStoreError>> + Send;
    /// Every node with a record, with its blocks and its liveness at `now` (Unix seconds).
    fn nodes(
        &self,
        now: u64,
    ) -> impl Future<Output = Result<BTreeMap<String, ClusterNode>, NodeStoreError>> + Send;
    /// Makes `node`'s endpoint records exactly `records`.
    fn publish_endpoints(
        &self,
        node: &str,
        records: &[EndpointRecord],
    ) -> impl Future<Output = Result<(), NodeStoreError>> + Send;
    /// Every node's endpoint records.
    fn endpoints(&self)
    -> impl Future<Output = Result<Vec<EndpointRecord>, NodeStoreError>> + Send;
    /// Every node record, block affinity and endpoint record, read at one revision.
    fn list_records(&self) -> impl Future<Output = Result<RecordListing, NodeStoreError>> + Send;
    /// Their changes after revision `after`; `None`: the store cannot watch (list again instead).
    fn watch_records(
        &self,
        after: u64,
    ) -> impl Future<Output = Result<Option<RecordChanges>, NodeStoreError>> + Send;
}

/// A stored row as a record change (`value`: `None` when deleted).
fn record_change(
    kind: Kind,
    name: String,
    value: Option<&[u8]>,
) -> Result<RecordChange, StoreError> {
    fn decode<T: serde::de::DeserializeOwned>(
        kind: Kind,
        name: &str,
        v: &[u8],
    ) -> Result<T, StoreError> {
        serde_json::from_slice(v).map_err(|source| StoreError::Corrupt {
            key: Key::new(kind, name).to_string(),
            source,
        })
    }
    Ok(match kind {
        Kind::Node => {
            let record = value
                .map(|v| decode::<NodeRecord>(kind, &name, v))
                .transpose()?;
            RecordChange::Node(name, record)
        }
        Kind::Endpoint => {
            let record = value
                .map(|v| decode::<EndpointRecord>(kind, &name, v))
                .transpose()?;
            RecordChange::Endpoint(name, record)
        }
        _ => {
            let affinity = value
                .map(|v| decode::<BlockAffinity>(kind, &name, v))
                .transpose()?;
            let block = affinity
                .filter(|a| !a.deleted && a.state == AffinityState::Confirmed)
                .map(|a| (a.host, a.cidr));
            RecordChange::Block(name, block)
        }
    })
}

fn datastore(what: &'static str) -> impl Fn(StoreError) -> NodeStoreError {
    move |e| NodeStoreError::Datastore {
        what,
        source: IpamError::Store(e),
    }
}

impl<S: Store + WatchStore + Clone> NodeStore for Ipam<S> {
    async fn list_records(&self) -> Result<RecordListing, NodeStoreError> {
        let what = "list the node records, block affinities and endpoint records";
        let listing = self
            .store()
            .list_at(FOLLOWED.to_vec())
            .await
            .map_err(datastore(what))?;
        let mut records = Records::default();
        for (kind, rows) in listing.rows {
            for (name, v) in rows {
                records.apply(record_change(kind, name, Some(&v.value)).map_err(datastore(what))?);
            }
        }
        Ok(RecordListing {
            records,
            revision: listing.revision.map(|r| r.0),
        })
    }

    async fn watch_records(&self, after: u64) -> Result<Option<RecordChanges>, NodeStoreError> {
        let what = "watch the node records, block affinities and endpoint records";
        let Some(mut changes) = self
            .store()
            .watch(FOLLOWED.to_vec(), Revision(after))
            .await
            .map_err(datastore(what))?
        else {
            return Ok(None);
        };
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(batch) = changes.recv().await {
                let decoded = batch.and_then(|b| {
                    b.into_iter()
                        .map(
                            |Change {
                                 kind, name, value, ..
                             }| {
                                record_change(kind, name, value.as_deref())
                            },
                        )
                        .collect::<Result<Vec<_>, _>>()
                });
                let failed = decoded.is_err();
                if tx.send(decoded.map_err(datastore(what))).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Some(rx))
    }

    async fn heartbeat(&self, record: &NodeRecord) -> Result<(), NodeStoreError> {
        self.put_node(record)
            .await
            .map_err(|source| NodeStoreError::Datastore {
                what: "write this node's record",
                source,
            })
    }

    async fn publish_endpoints(
        &self,
        node: &str,
        records: &[EndpointRecord],
    ) -> Result<(), NodeStoreError> {
        self.sync_endpoints(node, records)
            .await
            .map(|_| ())
            .map_err(|source| NodeStoreError::Datastore {
                what: "publish this node's endpoint records",
                source,
            })
    }

    async fn endpoints(&self) -> Result<Vec<EndpointRecord>, NodeStoreError> {
        self.endpoint_records()
            .await
            .map_err(|source| NodeStoreError::Datastore {
                what: "list the endpoint records",
                source,
            })
    }

    async fn nodes(&self, now: u64) -> Result<BTreeMap<String, ClusterNode>, NodeStoreError> {
        let records = Ipam::nodes(self)
            .await
            .map_err(|source| NodeStoreError::Datastore {
                what: "list the node records",
                source,
            })?;
        let mut blocks = BlockStore::blocks(self).await?;
        Ok(records
            .into_iter()
            .map(|(name, r)| {
                let node_blocks = blocks.remove(&name).unwrap_or_default();
                let node = ClusterNode {
                    alive: r.alive(now),
                    name: r.name,
                    addresses: r.addresses,
                    labels: r.labels,
                    blocks: node_blocks,
                    heartbeat: r.heartbeat,
                };
                (name, node)
            })
            .collect())
    }
}
