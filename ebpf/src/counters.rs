//! Verdicts, the per-CPU counters every verdict goes through, and sampled drop events.

use maps_schema::{
    counters::counter_index,
    events::{CAPTURE_BYTES, SAMPLE_EVERY},
    reason::is_pass,
    rules::rule_slot,
};

use crate::{
    maps::{COUNTERS, DROP_EVENTS, RULE_HITS},
    parse::{Packet, Reason},
};

/// What happens to the packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Pass,
    Drop,
    /// The packet was rewritten and redirected (`bpf_redirect_peer`); tc only.
    Redirect,
}

/// Where the packet was seen: for counters and drop events.
#[derive(Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) direction: u32,
    pub(crate) ifindex: u32,
    pub(crate) len: u32,
    /// A `weir policy trace` test run (`crate::trace`): nothing is counted or written.
    pub(crate) trace: bool,
}

/// Counts `reason` once more; returns the slot's packet count on this CPU (0 if unavailable).
#[inline(always)]
pub(crate) fn count(reason: Reason, direction: u32, bytes: u32) -> u64 {
    match COUNTERS.get_ptr_mut(counter_index(reason, direction)) {
        Some(slot) => {
            // SAFETY: per-CPU slot, only this CPU touches it while the program runs.
            unsafe {
                (*slot).packets += 1;
                (*slot).bytes += u64::from(bytes);
                (*slot).packets
            }
        }
        None => 0,
    }
}

/// Counts the packet under the policy rule that decided it (`rule` 0: none did). Compiled out by
/// the benchmark-only feature `no-rule-hits` (the "counters off" side of `bench datapath`).
#[inline(always)]
pub(crate) fn count_rule(rule: u32, bytes: u32) {
    if cfg!(feature = "no-rule-hits") || rule == 0 {
        return;
    }
    if let Some(slot) = RULE_HITS.get_ptr_mut(rule_slot(rule)) {
        // SAFETY: per-CPU slot, only this CPU touches it while the program runs.
        unsafe {
            (*slot).packets += 1;
            (*slot).bytes += u64::from(bytes);
        }
    }
}

/// Counts the packet under `reason` and returns the verdict that reason implies; every
/// `SAMPLE_EVERY`th drop of a (reason, direction) on a CPU is also sent as a drop event.
#[inline(always)]
pub(crate) fn account(reason: Reason, seen: &Seen, pkt: &Packet) -> Verdict {
    let packets = count(reason, seen.direction, seen.len);
    if is_pass(reason) {
        return Verdict::Pass;
    }
    if packets % SAMPLE_EVERY == 1 {
        emit(reason, seen, pkt);
    }
    Verdict::Drop
}

/// Sends a drop event with the packet's first bytes (off the fast path: sampled drops only).
#[inline(never)]
fn emit(reason: Reason, seen: &Seen, pkt: &Packet) {
    let Some(mut entry) = DROP_EVENTS.reserve(0) else {
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reserved, writable `DropEvent` in the ring buffer.
    unsafe {
        (*event).reason = reason;
        (*event).direction = seen.direction;
        (*event).ifindex = seen.ifindex;
        (*event).packet_len = seen.len;
        (*event)._pad = 0;
        (*event).captured = capture(pkt, &mut (*event).head);
    }
    entry.submit(0);
}

/// Copies the largest of 128/64/32/16/0 bytes the packet holds; returns how many. Straight from
/// the packet into the event (no copy on the stack).
#[inline(always)]
fn capture(pkt: &Packet, head: &mut [u8; CAPTURE_BYTES]) -> u32 {
    *head = [0; CAPTURE_BYTES];
    if let Some(p) = pkt.ptr::<[u8; 128]>(0) {
        // SAFETY: bounds checked by `ptr`.
        *head = unsafe { *p };
        return 128;
    }
    if let Some(p) = pkt.ptr::<[u8; 64]>(0) {
        // SAFETY: as above.
        head[..64].copy_from_slice(unsafe { &*p });
        return 64;
    }
    if let Some(p) = pkt.ptr::<[u8; 32]>(0) {
        // SAFETY: as above.
        head[..32].copy_from_slice(unsafe { &*p });
        return 32;
    }
    if let Some(p) = pkt.ptr::<[u8; 16]>(0) {
        // SAFETY: as above.
        head[..16].copy_from_slice(unsafe { &*p });
        return 16;
    }
    0
}
