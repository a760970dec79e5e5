//! A client process for the socket LB tests: joins a cgroup (or none: `-`), enters a network
//! namespace, then talks to an address as a pod's application would, and prints one line per
//! exchange:
//! - `tcp COUNT ADDR`: COUNT connections; each prints `tcp <first line read> <getpeername>` or
//!   `tcp-error <error>`.
//! - `tcp6 COUNT ADDR`: as `tcp`, from an IPv6 socket to ADDR's IPv4-mapped address
//!   (`::ffff:a.b.c.d`), as a dual-stack application connects to an IPv4 peer.
//! - `udp COUNT ADDR`: COUNT connected UDP sockets, one datagram each; each prints
//!   `udp <answer> <recvfrom's source> <getpeername>` or `udp-error <error>`.
//! - `udp-sendto COUNT ADDR`: COUNT unconnected UDP sockets, each sending three datagrams to ADDR
//!   with `sendto` and reading each answer with `recvfrom`; each prints
//!   `udp <answer>,<answer>,<answer> <source>,<source>,<source>` or `udp-error <error>`.
//! - `udp6-sendto COUNT ADDR`: as `udp-sendto`, from an IPv6 socket to ADDR's IPv4-mapped address.
//! - `tcp-time COUNT ADDR` (the services benchmark): COUNT connections one after the other, each
//!   closed once the server has closed it; prints `elapsed_ns <N> failed <M>` for all of them.
//! - `udp-time COUNT ADDR` (the services benchmark): COUNT exchanges one after the other, each a
//!   new unconnected UDP socket sending one datagram with `sendto` and reading the answer with
//!   `recvfrom`; prints as `tcp-time`.
//!
//! Usage: `wt-sockclient CGROUP_DIR|- NETNS_PATH tcp|tcp6|udp|udp-sendto|udp6-sendto|tcp-time|udp-time COUNT ADDR`. The cgroup is joined first,
//! from the host's mount namespace (`ip netns exec` would remount `/sys`).

use std::{
    io::{BufRead as _, BufReader},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use anyhow::{Context as _, bail};
use nix::sched::{CloneFlags, setns};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [cgroup, netns, kind, count, addr] = args.as_slice() else {
        bail!(
            "usage: wt-sockclient CGROUP_DIR|- NETNS_PATH tcp|tcp6|udp|udp-sendto|udp6-sendto|tcp-time|udp-time COUNT ADDR"
        );
    };
    let count: u32 = count.parse().context("COUNT")?;
    let addr: SocketAddr = addr.parse().context("ADDR")?;
    if cgroup != "-" {
        let procs = std::path::Path::new(cgroup).join("cgroup.procs");
        std::fs::write(&procs, "0").with_context(|| format!("join {}", procs.display()))?;
    }
    let ns = std::fs::File::open(netns).with_context(|| format!("open {netns}"))?;
    setns(ns, CloneFlags::CLONE_NEWNET).context("enter the network namespace")?;
    let timeout = Duration::from_secs(3);
    if kind == "tcp-time" || kind == "udp-time" {
        let (elapsed, failed) = if kind == "tcp-time" {
            tcp_time(addr, count, timeout)
        } else {
            udp_time(addr, count, timeout)
        };
        println!("elapsed_ns {} failed {failed}", elapsed.as_nanos());
        return Ok(());
    }
    for _ in 0..count {
        match kind.as_str() {
            "tcp" => match tcp(addr, timeout) {
                Ok((line, peer)) => println!("tcp {line} {peer}"),
                Err(e) => println!("tcp-error {e:#}"),
            },
            "tcp6" => match tcp(mapped(addr), timeout) {
                Ok((line, peer)) => println!("tcp {line} {peer}"),
                Err(e) => println!("tcp-error {e:#}"),
            },
            "udp" => match udp(addr, timeout) {
                Ok((answer, from, peer)) => println!("udp {answer} {from} {peer}"),
                Err(e) => println!("udp-error {e:#}"),
            },
            "udp-sendto" | "udp6-sendto" => {
                let (bind, to) = if kind == "udp6-sendto" {
                    ("[::]:0", mapped(addr))
                } else {
                    ("0.0.0.0:0", addr)
                };
                match udp_sendto(bind, to, timeout) {
                    Ok((answers, sources)) => {
                        println!("udp {} {}", answers.join(","), sources.join(","));
                    }
                    Err(e) => println!("udp-error {e:#}"),
                }
            }
            other => bail!("unknown kind {other:?}: use tcp, tcp6, udp, udp-sendto or udp6-sendto"),
        }
    }
    Ok(())
}

/// `addr` as an IPv4-mapped IPv6 address (an IPv6 address stays as it is).
fn mapped(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(v4) => SocketAddr::V6(std::net::SocketAddrV6::new(
            v4.ip().to_ipv6_mapped(),
            v4.port(),
            0,
            0,
        )),
        v6 @ SocketAddr::V6(_) => v6,
    }
}

fn tcp(addr: SocketAddr, timeout: Duration) -> anyhow::Result<(String, SocketAddr)> {
    let stream = TcpStream::connect_timeout(&addr, timeout).context("connect")?;
    stream.set_read_timeout(Some(timeout))?;
    let peer = stream.peer_addr().context("getpeername")?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .context("read")?;
    Ok((line.trim_end().to_owned(), peer))
}

/// `count` connections to `addr`, each read to its end (the server closes first, so the client's
/// port is not left in `TIME_WAIT`): the time they took, and how many failed.
fn tcp_time(addr: SocketAddr, count: u32, timeout: Duration) -> (std::time::Duration, u32) {
    use std::io::Read as _;
    let mut failed = 0;
    let start = std::time::Instant::now();
    for _ in 0..count {
        let ok = TcpStream::connect_timeout(&addr, timeout).is_ok_and(|mut s| {
            let _ = s.set_read_timeout(Some(timeout));
            let mut buf = [0u8; 16];
            s.read(&mut buf).is_ok()
        });
        if !ok {
            failed += 1;
        }
    }
    (start.elapsed(), failed)
}

fn udp(addr: SocketAddr, timeout: Duration) -> anyhow::Result<(String, SocketAddr, SocketAddr)> {
    let socket = UdpSocket::bind("0.0.0.0:0").context("bind")?;
    socket.set_read_timeout(Some(timeout))?;
    socket.connect(addr).context("connect")?;
    let peer = socket.peer_addr().context("getpeername")?;
    socket.send(b"ask").context("send")?;
    let mut buf = [0u8; 512];
    let (n, from) = socket.recv_from(&mut buf).context("recvfrom")?;
    Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from, peer))
}

/// Three datagrams from one unconnected socket bound to `bind`, each sent to `to` and answered:
/// the answers and the sources `recvfrom` gave them.
fn udp_sendto(
    bind: &str,
    to: SocketAddr,
    timeout: Duration,
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let socket = UdpSocket::bind(bind).context("bind")?;
    socket.set_read_timeout(Some(timeout))?;
    let (mut answers, mut sources) = (Vec::new(), Vec::new());
    let mut buf = [0u8; 512];
    for _ in 0..3 {
        socket.send_to(b"ask", to).context("sendto")?;
        let (n, from) = socket.recv_from(&mut buf).context("recvfrom")?;
        answers.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        sources.push(from.to_string());
    }
    Ok((answers, sources))
}

/// `count` exchanges with `addr`, each from a new unconnected UDP socket: the time they took,
/// and how many failed.
fn udp_time(addr: SocketAddr, count: u32, timeout: Duration) -> (std::time::Duration, u32) {
    let mut failed = 0;
    let mut buf = [0u8; 64];
    let start = std::time::Instant::now();
    for _ in 0..count {
        let ok = UdpSocket::bind("0.0.0.0:0").is_ok_and(|s| {
            s.set_read_timeout(Some(timeout)).is_ok()
                && s.send_to(b"ask", addr).is_ok()
                && s.recv_from(&mut buf).is_ok()
        });
        if !ok {
            failed += 1;
        }
    }
    (start.elapsed(), failed)
}
