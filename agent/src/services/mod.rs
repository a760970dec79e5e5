//! Kubernetes Services (ClusterIP) and their EndpointSlices: `convert` turns each object into the
//! validated `model` (for the standalone directory and, later, the Kubernetes watchers alike);
//! `desired` computes from the model the service maps' contents (frontends, backend slots,
//! backends, reverse NAT) with stable ids, no kernel I/O.

pub mod convert;
pub mod desired;
pub mod model;
pub mod view;

#[cfg(test)]
mod convert_tests;
#[cfg(test)]
mod desired_tests;
