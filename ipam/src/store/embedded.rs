//! The embedded store: a redb file, crash-safe, every commit durable (`Durability::Immediate`, redb's default).
//!
//! Opened in redb's multi-process mode (`ConcurrencyMode::MultiWriter`), so several `weir ipam` processes and
//! an agent can share one file: each write transaction holds the file's writer lock, reads inside it are fresh,
//! so compare-and-swap holds across processes. Inside one process a writer thread group-commits: it takes every
//! queued write, runs them one after another in one write transaction, and commits once. Before committing it
//! waits briefly (at most half a commit, at most 1 ms) for as many writes as its last commit held, because the
//! callers of that commit come back with their next write just after it (see [`gather`]). Every caller still
//! waits for its own durable commit.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
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

struct Inner {
    db: Arc<Database>,
    path: PathBuf,
    counters: Arc<Counters>,
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
            .field("path", &self.inner.path)
            .finish()
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
            let mut b = Database::builder();
            b.set_concurrency_mode(match sharing {
                Sharing::Shared => ConcurrencyMode::MultiWriter,
                Sharing::Exclusive => ConcurrencyMode::ExclusiveWriter,
            });
            match b.create(path) {
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
                Err(e) => {
                    return Err(unavailable(
                        "cannot open the database file: check the path and permissions".into(),
                        Some(Box::new(e)),
                    ));
                }
            }
        };
        let db = Arc::new(db);
        init_tables(&db)
            .map_err(|e| unavailable("cannot initialise the database".into(), Some(Box::new(e))))?;
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
        let wdb = db.clone();
        let counters = Arc::new(Counters::default());
        let wcounters = Arc::clone(&counters);
        let writer = std::thread::Builder::new()
            .name("weir-ipam-redb".into())
            .spawn(move || writer_loop(&wdb, &rx, &wcounters))
            .map_err(|e| unavailable("cannot start the writer thread".into(), Some(Box::new(e))))?;
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                path: path.to_owned(),
                counters,
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(writer)),
            }),
        })
    }

    /// How many durable commits this handle made, and how many writes they held.
    pub fn commit_stats(&self) -> CommitStats {
        CommitStats {
            commits: self.inner.counters.commits.load(Ordering::Relaxed),
            writes: self.inner.counters.writes.load(Ordering::Relaxed),
        }
    }

    fn unavailable(
        &self,
        detail: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Unavailable {
            backend: "embedded",
            location: self.inner.path.display().to_string(),
            detail: detail.to_owned(),
            source: Some(Box::new(e)),
        }
    }

    fn submit(&self, job: Box<dyn Job>) -> Result<(), StoreError> {
        let tx = self.inner.tx.lock().ok().and_then(|g| g.clone());
        let gone = || StoreError::Unavailable {
            backend: "embedded",
            location: self.inner.path.display().to_string(),
            detail: "the writer thread has stopped".into(),
            source: None,
        };
        tx.ok_or_else(gone)?.send(job).map_err(|_| gone())
    }

    fn gone(&self) -> StoreError {
        StoreError::Unavailable {
            backend: "embedded",
            location: self.inner.path.display().to_string(),
            detail: "the writer thread dropped the request".into(),
            source: None,
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

fn writer_loop(db: &Database, rx: &mpsc::Receiver<Box<dyn Job>>, counters: &Counters) {
    let (mut expect, mut window) = (1usize, Duration::ZERO);
    while let Ok(first) = rx.recv() {
        let mut batch = gather(rx, first, expect, window);
        let started = Instant::now();
        let outcome = run_batch(db, &mut batch);
        expect = batch.len();
        window = (started.elapsed() / 2).min(GATHER_MAX);
        match outcome {
            Ok(results) => {
                counters.commits.fetch_add(1, Ordering::Relaxed);
                counters.writes.fetch_add(
                    results.iter().filter(|r| r.is_ok()).count() as u64,
                    Ordering::Relaxed,
                );
                for (job, r) in batch.into_iter().zip(results) {
                    job.finish(r);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, jobs = batch.len(), "embedded datastore commit failed");
                let msg = e.to_string();
                for job in batch {
                    job.finish(Err(StoreError::Unavailable {
                        backend: "embedded",
                        location: String::new(),
                        detail: format!("commit failed: {msg}"),
                        source: None,
                    }));
                }
            }
        }
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
        let r = self
            .inner
            .db
            .begin_read()
            .map_err(|e| self.unavailable("cannot read", e))?;
        let t = r
            .open_table(table(key.kind))
            .map_err(|e| self.unavailable("cannot read", e))?;
        let v = t
            .get(key.name.as_str())
            .map_err(|e| self.unavailable("cannot read", e))?;
        Ok(v.map(|g| decode(g.value())))
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let r = self
            .inner
            .db
            .begin_read()
            .map_err(|e| self.unavailable("cannot read", e))?;
        let t = r
            .open_table(table(kind))
            .map_err(|e| self.unavailable("cannot read", e))?;
        let mut out = Vec::new();
        for item in t
            .range(prefix..)
            .map_err(|e| self.unavailable("cannot read", e))?
        {
            let (k, v) = item.map_err(|e| self.unavailable("cannot read", e))?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push((k.value().to_owned(), decode(v.value())));
        }
        Ok(out)
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
