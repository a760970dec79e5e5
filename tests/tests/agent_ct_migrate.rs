//! Conntrack layout migration under live flows, between two real layouts: the v2 agent is the
//! same `weir` binary loading the test-only `ct-v2` build of the programs (`--ebpf-object`),
//! whose conntrack value is layout 2 (`ct4_v2`, 24 bytes, a translated flow's frontend kept in
//! `svc_ct4_v1`); the built-in object is layout 3 (`ct4_v3`, 32 bytes, the frontend in the
//! conntrack entry). Upgrade v2 → v3, then roll back (`weir bpf migrate --to-version 2`, then the
//! v2 agent), once per failpoint: the crashed step rolls forward to the same result. The
//! conntrack keys read with `bpftool` are the same set before and after every step, the
//! synthetic entries keep their flags, every translated flow's entry carries its frontend in
//! layout 3, and TCP flows between two ingress-isolated pods — straight to the server, and
//! through a ClusterIP Service onto it, opened under either layout (every reply translated back,
//! or the client's socket would stall) — carry data throughout with no reset.

use std::{
    collections::BTreeSet, os::fd::AsFd as _, os::unix::process::ExitStatusExt as _, path::Path,
    process::Command,
};

use aya::maps::MapData;
use maps_schema::{
    Ct4Key, Ct6Key, CtEntryV2,
    conntrack::{FLAG_SRC_EGRESS_APPROVED, FLAG_TCP_SYN, FLAG_TCP_SYN_ACK},
};
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bin,
    bpf::PinRoot,
    ct::{
        Flow, ISOLATE_ALL_ADMIT_CLIENT, TwoPods, ct_keys, ct_pins, echo_server, map_show,
        wait_for_links, with_two_pods,
    },
    privileged::require_root,
};

const V2_OBJECT: &str = env!("WEIR_TEST_OBJECT_CT_V2");
/// Flows straight to the server, and as many through the Service.
const FLOWS: usize = 3;
/// The Service in front of the server (port 80 onto its 9000).
const CLUSTER_IP: &str = "10.96.44.1";
const SERVICE: &str = "kind: Service\nmetadata: {name: echo, namespace: default}\nspec:\n  clusterIP: 10.96.44.1\n  ports: [{port: 80, protocol: TCP, targetPort: 9000}]\n---\nkind: EndpointSlice\nmetadata: {name: echo-1, namespace: default, labels: {kubernetes.io/service-name: echo}}\naddressType: IPv4\nports: [{port: 9000, protocol: TCP}]\nendpoints:\n- {addresses: [SERVER]}\n";
const SYNTHETIC4: u32 = 3000;
const SYNTHETIC6: u32 = 500;
const SYNTHETIC_FLAGS: u32 = FLAG_SRC_EGRESS_APPROVED | FLAG_TCP_SYN | FLAG_TCP_SYN_ACK;

fn value_size(root: &PinRoot, name: &str) -> u64 {
    map_show(root, name)["bytes_value"]
        .as_u64()
        .expect("bytes_value")
}

fn synthetic4(i: u32) -> Ct4Key {
    let [_, a, b, c] = i.to_be_bytes();
    Ct4Key {
        addr_a: [10, 99, a, b],
        addr_b: [10, 98, c, 1],
        port_a: 40_000,
        port_b: 443,
        protocol: 6,
        _pad: [0; 3],
    }
}

fn synthetic6(i: u32) -> Ct6Key {
    let mut a = [0u8; 16];
    a[..4].copy_from_slice(&[0xfd, 0x99, 0, 0]);
    a[12..].copy_from_slice(&i.to_be_bytes());
    let mut b = a;
    b[1] = 0x98;
    Ct6Key {
        addr_a: a,
        addr_b: b,
        port_a: 40_000,
        port_b: 443,
        protocol: 6,
        _pad: [0; 3],
    }
}

/// Established entries the v2 programs could have written, straight into the v2 maps.
fn insert_synthetic(root: &PinRoot) {
    let now = agent::kernel::real::ct::now_ns();
    let entry = CtEntryV2::new(now, SYNTHETIC_FLAGS);
    let m4 = MapData::from_pin(root.paths().map_pin("ct4_v2")).expect("ct4_v2");
    let e4: Vec<(Ct4Key, CtEntryV2)> = (0..SYNTHETIC4).map(|i| (synthetic4(i), entry)).collect();
    agent::kernel::real::batch::update(m4.fd().as_fd(), &e4).expect("fill ct4_v2");
    let m6 = MapData::from_pin(root.paths().map_pin("ct6_v2")).expect("ct6_v2");
    let e6: Vec<(Ct6Key, CtEntryV2)> = (0..SYNTHETIC6).map(|i| (synthetic6(i), entry)).collect();
    agent::kernel::real::batch::update(m6.fd().as_fd(), &e6).expect("fill ct6_v2");
}

/// How many layout-3 entries name a frontend (`rev_nat`).
fn translated_entries(root: &PinRoot) -> usize {
    let m4 = MapData::from_pin(root.paths().map_pin("ct4_v3")).expect("ct4_v3");
    agent::kernel::migrate::read_entries::<Ct4Key>(m4.fd().as_fd(), 3)
        .expect("read")
        .iter()
        .filter(|(_, v)| v.rev_nat != 0)
        .count()
}

/// The synthetic entries' flags, read through the agent's layout-aware reader.
fn synthetic_flags_intact(root: &PinRoot, layout: u32) -> bool {
    let m4 = MapData::from_pin(root.paths().map_pin(&format!("ct4_v{layout}"))).expect("ct4");
    let all =
        agent::kernel::migrate::read_entries::<Ct4Key>(m4.fd().as_fd(), layout).expect("read");
    let synthetic: Vec<_> = all
        .iter()
        .filter(|(k, _)| k.addr_a[..2] == [10, 99])
        .collect();
    synthetic.len() == SYNTHETIC4 as usize
        && synthetic
            .iter()
            .all(|(_, v)| v.flags == SYNTHETIC_FLAGS && v.created_ns <= v.last_seen_ns)
}

fn migrate_cmd(
    root: &PinRoot,
    dirs: &AgentDirs,
    to: &str,
    failpoint: Option<&str>,
) -> std::process::Output {
    let mut cmd = Command::new(bin::weir());
    cmd.args(["bpf", "migrate", "--to-version", to, "--bpf-root"])
        .arg(root.path())
        .arg("--api-socket")
        .arg(dirs.path("weir.sock"));
    if let Some(f) = failpoint {
        cmd.env("WEIR_FAILPOINT", f);
    }
    cmd.output().expect("run weir bpf migrate")
}

fn killed(status: std::process::ExitStatus) -> bool {
    status.signal() == Some(9)
}

#[test]
fn conntrack_upgrades_and_rolls_back_under_live_flows_and_every_crash_rolls_forward() {
    if !require_root(
        "conntrack_upgrades_and_rolls_back_under_live_flows_and_every_crash_rolls_forward",
    ) {
        return;
    }
    assert!(Path::new(V2_OBJECT).is_file(), "the ct-v2 object was built");
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    with_two_pods('m', 44, |pods| upgrade_and_roll_back(&root, &dirs, pods));
}

fn upgrade_and_roll_back(root: &PinRoot, dirs: &AgentDirs, pods: &TwoPods<'_>) {
    let node = pods.node;
    pods.write_state(dirs, Some(ISOLATE_ALL_ADMIT_CLIENT));
    std::fs::write(
        dirs.path("policies").join("service.yaml"),
        SERVICE.replace("SERVER", &pods.ips[0]),
    )
    .expect("the Service");

    let previous = ["--ebpf-object", V2_OBJECT, "--ct-max-entries", "65536"];
    let current = ["--ct-max-entries", "65536"];
    let agent = AgentProcess::start(root, dirs, Some(node), &previous);
    assert_eq!(agent.started["ct_layout"], 2);
    assert_eq!(value_size(root, "ct4_v2"), 24, "layout 2 is 24 bytes");
    wait_for_links(node, root, 4);
    let _server = echo_server(pods.server, 9000, 3 * FLOWS);
    let mut flows: Vec<Flow> = (0..FLOWS)
        .map(|_| Flow::open(pods.client, &pods.server_addr(9000)))
        .collect();
    // Through the Service, once its frontend is in the kernel (read from outside; a probe
    // connection would leave a conntrack entry the sweep may remove mid-test).
    let frontend = format!("{CLUSTER_IP}:80");
    let svc4 = root.paths().map_pin("svc4_v1").display().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while tests::bpf::bpftool(&["map", "dump", "pinned", &svc4])
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the Service's frontend is in svc4_v1 within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    flows.extend((0..FLOWS).map(|_| Flow::open(pods.client, &frontend)));
    for f in &flows {
        f.assert_moving("before the upgrade");
    }
    insert_synthetic(root);
    let mut before = ct_keys(root, 2);
    assert_eq!(
        before.len(),
        2 * FLOWS + (SYNTHETIC4 + SYNTHETIC6) as usize,
        "one entry per live flow plus the synthetic ones"
    );
    assert!(agent.terminate().success());

    let upgrade_steps = [
        "ct-migrate:mid-copy",
        "ct-migrate:after-copy",
        "ct-migrate:after-rename",
        "ct-migrate:after-links",
        "ct-migrate:after-delta",
    ];
    let rollback_steps = ["ct-rollback:after-copy", "ct-rollback:after-rename"];
    for (round, step) in upgrade_steps.iter().enumerate() {
        // Upgrade, killed at `step`, then rolled forward by a clean start.
        let (status, stderr) = AgentProcess::run_to_exit(
            root,
            dirs,
            Some(node),
            &current,
            &[("WEIR_FAILPOINT", step)],
        );
        assert!(
            killed(status),
            "{step}: the failpoint kills the agent ({status}): {stderr}"
        );
        let left = ct_pins(root);
        assert!(
            left.contains("ct4_v2"),
            "{step}: the v2 map survives a crash: {left:?}"
        );
        for f in &flows {
            f.assert_moving(&format!("after a crash at {step}"));
        }
        let agent = AgentProcess::start(root, dirs, Some(node), &current);
        assert_eq!(agent.started["ct_layout"], 3);
        let left = ct_pins(root);
        assert_eq!(
            left,
            BTreeSet::from(["ct4_v3".to_owned(), "ct6_v3".to_owned()]),
            "{step}: the upgrade finished and removed the v2 pins"
        );
        assert_eq!(value_size(root, "ct4_v3"), 32, "layout 3 is 32 bytes");
        assert_eq!(
            ct_keys(root, 3),
            before,
            "{step}: the same conntrack keys after the upgrade"
        );
        assert!(
            synthetic_flags_intact(root, 3),
            "{step}: entries keep their flags"
        );
        assert_eq!(
            translated_entries(root),
            if round == 0 { FLOWS } else { 2 * FLOWS },
            "{step}: every translated flow's entry names its frontend"
        );
        for f in &flows {
            f.assert_moving(&format!("after the upgrade ({step})"));
        }
        if round == 0 {
            // Flows the layout-3 programs translate: their frontend is only in conntrack, so
            // every rollback must write it where the layout-2 programs look.
            flows.extend((0..FLOWS).map(|_| Flow::open(pods.client, &frontend)));
            for f in &flows {
                f.assert_moving("with flows translated by the layout-3 programs");
            }
            assert_eq!(translated_entries(root), 2 * FLOWS);
            before = ct_keys(root, 3);
        }
        assert!(agent.terminate().success());

        if round == 0 {
            // The v2 agent refuses the newer layout and names the command.
            let (status, stderr) =
                AgentProcess::run_to_exit(root, dirs, Some(node), &previous, &[]);
            assert!(!status.success(), "the v2 agent refuses layout 3");
            assert!(
                stderr.contains("weir bpf migrate --to-version 2"),
                "the refusal names the command: {stderr}"
            );
            assert_eq!(ct_keys(root, 3), before, "a refusal touches nothing");
        }

        // Roll back: the command (killed at a step in some rounds, then run again), then v2.
        if let Some(fail) = rollback_steps.get(round % 3) {
            let out = migrate_cmd(root, dirs, "2", Some(fail));
            assert!(
                killed(out.status),
                "{fail}: the failpoint kills the command"
            );
        }
        let out = migrate_cmd(root, dirs, "2", None);
        assert!(
            out.status.success(),
            "weir bpf migrate --to-version 2: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let left = ct_pins(root);
        assert!(
            left.contains("ct4_v2") && left.contains("ct4_v3:rollback"),
            "the rollback is prepared: {left:?}"
        );
        let agent = AgentProcess::start(root, dirs, Some(node), &previous);
        assert_eq!(agent.started["ct_layout"], 2);
        assert_eq!(
            ct_pins(root),
            BTreeSet::from(["ct4_v2".to_owned(), "ct6_v2".to_owned()]),
            "the v2 agent finished the rollback"
        );
        assert_eq!(value_size(root, "ct4_v2"), 24);
        assert_eq!(
            ct_keys(root, 2),
            before,
            "{step}: the same conntrack keys after the rollback"
        );
        assert!(synthetic_flags_intact(root, 2));
        for f in &flows {
            f.assert_moving(&format!("after the rollback (round {round})"));
        }
        assert!(agent.terminate().success());
    }

    for f in flows {
        f.finish()
            .expect("every flow carried data with no reset or error");
    }
}

/// A rollback prepared by a newer release whose layout this agent does not know (4, 40-byte
/// values): the agent reads each value's prefix — layouts only append fields — merges the entries
/// into its own `ct4_v3` and removes the newer pin.
#[test]
fn a_rollback_from_an_unknown_newer_layout_is_read_as_its_prefix() {
    if !require_root("a_rollback_from_an_unknown_newer_layout_is_read_as_its_prefix") {
        return;
    }
    use aya_obj::generated::bpf_map_type;
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = tests::netns::NetNs::new();
    let paths = root.with_maps_dir();
    let create = |name: &str, pin: &str, value_size: u32| {
        let obj = aya_obj::Map::new_from_params(
            bpf_map_type::BPF_MAP_TYPE_LRU_HASH as u32,
            16,
            value_size,
            65_536,
            0,
        );
        let map = MapData::create(obj, name, None).expect("create");
        map.pin(paths.map_pin(pin)).expect("pin");
        map
    };
    // What `weir bpf migrate --to-version 3` of a layout-4 release leaves: the converted ct4_v3
    // (empty here) and the layout-4 map renamed :rollback, whose entries the agent must take.
    drop(create("ct4_v3", "ct4_v3", 32));
    let newer = create("ct4_v4", "ct4_v4:rollback", 40);
    let now = agent::kernel::real::ct::now_ns();
    let entries: Vec<(Ct4Key, [u64; 5])> = (0..100)
        .map(|i| {
            // Layout 4 = layout 3 (last seen; flags, reserved; created; rev_nat, pad) + 8 bytes
            // of its own.
            let value = [
                now,
                u64::from(SYNTHETIC_FLAGS),
                now,
                0,
                0xabab_abab_abab_abab,
            ];
            (synthetic4(i), value)
        })
        .collect();
    agent::kernel::real::batch::update(newer.fd().as_fd(), &entries).expect("fill the newer map");
    drop(newer);

    let agent = AgentProcess::start(&root, &dirs, Some(&node), &["--ct-max-entries", "65536"]);
    assert_eq!(
        ct_pins(&root),
        BTreeSet::from(["ct4_v3".to_owned(), "ct6_v3".to_owned()]),
        "the newer layout's pin is merged and removed"
    );
    let m4 = MapData::from_pin(paths.map_pin("ct4_v3")).expect("ct4_v3");
    let all = agent::kernel::migrate::read_entries::<Ct4Key>(m4.fd().as_fd(), 3).expect("read");
    assert_eq!(all.len(), 100, "every entry of the newer layout arrived");
    assert!(
        all.iter()
            .all(|(_, v)| v.flags == SYNTHETIC_FLAGS && v.last_seen_ns == now),
        "each value is the newer value's prefix"
    );
    assert!(agent.terminate().success());
}

/// A pin with a conntrack name but another shape (here 8-byte keys) is refused with a message that
/// says so, and left as it was: the agent never reads it with the wrong sizes.
#[test]
fn a_conntrack_pin_of_the_wrong_shape_is_refused_and_left_alone() {
    if !require_root("a_conntrack_pin_of_the_wrong_shape_is_refused_and_left_alone") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = tests::netns::NetNs::new();
    let paths = root.with_maps_dir();
    let map = aya::maps::HashMap::<_, u64, u64>::create(64, 0).expect("create");
    map.pin(paths.map_pin("ct4_v1")).expect("pin");
    let id = map_show(&root, "ct4_v1")["id"].clone();
    let (status, stderr) = AgentProcess::run_to_exit(&root, &dirs, Some(&node), &[], &[]);
    assert!(
        !status.success(),
        "the agent refuses to copy a map of another shape"
    );
    assert!(
        stderr.contains("belongs to another layout"),
        "the error says what is wrong: {stderr}"
    );
    assert_eq!(map_show(&root, "ct4_v1")["id"], id, "the pin is untouched");
    assert!(
        !ct_pins(&root).contains("ct4_v3"),
        "no half-made copy is left as ct4_v3"
    );
}
