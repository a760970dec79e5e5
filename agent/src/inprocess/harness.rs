//! The in-process tier's kernel: hash maps behind the drivers' seam that record every key they
//! write, workload links whose attachments are recorded, optionally slow; and the expected kernel
//! state computed independently of the loop, by a fresh full compile of the sources on disk.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    hash::Hash,
    path::Path,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use aya::programs::TcAttachType;
use futures_util::{StreamExt as _, future::BoxFuture};
use maps_schema::{EndpointInfo, IdentityInfo, PolicyKey, PolicyValue};
use tokio::sync::mpsc;

use crate::{
    dataplane::{
        attachments::{AttachDriver, Attacher, Hook},
        endpoints::EndpointsManager,
        kernel::{KernelError, LinkIo, LinkWatch, MapIo, Prefix},
        map_driver::MapDriver,
        plane::Dataplane,
    },
    node::Node,
    paths::Paths,
    reference,
    sources::linkwatch::{LinkEvent, LinkWatchError},
};

pub(crate) use crate::reference::{AnyKey, State, policy_key};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct MapState<K, V> {
    entries: HashMap<K, V>,
    /// Every key written or deleted, in order.
    touched: Vec<K>,
    delay: Duration,
    fail_writes: u32,
}

/// One fake map; clones share it.
pub(crate) struct FakeHash<K, V> {
    name: String,
    state: Arc<Mutex<MapState<K, V>>>,
}

impl<K, V> Clone for FakeHash<K, V> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            state: Arc::clone(&self.state),
        }
    }
}

impl<K: Clone + Eq + Hash, V: Clone> FakeHash<K, V> {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            state: Arc::new(Mutex::new(MapState {
                entries: HashMap::new(),
                touched: Vec::new(),
                delay: Duration::ZERO,
                fail_writes: 0,
            })),
        }
    }

    pub(crate) fn contents(&self) -> HashMap<K, V> {
        lock(&self.state).entries.clone()
    }

    pub(crate) fn touched(&self) -> usize {
        lock(&self.state).touched.len()
    }

    pub(crate) fn touched_since(&self, from: usize) -> Vec<K> {
        lock(&self.state).touched[from..].to_vec()
    }

    pub(crate) fn set_delay(&self, delay: Duration) {
        lock(&self.state).delay = delay;
    }

    pub(crate) fn fail_next_writes(&self, n: u32) {
        lock(&self.state).fail_writes = n;
    }
}

impl<K: Clone + Eq + Hash + Send, V: Clone + Send> MapIo<K, V> for FakeHash<K, V> {
    fn name(&self) -> &str {
        &self.name
    }

    fn read_all(&self) -> Result<Vec<(K, V)>, KernelError> {
        Ok(lock(&self.state)
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn write(&mut self, key: &K, value: &V) -> Result<(), KernelError> {
        let delay = {
            let mut s = lock(&self.state);
            if s.fail_writes > 0 {
                s.fail_writes -= 1;
                return Err(KernelError::MapOp {
                    map: self.name.clone(),
                    op: "write",
                    source: Box::new(aya::maps::MapError::KeyNotFound),
                });
            }
            s.delay
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut s = lock(&self.state);
        s.entries.insert(key.clone(), value.clone());
        s.touched.push(key.clone());
        Ok(())
    }

    fn delete(&mut self, key: &K) -> Result<(), KernelError> {
        let mut s = lock(&self.state);
        if s.entries.remove(key).is_some() {
            s.touched.push(key.clone());
        }
        Ok(())
    }
}

#[derive(Default)]
struct LinkState {
    /// Interfaces that exist: name → index.
    interfaces: BTreeMap<String, u32>,
    /// (ifname, program) → (ifindex, program id) of what is attached.
    attached: BTreeMap<(String, String), (u32, u32)>,
    ops: u64,
}

/// Fake workload links and their attachments; clones share them.
#[derive(Clone, Default)]
pub(crate) struct FakeLinks(Arc<Mutex<LinkState>>);

const PROGRAM_ID: u32 = 7;

impl FakeLinks {
    pub(crate) fn add(&self, ifname: &str, ifindex: u32) {
        lock(&self.0).interfaces.insert(ifname.to_owned(), ifindex);
    }

    pub(crate) fn interfaces(&self) -> BTreeMap<String, u32> {
        lock(&self.0).interfaces.clone()
    }

    /// Kernel operations done (attach, update, unpin).
    pub(crate) fn ops(&self) -> u64 {
        lock(&self.0).ops
    }

    /// Links with both programs attached.
    pub(crate) fn attached_links(&self) -> BTreeSet<String> {
        let s = lock(&self.0);
        let per_link = |name: &String| {
            s.attached
                .iter()
                .filter(|((n, _), (i, _))| n == name && s.interfaces.get(n) == Some(i))
                .count()
        };
        s.interfaces
            .keys()
            .filter(|n| per_link(n) == 2)
            .cloned()
            .collect()
    }
}

impl Attacher for FakeLinks {
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError> {
        Ok(lock(&self.0).attached.keys().cloned().collect())
    }
    fn has_pin(&self, ifname: &str, program: &str) -> bool {
        lock(&self.0)
            .attached
            .contains_key(&(ifname.to_owned(), program.to_owned()))
    }
    fn hook(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        _hook: TcAttachType,
    ) -> Result<Hook, KernelError> {
        let s = lock(&self.0);
        let at = s.attached.get(&(ifname.to_owned(), program.to_owned()));
        Ok(Hook {
            ours: at.filter(|(i, _)| *i == ifindex).map(|(_, id)| *id),
            leftovers: false,
        })
    }
    fn current(&self, _program: &str) -> u32 {
        PROGRAM_ID
    }
    fn link_exists(&self, ifname: &str, ifindex: u32) -> bool {
        lock(&self.0).interfaces.get(ifname) == Some(&ifindex)
    }
    fn attach(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        _hook: TcAttachType,
    ) -> Result<(), KernelError> {
        let mut s = lock(&self.0);
        s.attached.insert(
            (ifname.to_owned(), program.to_owned()),
            (ifindex, PROGRAM_ID),
        );
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
        self.attach(ifname, ifindex, program, hook)
    }
    fn sweep(
        &mut self,
        _ifname: &str,
        _ifindex: u32,
        _program: &str,
        _hook: TcAttachType,
    ) -> Result<u64, KernelError> {
        Ok(0)
    }
    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError> {
        let mut s = lock(&self.0);
        s.attached.remove(&(ifname.to_owned(), program.to_owned()));
        s.ops += 1;
        Ok(())
    }
}

/// Where every fake map's write log stood.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark([usize; 6]);

/// The fake kernel: six maps and the links.
#[derive(Clone)]
pub(crate) struct FakeKernel {
    pub(crate) endpoints: FakeHash<u32, EndpointInfo>,
    pub(crate) ident4: FakeHash<[u8; 4], IdentityInfo>,
    pub(crate) ident6: FakeHash<[u8; 16], IdentityInfo>,
    pub(crate) ipcache4: FakeHash<Prefix<[u8; 4]>, IdentityInfo>,
    pub(crate) ipcache6: FakeHash<Prefix<[u8; 16]>, IdentityInfo>,
    pub(crate) policy: FakeHash<PolicyKey, PolicyValue>,
    pub(crate) links: FakeLinks,
}

impl FakeKernel {
    pub(crate) fn new() -> Self {
        use maps_schema::maps::{ENDPOINTS, IDENT4, IDENT6, IPCACHE4, IPCACHE6, POLICY};
        Self {
            endpoints: FakeHash::new(ENDPOINTS),
            ident4: FakeHash::new(IDENT4),
            ident6: FakeHash::new(IDENT6),
            ipcache4: FakeHash::new(IPCACHE4),
            ipcache6: FakeHash::new(IPCACHE6),
            policy: FakeHash::new(POLICY),
            links: FakeLinks::default(),
        }
    }

    /// Fresh drivers over this kernel (what a new agent process has).
    pub(crate) fn dataplane(&self) -> Dataplane {
        Dataplane {
            attachments: AttachDriver::new(Box::new(self.links.clone())),
            endpoints: MapDriver::new(Box::new(self.endpoints.clone())),
            endpoints_manager: EndpointsManager::new(),
            ident4: MapDriver::new(Box::new(self.ident4.clone())),
            ident6: MapDriver::new(Box::new(self.ident6.clone())),
            ipcache4: MapDriver::new(Box::new(self.ipcache4.clone())),
            ipcache6: MapDriver::new(Box::new(self.ipcache6.clone())),
            policy: MapDriver::new(Box::new(self.policy.clone())),
        }
    }

    /// Every map write slows down by `delay`.
    pub(crate) fn set_delay(&self, delay: Duration) {
        self.endpoints.set_delay(delay);
        self.ident4.set_delay(delay);
        self.ident6.set_delay(delay);
        self.ipcache4.set_delay(delay);
        self.ipcache6.set_delay(delay);
        self.policy.set_delay(delay);
    }

    pub(crate) fn state(&self) -> State {
        State {
            endpoints: self.endpoints.contents(),
            ident4: self.ident4.contents(),
            ident6: self.ident6.contents(),
            ipcache4: self.ipcache4.contents(),
            ipcache6: self.ipcache6.contents(),
            policy: self.policy.contents(),
        }
    }

    /// Map entries written or deleted so far.
    pub(crate) fn map_writes(&self) -> usize {
        self.mark().0.iter().sum()
    }

    pub(crate) fn mark(&self) -> Mark {
        Mark([
            self.endpoints.touched(),
            self.ident4.touched(),
            self.ident6.touched(),
            self.ipcache4.touched(),
            self.ipcache6.touched(),
            self.policy.touched(),
        ])
    }

    /// Every key written or deleted since `mark`, once per write (duplicates kept).
    pub(crate) fn touched_since(&self, mark: Mark) -> Vec<AnyKey> {
        let m = mark.0;
        let mut out: Vec<AnyKey> = Vec::new();
        out.extend(
            self.endpoints
                .touched_since(m[0])
                .iter()
                .map(|k| AnyKey::Endpoint(*k)),
        );
        out.extend(
            self.ident4
                .touched_since(m[1])
                .iter()
                .map(|k| AnyKey::Ident4(*k)),
        );
        out.extend(
            self.ident6
                .touched_since(m[2])
                .iter()
                .map(|k| AnyKey::Ident6(*k)),
        );
        out.extend(
            self.ipcache4
                .touched_since(m[3])
                .iter()
                .map(|k| AnyKey::Ipcache4(k.len, k.data)),
        );
        out.extend(
            self.ipcache6
                .touched_since(m[4])
                .iter()
                .map(|k| AnyKey::Ipcache6(k.len, k.data)),
        );
        out.extend(self.policy.touched_since(m[5]).iter().map(policy_key));
        out
    }
}

/// The kernel state the sources on disk call for, by a fresh full compile.
pub(crate) fn expected(paths: &Paths, links: &BTreeMap<String, u32>) -> State {
    reference::compile(paths, links).expect("the reference compile")
}

/// Paths of a node under `dir`.
pub(crate) fn paths(dir: &Path) -> Paths {
    Paths {
        state_dir: dir.join("state"),
        policy_dir: dir.join("policies"),
        api_socket: dir.join("weir.sock"),
        cni_conf_dir: dir.join("net.d"),
        ..Paths::with_bpf_root(dir.join("bpf"))
    }
}

/// Opens the node over `kernel` as the daemon does (policies read from the directory).
pub(crate) fn open_node(paths: &Paths, kernel: &FakeKernel) -> Node {
    let (set, errors) = crate::policy::load::load_dir(&paths.policy_dir);
    Node::open(paths, kernel.dataplane(), set, errors).expect("the node opens")
}

/// A link watcher over the fake links: dumps them, then forwards what the test sends on `live`
/// (or, with none, waits forever).
pub(crate) struct Watcher {
    links: FakeLinks,
    live: Mutex<Option<mpsc::UnboundedReceiver<LinkEvent>>>,
}

/// The link watcher of [`Watcher`].
pub(crate) fn watcher(
    links: FakeLinks,
    live: Option<mpsc::UnboundedReceiver<LinkEvent>>,
) -> Watcher {
    Watcher {
        links,
        live: Mutex::new(live),
    }
}

impl LinkIo for Watcher {
    fn watch(&self) -> BoxFuture<'_, Result<LinkWatch, LinkWatchError>> {
        let dump = self
            .links
            .interfaces()
            .into_iter()
            .map(|(ifname, ifindex)| LinkEvent::Up {
                ifname,
                ifindex,
                up: true,
            })
            .collect();
        let events = match lock(&self.live).take() {
            Some(live) => futures_util::stream::unfold(live, |mut live| async {
                live.recv().await.map(|e| (Ok(e), live))
            })
            .boxed(),
            None => futures_util::stream::pending().boxed(),
        };
        Box::pin(std::future::ready(Ok(LinkWatch { dump, events })))
    }
}

/// Keys written, as a set, with a check that none was written twice.
pub(crate) fn once_each(keys: Vec<AnyKey>) -> BTreeSet<AnyKey> {
    let n = keys.len();
    let set: HashSet<AnyKey> = keys.into_iter().collect();
    assert_eq!(set.len(), n, "a key was written more than once");
    set.into_iter().collect()
}
