//! What each fuzz target runs, one function per target (`fuzz_targets/NAME.rs` calls `NAME`).
//! Each takes the raw input and feeds it to the parsing entry point the project uses; a panic,
//! an abort or a timeout is a finding (docs/fuzzing.md). Kept in a library so the corpus replays
//! as an ordinary unit test on the stable toolchain (`corpus_replays` below).

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
    sync::OnceLock,
};

use agent::{
    calc::{
        identity::Identities,
        policy::{compile, load, warnings},
    },
    observe::{monitor, packet, trace},
};
use ipam::{
    Ipam,
    ops::{self, Operation},
    store::{Key, Kind, memory::MemoryStore},
};
use maps_schema::events::{CAPTURE_BYTES, DropEvent};
use serde::{Serialize, de::DeserializeOwned};

/// The names of the targets, as `cargo fuzz list` shows them.
pub const TARGETS: &[&str] = &[
    "cni_config",
    "cni_env",
    "manifest",
    "api_bodies",
    "ipam_records",
    "drop_event",
];

/// weir-cni's network configuration on stdin: `Config::parse` (and what `main` does around it:
/// the version peek, the redacted copy it logs, the CNI error object it prints).
pub fn cni_config(data: &[u8]) {
    let version = cni::config::peek_version(data);
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = cni::config::redacted(&value).to_string();
    }
    match cni::config::Config::parse(data) {
        Ok(mut config) => {
            let _ = config.handle("0123456789abcdef");
            let _ = config.adopt_agent_pin_root(Some(Path::new("/sys/fs/bpf/weir")));
        }
        Err(e) => {
            let version = version.as_deref().unwrap_or(cni::config::NEWEST_VERSION);
            let error = cni::error::CniError::from_error(version, &e);
            let _ = serde_json::to_string(&error);
        }
    }
}

/// weir-cni's environment: one `KEY=VALUE` per line (`CNI_COMMAND`, `CNI_ARGS`, …) through
/// `Env::from_lookup`, and the whole input as a `CNI_ARGS` value and an interface name.
pub fn cni_env(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    match cni::env::Env::from_lookup(|k| vars.get(k).map(|v| (*v).to_owned())) {
        Ok(env) => {
            let _ = (env.container_id(), env.ifname());
            let _ = (
                env.args.pod_namespace(),
                env.args.pod_name(),
                env.args.ips(),
            );
        }
        Err(e) => {
            let error = cni::error::CniError::from_error(cni::config::NEWEST_VERSION, &e);
            let _ = serde_json::to_string(&error);
        }
    }
    if let Ok(args) = cni::env::CniArgs::parse(text) {
        let _ = args.ips();
    }
    let _ = cni::env::validate_ifname(text);
}

/// The standalone source's manifests (`--policy-dir`): every kind, several YAML documents per
/// file, through `load::parse_str`; a set that loads is checked for caveats and compiled.
pub fn manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(set) = load::parse_str("fuzz.yaml", text) else {
        return;
    };
    let _ = warnings::check(&set);
    // A path that does not exist: an empty allocator that lives in memory only.
    let Ok(mut identities) = Identities::load(Path::new("/nonexistent/weir-fuzz/identities.json"))
    else {
        return;
    };
    let _ = compile::compile(&set, &[], &mut identities);
}

/// The agent API's bodies: the first byte picks a body type, the rest is the body. Requests are
/// parsed as the agent's handlers parse them and checked as they check them; responses as the
/// client (`weir`, weir-cni) reads them. Whatever parses must survive a round trip.
pub fn api_bodies(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 16 {
        0 => {
            if let Some(req) = round_trip::<weir_api::EndpointRequest>(body) {
                let _ = weir_api::endpoint_key(&req.container_id, &req.ifname);
            }
        }
        1 => drop(round_trip::<weir_api::AllocateRequest>(body)),
        2 => drop(round_trip::<weir_api::ReleaseRequest>(body)),
        3 => {
            if let Some(req) = round_trip::<agent::api::types::IpamOpsRequest>(body) {
                let _ = req.datastore.parse::<ipam::store::Datastore>();
            }
        }
        4 => {
            if let Some(req) = round_trip::<weir_api::TraceRequest>(body) {
                trace_request(&req);
            }
        }
        5 => {
            if let Some(req) = round_trip::<weir_api::LogLevel>(body) {
                // No reloadable filter is installed here: only the directive is parsed.
                let _ = agent::logging::set_filter(&req.level);
            }
        }
        6 => drop(round_trip::<weir_api::AllocateResponse>(body)),
        7 => drop(round_trip::<weir_api::Status>(body)),
        8 => drop(round_trip::<weir_api::ErrorBody>(body)),
        9 => drop(round_trip::<weir_api::DeleteResponse>(body)),
        10 => drop(round_trip::<weir_api::ReleaseResponse>(body)),
        11 => drop(round_trip::<weir_api::EndpointView>(body)),
        12 => drop(round_trip::<weir_api::HandleStatus>(body)),
        13 => drop(round_trip::<weir_api::TraceResult>(body)),
        14 => drop(round_trip::<ops::Outcome>(body)),
        _ => drop(round_trip::<weir_api::DropEventView>(body)),
    }
}

/// What `POST /v1/policy/trace` does with a request before the loop: the protocol, the TCP
/// flags and the synthetic frame of the kernel trace, which the monitor's decoder must read back.
fn trace_request(req: &weir_api::TraceRequest) {
    let Some(proto) = trace::protocol(&req.protocol) else {
        return;
    };
    let tcp_flags = req
        .tcp_flags
        .as_deref()
        .map_or(Some(packet::TCP_SYN), packet::tcp_flags);
    let spec = packet::Spec {
        src: req.src,
        dst: req.dst,
        proto,
        src_port: req.src_port.unwrap_or(40000),
        port: req.port,
        tcp_flags: tcp_flags.unwrap_or(packet::TCP_SYN),
    };
    frame_reads_back(&spec);
}

/// A frame built by `packet::frame` and decoded by the monitor names the same addresses,
/// protocol and ports.
fn frame_reads_back(spec: &packet::Spec) {
    let Some(frame) = packet::frame(spec) else {
        return;
    };
    let mut event = DropEvent {
        reason: 0,
        direction: 0,
        ifindex: 0,
        packet_len: u32::try_from(frame.len()).unwrap_or(u32::MAX),
        captured: 0,
        _pad: 0,
        head: [0; CAPTURE_BYTES],
    };
    let captured = frame.len().min(CAPTURE_BYTES);
    event.head[..captured].copy_from_slice(&frame[..captured]);
    event.captured = u32::try_from(captured).unwrap_or(0);
    let Some(view) = monitor::decode(bytemuck::bytes_of(&event)) else {
        panic!("a whole drop event did not decode");
    };
    assert_eq!(view.src, Some(spec.src), "source of {spec:?}");
    assert_eq!(view.dst, Some(spec.dst), "destination of {spec:?}");
    assert_eq!(view.protocol, Some(spec.proto), "protocol of {spec:?}");
    if [6, 17, 132].contains(&spec.proto) {
        assert_eq!(
            view.src_port.zip(view.dst_port),
            Some((spec.src_port, spec.port)),
            "ports of {spec:?}"
        );
    }
}

/// Parses `body` as `T`; when it parses, what it serializes to must parse to the same.
fn round_trip<T: Serialize + DeserializeOwned>(body: &[u8]) -> Option<T> {
    let parsed: T = serde_json::from_slice(body).ok()?;
    let first = serde_json::to_value(&parsed).expect("a parsed body serializes");
    let again: T = serde_json::from_value(first.clone()).expect("a serialized body parses back");
    let second = serde_json::to_value(&again).expect("a parsed body serializes");
    assert_eq!(first, second, "the body changed in a round trip");
    Some(parsed)
}

/// The monitor's decoder of drop-event ring records (the user-space reader of the packet head
/// the programs capture: Ethernet, IPv4/IPv6, ports), on raw records; and, from the first bytes,
/// a frame the trace builder makes, which it must read back exactly.
pub fn drop_event(data: &[u8]) {
    if let Some(view) = monitor::decode(data) {
        let _ = serde_json::to_string(&view);
    }
    if let [family, proto, a, b, c, d, e, f, g, h, ports @ ..] = data {
        let (src, dst) = if family & 1 == 0 {
            (
                IpAddr::V4(Ipv4Addr::new(*a, *b, *c, *d)),
                IpAddr::V4(Ipv4Addr::new(*e, *f, *g, *h)),
            )
        } else {
            let v6 =
                |x: u8, y: u8| Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, u16::from(x), u16::from(y));
            (IpAddr::V6(v6(*a, *b)), IpAddr::V6(v6(*c, *d)))
        };
        let be16 = |at: usize| {
            ports
                .get(at..at + 2)
                .map_or(0, |s| u16::from_be_bytes([s[0], s[1]]))
        };
        frame_reads_back(&packet::Spec {
            src,
            dst,
            proto: *proto,
            src_port: be16(0),
            port: be16(2),
            tcp_flags: packet::TCP_SYN,
        });
    }
}

/// The IPAM's stored records, corrupt or not: each input line `KIND/NAME VALUE` (`KIND` as the
/// stores name it: `blocks`, `handles`, `pools`, …; `VALUE` the raw stored bytes) is written
/// into a memory store as it stands, then every `weir ipam` operation runs over it. A corrupt
/// record must come back as an error, never a panic.
pub fn ipam_records(data: &[u8]) {
    let store = MemoryStore::new();
    let mut keys = Vec::new();
    for line in data.split(|&b| b == b'\n') {
        let Some(space) = line.iter().position(|&b| b == b' ') else {
            continue;
        };
        let Ok(path) = std::str::from_utf8(&line[..space]) else {
            continue;
        };
        let Some((kind, name)) = path.split_once('/') else {
            continue;
        };
        let Some(kind) = Kind::ALL.into_iter().find(|k| k.as_str() == kind) else {
            continue;
        };
        let key = Key::new(kind, name);
        store.force_put(key.clone(), line[space + 1..].to_vec());
        keys.push(key);
    }
    runtime().block_on(ipam_operations(store, keys));
}

/// Every operation of `weir ipam`, and the reads the agent makes, over `store`.
async fn ipam_operations(store: MemoryStore, keys: Vec<Key>) {
    let ipam = Ipam::new(store);
    let v4: IpAddr = Ipv4Addr::new(10, 244, 0, 1).into();
    let v6: IpAddr = "fd00:10:244::1".parse().expect("an IPv6 address");
    // An address of each stored block (named `NETWORK-PREFIX`), so that the operations meet the
    // records as stored before anything rewrites them.
    let in_blocks: Vec<IpAddr> = keys
        .iter()
        .filter(|k| k.kind == Kind::Block)
        .filter_map(|k| k.name.rsplit_once('-')?.0.parse().ok())
        .take(8)
        .collect();
    let mut operations = vec![
        Operation::PoolList,
        Operation::ConfigShow,
        Operation::Show { show_blocks: true },
        Operation::Utilization { show_blocks: true },
        Operation::ShowAddress { ip: v4 },
        Operation::ShowAddress { ip: v6 },
        Operation::Check {
            repair: false,
            nodes: None,
        },
        Operation::Allocate {
            host: "node-a".into(),
            handle: "fuzz.a".into(),
            ipv4: 1,
            ipv6: 1,
            pools: Vec::new(),
        },
    ];
    for ip in &in_blocks {
        operations.extend([
            Operation::ShowAddress { ip: *ip },
            Operation::AssignIp {
                host: "node-a".into(),
                handle: "fuzz.b".into(),
                ip: *ip,
            },
            Operation::ReleaseIps {
                ips: vec![*ip],
                sequence_number: None,
            },
        ]);
    }
    operations.extend([
        Operation::AssignIp {
            host: "node-b".into(),
            handle: "fuzz.b".into(),
            ip: v4,
        },
        Operation::ReleaseIps {
            ips: vec![v4, v6],
            sequence_number: None,
        },
    ]);
    for key in &keys {
        let name = key.name.clone();
        match key.kind {
            Kind::Handle => operations.push(Operation::ReleaseHandle { handle: name }),
            Kind::Node => operations.push(Operation::ReleaseNode { name, force: true }),
            Kind::Pool => operations.push(Operation::PoolDelete { name, force: false }),
            _ => {}
        }
    }
    operations.extend([
        Operation::ConfigSet {
            strict_affinity: Some(true),
            max_blocks_per_host: Some(2),
            cooldown: Some(0),
            auto_allocate_blocks: None,
        },
        Operation::Check {
            repair: true,
            nodes: Some(["node-a".to_owned()].into()),
        },
        Operation::ReleaseNode {
            name: "node-a".into(),
            force: true,
        },
    ]);
    for operation in operations {
        if let Ok(outcome) = ops::execute(&ipam, operation).await {
            let _ = serde_json::to_string(&outcome);
        }
    }
    let _ = ipam.nodes().await;
    let _ = ipam.endpoint_records().await;
    let _ = ipam.blocks_by_host().await;
    let _ = ipam.reservations().await;
    let _ = ipam.host_affinities("node-a").await;
    let _ = ipam.ips_by_handle("fuzz.a").await;
    let identities =
        ipam::identity::IdentityAllocator::new(ipam.store().clone(), "node-a", 256..=65535, 60);
    let labels: ipam::identity::Labels = [("app".to_owned(), "web".to_owned())].into();
    let _ = identities.allocate(&labels, 1_000).await;
    if let Ok(all) = identities.list().await {
        let ids: Vec<u32> = all.iter().map(|i| i.id).collect();
        let _ = identities.renew(&ids, 2_000).await;
        for id in ids.into_iter().take(4) {
            let _ = identities.release(id, 3_000).await;
        }
    }
    let _ = identities.collect_garbage(1_000_000).await;
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime")
    })
}

/// Runs `input` through target `name` (the corpus replay and `cargo xtask fuzz`'s checks).
pub fn run(name: &str, input: &[u8]) -> bool {
    match name {
        "cni_config" => cni_config(input),
        "cni_env" => cni_env(input),
        "manifest" => manifest(input),
        "api_bodies" => api_bodies(input),
        "ipam_records" => ipam_records(input),
        "drop_event" => drop_event(input),
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn corpus() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus")
    }

    /// Every input kept in `corpus/` (the seeds and every finding's input) runs through its
    /// target without a panic: the findings' regression net, on the stable toolchain.
    #[test]
    fn corpus_replays() {
        for name in TARGETS {
            let dir = corpus().join(name);
            let mut inputs: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("no corpus for {name} at {}: {e}", dir.display()))
                .map(|e| e.expect("a corpus entry").path())
                .collect();
            inputs.sort();
            assert!(!inputs.is_empty(), "the corpus of {name} is empty");
            for input in inputs {
                let bytes = std::fs::read(&input).expect("a corpus file");
                eprintln!("{}", input.display());
                assert!(run(name, &bytes), "{name} is not a target");
            }
        }
    }

    /// Every target has a binary and a corpus directory, and nothing else has one.
    #[test]
    fn targets_are_listed() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        for dir in ["fuzz_targets", "corpus"] {
            let mut found: Vec<String> = std::fs::read_dir(root.join(dir))
                .expect(dir)
                .map(|e| {
                    let name = e.expect("an entry").file_name();
                    let name = name.to_string_lossy();
                    name.strip_suffix(".rs").unwrap_or(&name).to_owned()
                })
                .collect();
            found.sort();
            let mut listed: Vec<String> = TARGETS.iter().map(|t| (*t).to_owned()).collect();
            listed.sort();
            assert_eq!(found, listed, "{dir}/ against TARGETS");
        }
    }
}
