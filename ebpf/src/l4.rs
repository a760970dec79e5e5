//! Upper-layer headers shared by both families: TCP, UDP, SCTP, and "other" (no ports).

use maps_schema::reason::{DROP_INVALID_HEADER, DROP_INVALID_TCP_FLAGS, DROP_MALFORMED};

use crate::parse::{
    IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, Packet, Reason, split_ports, tcp_flags_invalid, word,
};

/// Ports and TCP flags of an upper-layer header.
#[derive(Clone, Copy)]
pub(crate) struct Transport {
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) tcp_flags: u8,
}

/// Parses the TCP, UDP or SCTP header at `off`; other protocols have no ports.
#[inline(always)]
pub(crate) fn transport(pkt: &Packet, off: usize, proto: u8) -> Result<Transport, Reason> {
    match proto {
        IPPROTO_TCP => {
            let h: *const [u8; 20] = pkt.ptr(off).ok_or(DROP_MALFORMED)?;
            // SAFETY: bounds checked by `ptr` (20 bytes).
            let (ports, offset_flags) = unsafe { (word::<_, u32>(h, 0), word::<_, u16>(h, 12)) };
            let doff = usize::from((offset_flags as u8) >> 4);
            if doff < 5 {
                return Err(DROP_INVALID_HEADER);
            }
            // The options must be there too.
            if doff > 5 {
                pkt.ptr::<u8>(off + doff * 4 - 1).ok_or(DROP_MALFORMED)?;
            }
            let flags = (offset_flags >> 8) as u8;
            if tcp_flags_invalid(flags) {
                return Err(DROP_INVALID_TCP_FLAGS);
            }
            let (sport, dport) = split_ports(ports);
            Ok(Transport {
                sport,
                dport,
                tcp_flags: flags,
            })
        }
        IPPROTO_UDP => {
            let h: *const [u8; 8] = pkt.ptr(off).ok_or(DROP_MALFORMED)?;
            // SAFETY: bounds checked by `ptr` (8 bytes).
            let (sport, dport) = split_ports(unsafe { word(h, 0) });
            Ok(Transport {
                sport,
                dport,
                tcp_flags: 0,
            })
        }
        IPPROTO_SCTP => {
            // The common header: ports, verification tag, checksum (RFC 9260 §3.1). Its flows are
            // keyed by ports as UDP's are; chunks are not parsed.
            let h: *const [u8; 12] = pkt.ptr(off).ok_or(DROP_MALFORMED)?;
            // SAFETY: bounds checked by `ptr` (12 bytes).
            let (sport, dport) = split_ports(unsafe { word(h, 0) });
            Ok(Transport {
                sport,
                dport,
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
