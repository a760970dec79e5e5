//! The sources: everything that tells the loop what the node should be. Each runs as its own task
//! and sends typed deltas (`applier::Command`) to the one dataplane loop; none touches the kernel.
//!
//! - `registry`: the endpoints the CNI registered, persisted in `endpoints.json` and its
//!   `journal`, restored at open;
//! - `link_source`: the link watcher (the kernel seam's `LinkIo`; rtnetlink in
//!   `kernel::real::netlink_links`) as a source, the supervisor over that seam that restarts it;
//! - `policy_dir`: the hot-reloaded `--policy-dir` (NetworkPolicy, Namespace, Pod, Node, Service and EndpointSlice YAML);
//! - `kube`: `--source kubernetes`, watchers on the API server (Pods, Namespaces, NetworkPolicies,
//!   Nodes) sending the whole set, gated on their initial lists, with staleness reported;
//! - `prefilter_file`: `--prefilter-deny-file`, polled, each new read sent (the prefilter's deny set);
//! - `pools`: the IPAM pools, polled, their IPv4 CIDRs sent (the masquerade's `masq_cidr4_v1`).

pub mod journal;
pub mod kube;
pub mod link_source;
pub mod nodes;
pub mod policy_dir;
pub mod pools;
pub mod prefilter_file;
pub mod registry;
