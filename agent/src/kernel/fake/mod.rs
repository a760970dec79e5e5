//! The one in-memory fake of the kernel seam (`kernel`), for unit tests only: a [`FakeKernel`]
//! implements every seam trait (its maps are [`FakeMap`]s), and injects faults: every write
//! dropped for a while, one link's attachments failing, a conntrack read paused mid-sweep, a link
//! watch that cannot open or whose event stream ends or fails (a dead watcher), a conntrack
//! migration crashing at a failpoint (`ct`).

#[cfg(test)]
pub(crate) mod ct;
#[cfg(test)]
pub(crate) mod masq;
pub(crate) mod vxlan;
// Host routing, socket LB and `weir uninstall`.
#[cfg(test)]
pub(crate) mod host_fwd;
#[cfg(test)]
pub(crate) mod socket_lb;
#[cfg(test)]
pub(crate) mod uninstall;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    hash::Hash,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use attach::AttachMode;
use aya::{maps::MapError, programs::TcAttachType};
use maps_schema::{
    CtEntry,
    conntrack::{Ct4Key, Ct6Key},
};

use crate::kernel::{
    Attacher, CountersIo, CtIo, Hook, InspectIo, KernelError, LinkEvent, LinkIo, LinkStream,
    LinkWatch, LinkWatchError, MapIo, MapMeta, PinIo, RecordStream, SysctlIo, TraceIo,
    TraceIoError, XdpIo,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Faults shared by every part of one fake kernel.
#[derive(Default)]
struct Faults {
    /// Every map write, delete, attach, update, sweep and unpin fails while set.
    drop_all: AtomicBool,
}

fn injected(what: &str) -> KernelError {
    KernelError::Io {
        op: "write",
        what: what.to_owned(),
        source: std::io::Error::other("fault injected by the fake kernel"),
    }
}

struct Inner<K, V> {
    entries: HashMap<K, V>,
    mutations: u64,
    fail_writes: u32,
    /// Every key written or deleted, in order.
    touched: Vec<K>,
    /// How long each write takes (a slow kernel).
    delay: Duration,
    /// False once the pin was removed from outside (`unpin`), until the driver re-pins it.
    pinned: bool,
}

/// A fake map; clones share contents, so a test can inspect what a driver wrote.
pub(crate) struct FakeMap<K, V> {
    name: String,
    inner: Arc<Mutex<Inner<K, V>>>,
    faults: Arc<Faults>,
}

impl<K, V> Clone for FakeMap<K, V> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            inner: Arc::clone(&self.inner),
            faults: Arc::clone(&self.faults),
        }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> FakeMap<K, V> {
    /// A map of its own (no shared faults).
    pub(crate) fn new(name: &str) -> Self {
        Self::with_faults(name, Arc::default())
    }

    fn with_faults(name: &str, faults: Arc<Faults>) -> Self {
        Self {
            name: name.to_owned(),
            inner: Arc::new(Mutex::new(Inner {
                entries: HashMap::new(),
                mutations: 0,
                fail_writes: 0,
                touched: Vec::new(),
                delay: Duration::ZERO,
                pinned: true,
            })),
            faults,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K, V>> {
        lock(&self.inner)
    }

    /// Contents as if an earlier run had written them (not counted as mutations).
    pub(crate) fn preload(&self, entries: &[(K, V)]) {
        self.lock().entries.extend(entries.iter().cloned());
    }

    /// Every entry, in no particular order.
    pub(crate) fn unordered(&self) -> Vec<(K, V)> {
        self.lock()
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Every entry, sorted by key.
    pub(crate) fn contents(&self) -> Vec<(K, V)>
    where
        K: Ord,
    {
        let mut all = self.unordered();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    pub(crate) fn mutations(&self) -> u64 {
        self.lock().mutations
    }

    pub(crate) fn fail_next_writes(&self, n: u32) {
        self.lock().fail_writes = n;
    }

    /// Keys written or deleted so far.
    pub(crate) fn touched(&self) -> usize {
        self.lock().touched.len()
    }

    /// Every key written or deleted since the `from`th, in order.
    pub(crate) fn touched_since(&self, from: usize) -> Vec<K> {
        self.lock().touched[from..].to_vec()
    }

    /// Every later write takes `delay`.
    pub(crate) fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Removes the map's pin, as `rm` on bpffs would (the map itself lives on).
    pub(crate) fn unpin(&self) {
        self.lock().pinned = false;
    }

    /// True while the map's pin is in place.
    pub(crate) fn is_pinned(&self) -> bool {
        self.lock().pinned
    }

    /// Changes an entry from outside (not counted as a mutation of the driver's).
    pub(crate) fn tamper(&self, key: K, value: Option<V>) {
        let mut inner = self.lock();
        match value {
            Some(v) => inner.entries.insert(key, v),
            None => inner.entries.remove(&key),
        };
    }
}

impl<K: Eq + Hash + Clone + Send, V: Clone + Send> MapIo<K, V> for FakeMap<K, V> {
    fn name(&self) -> &str {
        &self.name
    }

    fn read_all(&self) -> Result<Vec<(K, V)>, KernelError> {
        Ok(self.unordered())
    }

    fn write(&mut self, key: &K, value: &V) -> Result<(), KernelError> {
        if self.faults.drop_all.load(Ordering::Relaxed) {
            return Err(injected(&self.name));
        }
        let delay = {
            let mut inner = self.lock();
            if inner.fail_writes > 0 {
                inner.fail_writes -= 1;
                return Err(KernelError::MapOp {
                    map: self.name.clone(),
                    op: "write",
                    source: Box::new(MapError::KeyNotFound),
                });
            }
            inner.delay
        };
        if !delay.is_zero() {
            // Outside the lock: readers of the map are not slowed down.
            std::thread::sleep(delay);
        }
        let mut inner = self.lock();
        inner.entries.insert(key.clone(), value.clone());
        inner.touched.push(key.clone());
        inner.mutations += 1;
        Ok(())
    }

    fn delete(&mut self, key: &K) -> Result<(), KernelError> {
        if self.faults.drop_all.load(Ordering::Relaxed) {
            return Err(injected(&self.name));
        }
        let mut inner = self.lock();
        if inner.entries.remove(key).is_some() {
            inner.touched.push(key.clone());
            inner.mutations += 1;
        }
        Ok(())
    }

    fn pin_present(&self) -> bool {
        self.is_pinned()
    }

    fn repin(&mut self) -> Result<(), KernelError> {
        if self.faults.drop_all.load(Ordering::Relaxed) {
            return Err(injected(&self.name));
        }
        self.lock().pinned = true;
        Ok(())
    }
}

/// The tc side: pins map (ifname, program) → program id; `attached` holds (ifindex, hook, id) of
/// live attachments; `other` holds (ifname, program) attachments of the other mechanism.
#[derive(Default)]
pub(crate) struct TcState {
    pub(crate) pins: BTreeMap<(String, String), u32>,
    pub(crate) attached: BTreeSet<(u32, String, u32)>,
    pub(crate) other: BTreeSet<(String, String)>,
    pub(crate) current: u32,
    pub(crate) ifindex: BTreeMap<String, u32>,
    pub(crate) ops: u32,
    /// Interfaces whose attach, update and sweep fail.
    pub(crate) failing: BTreeSet<String>,
}

/// The XDP side: interface → program id of its pinned prefilter link.
#[derive(Default)]
pub(crate) struct XdpState {
    pub(crate) pins: BTreeMap<String, u32>,
    pub(crate) current: u32,
    pub(crate) interfaces: BTreeSet<String>,
    /// Pins whose link lost its interface (deleted and recreated under the same name).
    pub(crate) defunct: BTreeSet<String>,
    /// Interfaces whose attach fails (an injected fault).
    pub(crate) failing: BTreeSet<String>,
    /// Every attach and unpin that succeeded.
    pub(crate) mutations: u32,
}

/// The conntrack side.
#[derive(Default)]
pub(crate) struct CtState {
    pub(crate) ct4: HashMap<Ct4Key, CtEntry>,
    pub(crate) ct6: HashMap<Ct6Key, CtEntry>,
    pub(crate) created: [u64; 2],
    pub(crate) capacity: u64,
    /// When set, the next IPv4 read, once it has read, reports on the first channel and waits on
    /// the second.
    pub(crate) pause: Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>,
    /// The translated flows' entries (`svc_ct4`).
    pub(crate) services4: HashMap<maps_schema::SvcCt4Key, maps_schema::SvcCt4Entry>,
}

impl CtState {
    /// The programs created an IPv4 entry.
    pub(crate) fn create4(&mut self, key: Ct4Key, entry: CtEntry) {
        self.ct4.insert(key, entry);
        self.created[0] += 1;
    }
}

/// The link watching side: node addresses, live watches and their faults (the links themselves
/// are `TcState::ifindex`).
#[derive(Default)]
pub(crate) struct LinkTable {
    /// Node addresses: (ifindex, address).
    pub(crate) addresses: BTreeSet<(u32, std::net::IpAddr)>,
    /// Workload links administratively down.
    pub(crate) down: BTreeSet<String>,
    /// The event streams of live watches.
    watchers: Vec<tokio::sync::mpsc::UnboundedSender<Result<LinkEvent, LinkWatchError>>>,
    /// The next this many watches fail to open.
    pub(crate) fail_opens: u32,
    /// Watches opened.
    pub(crate) opened: u32,
}

impl LinkTable {
    fn notify(&mut self, event: &LinkEvent) {
        self.watchers.retain(|w| w.send(Ok(event.clone())).is_ok());
    }
}

/// The trace side: the nonce, and what each program answers a trace run.
#[derive(Default)]
pub(crate) struct TraceState {
    /// The trace map's nonce (0: not yet created).
    pub(crate) nonce: u64,
    /// Program → the (reason, rule id) it answers; a program not named does not answer.
    pub(crate) answers: BTreeMap<&'static str, (u32, u32)>,
    /// Each run: (program, the context's ifindex, its nonce's low half).
    pub(crate) runs: Vec<(&'static str, u32, u32)>,
}

/// The routing side: weir's routes (its protocol only), and destinations whose writes fail.
#[derive(Default)]
pub(crate) struct RouteTable {
    pub(crate) routes: BTreeMap<ipnetwork::IpNetwork, crate::kernel::NextHop>,
    pub(crate) failing: BTreeSet<ipnetwork::IpNetwork>,
}

/// One fake kernel: every seam trait over shared in-memory state. Clones share it.
#[derive(Clone, Default)]
pub(crate) struct FakeKernel {
    pub(crate) links: Arc<Mutex<LinkTable>>,
    /// The conntrack pins the migration works on (`ct`).
    #[cfg(test)]
    pub(crate) ct_pins: Arc<Mutex<crate::kernel::fake::ct::CtPins>>,
    faults: Arc<Faults>,
    pub(crate) tc: Arc<Mutex<TcState>>,
    pub(crate) xdp: Arc<Mutex<XdpState>>,
    pub(crate) ct: Arc<Mutex<CtState>>,
    routes: Arc<Mutex<RouteTable>>,
    /// The VXLAN side (`vxlan`).
    pub(crate) vxlan: Arc<Mutex<crate::kernel::fake::vxlan::VxlanTable>>,
    /// The NAT map `InspectIo::nat` reads (created on first use).
    nat: Arc<Mutex<Option<FakeMap<maps_schema::Nat4Key, maps_schema::Nat4Entry>>>>,
    /// The masquerade's events (`nat_events_v1`), as the programs would have counted them.
    pub(crate) nat_events: Arc<Mutex<[u64; crate::kernel::NAT_EVENTS]>>,
    /// The masquerade side (`masq`).
    #[cfg(test)]
    pub(crate) masq: Arc<Mutex<crate::kernel::fake::masq::MasqTable>>,
    /// Host routing, socket LB and `weir uninstall` (`host_fwd`, `socket_lb`, `uninstall`).
    #[cfg(test)]
    pub(crate) host_fwd: Arc<Mutex<crate::kernel::fake::host_fwd::HostFwdTable>>,
    #[cfg(test)]
    pub(crate) socket_lb: Arc<Mutex<crate::kernel::fake::socket_lb::SocketLbTable>>,
    #[cfg(test)]
    pub(crate) uninstall: Arc<Mutex<crate::kernel::fake::uninstall::UninstallTable>>,
    counters: Arc<Mutex<HashMap<u32, (u64, u64)>>>,
    rule_hits: Arc<Mutex<HashMap<u32, (u64, u64)>>>,
    maps: Arc<Mutex<BTreeMap<String, MapMeta>>>,
    programs: Arc<Mutex<BTreeMap<String, u32>>>,
    trace: Arc<Mutex<TraceState>>,
    /// The readers of the drop events ring.
    drop_readers: Arc<Mutex<Vec<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>>>,
    sysctls: Arc<Mutex<BTreeMap<String, String>>>,
    pins: Arc<Mutex<BTreeSet<String>>>,
    pins_failing: Arc<Mutex<BTreeSet<String>>>,
}

impl FakeKernel {
    /// A map of this kernel (it shares the kernel's faults).
    pub(crate) fn map<K: Eq + Hash + Clone, V: Clone>(&self, name: &str) -> FakeMap<K, V> {
        FakeMap::with_faults(name, Arc::clone(&self.faults))
    }

    /// While `on`, every kernel write fails.
    pub(crate) fn drop_all_writes(&self, on: bool) {
        self.faults.drop_all.store(on, Ordering::Relaxed);
    }

    pub(crate) fn dropping(&self) -> bool {
        self.faults.drop_all.load(Ordering::Relaxed)
    }

    pub(crate) fn tc(&self) -> MutexGuard<'_, TcState> {
        lock(&self.tc)
    }

    pub(crate) fn xdp(&self) -> MutexGuard<'_, XdpState> {
        lock(&self.xdp)
    }

    pub(crate) fn ct(&self) -> MutexGuard<'_, CtState> {
        lock(&self.ct)
    }

    /// The route table.
    pub(crate) fn routes(&self) -> MutexGuard<'_, RouteTable> {
        lock(&self.routes)
    }

    /// The VXLAN side: underlays, the device, its addresses and entries.
    pub(crate) fn vxlan_table(&self) -> MutexGuard<'_, crate::kernel::fake::vxlan::VxlanTable> {
        lock(&self.vxlan)
    }

    /// The NAT map `InspectIo::nat` reads; clones share it.
    pub(crate) fn nat_map(&self) -> FakeMap<maps_schema::Nat4Key, maps_schema::Nat4Entry> {
        lock(&self.nat)
            .get_or_insert_with(|| self.map(maps_schema::maps::NAT4))
            .clone()
    }

    /// The masquerade side: interfaces, link pins, program ids.
    #[cfg(test)]
    pub(crate) fn masq_table(&self) -> MutexGuard<'_, crate::kernel::fake::masq::MasqTable> {
        lock(&self.masq)
    }

    /// The host routing side: the program array's slots, the pinned programs.
    #[cfg(test)]
    pub(crate) fn host_fwd(&self) -> MutexGuard<'_, crate::kernel::fake::host_fwd::HostFwdTable> {
        lock(&self.host_fwd)
    }

    /// The socket LB side: cgroups, link pins, the scope.
    #[cfg(test)]
    pub(crate) fn socket_lb(
        &self,
    ) -> MutexGuard<'_, crate::kernel::fake::socket_lb::SocketLbTable> {
        lock(&self.socket_lb)
    }

    /// The uninstall side: interfaces, filters, files.
    #[cfg(test)]
    pub(crate) fn uninstall_table(
        &self,
    ) -> MutexGuard<'_, crate::kernel::fake::uninstall::UninstallTable> {
        lock(&self.uninstall)
    }

    /// The link table (addresses, faults).
    pub(crate) fn link_table(&self) -> MutexGuard<'_, LinkTable> {
        lock(&self.links)
    }

    /// A link appears (live watches report it if it is a workload link).
    pub(crate) fn add_link(&self, ifname: &str, ifindex: u32) {
        let mut s = self.tc();
        s.ifindex.insert(ifname.to_owned(), ifindex);
        if is_workload(ifname) {
            let mut links = self.link_table();
            let up = !links.down.contains(ifname);
            links.notify(&LinkEvent::Up {
                ifname: ifname.to_owned(),
                ifindex,
                up,
            });
        }
    }

    /// A link disappears (with its attachments, as the kernel does).
    pub(crate) fn remove_link(&self, ifname: &str) {
        let mut s = self.tc();
        if let Some(ifindex) = s.ifindex.remove(ifname) {
            s.attached.retain(|(i, _, _)| *i != ifindex);
            if is_workload(ifname) {
                self.link_table().notify(&LinkEvent::Gone {
                    ifname: ifname.to_owned(),
                });
            }
        }
    }

    /// A node address appears on (or leaves) interface `ifindex`.
    pub(crate) fn set_address(&self, ifindex: u32, addr: std::net::IpAddr, present: bool) {
        let _order = self.tc();
        let mut links = self.link_table();
        let changed = if present {
            links.addresses.insert((ifindex, addr))
        } else {
            links.addresses.remove(&(ifindex, addr))
        };
        if changed {
            links.notify(&LinkEvent::Address {
                ifindex,
                addr,
                present,
            });
        }
    }

    /// Every live watch's event stream ends (`error`: with that error first): a dead watcher.
    pub(crate) fn end_link_watches(&self, error: Option<&str>) {
        for w in std::mem::take(&mut self.link_table().watchers) {
            if let Some(e) = error {
                let _closed = w.send(Err(LinkWatchError::Stream(std::io::Error::other(
                    e.to_owned(),
                ))));
            }
        }
    }

    /// The dump a watch starts from: an `Up` per workload link, an `Address` per node address.
    fn link_dump(tc: &TcState, links: &LinkTable) -> Vec<LinkEvent> {
        let ups =
            tc.ifindex
                .iter()
                .filter(|(name, _)| is_workload(name))
                .map(|(ifname, ifindex)| LinkEvent::Up {
                    ifname: ifname.clone(),
                    ifindex: *ifindex,
                    up: !links.down.contains(ifname),
                });
        let addresses = links
            .addresses
            .iter()
            .map(|(ifindex, addr)| LinkEvent::Address {
                ifindex: *ifindex,
                addr: *addr,
                present: true,
            });
        ups.chain(addresses).collect()
    }

    /// The link watcher's initial dump over this kernel's links and addresses, then `Synced` —
    /// the events `link_source` sends for a watch that starts now.
    pub(crate) fn link_events(&self) -> Vec<LinkEvent> {
        let tc = self.tc();
        let mut out = Self::link_dump(&tc, &self.link_table());
        out.push(LinkEvent::Synced);
        out
    }

    /// Counter slots: index → (packets, bytes).
    pub(crate) fn counters(&self) -> MutexGuard<'_, HashMap<u32, (u64, u64)>> {
        lock(&self.counters)
    }

    /// The trace side.
    pub(crate) fn trace(&self) -> MutexGuard<'_, TraceState> {
        lock(&self.trace)
    }

    /// Rule hit slots: rule id → (packets, bytes).
    pub(crate) fn rule_hits(&self) -> MutexGuard<'_, HashMap<u32, (u64, u64)>> {
        lock(&self.rule_hits)
    }

    /// The pinned maps' metadata: name → metadata.
    pub(crate) fn map_metas(&self) -> MutexGuard<'_, BTreeMap<String, MapMeta>> {
        lock(&self.maps)
    }

    /// The pinned programs: name → kernel id.
    pub(crate) fn program_ids(&self) -> MutexGuard<'_, BTreeMap<String, u32>> {
        lock(&self.programs)
    }

    /// The programs write one record into the drop events ring (every open reader gets it).
    pub(crate) fn push_drop_event(&self, record: &[u8]) {
        lock(&self.drop_readers).retain(|r| r.send(record.to_vec()).is_ok());
    }

    /// Readers of the drop events ring open now.
    pub(crate) fn drop_readers(&self) -> usize {
        lock(&self.drop_readers)
            .iter()
            .filter(|r| !r.is_closed())
            .count()
    }

    /// `/proc/sys` as written: path → value.
    pub(crate) fn sysctls(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        lock(&self.sysctls)
    }

    /// Map pin names.
    pub(crate) fn pins(&self) -> MutexGuard<'_, BTreeSet<String>> {
        lock(&self.pins)
    }

    /// Map pins whose removal fails.
    pub(crate) fn pins_failing(&self) -> MutexGuard<'_, BTreeSet<String>> {
        lock(&self.pins_failing)
    }

    /// Interfaces that exist: name → index.
    pub(crate) fn interfaces(&self) -> BTreeMap<String, u32> {
        self.tc().ifindex.clone()
    }

    /// Attachment operations done (attach, update, sweep, unpin).
    pub(crate) fn tc_ops(&self) -> u32 {
        self.tc().ops
    }

    /// Interfaces on which both endpoint programs are live (pinned and attached there).
    pub(crate) fn attached_links(&self) -> BTreeSet<String> {
        let s = self.tc();
        let live = |ifname: &String, ifindex: u32| {
            s.pins
                .iter()
                .filter(|((n, _), id)| {
                    n == ifname && s.attached.iter().any(|(i, _, a)| *i == ifindex && a == *id)
                })
                .count()
        };
        s.ifindex
            .iter()
            .filter(|(n, i)| live(n, **i) == crate::attach::endpoint::ENDPOINT_PROGRAMS.len())
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn tc_write(&self, ifname: &str) -> Result<MutexGuard<'_, TcState>, KernelError> {
        let s = self.tc();
        if self.dropping() || s.failing.contains(ifname) {
            return Err(injected(ifname));
        }
        Ok(s)
    }
}

fn is_workload(ifname: &str) -> bool {
    ifname.starts_with(maps_schema::programs::WORKLOAD_LINK_PREFIX)
}

impl LinkIo for FakeKernel {
    fn watch(&self) -> futures_util::future::BoxFuture<'_, Result<LinkWatch, LinkWatchError>> {
        // Subscribed and dumped under the same locks: no event is missed or reported twice.
        let tc = self.tc();
        let mut links = self.link_table();
        let result = if links.fail_opens > 0 {
            links.fail_opens -= 1;
            Err(LinkWatchError::Socket(std::io::Error::other(
                "fault injected by the fake kernel",
            )))
        } else {
            links.opened += 1;
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            links.watchers.push(tx);
            let events: LinkStream = Box::pin(futures_util::stream::unfold(rx, |mut rx| async {
                rx.recv().await.map(|e| (e, rx))
            }));
            Ok(LinkWatch {
                dump: Self::link_dump(&tc, &links),
                events,
            })
        };
        Box::pin(std::future::ready(result))
    }
}

fn key(ifname: &str, program: &str) -> (String, String) {
    (ifname.to_owned(), program.to_owned())
}

impl Attacher for FakeKernel {
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError> {
        Ok(self.tc().pins.keys().cloned().collect())
    }
    fn has_pin(&self, ifname: &str, program: &str) -> bool {
        self.tc().pins.contains_key(&key(ifname, program))
    }
    fn hook(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<Hook, KernelError> {
        let s = self.tc();
        let pinned = s.pins.get(&key(ifname, program)).copied();
        let ours = pinned.filter(|id| s.attached.contains(&(ifindex, format!("{hook:?}"), *id)));
        Ok(Hook {
            ours,
            leftovers: (pinned.is_some() && ours.is_none())
                || s.other.contains(&key(ifname, program)),
        })
    }
    fn current(&self, _program: &str) -> u32 {
        self.tc().current
    }
    fn link_exists(&self, ifname: &str, ifindex: u32) -> bool {
        self.tc().ifindex.get(ifname) == Some(&ifindex)
    }
    fn attach(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        let mut s = self.tc_write(ifname)?;
        let id = s.current;
        assert_eq!(s.ifindex[ifname], ifindex);
        // A stale pin at the same path is replaced by the new link's.
        s.pins.insert(key(ifname, program), id);
        s.attached.insert((ifindex, format!("{hook:?}"), id));
        s.ops += 1;
        Ok(())
    }
    fn update(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        let mut s = self.tc_write(ifname)?;
        let id = s.current;
        let old = s.pins.insert(key(ifname, program), id).expect("pinned");
        s.attached.remove(&(ifindex, format!("{hook:?}"), old));
        s.attached.insert((ifindex, format!("{hook:?}"), id));
        s.ops += 1;
        Ok(())
    }
    fn sweep(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<u64, KernelError> {
        let mut s = self.tc_write(ifname)?;
        let ours = s
            .pins
            .get(&key(ifname, program))
            .is_some_and(|id| s.attached.contains(&(ifindex, format!("{hook:?}"), *id)));
        assert!(ours, "leftovers are swept only once ours is in place");
        let removed = s.other.remove(&key(ifname, program));
        s.ops += 1;
        Ok(u64::from(removed))
    }
    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError> {
        let mut s = self.tc_write(ifname)?;
        s.pins.remove(&key(ifname, program));
        s.ops += 1;
        Ok(())
    }
}

impl XdpIo for FakeKernel {
    fn pinned(&self) -> Result<Vec<String>, KernelError> {
        Ok(self.xdp().pins.keys().cloned().collect())
    }
    fn pinned_program(&self, ifname: &str) -> Option<u32> {
        self.xdp().pins.get(ifname).copied()
    }
    fn pin_is_live(&self, ifname: &str) -> bool {
        let s = self.xdp();
        s.pins.contains_key(ifname) && s.interfaces.contains(ifname) && !s.defunct.contains(ifname)
    }
    fn current(&self) -> u32 {
        self.xdp().current
    }
    fn link_exists(&self, ifname: &str) -> bool {
        self.xdp().interfaces.contains(ifname)
    }
    fn attach(&mut self, ifname: &str) -> Result<AttachMode, KernelError> {
        if self.dropping() {
            return Err(injected(ifname));
        }
        let mut s = self.xdp();
        if s.failing.contains(ifname) {
            return Err(injected(ifname));
        }
        if !s.interfaces.contains(ifname) {
            return Err(KernelError::Io {
                op: "attach the prefilter to",
                what: ifname.to_owned(),
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        let id = s.current;
        s.defunct.remove(ifname);
        s.mutations += 1;
        Ok(match s.pins.insert(ifname.to_owned(), id) {
            Some(_) => AttachMode::Replaced,
            None => AttachMode::NewLink,
        })
    }
    fn unpin(&mut self, ifname: &str) -> Result<(), KernelError> {
        if self.dropping() {
            return Err(injected(ifname));
        }
        let mut s = self.xdp();
        s.pins.remove(ifname);
        s.mutations += 1;
        Ok(())
    }
}

impl CtIo for FakeKernel {
    fn entries4(&self) -> Result<Vec<(Ct4Key, CtEntry)>, KernelError> {
        let (entries, pause) = {
            let mut s = self.ct();
            let entries: Vec<_> = s.ct4.iter().map(|(k, v)| (*k, *v)).collect();
            (entries, s.pause.take())
        };
        if let Some((read, go)) = pause {
            // Mid-sweep, the entries read: let the test act, then go on with what was read.
            read.send(()).expect("the test waits for the read");
            go.recv().expect("the test lets the sweep go on");
        }
        Ok(entries)
    }
    fn entries6(&self) -> Result<Vec<(Ct6Key, CtEntry)>, KernelError> {
        Ok(self.ct().ct6.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn delete4(&mut self, keys: &[Ct4Key]) -> Result<u64, KernelError> {
        if self.dropping() {
            return Err(injected("ct4"));
        }
        let mut s = self.ct();
        Ok(keys.iter().filter(|k| s.ct4.remove(k).is_some()).count() as u64)
    }
    fn delete6(&mut self, keys: &[Ct6Key]) -> Result<u64, KernelError> {
        if self.dropping() {
            return Err(injected("ct6"));
        }
        let mut s = self.ct();
        Ok(keys.iter().filter(|k| s.ct6.remove(k).is_some()).count() as u64)
    }
    fn capacity(&self) -> Result<(u64, u64), KernelError> {
        let c = self.ct().capacity;
        Ok((c, c))
    }
    fn created(&self) -> Result<Option<[u64; 2]>, KernelError> {
        Ok(Some(self.ct().created))
    }
    fn service_flows4(&self) -> Result<Option<crate::kernel::ServiceFlows4>, KernelError> {
        let s = self.ct();
        let entries = s.services4.iter().map(|(k, v)| (*k, *v)).collect();
        Ok(Some((entries, s.capacity)))
    }
    fn delete_service_flows4(
        &mut self,
        keys: &[maps_schema::SvcCt4Key],
    ) -> Result<u64, KernelError> {
        if self.dropping() {
            return Err(injected(maps_schema::service_ct::SVC_CT4));
        }
        let mut s = self.ct();
        Ok(keys
            .iter()
            .filter(|k| s.services4.remove(k).is_some())
            .count() as u64)
    }
    fn nat_flows4(&self) -> Result<Vec<maps_schema::Nat4Key>, KernelError> {
        Ok(self
            .nat_map()
            .read_all()?
            .into_iter()
            .filter(|(k, _)| k.direction == maps_schema::nat::DIR_EGRESS)
            .map(|(k, _)| k)
            .collect())
    }
}

/// One fake per-CPU counter array (already summed): slot → (packets, bytes).
struct FakeArray(Arc<Mutex<HashMap<u32, (u64, u64)>>>);

impl CountersIo for FakeArray {
    fn slot(&self, index: u32) -> Result<(u64, u64), KernelError> {
        Ok(lock(&self.0).get(&index).copied().unwrap_or_default())
    }
}

fn no_pin(name: &str) -> KernelError {
    KernelError::Io {
        op: "open",
        what: format!("the pinned map {name}"),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    }
}

impl InspectIo for FakeKernel {
    fn map_meta(&self, name: &str) -> Result<MapMeta, KernelError> {
        self.map_metas()
            .get(name)
            .copied()
            .ok_or_else(|| no_pin(name))
    }
    fn program_id(&self, name: &str) -> Result<u32, KernelError> {
        self.program_ids()
            .get(name)
            .copied()
            .ok_or_else(|| no_pin(name))
    }
    fn counter_array(&self, name: &str) -> Result<Box<dyn CountersIo>, KernelError> {
        match name {
            maps_schema::maps::COUNTERS => Ok(Box::new(FakeArray(Arc::clone(&self.counters)))),
            maps_schema::maps::RULE_HITS => Ok(Box::new(FakeArray(Arc::clone(&self.rule_hits)))),
            _ => Err(no_pin(name)),
        }
    }
    fn conntrack(&self, _layout: u32) -> Box<dyn CtIo> {
        Box::new(self.clone())
    }
    fn nat(
        &self,
    ) -> Result<Box<dyn MapIo<maps_schema::Nat4Key, maps_schema::Nat4Entry>>, KernelError> {
        Ok(Box::new(self.nat_map()))
    }
    fn nat_events(&self) -> Result<Option<[u64; crate::kernel::NAT_EVENTS]>, KernelError> {
        Ok(Some(*lock(&self.nat_events)))
    }
    fn drop_events(&self) -> Result<RecordStream, KernelError> {
        if self.dropping() {
            return Err(injected(maps_schema::maps::DROP_EVENTS));
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        lock(&self.drop_readers).push(tx);
        Ok(Box::pin(futures_util::stream::unfold(rx, |mut rx| async {
            rx.recv().await.map(|r| (Ok(r), rx))
        })))
    }
}

/// Offsets in `struct __sk_buff` of the fields a trace run reads and answers in.
const SK_BUFF_IFINDEX: usize = 40;
const SK_BUFF_CB: usize = 48;

impl TraceIo for FakeKernel {
    fn trace_nonce(&self) -> Result<u64, TraceIoError> {
        let mut t = self.trace();
        if t.nonce == 0 {
            t.nonce = 0x5eed_0001;
        }
        Ok(t.nonce)
    }
    fn ifindex(&self, ifname: &str) -> Result<u32, TraceIoError> {
        self.tc()
            .ifindex
            .get(ifname)
            .copied()
            .ok_or_else(|| TraceIoError::Ifindex {
                ifname: ifname.to_owned(),
                source: nix::Error::ENODEV,
            })
    }
    fn test_run(
        &self,
        program: &'static str,
        _frame: &[u8],
        ctx: &[u8],
    ) -> Result<Vec<u8>, TraceIoError> {
        let word = |at: usize| {
            ctx.get(at..at + 4)
                .map_or(0, |w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        };
        let mut t = self.trace();
        t.runs
            .push((program, word(SK_BUFF_IFINDEX), word(SK_BUFF_CB + 4)));
        let mut out = ctx.to_vec();
        if let Some((reason, rule)) = t.answers.get(program).copied() {
            for (i, w) in [maps_schema::trace::CB_DONE, reason, rule]
                .iter()
                .enumerate()
            {
                let at = SK_BUFF_CB + 4 * i;
                out[at..at + 4].copy_from_slice(&w.to_ne_bytes());
            }
        }
        Ok(out)
    }
}

impl CountersIo for FakeKernel {
    fn slot(&self, index: u32) -> Result<(u64, u64), KernelError> {
        Ok(self.counters().get(&index).copied().unwrap_or_default())
    }
}

impl SysctlIo for FakeKernel {
    fn get(&self, path: &str) -> Option<String> {
        self.sysctls().get(path).cloned()
    }
    fn set(&mut self, path: &str, value: &str) -> Result<(), std::io::Error> {
        if self.dropping() {
            return Err(std::io::Error::other("fault injected by the fake kernel"));
        }
        self.sysctls().insert(path.to_owned(), value.to_owned());
        Ok(())
    }
}

impl PinIo for FakeKernel {
    fn map_pins(&self) -> Result<Vec<String>, KernelError> {
        Ok(self.pins().iter().cloned().collect())
    }
    fn remove_map_pin(&mut self, name: &str) -> Result<(), KernelError> {
        if self.dropping() || self.pins_failing().contains(name) {
            return Err(injected(name));
        }
        self.pins().remove(name);
        Ok(())
    }
}

impl crate::kernel::RouteIo for FakeKernel {
    fn dump(
        &mut self,
    ) -> Result<BTreeMap<ipnetwork::IpNetwork, crate::kernel::NextHop>, crate::kernel::RouteError>
    {
        Ok(self.routes().routes.clone())
    }

    fn replace(
        &mut self,
        dest: ipnetwork::IpNetwork,
        hop: crate::kernel::NextHop,
    ) -> Result<(), crate::kernel::RouteError> {
        let mut t = self.routes();
        if t.failing.contains(&dest) || self.dropping() {
            return Err(crate::kernel::RouteError::Netlink {
                op: "replace",
                dest: dest.to_string(),
                source: std::io::Error::other("injected fault"),
            });
        }
        t.routes.insert(dest, hop);
        Ok(())
    }

    fn delete(
        &mut self,
        dest: ipnetwork::IpNetwork,
        _: crate::kernel::NextHop,
    ) -> Result<(), crate::kernel::RouteError> {
        if self.dropping() {
            return Err(crate::kernel::RouteError::Netlink {
                op: "delete",
                dest: dest.to_string(),
                source: std::io::Error::other("injected fault"),
            });
        }
        self.routes().routes.remove(&dest);
        Ok(())
    }
}
