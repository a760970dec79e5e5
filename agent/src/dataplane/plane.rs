//! The drivers together, applied in security order: attachments to new links first (they only
//! close), then identities, ipcache and policy, and the endpoint entries (whose isolation flags
//! and addresses open an endpoint), so nothing is opened before the policy that guards it is in
//! place; program replacements and sweeps of attachments come last, once the maps the new
//! programs read are filled. A failed driver stops the apply there; its state stays dirty for the retry.

use maps_schema::{EndpointInfo, IdentityInfo, PolicyKey, PolicyValue};
use serde::Serialize;

use super::{
    attachments::{AttachDriver, AttachStats},
    endpoints::EndpointsManager,
    kernel::KernelError,
    kernel::Prefix,
    map_driver::{DriverStats, MapDriver},
};

/// Every driver and manager of the node.
pub struct Dataplane {
    /// tc attachments on workload links.
    pub attachments: AttachDriver,
    /// `endpoints_v1`.
    pub endpoints: MapDriver<u32, EndpointInfo>,
    /// Desired endpoint entries.
    pub endpoints_manager: EndpointsManager,
    /// `ident4_v1`: pod and node addresses → identity.
    pub ident4: MapDriver<[u8; 4], IdentityInfo>,
    /// `ident6_v1`.
    pub ident6: MapDriver<[u8; 16], IdentityInfo>,
    /// `ipcache4_v1`: policy CIDRs → CIDR identity.
    pub ipcache4: MapDriver<Prefix<[u8; 4]>, IdentityInfo>,
    /// `ipcache6_v1`.
    pub ipcache6: MapDriver<Prefix<[u8; 16]>, IdentityInfo>,
    /// `policy_v1`.
    pub policy: MapDriver<PolicyKey, PolicyValue>,
}

/// Counters of every driver, for metrics and `weir status`.
#[derive(Clone, Debug, Serialize)]
pub struct DataplaneStats {
    /// Attachment driver.
    pub attachments: AttachStats,
    /// Map drivers by map name.
    pub maps: Vec<(String, DriverStats)>,
}

impl Dataplane {
    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.attachments.is_dirty()
            || self.endpoints.is_dirty()
            || self.ident4.is_dirty()
            || self.ident6.is_dirty()
            || self.ipcache4.is_dirty()
            || self.ipcache6.is_dirty()
            || self.policy.is_dirty()
    }

    /// Before the first in-sync: only attach the deny-by-default programs to new workload links.
    pub fn apply_before_in_sync(&mut self) -> Result<(), KernelError> {
        self.attachments.apply(true)
    }

    /// A full apply, in security order: new links closed first; programs replaced on existing
    /// links only after the maps they read are filled (a new object may bring new map versions).
    pub fn apply(&mut self) -> Result<(), KernelError> {
        self.attachments.apply(true)?;
        self.ident4.apply()?;
        self.ident6.apply()?;
        self.ipcache4.apply()?;
        self.ipcache6.apply()?;
        self.policy.apply()?;
        self.endpoints.apply()?;
        self.attachments.apply(false)?;
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> DataplaneStats {
        DataplaneStats {
            attachments: self.attachments.stats(),
            maps: vec![
                (self.endpoints.name().to_owned(), self.endpoints.stats()),
                (self.ident4.name().to_owned(), self.ident4.stats()),
                (self.ident6.name().to_owned(), self.ident6.stats()),
                (self.ipcache4.name().to_owned(), self.ipcache4.stats()),
                (self.ipcache6.name().to_owned(), self.ipcache6.stats()),
                (self.policy.name().to_owned(), self.policy.stats()),
            ],
        }
    }
}
