//! `weir ipam` and a running agent that holds the embedded file: the command runs inside the agent (the file is
//! the agent's alone: opened directly it cannot be, which is the positive control), its allocations are the
//! agent's datastore's; a datastore the agent does not hold is opened directly; once the agent is gone the
//! command opens the file itself and sees everything the agent committed.

use std::{
    path::Path,
    process::{Command, Output},
    time::{Duration, Instant},
};

use hyper::Method;
use serde_json::Value;
use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bin,
    bpf::PinRoot,
    netns::NetNs,
    privileged::require_root,
};

fn weir_ipam(socket: &Path, datastore: &str, args: &[&str]) -> Output {
    Command::new(bin::weir())
        .arg("ipam")
        .args(args)
        .args(["-o", "json", "--datastore", datastore, "--api-socket"])
        .arg(socket)
        .env_remove("WEIR_DATASTORE")
        .env_remove("WEIR_API_SOCKET")
        .output()
        .expect("run weir ipam")
}

fn ok_json(socket: &Path, datastore: &str, args: &[&str]) -> Value {
    let out = weir_ipam(socket, datastore, args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json output")
}

fn first_ipv4(v: &Value) -> String {
    v["ipv4"][0]
        .as_str()
        .expect("an ipv4 address")
        .split('/')
        .next()
        .expect("address")
        .to_owned()
}

#[test]
fn weir_ipam_goes_through_the_agent_that_holds_the_file_and_opens_it_once_the_agent_is_gone() {
    if !require_root("weir_ipam_goes_through_the_agent_that_holds_the_file") {
        return;
    }
    let (root, dirs, node) = (PinRoot::new(), AgentDirs::new(), NetNs::new());
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &["--pool", "10.71.0.0/24"]);
    let ds = format!(
        "embedded:{}",
        dirs.path("state").join("ipam.redb").display()
    );
    let socket = agent.socket.clone();

    // Through the agent: its pool is there, an allocation lands in its datastore (the agent's own API sees it).
    let pools = ok_json(&socket, &ds, &["pool", "list"]);
    assert_eq!(pools[0]["cidr"], "10.71.0.0/24", "{pools}");
    let r = ok_json(
        &socket,
        &ds,
        &["allocate", "--host", "wt-node", "--handle", "cli-1"],
    );
    let ip = first_ipv4(&r);
    let handle: Value = agent
        .api(Method::GET, "/v1/ipam/handles/cli-1", None)
        .expect("handle through the API");
    assert_eq!(handle["ips"][0].as_str(), Some(ip.as_str()), "{handle}");
    assert_eq!(
        handle["confirmed"], true,
        "an operator's allocation does not expire"
    );
    let shown = ok_json(&socket, &ds, &["show", "--ip", &ip]);
    assert_eq!(shown["handle"], "cli-1");
    assert_eq!(shown["state"], "allocated");
    // Errors come back as the datastore's own, with a non-zero exit.
    let out = weir_ipam(&socket, &ds, &["pool", "delete", "nosuch"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist"), "{err}");
    let check = ok_json(&socket, &ds, &["check"]);
    assert_eq!(
        check["problems"].as_array().map(Vec::len),
        Some(0),
        "{check}"
    );

    // Positive control: the agent holds the file alone, so a command that does not reach it cannot open it
    // (it waits a bounded 10 s, then says why).
    let nobody = dirs.path("nobody.sock");
    let started = Instant::now();
    let out = weir_ipam(&nobody, &ds, &["pool", "list"]);
    assert!(
        !out.status.success(),
        "the file was opened beside the agent"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--api-socket"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(60));

    // A datastore the agent does not hold: the command opens it itself, and the agent's file is untouched.
    let other = format!("embedded:{}", dirs.path("other.redb").display());
    ok_json(
        &socket,
        &other,
        &["pool", "add", "other", "--cidr", "10.72.0.0/24"],
    );
    let r = ok_json(
        &socket,
        &other,
        &["allocate", "--host", "wt-node", "--handle", "cli-2"],
    );
    assert!(first_ipv4(&r).starts_with("10.72.0."), "{r}");
    let handle: Value = agent
        .api(Method::GET, "/v1/ipam/handles/cli-2", None)
        .expect("handle through the API");
    assert_eq!(handle["ips"].as_array().map(Vec::len), Some(0), "{handle}");

    // The agent gone (SIGTERM), nobody answers on its socket: the command opens the file and finds what the
    // agent committed.
    assert!(agent.terminate().success());
    let shown = ok_json(&socket, &ds, &["show", "--ip", &ip]);
    assert_eq!(shown["handle"], "cli-1", "{shown}");
    let released = ok_json(&socket, &ds, &["release", "--handle", "cli-1"]);
    assert_eq!(
        released["released"][0].as_str(),
        Some(ip.as_str()),
        "{released}"
    );
    drop(node);
}
