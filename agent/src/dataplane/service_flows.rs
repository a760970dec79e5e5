//! The translated flows' entries (`svc_ct4`), swept with conntrack: the programs write an entry
//! when they give a new flow its backend and never stamp it again, so its flow's life is its
//! conntrack entry's (`ct4`), or for a NodePort flow sent on to another node's backend its
//! `nat4` pair's. An entry whose flow is in neither once the conntrack sweep has run is stale:
//! left alone, it would hold its slot until the LRU evicts it, and under pressure the LRU evicts
//! by age of last use, so an idle live flow's entry could go before a closed one's.
//!
//! An entry younger than [`GRACE`] is kept whatever the maps say: a NodePort's programs write the
//! entry just before the `nat4` pair, and a sweep reading between the two would otherwise take
//! the new flow's entry.

use std::{collections::HashSet, net::Ipv4Addr, time::Duration};

use maps_schema::{
    Ct4Key, Nat4Key, SvcCt4Entry, SvcCt4Key,
    service_ct::{DIR_ORIGINAL, flow_key},
};

use crate::kernel::{CtIo, KernelError};

/// How old an entry must be (since the programs wrote it) before the sweep may take it.
pub const GRACE: Duration = Duration::from_secs(5);

/// The flows still alive: every conntrack key the sweep kept, and every flow `nat4` carries.
#[must_use]
pub fn live(conntrack: impl IntoIterator<Item = Ct4Key>, nat: &[Nat4Key]) -> HashSet<Ct4Key> {
    let mut live: HashSet<Ct4Key> = conntrack.into_iter().collect();
    live.extend(
        nat.iter()
            .map(|k| Ct4Key::of(k.protocol, (k.saddr, k.sport), (k.daddr, k.dport))),
    );
    live
}

/// The entries whose flow is not in `live`, written more than [`GRACE`] before `now_ns` (the
/// programs' clock).
#[must_use]
pub fn stale(
    entries: &[(SvcCt4Key, SvcCt4Entry)],
    live: &HashSet<Ct4Key>,
    now_ns: u64,
) -> Vec<SvcCt4Key> {
    let grace = u64::try_from(GRACE.as_nanos()).unwrap_or(u64::MAX);
    entries
        .iter()
        .filter(|(k, v)| {
            now_ns.saturating_sub(v.last_seen_ns) > grace && !live.contains(&flow_key(k, v))
        })
        .map(|(k, _)| *k)
        .collect()
}

/// One translated flow as operators read it (the API contract's).
pub use weir_api::FlowView;

/// Every translated flow (`svc_ct4`'s original entries) over `io` at `now_ns`, joined with its
/// conntrack entry, ordered by client; empty without the map.
pub fn list(io: &dyn CtIo, now_ns: u64) -> Result<Vec<FlowView>, KernelError> {
    let Some((entries, _)) = io.service_flows4()? else {
        return Ok(Vec::new());
    };
    let conntrack: std::collections::HashMap<Ct4Key, u64> = io
        .entries4()?
        .into_iter()
        .map(|(k, v)| (k, v.last_seen_ns))
        .collect();
    let secs = |ns: u64| now_ns.saturating_sub(ns) / 1_000_000_000;
    let end = |a: [u8; 4], p: u16| format!("{}:{p}", Ipv4Addr::from(a));
    let mut out: Vec<(SvcCt4Key, FlowView)> = entries
        .iter()
        .filter(|(k, _)| k.direction == DIR_ORIGINAL)
        .map(|(k, v)| {
            (
                *k,
                FlowView {
                    protocol: k.protocol,
                    client: end(k.saddr, k.sport),
                    frontend: end(k.daddr, k.dport),
                    backend: end(v.addr, v.port),
                    service: None,
                    idle_secs: conntrack.get(&flow_key(k, v)).map(|&last| secs(last)),
                    age_secs: secs(v.last_seen_ns),
                },
            )
        })
        .collect();
    out.sort_by_key(|(k, _)| (k.saddr, k.sport, k.daddr, k.dport, k.protocol));
    Ok(out.into_iter().map(|(_, v)| v).collect())
}

#[cfg(test)]
mod tests {
    use maps_schema::{
        nat::DIR_EGRESS,
        service_ct::{DIR_ORIGINAL, DIR_REPLY},
    };

    use super::*;

    const SECOND: u64 = 1_000_000_000;
    const CLIENT: [u8; 4] = [10, 0, 0, 1];
    const BACKEND: [u8; 4] = [10, 0, 1, 7];

    /// A flow's original entry (client:`cport` → the frontend, given `BACKEND`:8080) written at
    /// `at`.
    fn original(cport: u16, at: u64) -> (SvcCt4Key, SvcCt4Entry) {
        (
            SvcCt4Key {
                saddr: CLIENT,
                daddr: [10, 96, 0, 10],
                sport: cport,
                dport: 80,
                protocol: 6,
                direction: DIR_ORIGINAL,
                _pad: [0; 2],
            },
            SvcCt4Entry {
                addr: BACKEND,
                port: 8080,
                service_id: 1,
                last_seen_ns: at,
                ..SvcCt4Entry::default()
            },
        )
    }

    /// The same flow's reply entry (a NodePort's: `BACKEND`:8080 → client:`cport`).
    fn reply(cport: u16, at: u64) -> (SvcCt4Key, SvcCt4Entry) {
        (
            SvcCt4Key {
                saddr: BACKEND,
                daddr: CLIENT,
                sport: 8080,
                dport: cport,
                protocol: 6,
                direction: DIR_REPLY,
                _pad: [0; 2],
            },
            SvcCt4Entry {
                addr: CLIENT,
                port: cport,
                service_id: 1,
                last_seen_ns: at,
                ..SvcCt4Entry::default()
            },
        )
    }

    fn flow(cport: u16) -> Ct4Key {
        Ct4Key::of(6, (CLIENT, cport), (BACKEND, 8080))
    }

    #[test]
    fn an_entry_goes_with_its_flow_and_stays_while_conntrack_or_nat_carries_it() {
        let now = 100 * SECOND;
        let old = now - 60 * SECOND;
        let entries = [
            original(1000, old), // its conntrack entry is live
            reply(1000, old),
            original(2000, old), // gone from conntrack: stale
            reply(2000, old),
            original(3000, old), // carried by nat4 (a NodePort flow to another node)
            reply(3000, old),
        ];
        let nat = [Nat4Key {
            saddr: CLIENT,
            daddr: BACKEND,
            sport: 3000,
            dport: 8080,
            protocol: 6,
            direction: DIR_EGRESS,
            _pad: [0; 2],
        }];
        let live = live([flow(1000)], &nat);
        let mut doomed = stale(&entries, &live, now);
        doomed.sort_unstable();
        let mut want = vec![original(2000, old).0, reply(2000, old).0];
        want.sort_unstable();
        assert_eq!(doomed, want);
    }

    #[test]
    fn the_list_shows_original_entries_with_their_conntrack_idle_time() {
        use crate::kernel::fake::FakeKernel;
        let kernel = FakeKernel::default();
        let now = 100 * SECOND;
        for (k, v) in [
            original(1000, now - 30 * SECOND),
            reply(1000, now - 30 * SECOND),
            original(2000, now - 50 * SECOND),
        ] {
            kernel.ct().services4.insert(k, v);
        }
        kernel
            .ct()
            .create4(flow(1000), maps_schema::CtEntry::new(now - 4 * SECOND, 0));
        let flows = list(&kernel, now).expect("list");
        let shown: Vec<_> = flows
            .iter()
            .map(|f| {
                (
                    f.client.as_str(),
                    f.frontend.as_str(),
                    f.backend.as_str(),
                    f.idle_secs,
                    f.age_secs,
                )
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                (
                    "10.0.0.1:1000",
                    "10.96.0.10:80",
                    "10.0.1.7:8080",
                    Some(4),
                    30
                ),
                ("10.0.0.1:2000", "10.96.0.10:80", "10.0.1.7:8080", None, 50),
            ]
        );
    }

    #[test]
    fn a_young_entry_stays_though_its_flow_is_not_seen_yet() {
        let now = 100 * SECOND;
        let entries = [
            original(1000, now - SECOND),
            original(2000, now - 6 * SECOND),
        ];
        let doomed = stale(&entries, &HashSet::new(), now);
        assert_eq!(doomed, vec![original(2000, 0).0]);
    }
}
