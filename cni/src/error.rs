//! CNI error objects: the spec's codes, plugin codes from 100, and the JSON the runtime reads.
//!
//! Every module keeps its own `thiserror` enum and says which [`Code`] each variant is; the
//! command layer turns the first error into a [`CniError`] whose `msg` is the error's message
//! (what to fix) and whose `details` is the chain of causes.

use serde::Serialize;

/// The error codes weir-cni returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// 1: the requested `cniVersion` is not one weir-cni speaks.
    IncompatibleVersion,
    /// 2: a field weir-cni does not support (the message names the key and value).
    UnsupportedField,
    /// 4: a required environment variable is missing or invalid (the message names it).
    InvalidEnvironment,
    /// 5: reading stdin or another I/O failure.
    Io,
    /// 6: the configuration is not valid JSON.
    Decode,
    /// 7: the network configuration is invalid.
    InvalidConfig,
    /// 11: try again later (the agent is unreachable or not ready).
    TryAgainLater,
    /// 50: the plugin cannot serve ADD (STATUS).
    NotAvailable,
    /// 100: a netlink operation (veth, address, route, neighbour) failed.
    Netlink,
    /// 101: the agent's pinned programs could not be attached.
    Attach,
    /// 102: the agent could not allocate the addresses (exhausted, in use, not in a pool).
    Ipam,
    /// 103: the agent refused a request or answered with something weir-cni cannot read.
    Agent,
    /// 104: the interface already exists in the pod's network namespace.
    InterfaceExists,
    /// 105: CHECK found the pod different from its ADD result.
    Drift,
    /// 106: the network namespace cannot be used.
    Netns,
}

impl Code {
    /// The number the runtime sees.
    #[must_use]
    pub const fn number(self) -> u32 {
        match self {
            Self::IncompatibleVersion => 1,
            Self::UnsupportedField => 2,
            Self::InvalidEnvironment => 4,
            Self::Io => 5,
            Self::Decode => 6,
            Self::InvalidConfig => 7,
            Self::TryAgainLater => 11,
            Self::NotAvailable => 50,
            Self::Netlink => 100,
            Self::Attach => 101,
            Self::Ipam => 102,
            Self::Agent => 103,
            Self::InterfaceExists => 104,
            Self::Drift => 105,
            Self::Netns => 106,
        }
    }
}

/// Implemented by every module's error enum.
pub trait CniCode: std::error::Error {
    /// The CNI code for this error.
    fn code(&self) -> Code;
}

/// A CNI error object, as printed on stdout.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CniError {
    /// The version the request asked for (or the newest one weir-cni speaks).
    pub cni_version: String,
    /// The code.
    pub code: u32,
    /// What went wrong and what to fix.
    pub msg: String,
    /// The causes, outermost first.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    /// Builds the object from a module error: its message, and its causes as details.
    pub fn from_error<E: CniCode>(cni_version: &str, error: &E) -> Self {
        Self {
            cni_version: cni_version.to_owned(),
            code: error.code().number(),
            msg: error.to_string(),
            details: causes(error),
        }
    }
}

/// The chain of `source()`s of `error`, joined with ": ".
#[must_use]
pub fn causes(error: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut next = error.source();
    while let Some(e) = next {
        parts.push(e.to_string());
        next = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer; fix the thing")]
    struct Outer(#[source] std::io::Error);

    impl CniCode for Outer {
        fn code(&self) -> Code {
            Code::Io
        }
    }

    #[test]
    fn error_objects_carry_code_message_and_causes() {
        let e = Outer(std::io::Error::other("inner"));
        let obj = CniError::from_error("1.1.0", &e);
        let json = serde_json::to_value(&obj).expect("serialises");
        assert_eq!(json["cniVersion"], "1.1.0");
        assert_eq!(json["code"], 5);
        assert_eq!(json["msg"], "outer; fix the thing");
        assert_eq!(json["details"], "inner");
    }

    #[test]
    fn plugin_codes_start_at_100() {
        for c in [
            Code::Netlink,
            Code::Attach,
            Code::Ipam,
            Code::Agent,
            Code::InterfaceExists,
            Code::Drift,
            Code::Netns,
        ] {
            assert!(c.number() >= 100, "{c:?}");
        }
    }
}
