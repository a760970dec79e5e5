//! `--prefilter-deny-file` as a source: the file is read at start (the loop's first apply has its
//! set, or, when it is refused, leaves the deny maps as they are), then looked at every [`POLL`]; a
//! change is read and sent to the loop ([`Command::PrefilterDenyFile`]) as the parsed set or the
//! reason it was refused (the node keeps the last good set). Every read is counted for the metric
//! `weir_prefilter_deny_file_reads_total`. No kernel I/O.

use std::{
    fs, io,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use ipnetwork::IpNetwork;

use crate::control::applier::{Command, LoopHandle};

/// How often the file's modification time and length are looked at.
pub const POLL: Duration = Duration::from_millis(200);

/// A deny file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DenyFileError {
    /// The file cannot be read.
    #[error("cannot read the prefilter deny file {path}: {source}; check --prefilter-deny-file")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A line is not a CIDR.
    #[error(
        "{path}:{line}: {text:?} is not a CIDR (write one address or CIDR per line, such as 192.0.2.0/24 or 2001:db8::/32; # starts a comment)"
    )]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
}

/// One CIDR as the operator writes it (`192.0.2.0/24`, a bare address is a /32 or /128),
/// normalised to its network address.
#[must_use]
pub fn parse_cidr(text: &str) -> Option<IpNetwork> {
    let net: IpNetwork = text.trim().parse().ok()?;
    IpNetwork::new(net.network(), net.prefix()).ok()
}

/// The CIDRs of a deny file: one per line; blank lines and `#` comments are skipped.
pub fn read_deny_file(path: &Path) -> Result<Vec<IpNetwork>, DenyFileError> {
    let text = fs::read_to_string(path).map_err(|source| DenyFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        out.push(parse_cidr(line).ok_or_else(|| DenyFileError::Line {
            path: path.to_owned(),
            line: i + 1,
            text: line.to_owned(),
        })?);
    }
    Ok(out)
}

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

/// One read of the file: its CIDRs, or why it was refused.
pub type DenyFileRead = Result<Vec<IpNetwork>, DenyFileError>;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        parse_cidr(s).expect("cidr")
    }

    #[test]
    fn a_bad_line_names_the_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("deny");
        fs::write(&path, "# deny list\n10.0.0.0/8\n\n2001:db8::/32 # docs\n").expect("write");
        let got = read_deny_file(&path).expect("valid file");
        assert_eq!(got, vec![net("10.0.0.0/8"), net("2001:db8::/32")]);
        fs::write(&path, "10.0.0.0/8\n10.0.0.300/8\n").expect("write");
        let err = read_deny_file(&path).expect_err("bad line").to_string();
        assert!(err.contains(&format!("{}:2:", path.display())), "{err}");
    }
}
