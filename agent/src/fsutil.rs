//! Durable file replacement: write a temporary file beside the target, fsync it, rename it over
//! the target, fsync the directory. A crash leaves either the old or the new content, never half;
//! a failed write removes its temporary file (on a full disk it holds the space that is missing)
//! and leaves the target as it was.
//!
//! The agent's state files (`endpoints.json` and its journal, `identities.json`,
//! `allocations.json`) are written through [`write_state`], which also keeps their health: a
//! failed write is a fault of that file (its path and cause, a full disk named as one) until a
//! write of it succeeds again or [`probe`] finds that the directory takes a write of that size
//! again. Every caller keeps its memory equal to the file it failed to replace, so nothing is owed
//! once writes work: the fault clears, and the next change writes the file as usual.

use std::{
    collections::BTreeMap,
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Replaces `path` with `bytes` atomically and durably, creating its directory if needed. On
/// failure the temporary file is removed and `path` keeps its previous content.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        fs::create_dir_all(dir)?;
    }
    let tmp = temporary(path);
    let written = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        // The target is untouched; the partial temporary file would only hold space.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Some(dir) = dir {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A state file whose last write failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileFault {
    /// The file.
    pub path: PathBuf,
    /// What failed and what to do.
    pub cause: String,
    /// The cause is a full disk (`ENOSPC`) or an exhausted quota (`EDQUOT`).
    pub full_disk: bool,
    /// When the first failure happened.
    pub since: SystemTime,
    /// Failed writes and probes since then.
    pub attempts: u64,
}

struct Tracked {
    fault: FileFault,
    /// The size of the write that failed: a probe writes as much.
    size: usize,
    next_probe: Instant,
    backoff: Duration,
}

static FAULTS: Mutex<BTreeMap<PathBuf, Tracked>> = Mutex::new(BTreeMap::new());
static BEGUN: AtomicU64 = AtomicU64::new(0);
static CLEARED: AtomicU64 = AtomicU64::new(0);

const PROBE_MIN: Duration = Duration::from_secs(1);
const PROBE_MAX: Duration = Duration::from_secs(10);
/// A probe writes at most this much (the state files are far smaller).
const PROBE_MAX_BYTES: usize = 1 << 20;

const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;

/// Whether `e` means the disk (or the quota) is full.
#[must_use]
pub fn is_full_disk(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT))
        || matches!(
            e.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        )
}

/// `e` as the operator reads it: a full disk named as one, with the directory to free space in and
/// the fact that `path` kept its previous content. The kind is kept.
#[must_use]
pub fn describe(path: &Path, e: &io::Error) -> (String, bool) {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if is_full_disk(e) {
        (
            format!(
                "the disk is full ({e}): free space on the filesystem holding {}; the file keeps its previous \
                 content and the agent retries by itself",
                dir.display()
            ),
            true,
        )
    } else {
        (format!("{e}; the file keeps its previous content"), false)
    }
}

/// Records that writing `size` bytes to the state file `path` failed with `e`, and returns the
/// error to report: `e`'s kind, with [`describe`]'s text.
pub fn note_failure(path: &Path, size: usize, e: &io::Error) -> io::Error {
    let (cause, full_disk) = describe(path, e);
    let mut faults = FAULTS.lock().unwrap_or_else(PoisonError::into_inner);
    match faults.get_mut(path) {
        Some(t) => {
            t.fault.attempts += 1;
            t.fault.cause.clone_from(&cause);
            t.fault.full_disk = full_disk;
            t.size = size;
        }
        None => {
            tracing::error!(path = %path.display(), cause = %cause, "cannot write a state file: the change it carries is refused until writes work again");
            BEGUN.fetch_add(1, Ordering::Relaxed);
            faults.insert(
                path.to_owned(),
                Tracked {
                    fault: FileFault {
                        path: path.to_owned(),
                        cause: cause.clone(),
                        full_disk,
                        since: SystemTime::now(),
                        attempts: 1,
                    },
                    size,
                    next_probe: Instant::now() + PROBE_MIN,
                    backoff: PROBE_MIN,
                },
            );
        }
    }
    io::Error::new(e.kind(), cause)
}

/// Records that the state file `path` was written: its fault, if any, clears.
pub fn note_success(path: &Path) {
    let cleared = FAULTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(path);
    if let Some(t) = cleared {
        CLEARED.fetch_add(1, Ordering::Relaxed);
        tracing::info!(path = %path.display(), attempts = t.fault.attempts, "a state file is written again");
    }
}

/// [`write_atomic`] for a state file, keeping its health ([`faults`]).
pub fn write_state(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match write_atomic(path, bytes) {
        Ok(()) => {
            note_success(path);
            Ok(())
        }
        Err(e) => Err(note_failure(path, bytes.len(), &e)),
    }
}

/// The state files whose last write failed.
#[must_use]
pub fn faults() -> Vec<FileFault> {
    FAULTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
        .map(|t| t.fault.clone())
        .collect()
}

/// State-file faults begun and cleared since the agent started.
#[must_use]
pub fn fault_counts() -> (u64, u64) {
    (
        BEGUN.load(Ordering::Relaxed),
        CLEARED.load(Ordering::Relaxed),
    )
}

/// Probes each faulted state file whose probe is due (backing off from 1 s to 10 s): a hidden file
/// of the failed write's size is written durably beside it and removed. When that succeeds the
/// directory takes the write again, and the fault clears. Blocking file I/O: call it off the
/// runtime's threads.
pub fn probe() {
    let due: Vec<(PathBuf, usize)> = {
        let now = Instant::now();
        FAULTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, t)| t.next_probe <= now)
            .map(|(p, t)| (p.clone(), t.size.min(PROBE_MAX_BYTES)))
            .collect()
    };
    for (path, size) in due {
        let mut name = std::ffi::OsString::from(".");
        name.push(path.file_name().unwrap_or_default());
        name.push(".probe");
        let probe = path.with_file_name(name);
        match write_atomic(&probe, &vec![0u8; size]) {
            Ok(()) => {
                let _ = fs::remove_file(&probe);
                note_success(&path);
            }
            Err(e) => {
                let (cause, full_disk) = describe(&path, &e);
                if let Some(t) = FAULTS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_mut(&path)
                {
                    t.fault.attempts += 1;
                    t.fault.cause = cause;
                    t.fault.full_disk = full_disk;
                    t.backoff = (t.backoff * 2).min(PROBE_MAX);
                    t.next_probe = Instant::now() + t.backoff;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_files() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("sub/state.json");
        super::write_atomic(&path, b"one").expect("first");
        super::write_atomic(&path, b"two").expect("second");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        assert!(!path.with_file_name("state.json.tmp").exists());
    }

    #[test]
    fn a_failed_state_write_keeps_the_old_file_is_a_fault_naming_the_full_disk_and_clears_on_success()
     {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("state.json");
        write_state(&path, b"old").expect("first");
        assert!(faults().iter().all(|f| f.path != path));
        // The kernel's full-disk error, as the rename of a full filesystem would give it.
        let err = note_failure(&path, 3, &io::Error::from_raw_os_error(ENOSPC));
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        let text = err.to_string();
        assert!(
            text.contains("the disk is full") && text.contains(&dir.path().display().to_string()),
            "{text}"
        );
        let fault = faults()
            .into_iter()
            .find(|f| f.path == path)
            .expect("fault");
        assert!(fault.full_disk, "{fault:?}");
        // A write that cannot replace the file (a directory stands at the temporary path) fails,
        // leaves the old content and counts as one more attempt.
        fs::create_dir_all(dir.path().join("state.json.tmp/x")).expect("blocker");
        assert!(write_state(&path, b"new").is_err());
        assert_eq!(fs::read(&path).expect("read"), b"old");
        let fault = faults()
            .into_iter()
            .find(|f| f.path == path)
            .expect("fault");
        assert!(!fault.full_disk && fault.attempts == 2, "{fault:?}");
        // Writes work again: the fault clears.
        fs::remove_dir_all(dir.path().join("state.json.tmp")).expect("unblock");
        write_state(&path, b"new").expect("again");
        assert!(faults().iter().all(|f| f.path != path));
        assert_eq!(fs::read(&path).expect("read"), b"new");
    }

    #[test]
    fn a_probe_clears_a_fault_once_the_directory_takes_a_write() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("state.json");
        let _ = note_failure(&path, 64, &io::Error::from_raw_os_error(ENOSPC));
        // Not due yet: nothing changes.
        probe();
        assert!(faults().iter().any(|f| f.path == path));
        FAULTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&path)
            .expect("tracked")
            .next_probe = Instant::now();
        probe();
        assert!(faults().iter().all(|f| f.path != path), "the probe wrote");
        assert!(
            fs::read_dir(dir.path()).expect("dir").next().is_none(),
            "the probe left nothing behind"
        );
    }
}
