//! The one source of weir's BPF map names, layout versions, key/value types and constants.
//!
//! Shared by the eBPF programs (`no_std`) and user space (feature `user`, which adds `aya::Pod`).
//! Every key and value is `#[repr(C)]`, has explicit padding and a compile-time size assertion;
//! no `bool`, `Option` or Rust enum is ever stored in a map.
#![no_std]

#[cfg(feature = "user")]
extern crate std;

pub mod checksum;
pub mod conntrack;
pub mod counters;
pub mod endpoint;
pub mod events;
pub mod identity;
pub mod maps;
pub mod nat;
pub mod pins;
pub mod policy;
pub mod prefilter;
pub mod programs;
pub mod reason;
pub mod rules;
pub mod service;
pub mod service_ct;
pub mod socket_lb;
pub mod trace;

pub use conntrack::{ClockCache, Ct4Key, Ct6Key, CtEntry, CtEntryV1, CtEntryV2};
pub use counters::{CounterKey, CounterValue};
pub use endpoint::EndpointInfo;
pub use events::DropEvent;
pub use identity::IdentityInfo;
pub use nat::{MasqCidr, MasqInterface, Nat4Entry, Nat4Key};
pub use policy::{PolicyKey, PolicyValue, PortRange};
pub use prefilter::PrefilterEntry;
pub use service::{Backend4, RevNat4, SlotKey, SlotValue, Svc4Key, Svc4Value};
pub use service_ct::{SvcCt4Entry, SvcCt4Key};
pub use trace::TraceConfig;

/// Implements `aya::Pod` for map keys and values when built for user space.
macro_rules! user_pod {
    ($($ty:ty),+ $(,)?) => {
        $(
            #[cfg(feature = "user")]
            // SAFETY: the type is `#[repr(C)]`, `Copy`, has explicit padding fields (no implicit
            // padding, checked by the size assertion beside it) and every bit pattern is valid.
            unsafe impl aya::Pod for $ty {}
        )+
    };
}
pub(crate) use user_pod;

/// Asserts a map type's size at compile time (the kernel side checks it again at load).
macro_rules! assert_size {
    ($ty:ty, $size:expr) => {
        const _: () = assert!(core::mem::size_of::<$ty>() == $size);
    };
}
pub(crate) use assert_size;
