//! `GET /v1/status`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::nodes::NodeStatus;

/// `GET /v1/status`: what every client reads (ready, pin root, pools) and the agent's detail,
/// flattened into the same object.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    /// Ready: first in-sync applied and the dataplane is not failing.
    pub ready: bool,
    /// Node name.
    #[serde(default)]
    pub node: String,
    /// The agent's bpffs pin root: where weir-cni finds the programs to attach (empty from an
    /// agent that does not say; see [`Status::agent_pin_root`]).
    #[serde(default)]
    pub bpf_root: PathBuf,
    /// Registered endpoints.
    #[serde(default)]
    pub endpoints: usize,
    /// Pools.
    #[serde(default)]
    pub pools: Vec<PoolStatus>,
    /// The agent's detail (node state, applier, dataplane and conntrack counters).
    #[serde(flatten)]
    pub detail: StatusDetail,
}

impl Status {
    /// The agent's pin root, `None` when the agent did not say (an older agent).
    #[must_use]
    pub fn agent_pin_root(&self) -> Option<&Path> {
        pin_root(&self.bpf_root)
    }
}

/// A pin root from an answer: `None` when empty (the agent did not say).
#[must_use]
pub fn pin_root(path: &Path) -> Option<&Path> {
    (!path.as_os_str().is_empty()).then_some(path)
}

/// A pool as the status shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Name.
    pub name: String,
    /// CIDR.
    pub cidr: String,
    /// Free addresses.
    pub free: u64,
    /// Disabled pools hand out nothing.
    #[serde(default)]
    pub disabled: bool,
}

/// The agent's part of `GET /v1/status` (flattened into the same object). Every part defaults
/// when absent, so a client reads the status of an agent that says less.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatusDetail {
    /// Node state.
    pub state: NodeSummary,
    /// Applier progress.
    pub applied: Applied,
    /// Driver counters.
    pub dataplane: DataplaneStatus,
    /// Conntrack sweeps and map pressure.
    pub conntrack: ConntrackStats,
    /// The cluster's nodes (with node records: an `etcd:` datastore), their blocks, routes and health.
    pub nodes: Vec<NodeStatus>,
    /// The cgroup v2 directory socket LB is attached to (`--socket-lb-cgroup`); absent: off.
    pub socket_lb: Option<PathBuf>,
    /// Which sockets socket LB places (`--socket-lb-scope`); absent: off.
    pub socket_lb_scope: Option<SocketLbScope>,
    /// The masquerade's NAT map (`nat4_v1`) as of its last sweep: entries, capacity, what the
    /// sweeps removed and what the programs counted.
    pub nat: NatStats,
    /// The agent's own storage: the embedded IPAM datastore and the state files.
    pub storage: StorageStatus,
}

/// The agent's own storage (`storage` in the status): the embedded IPAM datastore and the state
/// files in its state directory. While a write fails (a full disk, an I/O error) allocations and
/// endpoint changes that need it are refused (CNI: try again later) and the store is degraded;
/// the agent reopens and probes by itself and clears the fault once a write succeeds. Readiness
/// is unaffected: the dataplane keeps serving the pods that exist.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StorageStatus {
    /// True while any fault below is open.
    pub degraded: bool,
    /// What fails now.
    pub faults: Vec<StorageFault>,
    /// Faults begun since the agent started.
    pub faults_total: u64,
    /// Faults that cleared by themselves since the agent started.
    pub recoveries: u64,
}

/// One failing store (`storage.faults[]` in the status).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StorageFault {
    /// `ipam-datastore` (the embedded redb file) or `state-file`.
    pub store: String,
    /// The file.
    pub path: PathBuf,
    /// What fails and what to do.
    pub cause: String,
    /// The disk (or the quota) is full.
    pub full_disk: bool,
    /// When it began (Unix seconds).
    pub since: u64,
    /// Failed writes, reopens and probes since then.
    pub attempts: u64,
}

/// What the node's desired state holds (`state` in the status).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSummary {
    /// Registered endpoints.
    pub endpoints: usize,
    /// Workload links seen.
    pub workload_links: usize,
    /// True once every source has been read.
    pub in_sync: bool,
    /// Desired-state generation.
    pub generation: u64,
    /// NetworkPolicies in force.
    pub policies: usize,
    /// Policy documents that were refused (file:line: reason).
    pub policy_errors: Vec<String>,
    /// Source objects that apply with a caveat: a namespace with no Namespace object, a named
    /// port no Pod declares.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_warnings: Vec<String>,
}

/// What the dataplane loop has achieved (`applied` in the status).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Applied {
    /// The newest generation fully applied (0: none yet).
    pub generation: u64,
    /// True once an apply after the first in-sync succeeded, the last apply did not fail and
    /// every source is live.
    pub ready: bool,
    /// The last apply error, if the last apply failed.
    pub error: Option<String>,
    /// Consecutive failed applies.
    pub failures: u32,
    /// Applies done.
    pub applies: u64,
    /// A source that is down (the link watcher, while it is restarted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_error: Option<String>,
    /// The last route apply error while routes to other nodes' blocks are not all written (retried at
    /// every wake of the loop; it fails no write and no readiness: pods of this node are unaffected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes_error: Option<String>,
}

/// The dataplane drivers' counters (`dataplane` in the status). Fields are in name order, as the
/// agent has always written them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataplaneStatus {
    /// The attachment driver.
    pub attachments: AttachCounters,
    /// Each map driver, by map name: `[name, counters]`.
    pub maps: Vec<(String, DriverCounters)>,
    /// Drift repaired by each driver (`tc-attachments`, each map, `routes`, `vxlan`): kernel state
    /// changed from outside that a refresh or a kernel event found and rewritten.
    #[serde(default)]
    pub repairs: Vec<(String, u64)>,
}

/// The attachment driver's counters. Fields in name order (the agent's order on the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachCounters {
    /// New attachments.
    pub attaches: u64,
    /// Applies that failed.
    pub errors: u64,
    /// Pins removed and leftovers swept (orphans, stale pins, the other mechanism's attachments).
    pub unpins: u64,
    /// Program replacements through existing links.
    pub updates: u64,
}

/// One map driver's counters. Fields in name order (the agent's order on the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverCounters {
    /// Entries deleted (orphans and removals).
    pub deletes: u64,
    /// Applies that failed.
    pub errors: u64,
    /// Full resyncs done.
    pub resyncs: u64,
    /// Entries written (created or replaced).
    pub writes: u64,
}

/// Conntrack sweeps and map pressure (`conntrack` in the status).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConntrackStats {
    /// Sweeps done.
    pub sweeps: u64,
    /// Expired entries removed, IPv4.
    pub expired4: u64,
    /// Expired entries removed, IPv6.
    pub expired6: u64,
    /// Entries at the last sweep, IPv4.
    pub entries4: u64,
    /// Entries at the last sweep, IPv6.
    pub entries6: u64,
    /// Capacity of `ct4`.
    pub max4: u64,
    /// Capacity of `ct6`.
    pub max6: u64,
    /// Entries the programs created, IPv4 (from `ct_events`, since the pin was created).
    pub created4: u64,
    /// Entries the programs created, IPv6.
    pub created6: u64,
    /// LRU evictions, IPv4: entries created since the last sweep that neither remain nor were
    /// removed by the agent.
    pub evicted4: u64,
    /// LRU evictions, IPv6.
    pub evicted6: u64,
    /// Translated flows' entries (`svc_ct4`) at the last sweep.
    #[serde(default)]
    pub service_flows4: u64,
    /// Capacity of `svc_ct4`.
    #[serde(default)]
    pub service_flows_max4: u64,
    /// `svc_ct4` entries removed because their flow left conntrack (and `nat4`).
    #[serde(default)]
    pub service_flows_expired4: u64,
}

/// The masquerade's NAT map (`nat4_v1`) as of its last sweep (`nat` in the status).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NatStats {
    /// Sweeps done.
    pub sweeps: u64,
    /// Entries left after the last sweep (two per masqueraded flow).
    pub entries: u64,
    /// Capacity of `nat4_v1`.
    pub capacity: u64,
    /// Entries the sweeps removed (idle pairs).
    pub swept: u64,
    /// Entry pairs the programs created.
    pub created: u64,
    /// Port candidates the programs found taken (each tried the next one).
    pub collisions: u64,
    /// New flows refused for want of a free port (`nat-port-exhausted`).
    pub exhausted: u64,
    /// Entries the map refused (full or busy: `nat-insert-failed`).
    pub insert_failed: u64,
}

/// Which sockets socket LB places (`--socket-lb-scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SocketLbScope {
    /// Every socket of a process in the cgroup.
    All,
    /// Only sockets of the node's own network namespace (the agent's).
    Host,
}

impl std::fmt::Display for SocketLbScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::All => "all",
            Self::Host => "host",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_status_keeps_its_shape_and_reads_an_agent_that_says_less() {
        let wire = json!({
            "ready": true, "node": "n1", "bpf_root": "/sys/fs/bpf/weir", "endpoints": 1,
            "pools": [{"name": "p", "cidr": "10.244.0.0/16", "free": 9, "disabled": false}],
            "state": {"endpoints": 1, "workload_links": 1, "in_sync": true, "generation": 3,
                      "policies": 0, "policy_errors": []},
            "applied": {"generation": 3, "ready": true, "error": null, "failures": 0, "applies": 2},
            "dataplane": {"attachments": {"attaches": 2, "errors": 0, "unpins": 0, "updates": 0},
                          "maps": [["endpoints_v1", {"deletes": 0, "errors": 0, "resyncs": 1, "writes": 1}]],
                          "repairs": [["tc-attachments", 1]]},
            "conntrack": {"sweeps": 1, "expired4": 0, "expired6": 0, "entries4": 0, "entries6": 0,
                          "max4": 10, "max6": 10, "created4": 0, "created6": 0, "evicted4": 0,
                          "evicted6": 0, "service_flows4": 0, "service_flows_max4": 0,
                          "service_flows_expired4": 0},
            "nodes": [], "socket_lb": null, "socket_lb_scope": "host",
            "nat": {"sweeps": 0, "entries": 0, "capacity": 0, "swept": 0, "created": 0,
                    "collisions": 0, "exhausted": 0, "insert_failed": 0},
            "storage": {"degraded": true, "faults_total": 1, "recoveries": 0, "faults": [
                {"store": "ipam-datastore", "path": "/var/lib/weir/ipam.redb", "cause": "the disk is full",
                 "full_disk": true, "since": 1767000000, "attempts": 3}]}
        });
        let status: Status = serde_json::from_value(wire.clone()).expect("status");
        assert_eq!(status.detail.socket_lb_scope, Some(SocketLbScope::Host));
        assert_eq!(status.detail.dataplane.maps[0].1.writes, 1);
        assert!(status.detail.storage.degraded && status.detail.storage.faults[0].full_disk);
        assert_eq!(serde_json::to_value(&status).expect("json"), wire);
        // What weir-cni needs from an agent that sends nothing more.
        let bare: Status =
            serde_json::from_value(json!({"ready": false, "pools": []})).expect("bare");
        assert_eq!((bare.ready, bare.agent_pin_root()), (false, None));
        assert_eq!(bare.detail, StatusDetail::default());
    }

    #[test]
    fn the_dataplane_counters_are_written_in_name_order() {
        let text = serde_json::to_string(&DataplaneStatus {
            attachments: AttachCounters::default(),
            maps: vec![("m".into(), DriverCounters::default())],
            repairs: vec![("m".into(), 0)],
        })
        .expect("json");
        assert_eq!(
            text,
            r#"{"attachments":{"attaches":0,"errors":0,"unpins":0,"updates":0},"maps":[["m",{"deletes":0,"errors":0,"resyncs":0,"writes":0}]],"repairs":[["m",0]]}"#
        );
    }
}
