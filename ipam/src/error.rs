//! Errors of IPAM operations. Messages are lowercase and tell the operator what to do.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::{
    cidr::Family,
    model::{BlockError, config::ConfigError},
    store::StoreError,
};

/// An IPAM operation failed. Nothing was changed unless the variant says so.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// The datastore failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A pool definition is invalid.
    #[error("pool {name:?}: {reason}")]
    InvalidPool {
        /// The pool.
        name: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The new pool overlaps an existing one.
    #[error(
        "pool {name:?} ({cidr}) overlaps pool {other:?} ({other_cidr}): choose a CIDR outside every existing pool"
    )]
    PoolOverlap {
        /// The new pool.
        name: String,
        /// Its CIDR.
        cidr: IpNetwork,
        /// The existing pool.
        other: String,
        /// Its CIDR.
        other_cidr: IpNetwork,
    },
    /// A pool of this name exists.
    #[error("pool {name:?} already exists: choose another name, or delete it first")]
    PoolExists {
        /// The pool.
        name: String,
    },
    /// No pool has this name.
    #[error("pool {name:?} does not exist: `weir ipam pool list` shows the pools ({known})")]
    UnknownPool {
        /// The name asked for.
        name: String,
        /// The pools that exist.
        known: String,
    },
    /// A requested pool is disabled.
    #[error("pool {name:?} is disabled: pick an enabled pool")]
    PoolDisabled {
        /// The pool.
        name: String,
    },
    /// A pool still holds addresses.
    #[error(
        "pool {name:?} still has {in_use} allocated addresses: release them first, or pass --force"
    )]
    PoolInUse {
        /// The pool.
        name: String,
        /// Addresses in use.
        in_use: u64,
    },
    /// No pool can serve the request.
    #[error(
        "no {family} pool can serve this request ({why}): add a pool with `weir ipam pool add`, or relax the request"
    )]
    NoQualifiedPool {
        /// The family.
        family: Family,
        /// Why every pool was excluded.
        why: String,
    },
    /// The address is outside every pool.
    #[error("address {ip} is not in any pool: `weir ipam pool list` shows the pools")]
    NotInAnyPool {
        /// The address.
        ip: IpAddr,
    },
    /// A block refused the operation.
    #[error("block {block} refused the operation")]
    Block {
        /// The block.
        block: IpNetwork,
        /// What it refused.
        #[source]
        source: BlockError,
    },
    /// The config is invalid.
    #[error("invalid ipam config")]
    Config(#[from] ConfigError),
    /// A request argument is invalid.
    #[error("{what}: {fix}")]
    InvalidArgument {
        /// What is wrong.
        what: String,
        /// How to fix it.
        fix: String,
    },
    /// The handle does not exist.
    #[error("handle {handle:?} holds no addresses")]
    HandleNotFound {
        /// The handle.
        handle: String,
    },
    /// The handle would exceed its cap.
    #[error(
        "handle {handle:?} already has {held} {family} address(es) allocated, the most it may hold is {max}: release some first"
    )]
    HandleCap {
        /// The handle.
        handle: String,
        /// The family.
        family: Family,
        /// Its cap.
        max: u32,
        /// What it holds.
        held: u32,
    },
    /// A block affinity could not be released because the block is in use.
    #[error("block {cidr} still has allocated addresses: release them first")]
    BlockNotEmpty {
        /// The block.
        cidr: IpNetwork,
    },
    /// A node whose heartbeat is live cannot have its blocks released.
    #[error(
        "node {node:?} is live (its heartbeat expires in {seconds} s): stop its agent and wait, or pass --force to \
         release its blocks anyway"
    )]
    NodeLive {
        /// The node.
        node: String,
        /// Seconds until its heartbeat expires.
        seconds: u64,
    },
    /// Strict affinity forbids assigning from another host's block.
    #[error(
        "block {block} is not affine to {host} and strict affinity is on: assign the address on the block's own host"
    )]
    NotAffine {
        /// The block.
        block: IpNetwork,
        /// The host that asked.
        host: String,
    },
    /// A CIDR smaller than one block was asked for.
    #[error(
        "the requested CIDR ({cidr}) is smaller than the pool's block size /{block_size}: claim whole blocks"
    )]
    CidrTooSmall {
        /// The CIDR.
        cidr: IpNetwork,
        /// The pool's block size.
        block_size: u8,
    },
    /// Too many conflicting writers.
    #[error(
        "gave up after {retries} conflicting writes to {what} (excessive concurrent ipam requests): retry later"
    )]
    TooManyRetries {
        /// What was being written.
        what: String,
        /// How many times it was tried.
        retries: usize,
    },
}

impl IpamError {
    /// A block error with its block.
    pub fn block(block: IpNetwork, source: BlockError) -> Self {
        Self::Block { block, source }
    }
}
