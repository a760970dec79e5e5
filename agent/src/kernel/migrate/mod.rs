//! Conntrack layout migration (DESIGN.md → "Map versioning and conntrack migration").
//!
//! Before the programs load, [`prepare`] discards unfinished copies, refuses a layout newer than
//! the agent's, resizes through `<name>_old`, and copies and converts the older layout's entries
//! into the new map under a temporary pin (`ct4_v2:migrating`, renamed to `ct4_v2` when whole).
//! Once every link runs the new programs, [`finish`] merges the delta the old programs wrote
//! meanwhile and removes the old pins. [`rollback`] (`weir bpf migrate --to-version N`)
//! converts back for an older release. Every step leaves pins a later start rolls forward from.
//!
//! Every pin and map operation goes through the kernel seam's [`MigrateIo`] (real:
//! `kernel::real::ct_maps::BpffsCtMaps`; the fake kernel's in the unit tests, `tests.rs`).

mod copy;
pub mod failpoint;
pub mod pins;
pub mod rev_nat;
#[cfg(test)]
mod tests;

use std::{
    io,
    path::{Path, PathBuf},
    time::Instant,
};

use std::collections::HashMap;

use bytemuck::Pod;
use maps_schema::{
    Ct4Key, Ct6Key, CtEntry, SvcCt4Entry, SvcCt4Key,
    conntrack::{LAYOUT, OLDEST_LAYOUT, value_size},
    maps::{CT4_STEM, CT6_STEM},
    service_ct::{DIR_REPLY, SVC_CT4},
};
use serde::Serialize;

pub use crate::kernel::real::ct_maps::BpffsCtMaps;
use crate::kernel::{CtMapIo, MigrateIo};
use pins::{CtPin, PinKind, Refusal};

/// Errors of a migration. Nothing is deleted on an error: the pins stay for the next attempt.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A newer layout is pinned.
    #[error(
        "conntrack map {pin} has layout {found}, newer than this weir's layout {known}: run `weir bpf migrate --to-version {known}` with the newer weir (while no agent runs) to convert it back, then start this agent"
    )]
    NewerLayout {
        /// The pin.
        pin: PathBuf,
        /// Its layout.
        found: u32,
        /// This release's layout.
        known: u32,
    },
    /// A layout this release cannot convert.
    #[error(
        "conntrack map {pin} has layout {found}, which this weir cannot convert (it knows {OLDEST_LAYOUT} to {LAYOUT}); remove the pin if no traffic depends on it"
    )]
    UnknownLayout {
        /// The pin.
        pin: PathBuf,
        /// Its layout.
        found: u32,
    },
    /// The eBPF object has no conntrack map (or two different layouts).
    #[error("the eBPF object does not parse ({0}): rebuild it with `cargo xtask build-ebpf`")]
    Object(#[source] aya_obj::ParseError),
    /// The eBPF object's conntrack maps are missing, of two layouts, or of one unknown here.
    #[error(
        "the eBPF object declares no usable conntrack maps (ct4 layout {ct4:?}, ct6 layout {ct6:?}): rebuild it with `cargo xtask build-ebpf`"
    )]
    ObjectLayouts {
        /// The layout of its `ct4` map, if it has one.
        ct4: Option<u32>,
        /// The layout of its `ct6` map.
        ct6: Option<u32>,
    },
    /// Entries went missing during the copy (LRU eviction).
    #[error(
        "copying {map} lost {lost} entries to LRU eviction; raise --ct-max-entries and start again (the source is untouched)"
    )]
    Lost {
        /// The target map.
        map: String,
        /// Entries missing.
        lost: usize,
    },
    /// The requested rollback target is not older than what is pinned.
    #[error("cannot migrate {map} to layout {to}: {why}")]
    BadTarget {
        /// The map.
        map: String,
        /// The requested layout.
        to: u32,
        /// Why.
        why: String,
    },
    /// The migration stopped at a failpoint (the fake kernel's crash; the real one kills the
    /// process there).
    #[error("the conntrack migration stopped at failpoint {0}")]
    Failpoint(&'static str),
    /// A kernel or filesystem operation failed.
    #[error("cannot {op} {what}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// What it was applied to.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

fn io_err(
    op: &'static str,
    what: impl std::fmt::Display,
) -> impl FnOnce(io::Error) -> MigrateError {
    let what = what.to_string();
    move |source| MigrateError::Io { op, what, source }
}

/// One conntrack family: its stem and key type, and what it does about the reverse NAT of
/// translated flows across layout 3 (`rev_nat`: IPv4 only; IPv6 has no services).
trait Family {
    const STEM: &'static str;
    type Key: Pod + Eq + std::hash::Hash;

    /// Converting entries of layout `from` to layout `to`: fills their reverse NAT from
    /// `svc_ct4_v1` when `to` keeps it in conntrack and `from` did not. Returns how many.
    fn fill_rev_nat(
        _io: &impl MigrateIo,
        _from: u32,
        _to: u32,
        _entries: &mut [(Self::Key, CtEntry)],
    ) -> Result<usize, MigrateError> {
        Ok(0)
    }

    /// Converting entries (current layout) to layout `to`: writes their reverse NAT into
    /// `svc_ct4_v1` when `to` does not keep it in conntrack. Returns how many.
    fn write_replies(
        _io: &impl MigrateIo,
        _to: u32,
        _entries: &[(Self::Key, CtEntry)],
    ) -> Result<usize, MigrateError> {
        Ok(0)
    }
}
struct V4;
impl Family for V4 {
    const STEM: &'static str = CT4_STEM;
    type Key = Ct4Key;

    fn fill_rev_nat(
        io: &impl MigrateIo,
        from: u32,
        to: u32,
        entries: &mut [(Ct4Key, CtEntry)],
    ) -> Result<usize, MigrateError> {
        if from >= rev_nat::FIRST_IN_CONNTRACK || to < rev_nat::FIRST_IN_CONNTRACK {
            return Ok(0);
        }
        let replies = svc_replies(io)?;
        let filled = rev_nat::fill(entries, &replies);
        if filled > 0 {
            tracing::info!(
                filled,
                "translated flows keep their frontend in conntrack now"
            );
        }
        Ok(filled)
    }

    fn write_replies(
        io: &impl MigrateIo,
        to: u32,
        entries: &[(Ct4Key, CtEntry)],
    ) -> Result<usize, MigrateError> {
        if to >= rev_nat::FIRST_IN_CONNTRACK {
            return Ok(0);
        }
        let replies = rev_nat::replies(entries);
        if replies.is_empty() {
            return Ok(0);
        }
        let map = io
            .open(SVC_CT4)
            .map_err(io_err("open", io.path(SVC_CT4).display()))?;
        map.check::<SvcCt4Key, SvcCt4Entry>(false)
            .and_then(|()| map.update(&replies))
            .map_err(io_err(
                "write reply entries into",
                io.path(SVC_CT4).display(),
            ))
    }
}
struct V6;
impl Family for V6 {
    const STEM: &'static str = CT6_STEM;
    type Key = Ct6Key;
}

/// The reply entries of `svc_ct4_v1` (none when it is not pinned: no flow was ever translated).
fn svc_replies(io: &impl MigrateIo) -> Result<HashMap<SvcCt4Key, SvcCt4Entry>, MigrateError> {
    let pinned = io
        .pins()
        .map_err(io_err("read", io.path("").display()))?
        .iter()
        .any(|name| name == SVC_CT4);
    if !pinned {
        return Ok(HashMap::new());
    }
    let map = io
        .open(SVC_CT4)
        .map_err(io_err("open", io.path(SVC_CT4).display()))?;
    let read = map
        .check::<SvcCt4Key, SvcCt4Entry>(false)
        .and_then(|()| map.lookup_all::<SvcCt4Key, SvcCt4Entry>())
        .map_err(io_err("read", io.path(SVC_CT4).display()))?;
    Ok(read
        .into_iter()
        .filter(|(k, _)| k.direction == DIR_REPLY)
        .collect())
}

fn known(version: u32) -> bool {
    (OLDEST_LAYOUT..=LAYOUT).contains(&version)
}

/// The conntrack layout of an eBPF object (from its map names: `ct4_v2` → 2).
pub fn object_layout(object: &[u8]) -> Result<u32, MigrateError> {
    let obj = aya_obj::Object::parse(object).map_err(MigrateError::Object)?;
    let layout = |stem: &str| {
        obj.maps
            .keys()
            .filter_map(|name| CtPin::parse(stem, name))
            .find(|p| p.kind == PinKind::Plain)
            .map(|p| p.version)
    };
    match (layout(CT4_STEM), layout(CT6_STEM)) {
        (Some(a), Some(b)) if a == b && known(a) => Ok(a),
        (ct4, ct6) => Err(MigrateError::ObjectLayouts { ct4, ct6 }),
    }
}

fn list(io: &impl MigrateIo, stem: &str) -> Result<Vec<CtPin>, MigrateError> {
    let mut out: Vec<CtPin> = io
        .pins()
        .map_err(io_err("read", io.path("").display()))?
        .iter()
        .filter_map(|name| CtPin::parse(stem, name))
        .collect();
    out.sort();
    Ok(out)
}

fn pin_path(io: &impl MigrateIo, stem: &str, pin: &CtPin) -> PathBuf {
    io.path(&pin.name(stem))
}

fn open<M: MigrateIo>(io: &M, stem: &str, pin: &CtPin) -> Result<M::Map, MigrateError> {
    io.open(&pin.name(stem))
        .map_err(io_err("open", pin_path(io, stem, pin).display()))
}

fn capacity(
    io: &impl MigrateIo,
    stem: &str,
    pin: &CtPin,
    map: &impl CtMapIo,
) -> Result<u32, MigrateError> {
    map.max_entries()
        .map_err(io_err("read", pin_path(io, stem, pin).display()))
}

fn refusal(io: &impl MigrateIo, stem: &str, target: u32, r: Refusal) -> MigrateError {
    match r {
        Refusal::Newer { pin } => MigrateError::NewerLayout {
            pin: pin_path(io, stem, &pin),
            found: pin.version,
            known: target,
        },
        Refusal::Unknown { pin } => MigrateError::UnknownLayout {
            pin: pin_path(io, stem, &pin),
            found: pin.version,
        },
    }
}

fn rename(
    io: &mut impl MigrateIo,
    stem: &str,
    from: &CtPin,
    to: &CtPin,
) -> Result<(), MigrateError> {
    io.rename(&from.name(stem), &to.name(stem)).map_err(io_err(
        "rename",
        format!(
            "{} to {}",
            pin_path(io, stem, from).display(),
            pin_path(io, stem, to).display()
        ),
    ))
}

fn remove(io: &mut impl MigrateIo, stem: &str, pin: &CtPin) -> Result<(), MigrateError> {
    io.remove(&pin.name(stem))
        .map_err(io_err("remove", pin_path(io, stem, pin).display()))
}

/// Failpoint `name`: an error (the fake's crash) stops the migration there.
fn hit(io: &mut impl MigrateIo, name: &'static str) -> Result<(), MigrateError> {
    if io.failpoint(name) {
        Err(MigrateError::Failpoint(name))
    } else {
        Ok(())
    }
}

/// Every entry of the conntrack map behind `fd` (layout `version`), in the current layout.
pub fn read_entries<K: Pod>(
    fd: std::os::fd::BorrowedFd<'_>,
    version: u32,
) -> io::Result<Vec<(K, maps_schema::CtEntry)>> {
    copy::read(&fd, version)
}

/// What a migration did, for the agent's log, `weir status` and the benchmark.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct MigrationReport {
    /// Per family and source: what was done.
    pub steps: Vec<MigrationStep>,
}

/// One copy or merge.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MigrationStep {
    /// `copy` (full, into a new map), `merge` (delta), `resize`, `discard`, `restore`.
    pub action: &'static str,
    /// Source pin.
    pub from: String,
    /// Target pin.
    pub to: String,
    /// Entries written.
    pub entries: usize,
    /// Seconds taken.
    pub seconds: f64,
}

/// Sources still owed a delta merge once the links run the new programs.
#[derive(Debug, Default)]
pub struct Pending {
    /// The maps directory of [`prepare`] (for [`finish`]).
    dir: PathBuf,
    target: u32,
    families: Vec<(&'static str, Vec<CtPin>, Option<u64>)>,
    /// What `prepare` did.
    pub report: MigrationReport,
    /// (map name, max entries) of each conntrack map as the programs must load it: the flag's
    /// size, or more when conntrack holds more than the flag's size leaves room for.
    pub sizes: Vec<(String, u32)>,
}

impl Pending {
    /// True when `finish` has work.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.families.iter().all(|(_, s, _)| s.is_empty())
    }
}

/// Entries a map needs to take `entries` without early LRU eviction (10% headroom).
fn with_headroom(entries: usize) -> u32 {
    u32::try_from((entries as u64 * 10).div_ceil(9)).unwrap_or(u32::MAX)
}

/// Step 1 for both families (see the module doc) on the pins of the maps directory `dir`.
/// `max_entries` is `--ct-max-entries`; a map never shrinks below what its entries need, so no
/// entry is ever evicted by a resize or copy.
pub fn prepare(dir: &Path, target: u32, max_entries: u32) -> Result<Pending, MigrateError> {
    let mut pending = prepare_with(&mut BpffsCtMaps::new(dir), target, max_entries)?;
    pending.dir = dir.to_owned();
    Ok(pending)
}

/// [`prepare`] over the kernel seam.
pub fn prepare_with(
    io: &mut impl MigrateIo,
    target: u32,
    max_entries: u32,
) -> Result<Pending, MigrateError> {
    let mut pending = Pending {
        target,
        ..Pending::default()
    };
    // Refuse before touching anything.
    for stem in [CT4_STEM, CT6_STEM] {
        pins::plan(&list(io, stem)?, target, known).map_err(|r| refusal(io, stem, target, r))?;
    }
    prepare_family::<V4>(io, &mut pending, max_entries)?;
    prepare_family::<V6>(io, &mut pending, max_entries)?;
    Ok(pending)
}

fn prepare_family<F: Family>(
    io: &mut impl MigrateIo,
    pending: &mut Pending,
    max_entries: u32,
) -> Result<(), MigrateError> {
    let (target, stem) = (pending.target, F::STEM);
    let plan =
        pins::plan(&list(io, stem)?, target, known).map_err(|r| refusal(io, stem, target, r))?;
    for pin in &plan.discard {
        tracing::warn!(pin = %pin.name(stem), "discarding an unfinished conntrack copy");
        remove(io, stem, pin)?;
        pending
            .report
            .steps
            .push(step("discard", &pin.name(stem), "", 0, Instant::now()));
    }
    let target_pin = CtPin::plain(target);
    if let Some(pin) = &plan.restore {
        tracing::warn!(pin = %pin.name(stem), "a rollback was prepared but this newer agent started: restoring its map");
        rename(io, stem, pin, &target_pin)?;
        pending.report.steps.push(step(
            "restore",
            &pin.name(stem),
            &target_pin.name(stem),
            0,
            Instant::now(),
        ));
    }
    let mut plan = plan;
    let mut size = max_entries;
    if plan.target_exists {
        let map = open(io, stem, &target_pin)?;
        let current = capacity(io, stem, &target_pin, &map)?;
        let entries = if current == max_entries {
            0
        } else {
            copy::read::<F::Key>(&map, target)
                .map_err(io_err("read", pin_path(io, stem, &target_pin).display()))?
                .len()
        };
        if current != max_entries && with_headroom(entries) > max_entries {
            tracing::warn!(
                map = %target_pin.name(stem),
                entries,
                size = current,
                requested = max_entries,
                "conntrack holds more than --ct-max-entries leaves room for; keeping the current size (raise the flag, or let entries expire first)"
            );
            size = current;
            pending.report.steps.push(step(
                "keep",
                &target_pin.name(stem),
                &target_pin.name(stem),
                entries,
                Instant::now(),
            ));
        } else if current != max_entries {
            let old = CtPin {
                version: target,
                kind: PinKind::Old,
            };
            tracing::info!(map = %target_pin.name(stem), from = current, to = max_entries, "resizing conntrack through {}", old.name(stem));
            rename(io, stem, &target_pin, &old)?;
            pending.report.steps.push(step(
                "resize",
                &target_pin.name(stem),
                &old.name(stem),
                0,
                Instant::now(),
            ));
            plan = pins::plan(&list(io, stem)?, target, known)
                .map_err(|r| refusal(io, stem, target, r))?;
        }
    }
    let mut since = None;
    if !plan.target_exists
        && let Some(source) = plan.sources.first()
    {
        let started = Instant::now();
        let source_map = open(io, stem, source)?;
        since = Some(io.now_ns());
        let mut entries = copy::read::<F::Key>(&source_map, source.version)
            .map_err(io_err("read", pin_path(io, stem, source).display()))?;
        F::fill_rev_nat(io, source.version, target, &mut entries)?;
        let needed = with_headroom(entries.len());
        if needed > max_entries {
            tracing::warn!(
                map = %source.name(stem),
                entries = entries.len(),
                requested = max_entries,
                size = needed,
                "conntrack holds more than --ct-max-entries leaves room for; the new map gets {needed} entries so none is evicted"
            );
            size = needed;
        }
        let migrating = CtPin {
            version: target,
            kind: PinKind::Migrating,
        };
        let migrating_path = pin_path(io, stem, &migrating);
        let key_size = u32::try_from(size_of::<F::Key>()).unwrap_or(u32::MAX);
        let value = value_size(target).unwrap_or_default();
        let map = io
            .create(
                &target_pin.name(stem),
                &migrating.name(stem),
                key_size,
                value,
                size,
            )
            .map_err(io_err("create", migrating_path.display()))?;
        let copied = copy::copy_into(&map, target, &entries, || {
            io.failpoint("ct-migrate:mid-copy")
        })
        .map_err(io_err("copy into", migrating_path.display()))?;
        if copied.is_none() {
            return Err(MigrateError::Failpoint("ct-migrate:mid-copy"));
        }
        let present = copy::read::<F::Key>(&map, target)
            .map_err(io_err("read", migrating_path.display()))?
            .len();
        if present < entries.len() {
            remove(io, stem, &migrating)?;
            return Err(MigrateError::Lost {
                map: migrating.name(stem),
                lost: entries.len() - present,
            });
        }
        hit(io, "ct-migrate:after-copy")?;
        rename(io, stem, &migrating, &target_pin)?;
        tracing::info!(from = %source.name(stem), to = %target_pin.name(stem), entries = entries.len(), "conntrack copied and converted");
        pending.report.steps.push(step(
            "copy",
            &source.name(stem),
            &target_pin.name(stem),
            entries.len(),
            started,
        ));
        hit(io, "ct-migrate:after-rename")?;
    }
    pending.families.push((stem, plan.sources, since));
    pending.sizes.push((target_pin.name(stem), size));
    Ok(())
}

fn step(
    action: &'static str,
    from: &str,
    to: &str,
    entries: usize,
    started: Instant,
) -> MigrationStep {
    MigrationStep {
        action,
        from: from.to_owned(),
        to: to.to_owned(),
        entries,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Steps 2–3, once every link runs the programs that use the new maps: merges what the old
/// programs wrote meanwhile and removes the old pins (in the directory `prepare` used).
pub fn finish(pending: &mut Pending) -> Result<MigrationReport, MigrateError> {
    let mut io = BpffsCtMaps::new(&pending.dir);
    finish_with(&mut io, pending)
}

/// [`finish`] over the kernel seam.
pub fn finish_with(
    io: &mut impl MigrateIo,
    pending: &mut Pending,
) -> Result<MigrationReport, MigrateError> {
    let mut report = MigrationReport::default();
    if pending.is_empty() {
        return Ok(report);
    }
    hit(io, "ct-migrate:after-links")?;
    let target = pending.target;
    let mut owed = Vec::new();
    for (stem, sources, since) in &pending.families {
        let target_pin = CtPin::plain(target);
        for (i, source) in sources.iter().enumerate() {
            let started = Instant::now();
            let since = if i == 0 { *since } else { None };
            let (from_map, to_map) = (open(io, stem, source)?, open(io, stem, &target_pin)?);
            let merged = if *stem == CT4_STEM {
                let mut filled = Ok(0);
                let merged =
                    copy::merge::<Ct4Key>(&from_map, source.version, &to_map, target, since, |c| {
                        filled = V4::fill_rev_nat(io, source.version, target, c);
                        Ok(())
                    });
                filled?;
                merged
            } else {
                copy::merge::<Ct6Key>(
                    &from_map,
                    source.version,
                    &to_map,
                    target,
                    since,
                    |_| Ok(()),
                )
            }
            .map_err(io_err(
                "merge",
                format!(
                    "{} into {}",
                    pin_path(io, stem, source).display(),
                    pin_path(io, stem, &target_pin).display()
                ),
            ))?;
            tracing::info!(from = %source.name(stem), to = %target_pin.name(stem), merged, "conntrack delta merged");
            report.steps.push(step(
                "merge",
                &source.name(stem),
                &target_pin.name(stem),
                merged,
                started,
            ));
            owed.push((*stem, source.clone()));
        }
    }
    hit(io, "ct-migrate:after-delta")?;
    for (stem, pin) in owed {
        remove(io, stem, &pin)?;
    }
    pending.families.clear();
    Ok(report)
}

/// `weir bpf migrate --to-version to`: converts the pinned conntrack maps back to layout `to` for
/// an older release, with no agent running. The converted map is pinned under the older name
/// and the newer map is renamed `<name>:rollback`; the older agent merges that one's last
/// entries once its programs run, then removes it.
pub fn rollback(dir: &Path, to: u32) -> Result<MigrationReport, MigrateError> {
    rollback_with(&mut BpffsCtMaps::new(dir), to)
}

/// [`rollback`] over the kernel seam.
pub fn rollback_with(io: &mut impl MigrateIo, to: u32) -> Result<MigrationReport, MigrateError> {
    let mut report = MigrationReport::default();
    if !known(to) {
        return Err(MigrateError::BadTarget {
            map: "conntrack".into(),
            to,
            why: format!("this weir converts layouts {OLDEST_LAYOUT} to {LAYOUT} only"),
        });
    }
    rollback_family::<V4>(io, to, &mut report)?;
    rollback_family::<V6>(io, to, &mut report)?;
    Ok(report)
}

fn rollback_family<F: Family>(
    io: &mut impl MigrateIo,
    to: u32,
    report: &mut MigrationReport,
) -> Result<(), MigrateError> {
    let stem = F::STEM;
    let pins = list(io, stem)?;
    let Some(current) = pins
        .iter()
        .filter(|p| p.kind == PinKind::Plain)
        .map(|p| p.version)
        .max()
    else {
        return Ok(());
    };
    if current == to {
        return Ok(());
    }
    if current < to {
        return Err(MigrateError::BadTarget {
            map: CtPin::plain(current).name(stem),
            to,
            why: "it is older; start the newer agent to upgrade".into(),
        });
    }
    if !known(current) {
        return Err(MigrateError::UnknownLayout {
            pin: pin_path(io, stem, &CtPin::plain(current)),
            found: current,
        });
    }
    let started = Instant::now();
    let (source_pin, target_pin) = (CtPin::plain(current), CtPin::plain(to));
    let migrating = CtPin {
        version: to,
        kind: PinKind::Migrating,
    };
    let migrating_path = pin_path(io, stem, &migrating);
    remove(io, stem, &migrating)?;
    let source = open(io, stem, &source_pin)?;
    let written = if pins.contains(&target_pin) {
        // An upgrade never finished: older programs may still write the older map, so merge
        // into it in place rather than replace it.
        let target = open(io, stem, &target_pin)?;
        copy::merge::<F::Key>(&source, current, &target, to, None, |_| Ok(())).map_err(io_err(
            "merge",
            format!(
                "{} into {}",
                pin_path(io, stem, &source_pin).display(),
                pin_path(io, stem, &target_pin).display()
            ),
        ))?
    } else {
        let max = capacity(io, stem, &source_pin, &source)?;
        let entries = copy::read::<F::Key>(&source, current)
            .map_err(io_err("read", pin_path(io, stem, &source_pin).display()))?;
        let key_size = u32::try_from(size_of::<F::Key>()).unwrap_or(u32::MAX);
        let map = io
            .create(
                &target_pin.name(stem),
                &migrating.name(stem),
                key_size,
                value_size(to).unwrap_or_default(),
                max,
            )
            .map_err(io_err("create", migrating_path.display()))?;
        let n = copy::copy_into(&map, to, &entries, || false)
            .map_err(io_err("copy into", migrating_path.display()))?
            .unwrap_or_default();
        hit(io, "ct-rollback:after-copy")?;
        rename(io, stem, &migrating, &target_pin)?;
        n
    };
    // The older layout finds a translated flow's frontend in `svc_ct4_v1`: write it there.
    let entries = copy::read::<F::Key>(&source, current)
        .map_err(io_err("read", pin_path(io, stem, &source_pin).display()))?;
    let replies = F::write_replies(io, to, &entries)?;
    if replies > 0 {
        tracing::info!(
            replies,
            "translated flows' frontends written back for the older layout"
        );
    }
    hit(io, "ct-rollback:after-rename")?;
    let rollback_pin = CtPin {
        version: current,
        kind: PinKind::Rollback,
    };
    rename(io, stem, &source_pin, &rollback_pin)?;
    report.steps.push(step(
        "rollback",
        &source_pin.name(stem),
        &target_pin.name(stem),
        written,
        started,
    ));
    Ok(())
}
