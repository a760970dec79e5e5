//! `kill -9` of the agent at random moments while it applies: after each restart, the kernel — read
//! from outside with bpftool — equals the desired state of the files and links as they are now,
//! with no orphans (no entry of the other policy version, no link pin of a vanished veth).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant, SystemTime},
};

use hyper::Method;
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bpf::{PinRoot, bpftool},
    netns::{NetNs, VethPair},
    pod::workload_name,
    privileged::require_root,
};

/// A policy admitting `count` /32 blocks starting at 10.`second`.0.0 on TCP 80.
fn policy(second: u8, count: u16) -> (String, BTreeSet<String>) {
    let cidrs: Vec<String> = (0..count)
        .map(|i| format!("10.{second}.{}.{}/32", i / 256, i % 256))
        .collect();
    let peers: Vec<String> = cidrs
        .iter()
        .map(|c| format!("{{ipBlock: {{cidr: {c}}}}}"))
        .collect();
    let text = format!(
        "kind: NetworkPolicy\nmetadata: {{name: crash, namespace: default}}\nspec:\n  podSelector: {{}}\n  ingress:\n  - from: [{}]\n    ports: [{{port: 80}}]\n",
        peers.join(", ")
    );
    (text, cidrs.into_iter().collect())
}

/// The CIDRs in `ipcache4_v1`, as bpftool shows them.
fn ipcache(root: &PinRoot) -> BTreeSet<String> {
    let dump = bpftool(&[
        "map",
        "dump",
        "pinned",
        &root.paths().map_pin("ipcache4_v1").display().to_string(),
    ]);
    dump.as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            let key = &e["formatted"]["key"];
            let len = key["prefix_len"].as_u64().expect("prefix_len");
            let data: Vec<String> = key["data"]
                .as_array()
                .expect("data")
                .iter()
                .map(|b| b.as_u64().expect("byte").to_string())
                .collect();
            format!("{}/{len}", data.join("."))
        })
        .collect()
}

fn policy_entries(root: &PinRoot) -> usize {
    bpftool(&[
        "map",
        "dump",
        "pinned",
        &root.paths().map_pin("policy_v1").display().to_string(),
    ])
    .as_array()
    .map_or(0, Vec::len)
}

fn pseudo_random(n: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    (nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % 120
}

#[test]
fn kill_9_during_apply_always_restarts_to_the_desired_state() {
    if !require_root("kill_9_during_apply_always_restarts_to_the_desired_state") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let policy_dir = dirs.path("policies");
    std::fs::create_dir_all(&policy_dir).expect("policy dir");
    let node = NetNs::new();
    let pod = NetNs::new();
    let (a, b) = (policy(20, 600), policy(21, 900));
    std::fs::write(policy_dir.join("p.yaml"), &a.0).expect("write");
    let mut agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);
    // Three endpoints the policy selects (so entries are per endpoint × block).
    let mut veths = Vec::new();
    for i in 0..3 {
        let host = workload_name();
        veths.push(VethPair::named(&node, &host, &pod, &format!("p{i}")));
        let handle = format!("wt-net.k{i}");
        let ip = tests::agent_pod::allocate_ipv4(&agent, &handle);
        let body = json!({"container_id": format!("k{i}"), "ifname": "eth0", "host_ifname": host, "namespace": "default", "pod": format!("k{i}"), "handle": handle, "ips": [ip]});
        let _: Value = agent
            .api(
                Method::PUT,
                &format!("/v1/endpoints/k{i}:eth0"),
                Some(&body),
            )
            .expect("register");
    }

    let mut extra: Option<VethPair<'_>> = None;
    for iteration in 0..10u64 {
        // Change the desired state, then kill the agent while it is (likely) applying it.
        let (text, _) = if iteration % 2 == 0 { &b } else { &a };
        std::fs::write(policy_dir.join("p.yaml"), text).expect("edit");
        // A workload veth comes or goes as well, so there are attachments to make or sweep.
        extra = match extra.take() {
            Some(v) => {
                drop(v);
                None
            }
            None => Some(VethPair::named(&node, &workload_name(), &pod, "x")),
        };
        std::thread::sleep(Duration::from_millis(pseudo_random(iteration)));
        drop(agent); // SIGKILL
        agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);

        // The kernel converges to exactly the desired state of the current file and links.
        let (_, want) = if iteration % 2 == 0 { &b } else { &a };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let have = ipcache(&root);
            let entries = policy_entries(&root);
            // Links running both programs, from outside (filters, or tcx link pins: a pin left
            // by a removed link would show here as well, so this also finds orphans).
            let mut pins: BTreeSet<String> = tests::hooks::attached_links(&node, &root)
                .into_iter()
                .collect();
            let mut links: BTreeSet<String> = veths.iter().map(|v| v.a.clone()).collect();
            if let Some(v) = &extra {
                links.insert(v.a.clone());
            }
            pins.retain(|p| p.starts_with("weir"));
            if &have == want && entries == 3 * want.len() && pins == links {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "iteration {iteration}: ipcache has {} entries ({} wanted, {} unexpected), policy {entries} (want {}), attached {pins:?} vs links {links:?}",
                have.len(),
                want.len(),
                have.difference(want).count(),
                3 * want.len()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert!(agent.terminate().success());
}
