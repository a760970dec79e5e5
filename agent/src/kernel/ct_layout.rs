//! Conntrack entries of any layout, read in the current one: the sweep and listing read the
//! maps through this, and so does the migration (`migrate/`), which depends on the dataplane
//! and never the other way round. Over the seam's [`CtMapIo`] (a map's fd, or the fake's map).

use std::io;

use bytemuck::Pod;
use maps_schema::{CtEntry, CtEntryV1, CtEntryV2};

use crate::kernel::CtMapIo;

/// Every entry of a conntrack map of layout `version`, in the current layout. A layout newer
/// than this release's is read as its prefix (layouts only append fields), so an older release
/// can take the last entries of a rollback without knowing the newer layout.
pub fn read<K: Pod>(map: &impl CtMapIo, version: u32) -> io::Result<Vec<(K, CtEntry)>> {
    match version {
        1 => Ok(map
            .lookup_all::<K, CtEntryV1>()?
            .into_iter()
            .map(|(k, v)| (k, v.upgrade()))
            .collect()),
        2 => Ok(map
            .lookup_all::<K, CtEntryV2>()?
            .into_iter()
            .map(|(k, v)| (k, v.upgrade()))
            .collect()),
        v if v > maps_schema::conntrack::LAYOUT => {
            map.lookup_all_prefix::<K, CtEntry>(map.sizes()?.1)
        }
        _ => map.lookup_all::<K, CtEntry>(),
    }
}

/// The pin names of the conntrack maps of layout `layout` (`ct4_v3`, `ct6_v3`).
#[must_use]
pub fn map_names(layout: u32) -> (String, String) {
    use maps_schema::maps::{CT4_STEM, CT6_STEM};
    (
        format!("{CT4_STEM}_v{layout}"),
        format!("{CT6_STEM}_v{layout}"),
    )
}
