//! Writing ClusterIP services into a loaded object's service maps (`svc4_v1`, `svc_slots_v1`,
//! `svc_members_v1`, `svc_backend4_v1`, `svc_revnat4_v1`) as the agent's drivers do, and emptying a map: for the
//! service packet tests and `bench services`.

use std::net::Ipv4Addr;

use aya::{
    Ebpf,
    maps::{HashMap, MapData},
};
use maps_schema::service::{
    Backend4, MemberKey, MemberValue, RevNat4, SVC_BACKENDS4, SVC_MEMBERS, SVC_REVNAT4, SVC_SLOTS,
    SVC4, SlotKey, SlotValue, Svc4Key, Svc4Value,
};

/// One service frontend and its backends.
#[derive(Clone, Copy, Debug)]
pub struct Frontend<'a> {
    /// The service id (key of its slots and reverse NAT).
    pub id: u32,
    /// The cluster IP.
    pub vip: Ipv4Addr,
    /// The Service port.
    pub port: u16,
    /// IP protocol.
    pub protocol: u8,
    /// (backend id, address, port) in slot order.
    pub backends: &'a [(u32, Ipv4Addr, u16)],
}

fn hash<'a, K: aya::Pod, V: aya::Pod>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> HashMap<&'a mut MapData, K, V> {
    HashMap::try_from(
        ebpf.map_mut(name)
            .unwrap_or_else(|| panic!("no map {name}")),
    )
    .unwrap_or_else(|e| panic!("{name} is not a hash map: {e}"))
}

/// Writes `f`: backends, slots (with their inverse, the members) and reverse NAT before the
/// frontend that points at them. Slots beyond the new count, and the members of backends `f` no
/// longer has, are left as they were (the agent's write order does the same: the count shrinks
/// first; the programs check a member against its slot).
pub fn write_service(ebpf: &mut Ebpf, f: &Frontend<'_>) {
    {
        let mut m: HashMap<_, u32, Backend4> = hash(ebpf, SVC_BACKENDS4);
        for (bid, addr, port) in f.backends {
            let b = Backend4 {
                addr: addr.octets(),
                port: *port,
                protocol: f.protocol,
                flags: 0,
            };
            m.insert(bid, &b, 0).expect("insert backend");
        }
    }
    {
        let mut m: HashMap<_, SlotKey, SlotValue> = hash(ebpf, SVC_SLOTS);
        for (slot, (bid, _, _)) in f.backends.iter().enumerate() {
            let key = SlotKey {
                service_id: f.id,
                slot: u16::try_from(slot).expect("slot"),
                pad: 0,
            };
            m.insert(&key, &SlotValue { backend_id: *bid }, 0)
                .expect("insert slot");
        }
    }
    {
        let mut m: HashMap<_, MemberKey, MemberValue> = hash(ebpf, SVC_MEMBERS);
        for (slot, (bid, _, _)) in f.backends.iter().enumerate() {
            let key = MemberKey {
                service_id: f.id,
                backend_id: *bid,
            };
            let value = MemberValue {
                slot: u16::try_from(slot).expect("slot"),
                pad: 0,
            };
            m.insert(&key, &value, 0).expect("insert member");
        }
    }
    {
        let mut m: HashMap<_, u32, RevNat4> = hash(ebpf, SVC_REVNAT4);
        let rev = RevNat4 {
            addr: f.vip.octets(),
            port: f.port,
            pad: 0,
        };
        m.insert(&f.id, &rev, 0).expect("insert revnat");
    }
    let mut m: HashMap<_, Svc4Key, Svc4Value> = hash(ebpf, SVC4);
    let key = Svc4Key {
        addr: f.vip.octets(),
        port: f.port,
        protocol: f.protocol,
        scope: 0,
    };
    let value = Svc4Value {
        service_id: f.id,
        backend_count: u16::try_from(f.backends.len()).expect("count"),
        ..Svc4Value::default()
    };
    m.insert(&key, &value, 0).expect("insert frontend");
}

/// Deletes every entry of the hash (or LRU hash) map `name`, whose keys are `K`.
pub fn clear<K: aya::Pod, V: aya::Pod>(ebpf: &mut Ebpf, name: &str) {
    let mut m: HashMap<_, K, V> = hash(ebpf, name);
    let keys: Vec<K> = m.keys().filter_map(Result::ok).collect();
    for key in keys {
        // An LRU map may have evicted it meanwhile.
        let _ = m.remove(&key);
    }
}
