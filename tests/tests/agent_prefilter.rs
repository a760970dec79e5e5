//! The agent's XDP prefilter for real: a deny CIDR added to `--prefilter-deny-file` drops real
//! traffic on the named interface while another source passes (and traffic passed before the
//! deny); a bad file keeps the last good set; a restart that no longer names the interface
//! detaches its XDP link and removes its pin (checked with `ip`, `bpftool net` and `bpftool link`
//! from outside), while the interface still named keeps its link; a named interface recreated
//! while the agent was away gets the prefilter again at the next start. A named interface that
//! does not exist stops the start with an error naming it.

use std::{
    net::{Ipv4Addr, UdpSocket},
    path::Path,
    time::{Duration, Instant},
};

use maps_schema::programs::XDP_PREFILTER;
use tests::{
    agent_proc::{AgentDirs, AgentProcess, metrics_get},
    bpf::{PinRoot, bpftool},
    netns::{NetNs, VethPair},
    privileged::require_root,
};

const DENIED: Ipv4Addr = Ipv4Addr::new(10, 246, 0, 1);
const ALLOWED: Ipv4Addr = Ipv4Addr::new(10, 247, 0, 1);
const TARGET: Ipv4Addr = Ipv4Addr::new(10, 248, 0, 1);

fn xdp_prog_id(ns: &NetNs, ifname: &str) -> Option<u64> {
    let out = ns.exec(&["ip", "-j", "-d", "link", "show", "dev", ifname]);
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j prints JSON");
    links[0]["xdp"]["prog"]["id"].as_u64()
}

/// The interfaces of `ns` with an XDP program, as `bpftool net` shows them.
fn bpftool_net_xdp(ns: &NetNs) -> Vec<String> {
    let out = ns.exec(&["bpftool", "-j", "net", "show"]);
    let shown: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("bpftool net prints JSON");
    shown[0]["xdp"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|x| x["devname"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// XDP bpf links (`bpftool link`) running program `prog`.
fn xdp_links_running(prog: u64) -> usize {
    bpftool(&["link", "show"])
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|l| l["type"] == "xdp" && l["prog_id"].as_u64() == Some(prog))
                .count()
        })
        .unwrap_or(0)
}

/// Datagrams from `src` that reach the receiver within `wait`.
fn received_from(sender: &NetNs, src: Ipv4Addr, rx: &UdpSocket, wait: Duration) -> usize {
    tests::prefilter::received_from(sender, src, TARGET, rx, wait)
}

/// Waits (bounded) until traffic from `src` no longer arrives.
fn wait_dropped(sender: &NetNs, src: Ipv4Addr, rx: &UdpSocket) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if received_from(sender, src, rx, Duration::from_millis(500)) == 0 {
            return true;
        }
    }
    false
}

/// `weir_prefilter_deny_file_reads_total{result}` from the agent's metrics (call inside its
/// namespace).
fn deny_file_reads(result: &str) -> u64 {
    let text = metrics_get("/metrics");
    let prefix = format!("weir_prefilter_deny_file_reads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {prefix} in the agent's metrics"))
        .trim()
        .parse()
        .expect("a count")
}

fn write(path: &Path, text: &str) {
    // Through a rename, as editors and config managers write: the reader never sees half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write deny file");
    std::fs::rename(&tmp, path).expect("rename deny file");
}

#[test]
fn a_deny_cidr_from_the_file_drops_real_traffic_and_an_unnamed_interface_loses_its_link() {
    if !require_root(
        "a_deny_cidr_from_the_file_drops_real_traffic_and_an_unnamed_interface_loses_its_link",
    ) {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let (node, sender) = (NetNs::new(), NetNs::new());
    let told = VethPair::new(&node, "p", &sender, "q");
    let kept = VethPair::new(&node, "k", &sender, "l");
    tests::prefilter::plumb(
        &sender,
        &told.b,
        &[DENIED, ALLOWED],
        &node,
        &told.a,
        TARGET,
        "10.246.0.0/15",
    );
    let rx = tests::prefilter::receiver_socket(&node, TARGET);

    let deny = dirs.path("prefilter-deny");
    write(&deny, "# nothing denied yet\n");
    let deny_flag = deny.display().to_string();
    let interfaces = format!("{},{}", told.a, kept.a);
    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&node),
        &[
            "--prefilter-interfaces",
            &interfaces,
            "--prefilter-deny-file",
            &deny_flag,
            "--prefilter-deny",
            "192.0.2.0/24",
        ],
    );
    let prog = xdp_prog_id(&node, &told.a).expect("xdp_prefilter on the named interface");
    assert_eq!(xdp_prog_id(&node, &kept.a), Some(prog));
    assert_eq!(
        xdp_links_running(prog),
        2,
        "one pinned XDP link per named interface"
    );

    // Before the deny: both sources pass (the positive control for the drop below).
    assert!(
        received_from(&sender, DENIED, &rx, Duration::from_secs(10)) > 0,
        "traffic from 10.246.0.1 passes before it is denied"
    );
    assert!(received_from(&sender, ALLOWED, &rx, Duration::from_secs(10)) > 0);

    // The deny CIDR added to the file: its traffic drops; another source still passes.
    write(&deny, "# test deny list\n10.246.0.0/24\n");
    assert!(
        wait_dropped(&sender, DENIED, &rx),
        "traffic from the deny CIDR drops once the file names it"
    );
    assert_eq!(
        received_from(&sender, DENIED, &rx, Duration::from_millis(1500)),
        0,
        "and keeps dropping"
    );
    assert!(
        received_from(&sender, ALLOWED, &rx, Duration::from_secs(10)) > 0,
        "traffic from outside the deny CIDR passes"
    );

    // A bad file (which would lift the deny if it were applied): the last good set stays. The
    // agent's count of refused reads says when it has read the file; the drop is checked after.
    assert_eq!(
        node.run(|| deny_file_reads("refused")),
        0,
        "no refusal before the bad file"
    );
    assert!(
        node.run(|| deny_file_reads("applied")) >= 2,
        "the start's file and the deny were read and applied"
    );
    write(&deny, "192.0.2.0/24\nnot-a-cidr\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.run(|| deny_file_reads("refused")) == 0 {
        assert!(
            Instant::now() < deadline,
            "the agent did not count the bad file as refused within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        received_from(&sender, DENIED, &rx, Duration::from_millis(1500)),
        0,
        "a refused file keeps the last good deny set"
    );
    assert!(received_from(&sender, ALLOWED, &rx, Duration::from_secs(10)) > 0);

    // Restart without the interface in the flag: its link goes, the other stays.
    assert!(agent.terminate().success());
    let kept_only = kept.a.clone();
    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&node),
        &[
            "--prefilter-interfaces",
            &kept_only,
            "--prefilter-deny-file",
            &deny_flag,
        ],
    );
    assert_eq!(
        xdp_prog_id(&node, &told.a),
        None,
        "the interface no longer named runs no XDP program"
    );
    let on = bpftool_net_xdp(&node);
    assert!(
        !on.contains(&told.a) && on.contains(&kept.a),
        "bpftool net shows XDP only on {}: {on:?}",
        kept.a
    );
    assert_eq!(
        xdp_links_running(prog),
        1,
        "the unnamed interface's XDP link is gone; the named one's stays"
    );
    assert!(
        !root
            .paths()
            .link_pin(&told.a, XDP_PREFILTER)
            .symlink_metadata()
            .is_ok(),
        "its link pin is removed"
    );
    assert_eq!(agent.started["prefilter"][0][0], kept.a.as_str());
    assert_eq!(agent.started["prefilter"][0][1], "unchanged");
    // And its traffic is no longer filtered.
    assert!(
        received_from(&sender, DENIED, &rx, Duration::from_secs(10)) > 0,
        "without the prefilter on it, the interface passes the once-denied source"
    );
    assert!(agent.terminate().success());

    // The named interface deleted and recreated under the same name while the agent is away: its
    // pin holds a defunct link, so the next start attaches anew instead of calling it unchanged.
    let (kept_a, kept_b) = (kept.a.clone(), kept.b.clone());
    drop(kept);
    let recreated = VethPair::named(&node, &kept_a, &sender, &kept_b);
    assert_eq!(xdp_prog_id(&node, &recreated.a), None, "a new interface");
    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&node),
        &["--prefilter-interfaces", &kept_only],
    );
    assert_eq!(
        xdp_prog_id(&node, &recreated.a),
        Some(prog),
        "the recreated interface runs the prefilter again"
    );
    assert_eq!(agent.started["prefilter"][0][1], "new-link");
    assert_eq!(xdp_links_running(prog), 1, "the defunct link is gone");
    assert!(agent.terminate().success());
}

#[test]
fn a_named_interface_that_does_not_exist_stops_the_start_naming_it() {
    if !require_root("a_named_interface_that_does_not_exist_stops_the_start_naming_it") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    let missing = "wtnosuch0";
    let shown = node.exec(&["ip", "-j", "link", "show"]);
    assert!(
        !String::from_utf8_lossy(&shown.stdout).contains(missing),
        "the precondition: no interface {missing} in the namespace"
    );
    let (status, stderr) = AgentProcess::run_to_exit(
        &root,
        &dirs,
        Some(&node),
        &["--prefilter-interfaces", missing],
        &[],
    );
    assert!(!status.success(), "the agent refuses to start: {stderr}");
    assert!(
        stderr.contains("cannot set up the XDP prefilter")
            && stderr.contains(missing)
            && stderr.contains("check --prefilter-interfaces"),
        "the error names the interface and the flag: {stderr}"
    );
}
