//! Group commit for etcd: read-modify-writes of one process share transactions.
//!
//! Several callers of one host that each read a block and compare-and-swap it race each other: only one CAS of
//! a round wins, the others re-decide and try again, and the tail latency grows with every round lost. Instead,
//! a committer task takes every read-modify-write waiting (as many as fit in one txn: [`ETCD_MAX_TXN_OPS`] keys),
//! reads all their keys in one read-only txn, runs their decisions one after another on those values (each sees
//! the writes of the ones before it), and writes everything in one conditional txn. A lost CAS (another process
//! wrote) re-decides every job on the values the failure branch returned. While one round is in flight the
//! next requests queue and go together in the next round; a second round may be in flight beside it
//! when its jobs share no key with the first ([`PIPELINE`]), so a queue does not wait out a whole fsync. Keys the committer itself wrote are not read again:
//! a txn's writes all get its revision, so their value and `mod_revision` are known; if another process wrote
//! them since, the CAS fails and its failure branch supplies the current values. A handle key never seen is
//! assumed absent (allocations create new ones) and not read; the CAS checks that too. Every caller still gets its answer only once the
//! transaction that holds its write has committed.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::{Cas, ETCD_MAX_TXN_OPS, EtcdStore};
use crate::store::{Key, Kind, Op, RMW_RETRIES, StoreError, Versioned, Write};

/// A read-modify-write waiting for a round.
pub(super) trait Job: Send {
    fn keys(&self) -> &[Key];
    /// Decides on the current values of [`Job::keys`], in order.
    fn decide(&mut self, values: &[Option<Vec<u8>>]) -> Vec<Write>;
    fn finish(self: Box<Self>, result: Result<(), StoreError>);
    /// When the job was queued.
    fn queued(&self) -> Instant;
}

pub(super) struct RmwJob<T, F> {
    pub(super) keys: Vec<Key>,
    pub(super) f: F,
    pub(super) out: Option<T>,
    pub(super) reply: Option<oneshot::Sender<Result<T, StoreError>>>,
    pub(super) queued: Instant,
}

impl<T, F> Job for RmwJob<T, F>
where
    T: Send + 'static,
    F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send + 'static,
{
    fn keys(&self) -> &[Key] {
        &self.keys
    }

    fn decide(&mut self, values: &[Option<Vec<u8>>]) -> Vec<Write> {
        let (writes, out) = (self.f)(values);
        self.out = Some(out);
        writes
    }

    fn finish(mut self: Box<Self>, result: Result<(), StoreError>) {
        let Some(reply) = self.reply.take() else {
            return;
        };
        let msg = match (result, self.out.take()) {
            (Ok(()), Some(out)) => Ok(out),
            (Err(e), _) => Err(e),
            (Ok(()), None) => Err(StoreError::Conflict {
                key: "read-modify-write (never decided)".into(),
            }),
        };
        // A caller that stopped waiting is gone; its write committed or not like everyone else's.
        let _ = reply.send(msg);
    }

    fn queued(&self) -> Instant {
        self.queued
    }
}

/// Where the time of etcd read-modify-writes went, summed since the store was connected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EtcdStats {
    /// Read-modify-writes answered.
    pub jobs: u64,
    /// Rounds (one read txn, then one or more CAS txns).
    pub rounds: u64,
    /// CAS txns sent.
    pub cas_txns: u64,
    /// CAS txns that lost (another writer changed a key): each one is a retry of its round.
    pub lost: u64,
    /// Nanoseconds jobs waited in the queue before their round started, summed over jobs.
    pub queued_ns: u64,
    /// Nanoseconds spent in read txns, summed over rounds.
    pub read_ns: u64,
    /// Nanoseconds spent in CAS txns (retries included), summed over rounds.
    pub cas_ns: u64,
    /// Plain reads (`get`, `list`) that went to etcd (not the settings cache), and their nanoseconds.
    pub reads: u64,
    /// See `reads`.
    pub reads_ns: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    jobs: AtomicU64,
    rounds: AtomicU64,
    cas_txns: AtomicU64,
    lost: AtomicU64,
    queued_ns: AtomicU64,
    read_ns: AtomicU64,
    cas_ns: AtomicU64,
    pub(super) reads: AtomicU64,
    pub(super) reads_ns: AtomicU64,
    samples: Mutex<Samples>,
}

/// Durations in microseconds, for percentiles: per job (queued to answered), per read txn, per round's CAS.
#[derive(Default)]
struct Samples {
    job: Vec<u32>,
    read: Vec<u32>,
    cas: Vec<u32>,
}

/// Samples kept per kind at most (later ones are not recorded).
const MAX_SAMPLES: usize = 200_000;

fn sample(v: &mut Vec<u32>, since: Instant) {
    if v.len() < MAX_SAMPLES {
        v.push(u32::try_from(since.elapsed().as_micros()).unwrap_or(u32::MAX));
    }
}

/// Percentiles (milliseconds) of etcd read-modify-writes since the store was connected.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EtcdPercentiles {
    /// A read-modify-write from its call to its answer (queue, read txn and CAS txn).
    pub write_ms: f64,
    /// One read txn.
    pub read_txn_ms: f64,
    /// One round's CAS txns (retries included).
    pub cas_txn_ms: f64,
}

fn percentile(v: &[u32], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut sorted = v.to_vec();
    sorted.sort_unstable();
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)]) / 1000.0
}

fn nanos(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Counters {
    pub(super) fn snapshot(&self) -> EtcdStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EtcdStats {
            jobs: g(&self.jobs),
            rounds: g(&self.rounds),
            cas_txns: g(&self.cas_txns),
            lost: g(&self.lost),
            queued_ns: g(&self.queued_ns),
            read_ns: g(&self.read_ns),
            cas_ns: g(&self.cas_ns),
            reads: g(&self.reads),
            reads_ns: g(&self.reads_ns),
        }
    }

    pub(super) fn percentiles(&self, q: f64) -> EtcdPercentiles {
        let s = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        EtcdPercentiles {
            write_ms: percentile(&s.job, q),
            read_txn_ms: percentile(&s.read, q),
            cas_txn_ms: percentile(&s.cas, q),
        }
    }

    fn samples(&self) -> std::sync::MutexGuard<'_, Samples> {
        self.samples.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn read(&self, since: Instant) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.reads_ns.fetch_add(nanos(since), Ordering::Relaxed);
    }
}

/// Rounds in flight at once. A second round takes the jobs that queued while the first waits for etcd's fsync, so
/// they no longer wait a whole round before theirs starts; rounds in flight never share a key (a job touching a
/// key of a round in flight waits for it), so each round decides on values no other round in flight can change.
const PIPELINE: usize = 2;

/// A round that finished: its jobs with their results, and what it learned of its keys.
type Finished = (Vec<Box<dyn Job>>, Vec<Result<(), StoreError>>, Known);

/// The committer task. `store` must not hold the queue's sender (the task ends when every sender is gone).
pub(super) async fn committer(store: EtcdStore, mut rx: mpsc::UnboundedReceiver<Box<dyn Job>>) {
    let mut waiting: VecDeque<Box<dyn Job>> = VecDeque::new();
    let mut known = Known::default();
    let mut busy: BTreeSet<Key> = BTreeSet::new();
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        while in_flight.len() < PIPELINE {
            let batch = next_batch(&mut waiting, &busy);
            if batch.is_empty() {
                break;
            }
            let mut keys: Vec<Key> = Vec::new();
            for job in &batch {
                for k in job.keys() {
                    if !keys.contains(k) {
                        keys.push(k.clone());
                    }
                }
            }
            busy.extend(keys.iter().cloned());
            let mut local = known.take(&keys);
            let store = store.clone();
            in_flight.push(async move {
                let mut batch = batch;
                let results = round(&store, &mut batch, &mut local).await;
                (batch, results, local)
            });
        }
        if !open && waiting.is_empty() && in_flight.is_empty() {
            return;
        }
        tokio::select! {
            job = rx.recv(), if open => match job {
                Some(j) => {
                    waiting.push_back(j);
                    while let Ok(j) = rx.try_recv() {
                        waiting.push_back(j);
                    }
                }
                None => open = false,
            },
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                let (batch, results, local): Finished = done;
                for job in &batch {
                    for k in job.keys() {
                        busy.remove(k);
                    }
                }
                known.merge(local);
                for (job, r) in batch.into_iter().zip(results) {
                    sample(&mut store.counters.samples().job, job.queued());
                    job.finish(r);
                }
            }
        }
    }
}

/// The jobs of the next round, in queue order: as many as fit in one txn ([`ETCD_MAX_TXN_OPS`] keys), none
/// touching a key of a round in flight. A job left waiting reserves its keys, so no later job on one of them
/// overtakes it.
fn next_batch(waiting: &mut VecDeque<Box<dyn Job>>, busy: &BTreeSet<Key>) -> Vec<Box<dyn Job>> {
    let mut keys: BTreeSet<Key> = BTreeSet::new();
    let mut reserved: BTreeSet<Key> = BTreeSet::new();
    let mut batch = Vec::new();
    let mut left = VecDeque::with_capacity(waiting.len());
    let mut full = false;
    while let Some(j) = waiting.pop_front() {
        let blocked = full
            || j.keys()
                .iter()
                .any(|k| busy.contains(k) || reserved.contains(k));
        let more = j.keys().iter().filter(|k| !keys.contains(*k)).count();
        if blocked || keys.len() + more > ETCD_MAX_TXN_OPS {
            full |= !blocked && !batch.is_empty();
            reserved.extend(j.keys().iter().cloned());
            left.push_back(j);
            continue;
        }
        keys.extend(j.keys().iter().cloned());
        batch.push(j);
    }
    *waiting = left;
    batch
}

/// Values (with their revisions) of keys as this committer last saw or wrote them.
#[derive(Default)]
struct Known(BTreeMap<Key, Option<Versioned>>);

impl Known {
    /// How many keys are remembered at most (then the memory starts over).
    const MAX: usize = 16_384;

    fn remember(&mut self, key: &Key, value: Option<Versioned>) {
        if self.0.len() >= Self::MAX && !self.0.contains_key(key) {
            self.0.clear();
        }
        self.0.insert(key.clone(), value);
    }

    /// Moves what is known of `keys` out, for a round that owns them until it ends.
    fn take(&mut self, keys: &[Key]) -> Known {
        Known(keys.iter().filter_map(|k| self.0.remove_entry(k)).collect())
    }

    /// Takes back what a round knows of its keys after it ended.
    fn merge(&mut self, round: Known) {
        for (k, v) in round.0 {
            self.remember(&k, v);
        }
    }
}

/// One round: one read txn for the keys not known, the decisions in order, one CAS txn (again on a lost race).
async fn round(
    store: &EtcdStore,
    batch: &mut [Box<dyn Job>],
    known: &mut Known,
) -> Vec<Result<(), StoreError>> {
    let c = &store.counters;
    let started = Instant::now();
    for job in batch.iter() {
        c.queued_ns.fetch_add(
            u64::try_from(started.duration_since(job.queued()).as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
    c.rounds.fetch_add(1, Ordering::Relaxed);
    c.jobs.fetch_add(batch.len() as u64, Ordering::Relaxed);
    let mut keys: Vec<Key> = Vec::new();
    for job in batch.iter() {
        for k in job.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let fail_all = |e: StoreError, n: usize| -> Vec<Result<(), StoreError>> {
        let what = e.to_string();
        let mut first = Some(e);
        (0..n)
            .map(|_| {
                Err(first.take().unwrap_or_else(|| StoreError::Unavailable {
                    backend: "etcd",
                    location: store.endpoints.clone(),
                    detail: format!("the transaction this write shared failed: {what}"),
                    source: None,
                }))
            })
            .collect()
    };
    // A handle key the committer has not seen is almost always new (one per allocation): it is assumed absent
    // instead of read, and the CAS checks that it is (a lost CAS supplies its value and the round decides
    // again). Every other unknown key is read.
    let (assumed, unknown): (Vec<Key>, Vec<Key>) = keys
        .iter()
        .filter(|k| !known.0.contains_key(*k))
        .cloned()
        .partition(|k| k.kind == Kind::Handle);
    let mut fetched = BTreeMap::new();
    if !unknown.is_empty() {
        let t = Instant::now();
        // The first read is serializable (no consensus round); the CAS catches anything stale.
        let read = store.read_all(&unknown, true).await;
        c.read_ns.fetch_add(nanos(t), Ordering::Relaxed);
        sample(&mut c.samples().read, t);
        match read {
            Ok(values) => fetched.extend(unknown.into_iter().zip(values)),
            Err(e) => return fail_all(e, batch.len()),
        }
    }
    let mut read: Vec<Option<Versioned>> = keys
        .iter()
        .map(|k| {
            fetched
                .remove(k)
                .or_else(|| known.0.get(k).cloned())
                .flatten()
        })
        .collect();
    let t = Instant::now();
    let outcome = decide_and_commit(store, batch, &keys, &mut read, &assumed).await;
    c.cas_ns.fetch_add(nanos(t), Ordering::Relaxed);
    sample(&mut c.samples().cas, t);
    match outcome {
        Ok(after) => {
            for (k, v) in keys.iter().zip(after) {
                match v {
                    Some(v) => known.remember(k, v),
                    // Assumed absent and never checked: nothing was learned of it.
                    None => {
                        known.0.remove(k);
                    }
                }
            }
            batch.iter().map(|_| Ok(())).collect()
        }
        Err(e) => {
            for k in &keys {
                known.0.remove(k);
            }
            fail_all(e, batch.len())
        }
    }
}

/// Decides every job on `read` and commits; returns each key's value after the commit, `None` for a key assumed
/// absent that no txn checked (nothing was learned of it). A key no job wrote nor used ([`Write::Unread`]) gets no
/// op. A round that writes nothing but used a key of `assumed` (assumed absent, not read) still runs its checks
/// as a txn, so no job's decision rests on an unverified absence.
async fn decide_and_commit(
    store: &EtcdStore,
    batch: &mut [Box<dyn Job>],
    keys: &[Key],
    read: &mut [Option<Versioned>],
    assumed: &[Key],
) -> Result<Vec<Option<Option<Versioned>>>, StoreError> {
    let mut assumed: BTreeSet<&Key> = assumed.iter().collect();
    let c = &store.counters;
    for _ in 0..RMW_RETRIES {
        let mut current: BTreeMap<&Key, Option<Vec<u8>>> = keys
            .iter()
            .zip(read.iter())
            .map(|(k, v)| (k, v.as_ref().map(|v| v.value.clone())))
            .collect();
        let mut written: BTreeSet<&Key> = BTreeSet::new();
        let mut used: BTreeSet<&Key> = BTreeSet::new();
        for job in batch.iter_mut() {
            let values: Vec<Option<Vec<u8>>> = job
                .keys()
                .iter()
                .map(|k| current.get(k).cloned().flatten())
                .collect();
            let mut writes = job.decide(&values);
            let job_keys = job.keys().to_vec();
            // A write left out means the key is kept, and so used.
            writes.resize(job_keys.len(), Write::Keep);
            for (k, w) in job_keys.iter().zip(writes) {
                // The round's own reference to the key (the job's borrow ends with this loop).
                let Some(key) = keys.iter().find(|x| *x == k) else {
                    continue;
                };
                if w != Write::Unread {
                    used.insert(key);
                }
                match w {
                    Write::Keep | Write::Unread => {}
                    Write::Put(v) => {
                        current.insert(key, Some(v));
                        written.insert(key);
                    }
                    Write::Delete => {
                        if current.get(key).is_some_and(Option::is_some) {
                            current.insert(key, None);
                            written.insert(key);
                        }
                    }
                }
            }
        }
        let ops = plan(keys, read, &current, &written, &used);
        let unverified = |k: &Key, checked: bool| assumed.contains(k) && !checked;
        if !used.iter().any(|k| assumed.contains(*k))
            && ops.iter().all(|o| matches!(o, Op::Check { .. }))
        {
            return Ok(keys
                .iter()
                .zip(read.iter())
                .map(|(k, seen)| (!unverified(k, false)).then(|| seen.clone()))
                .collect());
        }
        c.cas_txns.fetch_add(1, Ordering::Relaxed);
        match store.cas(&ops).await? {
            Cas::Applied(revision) => {
                return Ok(keys
                    .iter()
                    .zip(read.iter())
                    .map(|(k, seen)| {
                        if written.contains(k) {
                            Some(
                                current
                                    .get(k)
                                    .cloned()
                                    .flatten()
                                    .map(|value| Versioned { value, revision }),
                            )
                        } else {
                            (!unverified(k, used.contains(k))).then(|| seen.clone())
                        }
                    })
                    .collect());
            }
            // The failure branch read every key linearizably: decide again on that.
            // Keys the txn had no op on keep what was known of them (and stay assumed if they were).
            Cas::Lost(now) => {
                c.lost.fetch_add(1, Ordering::Relaxed);
                for (op, v) in ops.iter().zip(now) {
                    if let Some(i) = keys.iter().position(|k| k == op.key()) {
                        read[i] = v;
                        assumed.remove(op.key());
                    }
                }
            }
        }
    }
    Err(StoreError::Conflict {
        key: keys.first().map(ToString::to_string).unwrap_or_default(),
    })
}

/// The round's txn: every key written is created, updated or deleted on the revision read; every other key a
/// decision used is checked at it; a key no decision used gets no op.
fn plan(
    keys: &[Key],
    read: &[Option<Versioned>],
    current: &BTreeMap<&Key, Option<Vec<u8>>>,
    written: &BTreeSet<&Key>,
    used: &BTreeSet<&Key>,
) -> Vec<Op> {
    keys.iter()
        .zip(read)
        .filter(|(key, _)| used.contains(key) || written.contains(key))
        .map(|(key, seen)| {
            let revision = seen.as_ref().map(|v| v.revision);
            let key_owned = key.clone();
            if !written.contains(key) {
                return Op::Check {
                    key: key_owned,
                    revision,
                };
            }
            match (current.get(key).cloned().flatten(), revision) {
                (Some(value), None) => Op::Create {
                    key: key_owned,
                    value,
                },
                (Some(value), Some(revision)) => Op::Update {
                    key: key_owned,
                    value,
                    revision,
                },
                (None, Some(revision)) => Op::Delete {
                    key: key_owned,
                    revision,
                },
                (None, None) => Op::Check {
                    key: key_owned,
                    revision: None,
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Revision;

    struct Fake(Vec<Key>, Instant);

    impl Job for Fake {
        fn keys(&self) -> &[Key] {
            &self.0
        }
        fn decide(&mut self, _: &[Option<Vec<u8>>]) -> Vec<Write> {
            Vec::new()
        }
        fn finish(self: Box<Self>, _: Result<(), StoreError>) {}
        fn queued(&self) -> Instant {
            self.1
        }
    }

    fn key(name: &str) -> Key {
        Key::new(Kind::Block, name)
    }

    fn job(names: &[&str]) -> Box<dyn Job> {
        Box::new(Fake(names.iter().map(|n| key(n)).collect(), Instant::now()))
    }

    fn names(jobs: &[Box<dyn Job>]) -> Vec<String> {
        jobs.iter()
            .map(|j| {
                j.keys()
                    .iter()
                    .map(|k| k.name.clone())
                    .collect::<Vec<_>>()
                    .join("+")
            })
            .collect()
    }

    #[test]
    fn a_job_on_a_busy_key_waits_and_reserves_its_keys_for_the_queue_order() {
        let mut waiting: VecDeque<Box<dyn Job>> =
            [job(&["a"]), job(&["b", "c"]), job(&["c"]), job(&["d", "a"])].into();
        let busy: BTreeSet<Key> = [key("b")].into();
        let batch = next_batch(&mut waiting, &busy);
        assert_eq!(names(&batch), ["a", "d+a"]);
        let left: Vec<Box<dyn Job>> = waiting.into_iter().collect();
        assert_eq!(names(&left), ["b+c", "c"]);
    }

    #[test]
    fn an_unread_key_gets_no_op_and_a_used_one_is_checked() {
        let keys = [key("w"), key("used"), key("unread")];
        let seen = |r: u64| {
            Some(Versioned {
                value: b"v".to_vec(),
                revision: Revision(r),
            })
        };
        let read = [seen(1), seen(2), None];
        let current: BTreeMap<&Key, Option<Vec<u8>>> = [
            (&keys[0], Some(b"new".to_vec())),
            (&keys[1], Some(b"v".to_vec())),
            (&keys[2], None),
        ]
        .into();
        let written: BTreeSet<&Key> = [&keys[0]].into();
        let used: BTreeSet<&Key> = [&keys[0], &keys[1]].into();
        let ops = plan(&keys, &read, &current, &written, &used);
        assert_eq!(
            ops,
            [
                Op::Update {
                    key: key("w"),
                    value: b"new".to_vec(),
                    revision: Revision(1)
                },
                Op::Check {
                    key: key("used"),
                    revision: Some(Revision(2))
                },
            ]
        );
    }
}
