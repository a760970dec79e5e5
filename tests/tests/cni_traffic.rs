//! TCP between two pods that weir-cni attached, IPv4 and IPv6, through the node: the link-local
//! gateways, host routes and attached programs carry real traffic.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use serde_json::json;
use tests::{
    cni::{CniNode, Pod},
    privileged::require_root,
};

/// Sends a line from `client` to a listener in `server` at `ip`, returns what came back.
fn echo(client: &Pod, server: &Pod, ip: IpAddr) -> std::io::Result<String> {
    let addr = SocketAddr::new(ip, 18_080);
    let listener = server.ns.run(move || TcpListener::bind(addr))?;
    std::thread::scope(|s| {
        let srv = s.spawn(move || -> std::io::Result<()> {
            listener.set_nonblocking(false)?;
            let (mut conn, _) = listener.accept()?;
            let mut buf = [0u8; 5];
            conn.read_exact(&mut buf)?;
            conn.write_all(&buf)
        });
        let got = client.ns.run(move || -> std::io::Result<String> {
            let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            conn.set_read_timeout(Some(Duration::from_secs(5)))?;
            conn.write_all(b"hello")?;
            let mut buf = [0u8; 5];
            conn.read_exact(&mut buf)?;
            Ok(String::from_utf8_lossy(&buf).into_owned())
        });
        if got.is_ok() {
            srv.join().expect("server thread")?;
        }
        got
    })
}

#[test]
fn tcp_flows_between_pods_over_ipv4_and_ipv6() {
    if !require_root("tcp_flows_between_pods_over_ipv4_and_ipv6") {
        return;
    }
    let node = CniNode::start(&["--pool", "10.244.0.0/16", "--pool", "fd00:77::/112"]);
    let conf = node.conf(&json!({"ipam": {"families": ["ipv4", "ipv6"]}}));
    let (a, b) = (Pod::new(), Pod::new());
    let ra = node.add(&a, &conf);
    let rb = node.add(&b, &conf);
    for ipv6 in [false, true] {
        let ip: IpAddr = Pod::address(&rb, ipv6).parse().expect("address");
        let got = echo(&a, &b, ip).unwrap_or_else(|e| panic!("TCP to {ip} failed: {e}"));
        assert_eq!(got, "hello");
    }
    // CHECK of a dual-stack pod passes too.
    node.exec(&a.call("CHECK"), &tests::cni::with_prev(&conf, Some(&ra)))
        .ok("dual-stack CHECK");
    node.del(&a, &conf, Some(&ra));
    node.del(&b, &conf, Some(&rb));
}
