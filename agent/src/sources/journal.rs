//! An append-only journal beside a state file that is rewritten whole (the endpoint registry's
//! `endpoints.json`): a change is one line appended and synced, not a rewrite of every record.
//!
//! The journal is preallocated: created zero-filled, synced and renamed into place, so an append
//! overwrites blocks the file already has and `fdatasync` flushes that data alone (no size or
//! extent change to commit) — a fraction of a millisecond, where a durable rewrite costs a data
//! flush of the whole file and two filesystem commits (rename, directory).
//!
//! Layout: a header line `{"base":TOKEN}`, then one line per record, then zeros. The token ties
//! the journal to one version of the base file (the base names it too); a journal of another
//! token is stale and ignored. Crash cases:
//! - during an append: the record is not acknowledged (its sync did not return); what reached
//!   the disk is a prefix of the line (cut at the first zero byte), which the reader drops as
//!   torn. Only the last record can be torn: the next is written after this one's sync returned;
//! - during a compaction (the base rewritten with a new token, then a new journal): before the
//!   base's rename, the old base and its journal are intact; after it, the new base holds every
//!   record and the old journal's token no longer matches, so it is ignored; the new journal is
//!   renamed into place whole, so it is either absent (stale old one) or empty;
//! - a failed append may leave part of its line behind: the writer drops the journal, and the
//!   next change compacts (new token), so nothing is ever appended after a partial line. A line
//!   that is complete but does not parse is corruption, reported as such.

use std::{
    fs,
    io::{self, Write as _},
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// The journal of a base file `path`: `path` + `.journal`.
#[must_use]
pub fn path_of(base: &Path) -> PathBuf {
    let mut name = base.file_name().unwrap_or_default().to_owned();
    name.push(".journal");
    base.with_file_name(name)
}

#[derive(Serialize, Deserialize)]
struct Header {
    base: u64,
}

/// The complete records of the journal at `path` written for base `token`, in order. None when
/// there is no journal, or it belongs to another version of the base. A torn last line is
/// dropped.
pub fn read(path: &Path, token: u64) -> io::Result<Option<Vec<Vec<u8>>>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let used = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let mut lines = bytes[..used].split_inclusive(|b| *b == b'\n');
    let header = lines
        .next()
        .and_then(|line| line.strip_suffix(b"\n"))
        .and_then(|line| serde_json::from_slice::<Header>(line).ok());
    if header.is_none_or(|h| h.base != token) {
        return Ok(None);
    }
    Ok(Some(
        lines
            .filter_map(|line| line.strip_suffix(b"\n"))
            .map(<[u8]>::to_vec)
            .collect(),
    ))
}

/// A journal open for appends.
pub struct Journal {
    file: fs::File,
    offset: u64,
    capacity: u64,
}

impl Journal {
    /// Replaces the journal at `path` with an empty one for base `token`, with room for at least
    /// `capacity` bytes of records: written zero-filled beside it, synced, renamed into place,
    /// directory synced.
    pub fn create(path: &Path, token: u64, capacity: u64) -> io::Result<Self> {
        let mut header = serde_json::to_vec(&Header { base: token }).map_err(io::Error::other)?;
        header.push(b'\n');
        let offset = header.len() as u64;
        let size = (offset + capacity).next_multiple_of(4096);
        let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
        tmp_name.push(".tmp");
        let tmp = path.with_file_name(tmp_name);
        let mut file = fs::File::create(&tmp)?;
        file.write_all(&header)?;
        let zeros = vec![0u8; 1 << 16];
        let mut left = size - offset;
        while left > 0 {
            let n = left.min(zeros.len() as u64);
            file.write_all(&zeros[..usize::try_from(n).unwrap_or(zeros.len())])?;
            left -= n;
        }
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::File::open(dir)?.sync_all()?;
        }
        let file = fs::OpenOptions::new().write(true).open(path)?;
        Ok(Self {
            file,
            offset,
            capacity: size,
        })
    }

    /// Appends `record` (one line, no newline inside) durably. False when it does not fit: the
    /// caller compacts instead. After an error the journal must not be appended to again.
    pub fn append(&mut self, record: &[u8]) -> io::Result<bool> {
        let len = record.len() as u64 + 1;
        // Keep one zero byte after the last record: the reader's end mark.
        if self.offset + len >= self.capacity {
            return Ok(false);
        }
        let mut line = Vec::with_capacity(record.len() + 1);
        line.extend_from_slice(record);
        line.push(b'\n');
        self.file.write_all_at(&line, self.offset)?;
        self.file.sync_data()?;
        self.offset += len;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_the_base_are_read_back_and_a_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("state.json.journal");
        assert_eq!(read(&path, 7).expect("absent"), None);
        let mut j = Journal::create(&path, 7, 100).expect("create");
        assert_eq!(read(&path, 7).expect("empty"), Some(Vec::new()));
        assert!(j.append(b"{\"a\":1}").expect("one"));
        assert!(j.append(b"{\"b\":2}").expect("two"));
        let records = read(&path, 7).expect("read").expect("ours");
        assert_eq!(records, vec![b"{\"a\":1}".to_vec(), b"{\"b\":2}".to_vec()]);
        assert_eq!(
            read(&path, 8).expect("other"),
            None,
            "another base's journal"
        );
        // A record that does not fit (the room is rounded up to 4 KiB) is refused, nothing
        // written.
        assert!(!j.append(&[b'x'; 5000]).expect("full"));
        // A torn append: part of a line, no newline.
        let size = fs::metadata(&path).expect("meta").len();
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        let end = fs::read(&path)
            .expect("bytes")
            .iter()
            .position(|b| *b == 0)
            .expect("end");
        f.write_all_at(b"{\"c\":", end as u64).expect("torn");
        assert_eq!(read(&path, 7).expect("read").expect("ours").len(), 2);
        assert_eq!(
            fs::metadata(&path).expect("meta").len(),
            size,
            "preallocated"
        );
    }
}
