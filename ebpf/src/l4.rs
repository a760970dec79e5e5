//! Upper-layer headers shared by both families: TCP, UDP, and "other" (no ports).

use maps_schema::reason::{DROP_INVALID_HEADER, DROP_INVALID_TCP_FLAGS, DROP_MALFORMED};

use crate::parse::{IPPROTO_TCP, IPPROTO_UDP, Packet, Reason, tcp_flags_invalid};

/// Ports and TCP flags of an upper-layer header.
#[derive(Clone, Copy)]
pub(crate) struct Transport {
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) tcp_flags: u8,
}

/// Parses the TCP or UDP header at `off`; other protocols have no ports.
#[inline(always)]
pub(crate) fn transport(pkt: &Packet, off: usize, proto: u8) -> Result<Transport, Reason> {
    match proto {
        IPPROTO_TCP => {
            let h = pkt.load::<20>(off).ok_or(DROP_MALFORMED)?;
            let doff = usize::from(h[12] >> 4);
            if doff < 5 {
                return Err(DROP_INVALID_HEADER);
            }
            // The options must be there too.
            pkt.ptr::<u8>(off + doff * 4 - 1).ok_or(DROP_MALFORMED)?;
            let flags = h[13];
            if tcp_flags_invalid(flags) {
                return Err(DROP_INVALID_TCP_FLAGS);
            }
            Ok(Transport {
                sport: u16::from_be_bytes([h[0], h[1]]),
                dport: u16::from_be_bytes([h[2], h[3]]),
                tcp_flags: flags,
            })
        }
        IPPROTO_UDP => {
            let h = pkt.load::<8>(off).ok_or(DROP_MALFORMED)?;
            Ok(Transport {
                sport: u16::from_be_bytes([h[0], h[1]]),
                dport: u16::from_be_bytes([h[2], h[3]]),
                tcp_flags: 0,
            })
        }
        _ => Ok(Transport {
            sport: 0,
            dport: 0,
            tcp_flags: 0,
        }),
    }
}
