//! Map names (each carries its layout version), default sizes and map flags.
//!
//! The eBPF crate declares each map with the same name literal (`#[btf_map(name = "...")]`);
//! the verifier gate in `tests/` checks that the object's maps are exactly [`ALL`].

/// `BPF_F_NO_PREALLOC`: allocate hash entries on demand (required for LPM tries).
pub const BPF_F_NO_PREALLOC: usize = 1;
/// `BPF_F_RDONLY_PROG`: programs may read but never write the map; only the agent writes it.
pub const BPF_F_RDONLY_PROG: usize = 1 << 7;

/// ifindex → [`crate::EndpointInfo`]. Written by the agent (and `weir-cni` through it).
pub const ENDPOINTS: &str = "endpoints_v1";
/// Default size of [`ENDPOINTS`].
pub const ENDPOINTS_MAX: u32 = 65_536;

/// [`crate::CounterKey`] → per-CPU [`crate::CounterValue`] (packets and bytes by reason and direction).
pub const COUNTERS: &str = "counters_v1";
/// Slots in [`COUNTERS`]: every reason × every direction.
pub const COUNTERS_MAX: u32 = crate::reason::MAX_REASONS * crate::reason::DIRECTIONS;

/// Every map in the object, in the order `weir bpf maps` lists them.
pub const ALL: &[&str] = &[ENDPOINTS, COUNTERS];

/// The pin name of map `name` at version `version` (`ct4`, 2 → `ct4_v2`).
#[must_use]
pub const fn layout_version(name: &str) -> Option<u32> {
    let bytes = name.as_bytes();
    let mut i = bytes.len();
    let mut version = 0u32;
    let mut scale = 1u32;
    while i > 0 {
        let b = bytes[i - 1];
        if b.is_ascii_digit() {
            version += (b - b'0') as u32 * scale;
            scale *= 10;
            i -= 1;
        } else if b == b'v' && i >= 2 && bytes[i - 2] == b'_' && scale > 1 {
            return Some(version);
        } else {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_map_name_carries_a_version_and_fits_the_kernel_name_limit() {
        for name in ALL {
            assert!(layout_version(name).is_some(), "{name} has no _vN suffix");
            assert!(
                name.len() <= 15,
                "{name} is longer than BPF_OBJ_NAME_LEN - 1"
            );
        }
        assert_eq!(layout_version("ct4_v2"), Some(2));
        assert_eq!(layout_version("ct4_v12"), Some(12));
        assert_eq!(layout_version("ct4"), None);
        assert_eq!(layout_version("ct4_v"), None);
    }
}
