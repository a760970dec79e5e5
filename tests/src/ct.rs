//! Conntrack tests' shared parts: two hand-built pods in the agent's registry, TCP
//! request/response flows that record any error, and conntrack read from outside with bpftool.

use std::{
    collections::BTreeSet,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde_json::json;

use crate::{
    agent_proc::AgentDirs,
    bpf::PinRoot,
    bpf::bpftool,
    netns::{NetNs, VethPair},
    pod::plumb,
};

/// Two hand-built pods behind a node namespace: the server (endpoint 0) and the client
/// (endpoint 1), on workload links the agent attaches to.
pub struct TwoPods<'a> {
    /// The node's namespace (the agent runs in it).
    pub node: &'a NetNs,
    /// The server pod.
    pub server: &'a NetNs,
    /// The client pod.
    pub client: &'a NetNs,
    /// Host-side link names (`weir…`).
    pub hosts: [String; 2],
    /// Pod addresses.
    pub ips: [String; 2],
}

impl TwoPods<'_> {
    /// `server-ip:port`.
    #[must_use]
    pub fn server_addr(&self, port: u16) -> String {
        format!("{}:{port}", self.ips[0])
    }

    /// Writes the registry for both pods and `policy` into `dirs` (see [`write_two_pods`]).
    pub fn write_state(&self, dirs: &AgentDirs, policy: Option<&str>) {
        write_two_pods(
            dirs,
            [&self.hosts[0], &self.hosts[1]],
            [&self.ips[0], &self.ips[1]],
            policy,
        );
    }
}

/// Builds two pods (links `weir<pid><tag>0/1`, addresses `10.<subnet>.0.2/3`), runs `f`, and
/// removes everything, on failure too.
pub fn with_two_pods<R>(tag: char, subnet: u8, f: impl FnOnce(&TwoPods<'_>) -> R) -> R {
    let node = NetNs::new();
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let (server, client) = (NetNs::new(), NetNs::new());
    let hosts = [0, 1].map(|i| format!("weir{:05x}{tag}{i}", std::process::id() & 0xf_ffff));
    let ips = [2, 3].map(|i| format!("10.{subnet}.0.{i}"));
    let server_veth = VethPair::named(&node, &hosts[0], &server, "eth0");
    let client_veth = VethPair::named(&node, &hosts[1], &client, "eth0");
    plumb(&node, &server, &server_veth, &ips[0]);
    plumb(&node, &client, &client_veth, &ips[1]);
    f(&TwoPods {
        node: &node,
        server: &server,
        client: &client,
        hosts,
        ips,
    })
}

/// Every pod ingress-isolated; the server (endpoint 0) admits the client (endpoint 1) on 9000.
/// The client's ingress then admits the server's replies only through conntrack.
pub const ISOLATE_ALL_ADMIT_CLIENT: &str = "kind: NetworkPolicy\nmetadata: {name: isolate, namespace: default}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n---\nkind: NetworkPolicy\nmetadata: {name: server, namespace: default}\nspec:\n  podSelector: {matchLabels: {app: server}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}}]\n    ports: [{port: 9000}]\n";

/// Writes the agent's registry (a server and a client endpoint on `host_ifnames` with `ips`) and
/// `policy` (if any) into `dirs`, as a previous run would have left them.
pub fn write_two_pods(
    dirs: &AgentDirs,
    host_ifnames: [&str; 2],
    ips: [&str; 2],
    policy: Option<&str>,
) {
    let state = dirs.path("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let mut endpoints = serde_json::Map::new();
    for (i, app) in [(0usize, "server"), (1, "client")] {
        endpoints.insert(
            format!("c{i}:eth0"),
            json!({"id": i + 1, "container_id": format!("c{i}"), "ifname": "eth0", "host_ifname": host_ifnames[i],
                   "namespace": "default", "pod": format!("p{i}"), "labels": {"app": app},
                   "handle": format!("wt-net.c{i}"), "ips": [ips[i]]}),
        );
    }
    std::fs::write(
        state.join("endpoints.json"),
        serde_json::to_vec(&json!({"next_id": 3, "endpoints": endpoints})).expect("json"),
    )
    .expect("registry");
    let policies = dirs.path("policies");
    std::fs::create_dir_all(&policies).expect("policy dir");
    if let Some(policy) = policy {
        std::fs::write(policies.join("policy.yaml"), policy).expect("policy");
    }
}

/// Waits (bounded) until the pods' `n / 2` links run both programs (`n` attachments), whichever
/// mechanism the agent uses.
pub fn wait_for_links(node: &NetNs, root: &PinRoot, n: usize) {
    crate::hooks::wait_attached_count(node, root, n / 2, Duration::from_secs(30));
}

/// An echo server on `port` in `ns` for `flows` connections.
pub fn echo_server(ns: &NetNs, port: u16, flows: usize) -> JoinHandle<()> {
    let listener = ns.run(|| TcpListener::bind(("0.0.0.0", port)).expect("listen"));
    std::thread::spawn(move || {
        for stream in listener.incoming().take(flows) {
            let Ok(mut s) = stream else { break };
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    })
}

/// A TCP request/response flow from a client namespace that records the first error.
pub struct Flow {
    echoed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<(), String>>,
}

impl Flow {
    /// Connects from `client` to `server_addr` (`IP:PORT`) and starts exchanging 8 bytes.
    #[must_use]
    pub fn open(client: &NetNs, server_addr: &str) -> Self {
        let addr = server_addr.parse().expect("addr");
        let mut stream = client
            .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect"));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let (stop, echoed) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let thread = {
            let (stop, echoed) = (Arc::clone(&stop), Arc::clone(&echoed));
            std::thread::spawn(move || -> Result<(), String> {
                let mut buf = [0u8; 8];
                while !stop.load(Ordering::Relaxed) {
                    stream
                        .write_all(b"12345678")
                        .map_err(|e| format!("write: {e}"))?;
                    stream
                        .read_exact(&mut buf)
                        .map_err(|e| format!("read: {e}"))?;
                    echoed.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(())
            })
        };
        Self {
            echoed,
            stop,
            thread,
        }
    }

    /// Waits (bounded) until the flow carries more data than it had.
    pub fn assert_moving(&self, what: &str) {
        let before = self.echoed.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.echoed.load(Ordering::Relaxed) <= before + 5 {
            assert!(
                !self.thread.is_finished() && Instant::now() < deadline,
                "a flow stopped carrying data {what}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the flow and returns its first error, if any.
    pub fn finish(self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "the flow thread panicked".to_owned())?
    }
}

/// (family, key bytes) of every entry of the conntrack pins `ct4_v<layout>` and `ct6_v<layout>`,
/// read by bpftool.
#[must_use]
pub fn ct_keys(root: &PinRoot, layout: u32) -> BTreeSet<(u8, Vec<u8>)> {
    let mut keys = BTreeSet::new();
    for (family, stem) in [(4u8, "ct4"), (6, "ct6")] {
        let pin = root.paths().map_pin(&format!("{stem}_v{layout}"));
        let dump = bpftool(&["map", "dump", "pinned", &pin.display().to_string()]);
        for entry in dump.as_array().expect("bpftool dump is an array") {
            let key: Vec<u8> = entry["key"]
                .as_array()
                .expect("raw key bytes")
                .iter()
                .map(|b| {
                    u8::from_str_radix(b.as_str().expect("hex byte").trim_start_matches("0x"), 16)
                        .expect("hex")
                })
                .collect();
            keys.insert((family, key));
        }
    }
    keys
}

/// `bpftool map show` of a pinned map, by name.
#[must_use]
pub fn map_show(root: &PinRoot, name: &str) -> serde_json::Value {
    let pin = root.paths().map_pin(name);
    bpftool(&["map", "show", "pinned", &pin.display().to_string()])
}

/// The names of the conntrack pins (`ct4_…`, `ct6_…`) under the pin root.
#[must_use]
pub fn ct_pins(root: &PinRoot) -> BTreeSet<String> {
    std::fs::read_dir(root.paths().maps_dir())
        .expect("maps dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("ct4_") || n.starts_with("ct6_"))
        .collect()
}
