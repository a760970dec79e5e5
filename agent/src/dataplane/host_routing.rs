//! BPF host routing (`--host-routing`): on, each slot of the program array `host_fwd_v1` holds its pinned
//! program (`host_fwd`, `host_fwd_in`, `to_endpoint`) and `from_endpoint` hands passed packets to `host_fwd`
//! (FIB lookup and redirect); off, the slots are empty and the kernel's IP forwarding routes. The driver
//! reads each slot back and writes only a slot that holds something else, so a restart over an unchanged
//! pin root writes nothing. The kernel side is [`HostFwdIo`].

use maps_schema::{
    maps::{HOST_FWD_IN_SLOT, HOST_FWD_SLOT, TO_ENDPOINT_SLOT},
    programs::{HOST_FWD, HOST_FWD_IN, TO_ENDPOINT},
};

use crate::kernel::{HostFwdIo, KernelError};

/// Each slot of `host_fwd_v1` with the program it holds when host routing is on.
pub const SLOTS: [(u32, &str); 3] = [
    (HOST_FWD_SLOT, HOST_FWD),
    (HOST_FWD_IN_SLOT, HOST_FWD_IN),
    (TO_ENDPOINT_SLOT, TO_ENDPOINT),
];

/// BPF host routing could not be turned on or off.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot {action} BPF host routing: {source}; restart the agent (or run it with `--host-routing kernel`)"
)]
pub struct HostRoutingError {
    /// "turn on" or "turn off".
    pub action: &'static str,
    /// The cause.
    #[source]
    pub source: KernelError,
}

/// Turns BPF host routing on or off; returns how many slots it wrote.
pub fn reconcile(io: &mut dyn HostFwdIo, on: bool) -> Result<usize, HostRoutingError> {
    let action = if on { "turn on" } else { "turn off" };
    let err = |source| HostRoutingError { action, source };
    let mut wanted = Vec::new();
    for (slot, program) in SLOTS {
        let current = io.slot(slot).map_err(err)?;
        let id = if on {
            Some(io.program_id(program).map_err(err)?)
        } else {
            None
        };
        if current != id {
            wanted.push((slot, program));
        }
    }
    for (slot, program) in &wanted {
        if on {
            io.set(*slot, program)
        } else {
            io.clear(*slot)
        }
        .map_err(err)?;
    }
    if !wanted.is_empty() {
        tracing::info!(on, slots = wanted.len(), "set BPF host routing");
    }
    Ok(wanted.len())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::kernel::fake::FakeKernel;

    /// A kernel whose pin root holds the three programs (ids 11, 12, 13) and an empty program array.
    fn kernel() -> FakeKernel {
        let kernel = FakeKernel::default();
        kernel.host_fwd().programs = BTreeMap::from([
            (HOST_FWD.to_owned(), 11),
            (HOST_FWD_IN.to_owned(), 12),
            (TO_ENDPOINT.to_owned(), 13),
        ]);
        kernel
    }

    #[test]
    fn on_fills_each_slot_with_its_program_and_a_restart_writes_nothing() {
        let mut kernel = kernel();
        assert_eq!(reconcile(&mut kernel, true).expect("on"), 3);
        assert_eq!(
            kernel.host_fwd().slots,
            BTreeMap::from([
                (HOST_FWD_SLOT, 11),
                (HOST_FWD_IN_SLOT, 12),
                (TO_ENDPOINT_SLOT, 13)
            ])
        );
        assert_eq!(reconcile(&mut kernel, true).expect("again"), 0);
        assert_eq!(
            kernel.host_fwd().writes,
            3,
            "an unchanged pin root is not written"
        );
    }

    #[test]
    fn a_slot_holding_another_program_is_rewritten_alone() {
        let mut kernel = kernel();
        reconcile(&mut kernel, true).expect("on");
        // A new object pinned a new `host_fwd_in`: only its slot is out of date.
        kernel
            .host_fwd()
            .programs
            .insert(HOST_FWD_IN.to_owned(), 22);
        assert_eq!(reconcile(&mut kernel, true).expect("on"), 1);
        assert_eq!(kernel.host_fwd().slots.get(&HOST_FWD_IN_SLOT), Some(&22));
    }

    #[test]
    fn kernel_mode_empties_the_slots() {
        let mut kernel = kernel();
        reconcile(&mut kernel, true).expect("on");
        assert_eq!(kernel.host_fwd().slots.len(), 3, "precondition: filled");
        assert_eq!(reconcile(&mut kernel, false).expect("off"), 3);
        assert!(kernel.host_fwd().slots.is_empty());
        assert_eq!(reconcile(&mut kernel, false).expect("off again"), 0);
    }

    #[test]
    fn a_missing_program_fails_with_the_fix() {
        let mut kernel = kernel();
        kernel.host_fwd().programs.remove(HOST_FWD);
        let e = reconcile(&mut kernel, true).expect_err("no host_fwd pin");
        let message = e.to_string();
        assert!(
            message.starts_with("cannot turn on BPF host routing"),
            "{message}"
        );
        assert!(message.contains(HOST_FWD), "{message}");
        assert!(message.contains("--host-routing kernel"), "{message}");
        assert!(
            kernel.host_fwd().slots.is_empty(),
            "nothing written before the failure"
        );
    }

    #[test]
    fn a_failed_write_is_reported() {
        let mut kernel = kernel();
        kernel.drop_all_writes(true);
        let e = reconcile(&mut kernel, true).expect_err("writes fail");
        assert!(e.to_string().contains("host_fwd_v1"), "{e}");
        kernel.drop_all_writes(false);
        assert_eq!(reconcile(&mut kernel, true).expect("retried"), 3);
    }
}
