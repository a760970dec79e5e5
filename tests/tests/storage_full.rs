//! A full disk under the agent's state directory (a small tmpfs, filled by a filler file): an ADD
//! fails with "try again later" naming the full disk and the path, `weir status` and `/metrics`
//! show the degraded storage while the agent stays ready; once the filler is gone the next ADD
//! succeeds with no restart and no allocation made before is lost. And the embedded datastore
//! alone on a full tmpfs: a commit fails, nothing committed is lost, and it writes again.

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ipam::store::{
    Key, Kind, Op, Store,
    embedded::{EmbeddedStore, Sharing},
};
use serde_json::{Value, json};
use tests::{
    agent_proc::{AgentDirs, metrics_get},
    bin,
    cni::{CniNode, NETWORK, Pod},
    netns::NetNs,
    privileged::require_root,
};

/// A tmpfs mounted in a `wt…` temporary directory of its own; unmounted on drop, then the
/// directory removed (its fields drop after `drop` has run).
struct Tmpfs {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("wt-storefull")
            .tempdir()
            .expect("temp dir");
        let mount = dir.path().join("mnt");
        fs::create_dir(&mount).expect("mount point");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "wt-storefull",
            ])
            .arg(&mount)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mount tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { mount, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: an agent killed a moment ago may still hold a file open.
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// Fills the filesystem holding `path` with the file `path` (64 KiB at a time, bounded): returns
/// the bytes written once a write fails with ENOSPC.
fn fill(path: &Path) -> usize {
    let mut file = fs::File::create(path).expect("filler");
    let chunk = vec![0xa5u8; 64 << 10];
    let mut written = 0;
    for _ in 0..1024 {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n,
            Err(e) => {
                assert_eq!(
                    e.raw_os_error(),
                    Some(28),
                    "the filler stops at a full disk: {e}"
                );
                // Also the last partial page: a write of one byte fails only on a full disk.
                while file.write(&[0xa5]).is_ok_and(|n| n == 1) {
                    written += 1;
                }
                return written;
            }
        }
    }
    panic!(
        "the filesystem of {} did not fill within 64 MiB",
        path.display()
    );
}

fn degraded_metric(node: &CniNode, store: &str) -> Option<u64> {
    let metrics = node.ns.run(|| metrics_get("/metrics"));
    let line = format!("weir_storage_degraded{{store=\"{store}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|v| v.trim().parse().ok())
}

fn held(node: &CniNode, pod: &Pod) -> Vec<String> {
    let h = node.api_get(&format!("/v1/ipam/handles/{NETWORK}.{}", pod.id));
    h["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.as_str().map(str::to_owned))
        .collect()
}

fn ipam_check(node: &CniNode) -> (bool, String) {
    let out = Command::new(bin::weir())
        .args(["ipam", "check", "--datastore"])
        .arg(format!(
            "embedded:{}",
            node.dirs.path("state/ipam.redb").display()
        ))
        .arg("--api-socket")
        .arg(node.socket())
        .output()
        .expect("weir ipam check");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_full_state_disk_fails_add_naming_it_and_the_next_add_after_space_returns_succeeds() {
    if !require_root(
        "a_full_state_disk_fails_add_naming_it_and_the_next_add_after_space_returns_succeeds",
    ) {
        return;
    }
    // Declared before the node: dropped after it (the agent is stopped first). The agent's state
    // directory is a link to it, so removing the agent's directories never meets the mount.
    let tmpfs = Tmpfs::mount("2m");
    let dirs = AgentDirs::new();
    let state = dirs.path("state");
    std::os::unix::fs::symlink(&tmpfs.mount, &state).expect("state directory link");
    let node = CniNode::start_with_dirs(NetNs::new(), dirs, &[]);
    let pid = node.agent.as_ref().expect("agent").pid();
    let conf = node.conf(&json!({}));
    // Positive control: ADDs succeed on the tmpfs.
    let mut pods: Vec<(Pod, String)> = Vec::new();
    for _ in 0..3 {
        let pod = Pod::new();
        let ip = Pod::ipv4(&node.add(&pod, &conf));
        pods.push((pod, ip));
    }
    let status = node.api_get("/v1/status");
    assert_eq!(status["storage"]["degraded"], json!(false), "{status}");
    assert_eq!(degraded_metric(&node, "ipam-datastore"), Some(0));
    assert_eq!(degraded_metric(&node, "state-files"), Some(0));

    let filler = state.join("wt-filler");
    let filled = fill(&filler);
    eprintln!("filler: {filled} bytes");
    // ADDs until one fails (a write may still fit in pages a file already holds): bounded.
    let mut failure = None;
    for _ in 0..20 {
        let pod = Pod::new();
        let out = node.exec(&pod.call("ADD"), &conf);
        if out.status.success() {
            let ip = Pod::ipv4(&out.json);
            eprintln!("an ADD still fit on the full disk: {ip}");
            pods.push((pod, ip));
        } else {
            failure = Some((pod, out.err(11, "ADD on a full disk (try again later)")));
            break;
        }
    }
    let (failed_pod, message) = failure.expect("an ADD fails within 20 on a full disk");
    eprintln!("ADD on the full disk: {message}");
    assert!(
        message.contains("the disk is full") && message.contains(&state.display().to_string()),
        "the failure names the full disk and the path: {message}"
    );
    assert!(
        held(&node, &failed_pod).is_empty(),
        "the failed ADD keeps no address"
    );
    // The status shows the degraded storage (and the agent stays ready: its pods are served).
    let status = node.api_get("/v1/status");
    let storage = &status["storage"];
    assert_eq!(storage["degraded"], json!(true), "{status}");
    let faults = storage["faults"].as_array().expect("faults");
    assert!(
        faults.iter().any(|f| f["full_disk"] == json!(true)
            && f["path"]
                .as_str()
                .is_some_and(|p| p.starts_with(&*state.to_string_lossy()))),
        "{storage}"
    );
    assert_eq!(
        status["ready"],
        json!(true),
        "readiness is the dataplane's: {status}"
    );
    let degraded: Vec<&str> = faults.iter().filter_map(|f| f["store"].as_str()).collect();
    eprintln!("degraded stores: {degraded:?}");
    for store in &degraded {
        let label = if *store == "state-file" {
            "state-files"
        } else {
            store
        };
        assert_eq!(degraded_metric(&node, label), Some(1), "{store}");
    }
    let table = Command::new(bin::weir())
        .args(["status", "--api-socket"])
        .arg(node.socket())
        .output()
        .expect("weir status");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("storage:    DEGRADED"), "{table}");

    // Space returns: the next ADD succeeds, with no restart.
    fs::remove_file(&filler).expect("remove the filler");
    let pod = Pod::new();
    let ip = Pod::ipv4(&node.add(&pod, &conf));
    pods.push((pod, ip));
    assert_eq!(
        node.agent.as_ref().expect("agent").pid(),
        pid,
        "the same agent process"
    );
    tests::wait::until(
        "the storage fault clears by itself",
        Duration::from_secs(30),
        || node.api_get("/v1/status")["storage"]["degraded"] == json!(false),
    );
    for store in ["ipam-datastore", "state-files"] {
        assert_eq!(degraded_metric(&node, store), Some(0), "{store}");
    }
    let status = node.api_get("/v1/status");
    assert!(
        status["storage"]["recoveries"].as_u64() >= Some(1),
        "{status}"
    );
    // No allocation lost: every pod holds its address, and the datastore checks out.
    for (pod, ip) in &pods {
        assert_eq!(held(&node, pod), std::slice::from_ref(ip), "{}", pod.id);
    }
    assert_eq!(node.addresses_in_use(), pods.len() as u64);
    let (ok, report) = ipam_check(&node);
    assert!(ok, "weir ipam check: {report}");
    let endpoints: Value = node.api_get("/v1/endpoints");
    assert_eq!(
        endpoints.as_array().map(Vec::len),
        Some(pods.len()),
        "{endpoints}"
    );
}

#[test]
fn the_embedded_datastore_on_a_full_disk_keeps_its_commits_and_writes_again_when_space_returns() {
    if !require_root(
        "the_embedded_datastore_on_a_full_disk_keeps_its_commits_and_writes_again_when_space_returns",
    ) {
        return;
    }
    let tmpfs = Tmpfs::mount("1m");
    let mount = tmpfs.mount.clone();
    let path = mount.join("ipam.redb");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let store =
        EmbeddedStore::open_with(&path, Duration::from_secs(5), Sharing::Exclusive).expect("open");
    let value = vec![7u8; 2000];
    let put = |i: usize| {
        runtime.block_on(store.txn(vec![Op::Create {
            key: Key::new(Kind::Handle, format!("h{i:05}")),
            value: value.clone(),
        }]))
    };
    // Fill the disk with the store itself: commits until one fails (bounded by the tmpfs size).
    let mut committed = 0;
    let err = loop {
        match put(committed) {
            Ok(()) => committed += 1,
            Err(e) => break e,
        }
        assert!(committed < 2000, "a 1 MiB tmpfs never filled");
    };
    let message = err.to_string();
    assert!(
        message.contains("the disk is full") && message.contains(&path.display().to_string()),
        "{message}"
    );
    let fault = store.health().fault.expect("degraded");
    assert!(fault.full_disk && fault.path == path, "{fault:?}");
    // Space returns: the filesystem grows (the store alone filled it).
    let out = Command::new("mount")
        .args(["-o", "remount,size=4m"])
        .arg(&mount)
        .output()
        .expect("remount");
    assert!(
        out.status.success(),
        "remount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    put(committed).expect("the next commit after space returns succeeds");
    assert!(store.health().fault.is_none(), "recovered");
    let listed = runtime
        .block_on(store.list(Kind::Handle, "h"))
        .expect("list");
    assert_eq!(
        listed.len(),
        committed + 1,
        "every commit before the failure is kept, and the new one"
    );
    drop(store);
    let reopened = EmbeddedStore::open_with(&path, Duration::from_secs(5), Sharing::Exclusive)
        .expect("reopen");
    assert_eq!(
        runtime
            .block_on(reopened.list(Kind::Handle, "h"))
            .expect("list")
            .len(),
        committed + 1
    );
}
