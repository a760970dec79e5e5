//! The one kernel seam: every kernel operation a driver or upkeep task does goes through one of
//! these traits, whose real implementations are thin (aya, netlink, bpffs, `bpf()` batches) and
//! whose one fake (`fake::FakeKernel`, unit tests) implements them all.
//!
//! - [`MapIo`]: one BPF map (hash, LRU hash, LPM trie): read back, write, delete.
//! - [`Attacher`]: the endpoint programs on workload links (`real::tc_links::TcLinks`).
//! - [`XdpIo`]: the XDP prefilter on named interfaces (`real::xdp::PinnedXdp`).
//! - [`HostTcIo`]: the masquerade's programs on named interfaces (`real::host_tc::PinnedHostTc`).
//! - [`CtIo`]: the conntrack maps of one layout and the programs' created-entries counter
//!   (`real::ct::PinnedCt`: batch lookups and deletes).
//! - [`CountersIo`]: the per-CPU verdict counters (`real::counters::PinnedCounters`).
//! - [`SysctlIo`]: `/proc/sys` (`setup::host::ProcSysctl`).
//! - [`PinIo`]: the map pins under the pin root (`dataplane::pins::BpffsPins`), for stale-pin removal.
//! - [`LinkIo`]: link and address dumps and their live events (`real::netlink_links::Netlink`).
//! - [`InspectIo`]: what the API reads on an operator's request (map metadata, the counter
//!   arrays, the conntrack maps, the drop events ring buffer) — `real::inspect::PinnedInspect`.
//! - [`TraceIo`]: the kernel half of `weir policy trace` (the trace nonce, `BPF_PROG_TEST_RUN`
//!   of the loaded programs) — `real::inspect::PinnedInspect` too.
//! - [`MigrateIo`] and [`CtMapIo`]: the conntrack migration's map pins (create, rename, remove)
//!   and raw batch reads and writes of one conntrack map of any layout
//!   (`real::ct_maps::BpffsCtMaps`, and `aya::maps::MapData` itself).
//! - [`RouteIo`]: weir's routes (`real::netlink_routes::NetlinkRoutes`).
//! - [`VxlanIo`]: the VXLAN device, its address, forwarding and neighbour entries
//!   (`real::netlink_vxlan::NetlinkVxlan`).
//! - [`HostFwdIo`]: BPF host routing's program array (`real::host_fwd::PinnedHostFwd`).
//! - [`SocketLbIo`]: socket LB's cgroup links and settings map (`real::socket_lb::PinnedSocketLb`).
//! - [`UninstallIo`]: the filters and files `weir uninstall` removes (`real::uninstall::HostUninstall`).

pub mod ct_layout;
pub mod migrate;
pub mod real;

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "the `testing` feature uses part of the fake kernel"
    )
)]
pub(crate) mod fake;

use std::{collections::BTreeMap, hash::Hash, io, net::IpAddr, path::Path, path::PathBuf};

use ipnetwork::IpNetwork;
use serde::Serialize;

use futures_util::{future::BoxFuture, stream::BoxStream};

use maps_schema::{
    CtEntry, Nat4Key, SvcCt4Entry, SvcCt4Key,
    conntrack::{Ct4Key, Ct6Key},
};

/// The tc hook (ingress or egress) the seam's [`Attacher`] takes: a plain enum, so code above the seam names it
/// through here rather than through aya.
pub use aya::programs::TcAttachType;
use aya::{
    Pod,
    maps::{
        HashMap, IterableMap, Map, MapData, MapError,
        lpm_trie::{Key as LpmKey, LpmTrie},
    },
};

/// Errors from the kernel seam.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A pinned map could not be opened.
    #[error("cannot open the pinned map {path}: {source}; is the agent's pin root intact?")]
    OpenMap {
        /// The pin.
        path: String,
        /// The cause.
        #[source]
        source: Box<MapError>,
    },
    /// A pinned program could not be opened.
    #[error("cannot open the pinned program {path}: {source}; is the agent's pin root intact?")]
    OpenProgram {
        /// The pin.
        path: String,
        /// The cause.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// Attaching, updating or unpinning a program link failed.
    #[error("cannot {op} {what}: {source}")]
    Attach {
        /// The operation.
        op: &'static str,
        /// What it was applied to.
        what: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A file or syscall operation failed.
    #[error("cannot {op} {what}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// What it was applied to.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A map operation failed.
    #[error("{op} on map {map} failed: {source}")]
    MapOp {
        /// The map's name.
        map: String,
        /// The operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: Box<MapError>,
    },
}

/// What one hook of a workload link holds, as the driver classifies it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hook {
    /// The program the mechanism's own attachment runs there, if it is live on this interface.
    pub ours: Option<u32>,
    /// Something else of weir's is there that must go once ours is in place.
    pub leftovers: bool,
}

/// The kernel operations of the attachment driver; the real one uses aya, netlink and bpffs.
pub trait Attacher: Send {
    /// Link pins present: (ifname, program).
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError>;
    /// True when a link pin exists for (ifname, program).
    fn has_pin(&self, ifname: &str, program: &str) -> bool;
    /// Reads back `program`'s hook on interface `ifname` (index `ifindex`).
    fn hook(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<Hook, KernelError>;
    /// The id of the program this agent attaches as `program`.
    fn current(&self, program: &str) -> u32;
    /// True while interface `ifname` exists with index `ifindex` (it may vanish before the link
    /// watcher says so: a pod's veth dies with its namespace).
    fn link_exists(&self, ifname: &str, ifindex: u32) -> bool;
    /// Attaches `program` to `ifname` anew (a pin that outlived its interface is replaced).
    fn attach(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError>;
    /// Points the existing attachment at the current program (atomic).
    fn update(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError>;
    /// Removes the leftovers at `program`'s hook; returns how many went.
    fn sweep(
        &mut self,
        ifname: &str,
        ifindex: u32,
        program: &str,
        hook: TcAttachType,
    ) -> Result<u64, KernelError>;
    /// Detaches the pinned link and removes its pin (`batch::detach_link_pin`).
    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError>;
}

/// The XDP prefilter's attachments: one pinned XDP link per interface.
pub trait XdpIo: Send {
    /// Interfaces that have a prefilter link pin.
    fn pinned(&self) -> Result<Vec<String>, KernelError>;
    /// The program the pinned link of `ifname` runs, if its pin opens.
    fn pinned_program(&self, ifname: &str) -> Option<u32>;
    /// True when the pinned link of `ifname` runs on the interface of that name now (not on one
    /// that was deleted and recreated under the same name).
    fn pin_is_live(&self, ifname: &str) -> bool;
    /// The id of the prefilter program this agent loaded.
    fn current(&self) -> u32;
    /// True while interface `ifname` exists.
    fn link_exists(&self, ifname: &str) -> bool;
    /// Attaches the current program to `ifname` (through an existing pin: replaced atomically).
    fn attach(&mut self, ifname: &str) -> Result<attach::AttachMode, KernelError>;
    /// Removes the pin of `ifname` (detaching its link).
    fn unpin(&mut self, ifname: &str) -> Result<(), KernelError>;
}

/// Both masquerade programs and their hooks.
pub const MASQ_PROGRAMS: [(&str, TcAttachType); 2] = [
    (maps_schema::programs::MASQ_EGRESS, TcAttachType::Egress),
    (maps_schema::programs::MASQ_INGRESS, TcAttachType::Ingress),
];

/// The masquerade's attachments (`real::host_tc::PinnedHostTc`): `masq_egress` at tc egress and
/// `masq_ingress` at tc ingress of each interface `--masquerade-interfaces` names, as tcx links
/// pinned at `links/<ifname>:<program>`; and what the driver needs to know of those interfaces.
pub trait HostTcIo: Send {
    /// (interface, program) of every masquerade link pin.
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError>;
    /// The program the pinned link of (`ifname`, `program`) runs, if its pin opens.
    fn pinned_program(&self, ifname: &str, program: &str) -> Option<u32>;
    /// True when that pinned link runs on the interface of that name now (not on a deleted one).
    fn pin_is_live(&self, ifname: &str, program: &str) -> bool;
    /// The id of `program` as this agent loaded it.
    fn current(&self, program: &str) -> u32;
    /// The index and the first IPv4 address of `ifname`; `None` when there is no such interface.
    fn interface(&self, ifname: &str) -> Option<(u32, Option<std::net::Ipv4Addr>)>;
    /// Attaches the current `program` to `ifname` (through an existing pin: replaced atomically).
    fn attach(&mut self, ifname: &str, program: &str) -> Result<attach::AttachMode, KernelError>;
    /// Removes the pin of (`ifname`, `program`), detaching its link.
    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError>;
}

/// The conntrack maps of one layout (`ct4`/`ct6`) and the programs' created-entries counter.
pub trait CtIo: Send {
    /// Every IPv4 entry.
    fn entries4(&self) -> Result<Vec<(Ct4Key, CtEntry)>, KernelError>;
    /// Every IPv6 entry.
    fn entries6(&self) -> Result<Vec<(Ct6Key, CtEntry)>, KernelError>;
    /// Deletes IPv4 entries (missing ones are skipped); returns how many went.
    fn delete4(&mut self, keys: &[Ct4Key]) -> Result<u64, KernelError>;
    /// Deletes IPv6 entries; returns how many went.
    fn delete6(&mut self, keys: &[Ct6Key]) -> Result<u64, KernelError>;
    /// Capacity of (`ct4`, `ct6`).
    fn capacity(&self) -> Result<(u64, u64), KernelError>;
    /// Entries the programs created (IPv4, IPv6) since the counter's pin was made; `None` when
    /// the pin does not exist (programs older than the counter).
    fn created(&self) -> Result<Option<[u64; 2]>, KernelError>;
    /// Every entry of the translated flows' map (`svc_ct4`) and its capacity; `None` without
    /// the pin (programs older than Services).
    fn service_flows4(&self) -> Result<Option<ServiceFlows4>, KernelError>;
    /// Deletes `svc_ct4` entries (missing ones are skipped); returns how many went.
    fn delete_service_flows4(&mut self, keys: &[SvcCt4Key]) -> Result<u64, KernelError>;
    /// The egress keys of `nat4` (each a flow the masquerade or a NodePort sent on from this
    /// node's address); empty without the pin.
    fn nat_flows4(&self) -> Result<Vec<Nat4Key>, KernelError>;
}

/// What [`CtIo::service_flows4`] reads: the entries and the map's capacity.
pub type ServiceFlows4 = (Vec<(SvcCt4Key, SvcCt4Entry)>, u64);

/// The verdict counters: one slot per (reason, direction), summed over CPUs.
pub trait CountersIo: Send {
    /// (packets, bytes) of slot `index`.
    fn slot(&self, index: u32) -> Result<(u64, u64), KernelError>;
}

/// Metadata of one pinned map, as the kernel reports it (`bpf_obj_get_info`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapMeta {
    /// Kernel id.
    pub id: u32,
    /// Kernel map type number.
    pub map_type: u32,
    /// Key size.
    pub key_size: u32,
    /// Value size.
    pub value_size: u32,
    /// Capacity.
    pub max_entries: u32,
    /// Flags.
    pub flags: u32,
}

/// The raw records of a ring buffer as they arrive; an error ends the reader.
pub type RecordStream = BoxStream<'static, Result<Vec<u8>, KernelError>>;

/// What the API reads from the kernel when an operator asks (`weir bpf maps|ct|counters`,
/// `weir policy rules`, `weir monitor`; the start report's pins too) and the conntrack maps its flush goes through: each call
/// opens what it needs from the pin root, so a migration or a reload is seen at the next call.
pub trait InspectIo: TraceIo + Send + Sync {
    /// The metadata of the map pinned as `name`.
    fn map_meta(&self, name: &str) -> Result<MapMeta, KernelError>;
    /// The kernel id of the program pinned as `name`.
    fn program_id(&self, name: &str) -> Result<u32, KernelError>;
    /// The per-CPU counter array pinned as `name` (`counters`, `rule_hits_v1`).
    fn counter_array(&self, name: &str) -> Result<Box<dyn CountersIo>, KernelError>;
    /// The conntrack maps of layout `layout`.
    fn conntrack(&self, layout: u32) -> Box<dyn CtIo>;
    /// The masquerade NAT map (`nat4_v1`), read for `weir bpf nat list`.
    fn nat(
        &self,
    ) -> Result<Box<dyn MapIo<maps_schema::Nat4Key, maps_schema::Nat4Entry>>, KernelError>;
    /// The drop events ring buffer's records from now on (call inside the runtime). The ring has
    /// one consumer position, so one reader per agent (`observe::monitor::Monitor`).
    fn drop_events(&self) -> Result<RecordStream, KernelError>;
    /// The masquerade's events (`nat_events_v1`, summed over CPUs, indexed by
    /// `maps_schema::nat::EVENT_*`); `None` without the pin.
    fn nat_events(&self) -> Result<Option<[u64; NAT_EVENTS]>, KernelError>;
}

/// How many `nat_events_v1` slots there are (`maps_schema::nat::EVENT_*`).
pub const NAT_EVENTS: usize = 4;

/// Errors of the kernel half of a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceIoError {
    /// A pinned program could not be opened.
    #[error(
        "cannot open the pinned program {path}: {source}; is the agent's pin root right and are its programs loaded?"
    )]
    OpenProgram {
        /// Pin path.
        path: String,
        /// Cause.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// The trace map could not be opened or written.
    #[error(
        "cannot {op} the trace map {path}: {source}; restart the agent so it loads programs with trace support"
    )]
    TraceMap {
        /// What failed.
        op: &'static str,
        /// Pin path.
        path: String,
        /// Cause.
        #[source]
        source: Box<MapError>,
    },
    /// No random bytes for the nonce.
    #[error("cannot read random bytes for the trace nonce from /dev/urandom: {0}")]
    Random(#[source] std::io::Error),
    /// A host interface is not in the agent's network namespace.
    #[error("interface {ifname} is not in the agent's network namespace: {source}")]
    Ifindex {
        /// Host interface.
        ifname: String,
        /// Cause.
        #[source]
        source: nix::Error,
    },
    /// The test run itself failed.
    #[error("BPF_PROG_TEST_RUN of {program} failed: {source}")]
    TestRun {
        /// Program.
        program: &'static str,
        /// Cause.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
}

/// The kernel half of `weir policy trace`: the loaded programs run on a synthetic packet with
/// `BPF_PROG_TEST_RUN` against the live pinned maps (`observe::ktrace` builds the packet and
/// reads the answer).
pub trait TraceIo: Send + Sync {
    /// The trace nonce the programs check, created (random, non-zero) on first use.
    fn trace_nonce(&self) -> Result<u64, TraceIoError>;
    /// The index of host interface `ifname`.
    fn ifindex(&self, ifname: &str) -> Result<u32, TraceIoError>;
    /// Runs the pinned program `program` on `frame` with the `__sk_buff` context `ctx`; returns
    /// the context the run wrote back.
    fn test_run(
        &self,
        program: &'static str,
        frame: &[u8],
        ctx: &[u8],
    ) -> Result<Vec<u8>, TraceIoError>;
}

impl std::fmt::Debug for dyn InspectIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InspectIo")
    }
}

/// Kernel settings under `/proc/sys`.
pub trait SysctlIo: Send {
    /// The current value (trimmed), `None` when the file cannot be read.
    fn get(&self, path: &str) -> Option<String>;
    /// Writes `value`.
    fn set(&mut self, path: &str, value: &str) -> Result<(), std::io::Error>;
}

/// The map pins of the pin root.
pub trait PinIo: Send {
    /// File names in the maps directory.
    fn map_pins(&self) -> Result<Vec<String>, KernelError>;
    /// Removes one (a missing one is not an error).
    fn remove_map_pin(&mut self, name: &str) -> Result<(), KernelError>;
}

/// One BPF map as drivers see it.
pub trait MapIo<K, V>: Send {
    /// The map's (versioned) name.
    fn name(&self) -> &str;
    /// Every entry the kernel holds.
    fn read_all(&self) -> Result<Vec<(K, V)>, KernelError>;
    /// Creates or replaces an entry.
    fn write(&mut self, key: &K, value: &V) -> Result<(), KernelError>;
    /// Deletes an entry; deleting a missing one is not an error.
    fn delete(&mut self, key: &K) -> Result<(), KernelError>;
    /// True when the map's pin is in place (a pin removed from outside leaves the map alive in
    /// the programs and in this handle, but the CNI, the CLI and the next start would not find it).
    fn pin_present(&self) -> bool;
    /// Pins the map this handle holds open again at its path.
    fn repin(&mut self) -> Result<(), KernelError>;
}

/// True when `path` exists (a pin is a file on bpffs).
fn pin_exists(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

/// Pins `map` at `path` (the map `name`'s) again.
fn repin(name: &str, map: &MapData, path: &Path) -> Result<(), KernelError> {
    map.pin(path).map_err(|source| KernelError::Attach {
        op: "re-pin",
        what: format!("map {name} at {}", path.display()),
        source: Box::new(source),
    })
}

fn open(path: &Path) -> Result<Map, KernelError> {
    let open_err = |source| KernelError::OpenMap {
        path: path.display().to_string(),
        source: Box::new(source),
    };
    let data = MapData::from_pin(path).map_err(open_err)?;
    Map::from_map_data(data).map_err(open_err)
}

fn is_not_found(e: &MapError) -> bool {
    matches!(e, MapError::KeyNotFound)
        || matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::ENOENT))
}

/// A pinned hash (or LRU hash) map.
pub struct PinnedHash<K, V> {
    name: String,
    path: PathBuf,
    map: HashMap<MapData, K, V>,
}

impl<K: Pod, V: Pod> PinnedHash<K, V> {
    /// Opens the map pinned at `path`.
    pub fn open(name: &str, path: &Path) -> Result<Self, KernelError> {
        let map = HashMap::try_from(open(path)?).map_err(|source| KernelError::OpenMap {
            path: path.display().to_string(),
            source: Box::new(source),
        })?;
        Ok(Self {
            name: name.to_owned(),
            path: path.to_owned(),
            map,
        })
    }

    fn op_err(&self, op: &'static str) -> impl Fn(MapError) -> KernelError + '_ {
        move |source| KernelError::MapOp {
            map: self.name.clone(),
            op,
            source: Box::new(source),
        }
    }
}

impl<K, V> MapIo<K, V> for PinnedHash<K, V>
where
    K: Pod + bytemuck::Pod + Send + Eq + Hash,
    V: Pod + bytemuck::Pod + Send,
{
    fn name(&self) -> &str {
        &self.name
    }

    /// The whole map in `BPF_MAP_LOOKUP_BATCH` chunks (a few syscalls for 100,000 entries, where
    /// walking it costs two per entry: the drift refresh reads every map this way); a kernel
    /// without batch lookups for this map type gets the walk.
    fn read_all(&self) -> Result<Vec<(K, V)>, KernelError> {
        use std::os::fd::AsFd as _;
        match real::batch::lookup_all::<K, V>(IterableMap::map(&self.map).fd().as_fd()) {
            Ok(all) => Ok(all),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => self
                .map
                .iter()
                .collect::<Result<Vec<_>, _>>()
                .map_err(self.op_err("read")),
            Err(source) => Err(KernelError::Io {
                op: "read",
                what: format!("map {}", self.name),
                source,
            }),
        }
    }

    fn write(&mut self, key: &K, value: &V) -> Result<(), KernelError> {
        let name = self.name.clone();
        self.map
            .insert(key, value, 0)
            .map_err(|source| KernelError::MapOp {
                map: name,
                op: "write",
                source: Box::new(source),
            })
    }

    fn delete(&mut self, key: &K) -> Result<(), KernelError> {
        match self.map.remove(key) {
            Err(e) if !is_not_found(&e) => Err(KernelError::MapOp {
                map: self.name.clone(),
                op: "delete",
                source: Box::new(e),
            }),
            _ => Ok(()),
        }
    }

    fn pin_present(&self) -> bool {
        pin_exists(&self.path)
    }

    fn repin(&mut self) -> Result<(), KernelError> {
        repin(&self.name, IterableMap::map(&self.map), &self.path)
    }
}

/// A prefix key of an LPM trie: (prefix length, data).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix<K> {
    /// Prefix length in bits.
    pub len: u32,
    /// The address bytes.
    pub data: K,
}

/// A pinned LPM trie.
pub struct PinnedLpm<K, V> {
    name: String,
    path: PathBuf,
    map: LpmTrie<MapData, K, V>,
}

impl<K: Pod, V: Pod> PinnedLpm<K, V> {
    /// Opens the trie pinned at `path`.
    pub fn open(name: &str, path: &Path) -> Result<Self, KernelError> {
        let map = LpmTrie::try_from(open(path)?).map_err(|source| KernelError::OpenMap {
            path: path.display().to_string(),
            source: Box::new(source),
        })?;
        Ok(Self {
            name: name.to_owned(),
            path: path.to_owned(),
            map,
        })
    }
}

impl<K: Pod + Send, V: Pod + Send> MapIo<Prefix<K>, V> for PinnedLpm<K, V> {
    fn name(&self) -> &str {
        &self.name
    }

    fn read_all(&self) -> Result<Vec<(Prefix<K>, V)>, KernelError> {
        let mut out = Vec::new();
        for entry in self.map.iter() {
            let (key, value) = entry.map_err(|source| KernelError::MapOp {
                map: self.name.clone(),
                op: "read",
                source: Box::new(source),
            })?;
            out.push((
                Prefix {
                    len: key.prefix_len(),
                    data: key.data(),
                },
                value,
            ));
        }
        Ok(out)
    }

    fn write(&mut self, key: &Prefix<K>, value: &V) -> Result<(), KernelError> {
        let name = self.name.clone();
        self.map
            .insert(&LpmKey::new(key.len, key.data), value, 0)
            .map_err(|source| KernelError::MapOp {
                map: name,
                op: "write",
                source: Box::new(source),
            })
    }

    fn delete(&mut self, key: &Prefix<K>) -> Result<(), KernelError> {
        match self.map.remove(&LpmKey::new(key.len, key.data)) {
            Err(e) if !is_not_found(&e) => Err(KernelError::MapOp {
                map: self.name.clone(),
                op: "delete",
                source: Box::new(e),
            }),
            _ => Ok(()),
        }
    }

    fn pin_present(&self) -> bool {
        pin_exists(&self.path)
    }

    fn repin(&mut self) -> Result<(), KernelError> {
        repin(&self.name, IterableMap::map(&self.map), &self.path)
    }
}

/// A change of workload links or node addresses, as the link watcher reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// A workload link exists with this index.
    Up {
        /// Name.
        ifname: String,
        /// Index.
        ifindex: u32,
        /// Administratively up (`IFF_UP`).
        up: bool,
    },
    /// A workload link is gone.
    Gone {
        /// Name.
        ifname: String,
    },
    /// A node address appeared on (or left) interface `ifindex`.
    Address {
        /// Interface.
        ifindex: u32,
        /// Address.
        addr: std::net::IpAddr,
        /// True when added, false when removed.
        present: bool,
    },
    /// The initial dump is complete.
    Synced,
    /// The kernel said something of weir's may have been removed from outside (a netlink
    /// `RTM_DEL*` notification): the loop reads that part back at once.
    Drift(Drift),
}

/// What a netlink deletion notification names (see [`LinkEvent::Drift`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// A tc filter or qdisc was deleted on interface `ifindex`.
    Tc {
        /// The interface.
        ifindex: u32,
    },
    /// A route of weir's protocol was deleted.
    Route,
    /// A forwarding (FDB) or neighbour entry was deleted on interface `ifindex`.
    Neighbour {
        /// The interface.
        ifindex: u32,
    },
}

/// Errors of link watching.
#[derive(Debug, thiserror::Error)]
pub enum LinkWatchError {
    /// The netlink socket could not be opened.
    #[error("cannot open a netlink socket to watch links: {0}")]
    Socket(#[source] std::io::Error),
    /// The dump failed.
    #[error("cannot list links: {0}")]
    Dump(#[source] rtnetlink::Error),
    /// The event stream failed.
    #[error("the link event stream failed: {0}")]
    Stream(#[source] std::io::Error),
}

/// Why a link watch stopped (the loop is told, and the agent is not ready until a new one synced).
#[derive(Debug, thiserror::Error)]
pub enum LinkWatcherStopped {
    /// It could not open, or its stream failed.
    #[error(transparent)]
    Failed(#[from] LinkWatchError),
    /// Its event stream ended.
    #[error("its netlink stream ended")]
    Ended,
}

/// The live link and address events after a dump; its end (or an error) means the watcher died.
pub type LinkStream = BoxStream<'static, Result<LinkEvent, LinkWatchError>>;

/// What a watch starts from: the dump's events (an `Up` per workload link, an `Address` per
/// node address; no `Synced`) and the events since the subscription, which was made first so
/// nothing between the two is missed.
pub struct LinkWatch {
    /// The dump.
    pub dump: Vec<LinkEvent>,
    /// Live events from here on.
    pub events: LinkStream,
}

/// Link and address watching in the agent's network namespace.
pub trait LinkIo: Send + Sync {
    /// Subscribes to link and address changes, then dumps what exists.
    fn watch(&self) -> BoxFuture<'_, Result<LinkWatch, LinkWatchError>>;
}

/// One conntrack map of any layout, raw: batch reads and writes with the key and value types
/// the caller names, each refused when the map's sizes differ (the real one is the map's fd:
/// `real::batch`). Layout conversion happens above it (`ct_layout`, `migrate/copy`).
pub trait CtMapIo {
    /// (key size, value size) in bytes.
    fn sizes(&self) -> io::Result<(usize, usize)>;
    /// Capacity.
    fn max_entries(&self) -> io::Result<u32>;
    /// Refuses a map whose key size is not `K`'s or whose value size is not `V`'s (smaller
    /// than it, with `prefix`).
    fn check<K: bytemuck::Pod, V: bytemuck::Pod>(&self, prefix: bool) -> io::Result<()>;
    /// Every entry.
    fn lookup_all<K: bytemuck::Pod, V: bytemuck::Pod>(&self) -> io::Result<Vec<(K, V)>>;
    /// Every entry of a map with values of `value_size` ≥ `size_of::<V>()` bytes, each value
    /// read as its first `size_of::<V>()` bytes.
    fn lookup_all_prefix<K: bytemuck::Pod, V: bytemuck::Pod>(
        &self,
        value_size: usize,
    ) -> io::Result<Vec<(K, V)>>;
    /// One entry, unchecked (call [`CtMapIo::check`] first).
    fn lookup<K: bytemuck::Pod, V: bytemuck::Pod>(&self, key: &K) -> io::Result<Option<V>>;
    /// Creates or replaces entries; returns how many were written.
    fn update<K: bytemuck::Pod, V: bytemuck::Pod>(&self, entries: &[(K, V)]) -> io::Result<usize>;
}

/// The conntrack pins of the maps directory, as the migration uses them.
pub trait MigrateIo {
    /// A map opened from (or created under) a pin; it stays usable after its pin is renamed or
    /// removed, as a file descriptor does.
    type Map: CtMapIo;
    /// File names in the maps directory.
    fn pins(&self) -> io::Result<Vec<String>>;
    /// The path of pin `name` (for messages).
    fn path(&self, name: &str) -> PathBuf;
    /// Opens the map pinned as `name`.
    fn open(&self, name: &str) -> io::Result<Self::Map>;
    /// Creates an LRU hash map named `name` in the kernel and pins it as `pin`.
    fn create(
        &mut self,
        name: &str,
        pin: &str,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> io::Result<Self::Map>;
    /// Renames pin `from` to `to`.
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()>;
    /// Removes pin `name` (a missing one is not an error).
    fn remove(&mut self, name: &str) -> io::Result<()>;
    /// The programs' clock now (`CLOCK_MONOTONIC_COARSE`), in nanoseconds.
    fn now_ns(&self) -> u64;
    /// Failpoint `name` (`WEIR_FAILPOINT`): the real one kills the process there; true when the
    /// migration must stop there as if it had (the fake's crash).
    fn failpoint(&mut self, name: &'static str) -> bool;
}

/// Where a route sends its block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum NextHop {
    /// Native routing: via the remote node's address (on a shared L2, or a fabric that routes pod CIDRs).
    Via(IpAddr),
    /// Tunnel routing: through a device (the VXLAN device, by ifindex), `onlink` via the remote node's
    /// tunnel address.
    Device {
        /// The device.
        ifindex: u32,
        /// The remote end's address on the tunnel.
        via: IpAddr,
    },
}

/// A route-table failure.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// A netlink request failed.
    #[error("cannot {op} the route to {dest}: {source}")]
    Netlink {
        /// What was done.
        op: &'static str,
        /// The destination (or `*` for a dump).
        dest: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The kernel's route table as the route driver sees it (weir's protocol only).
pub trait RouteIo: Send {
    /// Every route of weir's protocol in the main table.
    fn dump(&mut self) -> Result<BTreeMap<IpNetwork, NextHop>, RouteError>;
    /// Creates or replaces the route to `dest`.
    fn replace(&mut self, dest: IpNetwork, hop: NextHop) -> Result<(), RouteError>;
    /// Deletes the route to `dest` (of weir's protocol).
    fn delete(&mut self, dest: IpNetwork, hop: NextHop) -> Result<(), RouteError>;
}

/// A MAC address.
pub type Mac = [u8; 6];

/// The VXLAN device as the VXLAN driver wants it (and reads it back): what `ip -d link show` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VxlanDevice {
    /// The VNI.
    pub vni: u32,
    /// The UDP destination port.
    pub port: u16,
    /// The underlay device's index (`dev`).
    pub underlay_ifindex: u32,
    /// The underlay source address (`local`).
    pub local: std::net::Ipv4Addr,
    /// The device's own MAC (derived from its VTEP address, so peers know it without asking).
    pub mac: Mac,
    /// The device MTU (the underlay's less the encapsulation overhead).
    pub mtu: u32,
}

/// A VXLAN device read back from the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanLink {
    /// Its index.
    pub ifindex: u32,
    /// Its attributes (`None` when a link of that name exists but is not a VXLAN device).
    pub device: Option<VxlanDevice>,
    /// Whether it is administratively up.
    pub up: bool,
    /// Whether it learns source MACs (weir's device never does: its entries are static).
    pub learning: bool,
}

/// An underlay device: the link the tunnel's UDP packets leave through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Underlay {
    /// Its index.
    pub ifindex: u32,
    /// Its MTU.
    pub mtu: u32,
}

/// A failure of the VXLAN side of the kernel seam.
#[derive(Debug, thiserror::Error)]
pub enum VxlanError {
    /// A netlink request failed.
    #[error("cannot {op} {what}: {source}")]
    Netlink {
        /// What was done.
        op: &'static str,
        /// On what (device, entry).
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The underlay device does not exist.
    #[error(
        "the VXLAN underlay device {name} does not exist; name an existing one with --vxlan-underlay"
    )]
    NoUnderlay {
        /// The device name.
        name: String,
    },
    /// A link of the VXLAN device's name exists and is not a VXLAN device: it is not weir's.
    #[error(
        "a link named {name} exists and is not a VXLAN device; weir never touches it: choose another name with --vxlan-device"
    )]
    NotVxlan {
        /// The link name.
        name: String,
    },
    /// The underlay MTU leaves no room for the encapsulation.
    #[error(
        "the underlay MTU {mtu} of {name} is too small for VXLAN ({overhead} bytes of encapsulation)"
    )]
    MtuTooSmall {
        /// The underlay device.
        name: String,
        /// Its MTU.
        mtu: u32,
        /// The encapsulation overhead.
        overhead: u32,
    },
}

/// The VXLAN device and its entries, as the VXLAN driver sees them. Only IPv4 underlays and tunnel
/// addresses: forwarding entries are `MAC → underlay address`, neighbour entries `VTEP address → MAC`, both
/// permanent on the device.
pub trait VxlanIo: Send {
    /// The underlay device `name`, `None` when there is none.
    fn underlay(&mut self, name: &str) -> Result<Option<Underlay>, VxlanError>;
    /// The name of the device holding IPv4 address `address` (the default underlay: the device of this
    /// node's address), `None` when no device holds it.
    fn device_with_address(
        &mut self,
        address: std::net::Ipv4Addr,
    ) -> Result<Option<String>, VxlanError>;
    /// The link named `name`, `None` when there is none.
    fn vxlan(&mut self, name: &str) -> Result<Option<VxlanLink>, VxlanError>;
    /// Creates the VXLAN device `name` (up, learning off); its index.
    fn create(&mut self, name: &str, device: &VxlanDevice) -> Result<u32, VxlanError>;
    /// Deletes link `ifindex`.
    fn delete(&mut self, ifindex: u32) -> Result<(), VxlanError>;
    /// Sets link `ifindex`'s MTU.
    fn set_mtu(&mut self, ifindex: u32, mtu: u32) -> Result<(), VxlanError>;
    /// Sets link `ifindex` up.
    fn set_up(&mut self, ifindex: u32) -> Result<(), VxlanError>;
    /// The IPv4 addresses (host prefixes included) on link `ifindex`.
    fn addresses(
        &mut self,
        ifindex: u32,
    ) -> Result<std::collections::BTreeSet<ipnetwork::Ipv4Network>, VxlanError>;
    /// Adds an address to link `ifindex`.
    fn add_address(&mut self, ifindex: u32, addr: ipnetwork::Ipv4Network)
    -> Result<(), VxlanError>;
    /// Removes an address from link `ifindex`.
    fn delete_address(
        &mut self,
        ifindex: u32,
        addr: ipnetwork::Ipv4Network,
    ) -> Result<(), VxlanError>;
    /// The device's permanent forwarding entries that have a destination: MAC → underlay address.
    fn fdb(&mut self, ifindex: u32) -> Result<BTreeMap<Mac, std::net::Ipv4Addr>, VxlanError>;
    /// Creates or replaces the forwarding entry for `mac`.
    fn fdb_replace(
        &mut self,
        ifindex: u32,
        mac: Mac,
        dst: std::net::Ipv4Addr,
    ) -> Result<(), VxlanError>;
    /// Deletes the forwarding entry for `mac` towards `dst`.
    fn fdb_delete(
        &mut self,
        ifindex: u32,
        mac: Mac,
        dst: std::net::Ipv4Addr,
    ) -> Result<(), VxlanError>;
    /// The device's permanent IPv4 neighbour entries: address → MAC.
    fn neighbours(&mut self, ifindex: u32)
    -> Result<BTreeMap<std::net::Ipv4Addr, Mac>, VxlanError>;
    /// Creates or replaces the permanent neighbour entry for `ip`.
    fn neigh_replace(
        &mut self,
        ifindex: u32,
        ip: std::net::Ipv4Addr,
        mac: Mac,
    ) -> Result<(), VxlanError>;
    /// Deletes the neighbour entry for `ip`.
    fn neigh_delete(&mut self, ifindex: u32, ip: std::net::Ipv4Addr) -> Result<(), VxlanError>;
}

// Host routing, socket LB and `weir uninstall`: what the agent's start and the uninstall write outside the loop.

/// BPF host routing's program array (`host_fwd_v1`, `real::host_fwd::PinnedHostFwd`): the program each slot
/// holds, by the kernel ids of the pinned programs.
pub trait HostFwdIo: Send {
    /// The id of the program slot `slot` holds (`None`: empty).
    fn slot(&mut self, slot: u32) -> Result<Option<u32>, KernelError>;
    /// The id of the program pinned as `program`.
    fn program_id(&mut self, program: &str) -> Result<u32, KernelError>;
    /// Puts the program pinned as `program` into slot `slot`.
    fn set(&mut self, slot: u32, program: &str) -> Result<(), KernelError>;
    /// Empties slot `slot`.
    fn clear(&mut self, slot: u32) -> Result<(), KernelError>;
}

/// Socket LB's programs on a cgroup (`real::socket_lb::PinnedSocketLb`): bpf links pinned as
/// `links/<program>`, so they stay attached while the agent restarts, and the settings map `sock_cfg_v1`.
pub trait SocketLbIo: Send {
    /// Whether `cgroup` is a directory on a cgroup v2 filesystem; an error when it cannot be examined.
    fn is_cgroup2(&mut self, cgroup: &Path) -> io::Result<bool>;
    /// The cookie of this network namespace (`SO_NETNS_COOKIE`, kernel 5.14 or later).
    fn netns_cookie(&mut self) -> io::Result<u64>;
    /// Writes which sockets the programs place into `sock_cfg_v1`: a namespace's cookie, or 0 for every one.
    fn write_scope(&mut self, netns_cookie: u64) -> Result<(), KernelError>;
    /// Attaches the pinned `program` to `cgroup` by a new bpf link and pins it over `links/<program>`
    /// (which detaches the link pinned before).
    fn attach(&mut self, cgroup: &Path, program: &'static str) -> Result<(), KernelError>;
    /// Removes the link pin of `program`, detaching its link; false when there was none.
    fn detach(&mut self, program: &str) -> Result<bool, KernelError>;
}

/// What `weir uninstall` reads and removes (`real::uninstall::HostUninstall`): the tc filters on this
/// network namespace's interfaces, and weir's files (the conflist, link pins, the pin root, the API socket).
pub trait UninstallIo {
    /// True when something answers on the unix socket `socket` (a running agent).
    fn agent_running(&self, socket: &Path) -> bool;
    /// (index, name) of every interface in this network namespace.
    fn interfaces(&mut self) -> Result<Vec<(u32, String)>, KernelError>;
    /// The `bpf` filters at `hook` of interface `ifindex`; `None` when the interface is gone.
    fn filters(
        &mut self,
        ifindex: u32,
        hook: TcAttachType,
    ) -> Result<Option<Vec<attach::filter::BpfFilter>>, KernelError>;
    /// Deletes `filter` from `hook` of interface `ifindex`.
    fn delete_filter(
        &mut self,
        ifindex: u32,
        hook: TcAttachType,
        filter: &attach::filter::BpfFilter,
    ) -> Result<(), KernelError>;
    /// The names of the entries of directory `dir`; `None` when there is no such directory.
    fn list(&mut self, dir: &Path) -> io::Result<Option<Vec<String>>>;
    /// Removes file `path`; false when there was none.
    fn remove_file(&mut self, path: &Path) -> io::Result<bool>;
    /// Removes directory `dir` with everything in it; false when there was none.
    fn remove_tree(&mut self, dir: &Path) -> io::Result<bool>;
}
