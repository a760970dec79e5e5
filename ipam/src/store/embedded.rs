//! The embedded store: a redb file, crash-safe, every commit durable (`Durability::Immediate`, redb's default).
//!
//! Opened in redb's multi-process mode (`ConcurrencyMode::MultiWriter`), so several `weir ipam` processes and
//! an agent can share one file: each write transaction holds the file's writer lock, reads inside it are fresh,
//! so compare-and-swap holds across processes. Inside one process a writer thread group-commits: it takes every
//! queued write, runs them one after another in one write transaction, and commits once. Before committing it
//! waits briefly (at most half a commit, at most 1 ms) for as many writes as its last commit held, because the
//! callers of that commit come back with their next write just after it (see [`gather`]). Every caller still
//! waits for its own durable commit.
//!
//! Storage faults: a commit that fails with an I/O error (a full disk, `EIO`) wrote nothing (redb's commit is all
//! or nothing; the file keeps the last commit that succeeded). Its callers get an error naming the file and the
//! cause (`ENOSPC` as a full disk, with what to do); the store is degraded ([`EmbeddedStore::health`]) and, since
//! redb refuses every later operation after an I/O error, the writer closes and reopens the database at once (a
//! reopen repairs the file) so reads go on. While degraded the writer probes with an empty commit on a backoff
//! (0.25 s to 5 s) and before every request's batch; the first commit that succeeds clears the fault. No caller
//! reopens anything and nothing restarts.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use redb::{
    ConcurrencyMode, Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use tokio::sync::oneshot;

use super::{Key, Kind, Op, Revision, Store, StoreError, Versioned, Write};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const MAX_BATCH: usize = 256;

fn table(kind: Kind) -> TableDefinition<'static, &'static str, &'static [u8]> {
    TableDefinition::new(kind.as_str())
}

fn encode(rev: u64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + value.len());
    v.extend_from_slice(&rev.to_le_bytes());
    v.extend_from_slice(value);
    v
}

fn decode(raw: &[u8]) -> Versioned {
    let (r, v) = raw.split_at(raw.len().min(8));
    let mut b = [0u8; 8];
    b[..r.len()].copy_from_slice(r);
    Versioned {
        value: v.to_vec(),
        revision: Revision(u64::from_le_bytes(b)),
    }
}

trait Job: Send {
    /// Runs inside the shared write transaction. `Ok(Err(_))`: this job is refused and wrote nothing;
    /// `Err(_)`: the storage failed and the whole transaction is abandoned.
    fn apply(
        &mut self,
        txn: &WriteTransaction,
        rev: &mut u64,
    ) -> Result<Result<(), StoreError>, redb::Error>;
    fn finish(self: Box<Self>, result: Result<(), StoreError>);
}

fn read_in(txn: &WriteTransaction, key: &Key) -> Result<Option<Versioned>, redb::Error> {
    let t = txn.open_table(table(key.kind))?;
    Ok(t.get(key.name.as_str())?.map(|g| decode(g.value())))
}

fn put_in(
    txn: &WriteTransaction,
    key: &Key,
    value: &[u8],
    rev: &mut u64,
) -> Result<(), redb::Error> {
    *rev += 1;
    let mut t = txn.open_table(table(key.kind))?;
    t.insert(key.name.as_str(), encode(*rev, value).as_slice())?;
    Ok(())
}

fn delete_in(txn: &WriteTransaction, key: &Key) -> Result<(), redb::Error> {
    let mut t = txn.open_table(table(key.kind))?;
    t.remove(key.name.as_str())?;
    Ok(())
}

struct TxnJob {
    ops: Vec<Op>,
    reply: Option<oneshot::Sender<Result<(), StoreError>>>,
}

impl Job for TxnJob {
    fn apply(
        &mut self,
        txn: &WriteTransaction,
        rev: &mut u64,
    ) -> Result<Result<(), StoreError>, redb::Error> {
        for op in &self.ops {
            let cur = read_in(txn, op.key())?.map(|v| v.revision);
            let ok = match op {
                Op::Create { .. } => cur.is_none(),
                Op::Update { revision, .. } | Op::Delete { revision, .. } => cur == Some(*revision),
                Op::Check { revision, .. } => cur == *revision,
            };
            if !ok {
                return Ok(Err(StoreError::Conflict {
                    key: op.key().to_string(),
                }));
            }
        }
        for op in &self.ops {
            match op {
                Op::Create { key, value } | Op::Update { key, value, .. } => {
                    put_in(txn, key, value, rev)?;
                }
                Op::Delete { key, .. } => delete_in(txn, key)?,
                Op::Check { .. } => {}
            }
        }
        Ok(Ok(()))
    }

    fn finish(mut self: Box<Self>, result: Result<(), StoreError>) {
        if let Some(r) = self.reply.take() {
            let _ = r.send(result);
        }
    }
}

struct RmwJob<T, F> {
    keys: Vec<Key>,
    f: F,
    out: Option<T>,
    reply: Option<oneshot::Sender<Result<T, StoreError>>>,
}

impl<T, F> Job for RmwJob<T, F>
where
    T: Send + 'static,
    F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send + 'static,
{
    fn apply(
        &mut self,
        txn: &WriteTransaction,
        rev: &mut u64,
    ) -> Result<Result<(), StoreError>, redb::Error> {
        let mut values = Vec::with_capacity(self.keys.len());
        for k in &self.keys {
            values.push(read_in(txn, k)?.map(|v| v.value));
        }
        let (writes, out) = (self.f)(&values);
        for (k, w) in self.keys.iter().zip(writes) {
            match w {
                Write::Keep | Write::Unread => {}
                Write::Put(v) => put_in(txn, k, &v, rev)?,
                Write::Delete => delete_in(txn, k)?,
            }
        }
        self.out = Some(out);
        Ok(Ok(()))
    }

    fn finish(mut self: Box<Self>, result: Result<(), StoreError>) {
        let Some(reply) = self.reply.take() else {
            return;
        };
        let msg = match (result, self.out.take()) {
            (Ok(()), Some(out)) => Ok(out),
            (Err(e), _) => Err(e),
            (Ok(()), None) => Err(StoreError::Injected {
                what: "job finished without running",
            }),
        };
        let _ = reply.send(msg);
    }
}

/// How the file is shared with other processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// redb's multi-process mode: other processes may open the file at once. Each commit is a two-phase commit
    /// (two fsyncs) and every write transaction takes the file's writer lock.
    Shared,
    /// This process alone: one fsync per commit. Other processes wait for the file (or, for `weir ipam`, go
    /// through the agent that holds it).
    Exclusive,
}

/// Commit counters of an [`EmbeddedStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Durable commits.
    pub commits: u64,
    /// Writes (transactions and read-modify-writes) those commits held.
    pub writes: u64,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    writes: AtomicU64,
}

/// Why the store's writes fail: its file, the cause, and since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreFault {
    /// The database file.
    pub path: PathBuf,
    /// What failed and what to do (`the disk is full (…): free space on …`).
    pub cause: String,
    /// The cause is a full disk (`ENOSPC`) or an exhausted disk quota (`EDQUOT`).
    pub full_disk: bool,
    /// When the first failure of this fault happened.
    pub since: SystemTime,
    /// Failed attempts (commits, reopens and probes) since then.
    pub attempts: u64,
}

/// The store's health: the fault while writes fail, and how many faults began and cleared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreHealth {
    /// Set while the store's writes fail; cleared by the first commit that succeeds again.
    pub fault: Option<StoreFault>,
    /// Faults begun since the store was opened.
    pub faults: u64,
    /// Faults that cleared (the store recovered by itself).
    pub recoveries: u64,
}

/// The shortest and the longest wait between two probes while the store is degraded.
const PROBE_MIN: Duration = Duration::from_millis(250);
const PROBE_MAX: Duration = Duration::from_secs(5);

/// What the callers and the writer thread share: the open database (none while a reopen is owed) and its health.
struct Shared {
    /// Held for reading by every read and by the writer for a batch; for writing only by a reopen.
    db: RwLock<Option<Database>>,
    path: PathBuf,
    sharing: Sharing,
    counters: Counters,
    health: Mutex<StoreHealth>,
    #[cfg(test)]
    inject: Option<faults::Injector>,
}

struct Inner {
    shared: Arc<Shared>,
    tx: Mutex<Option<mpsc::Sender<Box<dyn Job>>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(h) = self.writer.lock().ok().and_then(|mut w| w.take()) {
            let _ = h.join();
        }
    }
}

/// A redb database file.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.inner.shared.path)
            .finish()
    }
}

/// A storage failure described for the operator, and an `io::Error` of the same kind for the chain of causes.
struct Cause {
    text: String,
    full_disk: bool,
    io: Option<(Option<i32>, std::io::ErrorKind)>,
}

impl Cause {
    fn of_io(e: &std::io::Error, path: &Path) -> Self {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let (text, full_disk) = match (e.raw_os_error(), e.kind()) {
            (Some(ENOSPC), _) | (None, std::io::ErrorKind::StorageFull) => (
                format!(
                    "the disk is full ({e}): free space on the filesystem holding {}; the store resumes by itself \
                     once a write succeeds, and nothing it stored was lost",
                    dir.display()
                ),
                true,
            ),
            (Some(EDQUOT), _) | (None, std::io::ErrorKind::QuotaExceeded) => (
                format!(
                    "the disk quota is exceeded ({e}): raise the quota or free space on the filesystem holding {}; \
                     the store resumes by itself once a write succeeds, and nothing it stored was lost",
                    dir.display()
                ),
                true,
            ),
            (Some(EROFS), _) | (None, std::io::ErrorKind::ReadOnlyFilesystem) => (
                format!(
                    "the filesystem is read-only ({e}): remount {} read-write; the store resumes by itself once a \
                     write succeeds",
                    dir.display()
                ),
                false,
            ),
            _ => (
                format!(
                    "the disk failed ({e}): check the device holding {} (dmesg); the store retries by itself",
                    dir.display()
                ),
                false,
            ),
        };
        Self {
            text,
            full_disk,
            io: Some((e.raw_os_error(), e.kind())),
        }
    }

    /// The cause of a redb failure that needs the database reopened, or `None` when the failure is the request's
    /// own (a value too large, say) and the database is fine.
    fn of_redb(e: &redb::Error, path: &Path, last: Option<&StoreFault>) -> Option<Self> {
        match e {
            redb::Error::Io(io) => Some(Self::of_io(io, path)),
            redb::Error::PreviousIo | redb::Error::DatabaseClosed => Some(last.map_or_else(
                || Self {
                    text: format!(
                        "an earlier I/O error left the database unusable ({e}); it is reopened"
                    ),
                    full_disk: false,
                    io: None,
                },
                |f| Self {
                    text: f.cause.clone(),
                    full_disk: f.full_disk,
                    io: None,
                },
            )),
            redb::Error::Corrupted(_) => Some(Self {
                text: format!(
                    "the database file is damaged ({e}): it is reopened (and repaired); if this persists, restore \
                     the file from a backup"
                ),
                full_disk: false,
                io: None,
            }),
            _ => None,
        }
    }

    fn of_open(e: &redb::DatabaseError, path: &Path) -> Self {
        match e {
            redb::DatabaseError::Storage(redb::StorageError::Io(io)) => Self::of_io(io, path),
            other => Self {
                text: format!("cannot reopen the database file ({other})"),
                full_disk: false,
                io: None,
            },
        }
    }

    fn source(&self) -> Option<Box<dyn std::error::Error + Send + Sync>> {
        self.io
            .map(|(raw, kind)| -> Box<dyn std::error::Error + Send + Sync> {
                Box::new(raw.map_or_else(
                    || std::io::Error::from(kind),
                    std::io::Error::from_raw_os_error,
                ))
            })
    }
}

const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;
const EROFS: i32 = 30;

impl Shared {
    fn unavailable(
        &self,
        detail: String,
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StoreError {
        StoreError::Unavailable {
            backend: "embedded",
            location: self.path.display().to_string(),
            detail,
            source,
        }
    }

    /// The error a caller gets for a failure of `what` with `cause`.
    fn failed(&self, what: &str, cause: &Cause) -> StoreError {
        self.unavailable(format!("{what}: {}", cause.text), cause.source())
    }

    /// The error a caller gets while the store is degraded and not open.
    fn degraded(&self) -> StoreError {
        let health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        let cause = health.fault.as_ref().map_or_else(
            || "the database is being reopened".to_owned(),
            |f| f.cause.clone(),
        );
        self.unavailable(format!("writes fail, the store is degraded: {cause}"), None)
    }

    /// Records a failure: begins a fault (logged once) or counts one more attempt of the current one.
    fn record(&self, what: &str, cause: &Cause) {
        let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut health.fault {
            Some(fault) => {
                fault.attempts += 1;
                if fault.cause != cause.text {
                    tracing::warn!(path = %self.path.display(), cause = %cause.text, "the embedded datastore still fails, now for another reason");
                    fault.cause.clone_from(&cause.text);
                    fault.full_disk = cause.full_disk;
                }
            }
            None => {
                tracing::error!(path = %self.path.display(), cause = %cause.text, "the embedded datastore cannot write ({what}): allocations are degraded until a write succeeds again");
                health.faults += 1;
                health.fault = Some(StoreFault {
                    path: self.path.clone(),
                    cause: cause.text.clone(),
                    full_disk: cause.full_disk,
                    since: SystemTime::now(),
                    attempts: 1,
                });
            }
        }
    }

    /// A commit succeeded: clears the fault, if any (logged once).
    fn recovered(&self) {
        let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(fault) = health.fault.take() {
            health.recoveries += 1;
            tracing::info!(
                path = %self.path.display(),
                after_s = fault.since.elapsed().unwrap_or_default().as_secs(),
                attempts = fault.attempts,
                "the embedded datastore writes again: allocations are no longer degraded"
            );
        }
    }

    fn is_degraded(&self) -> bool {
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fault
            .is_some()
    }

    fn last_fault(&self) -> Option<StoreFault> {
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fault
            .clone()
    }

    /// Closes the database (if open) and opens it again; redb repairs a file an I/O error left unclean. Only
    /// the writer thread calls this; readers wait on the lock meanwhile.
    fn reopen(&self) -> Result<(), Cause> {
        let mut slot = self.db.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = slot.take() {
            // A close that fails leaves nothing to do: the next open repairs the file.
            if let Err(e) = old.close() {
                tracing::debug!(path = %self.path.display(), error = %e, "closing the failed database");
            }
        }
        let db = self.create().map_err(|e| Cause::of_open(&e, &self.path))?;
        *slot = Some(db);
        tracing::info!(path = %self.path.display(), "reopened the embedded datastore");
        Ok(())
    }

    fn create(&self) -> Result<Database, redb::DatabaseError> {
        let mut b = Database::builder();
        b.set_concurrency_mode(match self.sharing {
            Sharing::Shared => ConcurrencyMode::MultiWriter,
            Sharing::Exclusive => ConcurrencyMode::ExclusiveWriter,
        });
        #[cfg(test)]
        if let Some(inject) = &self.inject {
            return inject.create(&b, &self.path);
        }
        b.create(&self.path)
    }

    /// Runs `f` on the open database. While none is open (a reopen failed), asks the writer to try again first,
    /// which it does at once.
    fn read<T>(
        &self,
        store: &EmbeddedStore,
        f: impl Fn(&Database) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let run = || {
            let slot = self.db.read().unwrap_or_else(PoisonError::into_inner);
            slot.as_ref().map(&f)
        };
        let outcome = match run() {
            Some(r) => r,
            None => {
                store.probe_now();
                run().ok_or_else(|| self.degraded())?
            }
        };
        outcome.map_err(
            |e| match Cause::of_redb(&e, &self.path, self.last_fault().as_ref()) {
                Some(cause) => {
                    // The writer reopens the database; this read fails with the cause.
                    store.probe_later();
                    self.failed("cannot read", &cause)
                }
                None => self.unavailable(format!("cannot read ({e})"), Some(Box::new(e))),
            },
        )
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the database at `path`, shared with other processes ([`Sharing::Shared`]). If another
    /// process holds the file exclusively, waits up to `wait` for it to be released.
    pub fn open(path: &Path, wait: Duration) -> Result<Self, StoreError> {
        Self::open_with(path, wait, Sharing::Shared)
    }

    /// Opens (or creates) the database at `path`. If another process holds the file in a way `sharing` cannot
    /// join, waits up to `wait` for it to be released.
    pub fn open_with(path: &Path, wait: Duration, sharing: Sharing) -> Result<Self, StoreError> {
        Self::open_shared(
            Shared {
                db: RwLock::new(None),
                path: path.to_owned(),
                sharing,
                counters: Counters::default(),
                health: Mutex::new(StoreHealth::default()),
                #[cfg(test)]
                inject: None,
            },
            wait,
        )
    }

    fn open_shared(shared: Shared, wait: Duration) -> Result<Self, StoreError> {
        let path = shared.path.clone();
        let unavailable =
            |detail: String, source: Option<Box<dyn std::error::Error + Send + Sync>>| {
                StoreError::Unavailable {
                    backend: "embedded",
                    location: path.display().to_string(),
                    detail,
                    source,
                }
            };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                unavailable(
                    format!(
                        "cannot create directory {}: check the path and permissions",
                        dir.display()
                    ),
                    Some(Box::new(e)),
                )
            })?;
        }
        let deadline = Instant::now() + wait;
        let db = loop {
            match shared.create() {
                Ok(db) => break db,
                Err(redb::DatabaseError::DatabaseAlreadyOpen) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                    return Err(unavailable(
                        format!(
                            "another process holds the file and did not let go within {}s: when it is a running \
                             `weir agent`, let `weir ipam` reach it on its socket (--api-socket), or stop it",
                            wait.as_secs()
                        ),
                        None,
                    ));
                }
                Err(redb::DatabaseError::Storage(redb::StorageError::Io(e))) => {
                    let cause = Cause::of_io(&e, &path);
                    return Err(unavailable(
                        format!("cannot open the database file: {}", cause.text),
                        Some(Box::new(e)),
                    ));
                }
                Err(e) => {
                    return Err(unavailable(
                        "cannot open the database file: check the path and permissions".into(),
                        Some(Box::new(e)),
                    ));
                }
            }
        };
        init_tables(&db).map_err(|e| {
            let detail = match &e {
                redb::Error::Io(io) => {
                    format!(
                        "cannot initialise the database: {}",
                        Cause::of_io(io, &path).text
                    )
                }
                _ => "cannot initialise the database".into(),
            };
            unavailable(detail, Some(Box::new(e)))
        })?;
        *shared.db.write().unwrap_or_else(PoisonError::into_inner) = Some(db);
        let shared = Arc::new(shared);
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
        let wshared = Arc::clone(&shared);
        let writer = std::thread::Builder::new()
            .name("weir-ipam-redb".into())
            .spawn(move || writer_loop(&wshared, &rx))
            .map_err(|e| unavailable("cannot start the writer thread".into(), Some(Box::new(e))))?;
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(writer)),
            }),
        })
    }

    /// How many durable commits this handle made, and how many writes they held.
    pub fn commit_stats(&self) -> CommitStats {
        let c = &self.inner.shared.counters;
        CommitStats {
            commits: c.commits.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
        }
    }

    /// The store's health: the fault while its writes fail (a full disk, an I/O error), and how many faults
    /// began and cleared. A degraded store reopens its file and probes it by itself (every
    /// 0.25 s at first, backing off to 5 s, and at once on the next request); the first commit that succeeds
    /// clears the fault.
    pub fn health(&self) -> StoreHealth {
        self.inner
            .shared
            .health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.shared.path
    }

    fn submit(&self, job: Box<dyn Job>) -> Result<(), StoreError> {
        let tx = self.inner.tx.lock().ok().and_then(|g| g.clone());
        let gone = || {
            self.inner
                .shared
                .unavailable("the writer thread has stopped".into(), None)
        };
        tx.ok_or_else(gone)?.send(job).map_err(|_| gone())
    }

    fn gone(&self) -> StoreError {
        self.inner
            .shared
            .unavailable("the writer thread dropped the request".into(), None)
    }

    /// Asks the writer to reopen and probe now, and waits for it (a read found no open database).
    fn probe_now(&self) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if self.submit(Box::new(ProbeJob { done: Some(tx) })).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(10));
        }
    }

    /// Asks the writer to reopen and probe, without waiting (a read failed with an I/O error).
    fn probe_later(&self) {
        let _ = self.submit(Box::new(ProbeJob { done: None }));
    }
}

/// Writes nothing: its batch's commit (the revision rewritten) probes whether the store writes again.
struct ProbeJob {
    done: Option<std::sync::mpsc::SyncSender<()>>,
}

impl Job for ProbeJob {
    fn apply(
        &mut self,
        _txn: &WriteTransaction,
        _rev: &mut u64,
    ) -> Result<Result<(), StoreError>, redb::Error> {
        Ok(Ok(()))
    }

    fn finish(mut self: Box<Self>, _result: Result<(), StoreError>) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}

fn init_tables(db: &Database) -> Result<(), redb::Error> {
    // Only a new file needs its tables created: skipping the write spares every later open a commit (an fsync).
    let read = db.begin_read()?;
    if read.open_table(META).is_ok() && Kind::ALL.iter().all(|k| read.open_table(table(*k)).is_ok())
    {
        return Ok(());
    }
    drop(read);
    let txn = db.begin_write()?;
    for k in Kind::ALL {
        txn.open_table(table(k))?;
    }
    txn.open_table(META)?;
    txn.commit()?;
    Ok(())
}

/// How long the writer waits, at most, for the callers of its last commit to come back before it commits
/// without them.
const GATHER_MAX: Duration = Duration::from_micros(1_000);

/// Takes queued jobs into one batch. Callers wait for their commit and then come back with their next write, so
/// after a commit of `n` jobs about `n` jobs arrive again within a short while: rather than commit the first of
/// them alone (and make the others wait a whole extra commit), the writer gathers until it has as many jobs as
/// last time, or until half the last commit's duration (at most [`GATHER_MAX`]) has passed. A lone caller
/// (last batch of one) is never delayed.
fn gather(
    rx: &mpsc::Receiver<Box<dyn Job>>,
    first: Box<dyn Job>,
    expect: usize,
    window: Duration,
) -> Vec<Box<dyn Job>> {
    let mut batch = vec![first];
    let deadline = Instant::now() + window;
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(j) => {
                batch.push(j);
                continue;
            }
            Err(mpsc::TryRecvError::Disconnected) => break,
            Err(mpsc::TryRecvError::Empty) => {}
        }
        if batch.len() >= expect {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match rx.recv_timeout(deadline - now) {
            Ok(j) => batch.push(j),
            Err(_) => break,
        }
    }
    batch
}

/// The writer thread: group-commits the queued jobs. A commit that fails with an I/O error degrades the store:
/// the database is closed and reopened (redb refuses every later operation after one), and while degraded the
/// writer probes with an empty commit on a backoff (and before every batch), until a commit succeeds.
fn writer_loop(shared: &Shared, rx: &mpsc::Receiver<Box<dyn Job>>) {
    let (mut expect, mut window) = (1usize, Duration::ZERO);
    let mut backoff = PROBE_MIN;
    loop {
        let first = if shared.is_degraded() {
            match rx.recv_timeout(backoff) {
                Ok(job) => Some(job),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        } else {
            match rx.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            }
        };
        let mut batch = match first {
            Some(job) => gather(rx, job, expect, window),
            // Idle while degraded: an empty commit probes the store.
            None => Vec::new(),
        };
        let probing = batch.is_empty();
        let started = Instant::now();
        let outcome = commit(shared, &mut batch);
        if !probing {
            expect = batch.len();
            window = (started.elapsed() / 2).min(GATHER_MAX);
        }
        match outcome {
            Ok(results) => {
                backoff = PROBE_MIN;
                shared.counters.commits.fetch_add(1, Ordering::Relaxed);
                shared.counters.writes.fetch_add(
                    results.iter().filter(|r| r.is_ok()).count() as u64,
                    Ordering::Relaxed,
                );
                for (job, r) in batch.into_iter().zip(results) {
                    job.finish(r);
                }
            }
            Err(e) => {
                if probing {
                    backoff = (backoff * 2).min(PROBE_MAX);
                }
                for job in batch {
                    job.finish(Err(e.clone_for_caller(shared)));
                }
            }
        }
    }
}

/// Why a batch failed, for each of its callers.
enum BatchError {
    /// The storage failed: the store is degraded.
    Fault(Cause),
    /// redb refused the transaction for another reason (the database itself is fine).
    Refused(String),
}

impl BatchError {
    fn clone_for_caller(&self, shared: &Shared) -> StoreError {
        match self {
            Self::Fault(cause) => shared.failed("the commit failed and wrote nothing", cause),
            Self::Refused(e) => {
                shared.unavailable(format!("the commit failed and wrote nothing: {e}"), None)
            }
        }
    }
}

/// Reopens the database if a fault left it closed, runs the batch in one write transaction and commits it. A
/// fault is recorded and the database reopened at once (so reads go on); a success clears the fault.
fn commit(
    shared: &Shared,
    batch: &mut [Box<dyn Job>],
) -> Result<Vec<Result<(), StoreError>>, BatchError> {
    let closed = shared
        .db
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .is_none();
    if closed && let Err(cause) = shared.reopen() {
        shared.record("reopen", &cause);
        return Err(BatchError::Fault(cause));
    }
    let outcome = {
        let slot = shared.db.read().unwrap_or_else(PoisonError::into_inner);
        match slot.as_ref() {
            Some(db) => run_batch(db, batch),
            None => Err(redb::Error::DatabaseClosed),
        }
    };
    match outcome {
        Ok(results) => {
            shared.recovered();
            Ok(results)
        }
        Err(e) => match Cause::of_redb(&e, &shared.path, shared.last_fault().as_ref()) {
            Some(cause) => {
                shared.record("commit", &cause);
                // redb refuses every later operation after an I/O error: reopen now, so reads go on (the file
                // holds the last commit that succeeded; the failed one wrote nothing).
                if let Err(again) = shared.reopen() {
                    tracing::warn!(path = %shared.path.display(), cause = %again.text, "cannot reopen the embedded datastore yet; retrying");
                }
                Err(BatchError::Fault(cause))
            }
            None => {
                tracing::warn!(path = %shared.path.display(), error = %e, jobs = batch.len(), "embedded datastore commit refused");
                Err(BatchError::Refused(e.to_string()))
            }
        },
    }
}

fn run_batch(
    db: &Database,
    batch: &mut [Box<dyn Job>],
) -> Result<Vec<Result<(), StoreError>>, redb::Error> {
    let txn = db.begin_write()?;
    let mut rev = txn
        .open_table(META)?
        .get("revision")?
        .map_or(0, |g| g.value());
    let mut results = Vec::with_capacity(batch.len());
    for job in batch.iter_mut() {
        results.push(job.apply(&txn, &mut rev)?);
    }
    txn.open_table(META)?.insert("revision", rev)?;
    txn.commit()?;
    Ok(results)
}

impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn get(&self, key: &Key) -> Result<Option<Versioned>, StoreError> {
        self.inner.shared.read(self, |db| {
            let r = db.begin_read()?;
            let t = r.open_table(table(key.kind))?;
            let v = t.get(key.name.as_str())?;
            Ok(v.map(|g| decode(g.value())))
        })
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        self.inner.shared.read(self, |db| {
            let r = db.begin_read()?;
            let t = r.open_table(table(kind))?;
            let mut out = Vec::new();
            for item in t.range(prefix..)? {
                let (k, v) = item?;
                if !k.value().starts_with(prefix) {
                    break;
                }
                out.push((k.value().to_owned(), decode(v.value())));
            }
            Ok(out)
        })
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.submit(Box::new(TxnJob {
            ops,
            reply: Some(tx),
        }))?;
        rx.await.map_err(|_| self.gone())?
    }

    async fn read_modify_write<T, F>(&self, keys: Vec<Key>, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit(Box::new(RmwJob {
            keys,
            f,
            out: None,
            reply: Some(tx),
        }))?;
        rx.await.map_err(|_| self.gone())?
    }
}

#[cfg(test)]
mod faults;
#[cfg(test)]
mod tests;
