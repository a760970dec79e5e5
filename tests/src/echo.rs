//! A one-byte TCP echo server and many clients of it: the masquerade tests count the peer
//! addresses the server accepted and check that every flow completes through the translation.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    sync::mpsc,
    time::Duration,
};

use crate::netns::NetNs;

/// Serves `listener` on a thread: each connection gets its one byte back once it sent one; the
/// peer addresses it accepted go to the returned channel.
#[must_use]
pub fn serve(listener: TcpListener) -> mpsc::Receiver<SocketAddr> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let Ok(peer) = stream.peer_addr() else {
                continue;
            };
            if tx.send(peer).is_err() {
                return;
            }
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                if stream.read_exact(&mut b).is_ok() {
                    let _ = stream.write_all(&b);
                }
            });
        }
    });
    rx
}

/// `n` connections to `to` from inside `ns` (5 s to connect, 10 s to read each).
#[must_use]
pub fn connect(ns: &NetNs, to: SocketAddr, n: usize) -> Vec<TcpStream> {
    ns.run(move || {
        (0..n)
            .map(|_| {
                let s = TcpStream::connect_timeout(&to, Duration::from_secs(5))
                    .unwrap_or_else(|e| panic!("connect to {to}: {e}"));
                s.set_read_timeout(Some(Duration::from_secs(10)))
                    .expect("timeout");
                s
            })
            .collect()
    })
}

/// `per_ns` connections to `to` from each of `namespaces`, all opened at once (a thread each).
#[must_use]
pub fn connect_from_each<'a>(
    namespaces: impl IntoIterator<Item = &'a NetNs>,
    to: SocketAddr,
    per_ns: usize,
) -> Vec<TcpStream> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = namespaces
            .into_iter()
            .map(|ns| scope.spawn(move || connect(ns, to, per_ns)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("connects"))
            .collect()
    })
}

/// Sends a byte on each stream and reads it back: every flow completes.
pub fn round_trip(streams: &mut [TcpStream]) {
    for s in streams.iter_mut() {
        s.write_all(b"w").expect("send");
    }
    for s in streams.iter_mut() {
        let mut b = [0u8; 1];
        s.read_exact(&mut b)
            .expect("the reply comes back through the reverse translation");
        assert_eq!(&b, b"w");
    }
}

/// The peer addresses of the next `n` connections [`serve`] accepted (10 s for each).
#[must_use]
pub fn peers(rx: &mpsc::Receiver<SocketAddr>, n: usize) -> Vec<IpAddr> {
    (0..n)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(10))
                .expect("accepted")
                .ip()
        })
        .collect()
}
