//! The test seam for storage faults: a redb backend over the real file that fails writes, size changes and
//! syncs (and, when asked, reads) with an injected errno, as a full disk or a failing device does.

use std::{
    fs::OpenOptions,
    io,
    ops::Bound,
    path::Path,
    sync::{Arc, Mutex, PoisonError},
};

use redb::{Builder, Database, DatabaseError, StorageBackend, backends::FileBackend};

/// What the injected backend fails: nothing, or every write (and, with `reads`, every read) with `errno`.
#[derive(Clone, Copy, Debug, Default)]
struct Fault {
    errno: Option<i32>,
    reads: bool,
}

/// Turns faults on and off for every database opened through it.
#[derive(Clone, Debug, Default)]
pub(super) struct Injector(Arc<Mutex<Fault>>);

impl Injector {
    /// Writes, size changes and syncs fail with `errno` (a full disk: `ENOSPC`) until [`Self::clear`].
    pub(super) fn fail_writes(&self, errno: i32) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Fault {
            errno: Some(errno),
            reads: false,
        };
    }

    /// Every operation, reads too, fails with `errno` (a device gone bad) until [`Self::clear`].
    pub(super) fn fail_everything(&self, errno: i32) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Fault {
            errno: Some(errno),
            reads: true,
        };
    }

    /// The storage works again.
    pub(super) fn clear(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Fault::default();
    }

    fn check(&self, read: bool) -> io::Result<()> {
        let f = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match f.errno {
            Some(errno) if !read || f.reads => Err(io::Error::from_raw_os_error(errno)),
            _ => Ok(()),
        }
    }

    /// Opens the database at `path` as `b.create(path)` does, through the injecting backend.
    pub(super) fn create(&self, b: &Builder, path: &Path) -> Result<Database, DatabaseError> {
        self.check(true)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        b.create_with_backend(Injected {
            file: FileBackend::new(file)?,
            injector: self.clone(),
        })
    }
}

#[derive(Debug)]
struct Injected {
    file: FileBackend,
    injector: Injector,
}

impl StorageBackend for Injected {
    fn len(&self) -> Result<u64, io::Error> {
        self.injector.check(true)?;
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.injector.check(true)?;
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.injector.check(false)?;
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.injector.check(false)?;
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.injector.check(false)?;
        self.file.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.file.close()
    }

    fn try_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.file.query_lock_range(start, end)
    }
}
