//! The agent API on its unix socket (JSON over HTTP/1.1, `/v1/…`; contract in `docs/agent-api.md`).

pub mod client;
pub mod error;
pub mod log_level;
pub mod observe;
pub mod server;
pub mod services;
pub mod types;
