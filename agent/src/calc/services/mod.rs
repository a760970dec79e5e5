//! Kubernetes Services (ClusterIP) and their EndpointSlices: `convert` turns each object into the
//! validated `model` (for the standalone directory and the Kubernetes watchers alike);
//! `desired` computes from the model the service maps' contents (frontends, backend slots,
//! backends, reverse NAT) with stable ids, no kernel I/O; `view` lists every frontend with its
//! endpoints and their state for operators (`GET /v1/services`, `weir service list`).

pub mod convert;
pub mod desired;
pub mod incremental;
pub mod model;
pub mod view;

#[cfg(test)]
mod convert_tests;
#[cfg(test)]
mod desired_tests;
#[cfg(test)]
mod incremental_tests;
#[cfg(test)]
mod view_tests;
