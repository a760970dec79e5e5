//! Drop events for operators (`GET /v1/monitor`, `weir monitor`): the programs sample drops into
//! the `drop_events` ring buffer; one reader task drains it and hands each decoded event to every
//! subscriber. One reader per agent, because the ring's consumer position lives in the map and is
//! shared by every reader: two readers would split the events between them.
//!
//! The reader starts with the first subscriber and keeps running; with nobody subscribed the
//! events are read and dropped (the ring never stays full, which would lose the next samples).

use std::{
    convert::Infallible,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{Mutex, PoisonError},
};

use axum::{
    body::{Body, Bytes},
    response::{IntoResponse as _, Response},
};
use futures_util::StreamExt as _;
use maps_schema::{DropEvent, reason};
use tokio::sync::broadcast::{self, error::RecvError};
use weir_api::DropEventView;

use crate::kernel::{InspectIo, KernelError, RecordStream};

/// Events a slow subscriber may fall behind by before it misses some.
const BACKLOG: usize = 4096;

/// Errors of the monitor.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The ring buffer cannot be opened.
    #[error("cannot read the drop events ring buffer: {0}")]
    Open(#[source] KernelError),
}

/// The agent's one reader of the drop events ring (an agent has one pin root) and the channel to
/// its subscribers.
#[derive(Default)]
pub struct Monitor {
    reader: Mutex<Option<Reader>>,
}

struct Reader {
    events: broadcast::Sender<DropEventView>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    /// Subscribes to the drop events ring of `kernel`, starting its reader on first use (and
    /// again if it stopped). Call inside the agent's tokio runtime.
    pub fn subscribe(
        &self,
        kernel: &dyn InspectIo,
    ) -> Result<broadcast::Receiver<DropEventView>, MonitorError> {
        let mut reader = self.reader.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = reader.as_ref().filter(|r| !r.task.is_finished()) {
            return Ok(r.events.subscribe());
        }
        let ring = kernel.drop_events().map_err(MonitorError::Open)?;
        let (events, rx) = broadcast::channel(BACKLOG);
        let sender = events.clone();
        let task = tokio::spawn(async move {
            match read(ring, &sender).await {
                Err(e) => {
                    tracing::error!(error = %e, "the drop events reader stopped; the next `weir monitor` restarts it");
                }
                Ok(()) => tracing::warn!(
                    "the drop events ring buffer closed; the next `weir monitor` reopens it"
                ),
            }
        });
        *reader = Some(Reader { events, task });
        Ok(rx)
    }

    /// `GET /v1/monitor`: every event from now on, one JSON object per line, until the client
    /// goes.
    pub fn response(&self, kernel: &dyn InspectIo) -> Result<Response, MonitorError> {
        let rx = self.subscribe(kernel)?;
        let lines = futures_util::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(view) => match serde_json::to_vec(&view) {
                        Ok(mut line) => {
                            line.push(b'\n');
                            return Some((Ok::<_, Infallible>(Bytes::from(line)), rx));
                        }
                        Err(e) => tracing::warn!(error = %e, "cannot encode a drop event; skipped"),
                    },
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "a `weir monitor` fell behind; it missed events");
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        });
        Ok((
            [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
            Body::from_stream(lines),
        )
            .into_response())
    }
}

async fn read(
    mut ring: RecordStream,
    tx: &broadcast::Sender<DropEventView>,
) -> Result<(), KernelError> {
    while let Some(record) = ring.next().await {
        let record = record?;
        match decode(&record) {
            // No subscriber is not an error: the event is read and dropped.
            Some(view) => drop(tx.send(view)),
            None => tracing::warn!(
                len = record.len(),
                "a drop event of an unexpected size; is the agent older than its programs?"
            ),
        }
    }
    Ok(())
}

/// Decodes one ring buffer record: the event, and the addresses and ports of the packet's head
/// when it is IPv4 or IPv6 (`None` for a record of another size).
#[must_use]
pub fn decode(record: &[u8]) -> Option<DropEventView> {
    let event: DropEvent = bytemuck::pod_read_unaligned(record.get(..size_of::<DropEvent>())?);
    let captured = usize::try_from(event.captured)
        .unwrap_or(0)
        .min(event.head.len());
    let head = Head::parse(&event.head[..captured]);
    Some(DropEventView {
        reason: reason::name(event.reason).to_owned(),
        code: event.reason,
        direction: reason::direction_name(event.direction).to_owned(),
        ifindex: event.ifindex,
        packet_len: event.packet_len,
        src: head.src,
        dst: head.dst,
        protocol: head.protocol,
        src_port: head.ports.map(|p| p.0),
        dst_port: head.ports.map(|p| p.1),
    })
}

#[derive(Default)]
struct Head {
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
    protocol: Option<u8>,
    ports: Option<(u16, u16)>,
}

const ETH_LEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
/// Protocols whose header starts with (source port, destination port): TCP, UDP, SCTP.
const PORTED: [u8; 3] = [6, 17, 132];

impl Head {
    fn parse(frame: &[u8]) -> Self {
        let be16 =
            |b: &[u8], at: usize| b.get(at..at + 2).map(|s| u16::from_be_bytes([s[0], s[1]]));
        let Some(ethertype) = be16(frame, 12) else {
            return Self::default();
        };
        let ip = &frame[ETH_LEN.min(frame.len())..];
        let (src, dst, protocol, l4) = match ethertype {
            ETH_P_IP if ip.len() >= 20 => {
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                let src: [u8; 4] = ip[12..16].try_into().unwrap_or_default();
                let dst: [u8; 4] = ip[16..20].try_into().unwrap_or_default();
                (
                    IpAddr::from(Ipv4Addr::from(src)),
                    IpAddr::from(Ipv4Addr::from(dst)),
                    ip[9],
                    ip.get(ihl.max(20)..),
                )
            }
            ETH_P_IPV6 if ip.len() >= 40 => {
                let src: [u8; 16] = ip[8..24].try_into().unwrap_or_default();
                let dst: [u8; 16] = ip[24..40].try_into().unwrap_or_default();
                // Extension headers are not walked: their ports stay unknown.
                (
                    IpAddr::from(Ipv6Addr::from(src)),
                    IpAddr::from(Ipv6Addr::from(dst)),
                    ip[6],
                    ip.get(40..),
                )
            }
            _ => return Self::default(),
        };
        let ports = l4
            .filter(|_| PORTED.contains(&protocol))
            .and_then(|l4| Some((be16(l4, 0)?, be16(l4, 2)?)));
        Self {
            src: Some(src),
            dst: Some(dst),
            protocol: Some(protocol),
            ports,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(frame: &[u8], reason_code: u32) -> Vec<u8> {
        let mut event = DropEvent {
            reason: reason_code,
            direction: reason::DIR_TO_ENDPOINT,
            ifindex: 7,
            packet_len: 74,
            captured: u32::try_from(frame.len()).expect("len"),
            _pad: 0,
            head: [0; maps_schema::events::CAPTURE_BYTES],
        };
        event.head[..frame.len()].copy_from_slice(frame);
        bytemuck::bytes_of(&event).to_vec()
    }

    #[test]
    fn a_tcp_syn_decodes_to_its_addresses_and_ports() {
        let mut frame = vec![0u8; 54];
        frame[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        frame[14] = 0x45;
        frame[23] = 6;
        frame[26..30].copy_from_slice(&[10, 0, 0, 1]);
        frame[30..34].copy_from_slice(&[10, 0, 0, 2]);
        frame[34..36].copy_from_slice(&40000u16.to_be_bytes());
        frame[36..38].copy_from_slice(&8080u16.to_be_bytes());
        let view = decode(&record(&frame, 5)).expect("decodes");
        assert_eq!(view.reason, "policy-denied");
        assert_eq!(view.direction, "to-endpoint");
        assert_eq!(view.src, Some("10.0.0.1".parse().expect("ip")));
        assert_eq!(view.dst, Some("10.0.0.2".parse().expect("ip")));
        assert_eq!(
            (view.protocol, view.src_port, view.dst_port),
            (Some(6), Some(40000), Some(8080))
        );
    }

    #[test]
    fn short_or_foreign_records_decode_to_what_they_hold() {
        assert!(decode(&[0u8; 8]).is_none(), "too short for an event");
        // An ARP frame: reason and place, no addresses.
        let mut frame = vec![0u8; 42];
        frame[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let view = decode(&record(&frame, 3)).expect("decodes");
        assert_eq!(view.reason, "unsupported-ethertype");
        assert_eq!((view.src, view.src_port), (None, None));
        // A truncated IPv4 header.
        let mut frame = vec![0u8; 20];
        frame[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        assert_eq!(decode(&record(&frame, 2)).expect("decodes").src, None);
    }
}
