//! `POST /v1/log-level`: the agent's log filter, replaced at run time (`weir log-level`).

use serde::{Deserialize, Serialize};

/// The request and the answer: `{"level": "debug"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLevel {
    /// An `EnvFilter` directive: a level (`debug`) or `target=level,…`.
    pub level: String,
}
