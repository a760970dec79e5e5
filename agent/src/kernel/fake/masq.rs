//! The fake kernel's masquerade side ([`HostTcIo`] for [`FakeKernel`]): interfaces (index, first
//! IPv4 address), the link pins by (interface, program) with the program each runs, pins whose
//! interface was recreated (defunct), and the current program ids.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use attach::AttachMode;

use crate::kernel::{HostTcIo, KernelError, fake::FakeKernel};

/// The masquerade side of one fake kernel.
#[derive(Default)]
pub(crate) struct MasqTable {
    pub(crate) interfaces: BTreeMap<String, (u32, Option<Ipv4Addr>)>,
    pub(crate) pins: BTreeMap<(String, String), u32>,
    pub(crate) defunct: BTreeSet<(String, String)>,
    pub(crate) current: BTreeMap<String, u32>,
    /// Every attach and unpin that succeeded.
    pub(crate) mutations: u32,
    /// Interfaces whose attach fails (an injected fault).
    pub(crate) failing: BTreeSet<String>,
}

impl HostTcIo for FakeKernel {
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError> {
        Ok(self.masq_table().pins.keys().cloned().collect())
    }
    fn pinned_program(&self, ifname: &str, program: &str) -> Option<u32> {
        self.masq_table()
            .pins
            .get(&(ifname.to_owned(), program.to_owned()))
            .copied()
    }
    fn pin_is_live(&self, ifname: &str, program: &str) -> bool {
        let t = self.masq_table();
        t.pins
            .contains_key(&(ifname.to_owned(), program.to_owned()))
            && t.interfaces.contains_key(ifname)
            && !t.defunct.contains(&(ifname.to_owned(), program.to_owned()))
    }
    fn current(&self, program: &str) -> u32 {
        self.masq_table().current.get(program).copied().unwrap_or(1)
    }
    fn interface(&self, ifname: &str) -> Option<(u32, Option<Ipv4Addr>)> {
        self.masq_table().interfaces.get(ifname).copied()
    }
    fn attach(&mut self, ifname: &str, program: &str) -> Result<AttachMode, KernelError> {
        let id = HostTcIo::current(self, program);
        let mut t = self.masq_table();
        if t.failing.contains(ifname) {
            return Err(KernelError::Io {
                op: "attach a masquerade program to",
                what: ifname.to_owned(),
                source: std::io::Error::other("injected fault"),
            });
        }
        if !t.interfaces.contains_key(ifname) {
            return Err(KernelError::Io {
                op: "attach a masquerade program to",
                what: ifname.to_owned(),
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        t.defunct.remove(&(ifname.to_owned(), program.to_owned()));
        t.mutations += 1;
        Ok(
            match t.pins.insert((ifname.to_owned(), program.to_owned()), id) {
                Some(_) => AttachMode::Replaced,
                None => AttachMode::NewLink,
            },
        )
    }
    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError> {
        let mut t = self.masq_table();
        t.pins.remove(&(ifname.to_owned(), program.to_owned()));
        t.mutations += 1;
        Ok(())
    }
}
