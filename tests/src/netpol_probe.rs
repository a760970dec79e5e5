//! Request/response servers and bounded probes for the NetworkPolicy conformance matrix: TCP
//! (a connection completes), UDP (a datagram is echoed) and SCTP (an INIT is answered by an INIT
//! ACK), on a pod's (or an outside host's) network namespace.
//!
//! The kernels these tests run on may lack SCTP (`CONFIG_IP_SCTP`: `socket(…, IPPROTO_SCTP)`
//! fails with `EPROTONOSUPPORT` here), so SCTP goes over raw IP sockets of protocol 132: the
//! client sends an INIT chunk from a port of its own, the server answers each INIT to a port it
//! serves with an INIT ACK from that port. Both are real packets through the veths and weir's
//! programs, which is what the matrix tests. A raw socket that receives a protocol also keeps the
//! kernel from answering "protocol unreachable".
//!
//! Sockets are created on a thread that entered the namespace and stay in it; the threads that
//! serve them run anywhere.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    os::fd::{AsRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nix::sys::{
    socket::{
        AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, recvfrom, sendto,
        setsockopt, socket, sockopt,
    },
    time::{TimeVal, TimeValLike as _},
};

use crate::{netns::NetNs, netpol::Proto};

/// SCTP chunk types used here.
const SCTP_INIT: u8 = 1;
const SCTP_INIT_ACK: u8 = 2;

/// How long a probe waits for its answer: a denied probe costs this much.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// The servers of one namespace (TCP and UDP on `tcp_udp_ports`, SCTP on `sctp_ports`), stopped
/// on drop.
#[derive(Debug)]
pub struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    /// Starts the servers inside `ns`.
    #[must_use]
    pub fn start(ns: &NetNs, tcp_udp_ports: &[u16], sctp_ports: &[u16]) -> Self {
        let ports = tcp_udp_ports.to_vec();
        let (tcp, udp, raw): (Vec<TcpListener>, Vec<UdpSocket>, OwnedFd) = ns.run(move || {
            let tcp = ports
                .iter()
                .map(|p| {
                    TcpListener::bind(("0.0.0.0", *p))
                        .unwrap_or_else(|e| panic!("listen on TCP {p}: {e}"))
                })
                .collect();
            let udp = ports
                .iter()
                .map(|p| {
                    UdpSocket::bind(("0.0.0.0", *p)).unwrap_or_else(|e| panic!("bind UDP {p}: {e}"))
                })
                .collect();
            (tcp, udp, raw_sctp())
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for listener in tcp {
            listener.set_nonblocking(true).expect("nonblocking");
            let stop = Arc::clone(&stop);
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => drop(conn),
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            }));
        }
        for sock in udp {
            sock.set_read_timeout(Some(Duration::from_millis(100)))
                .expect("read timeout");
            let stop = Arc::clone(&stop);
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = sock.recv_from(&mut buf) {
                        // An echo; a reply the policy drops is the probe's business.
                        let _ = sock.send_to(&buf[..n], from);
                    }
                }
            }));
        }
        let served = sctp_ports.to_vec();
        let stop_sctp = Arc::clone(&stop);
        threads.push(std::thread::spawn(move || {
            sctp_responder(&raw, &served, &stop_sctp);
        }));
        Self { stop, threads }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A raw IPv4 socket of protocol SCTP, receiving with a short timeout.
fn raw_sctp() -> OwnedFd {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Sctp,
    )
    .unwrap_or_else(|e| panic!("a raw IP socket of protocol 132 (SCTP): {e}"));
    setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::milliseconds(50)).expect("SO_RCVTIMEO");
    fd
}

/// An SCTP packet (no IP header): common header, then one INIT-shaped chunk of type `chunk`.
/// The checksum stays zero: no SCTP stack checks it here, and weir's programs do not.
fn sctp_packet(sport: u16, dport: u16, vtag: u32, chunk: u8, initiate_tag: u32) -> [u8; 32] {
    let mut p = [0u8; 32];
    p[0..2].copy_from_slice(&sport.to_be_bytes());
    p[2..4].copy_from_slice(&dport.to_be_bytes());
    p[4..8].copy_from_slice(&vtag.to_be_bytes());
    p[12] = chunk;
    p[14..16].copy_from_slice(&20u16.to_be_bytes());
    p[16..20].copy_from_slice(&initiate_tag.to_be_bytes());
    p[20..24].copy_from_slice(&65_536u32.to_be_bytes());
    p[24..26].copy_from_slice(&1u16.to_be_bytes());
    p[26..28].copy_from_slice(&1u16.to_be_bytes());
    p[28..32].copy_from_slice(&1u32.to_be_bytes());
    p
}

/// What an SCTP packet received on a raw socket (IPv4 header included) says: source address,
/// ports, chunk type and the chunk's initiate tag.
fn parse_sctp(buf: &[u8]) -> Option<(Ipv4Addr, u16, u16, u8, u32)> {
    let ihl = usize::from(*buf.first()? & 0x0f) * 4;
    let src = Ipv4Addr::new(*buf.get(12)?, *buf.get(13)?, *buf.get(14)?, *buf.get(15)?);
    let s = buf.get(ihl..ihl + 20)?;
    Some((
        src,
        u16::from_be_bytes([s[0], s[1]]),
        u16::from_be_bytes([s[2], s[3]]),
        s[12],
        u32::from_be_bytes([s[16], s[17], s[18], s[19]]),
    ))
}

fn sctp_responder(raw: &OwnedFd, served: &[u16], stop: &AtomicBool) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, _)) = recvfrom::<SockaddrIn>(raw.as_raw_fd(), &mut buf) else {
            continue;
        };
        let Some((src, sport, dport, chunk, tag)) = parse_sctp(&buf[..n]) else {
            continue;
        };
        if chunk != SCTP_INIT || !served.contains(&dport) {
            continue;
        }
        let reply = sctp_packet(
            dport,
            sport,
            tag,
            SCTP_INIT_ACK,
            0x5eed_0000 | u32::from(sport),
        );
        let to = SockaddrIn::from(SocketAddrV4::new(src, 0));
        let _ = sendto(raw.as_raw_fd(), &reply, &to, MsgFlags::empty());
    }
}

/// One probe, from the namespace it runs in to `to` over `proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The destination.
    pub to: SocketAddrV4,
    /// The protocol.
    pub proto: Proto,
    /// A distinct source port for SCTP (raw sockets see every SCTP packet of the namespace).
    pub sctp_sport: u16,
}

/// Whether the probe got its answer within [`PROBE_TIMEOUT`]. Runs on a thread inside the
/// source namespace.
#[must_use]
pub fn probe(p: &Probe) -> bool {
    match p.proto {
        Proto::Tcp => tcp_probe(p),
        Proto::Udp => udp_probe(p),
        Proto::Sctp => sctp_probe(p),
    }
}

fn tcp_probe(p: &Probe) -> bool {
    TcpStream::connect_timeout(&SocketAddr::V4(p.to), PROBE_TIMEOUT).is_ok()
}

fn udp_probe(p: &Probe) -> bool {
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("a UDP socket");
    sock.set_read_timeout(Some(Duration::from_millis(250)))
        .expect("read timeout");
    let token = *b"weir-netpol-probe";
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let mut buf = [0u8; 64];
    while Instant::now() < deadline {
        // A datagram lost to neighbour resolution is sent again.
        let _ = sock.send_to(&token, p.to);
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            if from == SocketAddr::V4(p.to) && buf[..n] == token {
                return true;
            }
        }
    }
    false
}

fn sctp_probe(p: &Probe) -> bool {
    let raw = raw_sctp();
    let tag = 0x7e57_0000 | u32::from(p.sctp_sport);
    let init = sctp_packet(p.sctp_sport, p.to.port(), 0, SCTP_INIT, tag);
    let to = SockaddrIn::from(SocketAddrV4::new(*p.to.ip(), 0));
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let mut buf = [0u8; 1500];
    let mut next_send = Instant::now();
    while Instant::now() < deadline {
        if Instant::now() >= next_send {
            let _ = sendto(raw.as_raw_fd(), &init, &to, MsgFlags::empty());
            next_send = Instant::now() + Duration::from_millis(250);
        }
        let Ok((n, _)) = recvfrom::<SockaddrIn>(raw.as_raw_fd(), &mut buf) else {
            continue;
        };
        if let Some((src, sport, dport, chunk, _)) = parse_sctp(&buf[..n])
            && src == *p.to.ip()
            && sport == p.to.port()
            && dport == p.sctp_sport
            && chunk == SCTP_INIT_ACK
        {
            return true;
        }
    }
    false
}
