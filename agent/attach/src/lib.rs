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

pub mod endpoint;
pub mod filter;
pub mod tcx;

pub use tcx::{AttachError, AttachMode, attach_tc, attach_xdp, pinned_link_program};

/// How the endpoint programs are attached to workload veths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// clsact + `cls_bpf` direct-action filters (no RCU grace period per attachment).
    #[default]
    Filter,
    /// Pinned tcx links.
    Tcx,
}

impl Mechanism {
    /// The name used by the flag and the conflist.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Tcx => "tcx",
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Mechanism {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "filter" => Ok(Self::Filter),
            "tcx" => Ok(Self::Tcx),
            other => Err(format!(
                "unknown tc attach mechanism {other:?}: use \"filter\" (clsact + cls_bpf) or \"tcx\""
            )),
        }
    }
}
