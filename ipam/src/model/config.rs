//! The IPAM configuration singleton.

use serde::{Deserialize, Serialize};

/// The longest cooldown an operator may set (as Calico caps `IPCooldownSeconds`).
pub const MAX_COOLDOWN_SECONDS: u64 = 1200;

/// Block limit when neither the config nor the request sets one.
pub const DEFAULT_MAX_BLOCKS_PER_HOST: u32 = 20;

/// Cluster-wide IPAM settings. Defaults apply when none is stored; reading never writes them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpamConfig {
    /// Hosts only allocate from blocks affine to them (no borrowing).
    #[serde(default)]
    pub strict_affinity: bool,
    /// Hosts claim new blocks when their own blocks are full.
    #[serde(default = "yes")]
    pub auto_allocate_blocks: bool,
    /// How many blocks one host may claim (0 = the default of 20).
    #[serde(default)]
    pub max_blocks_per_host: u32,
    /// How long a released address waits before it can be handed out again.
    #[serde(default)]
    pub ip_cooldown_seconds: u64,
}

fn yes() -> bool {
    true
}

impl Default for IpamConfig {
    fn default() -> Self {
        Self {
            strict_affinity: false,
            auto_allocate_blocks: true,
            max_blocks_per_host: 0,
            ip_cooldown_seconds: 0,
        }
    }
}

/// A config that makes no sense.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Neither borrowing nor claiming: no host could ever get an address.
    #[error("auto-allocate blocks is off and strict affinity is off: turn one of them on")]
    NoAllocation,
    /// A block limit without strict affinity is meaningless: hosts would borrow past it.
    #[error(
        "max blocks per host {max} needs strict affinity: set --strict-affinity true, or --max-blocks-per-host 0"
    )]
    LimitWithoutStrict {
        /// The limit asked for.
        max: u32,
    },
    /// Cooldown above the cap.
    #[error(
        "cooldown {seconds}s is above the maximum of {MAX_COOLDOWN_SECONDS}s: choose a smaller --cooldown"
    )]
    CooldownTooLong {
        /// The cooldown asked for.
        seconds: u64,
    },
}

impl IpamConfig {
    /// Checks that the settings make sense together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.strict_affinity && !self.auto_allocate_blocks {
            return Err(ConfigError::NoAllocation);
        }
        if self.max_blocks_per_host > 0 && !self.strict_affinity {
            return Err(ConfigError::LimitWithoutStrict {
                max: self.max_blocks_per_host,
            });
        }
        if self.ip_cooldown_seconds > MAX_COOLDOWN_SECONDS {
            return Err(ConfigError::CooldownTooLong {
                seconds: self.ip_cooldown_seconds,
            });
        }
        Ok(())
    }

    /// The effective block limit for a request: the smaller of the two when both are set, 20 when neither is.
    pub fn effective_max_blocks(&self, per_request: u32) -> u32 {
        match (self.max_blocks_per_host, per_request) {
            (0, 0) => DEFAULT_MAX_BLOCKS_PER_HOST,
            (0, r) => r,
            (g, 0) => g,
            (g, r) => g.min(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_configs_are_refused() {
        let c = IpamConfig {
            auto_allocate_blocks: false,
            ..IpamConfig::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::NoAllocation));
        let c = IpamConfig {
            max_blocks_per_host: 2,
            ..IpamConfig::default()
        };
        assert_eq!(
            c.validate(),
            Err(ConfigError::LimitWithoutStrict { max: 2 })
        );
        let c = IpamConfig {
            strict_affinity: true,
            max_blocks_per_host: 2,
            ..IpamConfig::default()
        };
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn stricter_block_limit_wins() {
        let c = IpamConfig {
            strict_affinity: true,
            max_blocks_per_host: 2,
            ..IpamConfig::default()
        };
        assert_eq!(c.effective_max_blocks(3), 2);
        let c = IpamConfig {
            max_blocks_per_host: 3,
            ..c
        };
        assert_eq!(c.effective_max_blocks(2), 2);
        assert_eq!(c.effective_max_blocks(0), 3);
        assert_eq!(IpamConfig::default().effective_max_blocks(0), 20);
    }
}
