//! `--prefilter-deny-file` as a source: the file is read at start (the loop's first apply has its
//! set, or, when it is refused, leaves the deny maps as they are), then looked at every [`POLL`]; a
//! change is read and sent to the loop ([`Command::PrefilterDenyFile`]) as the parsed set or the
//! reason it was refused (the node keeps the last good set). Every read is counted for the metric
//! `weir_prefilter_deny_file_reads_total`. The file's format is the prefilter's
//! (`dataplane::prefilter::read_deny_file`). No kernel I/O.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use crate::{
    control::applier::{Command, LoopHandle},
    dataplane::prefilter::{DenyFileRead, read_deny_file},
};

/// How often the file's modification time and length are looked at.
pub const POLL: Duration = Duration::from_millis(200);

/// A cheap change detector for the deny file: (modification time, length), `None` when absent.
#[must_use]
pub fn fingerprint(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// How often the deny file was read and used or refused (the metric
/// `weir_prefilter_deny_file_reads_total`): the signal that a change to the file was seen.
#[derive(Debug, Default)]
pub struct DenyFileReads {
    /// Reads whose set was applied.
    pub applied: AtomicU64,
    /// Reads refused (the last good set stays).
    pub refused: AtomicU64,
}

/// The deny file as a source: its path, its fingerprint at the last read, and the read counters.
pub struct DenyFile {
    path: PathBuf,
    seen: Option<(SystemTime, u64)>,
    reads: Arc<DenyFileReads>,
}

impl DenyFile {
    /// Reads the file now (counted); the node starts from this read.
    pub fn first_read(path: PathBuf) -> (Self, DenyFileRead) {
        let this = Self {
            seen: fingerprint(&path),
            path,
            reads: Arc::default(),
        };
        let read = read_deny_file(&this.path);
        this.count(read.is_ok());
        (this, read)
    }

    /// The read counters, for the metrics.
    #[must_use]
    pub fn reads(&self) -> Arc<DenyFileReads> {
        Arc::clone(&self.reads)
    }

    /// The file read again when it changed since the last read (counted); `None` when not.
    pub fn poll(&mut self) -> Option<DenyFileRead> {
        let read = self.changed()?;
        self.count(read.is_ok());
        Some(read)
    }

    fn changed(&mut self) -> Option<DenyFileRead> {
        let now = fingerprint(&self.path);
        if now == self.seen {
            return None;
        }
        self.seen = now;
        Some(read_deny_file(&self.path))
    }

    fn count(&self, applied: bool) {
        let counter = if applied {
            &self.reads.applied
        } else {
            &self.reads.refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Looks at the file every [`POLL`] and sends each new read to the loop, counted once sent (a
    /// reader of the count knows the loop takes the read before anything it sends after); returns
    /// when the loop is gone.
    pub async fn run(mut self, dataplane: LoopHandle) {
        loop {
            tokio::time::sleep(POLL).await;
            let Some(read) = self.changed() else {
                continue;
            };
            let applied = read.is_ok();
            if dataplane.send(Command::PrefilterDenyFile(read)).is_err() {
                return;
            }
            self.count(applied);
        }
    }
}
