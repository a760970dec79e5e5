//! The fake kernel's conntrack map pins, for the migration's unit tests: [`MigrateIo`] over
//! in-memory maps of raw bytes (each with the key and value sizes it was created with, checked
//! as the kernel checks them, and LRU eviction when full), pins that rename and unlink as bpffs
//! does (an open map outlives its pin), the programs' clock, and a crash at one failpoint.

use std::{
    collections::BTreeMap,
    io,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use bytemuck::Pod;

use crate::kernel::{CtMapIo, MigrateIo, fake::FakeKernel};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct RawMap {
    key_size: usize,
    value_size: usize,
    max_entries: u32,
    /// key → (last write, value).
    entries: BTreeMap<Vec<u8>, (u64, Vec<u8>)>,
    writes: u64,
}

/// One fake map; clones are handles on the same map (as fds are).
#[derive(Clone)]
pub(crate) struct FakeCtMap(Arc<Mutex<RawMap>>);

fn sizes_differ(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the map has other {what} sizes: it belongs to another layout"),
    )
}

impl FakeCtMap {
    fn new(key_size: usize, value_size: usize, max_entries: u32) -> Self {
        Self(Arc::new(Mutex::new(RawMap {
            key_size,
            value_size,
            max_entries,
            entries: BTreeMap::new(),
            writes: 0,
        })))
    }
}

impl CtMapIo for FakeCtMap {
    fn sizes(&self) -> io::Result<(usize, usize)> {
        let m = lock(&self.0);
        Ok((m.key_size, m.value_size))
    }

    fn max_entries(&self) -> io::Result<u32> {
        Ok(lock(&self.0).max_entries)
    }

    fn check<K: Pod, V: Pod>(&self, prefix: bool) -> io::Result<()> {
        let (key, value) = self.sizes()?;
        let value_ok = if prefix {
            value >= size_of::<V>()
        } else {
            value == size_of::<V>()
        };
        if key == size_of::<K>() && value_ok {
            Ok(())
        } else {
            Err(sizes_differ("key or value"))
        }
    }

    fn lookup_all<K: Pod, V: Pod>(&self) -> io::Result<Vec<(K, V)>> {
        self.check::<K, V>(false)?;
        self.lookup_all_prefix(size_of::<V>())
    }

    fn lookup_all_prefix<K: Pod, V: Pod>(&self, value_size: usize) -> io::Result<Vec<(K, V)>> {
        self.check::<K, V>(true)?;
        let m = lock(&self.0);
        if m.value_size != value_size {
            return Err(sizes_differ("value"));
        }
        Ok(m.entries
            .iter()
            .map(|(k, (_, v))| {
                (
                    bytemuck::pod_read_unaligned(k),
                    bytemuck::pod_read_unaligned(&v[..size_of::<V>()]),
                )
            })
            .collect())
    }

    fn lookup<K: Pod, V: Pod>(&self, key: &K) -> io::Result<Option<V>> {
        let m = lock(&self.0);
        Ok(m.entries
            .get(bytemuck::bytes_of(key))
            .map(|(_, v)| bytemuck::pod_read_unaligned(&v[..size_of::<V>()])))
    }

    fn update<K: Pod, V: Pod>(&self, entries: &[(K, V)]) -> io::Result<usize> {
        self.check::<K, V>(false)?;
        let mut m = lock(&self.0);
        for (k, v) in entries {
            let key = bytemuck::bytes_of(k).to_vec();
            // LRU: a new key in a full map evicts the least recently written one.
            if !m.entries.contains_key(&key)
                && m.entries.len() >= m.max_entries as usize
                && let Some(oldest) = m
                    .entries
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone())
            {
                m.entries.remove(&oldest);
            }
            m.writes += 1;
            let at = m.writes;
            m.entries.insert(key, (at, bytemuck::bytes_of(v).to_vec()));
        }
        Ok(entries.len())
    }
}

/// The conntrack pins of the fake kernel's maps directory.
#[derive(Default)]
pub(crate) struct CtPins {
    maps: BTreeMap<String, FakeCtMap>,
    /// The migration crashes at this failpoint (once).
    crash_at: Option<&'static str>,
    /// Failpoints reached.
    pub(crate) reached: Vec<&'static str>,
    /// The programs' clock.
    pub(crate) clock_ns: u64,
}

impl FakeKernel {
    fn ct_pins(&self) -> MutexGuard<'_, CtPins> {
        lock(&self.ct_pins)
    }

    /// Pins a new conntrack map as `name` (as a release's loader does), returning it.
    pub(crate) fn pin_ct_map(
        &self,
        name: &str,
        key_size: usize,
        value_size: usize,
        max_entries: u32,
    ) -> FakeCtMap {
        let map = FakeCtMap::new(key_size, value_size, max_entries);
        self.ct_pins().maps.insert(name.to_owned(), map.clone());
        map
    }

    /// The map pinned as `name`.
    pub(crate) fn ct_pin(&self, name: &str) -> Option<FakeCtMap> {
        self.ct_pins().maps.get(name).cloned()
    }

    /// The conntrack pin names.
    pub(crate) fn ct_pin_names(&self) -> Vec<String> {
        self.ct_pins().maps.keys().cloned().collect()
    }

    /// The next migration step to reach failpoint `name` stops there, as a crash would.
    pub(crate) fn crash_at(&self, name: &'static str) {
        self.ct_pins().crash_at = Some(name);
    }

    /// Failpoints reached so far.
    pub(crate) fn failpoints_reached(&self) -> Vec<&'static str> {
        self.ct_pins().reached.clone()
    }

    /// Sets the programs' clock.
    pub(crate) fn set_clock_ns(&self, ns: u64) {
        self.ct_pins().clock_ns = ns;
    }
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no pin {name}"))
}

impl MigrateIo for FakeKernel {
    type Map = FakeCtMap;

    fn pins(&self) -> io::Result<Vec<String>> {
        Ok(self.ct_pin_names())
    }

    fn path(&self, name: &str) -> PathBuf {
        PathBuf::from("/fake/maps").join(name)
    }

    fn open(&self, name: &str) -> io::Result<FakeCtMap> {
        self.ct_pin(name).ok_or_else(|| not_found(name))
    }

    fn create(
        &mut self,
        _name: &str,
        pin: &str,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> io::Result<FakeCtMap> {
        if self.dropping() {
            return Err(io::Error::other("fault injected by the fake kernel"));
        }
        if self.ct_pin(pin).is_some() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, pin.to_owned()));
        }
        Ok(self.pin_ct_map(pin, key_size as usize, value_size as usize, max_entries))
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let mut pins = self.ct_pins();
        let map = pins.maps.remove(from).ok_or_else(|| not_found(from))?;
        pins.maps.insert(to.to_owned(), map);
        Ok(())
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.ct_pins().maps.remove(name);
        Ok(())
    }

    fn now_ns(&self) -> u64 {
        self.ct_pins().clock_ns
    }

    fn failpoint(&mut self, name: &'static str) -> bool {
        let mut pins = self.ct_pins();
        pins.reached.push(name);
        if pins.crash_at == Some(name) {
            pins.crash_at = None;
            true
        } else {
            false
        }
    }
}
