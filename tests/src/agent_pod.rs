//! A pod on a node namespace registered straight through the agent's API (no CNI): a netns with
//! a veth, an address from `POST /v1/ipam/allocate`, routes via the gateway, the endpoint PUT with
//! its `app` label. For agent tests that need real traffic between a few pods.

use std::{
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use hyper::Method;
use serde_json::{Value, json};

use crate::{
    agent_proc::AgentProcess,
    netns::{NetNs, VethPair},
    pod::{GATEWAY, workload_name},
};

/// The pod: its namespace, address and veth (removed on drop).
pub struct Pod<'a> {
    /// Its network namespace.
    pub ns: NetNs,
    /// Its IPv4 address.
    pub ip: String,
    /// Its veth's name on the node (a `weir*` workload link).
    pub host: String,
    _veth: VethPair<'a>,
}

/// Creates pod `name` labelled `app` on `node` and registers it with `agent`.
pub fn pod<'a>(node: &'a NetNs, agent: &AgentProcess, name: &str, app: &str) -> Pod<'a> {
    let ns = NetNs::new();
    let host = workload_name();
    let veth = VethPair::named(node, &host, &ns, "eth0");
    let handle = format!("wt-net.{name}");
    let ip = allocate_ipv4(agent, &handle);
    node.exec(&["ip", "addr", "add", &format!("{GATEWAY}/32"), "dev", &host]);
    node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", &host]);
    ns.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
    ns.exec(&["ip", "route", "add", GATEWAY, "dev", "eth0"]);
    ns.exec(&[
        "ip", "route", "add", "default", "via", GATEWAY, "dev", "eth0",
    ]);
    let body = json!({
        "container_id": name, "ifname": "eth0", "host_ifname": host, "namespace": "default",
        "pod": name, "labels": {"app": app}, "handle": handle, "ips": [ip],
    });
    let _: Value = agent
        .api(
            Method::PUT,
            &format!("/v1/endpoints/{name}:eth0"),
            Some(&body),
        )
        .expect("register");
    Pod {
        ns,
        ip,
        host,
        _veth: veth,
    }
}

/// One IPv4 address from the agent's IPAM (`POST /v1/ipam/allocate`) under `handle`.
#[must_use]
pub fn allocate_ipv4(agent: &AgentProcess, handle: &str) -> String {
    let alloc: Value = agent
        .api(
            Method::POST,
            "/v1/ipam/allocate",
            Some(&json!({"handle": handle, "ipv4": 1})),
        )
        .expect("allocate");
    alloc["ips"][0].as_str().expect("address").to_owned()
}

/// True when `from` connects to `to` on TCP 8080 within 700 ms.
pub fn connects(from: &Pod<'_>, to: &Pod<'_>) -> bool {
    let addr: SocketAddr = format!("{}:8080", to.ip).parse().expect("addr");
    from.ns
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_millis(700)).is_ok())
}
