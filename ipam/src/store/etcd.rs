//! The etcd v3 store: keys under `/weir/ipam/v1/<kind>/<name>`, compare-and-swap by `mod_revision` in a txn.
//!
//! **Hot path.** A read-modify-write reads all its keys in one read-only txn and writes them in one conditional
//! txn whose failure branch returns the keys' current values, so a lost race costs no extra read. The first
//! read is serializable (served by the member, no consensus round, which under load otherwise waits behind
//! in-flight fsyncs); the compare-and-swap catches anything stale, and retries read linearizably.
//!
//! **Settings cache.** Config, pools and reservations (read by every allocation, written rarely) are kept in
//! memory, fed by etcd watches from the revision of one consistent initial read. After a write through this
//! store, reads of that kind go to etcd until the watch has applied it (read-your-writes in one process, without
//! waiting); another process's change is seen
//! once its watch event arrives (normally milliseconds). That widens, by the watch delay, the window Calico also
//! has between reading pools and writing a block; blocks stay compare-and-swap, so no address is handed out
//! twice. If a watch fails, reads go to etcd until it is re-established.
//!
//! **Group commit.** Read-modify-writes of one process share rounds (`commit`): one read txn and one CAS txn
//! for every write waiting, so writers of one host do not lose CAS races to each other. [`EtcdStore::stats`]
//! says where the time went (queue, read txn, CAS txn, lost races).

mod commit;
mod follow;

pub use commit::{EtcdPercentiles, EtcdStats};

use std::{
    collections::BTreeMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use tokio::sync::{mpsc, oneshot, watch};

use super::{Key, Kind, Op, Revision, Store, StoreError, Versioned, Write};

/// The kinds kept in the settings cache.
const CACHED: [Kind; 3] = [Kind::Config, Kind::Pool, Kind::Reservation];

#[derive(Default)]
struct Cache {
    /// Whether every cached kind is synced and watched.
    live: bool,
    /// Sync generation: bumped on every (re)sync, so a stale watch task stops writing.
    generation: u64,
    entries: BTreeMap<Kind, BTreeMap<String, Versioned>>,
}

struct Settings {
    cache: RwLock<Cache>,
    /// Per cached kind: the revision its watch has applied up to.
    seen: BTreeMap<Kind, watch::Sender<i64>>,
    /// Per cached kind: the revision of this process's last write to it.
    floor: BTreeMap<Kind, AtomicI64>,
}

impl Settings {
    fn new() -> Self {
        Self {
            cache: RwLock::new(Cache::default()),
            seen: CACHED.iter().map(|k| (*k, watch::channel(0).0)).collect(),
            floor: CACHED.iter().map(|k| (*k, AtomicI64::new(0))).collect(),
        }
    }

    /// The cached rows of `kind`, when the cache is live and has seen this process's writes to it.
    fn cached(&self, kind: Kind) -> Option<BTreeMap<String, Versioned>> {
        let (seen, floor) = (self.seen.get(&kind)?, self.floor.get(&kind)?);
        let c = self.cache.read().ok()?;
        if !c.live || *seen.borrow() < floor.load(Ordering::SeqCst) {
            return None;
        }
        c.entries.get(&kind).cloned()
    }

    fn set_aside(&self) {
        if let Ok(mut c) = self.cache.write() {
            c.live = false;
        }
    }
}

const ROOT: &str = "/weir/ipam/v1";

/// etcd's default `--max-txn-ops`: the most operations one txn may hold.
pub const ETCD_MAX_TXN_OPS: usize = 128;

/// An etcd cluster.
#[derive(Clone)]
pub struct EtcdStore {
    client: Arc<Client>,
    endpoints: String,
    settings: Arc<Settings>,
    counters: Arc<commit::Counters>,
    /// The committer's queue (`None` in the committer's own handle, so the task ends with the last store).
    commits: Option<mpsc::UnboundedSender<Box<dyn commit::Job>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

fn path(kind: Kind, name: &str) -> String {
    format!("{ROOT}/{}/{name}", kind.as_str())
}

impl EtcdStore {
    /// Connects to `endpoints` and checks that the cluster answers.
    pub async fn connect(endpoints: &[String]) -> Result<Self, StoreError> {
        let joined = endpoints.join(",");
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(10));
        let unavailable = |e: etcd_client::Error| StoreError::Unavailable {
            backend: "etcd",
            location: joined.clone(),
            detail:
                "cannot reach etcd: check that it runs and that --datastore names its client URLs"
                    .into(),
            source: Some(Box::new(e)),
        };
        let mut client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(unavailable)?;
        client.status().await.map_err(unavailable)?;
        let mut store = Self {
            client: Arc::new(client),
            endpoints: joined,
            settings: Arc::new(Settings::new()),
            counters: Arc::default(),
            commits: None,
        };
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(commit::committer(store.clone(), rx));
        store.commits = Some(queue);
        let (client, settings) = (Arc::clone(&store.client), Arc::downgrade(&store.settings));
        tokio::spawn(async move {
            loop {
                let Some(s) = settings.upgrade() else { return };
                if let Err(e) = follow_settings(&client, &s).await {
                    tracing::debug!(error = %e, "etcd settings watch ended; reading settings from etcd until it is back");
                }
                s.set_aside();
                drop(s);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Ok(store)
    }

    /// Whether the settings cache is synced and watched, so config, pool and reservation reads are
    /// served from memory (false until the first sync after connecting, and while a watch is down).
    #[must_use]
    pub fn settings_cache_live(&self) -> bool {
        self.settings.cache.read().is_ok_and(|c| c.live)
    }

    /// Where the time of this store's read-modify-writes went (summed since it was connected).
    pub fn stats(&self) -> EtcdStats {
        self.counters.snapshot()
    }

    /// The `q` quantile of this store's read-modify-write, read txn and CAS txn durations since it was connected.
    pub fn percentiles(&self, q: f64) -> EtcdPercentiles {
        self.counters.percentiles(q)
    }

    /// Records that `ops`, committed at `revision`, wrote cached kinds: the cache serves those kinds again only
    /// once its watch has applied that revision (until then reads go to etcd), so a process reads its own writes.
    fn note_writes(&self, ops: &[Op], revision: i64) {
        for kind in CACHED {
            if ops
                .iter()
                .any(|o| o.key().kind == kind && !matches!(o, Op::Check { .. }))
            {
                self.settings.floor[&kind].fetch_max(revision, Ordering::SeqCst);
            }
        }
    }

    /// Reads `keys` in one read-only txn.
    async fn read_all(
        &self,
        keys: &[Key],
        serializable: bool,
    ) -> Result<Vec<Option<Versioned>>, StoreError> {
        let opts = || serializable.then(|| GetOptions::new().with_serializable());
        let gets: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(path(k.kind, &k.name), opts()))
            .collect();
        let mut kv = self.client.kv_client();
        let resp = kv
            .txn(Txn::new().and_then(gets))
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok(first_values(&resp.op_responses()))
    }

    fn unavailable(&self, e: etcd_client::Error) -> StoreError {
        StoreError::Unavailable {
            backend: "etcd",
            location: self.endpoints.clone(),
            detail: "request failed: check that etcd runs and has quorum".into(),
            source: Some(Box::new(e)),
        }
    }
}

/// What a conditional txn did.
enum Cas {
    /// Every condition held: the writes are committed at this revision (the `mod_revision` of every key the
    /// txn wrote).
    Applied(Revision),
    /// A condition failed: nothing was written; the values of every key of the txn, read in the same txn.
    Lost(Vec<Option<Versioned>>),
}

fn rev(r: i64) -> Revision {
    Revision(u64::try_from(r).unwrap_or(0))
}

fn irev(r: Revision) -> i64 {
    i64::try_from(r.0).unwrap_or(i64::MAX)
}

/// The value of each single-key get response, in order.
fn first_values(responses: &[TxnOpResponse]) -> Vec<Option<Versioned>> {
    responses
        .iter()
        .map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| Versioned {
                value: kv.value().to_vec(),
                revision: rev(kv.mod_revision()),
            }),
            _ => None,
        })
        .collect()
}

/// Syncs the settings cache from one consistent read, then applies watch events until a watch fails.
async fn follow_settings(client: &Client, s: &Arc<Settings>) -> Result<(), etcd_client::Error> {
    let mut kv = client.kv_client();
    let gets: Vec<TxnOp> = CACHED
        .iter()
        .map(|k| TxnOp::get(path(*k, ""), Some(GetOptions::new().with_prefix())))
        .collect();
    let resp = kv.txn(Txn::new().and_then(gets)).await?;
    let at = resp
        .header()
        .map_or(0, etcd_client::ResponseHeader::revision);
    let mut entries = BTreeMap::new();
    for (kind, r) in CACHED.iter().zip(resp.op_responses()) {
        let base = path(*kind, "");
        let mut m = BTreeMap::new();
        if let TxnOpResponse::Get(g) = r {
            for kv in g.kvs() {
                if let Some(name) = std::str::from_utf8(kv.key())
                    .ok()
                    .and_then(|k| k.strip_prefix(&base))
                {
                    m.insert(
                        name.to_owned(),
                        Versioned {
                            value: kv.value().to_vec(),
                            revision: rev(kv.mod_revision()),
                        },
                    );
                }
            }
        }
        entries.insert(*kind, m);
    }
    let mut streams = Vec::new();
    let mut watcher = client.watch_client();
    for kind in CACHED {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(at + 1);
        streams.push((kind, watcher.watch(path(kind, ""), Some(opts)).await?));
    }
    let generation = {
        let mut c = s.cache.write().map_err(|_| poisoned())?;
        c.generation += 1;
        c.entries = entries;
        c.live = true;
        c.generation
    };
    for kind in CACHED {
        s.seen[&kind].send_replace(at);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (kind, mut stream) in streams {
        let s = Arc::clone(s);
        let base = path(kind, "");
        tasks.spawn(async move {
            while let Some(resp) = stream.message().await? {
                if resp.canceled() {
                    return Err(etcd_client::Error::WatchError(format!(
                        "watch canceled: {}",
                        resp.cancel_reason()
                    )));
                }
                // Only events advance what the cache has seen: a response's header revision may be ahead of the
                // events it carries (the creation response, for one).
                let mut last = 0;
                let mut c = s.cache.write().map_err(|_| poisoned())?;
                if c.generation != generation {
                    return Ok(());
                }
                let m = c.entries.entry(kind).or_default();
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    last = last.max(kv.mod_revision());
                    let Some(name) = std::str::from_utf8(kv.key())
                        .ok()
                        .and_then(|k| k.strip_prefix(&base))
                    else {
                        continue;
                    };
                    match ev.event_type() {
                        EventType::Put => {
                            m.insert(
                                name.to_owned(),
                                Versioned {
                                    value: kv.value().to_vec(),
                                    revision: rev(kv.mod_revision()),
                                },
                            );
                        }
                        EventType::Delete => {
                            m.remove(name);
                        }
                    }
                }
                drop(c);
                s.seen[&kind].send_if_modified(|r| {
                    let newer = last > *r;
                    *r = (*r).max(last);
                    newer
                });
            }
            Err(etcd_client::Error::WatchError("watch stream ended".into()))
        });
    }
    match tasks.join_next().await {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(etcd_client::Error::WatchError(format!(
            "watch task failed: {e}"
        ))),
        None => Ok(()),
    }
}

fn poisoned() -> etcd_client::Error {
    etcd_client::Error::WatchError("settings cache lock poisoned".into())
}

impl Store for EtcdStore {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    fn atomic_txn_limit(&self) -> Option<usize> {
        Some(ETCD_MAX_TXN_OPS)
    }

    async fn get(&self, key: &Key) -> Result<Option<Versioned>, StoreError> {
        if let Some(m) = self.settings.cached(key.kind) {
            return Ok(m.get(&key.name).cloned());
        }
        let mut kv = self.client.kv_client();
        let t = std::time::Instant::now();
        let resp = kv
            .get(path(key.kind, &key.name), None)
            .await
            .map_err(|e| self.unavailable(e))?;
        self.counters.read(t);
        Ok(resp.kvs().first().map(|kv| Versioned {
            value: kv.value().to_vec(),
            revision: rev(kv.mod_revision()),
        }))
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        self.list_with(kind, prefix, false).await
    }

    async fn list_relaxed(
        &self,
        kind: Kind,
        prefix: &str,
    ) -> Result<Vec<(String, Versioned)>, StoreError> {
        self.list_with(kind, prefix, true).await
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        match self.cas(&ops).await? {
            Cas::Applied(_) => Ok(()),
            Cas::Lost(_) => Err(StoreError::Conflict {
                key: ops.first().map(|o| o.key().to_string()).unwrap_or_default(),
            }),
        }
    }
    async fn read_modify_write<T, F>(&self, keys: Vec<Key>, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send + 'static,
    {
        // Cached kinds are read in the round like any other key; the compare-and-swap checks them.
        let gone = || StoreError::Unavailable {
            backend: "etcd",
            location: self.endpoints.clone(),
            detail: "the committer has stopped".into(),
            source: None,
        };
        let (reply, answer) = oneshot::channel();
        let job = commit::RmwJob {
            keys,
            f,
            out: None,
            reply: Some(reply),
            queued: std::time::Instant::now(),
        };
        self.commits
            .as_ref()
            .ok_or_else(gone)?
            .send(Box::new(job))
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

impl EtcdStore {
    /// A prefix listing, from the settings cache when it can; `serializable`: without a consensus round.
    async fn list_with(
        &self,
        kind: Kind,
        prefix: &str,
        serializable: bool,
    ) -> Result<Vec<(String, Versioned)>, StoreError> {
        if let Some(m) = self.settings.cached(kind) {
            return Ok(m
                .range(prefix.to_owned()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect());
        }
        let mut kv = self.client.kv_client();
        let base = path(kind, "");
        let t = std::time::Instant::now();
        let resp = kv
            .get(
                format!("{base}{prefix}"),
                Some(if serializable {
                    GetOptions::new().with_prefix().with_serializable()
                } else {
                    GetOptions::new().with_prefix()
                }),
            )
            .await
            .map_err(|e| self.unavailable(e))?;
        self.counters.read(t);
        let mut out: Vec<(String, Versioned)> = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key())
                    .ok()?
                    .strip_prefix(&base)?
                    .to_owned();
                Some((
                    name,
                    Versioned {
                        value: kv.value().to_vec(),
                        revision: rev(kv.mod_revision()),
                    },
                ))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// One conditional txn over `ops`.
    async fn cas(&self, ops: &[Op]) -> Result<Cas, StoreError> {
        let or_else: Vec<TxnOp> = ops
            .iter()
            .map(|o| TxnOp::get(path(o.key().kind, &o.key().name), None))
            .collect();
        let mut compares = Vec::with_capacity(ops.len());
        let mut actions = Vec::with_capacity(ops.len());
        for op in ops {
            let p = path(op.key().kind, &op.key().name);
            match op {
                Op::Create { value, .. } => {
                    compares.push(Compare::version(p.clone(), CompareOp::Equal, 0));
                    actions.push(TxnOp::put(p, value.clone(), None));
                }
                Op::Update {
                    value, revision, ..
                } => {
                    compares.push(Compare::mod_revision(
                        p.clone(),
                        CompareOp::Equal,
                        irev(*revision),
                    ));
                    actions.push(TxnOp::put(p, value.clone(), None));
                }
                Op::Delete { revision, .. } => {
                    compares.push(Compare::mod_revision(
                        p.clone(),
                        CompareOp::Equal,
                        irev(*revision),
                    ));
                    actions.push(TxnOp::delete(p, None));
                }
                Op::Check {
                    revision: Some(r), ..
                } => {
                    compares.push(Compare::mod_revision(p, CompareOp::Equal, irev(*r)));
                }
                Op::Check { revision: None, .. } => {
                    compares.push(Compare::version(p, CompareOp::Equal, 0));
                }
            }
        }
        let mut kv = self.client.kv_client();
        let resp = kv
            .txn(Txn::new().when(compares).and_then(actions).or_else(or_else))
            .await
            .map_err(|e| self.unavailable(e))?;
        if resp.succeeded() {
            let at = resp
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
            self.note_writes(ops, at);
            Ok(Cas::Applied(rev(at)))
        } else {
            Ok(Cas::Lost(first_values(&resp.op_responses())))
        }
    }
}
