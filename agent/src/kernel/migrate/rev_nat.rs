//! The reverse NAT of translated flows across conntrack layouts 2 and 3. Layout 2 keeps a
//! translated flow's service id in `svc_ct4_v1`'s reply entry (backend → client); layout 3 keeps
//! it in the flow's conntrack entry (`CtEntry::rev_nat`). An upgrade from layout 2 or older fills
//! each IPv4 entry's `rev_nat` from the reply entry of its flow; a rollback to layout 2 or older
//! writes those reply entries back from the entries that have one, so the older programs find
//! every translated flow's frontend either way and no reply goes out untranslated.

use std::collections::HashMap;

use maps_schema::{
    Ct4Key, CtEntry, SvcCt4Entry, SvcCt4Key, conntrack::FLAG_OPENER_IS_B, service_ct::DIR_REPLY,
};

/// The first conntrack layout that keeps the reverse NAT itself.
pub const FIRST_IN_CONNTRACK: u32 = 3;

/// The `svc_ct4_v1` key of the reply direction of the flow `key` (with `entry`'s opener): from
/// the end that did not open the flow (the backend) to the one that did (the client).
#[must_use]
pub fn reply_key(key: &Ct4Key, entry: &CtEntry) -> SvcCt4Key {
    let opener_is_b = entry.flags & FLAG_OPENER_IS_B != 0;
    let ((client, cport), (backend, bport)) = if opener_is_b {
        ((key.addr_b, key.port_b), (key.addr_a, key.port_a))
    } else {
        ((key.addr_a, key.port_a), (key.addr_b, key.port_b))
    };
    SvcCt4Key {
        saddr: backend,
        daddr: client,
        sport: bport,
        dport: cport,
        protocol: key.protocol,
        direction: DIR_REPLY,
        _pad: [0; 2],
    }
}

/// Upgrade: every entry without a reverse NAT whose flow has a reply entry in `replies` gets that
/// entry's service id. Returns how many were filled.
pub fn fill(entries: &mut [(Ct4Key, CtEntry)], replies: &HashMap<SvcCt4Key, SvcCt4Entry>) -> usize {
    let mut filled = 0;
    for (key, entry) in entries.iter_mut().filter(|(_, e)| e.rev_nat == 0) {
        if let Some(reply) = replies.get(&reply_key(key, entry)) {
            entry.rev_nat = reply.service_id;
            filled += 1;
        }
    }
    filled
}

/// Rollback: the reply entries of every entry with a reverse NAT, as layout 2 wrote them (the
/// client's end, the service id; the backend id is not kept in conntrack and is left 0: replies
/// only need the service).
#[must_use]
pub fn replies(entries: &[(Ct4Key, CtEntry)]) -> Vec<(SvcCt4Key, SvcCt4Entry)> {
    entries
        .iter()
        .filter(|(_, e)| e.rev_nat != 0)
        .map(|(key, entry)| {
            let k = reply_key(key, entry);
            let value = SvcCt4Entry {
                addr: k.daddr,
                port: k.dport,
                _pad: 0,
                service_id: entry.rev_nat,
                backend_id: 0,
                last_seen_ns: entry.last_seen_ns,
            };
            (k, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(client: [u8; 4], cport: u16, backend: [u8; 4], bport: u16) -> (Ct4Key, u32) {
        // Normalised as the programs do: the lower (address, port) is `a`.
        if (client, cport) <= (backend, bport) {
            (
                Ct4Key {
                    addr_a: client,
                    addr_b: backend,
                    port_a: cport,
                    port_b: bport,
                    protocol: 6,
                    _pad: [0; 3],
                },
                0,
            )
        } else {
            (
                Ct4Key {
                    addr_a: backend,
                    addr_b: client,
                    port_a: bport,
                    port_b: cport,
                    protocol: 6,
                    _pad: [0; 3],
                },
                FLAG_OPENER_IS_B,
            )
        }
    }

    #[test]
    fn a_rollback_writes_what_an_upgrade_reads_whichever_end_is_lower() {
        let mut entries = Vec::new();
        for (i, (client, backend)) in [
            ([10, 0, 0, 1], [10, 0, 0, 9]),
            ([10, 0, 0, 9], [10, 0, 0, 1]),
            ([10, 0, 0, 5], [10, 0, 0, 5]),
        ]
        .into_iter()
        .enumerate()
        {
            let (key, opener) = flow(client, 40_000, backend, 8080);
            let entry = CtEntry {
                rev_nat: i as u32 + 7,
                ..CtEntry::new(100 + i as u64, opener)
            };
            entries.push((key, entry));
        }
        // A flow without a translation has no reply entry.
        let (plain, opener) = flow([10, 0, 0, 2], 1, [10, 0, 0, 3], 2);
        entries.push((plain, CtEntry::new(1, opener)));
        let written = replies(&entries);
        assert_eq!(written.len(), 3);
        for (k, v) in &written {
            assert_eq!(k.sport, 8080, "the reply leaves the backend's port");
            assert_eq!((v.port, v.addr), (k.dport, k.daddr), "to the client");
            assert_eq!(k.direction, DIR_REPLY);
        }
        let table: HashMap<SvcCt4Key, SvcCt4Entry> = written.into_iter().collect();
        let mut upgraded: Vec<(Ct4Key, CtEntry)> = entries
            .iter()
            .map(|(k, e)| (*k, CtEntry { rev_nat: 0, ..*e }))
            .collect();
        assert_eq!(fill(&mut upgraded, &table), 3);
        assert_eq!(upgraded, entries, "the round trip keeps every reverse NAT");
    }
}
