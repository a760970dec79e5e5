//! Crashes: weir-cni killed between allocation and endpoint creation, and the agent killed during
//! an ADD. Nothing leaks: unconfirmed allocations are released at expiry (short here), and the
//! failed ADD leaves no workload link behind.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{
    bin,
    cni::{CniNode, Pod, exec_plugin_env},
    privileged::require_root,
};

fn pool_free(node: &CniNode) -> Option<u64> {
    node.api_get("/v1/status")["pools"]
        .as_array()
        .map(|pools| pools.iter().filter_map(|p| p["free"].as_u64()).sum())
}

fn wait_free(node: &CniNode, want: u64, what: &str) {
    tests::wait::until_eq(
        &format!("{what}: the pool's free addresses"),
        Duration::from_secs(60),
        &Some(want),
        || pool_free(node),
    );
}

fn weir_links(node: &CniNode) -> usize {
    let out = node.ns.exec(&["ip", "-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(": weir"))
        .count()
}

fn conf(node: &CniNode) -> Value {
    node.conf(&json!({"allocationExpirySecs": 3}))
}

#[test]
fn a_plugin_killed_after_allocation_leaves_an_allocation_that_expires() {
    if !require_root("a_plugin_killed_after_allocation_leaves_an_allocation_that_expires") {
        return;
    }
    let node = CniNode::start(&[]);
    let conf = conf(&node);
    let before = pool_free(&node).expect("status");
    let pod = Pod::new();
    let out = exec_plugin_env(
        Some(&node.ns),
        &bin::weir_cni(),
        &pod.call("ADD"),
        conf.to_string().as_bytes(),
        &[("WEIR_CNI_FAILPOINT", "abort-after-allocate")],
    );
    assert!(!out.status.success(), "the failpoint must kill the plugin");
    // Positive control: the allocation exists right after the crash.
    assert_eq!(
        pool_free(&node),
        Some(before - 1),
        "the crash left no allocation"
    );
    assert_eq!(weir_links(&node), 0);
    wait_free(&node, before, "an unconfirmed allocation must expire");
}

#[test]
fn the_agent_killed_mid_add_fails_the_add_with_11_and_nothing_leaks() {
    if !require_root("the_agent_killed_mid_add_fails_the_add_with_11_and_nothing_leaks") {
        return;
    }
    let mut node = CniNode::start(&[]);
    let conf = conf(&node);
    let before = pool_free(&node).expect("status");
    let pod = Pod::new();
    // Held here so the scope below can kill it (dropping an AgentProcess kills it).
    let agent = node.agent.take();
    let out = std::thread::scope(|s| {
        let add = s.spawn(|| {
            exec_plugin_env(
                Some(&node.ns),
                &bin::weir_cni(),
                &pod.call("ADD"),
                conf.to_string().as_bytes(),
                &[("WEIR_CNI_FAILPOINT", "pause-before-endpoint=4")],
            )
        });
        // Wait until the allocation is there (the plugin is paused before the endpoint).
        let deadline = Instant::now() + Duration::from_secs(20);
        while pool_free(&node) != Some(before - 1) {
            assert!(Instant::now() < deadline, "the ADD never allocated");
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(agent);
        add.join().expect("ADD thread")
    });
    let _ = out.err(11, "ADD with the agent killed");
    assert_eq!(weir_links(&node), 0, "the failed ADD left its veth");
    node.restart_agent();
    wait_free(
        &node,
        before,
        "after the restart the unconfirmed allocation must expire",
    );
    let eps = node.api_get("/v1/endpoints");
    assert_eq!(eps.as_array().map(Vec::len), Some(0), "{eps}");
}
