//! Host-affine block IPAM (see `../shared/DESIGN.md` → IPAM).
//!
//! Pools are carved into blocks; a host claims blocks (a two-phase affinity claim) and hands out addresses from
//! them. Every write is compare-and-swap on the datastore's revision and is retried with fresh reads; in-memory
//! copies are only changed on the way to a write, never before it succeeds. While a host owns a block with free
//! addresses, one allocation is one atomic write over the block and the handle.
//!
//! Datastores: [`store::memory`] (tests), [`store::embedded`] (redb, the default), [`store::etcd`],
//! [`store::kubernetes`] (custom resources in group `ipam.weir.dev`, two compare-and-swap writes on the hot path).
//!
//! **Sharing an embedded file.** An agent opens its file exclusively (one fsync per commit) and `weir ipam` runs
//! its [`ops`] inside that agent; without an agent, `weir ipam` processes share a file in redb's multi-process
//! mode, where each write transaction holds the file's writer lock and re-reads inside it, so compare-and-swap
//! holds across processes. Serialised operations can share one commit through [`batch`].

pub mod allocator;
pub mod batch;
pub mod cidr;
pub mod error;
pub mod identity;
pub mod model;
pub mod ops;
pub mod store;
pub mod testing;

pub use allocator::{AssignArgs, AssignResult, Ipam};
pub use error::IpamError;
