//! The node's control loop: the node's desired state (`node`: sources in, the calculation, the managers and
//! drivers it feeds), per-object deltas (`node_deltas`), the one dataplane loop that owns the node (`applier`),
//! and what it publishes for every reader (`snapshot`).

pub mod applier;
pub mod node;
pub mod snapshot;
