//! `sweep`: what the conntrack sweep costs with the translated flows' entries (`svc_ct4_v1`) it
//! also sweeps, on the real pinned maps of the built-in object and the agent's own sweep
//! (`CtUpkeep` over `PinnedCt`): `n` established translated flows (an entry each in `ct4` and
//! `svc_ct4`) swept with `svc_ct4` empty, then with their entries, the median of `rounds`
//! sweeps each (nothing to remove: every flow is live); then `n` entries more whose flows are
//! gone (written a minute ago, in no map), and one sweep that removes them.

use std::{collections::BTreeMap, net::Ipv4Addr, os::fd::AsFd as _, time::Instant};

use agent::{
    dataplane::conntrack::{CtStats, CtTimeouts, CtUpkeep},
    kernel::{
        ct_layout::map_names,
        real::{
            batch,
            ct::{PinnedCt, now_ns},
        },
    },
};
use anyhow::{Context as _, Result, ensure};
use aya::maps::MapData;
use maps_schema::{
    Ct4Key, CtEntry, SvcCt4Entry, SvcCt4Key,
    conntrack::{FLAG_TCP_SYN_ACK, LAYOUT},
    service_ct::{DIR_ORIGINAL, SVC_CT4},
};
use serde_json::{Value, json};
use tests::bpf::{PinRoot, load_weir};

use crate::{PORT, Sizes, TARGET};

/// The one backend every flow was given, and the frontend it was sent to.
const BACKEND: Ipv4Addr = Ipv4Addr::new(10, 3, 0, 1);
const FRONTEND: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const CLIENT_PORT: u16 = 40_000;

/// Client `i` of a range starting at `base`.
fn client(base: Ipv4Addr, i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + u32::try_from(i).unwrap_or(u32::MAX))
}

/// The original `svc_ct4` entry of client `c`'s flow, written at `at`.
fn original(c: Ipv4Addr, at: u64) -> (SvcCt4Key, SvcCt4Entry) {
    (
        SvcCt4Key {
            saddr: c.octets(),
            daddr: FRONTEND.octets(),
            sport: CLIENT_PORT,
            dport: PORT,
            protocol: 6,
            direction: DIR_ORIGINAL,
            _pad: [0; 2],
        },
        SvcCt4Entry {
            addr: BACKEND.octets(),
            port: TARGET,
            service_id: 1,
            last_seen_ns: at,
            ..SvcCt4Entry::default()
        },
    )
}

/// The map pinned as `name` (its fd for the batch calls).
fn pinned(root: &PinRoot, name: &str) -> Result<MapData> {
    MapData::from_pin(root.paths().map_pin(name)).with_context(|| format!("{name} pin"))
}

/// Milliseconds of one sweep, and the counters after it.
fn sweep(root: &PinRoot, upkeep: &CtUpkeep) -> Result<(f64, CtStats)> {
    let mut io = PinnedCt::new(&root.paths(), LAYOUT);
    let start = Instant::now();
    upkeep.sweep(&mut io, &CtTimeouts::default())?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    Ok((ms, *upkeep.stats.lock().expect("stats")))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(s: Sizes, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let n = s.sweep_flows;
    let root = PinRoot::new();
    let _ebpf = load_weir(&root);
    let (ct4, _) = map_names(LAYOUT);
    let now = now_ns();
    let live_base = Ipv4Addr::new(10, 16, 0, 0);
    let gone_base = Ipv4Addr::new(10, 32, 0, 0);
    let flows: Vec<(Ct4Key, CtEntry)> = (0..n)
        .map(|i| {
            let key = Ct4Key::of(
                6,
                (client(live_base, i).octets(), CLIENT_PORT),
                (BACKEND.octets(), TARGET),
            );
            let entry = CtEntry {
                rev_nat: 1,
                ..CtEntry::new(now, FLAG_TCP_SYN_ACK)
            };
            (key, entry)
        })
        .collect();
    let (ct4_map, svc_map) = (pinned(&root, &ct4)?, pinned(&root, SVC_CT4)?);
    let (ct4_fd, svc_fd) = (ct4_map.fd().as_fd(), svc_map.fd().as_fd());
    batch::update(ct4_fd, &flows)?;
    ensure!(
        batch::count::<Ct4Key, CtEntry>(ct4_fd)? == n,
        "ct4 holds every flow"
    );
    let entries = || batch::count::<SvcCt4Key, SvcCt4Entry>(svc_fd);
    let upkeep = CtUpkeep::new(Default::default(), Default::default());
    let rounds = |label: &str| -> Result<f64> {
        let mut ms = Vec::new();
        for _ in 0..s.sweep_rounds {
            let (t, stats) = sweep(&root, &upkeep)?;
            ensure!(stats.entries4 == n as u64, "{label}: a live flow was swept");
            ms.push(t);
        }
        Ok(median(ms))
    };
    let ct_only = rounds("conntrack only")?;
    let translated: Vec<_> = (0..n)
        .map(|i| original(client(live_base, i), now))
        .collect();
    batch::update(svc_fd, &translated)?;
    let with_service_flows = rounds("with svc_ct4")?;
    ensure!(entries()? == n, "every live flow keeps its svc_ct4 entry");
    let old = now.saturating_sub(60_000_000_000);
    let gone: Vec<_> = (0..n)
        .map(|i| original(client(gone_base, i), old))
        .collect();
    batch::update(svc_fd, &gone)?;
    let present = entries()?;
    let (removing, stats) = sweep(&root, &upkeep)?;
    let left = entries()?;
    ensure!(
        left == n,
        "the sweep leaves the live flows' {n} entries ({left} left of {present})"
    );
    println!(
        "sweep: {n} translated flows: conntrack only {ct_only:.1} ms, with svc_ct4 \
         {with_service_flows:.1} ms, removing {} stale entries {removing:.1} ms",
        present - left
    );
    figures.insert("sweep_flows".to_owned(), json!(n));
    figures.insert("sweep_ct_only_ms".to_owned(), json!(ct_only));
    figures.insert(
        "sweep_with_service_flows_ms".to_owned(),
        json!(with_service_flows),
    );
    figures.insert("sweep_removing_stale_ms".to_owned(), json!(removing));
    figures.insert(
        "sweep_stale_removed".to_owned(),
        json!(stats.service_flows_expired4),
    );
    Ok(())
}
