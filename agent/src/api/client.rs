//! The client of the agent API (the operator CLI's, and weir-cni's): the one in `weir-api`.

pub use weir_api::client::{Client, ClientError, Method};
