//! The conversions of a conntrack migration, over the kernel seam ([`CtMapIo`]): copy and
//! convert every entry into a map of another layout, merge the delta (newest `last_seen_ns`
//! wins). The maps are created, renamed and removed through [`crate::kernel::MigrateIo`].

use std::{collections::HashMap, hash::Hash, io};

use bytemuck::Pod;
use maps_schema::{CtEntry, CtEntryV1, CtEntryV2};

use crate::kernel::CtMapIo;

/// Up to this many delta candidates are checked one lookup each (about 1 µs each); more read
/// the target whole (about 0.5 s per million entries).
const LOOKUP_LIMIT: usize = 131_072;
/// The programs' clock is coarse (a tick); an entry refreshed this close to the copy's start is
/// copied again.
const CLOCK_MARGIN_NS: u64 = 1_000_000_000;

pub use crate::kernel::ct_layout::read;

/// Writes `entries` (current layout) into a map of layout `version`.
pub fn write<K: Pod>(
    map: &impl CtMapIo,
    version: u32,
    entries: &[(K, CtEntry)],
) -> io::Result<usize> {
    match version {
        1 => {
            let old: Vec<(K, CtEntryV1)> =
                entries.iter().map(|(k, v)| (*k, v.downgrade())).collect();
            map.update(&old)
        }
        2 => {
            let old: Vec<(K, CtEntryV2)> = entries
                .iter()
                .map(|(k, v)| (*k, v.downgrade_v2()))
                .collect();
            map.update(&old)
        }
        _ => map.update(entries),
    }
}

/// One entry of a map of layout `version` (the target of a merge: always a layout this
/// release knows).
fn lookup<K: Pod>(map: &impl CtMapIo, version: u32, key: &K) -> io::Result<Option<CtEntry>> {
    match version {
        1 => Ok(map.lookup::<K, CtEntryV1>(key)?.map(CtEntryV1::upgrade)),
        2 => Ok(map.lookup::<K, CtEntryV2>(key)?.map(CtEntryV2::upgrade)),
        _ => map.lookup::<K, CtEntry>(key),
    }
}

/// Copies `entries` into `to` (layout `version`), calling `halfway` once half are written;
/// `None` when `halfway` says stop (a failpoint's crash).
pub fn copy_into<K: Pod>(
    to: &impl CtMapIo,
    version: u32,
    entries: &[(K, CtEntry)],
    halfway: impl FnOnce() -> bool,
) -> io::Result<Option<usize>> {
    let half = entries.len() / 2;
    let written = write(to, version, &entries[..half])?;
    if halfway() {
        return Ok(None);
    }
    Ok(Some(written + write(to, version, &entries[half..])?))
}

/// Merges `source` (layout `from`) into `target` (layout `to`): an entry refreshed since
/// `since_ns` (every entry without it) is written unless the target holds a newer one. `fill`
/// completes the candidates first (the reverse NAT an older layout kept elsewhere). Returns how
/// many were written.
pub fn merge<K: Pod + Eq + Hash>(
    source: &impl CtMapIo,
    from: u32,
    target: &impl CtMapIo,
    to: u32,
    since_ns: Option<u64>,
    fill: impl FnOnce(&mut [(K, CtEntry)]) -> io::Result<()>,
) -> io::Result<usize> {
    let mut candidates: Vec<(K, CtEntry)> = read::<K>(source, from)?
        .into_iter()
        .filter(|(_, v)| {
            since_ns.is_none_or(|s| v.last_seen_ns.saturating_add(CLOCK_MARGIN_NS) >= s)
        })
        .collect();
    fill(&mut candidates)?;
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
        1 => target.check::<K, CtEntryV1>(false)?,
        2 => target.check::<K, CtEntryV2>(false)?,
        _ => target.check::<K, CtEntry>(false)?,
    }
    if candidates.len() <= LOOKUP_LIMIT {
        for (k, v) in &candidates {
            if let Some(w) = newer(v, lookup(target, to, k)?) {
                writes.push((*k, w));
            }
        }
    } else {
        let existing: HashMap<K, CtEntry> = read::<K>(target, to)?.into_iter().collect();
        for (k, v) in &candidates {
            if let Some(w) = newer(v, existing.get(k).copied()) {
                writes.push((*k, w));
            }
        }
    }
    write(target, to, &writes)
}
