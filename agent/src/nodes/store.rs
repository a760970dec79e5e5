//! Where node records and blocks live, behind two small traits: the nodes source heartbeats this node's
//! record and lists every node with its blocks ([`NodeStore`]); the Kubernetes nodes source, whose records
//! are Node objects, lists only the blocks ([`BlockStore`]). The real store is the IPAM's datastore
//! (`ipam::Ipam` over any store: etcd, Kubernetes custom resources); tests use the same code over the
//! IPAM's memory store.

use std::{collections::BTreeMap, future::Future};

use ipam::{
    Ipam, IpamError,
    model::{EndpointRecord, NodeRecord},
    store::{AnyStore, Store},
};
use ipnetwork::IpNetwork;

use super::ClusterNode;

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
}

impl<S: Store + Clone> NodeStore for Ipam<S> {
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
