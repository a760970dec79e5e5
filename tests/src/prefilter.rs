//! The XDP prefilter tests' wire: a sender with several source addresses on one veth end, a
//! receiver owning the target address on the other, and UDP datagrams counted by source.

use std::{
    net::{Ipv4Addr, UdpSocket},
    time::{Duration, Instant},
};

use crate::netns::NetNs;

/// Gives `sender`'s `sender_dev` each of `sources` (/32) and a route to `target` through it, and
/// `receiver`'s `receiver_dev` the `target` (/32) and a route back to `sources_route`.
pub fn plumb(
    sender: &NetNs,
    sender_dev: &str,
    sources: &[Ipv4Addr],
    receiver: &NetNs,
    receiver_dev: &str,
    target: Ipv4Addr,
    sources_route: &str,
) {
    for src in sources {
        sender.exec(&["ip", "addr", "add", &format!("{src}/32"), "dev", sender_dev]);
    }
    let target_route = format!("{target}/32");
    sender.exec(&["ip", "route", "add", &target_route, "dev", sender_dev]);
    receiver.exec(&["ip", "addr", "add", &target_route, "dev", receiver_dev]);
    receiver.exec(&["ip", "route", "add", sources_route, "dev", receiver_dev]);
}

/// A UDP socket on `target` in `receiver` that gives up a read after 100 ms.
#[must_use]
pub fn receiver_socket(receiver: &NetNs, target: Ipv4Addr) -> UdpSocket {
    let rx = receiver.run(|| UdpSocket::bind((target, 0)).expect("bind receiver"));
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    rx
}

/// Datagrams from `src` (sent from `sender` to `target`) that reach `rx` within `wait`; it stops
/// counting at 3.
#[must_use]
pub fn received_from(
    sender: &NetNs,
    src: Ipv4Addr,
    target: Ipv4Addr,
    rx: &UdpSocket,
    wait: Duration,
) -> usize {
    let tx = sender.run(move || UdpSocket::bind((src, 0)).expect("bind sender"));
    let port = rx.local_addr().expect("addr").port();
    let deadline = Instant::now() + wait;
    let (mut got, mut buf) = (0, [0u8; 16]);
    while Instant::now() < deadline && got < 3 {
        tx.send_to(b"weir", (target, port)).expect("send");
        if let Ok((_, from)) = rx.recv_from(&mut buf) {
            got += usize::from(from.ip() == src);
        }
    }
    got
}
