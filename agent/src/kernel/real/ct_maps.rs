//! The real [`MigrateIo`] and [`CtMapIo`]: conntrack map pins on bpffs (`rename(2)`, `unlink(2)`,
//! map creation through aya) and a map's fd (or its `MapData`) with the batch syscalls of
//! [`super::batch`].

use std::{
    fs, io,
    os::fd::{AsFd as _, BorrowedFd},
    path::{Path, PathBuf},
};

use aya::maps::MapData;
use aya_obj::generated::bpf_map_type;
use bytemuck::Pod;

use super::batch;
use crate::kernel::{CtMapIo, MigrateIo};

impl CtMapIo for BorrowedFd<'_> {
    fn sizes(&self) -> io::Result<(usize, usize)> {
        batch::sizes(*self)
    }

    fn max_entries(&self) -> io::Result<u32> {
        batch::max_entries(*self)
    }

    fn check<K: Pod, V: Pod>(&self, prefix: bool) -> io::Result<()> {
        batch::check::<K, V>(*self, prefix)
    }

    fn lookup_all<K: Pod, V: Pod>(&self) -> io::Result<Vec<(K, V)>> {
        batch::lookup_all(*self)
    }

    fn lookup_all_prefix<K: Pod, V: Pod>(&self, value_size: usize) -> io::Result<Vec<(K, V)>> {
        batch::lookup_all_prefix(*self, value_size)
    }

    fn lookup<K: Pod, V: Pod>(&self, key: &K) -> io::Result<Option<V>> {
        batch::lookup(*self, key)
    }

    fn update<K: Pod, V: Pod>(&self, entries: &[(K, V)]) -> io::Result<usize> {
        batch::update(*self, entries)
    }
}

/// A map handle: its fd's operations.
impl CtMapIo for MapData {
    fn sizes(&self) -> io::Result<(usize, usize)> {
        self.fd().as_fd().sizes()
    }

    fn max_entries(&self) -> io::Result<u32> {
        self.fd().as_fd().max_entries()
    }

    fn check<K: Pod, V: Pod>(&self, prefix: bool) -> io::Result<()> {
        self.fd().as_fd().check::<K, V>(prefix)
    }

    fn lookup_all<K: Pod, V: Pod>(&self) -> io::Result<Vec<(K, V)>> {
        self.fd().as_fd().lookup_all()
    }

    fn lookup_all_prefix<K: Pod, V: Pod>(&self, value_size: usize) -> io::Result<Vec<(K, V)>> {
        self.fd().as_fd().lookup_all_prefix(value_size)
    }

    fn lookup<K: Pod, V: Pod>(&self, key: &K) -> io::Result<Option<V>> {
        self.fd().as_fd().lookup(key)
    }

    fn update<K: Pod, V: Pod>(&self, entries: &[(K, V)]) -> io::Result<usize> {
        self.fd().as_fd().update(entries)
    }
}

/// The conntrack pins of one maps directory.
#[derive(Clone, Debug)]
pub struct BpffsCtMaps {
    dir: PathBuf,
}

impl BpffsCtMaps {
    /// The pins under `dir` (the pin root's `maps/`).
    #[must_use]
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
        }
    }
}

impl MigrateIo for BpffsCtMaps {
    type Map = MapData;

    fn pins(&self) -> io::Result<Vec<String>> {
        // A name that is not UTF-8 is no pin of weir's.
        fs::read_dir(&self.dir)?
            .map(|e| e.map(|e| e.file_name().into_string().ok()))
            .filter_map(Result::transpose)
            .collect()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn open(&self, name: &str) -> io::Result<MapData> {
        MapData::from_pin(self.path(name)).map_err(io::Error::other)
    }

    fn create(
        &mut self,
        name: &str,
        pin: &str,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> io::Result<MapData> {
        let obj = aya_obj::Map::new_from_params(
            bpf_map_type::BPF_MAP_TYPE_LRU_HASH as u32,
            key_size,
            value_size,
            max_entries,
            0,
        );
        let map = MapData::create(obj, name, None).map_err(io::Error::other)?;
        map.pin(self.path(pin)).map_err(io::Error::other)?;
        Ok(map)
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        fs::rename(self.path(from), self.path(to))
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        match fs::remove_file(self.path(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn now_ns(&self) -> u64 {
        crate::kernel::real::ct::now_ns()
    }

    fn failpoint(&mut self, name: &'static str) -> bool {
        crate::kernel::migrate::failpoint::hit(name);
        false
    }
}
