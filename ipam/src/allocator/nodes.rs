//! Node records (standalone nodes sharing a datastore) and what a node holds: its blocks are its confirmed
//! affinities. A decommissioned node's blocks are freed by [`Ipam::release_node`], refused while the node's
//! heartbeat is live unless forced (as `calicoctl ipam release` for a node that is gone).

use std::collections::BTreeMap;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::{Ipam, encode};
use crate::{
    IpamError,
    model::{AffinityState, BlockAffinity, EndpointRecord, NodeRecord, ReleaseCheck},
    store::{Key, Kind, Store, Write},
};

/// What [`Ipam::release_node`] freed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRelease {
    /// The node.
    pub node: String,
    /// Blocks whose affinity was released.
    pub blocks: Vec<IpNetwork>,
    /// Addresses released from those blocks.
    pub addresses: usize,
    /// Whether the node's record was deleted.
    pub record_deleted: bool,
}

impl<S: Store + Clone> Ipam<S> {
    /// Writes (creates or replaces) `record`: the agent's heartbeat.
    pub async fn put_node(&self, record: &NodeRecord) -> Result<(), IpamError> {
        let value = encode(record);
        self.store
            .read_modify_write(vec![Key::new(Kind::Node, record.name.clone())], move |_| {
                (vec![Write::Put(value.clone())], ())
            })
            .await?;
        Ok(())
    }

    /// The record of node `name`, if any.
    pub async fn node(&self, name: &str) -> Result<Option<NodeRecord>, IpamError> {
        Ok(self
            .get_obj::<NodeRecord>(&Key::new(Kind::Node, name))
            .await?
            .map(|(n, _)| n))
    }

    /// Every node record, by name.
    pub async fn nodes(&self) -> Result<BTreeMap<String, NodeRecord>, IpamError> {
        Ok(self
            .list_objs::<NodeRecord>(Kind::Node, "")
            .await?
            .into_iter()
            .map(|(n, _)| (n.name.clone(), n))
            .collect())
    }

    /// Deletes node `name`'s record (absent: nothing to do). Returns whether one was deleted.
    pub async fn delete_node(&self, name: &str) -> Result<bool, IpamError> {
        Ok(self
            .store
            .read_modify_write(vec![Key::new(Kind::Node, name)], |cur| {
                if cur[0].is_some() {
                    (vec![Write::Delete], true)
                } else {
                    (vec![Write::Keep], false)
                }
            })
            .await?)
    }

    /// Makes `node`'s endpoint records exactly `records` (each of which must name `node`): writes the missing
    /// and changed ones, deletes the rest. Returns how many records it wrote or deleted.
    pub async fn sync_endpoints(
        &self,
        node: &str,
        records: &[EndpointRecord],
    ) -> Result<usize, IpamError> {
        let present: BTreeMap<String, EndpointRecord> = self
            .list_objs::<EndpointRecord>(Kind::Endpoint, &format!("{node}/"))
            .await?
            .into_iter()
            .filter(|(r, _)| r.node == node)
            .map(|(r, _)| (r.key_name(), r))
            .collect();
        let mut changes = 0;
        for r in records.iter().filter(|r| r.node == node) {
            if present.get(&r.key_name()) == Some(r) {
                continue;
            }
            let value = encode(r);
            self.store
                .read_modify_write(vec![Key::new(Kind::Endpoint, r.key_name())], move |_| {
                    (vec![Write::Put(value.clone())], ())
                })
                .await?;
            changes += 1;
        }
        for name in present.keys() {
            if records
                .iter()
                .any(|r| r.node == node && &r.key_name() == name)
            {
                continue;
            }
            self.store
                .read_modify_write(vec![Key::new(Kind::Endpoint, name.clone())], |cur| {
                    (
                        vec![if cur[0].is_some() {
                            Write::Delete
                        } else {
                            Write::Keep
                        }],
                        (),
                    )
                })
                .await?;
            changes += 1;
        }
        Ok(changes)
    }

    /// Every endpoint record of every node.
    pub async fn endpoint_records(&self) -> Result<Vec<EndpointRecord>, IpamError> {
        Ok(self
            .list_objs::<EndpointRecord>(Kind::Endpoint, "")
            .await?
            .into_iter()
            .map(|(r, _)| r)
            .collect())
    }

    /// Every host's blocks: its confirmed, not deleted affinities.
    pub async fn blocks_by_host(&self) -> Result<BTreeMap<String, Vec<IpNetwork>>, IpamError> {
        let mut hosts: BTreeMap<String, Vec<IpNetwork>> = BTreeMap::new();
        for (a, _) in self.list_objs::<BlockAffinity>(Kind::Affinity, "").await? {
            if !a.deleted && a.state == AffinityState::Confirmed {
                hosts.entry(a.host).or_default().push(a.cidr);
            }
        }
        Ok(hosts)
    }

    /// Frees a decommissioned node's blocks: every address allocated in them, then its affinities (the
    /// blocks are deleted), then its record. Refused while the node's record has a live heartbeat at `now`
    /// (Unix seconds), unless `force`.
    pub async fn release_node(
        &self,
        name: &str,
        force: bool,
        now: u64,
    ) -> Result<NodeRelease, IpamError> {
        if let Some(record) = self.node(name).await?
            && record.alive(now)
            && !force
        {
            return Err(IpamError::NodeLive {
                node: name.to_owned(),
                seconds: record.heartbeat.saturating_add(record.expiry) - now,
            });
        }
        let mut report = NodeRelease {
            node: name.to_owned(),
            ..NodeRelease::default()
        };
        let affinities = self.host_affinities(name).await?;
        for a in &affinities {
            let Some((block, _)) = self
                .get_obj::<crate::model::Block>(&super::claim::block_key(&a.cidr))
                .await?
            else {
                continue;
            };
            if !block.is_affine_to(name) {
                continue;
            }
            let ips: Vec<_> = block
                .live_ordinals()
                .map(|o| (block.ip(o), ReleaseCheck::default()))
                .collect();
            if !ips.is_empty() {
                report.addresses += self.release_ips(&ips).await?.released.len();
            }
        }
        self.release_host_affinities(name, false).await?;
        self.sync_endpoints(name, &[]).await?;
        report.blocks = affinities.into_iter().map(|a| a.cidr).collect();
        report.record_deleted = self.delete_node(name).await?;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        AssignArgs,
        model::{IpPool, IpUse},
        store::memory::MemoryStore,
    };

    fn record(name: &str, heartbeat: u64) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            addresses: vec!["192.0.2.1".parse().expect("ip")],
            labels: BTreeMap::new(),
            heartbeat,
            expiry: 10,
        }
    }

    #[tokio::test]
    async fn records_round_trip_and_a_live_node_is_released_only_when_forced() {
        let ipam = Ipam::new(MemoryStore::default());
        ipam.add_pool(IpPool {
            name: "p".into(),
            cidr: "10.40.0.0/24".parse().expect("cidr"),
            block_size: 28,
            node_selector: String::new(),
            namespace_selector: String::new(),
            allowed_uses: vec![IpUse::Workload],
            disabled: false,
        })
        .await
        .expect("pool");
        ipam.put_node(&record("n1", 100)).await.expect("put");
        ipam.put_node(&record("n2", 100)).await.expect("put");
        assert_eq!(
            ipam.nodes().await.expect("list").keys().collect::<Vec<_>>(),
            ["n1", "n2"]
        );
        let got = ipam
            .auto_assign(&AssignArgs::new("n1", "h1", 3, 0))
            .await
            .expect("assign");
        assert_eq!(got.ipv4.len(), 3);
        let blocks = ipam.blocks_by_host().await.expect("blocks");
        assert_eq!(blocks.get("n1").map(Vec::len), Some(1));
        assert!(!blocks.contains_key("n2"));

        // `check` reports a block only once its node has no record.
        let node_leaks = |r: crate::allocator::CheckReport| {
            r.leaks
                .into_iter()
                .filter(|l| l.contains("no node record"))
                .count()
        };
        assert_eq!(node_leaks(ipam.check().await.expect("check")), 0);
        let n1 = ipam.node("n1").await.expect("get").expect("n1");
        assert!(ipam.delete_node("n1").await.expect("delete"));
        assert_eq!(node_leaks(ipam.check().await.expect("check")), 1);
        ipam.put_node(&n1).await.expect("put back");

        let refused = ipam.release_node("n1", false, 105).await;
        assert!(
            matches!(refused, Err(IpamError::NodeLive { .. })),
            "{refused:?}"
        );
        let released = ipam.release_node("n1", true, 105).await.expect("forced");
        assert_eq!((released.blocks.len(), released.addresses), (1, 3));
        assert!(released.record_deleted);
        assert!(
            !ipam
                .blocks_by_host()
                .await
                .expect("blocks")
                .contains_key("n1")
        );
        assert!(ipam.node("n1").await.expect("get").is_none());
        // Endpoint records: synced per node, listed for all.
        let ep = |node: &str, pod: &str| EndpointRecord {
            node: node.into(),
            namespace: "ns".into(),
            pod: pod.into(),
            labels: BTreeMap::from([("app".to_owned(), pod.to_owned())]),
            ips: vec!["10.40.0.9".parse().expect("ip")],
        };
        let mine = [ep("n2", "a"), ep("n2", "b")];
        assert_eq!(ipam.sync_endpoints("n2", &mine).await.expect("sync"), 2);
        assert_eq!(
            ipam.sync_endpoints("n2", &mine).await.expect("sync"),
            0,
            "unchanged: no write"
        );
        assert_eq!(
            ipam.sync_endpoints("n2", &mine[..1]).await.expect("sync"),
            1
        );
        assert_eq!(
            ipam.endpoint_records().await.expect("list"),
            vec![ep("n2", "a")]
        );
        // An expired node needs no force.
        let expired = ipam.release_node("n2", false, 200).await.expect("expired");
        assert!(expired.record_deleted && expired.blocks.is_empty());
        assert!(
            ipam.endpoint_records().await.expect("list").is_empty(),
            "its endpoints went with it"
        );
    }
}
