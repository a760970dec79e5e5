//! The drivers together, applied in security order: attachments first (they only close), then
//! the endpoint entries (which open an endpoint) last, so nothing is opened before what guards it
//! is in place. A failed driver stops the apply there; its state stays dirty for the retry.

use maps_schema::EndpointInfo;
use serde::Serialize;

use super::{
    attachments::{AttachDriver, AttachStats},
    endpoints::EndpointsManager,
    kernel::KernelError,
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
        self.attachments.is_dirty() || self.endpoints.is_dirty()
    }

    /// Before the first in-sync: only attach the deny-by-default programs to new workload links.
    pub fn apply_before_in_sync(&mut self) -> Result<(), KernelError> {
        self.attachments.apply(true)
    }

    /// A full apply, in security order.
    pub fn apply(&mut self) -> Result<(), KernelError> {
        self.attachments.apply(false)?;
        self.endpoints.apply()?;
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> DataplaneStats {
        DataplaneStats {
            attachments: self.attachments.stats(),
            maps: vec![(self.endpoints.name().to_owned(), self.endpoints.stats())],
        }
    }
}
