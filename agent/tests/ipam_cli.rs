//! Black-box tests of `weir ipam …` on an embedded datastore: the commands, bad input (clear error, non-zero
//! exit, nothing changed), and concurrent invocations on one file.

use std::{
    collections::BTreeSet,
    path::Path,
    process::{Command, Output, Stdio},
};

use serde_json::Value;

fn weir(ds: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("ipam")
        .args(args)
        .env("WEIR_DATASTORE", ds)
        .env_remove("WEIR_LOG")
        .output()
        .expect("run weir")
}

fn ok_json(ds: &str, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = weir(ds, &a);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json output")
}

fn fails_with(ds: &str, args: &[&str], needle: &str) {
    let out = weir(ds, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(
        err.contains(needle),
        "{args:?}: {err:?} should mention {needle:?}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

fn datastore(dir: &Path) -> String {
    format!("embedded:{}", dir.join("ipam.redb").display())
}

#[test]
fn pools_allocate_show_release_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = datastore(dir.path());
    ok_json(
        &ds,
        &[
            "pool",
            "add",
            "v4",
            "--cidr",
            "10.244.0.0/16",
            "--block-size",
            "28",
        ],
    );
    ok_json(&ds, &["pool", "add", "v6", "--cidr", "fd00:10::/64"]);
    let pools = ok_json(&ds, &["pool", "list"]);
    assert_eq!(pools.as_array().expect("array").len(), 2);
    assert_eq!(pools[1]["blockSize"], 122, "IPv6 default block size");
    let r = ok_json(
        &ds,
        &[
            "allocate", "--host", "n1", "--handle", "c1", "--ipv4", "2", "--ipv6", "1",
        ],
    );
    assert_eq!(
        (
            r["ipv4"].as_array().expect("v4").len(),
            r["ipv6"].as_array().expect("v6").len()
        ),
        (2, 1)
    );
    let first = r["ipv4"][0]
        .as_str()
        .expect("ip")
        .split('/')
        .next()
        .expect("addr")
        .to_owned();
    let info = ok_json(&ds, &["show", "--ip", &first]);
    assert_eq!(info["state"], "allocated");
    assert_eq!(info["handle"], "c1");
    let show = ok_json(&ds, &["show", "--show-blocks"]);
    assert_eq!(show["blocks"].as_array().expect("blocks").len(), 2);
    let util = ok_json(&ds, &["utilization"]);
    assert_eq!(util[0]["in_use"], 2);
    let specific = ok_json(
        &ds,
        &[
            "allocate",
            "--host",
            "n1",
            "--handle",
            "c2",
            "--ip",
            "10.244.7.7",
        ],
    );
    assert_eq!(specific["ipv4"][0], "10.244.7.7/28");
    let rel = ok_json(
        &ds,
        &["release", "--ip", "10.244.7.7", "--ip", "10.244.9.9"],
    );
    assert_eq!(rel["released"].as_array().expect("released").len(), 1);
    assert_eq!(
        rel["notAllocated"][0], "10.244.9.9",
        "not allocated is reported, not an error"
    );
    let rel = ok_json(&ds, &["release", "--handle", "c1"]);
    assert_eq!(rel["released"].as_array().expect("released").len(), 3);
    ok_json(
        &ds,
        &[
            "config",
            "set",
            "--strict-affinity",
            "true",
            "--max-blocks-per-host",
            "4",
            "--cooldown",
            "30",
        ],
    );
    let cfg = ok_json(&ds, &["config", "show"]);
    assert_eq!(
        (
            cfg["strictAffinity"].clone(),
            cfg["maxBlocksPerHost"].clone()
        ),
        (Value::Bool(true), Value::from(4))
    );
    let check = ok_json(&ds, &["check"]);
    assert_eq!(check["problems"].as_array().expect("problems").len(), 0);
    ok_json(&ds, &["pool", "delete", "v6"]);
    assert_eq!(
        ok_json(&ds, &["pool", "list"])
            .as_array()
            .expect("array")
            .len(),
        1
    );
}

#[test]
fn bad_input_is_a_clear_error_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = datastore(dir.path());
    ok_json(&ds, &["pool", "add", "p", "--cidr", "10.0.0.0/16"]);
    let before = ok_json(&ds, &["show", "--show-blocks"]);
    fails_with(
        &ds,
        &["pool", "add", "x", "--cidr", "10.1.0.0/33"],
        "is not a CIDR",
    );
    fails_with(
        &ds,
        &["pool", "add", "x", "--cidr", "not-a-cidr"],
        "is not a CIDR",
    );
    fails_with(
        &ds,
        &["pool", "add", "x", "--cidr", "10.1.0.1/24"],
        "host bits set: write 10.1.0.0/24",
    );
    fails_with(
        &ds,
        &[
            "pool",
            "add",
            "x",
            "--cidr",
            "10.1.0.0/24",
            "--block-size",
            "20",
        ],
        "choose a block size from /24",
    );
    fails_with(
        &ds,
        &["pool", "add", "x", "--cidr", "10.0.5.0/24"],
        "overlaps pool \"p\"",
    );
    fails_with(
        &ds,
        &[
            "pool",
            "add",
            "x",
            "--cidr",
            "10.2.0.0/24",
            "--allowed-uses",
            "web",
        ],
        "unknown use",
    );
    fails_with(
        &ds,
        &["pool", "delete", "nope"],
        "pool \"nope\" does not exist",
    );
    fails_with(
        &ds,
        &["allocate", "--host", "n", "--handle", "h", "--pool", "nope"],
        "pool \"nope\" does not exist",
    );
    fails_with(
        &ds,
        &[
            "allocate",
            "--host",
            "n",
            "--handle",
            "h",
            "--ip",
            "192.168.0.1",
        ],
        "not in any pool",
    );
    fails_with(
        &ds,
        &[
            "allocate", "--host", "n", "--handle", "h", "--ipv6", "1", "--ipv4", "0",
        ],
        "no ipv6 pool",
    );
    fails_with(
        &ds,
        &["config", "set", "--max-blocks-per-host", "2"],
        "needs strict affinity",
    );
    fails_with(
        &ds,
        &["config", "set", "--cooldown", "5000"],
        "above the maximum",
    );
    fails_with(
        &ds,
        &["--datastore", "consul:x", "pool", "list"],
        "write embedded:PATH, etcd:URL[,URL…] or kubernetes",
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    fails_with(
        &ds,
        &[
            "--datastore",
            &format!("etcd:http://127.0.0.1:{port}"),
            "pool",
            "list",
        ],
        "cannot reach etcd",
    );
    assert_eq!(
        ok_json(&ds, &["show", "--show-blocks"]),
        before,
        "nothing changed"
    );
    assert_eq!(
        ok_json(&ds, &["pool", "list"])
            .as_array()
            .expect("pools")
            .len(),
        1
    );
}

#[test]
fn exhaustion_is_reported_and_exits_non_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = datastore(dir.path());
    ok_json(
        &ds,
        &[
            "pool",
            "add",
            "tiny",
            "--cidr",
            "10.9.0.0/30",
            "--block-size",
            "30",
        ],
    );
    let out = weir(
        &ds,
        &["allocate", "--host", "n", "--handle", "h", "--ipv4", "5"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("assigned 4 of 5 requested ipv4")
            && err.contains("no IPs available in pools: [10.9.0.0/30]"),
        "{err}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        4,
        "what was assigned is printed"
    );
}

#[test]
fn concurrent_invocations_on_one_file_hand_out_distinct_addresses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = datastore(dir.path());
    ok_json(
        &ds,
        &[
            "pool",
            "add",
            "p",
            "--cidr",
            "10.50.0.0/24",
            "--block-size",
            "29",
        ],
    );
    let children: Vec<_> = (0..12)
        .map(|i| {
            Command::new(env!("CARGO_BIN_EXE_weir"))
                .args([
                    "ipam",
                    "allocate",
                    "--host",
                    &format!("n{}", i % 3),
                    "--handle",
                    &format!("c{i}"),
                ])
                .args(["--ipv4", "3", "-o", "json"])
                .env("WEIR_DATASTORE", &ds)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut all = BTreeSet::new();
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        for ip in v["ipv4"].as_array().expect("ipv4") {
            assert!(
                all.insert(ip.as_str().expect("ip").to_owned()),
                "duplicate {ip}"
            );
        }
    }
    assert_eq!(all.len(), 36);
    let check = ok_json(&ds, &["check"]);
    assert_eq!(
        check["problems"].as_array().expect("problems").len(),
        0,
        "{check}"
    );
    assert_eq!(check["allocations"], 36);
}

/// `--datastore kubernetes` is accepted; without a cluster it fails with a message that says what to set, and
/// with a kubeconfig naming a server nobody answers it says the datastore is unavailable. Never a panic.
#[test]
fn kubernetes_without_a_cluster_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |kubeconfig: &Path| {
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["ipam", "--datastore", "kubernetes", "pool", "list"])
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", dir.path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env_remove("WEIR_DATASTORE")
            .env_remove("WEIR_LOG")
            .output()
            .expect("run weir")
    };
    let out = run(&dir.path().join("missing-kubeconfig"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no cluster must fail");
    assert!(
        err.contains("no usable Kubernetes client configuration"),
        "{err}"
    );
    assert!(err.contains("KUBECONFIG"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {}\n",
    )
    .expect("write kubeconfig");
    let out = run(&kubeconfig);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an unreachable API server must fail");
    assert!(err.contains("kubernetes datastore"), "{err}");
    assert!(err.contains("unavailable"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
