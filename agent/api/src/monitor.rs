//! `GET /v1/monitor`: sampled drop events, one JSON object per line (chunked), as the agent reads
//! them from the programs' `drop_events` ring buffer.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// One dropped packet, decoded from the first bytes the program captured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropEventView {
    /// The drop reason's name (`policy-denied`, …).
    pub reason: String,
    /// Its code.
    pub code: u32,
    /// Where it dropped (`from-endpoint`, `to-endpoint`, `prefilter`).
    pub direction: String,
    /// The interface.
    pub ifindex: u32,
    /// The packet's length.
    pub packet_len: u32,
    /// Source address, when the captured bytes hold an IP header.
    #[serde(default)]
    pub src: Option<IpAddr>,
    /// Destination address.
    #[serde(default)]
    pub dst: Option<IpAddr>,
    /// IP protocol number.
    #[serde(default)]
    pub protocol: Option<u8>,
    /// TCP/UDP/SCTP source port.
    #[serde(default)]
    pub src_port: Option<u16>,
    /// TCP/UDP/SCTP destination port.
    #[serde(default)]
    pub dst_port: Option<u16>,
}
