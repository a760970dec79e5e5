//! Kernel side of a conntrack migration: create the new-layout map under its temporary pin, copy
//! and convert every entry with batch operations, merge the delta (newest `last_seen_ns` wins).

use std::{
    collections::HashMap,
    hash::Hash,
    io,
    os::fd::{AsFd as _, BorrowedFd},
    path::Path,
};

use aya::maps::MapData;
use aya_obj::generated::bpf_map_type;
use bytemuck::Pod;
use maps_schema::{CtEntry, CtEntryV1};

use crate::dataplane::batch;

/// Up to this many delta candidates are checked one lookup each (about 1 µs each); more read
/// the target whole (about 0.5 s per million entries).
const LOOKUP_LIMIT: usize = 131_072;
/// The programs' clock is coarse (a tick); an entry refreshed this close to the copy's start is
/// copied again.
const CLOCK_MARGIN_NS: u64 = 1_000_000_000;

pub use crate::dataplane::ct_layout::read;

/// Writes `entries` (current layout) into a map of layout `version`.
pub fn write<K: Pod>(
    fd: BorrowedFd<'_>,
    version: u32,
    entries: &[(K, CtEntry)],
) -> io::Result<usize> {
    match version {
        1 => {
            let old: Vec<(K, CtEntryV1)> =
                entries.iter().map(|(k, v)| (*k, v.downgrade())).collect();
            batch::update(fd, &old)
        }
        _ => batch::update(fd, entries),
    }
}

/// One entry of a map of layout `version` (the target of a merge: always a layout this
/// release knows).
fn lookup<K: Pod>(fd: BorrowedFd<'_>, version: u32, key: &K) -> io::Result<Option<CtEntry>> {
    match version {
        1 => Ok(batch::lookup::<K, CtEntryV1>(fd, key)?.map(CtEntryV1::upgrade)),
        _ => batch::lookup::<K, CtEntry>(fd, key),
    }
}

/// Creates an LRU conntrack map of layout `version` (named `name` in the kernel) and pins it.
pub fn create(
    name: &str,
    pin: &Path,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
) -> io::Result<MapData> {
    let obj = aya_obj::Map::new_from_params(
        bpf_map_type::BPF_MAP_TYPE_LRU_HASH as u32,
        key_size,
        value_size,
        max_entries,
        0,
    );
    let map = MapData::create(obj, name, None).map_err(io::Error::other)?;
    map.pin(pin).map_err(io::Error::other)?;
    Ok(map)
}

/// Copies `entries` into `to` (layout `version`), calling `halfway` once half are written.
pub fn copy_into<K: Pod>(
    to: &MapData,
    version: u32,
    entries: &[(K, CtEntry)],
    halfway: impl FnOnce(),
) -> io::Result<usize> {
    let half = entries.len() / 2;
    let mut written = write(to.fd().as_fd(), version, &entries[..half])?;
    halfway();
    written += write(to.fd().as_fd(), version, &entries[half..])?;
    Ok(written)
}

/// Merges `source` (layout `from`) into `target` (layout `to`): an entry refreshed since
/// `since_ns` (every entry without it) is written unless the target holds a newer one.
/// Returns how many were written.
pub fn merge<K: Pod + Eq + Hash>(
    source: &MapData,
    from: u32,
    target: &MapData,
    to: u32,
    since_ns: Option<u64>,
) -> io::Result<usize> {
    let candidates: Vec<(K, CtEntry)> = read::<K>(source.fd().as_fd(), from)?
        .into_iter()
        .filter(|(_, v)| {
            since_ns.is_none_or(|s| v.last_seen_ns.saturating_add(CLOCK_MARGIN_NS) >= s)
        })
        .collect();
    let newer = |candidate: &CtEntry, existing: Option<CtEntry>| match existing {
        Some(t) if t.last_seen_ns >= candidate.last_seen_ns => None,
        Some(t) => Some(CtEntry {
            created_ns: t.created_ns.min(candidate.created_ns),
            ..*candidate
        }),
        None => Some(*candidate),
    };
    let mut writes = Vec::new();
    match to {
        1 => batch::check::<K, CtEntryV1>(target.fd().as_fd(), false)?,
        _ => batch::check::<K, CtEntry>(target.fd().as_fd(), false)?,
    }
    if candidates.len() <= LOOKUP_LIMIT {
        for (k, v) in &candidates {
            if let Some(w) = newer(v, lookup(target.fd().as_fd(), to, k)?) {
                writes.push((*k, w));
            }
        }
    } else {
        let existing: HashMap<K, CtEntry> =
            read::<K>(target.fd().as_fd(), to)?.into_iter().collect();
        for (k, v) in &candidates {
            if let Some(w) = newer(v, existing.get(k).copied()) {
                writes.push((*k, w));
            }
        }
    }
    write(target.fd().as_fd(), to, &writes)
}
