//! The migration over the fake kernel (`kernel::fake::ct`): copy and convert, the delta merge,
//! a crash at every failpoint rolled forward by the next start, and the rollback — each checked
//! key by key: no entry is lost and the newest `last_seen_ns` wins.

use std::collections::HashMap;

use maps_schema::{Ct4Key, Ct6Key, CtEntry, CtEntryV1, CtEntryV2, SvcCt4Entry, SvcCt4Key};

use super::*;
use crate::kernel::{
    ct_layout,
    fake::{FakeKernel, ct::FakeCtMap},
};

const CAPACITY: u32 = 1000;
const N: u32 = 100;
/// The programs' clock when the migration starts.
const T0: u64 = 1_000_000_000_000;

fn key4(i: u32) -> Ct4Key {
    let [a, b, c, d] = i.to_be_bytes();
    Ct4Key {
        addr_a: [10, a, b, c],
        addr_b: [10, 0, 0, d],
        port_a: 40_000,
        port_b: 80,
        protocol: 6,
        _pad: [0; 3],
    }
}

fn key6(i: u32) -> Ct6Key {
    let mut addr_a = [0u8; 16];
    addr_a[..4].copy_from_slice(&[0xfd, 0, 0, 1]);
    addr_a[12..].copy_from_slice(&i.to_be_bytes());
    Ct6Key {
        addr_a,
        addr_b: [0xfd; 16],
        port_a: 40_000,
        port_b: 443,
        protocol: 17,
        _pad: [0; 3],
    }
}

/// A node running the layout-1 programs: `ct4_v1` and `ct6_v1` with `N` entries each, last
/// seen over the minutes before `T0`.
fn v1_node() -> FakeKernel {
    let kernel = FakeKernel::default();
    kernel.set_clock_ns(T0);
    let m4 = kernel.pin_ct_map("ct4_v1", 16, 16, CAPACITY);
    let m6 = kernel.pin_ct_map("ct6_v1", 40, 16, CAPACITY);
    let e4: Vec<_> = (0..N).map(|i| (key4(i), v1(i))).collect();
    let e6: Vec<_> = (0..N).map(|i| (key6(i), v1(i))).collect();
    m4.update(&e4).expect("fill ct4_v1");
    m6.update(&e6).expect("fill ct6_v1");
    kernel
}

/// Entry `i` as the layout-1 programs wrote it (seen `i` seconds before `T0`, flags `i`).
fn v1(i: u32) -> CtEntryV1 {
    CtEntryV1 {
        last_seen_ns: T0 - 1_000_000_000 * (u64::from(i) + 10),
        flags: i,
        _reserved: 0,
    }
}

fn read4(kernel: &FakeKernel, pin: &str, layout: u32) -> HashMap<Ct4Key, CtEntry> {
    let map = kernel
        .ct_pin(pin)
        .unwrap_or_else(|| panic!("{pin} is pinned"));
    ct_layout::read::<Ct4Key>(&map, layout)
        .expect("read")
        .into_iter()
        .collect()
}

fn read6(kernel: &FakeKernel, pin: &str, layout: u32) -> HashMap<Ct6Key, CtEntry> {
    let map = kernel
        .ct_pin(pin)
        .unwrap_or_else(|| panic!("{pin} is pinned"));
    ct_layout::read::<Ct6Key>(&map, layout)
        .expect("read")
        .into_iter()
        .collect()
}

/// Every original entry is in layout 2, converted (flags kept, `created_ns` from `last_seen`).
fn assert_converted(kernel: &FakeKernel) {
    let ct4 = read4(kernel, "ct4_v2", 2);
    let ct6 = read6(kernel, "ct6_v2", 2);
    for i in 0..N {
        assert_eq!(ct4.get(&key4(i)), Some(&v1(i).upgrade()), "ct4 entry {i}");
        assert_eq!(ct6.get(&key6(i)), Some(&v1(i).upgrade()), "ct6 entry {i}");
    }
    let map = kernel.ct_pin("ct4_v2").expect("ct4_v2");
    assert_eq!(map.sizes().expect("sizes"), (16, 24), "the layout-2 shape");
}

/// A whole upgrade as an agent does it: prepare, (the links are replaced), finish.
fn upgrade(kernel: &mut FakeKernel) -> Result<(), MigrateError> {
    let mut pending = prepare_with(kernel, 2, CAPACITY)?;
    finish_with(kernel, &mut pending).map(drop)
}

#[test]
fn an_upgrade_copies_and_converts_every_entry_then_removes_the_old_pins() {
    let mut kernel = v1_node();
    let mut pending = prepare_with(&mut kernel, 2, CAPACITY).expect("prepare");
    assert_eq!(
        kernel.ct_pin_names(),
        ["ct4_v1", "ct4_v2", "ct6_v1", "ct6_v2"],
        "the copies are renamed whole; the sources stay for the delta"
    );
    assert_converted(&kernel);
    assert!(!pending.is_empty(), "the delta is owed");
    assert_eq!(
        pending.sizes,
        [
            ("ct4_v2".to_owned(), CAPACITY),
            ("ct6_v2".to_owned(), CAPACITY)
        ]
    );
    let copies: Vec<_> = pending
        .report
        .steps
        .iter()
        .map(|s| (s.action, s.entries))
        .collect();
    assert_eq!(copies, [("copy", N as usize), ("copy", N as usize)]);
    finish_with(&mut kernel, &mut pending).expect("finish");
    assert_eq!(kernel.ct_pin_names(), ["ct4_v2", "ct6_v2"]);
    assert_converted(&kernel);
    // A restart over the migrated pins has nothing to do.
    let pending = prepare_with(&mut kernel, 2, CAPACITY).expect("restart");
    assert!(pending.is_empty() && pending.report.steps.is_empty());
}

#[test]
fn the_delta_the_old_programs_wrote_meanwhile_is_merged_newest_wins() {
    let mut kernel = v1_node();
    let mut pending = prepare_with(&mut kernel, 2, CAPACITY).expect("prepare");
    // While the links still run the old programs: entry 1 refreshed, a new flow 500, both in
    // ct4_v1; the new programs refresh entry 2 in ct4_v2 later than the old ones did.
    let old = kernel.ct_pin("ct4_v1").expect("ct4_v1");
    let refreshed = CtEntryV1 {
        last_seen_ns: T0 + 5_000_000_000,
        flags: 77,
        _reserved: 0,
    };
    let new_flow = CtEntryV1 {
        last_seen_ns: T0 + 6_000_000_000,
        flags: 5,
        _reserved: 0,
    };
    let stale = CtEntryV1 {
        last_seen_ns: T0 + 1_000_000_000,
        flags: 1,
        _reserved: 0,
    };
    old.update(&[
        (key4(1), refreshed),
        (key4(500), new_flow),
        (key4(2), stale),
    ])
    .expect("old programs write");
    let newer = CtEntryV2 {
        last_seen_ns: T0 + 9_000_000_000,
        flags: 99,
        created_ns: T0 + 9_000_000_000,
        _reserved: 0,
    };
    kernel
        .ct_pin("ct4_v2")
        .expect("ct4_v2")
        .update(&[(key4(2), newer)])
        .expect("new programs write");
    let report = finish_with(&mut kernel, &mut pending).expect("finish");
    let merged: Vec<_> = report.steps.iter().map(|s| (s.action, s.entries)).collect();
    assert_eq!(
        merged,
        [("merge", 2), ("merge", 0)],
        "entries 1 and 500, nothing of ct6"
    );
    let ct4 = read4(&kernel, "ct4_v2", 2);
    assert_eq!(
        ct4.len(),
        N as usize + 1,
        "no entry lost, the new flow added"
    );
    let got = ct4[&key4(1)];
    assert_eq!((got.last_seen_ns, got.flags), (refreshed.last_seen_ns, 77));
    assert_eq!(
        got.created_ns,
        v1(1).last_seen_ns,
        "the refreshed flow keeps the creation time of its copy"
    );
    assert_eq!(ct4[&key4(500)], new_flow.upgrade());
    assert_eq!(
        ct4[&key4(2)],
        newer.upgrade(),
        "the new programs' newer entry wins"
    );
    for i in 3..N {
        assert_eq!(ct4[&key4(i)], v1(i).upgrade(), "untouched entry {i}");
    }
    assert_eq!(kernel.ct_pin_names(), ["ct4_v2", "ct6_v2"]);
}

#[test]
fn a_crash_at_every_failpoint_is_rolled_forward_by_the_next_start() {
    for point in [
        "ct-migrate:mid-copy",
        "ct-migrate:after-copy",
        "ct-migrate:after-rename",
        "ct-migrate:after-links",
        "ct-migrate:after-delta",
    ] {
        let mut kernel = v1_node();
        // A flow the old programs write after the crash, before the next start.
        let late = CtEntryV1 {
            last_seen_ns: T0 + 3_000_000_000,
            flags: 3,
            _reserved: 0,
        };
        kernel.crash_at(point);
        let crashed = upgrade(&mut kernel);
        assert!(
            matches!(crashed, Err(MigrateError::Failpoint(p)) if p == point),
            "{point}: {crashed:?}"
        );
        assert!(kernel.failpoints_reached().contains(&point), "{point}");
        kernel
            .ct_pin("ct4_v1")
            .unwrap_or_else(|| panic!("{point}: ct4_v1 stays until the delta is merged"))
            .update(&[(key4(700), late)])
            .expect("old programs write");
        kernel.set_clock_ns(T0 + 4_000_000_000);
        upgrade(&mut kernel).unwrap_or_else(|e| panic!("{point}: the next start: {e}"));
        assert_eq!(
            kernel.ct_pin_names(),
            ["ct4_v2", "ct6_v2"],
            "{point}: no copy or old pin left"
        );
        assert_converted(&kernel);
        let ct4 = read4(&kernel, "ct4_v2", 2);
        assert_eq!(ct4.len(), N as usize + 1, "{point}: no entry lost");
        assert_eq!(
            ct4.get(&key4(700)),
            Some(&late.upgrade()),
            "{point}: the late flow"
        );
    }
}

#[test]
fn a_copy_that_would_lose_entries_to_lru_eviction_gets_the_room_it_needs() {
    let mut kernel = v1_node();
    // Asked for fewer entries than conntrack holds: the new map is sized for them instead.
    let pending = prepare_with(&mut kernel, 2, 50).expect("prepare");
    let size = kernel
        .ct_pin("ct4_v2")
        .expect("ct4_v2")
        .max_entries()
        .expect("max");
    assert!(size >= N + N / 10, "{size} leaves headroom for {N} entries");
    assert_eq!(pending.sizes[0], ("ct4_v2".to_owned(), size));
    assert_converted(&kernel);
}

#[test]
fn a_resize_goes_through_old_and_keeps_every_entry() {
    let mut kernel = v1_node();
    upgrade(&mut kernel).expect("upgrade");
    let mut pending = prepare_with(&mut kernel, 2, 2 * CAPACITY).expect("resize");
    let actions: Vec<_> = pending.report.steps.iter().map(|s| s.action).collect();
    assert_eq!(actions, ["resize", "copy", "resize", "copy"]);
    assert_eq!(
        kernel
            .ct_pin("ct4_v2")
            .expect("ct4_v2")
            .max_entries()
            .expect("max"),
        2 * CAPACITY
    );
    finish_with(&mut kernel, &mut pending).expect("finish");
    assert_eq!(kernel.ct_pin_names(), ["ct4_v2", "ct6_v2"]);
    assert_converted(&kernel);
}

#[test]
fn a_rollback_converts_back_and_the_older_agent_merges_the_last_entries() {
    let mut kernel = v1_node();
    upgrade(&mut kernel).expect("upgrade");
    let v2 = read4(&kernel, "ct4_v2", 2);
    rollback_with(&mut kernel, 1).expect("rollback");
    assert_eq!(
        kernel.ct_pin_names(),
        ["ct4_v1", "ct4_v2:rollback", "ct6_v1", "ct6_v2:rollback"]
    );
    let map: FakeCtMap = kernel.ct_pin("ct4_v1").expect("ct4_v1");
    assert_eq!(map.sizes().expect("sizes"), (16, 16), "the layout-1 shape");
    let v1_entries = read4(&kernel, "ct4_v1", 1);
    assert_eq!(v1_entries.len(), v2.len(), "no entry lost");
    for (k, v) in &v2 {
        assert_eq!(
            v1_entries[k],
            v.downgrade().upgrade(),
            "converted back: {k:?}"
        );
    }
    // The newer programs wrote one more flow before they stopped; the older agent merges it.
    let last = CtEntryV2 {
        last_seen_ns: T0 + 8_000_000_000,
        flags: 8,
        created_ns: T0,
        _reserved: 0,
    };
    kernel
        .ct_pin("ct4_v2:rollback")
        .expect("rollback pin")
        .update(&[(key4(900), last)])
        .expect("write");
    let mut pending = prepare_with(&mut kernel, 1, CAPACITY).expect("the older agent");
    finish_with(&mut kernel, &mut pending).expect("finish");
    assert_eq!(kernel.ct_pin_names(), ["ct4_v1", "ct6_v1"]);
    let ct4 = read4(&kernel, "ct4_v1", 1);
    assert_eq!(ct4.len(), v2.len() + 1);
    assert_eq!(ct4[&key4(900)].last_seen_ns, last.last_seen_ns);
}

#[test]
fn a_rollback_crash_is_rolled_forward_by_running_it_again() {
    for point in ["ct-rollback:after-copy", "ct-rollback:after-rename"] {
        let mut kernel = v1_node();
        upgrade(&mut kernel).expect("upgrade");
        kernel.crash_at(point);
        let crashed = rollback_with(&mut kernel, 1);
        assert!(
            matches!(crashed, Err(MigrateError::Failpoint(p)) if p == point),
            "{point}: {crashed:?}"
        );
        // Run again (as the operator would after the crash), it completes.
        rollback_with(&mut kernel, 1).unwrap_or_else(|e| panic!("{point}: again: {e}"));
        assert_eq!(
            kernel.ct_pin_names(),
            ["ct4_v1", "ct4_v2:rollback", "ct6_v1", "ct6_v2:rollback"],
            "{point}"
        );
        assert_eq!(
            read4(&kernel, "ct4_v1", 1).len(),
            N as usize,
            "{point}: no entry lost"
        );
        assert_eq!(
            read6(&kernel, "ct6_v1", 1).len(),
            N as usize,
            "{point}: no entry lost"
        );
    }
}

#[test]
fn a_newer_layout_is_refused_naming_the_rollback_command() {
    let mut kernel = FakeKernel::default();
    kernel.pin_ct_map("ct4_v2", 16, 24, CAPACITY);
    let e = prepare_with(&mut kernel, 1, CAPACITY).expect_err("newer");
    assert!(
        e.to_string().contains("weir bpf migrate --to-version 1"),
        "{e}"
    );
    assert_eq!(kernel.ct_pin_names(), ["ct4_v2"], "nothing touched");
}

/// Layout 2 kept a translated flow's service in `svc_ct4_v1`'s reply entry; layout 3 keeps it in
/// the conntrack entry. The upgrade fills it in from there, and the rollback writes the reply
/// entries of flows the layout-3 programs translated back, so every translated flow's reply finds
/// its frontend under either release.
#[test]
fn translated_flows_keep_their_frontend_through_layout_3_and_back() {
    let mut kernel = FakeKernel::default();
    kernel.set_clock_ns(T0);
    let m4 = kernel.pin_ct_map("ct4_v2", 16, 24, CAPACITY);
    kernel.pin_ct_map("ct6_v2", 40, 24, CAPACITY);
    let svc = kernel.pin_ct_map(SVC_CT4, 16, 24, CAPACITY);
    // Even flows were translated (service id i + 1); the opener is `a` or `b` alternately.
    let entry = |i: u32| CtEntryV2 {
        last_seen_ns: T0 - 1_000_000_000,
        flags: if i.is_multiple_of(4) {
            maps_schema::conntrack::FLAG_OPENER_IS_B
        } else {
            0
        },
        _reserved: 0,
        created_ns: T0 - 2_000_000_000,
    };
    let entries: Vec<(Ct4Key, CtEntryV2)> = (0..N).map(|i| (key4(i), entry(i))).collect();
    m4.update(&entries).expect("fill ct4_v2");
    let replies: Vec<(SvcCt4Key, SvcCt4Entry)> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| i.is_multiple_of(2))
        .map(|(i, (k, e))| {
            let key = rev_nat::reply_key(k, &e.upgrade());
            let value = SvcCt4Entry {
                addr: key.daddr,
                port: key.dport,
                service_id: i as u32 + 1,
                ..SvcCt4Entry::default()
            };
            (key, value)
        })
        .collect();
    svc.update(&replies).expect("fill svc_ct4");

    let mut pending = prepare_with(&mut kernel, 3, CAPACITY).expect("prepare");
    finish_with(&mut kernel, &mut pending).expect("finish");
    let ct4 = read4(&kernel, "ct4_v3", 3);
    assert_eq!(ct4.len(), N as usize, "no entry lost");
    for i in 0..N {
        let want = if i.is_multiple_of(2) { i + 1 } else { 0 };
        assert_eq!(ct4[&key4(i)].rev_nat, want, "flow {i}'s frontend");
        assert_eq!(ct4[&key4(i)].flags, entry(i).flags);
    }

    // The layout-3 programs translate a new flow (its service only in conntrack), then the
    // operator rolls back: its reply entry is written for the layout-2 programs.
    let new_flow = CtEntry {
        rev_nat: 4242,
        ..CtEntry::new(T0 + 1_000_000_000, 0)
    };
    kernel
        .ct_pin("ct4_v3")
        .expect("ct4_v3")
        .update(&[(key4(700), new_flow)])
        .expect("new programs write");
    rollback_with(&mut kernel, 2).expect("rollback");
    let table: HashMap<SvcCt4Key, SvcCt4Entry> = svc
        .lookup_all::<SvcCt4Key, SvcCt4Entry>()
        .expect("read svc_ct4")
        .into_iter()
        .collect();
    let written = table
        .get(&rev_nat::reply_key(&key4(700), &new_flow))
        .expect("the new flow's reply entry");
    assert_eq!(written.service_id, 4242);
    for (k, v) in &replies {
        assert_eq!(
            table[k].service_id, v.service_id,
            "an older flow's reply entry"
        );
    }
    let v2 = read4(&kernel, "ct4_v2", 2);
    assert_eq!(v2.len(), N as usize + 1, "every flow in layout 2");
}

/// An upgrade to layout 3 on a node that never translated a flow (no `svc_ct4_v1` pinned): every
/// entry converts, none with a reverse NAT.
#[test]
fn an_upgrade_to_layout_3_without_service_flows_converts_everything() {
    let mut kernel = v1_node();
    assert!(!kernel.ct_pin_names().iter().any(|n| n == SVC_CT4));
    let mut pending = prepare_with(&mut kernel, 3, CAPACITY).expect("prepare");
    finish_with(&mut kernel, &mut pending).expect("finish");
    let ct4 = read4(&kernel, "ct4_v3", 3);
    assert_eq!(ct4.len(), N as usize);
    for i in 0..N {
        assert_eq!(ct4[&key4(i)], v1(i).upgrade(), "entry {i}");
    }
}
