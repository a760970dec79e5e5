//! The IPAM data model: what the datastore holds.

pub mod affinity;
pub mod block;
pub mod config;
pub mod endpoint;
pub mod handle;
pub mod identity;
pub mod node;
pub mod pool;
pub mod reservation;
pub mod selector;

pub use affinity::{AffinityState, BlockAffinity};
pub use block::{AllocationAttr, Block, BlockError, ReleaseCheck};
pub use config::IpamConfig;
pub use endpoint::EndpointRecord;
pub use handle::Handle;
pub use identity::{Identity, IdentityKey};
pub use node::NodeRecord;
pub use pool::{IpPool, IpUse};
pub use reservation::Reservation;
pub use selector::Selector;
