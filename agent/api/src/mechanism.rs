//! How the endpoint programs are attached to workload veths: the agent's `--tc-attach`, told to
//! weir-cni in the allocate answer and written as `tcAttach` into the conflist.

use serde::{Deserialize, Serialize};

/// How the endpoint programs are attached to workload veths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// clsact + `cls_bpf` direct-action filters (no RCU grace period per attachment).
    #[default]
    Filter,
    /// Pinned tcx links.
    Tcx,
}

/// A name that is not a [`Mechanism`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tc attach mechanism {name:?}: use \"filter\" (clsact + cls_bpf) or \"tcx\"")]
pub struct UnknownMechanism {
    /// The name given.
    pub name: String,
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
    type Err = UnknownMechanism;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "filter" => Ok(Self::Filter),
            "tcx" => Ok(Self::Tcx),
            other => Err(UnknownMechanism {
                name: other.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_an_unknown_one_names_the_choices() {
        for m in [Mechanism::Filter, Mechanism::Tcx] {
            assert_eq!(m.as_str().parse::<Mechanism>(), Ok(m));
            assert_eq!(serde_json::to_string(&m).expect("json"), format!("\"{m}\""));
        }
        let err = "clsact".parse::<Mechanism>().expect_err("unknown");
        assert!(err.to_string().contains("\"filter\""), "{err}");
    }
}
