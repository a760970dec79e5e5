//! Handles: the secondary index from an owner to the blocks holding its addresses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How many addresses a handle holds in each block (keyed by the block's CIDR name).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Handle {
    /// The handle id (`<network>.<containerID>` for CNI allocations).
    pub id: String,
    /// Block CIDR name → addresses held there.
    pub blocks: BTreeMap<String, u32>,
    /// Soft-delete marker.
    #[serde(default)]
    pub deleted: bool,
}

impl Handle {
    /// Adds `n` addresses in `block`.
    pub fn add(&mut self, block: &str, n: u32) {
        if n > 0 {
            *self.blocks.entry(block.to_owned()).or_default() += n;
        }
    }

    /// Removes `n` addresses in `block`, dropping the entry at zero.
    pub fn remove(&mut self, block: &str, n: u32) {
        if let Some(c) = self.blocks.get_mut(block) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                self.blocks.remove(block);
            }
        }
    }

    /// Total addresses held.
    pub fn total(&self) -> u32 {
        self.blocks.values().sum()
    }
}

/// A handle as callers may pass it: cut at the first `\r` (fallout of host-local migrations).
pub fn sanitize(handle: &str) -> &str {
    handle.split('\r').next().unwrap_or(handle)
}
