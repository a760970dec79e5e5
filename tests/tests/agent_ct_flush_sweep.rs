//! The agent's conntrack upkeep against the real pinned maps: a flush that arrives while a sweep
//! is in the middle of its run (forced: the sweep pauses right after it has read `ct4`) waits for
//! the sweep, and the entries it removes are not counted as LRU evictions by the next sweep;
//! positive control: an entry removed behind the agent's back (as LRU eviction does) is counted.
//! The sweep also takes the translated flows' `svc_ct4` entries whose flow is in neither `ct4` nor
//! `nat4`, and keeps those that one of them carries.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use agent::{
    dataplane::conntrack::{CtStats, CtTimeouts, CtUpkeep},
    kernel::{
        CtIo, KernelError, ServiceFlows4,
        ct_layout::map_names,
        real::ct::{PinnedCt, now_ns},
    },
};
use aya::maps::{HashMap, Map, MapData, PerCpuArray, PerCpuValues};
use maps_schema::{
    CtEntry, Nat4Entry, Nat4Key, SvcCt4Entry, SvcCt4Key,
    conntrack::{Ct4Key, Ct6Key, EVENT_CREATED4, FLAG_TCP_SYN_ACK, LAYOUT},
    maps::{CT_EVENTS, NAT4},
    nat::DIR_EGRESS,
    service_ct::{DIR_ORIGINAL, SVC_CT4},
};
use tests::{
    bpf::{PinRoot, load_weir},
    privileged::require_root,
};

/// The real maps, with a pause after the next IPv4 read.
struct Paused {
    inner: PinnedCt,
    pause: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl CtIo for Paused {
    fn entries4(&self) -> Result<Vec<(Ct4Key, CtEntry)>, KernelError> {
        let entries = self.inner.entries4()?;
        let pause = self.pause.lock().expect("lock").take();
        if let Some((read, go)) = pause {
            read.send(()).expect("the test waits");
            go.recv().expect("the test lets the sweep go on");
        }
        Ok(entries)
    }
    fn entries6(&self) -> Result<Vec<(Ct6Key, CtEntry)>, KernelError> {
        self.inner.entries6()
    }
    fn delete4(&mut self, keys: &[Ct4Key]) -> Result<u64, KernelError> {
        self.inner.delete4(keys)
    }
    fn delete6(&mut self, keys: &[Ct6Key]) -> Result<u64, KernelError> {
        self.inner.delete6(keys)
    }
    fn capacity(&self) -> Result<(u64, u64), KernelError> {
        self.inner.capacity()
    }
    fn created(&self) -> Result<Option<[u64; 2]>, KernelError> {
        self.inner.created()
    }
    fn service_flows4(&self) -> Result<Option<ServiceFlows4>, KernelError> {
        self.inner.service_flows4()
    }
    fn delete_service_flows4(&mut self, keys: &[SvcCt4Key]) -> Result<u64, KernelError> {
        self.inner.delete_service_flows4(keys)
    }
    fn nat_flows4(&self) -> Result<Vec<Nat4Key>, KernelError> {
        self.inner.nat_flows4()
    }
}

fn flow(port: u16) -> Ct4Key {
    Ct4Key {
        addr_a: [10, 0, 0, 1],
        addr_b: [10, 0, 0, 2],
        port_a: port,
        port_b: 80,
        protocol: 6,
        ..Ct4Key::default()
    }
}

/// What the programs do for a new flow: the entry, and one more in the created counter.
fn create(root: &PinRoot, port: u16) {
    let paths = root.paths();
    let (ct4, _) = map_names(LAYOUT);
    let data = MapData::from_pin(paths.map_pin(&ct4)).expect("ct4 pin");
    let mut map: HashMap<_, Ct4Key, CtEntry> =
        HashMap::try_from(Map::LruHashMap(data)).expect("ct4 is an LRU hash");
    map.insert(&flow(port), &CtEntry::new(now_ns(), FLAG_TCP_SYN_ACK), 0)
        .expect("insert");
    let data = MapData::from_pin(paths.map_pin(CT_EVENTS)).expect("ct_events pin");
    let mut events: PerCpuArray<_, u64> =
        PerCpuArray::try_from(Map::PerCpuArray(data)).expect("per-CPU array");
    let mut values: Vec<u64> = events.get(&EVENT_CREATED4, 0).expect("get").to_vec();
    values[0] += 1;
    events
        .set(
            EVENT_CREATED4,
            PerCpuValues::try_from(values).expect("values"),
            0,
        )
        .expect("set");
}

/// What LRU eviction does: the entry goes, the agent is not told.
fn evict(root: &PinRoot, port: u16) {
    let (ct4, _) = map_names(LAYOUT);
    let data = MapData::from_pin(root.paths().map_pin(&ct4)).expect("ct4 pin");
    let mut map: HashMap<_, Ct4Key, CtEntry> =
        HashMap::try_from(Map::LruHashMap(data)).expect("LRU hash");
    map.remove(&flow(port)).expect("remove");
}

#[test]
fn a_flush_during_a_sweep_is_not_counted_as_evictions_on_real_maps() {
    if !require_root("a_flush_during_a_sweep_is_not_counted_as_evictions_on_real_maps") {
        return;
    }
    let root = PinRoot::new();
    let _ebpf = load_weir(&root);
    for port in 1..=3 {
        create(&root, port);
    }
    let real = || PinnedCt::new(&root.paths(), LAYOUT);
    let upkeep = CtUpkeep::new(Arc::default(), Arc::new(Mutex::new(CtStats::default())));
    let timeouts = CtTimeouts::default();
    upkeep.sweep(&mut real(), &timeouts).expect("first sweep");
    let stats = |u: &CtUpkeep| *u.stats.lock().expect("lock");
    assert_eq!(stats(&upkeep).entries4, 3);

    let (read_tx, read_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let paused = Paused {
        inner: real(),
        pause: Mutex::new(Some((read_tx, go_rx))),
    };
    let flushed = AtomicBool::new(false);
    let (calling_tx, calling_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let sweeping = s.spawn(|| {
            let mut io = paused;
            upkeep.sweep(&mut io, &timeouts)
        });
        read_rx.recv().expect("the sweep read ct4");
        // Owned here: should an assertion below fail, dropping it lets the paused sweep end.
        let go_tx = go_tx;
        let flushing = s.spawn(|| {
            calling_tx.send(()).expect("the test waits");
            let n = upkeep.flush(&mut real());
            flushed.store(true, Ordering::SeqCst);
            n
        });
        // The flush is called (so a flush that did not wait would be done within the window).
        calling_rx.recv().expect("the flush thread runs");
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !flushed.load(Ordering::SeqCst),
            "the flush waits for the sweep in progress"
        );
        assert_eq!(
            real().entries4().expect("read").len(),
            3,
            "nothing is flushed in the middle of the sweep"
        );
        go_tx.send(()).expect("go");
        sweeping.join().expect("sweep thread").expect("sweep");
        assert_eq!(flushing.join().expect("flush thread").expect("flush"), 3);
    });
    assert!(real().entries4().expect("read").is_empty(), "flushed");

    upkeep.sweep(&mut real(), &timeouts).expect("sweep");
    assert_eq!(
        stats(&upkeep).evicted4,
        0,
        "the flushed entries are not LRU evictions"
    );

    // Positive control: an entry that vanished behind the agent's back is counted.
    create(&root, 7);
    create(&root, 8);
    evict(&root, 7);
    upkeep.sweep(&mut real(), &timeouts).expect("sweep");
    assert_eq!(stats(&upkeep).evicted4, 1, "an evicted entry is counted");
    assert_eq!(stats(&upkeep).entries4, 1);
}

/// A translated flow's original entry (10.0.0.1:`port` → 10.96.0.10:8080, given backend
/// 10.0.0.2:80, `flow(port)`'s other end), written a minute ago.
fn translated(port: u16) -> (SvcCt4Key, SvcCt4Entry) {
    (
        SvcCt4Key {
            saddr: [10, 0, 0, 1],
            daddr: [10, 96, 0, 10],
            sport: port,
            dport: 8080,
            protocol: 6,
            direction: DIR_ORIGINAL,
            _pad: [0; 2],
        },
        SvcCt4Entry {
            addr: [10, 0, 0, 2],
            port: 80,
            service_id: 1,
            last_seen_ns: now_ns().saturating_sub(60_000_000_000),
            ..SvcCt4Entry::default()
        },
    )
}

#[test]
fn the_sweep_takes_translated_flows_entries_whose_flow_is_gone_from_the_real_maps() {
    if !require_root(
        "the_sweep_takes_translated_flows_entries_whose_flow_is_gone_from_the_real_maps",
    ) {
        return;
    }
    let root = PinRoot::new();
    let _ebpf = load_weir(&root);
    let paths = root.paths();
    let data = MapData::from_pin(paths.map_pin(SVC_CT4)).expect("svc_ct4 pin");
    let mut svc: HashMap<_, SvcCt4Key, SvcCt4Entry> =
        HashMap::try_from(Map::LruHashMap(data)).expect("svc_ct4 is an LRU hash");
    // 1: in conntrack; 2: in nat4 only (a NodePort flow sent to another node); 3: in neither.
    create(&root, 1);
    let data = MapData::from_pin(paths.map_pin(NAT4)).expect("nat4 pin");
    let mut nat: HashMap<_, Nat4Key, Nat4Entry> =
        HashMap::try_from(Map::LruHashMap(data)).expect("nat4 is an LRU hash");
    let egress = Nat4Key {
        saddr: [10, 0, 0, 1],
        daddr: [10, 0, 0, 2],
        sport: 2,
        dport: 80,
        protocol: 6,
        direction: DIR_EGRESS,
        _pad: [0; 2],
    };
    let pair = Nat4Entry {
        addr: [192, 0, 2, 1],
        port: 40_000,
        created_ns: now_ns(),
        last_seen_ns: now_ns(),
        flags: 0,
    };
    nat.insert(&egress, &pair, 0).expect("nat4 insert");
    for port in 1..=3 {
        let (k, v) = translated(port);
        svc.insert(&k, &v, 0).expect("svc_ct4 insert");
    }
    let upkeep = CtUpkeep::new(Arc::default(), Arc::new(Mutex::new(CtStats::default())));
    upkeep
        .sweep(&mut PinnedCt::new(&paths, LAYOUT), &CtTimeouts::default())
        .expect("sweep");
    let mut left: Vec<u16> = svc.keys().map(|k| k.expect("read svc_ct4").sport).collect();
    left.sort_unstable();
    assert_eq!(
        left,
        vec![1, 2],
        "the entry of the flow in neither map goes"
    );
    let stats = *upkeep.stats.lock().expect("lock");
    assert_eq!(stats.service_flows_expired4, 1);
    assert_eq!(stats.service_flows4, 2);
    assert!(stats.service_flows_max4 > 0, "the capacity is read");
}
