//! The one in-memory fake of the kernel seam (`kernel`), for unit tests only: a [`FakeKernel`]
//! implements every seam trait (its maps are [`FakeMap`]s), and injects faults: every write
//! dropped for a while, one link's attachments failing, a conntrack read paused mid-sweep, a link
//! watch that cannot open or whose event stream ends or fails (a dead watcher), a conntrack
//! migration crashing at a failpoint (`fake_ct`).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    hash::Hash,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
};

use attach::AttachMode;
use aya::{maps::MapError, programs::TcAttachType};
use maps_schema::{
    CtEntry,
    conntrack::{Ct4Key, Ct6Key},
};

use super::kernel::{
    Attacher, CountersIo, CtIo, Hook, KernelError, LinkEvent, LinkIo, LinkStream, LinkWatch,
    LinkWatchError, MapIo, PinIo, SysctlIo, XdpIo,
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
        let mut inner = self.lock();
        if inner.fail_writes > 0 {
            inner.fail_writes -= 1;
            return Err(KernelError::MapOp {
                map: self.name.clone(),
                op: "write",
                source: Box::new(MapError::KeyNotFound),
            });
        }
        inner.entries.insert(key.clone(), value.clone());
        inner.mutations += 1;
        Ok(())
    }

    fn delete(&mut self, key: &K) -> Result<(), KernelError> {
        if self.faults.drop_all.load(Ordering::Relaxed) {
            return Err(injected(&self.name));
        }
        let mut inner = self.lock();
        if inner.entries.remove(key).is_some() {
            inner.mutations += 1;
        }
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

/// The routing side: weir's routes (its protocol only), and destinations whose writes fail.
#[derive(Default)]
pub(crate) struct RouteTable {
    pub(crate) routes: BTreeMap<ipnetwork::IpNetwork, super::kernel::NextHop>,
    pub(crate) failing: BTreeSet<ipnetwork::IpNetwork>,
}

/// One fake kernel: every seam trait over shared in-memory state. Clones share it.
#[derive(Clone, Default)]
pub(crate) struct FakeKernel {
    pub(crate) links: Arc<Mutex<LinkTable>>,
    /// The conntrack pins the migration works on (`fake_ct`).
    #[cfg(test)]
    pub(crate) ct_pins: Arc<Mutex<super::fake_ct::CtPins>>,
    faults: Arc<Faults>,
    pub(crate) tc: Arc<Mutex<TcState>>,
    pub(crate) xdp: Arc<Mutex<XdpState>>,
    pub(crate) ct: Arc<Mutex<CtState>>,
    routes: Arc<Mutex<RouteTable>>,
    /// The VXLAN side (`fake_vxlan`).
    pub(crate) vxlan: Arc<Mutex<super::fake_vxlan::VxlanTable>>,
    counters: Arc<Mutex<HashMap<u32, (u64, u64)>>>,
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
    pub(crate) fn vxlan_table(&self) -> MutexGuard<'_, super::fake_vxlan::VxlanTable> {
        lock(&self.vxlan)
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
        if !s.interfaces.contains(ifname) {
            return Err(KernelError::Io {
                op: "attach the prefilter to",
                what: ifname.to_owned(),
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        let id = s.current;
        s.defunct.remove(ifname);
        Ok(match s.pins.insert(ifname.to_owned(), id) {
            Some(_) => AttachMode::Replaced,
            None => AttachMode::NewLink,
        })
    }
    fn unpin(&mut self, ifname: &str) -> Result<(), KernelError> {
        if self.dropping() {
            return Err(injected(ifname));
        }
        self.xdp().pins.remove(ifname);
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
    fn capacity(&self) -> (u64, u64) {
        let c = self.ct().capacity;
        (c, c)
    }
    fn created(&self) -> Option<[u64; 2]> {
        Some(self.ct().created)
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

impl super::kernel::RouteIo for FakeKernel {
    fn dump(
        &mut self,
    ) -> Result<BTreeMap<ipnetwork::IpNetwork, super::kernel::NextHop>, super::kernel::RouteError>
    {
        Ok(self.routes().routes.clone())
    }

    fn replace(
        &mut self,
        dest: ipnetwork::IpNetwork,
        hop: super::kernel::NextHop,
    ) -> Result<(), super::kernel::RouteError> {
        let mut t = self.routes();
        if t.failing.contains(&dest) || self.dropping() {
            return Err(super::kernel::RouteError::Netlink {
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
        _: super::kernel::NextHop,
    ) -> Result<(), super::kernel::RouteError> {
        if self.dropping() {
            return Err(super::kernel::RouteError::Netlink {
                op: "delete",
                dest: dest.to_string(),
                source: std::io::Error::other("injected fault"),
            });
        }
        self.routes().routes.remove(&dest);
        Ok(())
    }
}
