//! The fake kernel's host routing side ([`HostFwdIo`] for [`FakeKernel`]): the program array's slots by
//! program id, the pinned programs' ids, and a count of the slots written.

use std::collections::BTreeMap;

use crate::kernel::{HostFwdIo, KernelError, fake::FakeKernel};

/// The host routing side of one fake kernel.
#[derive(Default)]
pub(crate) struct HostFwdTable {
    /// Slot → the id of the program it holds.
    pub(crate) slots: BTreeMap<u32, u32>,
    /// Pinned program name → its id; a program not named has no pin.
    pub(crate) programs: BTreeMap<String, u32>,
    /// Every slot written or emptied.
    pub(crate) writes: u32,
}

fn no_pin(program: &str) -> KernelError {
    KernelError::Io {
        op: "open",
        what: format!("the pinned program {program}"),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    }
}

impl HostFwdIo for FakeKernel {
    fn slot(&mut self, slot: u32) -> Result<Option<u32>, KernelError> {
        Ok(self.host_fwd().slots.get(&slot).copied())
    }

    fn program_id(&mut self, program: &str) -> Result<u32, KernelError> {
        self.host_fwd()
            .programs
            .get(program)
            .copied()
            .ok_or_else(|| no_pin(program))
    }

    fn set(&mut self, slot: u32, program: &str) -> Result<(), KernelError> {
        if self.dropping() {
            return Err(super::injected("host_fwd_v1"));
        }
        let mut t = self.host_fwd();
        let id = t
            .programs
            .get(program)
            .copied()
            .ok_or_else(|| no_pin(program))?;
        t.slots.insert(slot, id);
        t.writes += 1;
        Ok(())
    }

    fn clear(&mut self, slot: u32) -> Result<(), KernelError> {
        if self.dropping() {
            return Err(super::injected("host_fwd_v1"));
        }
        let mut t = self.host_fwd();
        t.slots.remove(&slot);
        t.writes += 1;
        Ok(())
    }
}
