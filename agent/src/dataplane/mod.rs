//! The dataplane, Felix-style: managers record desired state (cheap, no kernel I/O), drivers
//! reconcile one kind of kernel state each, and a throttled apply loop runs the drivers.
//!
//! - `kernel`: the one seam to the kernel's BPF maps (real: pinned aya maps; `fake` for unit tests).
//! - `map_driver`: a generic driver that reads a map back, writes only what is out of sync and
//!   sweeps orphans; it counts its writes and deletes.

pub mod attachments;
pub mod batch;
pub mod conntrack;
pub mod counters;
pub mod ct_layout;
pub mod ct_maps;
pub mod endpoints;
pub mod inspect;
pub mod kernel;
pub mod map_driver;
pub mod masquerade;
pub mod nat_stats;
pub mod netlink_routes;
pub mod netlink_vxlan;
pub mod node_routes;
pub mod pins;
pub mod plane;
pub mod prefilter;
pub mod retry;
pub mod routes;
pub mod service_flows;
pub mod services;
pub mod tc_links;
pub mod vxlan;

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "the `testing` feature uses part of the fake kernel"
    )
)]
pub(crate) mod fake;
#[cfg(test)]
pub(crate) mod fake_ct;
#[cfg(test)]
pub(crate) mod fake_masq;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "the `testing` feature uses part of the fake kernel"
    )
)]
pub(crate) mod fake_vxlan;
