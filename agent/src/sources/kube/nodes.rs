//! Node objects as node records (`--source kubernetes`, DESIGN.md → "Nodes and routing"): the source
//! hands this task every converted Node once the Nodes' first list is in ([`Feed`]), and again whenever a
//! Node changes; the task lists the block affinities of the IPAM datastore every
//! [`TICK`](crate::sources::nodes::TICK) and sends the loop what changed as [`NodeDelta`]s —
//! the same deltas the etcd node records make — then [`NodeDelta::Synced`] after the first full view. A
//! Node deleted is gone (its routes are swept); a Node without an address is named in the log and left
//! out; a Node whose Ready condition has not been True for `--node-expiry` is silent (alive again once
//! Ready): degraded in the status, its routes kept as long as the Node exists, as Cilium does and as an etcd
//! record whose heartbeat is too old keeps them (fail static). The agent never writes Node
//! objects (kubelet does); this node's own is the one named `--node`.
//! A datastore that does not answer changes nothing: the routes in place stay and the next round retries.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::watch;

use crate::{
    calc::policy::model::NodeInfo,
    cluster::{ClusterNode, NodeDelta, diff, store::BlockStore},
    control::applier::{Command, LoopHandle},
    sources::nodes::TICK,
};

/// A converted Node: what the policy takes, and its readiness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeNode {
    /// Name, addresses (InternalIPs, then ExternalIPs), labels.
    pub info: NodeInfo,
    /// Since when (Unix seconds, its `lastTransitionTime`) its Ready condition is not True; `None` while
    /// it is True, or with no Ready condition or transition time to judge by.
    pub not_ready_since: Option<u64>,
}

/// When the Node's Ready condition stopped being True (`None`: it is True, or cannot be judged).
#[must_use]
pub fn not_ready_since(node: &Node) -> Option<u64> {
    let ready = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if ready.status == "True" {
        return None;
    }
    let since = ready.last_transition_time.as_ref()?.0.as_second();
    Some(u64::try_from(since).unwrap_or(0))
}

/// Every converted Node, by name (`None` until the Nodes' first list is in).
pub type NodeObjects = Option<BTreeMap<String, KubeNode>>;

/// The source's end of the feed.
pub type Feed = watch::Sender<NodeObjects>;

/// A feed and the nodes task's end of it.
#[must_use]
pub fn feed() -> (Feed, watch::Receiver<NodeObjects>) {
    watch::channel(None)
}

/// Publishes `nodes` when they differ from what the feed holds (no wake-up otherwise).
pub fn publish(feed: &Feed, nodes: BTreeMap<String, KubeNode>) {
    feed.send_if_modified(|held| {
        if held.as_ref() == Some(&nodes) {
            return false;
        }
        *held = Some(nodes);
        true
    });
}

/// The node records the Node objects make with `blocks` (by host name) at `now` (Unix seconds; a Node not
/// Ready for `expiry` is not alive: silent, still routed), and the names of the Nodes left out because they
/// have no InternalIP or ExternalIP address.
#[must_use]
pub fn records(
    objects: &BTreeMap<String, KubeNode>,
    blocks: &BTreeMap<String, Vec<IpNetwork>>,
    now: u64,
    expiry: Duration,
) -> (BTreeMap<String, ClusterNode>, BTreeSet<String>) {
    let mut nodes = BTreeMap::new();
    let mut refused = BTreeSet::new();
    for (
        name,
        KubeNode {
            info,
            not_ready_since,
        },
    ) in objects
    {
        if info.addresses.is_empty() {
            refused.insert(name.clone());
            continue;
        }
        let mut node_blocks = blocks.get(name).cloned().unwrap_or_default();
        node_blocks.sort();
        nodes.insert(
            name.clone(),
            ClusterNode {
                name: name.clone(),
                addresses: info.addresses.clone(),
                labels: info.labels.clone(),
                blocks: node_blocks,
                alive: not_ready_since
                    .is_none_or(|since| now.saturating_sub(since) < expiry.as_secs()),
                // Not a heartbeat: when it stopped being Ready (0 while Ready).
                heartbeat: not_ready_since.unwrap_or(0),
            },
        );
    }
    (nodes, refused)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs until the loop or the source is gone; a Node not Ready for `expiry` is silent (still routed).
pub async fn run<S: BlockStore>(
    dataplane: LoopHandle,
    store: S,
    mut objects: watch::Receiver<NodeObjects>,
    expiry: Duration,
) {
    let mut blocks: Option<BTreeMap<String, Vec<IpNetwork>>> = None;
    let mut known = BTreeMap::new();
    let mut refused_known = BTreeSet::new();
    let mut synced = false;
    let mut list = tokio::time::interval(TICK);
    list.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = list.tick() => match store.blocks().await {
                Ok(listed) => blocks = Some(listed),
                Err(e) => tracing::warn!(error = %e, "block affinities: listing failed; retrying"),
            },
            changed = objects.changed() => if changed.is_err() {
                return;
            },
        }
        let Some(current) = objects.borrow_and_update().clone() else {
            continue;
        };
        let Some(blocks) = &blocks else { continue };
        let (listed, refused) = records(&current, blocks, now(), expiry);
        for name in refused.difference(&refused_known) {
            tracing::warn!(node = %name, "Node has no InternalIP or ExternalIP address in status.addresses; it gets no routes until it has one");
        }
        refused_known = refused;
        let first = !synced;
        let deltas = diff(&known, &listed);
        known = listed;
        for delta in deltas.into_iter().chain(first.then_some(NodeDelta::Synced)) {
            if dataplane.send(Command::Node(delta)).is_err() {
                return;
            }
        }
        if first {
            tracing::info!(
                nodes = known.len(),
                "Node objects and block affinities listed"
            );
        }
        synced = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipam::{Ipam, store::memory::MemoryStore};

    const EXPIRY: Duration = Duration::from_secs(40);

    fn info(name: &str, addresses: &[&str]) -> KubeNode {
        KubeNode {
            info: NodeInfo {
                name: name.into(),
                addresses: addresses.iter().map(|a| a.parse().expect("ip")).collect(),
                labels: BTreeMap::from([("zone".to_owned(), "z1".to_owned())]),
            },
            not_ready_since: None,
        }
    }

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("cidr")
    }

    #[test]
    fn nodes_with_addresses_become_records_with_their_blocks_and_the_rest_are_named() {
        let objects = BTreeMap::from([
            ("a".to_owned(), info("a", &["192.0.2.1", "fd00::1"])),
            ("b".to_owned(), info("b", &["192.0.2.2"])),
            ("bare".to_owned(), info("bare", &[])),
        ]);
        let blocks = BTreeMap::from([
            (
                "a".to_owned(),
                vec![net("fd00:244::/122"), net("10.244.0.0/26")],
            ),
            ("gone".to_owned(), vec![net("10.244.9.0/26")]),
        ]);
        let (nodes, refused) = records(&objects, &blocks, 1000, EXPIRY);
        assert_eq!(refused, BTreeSet::from(["bare".to_owned()]));
        assert_eq!(nodes.keys().collect::<Vec<_>>(), ["a", "b"]);
        let a = &nodes["a"];
        assert_eq!(a.addresses, objects["a"].info.addresses);
        assert_eq!(a.labels["zone"], "z1");
        assert_eq!(
            a.blocks,
            [net("10.244.0.0/26"), net("fd00:244::/122")],
            "sorted"
        );
        assert!(a.alive);
        assert!(nodes["b"].blocks.is_empty(), "a Node with no affinity yet");
    }

    #[test]
    fn a_node_not_ready_for_the_expiry_is_not_alive() {
        let yaml = |status: &str, since: &str| {
            format!(
                "kind: Node\nmetadata: {{name: n}}\nstatus: {{conditions: [{{type: MemoryPressure, status: \"False\"}}, {{type: Ready, status: \"{status}\", lastTransitionTime: \"{since}\"}}]}}\n"
            )
        };
        let parse = |text: &str| -> Node { serde_norway::from_str(text).expect("a Node") };
        let t = 1_780_000_000_u64; // 2026-05-28T20:26:40Z
        let at = "2026-05-28T20:26:40Z";
        assert_eq!(not_ready_since(&parse(&yaml("True", at))), None);
        assert_eq!(not_ready_since(&parse(&yaml("False", at))), Some(t));
        assert_eq!(not_ready_since(&parse(&yaml("Unknown", at))), Some(t));
        assert_eq!(
            not_ready_since(&parse("kind: Node\nmetadata: {name: n}\n")),
            None,
            "no condition yet: not judged"
        );
        let mut n = info("n", &["192.0.2.9"]);
        n.not_ready_since = Some(t);
        let objects = BTreeMap::from([("n".to_owned(), n)]);
        let alive = |now| records(&objects, &BTreeMap::new(), now, EXPIRY).0["n"].alive;
        assert!(alive(t + 39), "not ready for less than the expiry");
        assert!(!alive(t + 40), "not ready for the expiry");
        assert!(alive(t - 5), "a clock behind the transition");
    }

    #[test]
    fn the_source_hands_over_the_converted_nodes_once_their_list_is_in() {
        use super::super::{cluster, watch::Change, watch::Kind};
        let parse = |text: &str| -> Node { serde_norway::from_str(text).expect("a Node") };
        let key = |name: &str| (String::new(), name.to_owned());
        let good = parse(
            "kind: Node\nmetadata: {name: a}\nstatus: {addresses: [{type: ExternalIP, address: 198.51.100.1}, {type: InternalIP, address: 192.0.2.1}], conditions: [{type: Ready, status: \"False\", lastTransitionTime: \"2026-05-28T20:26:40Z\"}]}\n",
        );
        let bad = parse(
            "kind: Node\nmetadata: {name: b}\nstatus: {addresses: [{type: InternalIP, address: nope}]}\n",
        );
        let mut c = cluster::Cluster::default();
        assert!(c.nodes().is_none());
        c.take(Change::Init(Kind::Nodes));
        c.take(Change::InitApply(
            Kind::Nodes,
            key("a"),
            cluster::node(&good),
        ));
        c.take(Change::InitApply(
            Kind::Nodes,
            key("b"),
            cluster::node(&bad),
        ));
        assert!(c.nodes().is_none(), "the list is under way");
        c.take(Change::InitDone(Kind::Nodes));
        let nodes = c.nodes().expect("listed");
        assert_eq!(
            nodes.keys().collect::<Vec<_>>(),
            ["a"],
            "the bad Node is refused"
        );
        assert_eq!(
            nodes["a"].info.addresses,
            [
                "192.0.2.1".parse::<std::net::IpAddr>().expect("ip"),
                "198.51.100.1".parse().expect("ip")
            ]
        );
        assert_eq!(nodes["a"].not_ready_since, Some(1_780_000_000));
        c.take(Change::Delete(Kind::Nodes, key("a")));
        assert_eq!(c.nodes(), Some(BTreeMap::new()), "deleted");
    }

    #[test]
    fn the_feed_wakes_only_on_a_change() {
        let (tx, mut rx) = feed();
        assert!(rx.borrow().is_none());
        let nodes = BTreeMap::from([("a".to_owned(), info("a", &["192.0.2.1"]))]);
        publish(&tx, nodes.clone());
        assert!(rx.has_changed().expect("open"));
        rx.borrow_and_update();
        publish(&tx, nodes);
        assert!(!rx.has_changed().expect("open"), "the same Nodes again");
        publish(&tx, BTreeMap::new());
        assert!(rx.has_changed().expect("open"));
    }

    #[tokio::test]
    async fn the_blocks_are_the_confirmed_affinities_of_the_datastore() {
        use ipam::model::{IpPool, IpUse};
        let store = Ipam::new(MemoryStore::new());
        store
            .add_pool(IpPool {
                name: "p".into(),
                cidr: net("10.40.0.0/24"),
                block_size: 28,
                node_selector: String::new(),
                namespace_selector: String::new(),
                allowed_uses: vec![IpUse::Workload],
                disabled: false,
            })
            .await
            .expect("pool");
        assert!(
            BlockStore::blocks(&store).await.expect("list").is_empty(),
            "no affinity yet"
        );
        let mut want = BTreeMap::new();
        for (host, n) in [("a", 20), ("b", 3)] {
            let got = store
                .auto_assign(&ipam::AssignArgs::new(host, &format!("h-{host}"), n, 0))
                .await
                .expect("assign");
            let mut held: Vec<IpNetwork> = got
                .ipv4
                .iter()
                .map(|ip| IpNetwork::new(ip.network(), ip.prefix()).expect("block"))
                .collect();
            held.sort();
            held.dedup();
            want.insert(host.to_owned(), held);
        }
        let blocks = BlockStore::blocks(&store).await.expect("list");
        assert_eq!(blocks, want, "every host's blocks, sorted");
        assert_eq!(blocks["a"].len(), 2, "20 addresses take two /28 blocks");
        let objects = BTreeMap::from([("a".to_owned(), info("a", &["192.0.2.1"]))]);
        assert_eq!(
            records(&objects, &blocks, 0, EXPIRY).0["a"].blocks,
            want["a"]
        );

        let local = ipam::store::AnyStore::Memory(MemoryStore::new());
        let e = crate::cluster::store::shared(&local).expect_err("a memory store is node-local");
        assert!(e.to_string().contains("--datastore etcd:URL"), "{e}");
    }
}
