//! The agent's pinned `from_endpoint` (tc ingress) and `to_endpoint` (tc egress) on a pod's host
//! veth, through the helper the agent uses too (`agent/attach`), by the mechanism the agent's
//! conflist names (`tcAttach`: clsact + `cls_bpf` filters by default, or pinned tcx links).

use ::attach::Mechanism;
pub use ::attach::endpoint::{
    EndpointError as AttachError, detach_endpoint_programs, missing_programs,
};

use crate::error::{CniCode, Code};

impl CniCode for AttachError {
    fn code(&self) -> Code {
        Code::Attach
    }
}

/// Attaches both endpoint programs to `ifname` (a fresh, still-down host veth).
pub fn attach_endpoint_programs(
    bpf_root: &std::path::Path,
    ifname: &str,
    mechanism: Mechanism,
) -> Result<(), AttachError> {
    ::attach::endpoint::attach_endpoint_programs(bpf_root, ifname, mechanism)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_says_what_to_fix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err =
            attach_endpoint_programs(dir.path(), "lo", Mechanism::Filter).expect_err("no pins");
        assert_eq!(err.code(), Code::Attach);
        assert!(err.to_string().contains("bpfRoot"), "{err}");
    }
}
