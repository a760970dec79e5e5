//! A cluster of node namespaces on one kernel (DESIGN.md → "Nodes and routing"): an infra namespace holds an
//! underlay bridge and a real etcd; each node is a namespace joined to the bridge by a veth, with its own
//! agent (pin root, socket, state directory) on that etcd, and pods made through `weir-cni`. Nodes are
//! numbered from 0; node `i` is `wt-node-<i>` at `10.99.0.<11 + i>`, etcd at `10.99.0.1`.

use std::{collections::BTreeSet, process::Output};

use hyper::Method;
use serde_json::Value;

use crate::{
    cni::{CniNode, Pod},
    etcd_netns::{NetnsEtcd, PORT},
    names,
    netns::NetNs,
};

/// The underlay's address of etcd (the bridge's own address).
pub const ETCD_IP: &str = "10.99.0.1";

/// A node of the cluster: its agent (with its namespace) and its pods.
#[derive(Debug)]
pub struct Node {
    /// The node (agent, directories, namespace).
    pub cni: CniNode,
    /// Its pods with their ADD results.
    pub pods: Vec<(Pod, Value)>,
    /// Its name.
    pub name: String,
    /// Its underlay address.
    pub address: String,
}

impl Node {
    /// `ip …` output inside the node (stdout as text).
    #[must_use]
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["ip"];
        all.extend_from_slice(args);
        text(&self.cni.ns.exec(&all))
    }

    /// weir's routes on this node (`ip route show proto 87`), one line each, sorted.
    #[must_use]
    pub fn weir_routes(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .ip(&["route", "show", "proto", "87"])
            .lines()
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    }

    /// The nodes this node's agent lists (`GET /v1/nodes`).
    #[must_use]
    pub fn nodes(&self) -> Vec<Value> {
        let nodes: Value = self
            .cni
            .agent
            .as_ref()
            .expect("running")
            .api(Method::GET, "/v1/nodes", None)
            .expect("nodes");
        nodes.as_array().cloned().unwrap_or_default()
    }

    /// `weir node list` (the table) and `/metrics` on this node show `name` as silent: `health` `silent` with
    /// its last-seen age, `weir_nodes{health="silent"} 1` and `weir_node_silent_seconds{node=…}`.
    pub fn shows_silent(&self, name: &str) {
        let socket = self.cni.socket();
        let out = self.cni.ns.exec(&[
            crate::bin::weir().to_str().expect("utf-8 path"),
            "node",
            "list",
            "--api-socket",
            socket.to_str().expect("utf-8 path"),
        ]);
        let table = String::from_utf8_lossy(&out.stdout);
        let row: Vec<&str> = table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("weir node list has no {name}:\n{table}"))
            .split_whitespace()
            .collect();
        assert_eq!(row[2], "silent", "{table}");
        assert!(row[3].ends_with('s') && row[4] == "ago", "{table}");
        let metrics = self
            .cni
            .ns
            .run(|| crate::agent_proc::metrics_get("/metrics"));
        assert!(
            metrics
                .lines()
                .any(|l| l == r#"weir_nodes{health="silent"} 1"#),
            "{metrics}"
        );
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(&format!(r#"weir_node_silent_seconds{{node="{name}"}} "#))),
            "{metrics}"
        );
    }

    /// The blocks this node reports for itself (`GET /v1/nodes`).
    #[must_use]
    pub fn own_blocks(&self) -> BTreeSet<String> {
        self.nodes()
            .iter()
            .filter(|n| n["name"] == self.name.as_str())
            .flat_map(|n| n["blocks"].as_array().cloned().unwrap_or_default())
            .filter_map(|b| b.as_str().map(str::to_owned))
            .collect()
    }

    /// `dest via next-hop` of weir's routes on this node.
    #[must_use]
    pub fn routes(&self) -> BTreeSet<String> {
        self.weir_routes()
            .iter()
            .map(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                format!("{} via {}", words[0], words.get(2).copied().unwrap_or("?"))
            })
            .collect()
    }

    /// The pods' MTU in the conflist the agent wrote (`None`: weir-cni's default).
    #[must_use]
    pub fn conflist_mtu(&self) -> Option<u64> {
        let path = self.cni.dirs.path("net.d").join("04-weir.conflist");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let conflist: Value = serde_json::from_str(&text).expect("the conflist is JSON");
        conflist["plugins"][0]["mtu"].as_u64()
    }

    /// Adds a pod through `weir-cni`, with the conflist's MTU as a runtime passes it; returns its address.
    pub fn add_pod(&mut self, namespace: &str, name: &str) -> String {
        let pod = Pod::k8s(namespace, name);
        let extra = self
            .conflist_mtu()
            .map_or(Value::Null, |mtu| serde_json::json!({ "mtu": mtu }));
        let result = self.cni.add(&pod, &self.cni.conf(&extra));
        let ip = Pod::ipv4(&result);
        self.pods.push((pod, result));
        ip
    }
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cluster. Nodes go first (their agents stop), then etcd, then the infra namespace.
#[derive(Debug)]
pub struct Cluster {
    /// The nodes, by number (`None`: removed).
    pub nodes: Vec<Option<Node>>,
    /// etcd.
    pub etcd: NetnsEtcd,
    /// The infra namespace (bridge and etcd).
    pub infra: NetNs,
    bridge: String,
    extra: Vec<String>,
}

impl Cluster {
    /// An infra namespace with the bridge and etcd, and no nodes yet; agents get `extra` flags.
    #[must_use]
    pub fn new(extra: &[&str]) -> Self {
        let infra = NetNs::new();
        let bridge = names::unique("br");
        infra.exec(&["ip", "link", "add", &bridge, "type", "bridge"]);
        // A fixed address: a bridge otherwise takes its lowest port's, which changes when a node leaves,
        // and nodes whose TCP traffic keeps confirming the old neighbour entry never ask again.
        infra.exec(&["ip", "link", "set", &bridge, "address", "02:00:0a:63:00:01"]);
        infra.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{ETCD_IP}/24"),
            "dev",
            &bridge,
        ]);
        infra.exec(&["ip", "link", "set", &bridge, "up"]);
        let etcd = NetnsEtcd::start(&infra);
        Self {
            nodes: Vec::new(),
            etcd,
            infra,
            bridge,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// The datastore flag's value.
    #[must_use]
    pub fn datastore() -> String {
        format!("etcd:http://{ETCD_IP}:{PORT}")
    }

    /// Adds node number `self.nodes.len()`: its namespace joined to the bridge, and its agent.
    pub fn add_node(&mut self) -> &mut Node {
        self.add_node_with(|_, _| Vec::new())
    }

    /// [`Self::add_node`], with `prepare` run in between: given the node's namespace and its
    /// underlay link's name, it sets up what the node needs before its agent starts and returns
    /// the agent's extra flags for this node.
    pub fn add_node_with(
        &mut self,
        prepare: impl FnOnce(&NetNs, &str) -> Vec<String>,
    ) -> &mut Node {
        let i = self.nodes.len();
        let name = format!("wt-node-{i}");
        let address = format!("10.99.0.{}", 11 + i);
        let ns = NetNs::new();
        let (outer, inner) = (names::unique("u"), names::unique("n"));
        self.infra.exec(&[
            "ip",
            "link",
            "add",
            &outer,
            "type",
            "veth",
            "peer",
            "name",
            &inner,
            "netns",
            ns.name(),
        ]);
        self.infra
            .exec(&["ip", "link", "set", &outer, "master", &self.bridge]);
        self.infra.exec(&["ip", "link", "set", &outer, "up"]);
        ns.exec(&["ip", "addr", "add", &format!("{address}/24"), "dev", &inner]);
        ns.exec(&["ip", "link", "set", &inner, "up"]);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        let own = prepare(&ns, &inner);
        let datastore = Self::datastore();
        let mut flags: Vec<&str> = vec!["--datastore", &datastore, "--node", &name];
        flags.extend(self.extra.iter().map(String::as_str));
        flags.extend(own.iter().map(String::as_str));
        let cni = CniNode::start_in(ns, &flags);
        self.nodes.push(Some(Node {
            cni,
            pods: Vec::new(),
            name,
            address,
        }));
        self.nodes[i].as_mut().expect("just added")
    }

    /// Node `i` (panics when removed).
    #[must_use]
    pub fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("a node that was not removed")
    }

    /// Node `i`, mutable.
    pub fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("a node that was not removed")
    }

    /// The live nodes.
    pub fn live(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().flatten()
    }
}
