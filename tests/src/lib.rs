//! Test harness shared by weir's integration tests (see `tests/README.md` for the tiers).
//!
//! - `privileged`: root checks that fail (never skip) under `CI=true`.
//! - `names`: generated `wt…` names for namespaces, links and pin roots.
//! - `netns`: RAII network namespaces and veth pairs, closures run inside a namespace.
//! - `agent_proc`: a `weir agent` process with its own pin root and directories.
//! - `pod`: workload veth names and pod plumbing for the agent tests.
//! - `bin`: paths of the built `weir` and `weir-cni` binaries.
//! - `bpf`: per-test pin roots, loading weir's object, `BPF_PROG_TEST_RUN`, `bpftool` from outside.
//! - `hooks`: the programs on workload veths' tc hooks, read from outside (filters or tcx links).
//! - `cgroup`: a cgroup v2 directory of the test's own (socket LB is attached to it).
//! - `ct`: two hand-built pods, live TCP flows, conntrack read with bpftool (migration tests).
//! - `cri`: a containerd of the test's own driven through the CRI gRPC API, as kubelet drives it.
//! - `netpol`: a model of upstream NetworkPolicy semantics that computes expected connectivity.
//! - `netpol_lab`, `netpol_probe`, `netpol_policies`: the upstream conformance topology on a real
//!   agent (x, y, z × a, b, c; outside hosts), its TCP/UDP/SCTP servers and probes, policy builders.
//! - `netpol_cases`: the conformance cases, one copy for both conformance tests.
//! - `echo`: a one-byte TCP echo server, its clients and the peers it accepted (masquerade tests).
//! - `demo`: `cargo xtask demo` (agent, three pods, a policy, counters, a trace), also a test.
//! - `observe`: dual-stack pods on a real agent and the operator's view (`weir …`, `/metrics`).
//! - `multinode`: the 3-node cluster harness (etcd, agents, pods through weir-cni).
//! - `node_lab`: node namespaces on an underlay bridge, a pod behind each (route driver tests, bench).
//! - `podnet`: TCP listeners and probes inside a pod's network namespace (by its process).
//! - `manifests`: `deploy/weir.yaml` parsed with the `k8s-openapi` types and checked against the code.
//! - `kube_api`: a minimal Kubernetes API server (lists, chunked watches, bookmarks, 410, faults).
//! - `netfilter`: read-only snapshots of a namespace's iptables and nftables rules, compared.
//! - `svc_maps`: ClusterIP services written into a loaded object's service maps (tests, bench).
//! - `bench_net`: pieces the traffic benchmarks share (pod plumbing, CPU pinning, rule loading).
//! - `bench_node`: the agent's dataplane loop in process over its real maps, links in place (benchmarks).
//! - `prefilter`: the XDP prefilter tests' wire (sources, target) and datagrams counted by source.
//! - `dpmodel`, `differential`: a model of the endpoint programs and the differential test's
//!   generators, kernel side and shrinking.
//! - `wait`: bounded waits on a condition (poll until it holds, fail naming it after the bound).
//! - `image`: the container image (`cargo xtask image`) and the agent run from it under containerd.

pub mod agent_pod;
pub mod agent_proc;
pub mod bench_net;
pub mod bench_node;
pub mod bin;
pub mod bpf;
pub mod cgroup;
pub mod cni;
pub mod cri;
pub mod csum;
pub mod ct;
pub mod datapath;
pub mod demo;
pub mod differential;
pub mod dpmodel;
pub mod echo;
pub mod etcd_netns;
pub mod hooks;
pub mod image;
pub mod kube_api;
pub mod manifests;
pub mod multinode;
pub mod names;
pub mod netfilter;
pub mod netns;
pub mod netpol;
pub mod netpol_cases;
pub mod netpol_lab;
pub mod netpol_policies;
pub mod netpol_probe;
pub mod node_lab;
pub mod observe;
pub mod packet;
pub mod pod;
pub mod pod_doc;
pub mod podnet;
pub mod prefilter;
pub mod privileged;
pub mod svc_maps;
pub mod wait;
