//! Unit tests of the loop: batching, readiness, waiters that fail only on their own deadline,
//! backoff after failures, the link watcher's restart.

use std::time::Duration;

use super::*;
use crate::{
    inprocess::harness::{self, FakeKernel},
    synthetic::{self, Sizes},
};

const SMALL: Sizes = Sizes {
    endpoints: 4,
    namespaces: 2,
    policies: 2,
};

fn setup() -> (tempfile::TempDir, crate::paths::Paths, FakeKernel) {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    synthetic::write(&paths, SMALL).expect("sources");
    let kernel = FakeKernel::new();
    for i in 0..SMALL.endpoints {
        kernel.fake.add_link(
            &synthetic::host_ifname(i),
            100 + u32::try_from(i).expect("i"),
        );
    }
    (dir, paths, kernel)
}

fn links_of(kernel: &FakeKernel, handle: &LoopHandle) {
    for (ifname, ifindex) in kernel.fake.interfaces() {
        handle
            .send(Command::Link(LinkEvent::Up {
                ifname,
                ifindex,
                up: true,
            }))
            .expect("send");
    }
}

async fn wait(handle: &LoopHandle, what: &str, ok: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
    let mut rx = handle.subscribe();
    match tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|s| ok(s))).await {
        Ok(Ok(s)) => Arc::clone(&s),
        _ => panic!("{what}: not within 30 s: {:?}", handle.snapshot().applied),
    }
}

fn endpoint(i: usize) -> Endpoint {
    synthetic::endpoint(SMALL, i)
}

#[tokio::test]
async fn nothing_but_attachments_before_in_sync_then_everything_and_ready() {
    let (_dir, paths, kernel) = setup();
    let (handle, thread) = spawn(harness::open_node(&paths, &kernel)).expect("spawn");
    links_of(&kernel, &handle);
    wait(&handle, "attached before in-sync", |_| {
        kernel.fake.attached_links().len() == SMALL.endpoints
    })
    .await;
    assert_eq!(
        kernel.map_writes(),
        0,
        "no map write before the first in-sync"
    );
    assert!(!handle.snapshot().applied.ready);
    handle.send(Command::Link(LinkEvent::Synced)).expect("send");
    let s = wait(&handle, "ready", |s| s.applied.ready).await;
    assert_eq!(s.applied.generation, s.summary.generation);
    assert!(kernel.state() == harness::expected(&paths, &kernel.fake.interfaces()));
    handle.stop();
    thread.join().expect("join");
}

#[tokio::test]
async fn a_write_resolves_once_applied_and_fails_only_on_its_own_deadline() {
    let (_dir, paths, kernel) = setup();
    let (handle, thread) = spawn(harness::open_node(&paths, &kernel)).expect("spawn");
    links_of(&kernel, &handle);
    handle.send(Command::Link(LinkEvent::Synced)).expect("send");
    wait(&handle, "ready", |s| s.applied.ready).await;

    // A failing write: the key stays dirty, the apply retries with backoff.
    kernel.policy.fail_next_writes(1_000_000);
    kernel.ident4.fail_next_writes(1_000_000);
    let mut changed = endpoint(0);
    changed.labels.insert("app".into(), "a9".into());
    let short = handle
        .upsert_endpoint(changed, Duration::from_millis(400))
        .await
        .expect("accepted");
    let started = Instant::now();
    let error = short.applied().await.expect_err("cannot be applied");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited for its own deadline, not the first failure: {:?}",
        started.elapsed()
    );
    let message = error.to_string();
    assert!(
        message.contains("write on map"),
        "names the last error: {message}"
    );
    let failing = handle.snapshot().applied.clone();
    assert!(failing.failures >= 1 && !failing.ready, "{failing:?}");
    assert!(
        failing.failures < 10,
        "backoff: not one retry per loop turn ({} failures)",
        failing.failures
    );

    // Another write while a failure is pending: it is not failed for it, and resolves once
    // the kernel recovers.
    let waiting = handle
        .upsert_endpoint(endpoint(1), Duration::from_secs(30))
        .await
        .expect("accepted");
    kernel.policy.fail_next_writes(0);
    kernel.ident4.fail_next_writes(0);
    let generation = waiting.applied().await.expect("applied after recovery");
    let s = handle.snapshot();
    assert!(s.applied.ready && s.applied.generation >= generation);
    assert!(kernel.state() == harness::expected(&paths, &kernel.fake.interfaces()));
    handle.stop();
    thread.join().expect("join");
}

#[tokio::test]
async fn a_refused_write_answers_at_once_and_commands_are_batched() {
    let (_dir, paths, kernel) = setup();
    let (handle, thread) = spawn(harness::open_node(&paths, &kernel)).expect("spawn");
    links_of(&kernel, &handle);
    handle.send(Command::Link(LinkEvent::Synced)).expect("send");
    wait(&handle, "ready", |s| s.applied.ready).await;
    let applies = handle.snapshot().applied.applies;

    let mut bad = endpoint(0);
    bad.ips.clear();
    bad.container_id.clear();
    assert!(matches!(
        handle.upsert_endpoint(bad, Duration::from_secs(5)).await,
        Err(WriteError::Refused(_))
    ));
    // Many deltas queued at once are taken as one batch: far fewer applies than deltas.
    for round in 0..200 {
        for (ifname, ifindex) in kernel.fake.interfaces() {
            handle
                .send(Command::Link(LinkEvent::Up {
                    ifname,
                    ifindex,
                    up: round % 2 == 0,
                }))
                .expect("send");
        }
    }
    let last = handle
        .delete_endpoint("c3:eth0".into(), Duration::from_secs(30))
        .await
        .expect("accepted");
    assert!(last.value.is_some(), "c3 existed");
    last.applied().await.expect("applied");
    let s = handle.snapshot();
    assert!(
        s.applied.applies - applies < 100,
        "800 link deltas and a delete took {} applies",
        s.applied.applies - applies
    );
    assert!(s.endpoint("c3:eth0").is_none());
    assert_eq!(s.summary.endpoints, SMALL.endpoints - 1);
    handle.stop();
    thread.join().expect("join");
}

#[tokio::test]
async fn a_dead_link_watcher_turns_the_agent_not_ready_and_is_restarted() {
    let (_dir, paths, kernel) = setup();
    let (handle, thread) = spawn(harness::open_node(&paths, &kernel)).expect("spawn");
    // The one fake kernel's link watch: it dumps every link, then streams their changes.
    let task = tokio::spawn(crate::sources::link_source::supervise(
        handle.clone(),
        kernel.fake.clone(),
        |_| {},
    ));
    wait(&handle, "ready", |s| s.applied.ready).await;
    let before = kernel.state();
    assert_eq!(before.endpoints.len(), SMALL.endpoints);
    assert_eq!(kernel.fake.link_table().opened, 1);

    // The watch dies; its next two reopens fail (the agent stays not ready a while); c0's link
    // vanishes meanwhile, unseen, so only the restarted watcher's dump can tell.
    kernel.fake.link_table().fail_opens = 2;
    kernel.fake.end_link_watches(Some("netlink socket closed"));
    kernel.fake.remove_link(&synthetic::host_ifname(0));
    let s = wait(&handle, "not ready", |s| !s.applied.ready).await;
    assert!(
        s.applied.source_error.as_deref().is_some_and(|e| {
            e.contains("netlink socket closed") || e.contains("fault injected")
        }),
        "{:?}",
        s.applied
    );
    let s = wait(&handle, "ready again", |s| s.applied.ready).await;
    let table = kernel.fake.link_table();
    assert_eq!(
        (table.opened, table.fail_opens),
        (2, 0),
        "restarted after two failed opens"
    );
    drop(table);
    assert!(s.applied.source_error.is_none());
    assert_eq!(
        s.links.len(),
        SMALL.endpoints - 1,
        "the vanished link is gone"
    );
    let after = kernel.state();
    assert_eq!(
        after.endpoints.len(),
        SMALL.endpoints - 1,
        "its endpoint entry is removed"
    );
    task.abort();
    handle.stop();
    thread.join().expect("join");
}

#[tokio::test]
async fn the_snapshot_rebuilds_exactly_the_endpoint_views_a_change_touches() {
    let (_dir, paths, kernel) = setup();
    let (handle, thread) = spawn(harness::open_node(&paths, &kernel)).expect("spawn");
    links_of(&kernel, &handle);
    handle.send(Command::Link(LinkEvent::Synced)).expect("send");
    let ready = wait(&handle, "ready", |s| {
        s.applied.ready && s.endpoints.values().all(|v| v.ifindex.is_some())
    })
    .await;
    let (e0, e1) = (endpoint(0), endpoint(1));
    assert_ne!(
        e0.namespace, e1.namespace,
        "the two endpoints live in different namespaces"
    );
    let identity_of = |s: &Snapshot, e: &Endpoint| s.endpoint(&e.key()).and_then(|v| v.identity);

    // A link gone: only its endpoint loses its ifindex; the other views are the same objects.
    handle
        .send(Command::Link(LinkEvent::Gone {
            ifname: e0.host_ifname.clone(),
        }))
        .expect("send");
    let gone = wait(&handle, "e0's link gone", |s| {
        s.endpoint(&e0.key()).is_some_and(|v| v.ifindex.is_none())
    })
    .await;
    assert!(Arc::ptr_eq(
        &ready.endpoints[&e1.key()],
        &gone.endpoints[&e1.key()]
    ));

    // A policy reload that relabels e0's namespace: e0 gets a new identity, e1 keeps its own.
    let (mut set, errors) = crate::calc::policy::load::load_dir(&paths.policy_dir);
    assert!(errors.is_empty(), "{errors:?}");
    set.namespaces
        .entry(e0.namespace.clone())
        .or_default()
        .insert("relabelled".into(), "yes".into());
    let before = (identity_of(&gone, &e0), identity_of(&gone, &e1));
    assert!(before.0.is_some() && before.1.is_some());
    handle
        .send(Command::Policies { set, errors })
        .expect("send");
    let after = wait(&handle, "e0 relabelled", |s| {
        identity_of(s, &e0) != before.0
    })
    .await;
    assert_eq!(
        identity_of(&after, &e1),
        before.1,
        "another namespace's endpoint keeps its identity"
    );
    assert!(Arc::ptr_eq(
        &gone.endpoints[&e1.key()],
        &after.endpoints[&e1.key()]
    ));
    handle.stop();
    thread.join().expect("join");
}

#[tokio::test]
async fn a_route_that_cannot_be_written_holds_back_no_write_and_is_retried() {
    use crate::{
        cluster::{ClusterNode, NodeDelta, routing::NodeRoutes},
        dataplane::node_routes::{self, RoutingMode},
    };
    let (_dir, paths, kernel) = setup();
    let mut node = harness::open_node(&paths, &kernel);
    let table = crate::kernel::fake::FakeKernel::default();
    let block: ipnetwork::IpNetwork = "10.244.9.0/26".parse().expect("cidr");
    table.routes().failing.insert(block);
    node.set_routing(NodeRoutes::new(
        "here",
        node_routes::NodeRoutes::new(
            RoutingMode::Native,
            Box::new(table.clone()),
            Box::new(table.clone()),
            None,
        ),
    ));
    let (handle, thread) = spawn(node).expect("spawn");
    links_of(&kernel, &handle);
    handle.send(Command::Link(LinkEvent::Synced)).expect("send");
    handle
        .send(Command::Node(NodeDelta::Upsert(ClusterNode {
            name: "there".into(),
            addresses: vec!["192.0.2.2".parse().expect("ip")],
            labels: BTreeMap::new(),
            blocks: vec![block],
            alive: true,
            heartbeat: 1,
        })))
        .expect("send");
    handle.send(Command::Node(NodeDelta::Synced)).expect("send");
    wait(&handle, "the route failure reported", |s| {
        s.applied.routes_error.is_some()
    })
    .await;
    // This node's own writes are not held back by it.
    let pending = handle
        .upsert_endpoint(endpoint(1), Duration::from_secs(10))
        .await
        .expect("accepted");
    pending
        .applied()
        .await
        .expect("applied although a route fails");
    assert!(handle.snapshot().applied.ready);
    assert!(table.routes().routes.is_empty());
    // Once the table takes it, the retry writes it.
    table.routes().failing.clear();
    wait(&handle, "the route written on a retry", |s| {
        s.applied.routes_error.is_none()
    })
    .await;
    assert_eq!(table.routes().routes.len(), 1);
    handle.stop();
    thread.join().expect("join");
}

#[tokio::test]
async fn another_nodes_record_gives_its_addresses_remote_node_in_the_kernel_maps_until_it_goes() {
    use crate::cluster::{ClusterNode, NodeDelta};
    use maps_schema::identity::REMOTE_NODE;
    let (_dir, paths, kernel) = setup();
    let (handle, thread) = spawn(harness::open_node(&paths, &kernel)).expect("spawn");
    links_of(&kernel, &handle);
    handle.send(Command::Link(LinkEvent::Synced)).expect("send");
    let there: std::net::Ipv4Addr = "192.0.2.7".parse().expect("ip");
    let entry = |kernel: &FakeKernel| {
        kernel
            .ident4
            .contents()
            .into_iter()
            .find(|(k, _)| *k == there.octets())
            .map(|(_, v)| v.identity)
    };
    assert_eq!(entry(&kernel), None, "no entry before the record");
    handle
        .send(Command::Node(NodeDelta::Upsert(ClusterNode {
            name: "there".into(),
            addresses: vec![there.into()],
            labels: BTreeMap::new(),
            blocks: Vec::new(),
            alive: true,
            heartbeat: 1,
        })))
        .expect("send");
    let deadline = Instant::now() + Duration::from_secs(10);
    while entry(&kernel) != Some(REMOTE_NODE) {
        assert!(
            Instant::now() < deadline,
            "the remote-node entry never reached the map"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle
        .send(Command::Node(NodeDelta::Gone("there".into())))
        .expect("send");
    while entry(&kernel).is_some() {
        assert!(
            Instant::now() < deadline,
            "the remote-node entry outlived its node"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.stop();
    thread.join().expect("join");
}
