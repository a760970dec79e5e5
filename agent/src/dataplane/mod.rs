//! The dataplane, Felix-style: managers record desired state (cheap, no kernel I/O), drivers
//! reconcile one kind of kernel state each, and a throttled apply loop runs the drivers.
//!
//! - `crate::kernel`: the one seam to the kernel (real: `kernel::real`; `kernel::fake` for unit tests).
//! - `map_driver`: a generic driver that reads a map back, writes only what is out of sync and
//!   sweeps orphans; it counts its writes and deletes.

pub mod attachments;
pub mod conntrack;
pub mod counters;
pub mod endpoints;
pub mod host;
pub mod host_routing;
pub mod map_driver;
pub mod masquerade;
pub mod nat_stats;
pub mod node_routes;
pub mod pins;
pub mod plane;
pub mod prefilter;
pub mod retry;
pub mod routes;
pub mod service_flows;
pub mod services;
pub mod socket_lb;
pub mod vxlan;
