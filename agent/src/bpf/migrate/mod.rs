//! Conntrack layout migration (DESIGN.md → "Map versioning and conntrack migration").
//!
//! Before the programs load, [`prepare`] discards unfinished copies, refuses a layout newer than
//! the agent's, resizes through `<name>_old`, and copies and converts the older layout's entries
//! into the new map under a temporary pin (`ct4_v2:migrating`, renamed to `ct4_v2` when whole).
//! Once every link runs the new programs, [`finish`] merges the delta the old programs wrote
//! meanwhile and removes the old pins. [`rollback`] (`weir bpf migrate --to-version N`)
//! converts back for an older release. Every step leaves pins a later start rolls forward from.

mod copy;
pub mod failpoint;
pub mod pins;

use std::{
    fs, io,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    time::Instant,
};

use aya::maps::MapData;
use bytemuck::Pod;
use maps_schema::{
    Ct4Key, Ct6Key,
    conntrack::{LAYOUT, OLDEST_LAYOUT, value_size},
    maps::{CT4_STEM, CT6_STEM},
};
use serde::Serialize;

use crate::dataplane::conntrack::now_ns;
pub use copy::read as read_entries;
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

/// One conntrack family: its stem and key type.
trait Family {
    const STEM: &'static str;
    type Key: Pod + Eq + std::hash::Hash;
}
struct V4;
impl Family for V4 {
    const STEM: &'static str = CT4_STEM;
    type Key = Ct4Key;
}
struct V6;
impl Family for V6 {
    const STEM: &'static str = CT6_STEM;
    type Key = Ct6Key;
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

fn list(dir: &Path, stem: &str) -> Result<Vec<CtPin>, MigrateError> {
    let mut out: Vec<CtPin> = fs::read_dir(dir)
        .map_err(io_err("read", dir.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| CtPin::parse(stem, e.file_name().to_str()?))
        .collect();
    out.sort();
    Ok(out)
}

fn pin_path(dir: &Path, stem: &str, pin: &CtPin) -> PathBuf {
    dir.join(pin.name(stem))
}

fn open(path: &Path) -> Result<MapData, MigrateError> {
    MapData::from_pin(path).map_err(|e| MigrateError::Io {
        op: "open",
        what: path.display().to_string(),
        source: io::Error::other(e),
    })
}

fn refusal(dir: &Path, stem: &str, target: u32, r: Refusal) -> MigrateError {
    match r {
        Refusal::Newer { pin } => MigrateError::NewerLayout {
            pin: pin_path(dir, stem, &pin),
            found: pin.version,
            known: target,
        },
        Refusal::Unknown { pin } => MigrateError::UnknownLayout {
            pin: pin_path(dir, stem, &pin),
            found: pin.version,
        },
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), MigrateError> {
    fs::rename(from, to).map_err(io_err(
        "rename",
        format!("{} to {}", from.display(), to.display()),
    ))
}

fn remove(path: &Path) -> Result<(), MigrateError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", path.display())(e)),
        _ => Ok(()),
    }
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

/// Step 1 for both families (see the module doc). `max_entries` is `--ct-max-entries`; a map
/// never shrinks below what its entries need, so no entry is ever evicted by a resize or copy.
pub fn prepare(dir: &Path, target: u32, max_entries: u32) -> Result<Pending, MigrateError> {
    let mut pending = Pending {
        dir: dir.to_owned(),
        target,
        ..Pending::default()
    };
    // Refuse before touching anything.
    for stem in [CT4_STEM, CT6_STEM] {
        pins::plan(&list(dir, stem)?, target, known).map_err(|r| refusal(dir, stem, target, r))?;
    }
    prepare_family::<V4>(&mut pending, max_entries)?;
    prepare_family::<V6>(&mut pending, max_entries)?;
    Ok(pending)
}

fn prepare_family<F: Family>(pending: &mut Pending, max_entries: u32) -> Result<(), MigrateError> {
    let (dir, target, stem) = (pending.dir.clone(), pending.target, F::STEM);
    let plan = pins::plan(&list(&dir, stem)?, target, known)
        .map_err(|r| refusal(&dir, stem, target, r))?;
    for pin in &plan.discard {
        tracing::warn!(pin = %pin.name(stem), "discarding an unfinished conntrack copy");
        remove(&pin_path(&dir, stem, pin))?;
        pending
            .report
            .steps
            .push(step("discard", &pin.name(stem), "", 0, Instant::now()));
    }
    let target_pin = CtPin::plain(target);
    let target_path = pin_path(&dir, stem, &target_pin);
    if let Some(pin) = &plan.restore {
        tracing::warn!(pin = %pin.name(stem), "a rollback was prepared but this newer agent started: restoring its map");
        rename(&pin_path(&dir, stem, pin), &target_path)?;
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
        let map = open(&target_path)?;
        let info = map
            .info()
            .map_err(|e| io_err("read", target_path.display())(io::Error::other(e)))?;
        let entries = if info.max_entries() == max_entries {
            0
        } else {
            copy::read::<F::Key>(map.fd().as_fd(), target)
                .map_err(io_err("read", target_path.display()))?
                .len()
        };
        if info.max_entries() != max_entries && with_headroom(entries) > max_entries {
            tracing::warn!(
                map = %target_pin.name(stem),
                entries,
                size = info.max_entries(),
                requested = max_entries,
                "conntrack holds more than --ct-max-entries leaves room for; keeping the current size (raise the flag, or let entries expire first)"
            );
            size = info.max_entries();
            pending.report.steps.push(step(
                "keep",
                &target_pin.name(stem),
                &target_pin.name(stem),
                entries,
                Instant::now(),
            ));
        } else if info.max_entries() != max_entries {
            let old = CtPin {
                version: target,
                kind: PinKind::Old,
            };
            tracing::info!(map = %target_pin.name(stem), from = info.max_entries(), to = max_entries, "resizing conntrack through {}", old.name(stem));
            rename(&target_path, &pin_path(&dir, stem, &old))?;
            pending.report.steps.push(step(
                "resize",
                &target_pin.name(stem),
                &old.name(stem),
                0,
                Instant::now(),
            ));
            plan = pins::plan(&list(&dir, stem)?, target, known)
                .map_err(|r| refusal(&dir, stem, target, r))?;
        }
    }
    let mut since = None;
    if !plan.target_exists
        && let Some(source) = plan.sources.first()
    {
        let started = Instant::now();
        let source_path = pin_path(&dir, stem, source);
        let source_map = open(&source_path)?;
        since = Some(now_ns());
        let entries = copy::read::<F::Key>(source_map.fd().as_fd(), source.version)
            .map_err(io_err("read", source_path.display()))?;
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
        let migrating_path = pin_path(&dir, stem, &migrating);
        let key_size = u32::try_from(size_of::<F::Key>()).unwrap_or(u32::MAX);
        let value = value_size(target).unwrap_or_default();
        let map = copy::create(
            &target_pin.name(stem),
            &migrating_path,
            key_size,
            value,
            size,
        )
        .map_err(io_err("create", migrating_path.display()))?;
        copy::copy_into(&map, target, &entries, || {
            failpoint::hit("ct-migrate:mid-copy");
        })
        .map_err(io_err("copy into", migrating_path.display()))?;
        let present = copy::read::<F::Key>(map.fd().as_fd(), target)
            .map_err(io_err("read", migrating_path.display()))?
            .len();
        if present < entries.len() {
            remove(&migrating_path)?;
            return Err(MigrateError::Lost {
                map: migrating.name(stem),
                lost: entries.len() - present,
            });
        }
        failpoint::hit("ct-migrate:after-copy");
        rename(&migrating_path, &target_path)?;
        tracing::info!(from = %source.name(stem), to = %target_pin.name(stem), entries = entries.len(), "conntrack copied and converted");
        pending.report.steps.push(step(
            "copy",
            &source.name(stem),
            &target_pin.name(stem),
            entries.len(),
            started,
        ));
        failpoint::hit("ct-migrate:after-rename");
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
/// programs wrote meanwhile and removes the old pins.
pub fn finish(pending: &mut Pending) -> Result<MigrationReport, MigrateError> {
    let mut report = MigrationReport::default();
    if pending.is_empty() {
        return Ok(report);
    }
    failpoint::hit("ct-migrate:after-links");
    let (dir, target) = (pending.dir.clone(), pending.target);
    let mut owed = Vec::new();
    for (stem, sources, since) in &pending.families {
        let target_pin = CtPin::plain(target);
        for (i, source) in sources.iter().enumerate() {
            let started = Instant::now();
            let since = if i == 0 { *since } else { None };
            let (from, to) = (
                pin_path(&dir, stem, source),
                pin_path(&dir, stem, &target_pin),
            );
            let (from_map, to_map) = (open(&from)?, open(&to)?);
            let merged = if *stem == CT4_STEM {
                copy::merge::<Ct4Key>(&from_map, source.version, &to_map, target, since)
            } else {
                copy::merge::<Ct6Key>(&from_map, source.version, &to_map, target, since)
            }
            .map_err(io_err(
                "merge",
                format!("{} into {}", from.display(), to.display()),
            ))?;
            tracing::info!(from = %source.name(stem), to = %target_pin.name(stem), merged, "conntrack delta merged");
            report.steps.push(step(
                "merge",
                &source.name(stem),
                &target_pin.name(stem),
                merged,
                started,
            ));
            owed.push(from);
        }
    }
    failpoint::hit("ct-migrate:after-delta");
    for path in owed {
        remove(&path)?;
    }
    pending.families.clear();
    Ok(report)
}

/// `weir bpf migrate --to-version to`: converts the pinned conntrack maps back to layout `to` for
/// an older release, with no agent running. The converted map is pinned under the older name
/// and the newer map is renamed `<name>:rollback`; the older agent merges that one's last
/// entries once its programs run, then removes it.
pub fn rollback(dir: &Path, to: u32) -> Result<MigrationReport, MigrateError> {
    let mut report = MigrationReport::default();
    if !known(to) {
        return Err(MigrateError::BadTarget {
            map: "conntrack".into(),
            to,
            why: format!("this weir converts layouts {OLDEST_LAYOUT} to {LAYOUT} only"),
        });
    }
    rollback_family::<V4>(dir, to, &mut report)?;
    rollback_family::<V6>(dir, to, &mut report)?;
    Ok(report)
}

fn rollback_family<F: Family>(
    dir: &Path,
    to: u32,
    report: &mut MigrationReport,
) -> Result<(), MigrateError> {
    let stem = F::STEM;
    let pins = list(dir, stem)?;
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
            pin: pin_path(dir, stem, &CtPin::plain(current)),
            found: current,
        });
    }
    let started = Instant::now();
    let (source_pin, target_pin) = (CtPin::plain(current), CtPin::plain(to));
    let (source_path, target_path) = (
        pin_path(dir, stem, &source_pin),
        pin_path(dir, stem, &target_pin),
    );
    let migrating = CtPin {
        version: to,
        kind: PinKind::Migrating,
    };
    let migrating_path = pin_path(dir, stem, &migrating);
    remove(&migrating_path)?;
    let source = open(&source_path)?;
    let written = if pins.contains(&target_pin) {
        // An upgrade never finished: older programs may still write the older map, so merge
        // into it in place rather than replace it.
        let target = open(&target_path)?;
        copy::merge::<F::Key>(&source, current, &target, to, None).map_err(io_err(
            "merge",
            format!("{} into {}", source_path.display(), target_path.display()),
        ))?
    } else {
        let max = source
            .info()
            .map_err(|e| io_err("read", source_path.display())(io::Error::other(e)))?
            .max_entries();
        let entries = copy::read::<F::Key>(source.fd().as_fd(), current)
            .map_err(io_err("read", source_path.display()))?;
        let key_size = u32::try_from(size_of::<F::Key>()).unwrap_or(u32::MAX);
        let map = copy::create(
            &target_pin.name(stem),
            &migrating_path,
            key_size,
            value_size(to).unwrap_or_default(),
            max,
        )
        .map_err(io_err("create", migrating_path.display()))?;
        let n = copy::copy_into(&map, to, &entries, || {})
            .map_err(io_err("copy into", migrating_path.display()))?;
        failpoint::hit("ct-rollback:after-copy");
        rename(&migrating_path, &target_path)?;
        n
    };
    failpoint::hit("ct-rollback:after-rename");
    let rollback_pin = CtPin {
        version: current,
        kind: PinKind::Rollback,
    };
    rename(&source_path, &pin_path(dir, stem, &rollback_pin))?;
    report.steps.push(step(
        "rollback",
        &source_pin.name(stem),
        &target_pin.name(stem),
        written,
        started,
    ));
    Ok(())
}
