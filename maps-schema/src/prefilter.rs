//! `prefilter4`/`prefilter6`: LPM deny lists for `xdp_prefilter` (key: prefix length + address).

use crate::{assert_size, user_pod};

/// The value of a prefilter deny CIDR.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PrefilterEntry {
    /// An operator-chosen id for the CIDR (for traces); not interpreted.
    pub rule_id: u32,
}
assert_size!(PrefilterEntry, 4);
user_pod!(PrefilterEntry);
