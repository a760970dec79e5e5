//! The agent API as weir-cni uses it: the contract crate `weir-api` (types and the one client,
//! `docs/agent-api.md`), and how its errors map to CNI error codes. A socket that cannot be
//! reached, a connection that breaks and a timeout all mean "try again later" (CNI code 11).

pub use weir_api::{
    AllocateRequest, Client as AgentClient, ClientError as AgentError, EndpointRequest, PoolStatus,
    code,
};

use crate::error::{CniCode, Code};

impl CniCode for AgentError {
    fn code(&self) -> Code {
        match self {
            e if e.is_unavailable() => Code::TryAgainLater,
            Self::Api { status, code, .. } => match code.as_str() {
                code::EXHAUSTED | code::ADDRESS_IN_USE | code::ADDRESS_NOT_IN_POOL => Code::Ipam,
                code::UNKNOWN_POOL => Code::InvalidConfig,
                _ if *status == 503 => Code::TryAgainLater,
                _ => Code::Agent,
            },
            _ => Code::Agent,
        }
    }
}

#[cfg(test)]
mod tests;
