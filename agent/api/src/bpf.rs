//! The kernel's view for operators (`weir bpf …`): `GET /v1/bpf/maps`, `GET /v1/bpf/counters`,
//! `GET|DELETE /v1/bpf/ct`, `GET /v1/bpf/nat`.

use serde::{Deserialize, Serialize};

/// One pinned map (`GET /v1/bpf/maps`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapView {
    /// Versioned name.
    pub name: String,
    /// Pin.
    pub pin: String,
    /// Kernel id.
    pub id: u32,
    /// Kernel map type number.
    pub map_type: u32,
    /// Key size.
    pub key_size: u32,
    /// Value size.
    pub value_size: u32,
    /// Capacity.
    pub max_entries: u32,
    /// Flags.
    pub flags: u32,
}

/// One verdict counter slot (`GET /v1/bpf/counters`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CounterView {
    /// Reason code.
    pub code: u32,
    /// Reason name.
    pub reason: String,
    /// Direction name.
    pub direction: String,
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// One conntrack entry as operators read it (`GET /v1/bpf/ct`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CtView {
    /// Protocol number.
    pub protocol: u8,
    /// One end.
    pub a: String,
    /// The other end.
    pub b: String,
    /// State flags (see `maps_schema::conntrack`).
    pub flags: u32,
    /// Seconds since the last packet.
    pub idle_secs: u64,
    /// Seconds since the first packet (since the last packet for entries converted from
    /// conntrack layout 1, which did not record it).
    #[serde(default)]
    pub age_secs: u64,
}

/// `DELETE /v1/bpf/ct` answer: `{"flushed": N}`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CtFlushResponse {
    /// Conntrack entries deleted.
    pub flushed: u64,
}

/// One masqueraded flow as operators read it (`GET /v1/bpf/nat`, `weir bpf nat list`): its
/// egress entry and, when present, its ingress entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatView {
    /// Protocol number.
    pub protocol: u8,
    /// The pod's end (`address:port`; the echo identifier for ICMP).
    pub pod: String,
    /// The remote end.
    pub remote: String,
    /// What the pod's end becomes on the wire (the node address and NAT port).
    pub translated: String,
    /// The reverse (ingress) entry is there: replies are translated back.
    pub reverse: bool,
    /// `FLAG_*` bits of both entries.
    pub flags: u16,
    /// Seconds since the last packet either way.
    pub idle_secs: u64,
    /// Seconds since the flow was translated first.
    pub age_secs: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};

    fn round_trips<T: Serialize + DeserializeOwned>(wire: &Value) {
        let parsed: T = serde_json::from_value(wire.clone()).expect("parses");
        assert_eq!(&serde_json::to_value(&parsed).expect("json"), wire);
    }

    #[test]
    fn the_bpf_views_round_trip() {
        round_trips::<MapView>(
            &json!({"name": "ct4_v3", "pin": "/sys/fs/bpf/weir/maps/ct4_v3",
            "id": 7, "map_type": 9, "key_size": 16, "value_size": 24, "max_entries": 1024, "flags": 0}),
        );
        round_trips::<CounterView>(&json!({"code": 1, "reason": "policy-denied",
            "direction": "from-endpoint", "packets": 3, "bytes": 180}));
        round_trips::<CtView>(&json!({"protocol": 6, "a": "10.244.0.5:40000",
            "b": "10.244.0.6:80", "flags": 3, "idle_secs": 1, "age_secs": 2}));
        round_trips::<CtFlushResponse>(&json!({"flushed": 4}));
        round_trips::<NatView>(&json!({"protocol": 17, "pod": "10.244.0.5:5000",
            "remote": "192.0.2.9:53", "translated": "192.0.2.1:32768", "reverse": true,
            "flags": 0, "idle_secs": 0, "age_secs": 1}));
    }
}
