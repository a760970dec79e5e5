//! Conntrack entries of any layout, read in the current one: the sweep and listing read the
//! maps through this, and so does the migration (`migrate/`), which depends on the dataplane
//! and never the other way round.

use std::{io, os::fd::BorrowedFd};

use bytemuck::Pod;
use maps_schema::{CtEntry, CtEntryV1};

use super::batch;

/// Every entry of a conntrack map of layout `version`, in the current layout. A layout newer
/// than this release's is read as its prefix (layouts only append fields), so an older release
/// can take the last entries of a rollback without knowing the newer layout.
pub fn read<K: Pod>(fd: BorrowedFd<'_>, version: u32) -> io::Result<Vec<(K, CtEntry)>> {
    match version {
        1 => Ok(batch::lookup_all::<K, CtEntryV1>(fd)?
            .into_iter()
            .map(|(k, v)| (k, v.upgrade()))
            .collect()),
        v if v > maps_schema::conntrack::LAYOUT => {
            batch::lookup_all_prefix::<K, CtEntry>(fd, batch::value_size(fd)?)
        }
        _ => batch::lookup_all::<K, CtEntry>(fd),
    }
}
