//! How weir's programs get onto interfaces — one helper for both binaries: the agent's
//! attachment driver and prefilter (`weir`) and the CNI plugin's ADD/CHECK/DEL (`weir-cni`).
//!
//! Two mechanisms for the endpoint programs (`from_endpoint` at tc ingress, `to_endpoint` at tc
//! egress of a workload veth), chosen by [`Mechanism`] (`--tc-attach` on the agent, `tcAttach`
//! in the conflist the agent writes):
//! - [`Mechanism::Filter`] (default): a clsact qdisc and a `cls_bpf` direct-action filter at
//!   weir's fixed priority and handle, named after the program ([`filter`]). Replacement is one
//!   `RTM_NEWTFILTER` on the same slot (atomic); filters need no pins and go with the device.
//! - [`Mechanism::Tcx`]: a tcx link pinned at `<root>/links/<ifname>:<program>` ([`tcx`]);
//!   replacement is `bpf_link_update` through the pin. Each `BPF_LINK_CREATE` waits for an RCU
//!   grace period under RTNL (about 12 ms here), which is why it is not the default.
//!
//! [`endpoint`] reads back what is on a hook whichever mechanism put it there, so each side
//! recognises weir's attachments with no memory of a previous run.
//!
//! What survives tampering (measured on 6.18, docs/datapath.md "Tampering and the gap"): a filter
//! is removed by `tc filter del` and by `tc qdisc del … clsact`, and the hook then passes every
//! packet (fails open) until the agent re-attaches it from the netlink event; a tcx link survives
//! both (tc does not see it) but not `bpftool link detach`, which sends no event (the agent's
//! periodic refresh re-attaches it). Neither mechanism can make the gap fail closed by itself.

pub mod endpoint;
pub mod filter;
pub mod tcx;

pub use tcx::{AttachError, AttachMode, attach_tc, attach_xdp, pinned_link_program};

/// How the endpoint programs are attached to workload veths: a wire type of the agent API
/// (the agent tells weir-cni in its allocate answer), so it lives in the API contract.
pub use weir_api::{Mechanism, UnknownMechanism};
