//! Pods as the source of truth, through the real policy-directory source (`sources::policy_dir`)
//! and the loop: a `kind: Pod` document relabels its local endpoint incrementally (exactly the
//! keys a full compile says change are written, once each), a pod of another node puts its
//! address into the identity map with its identity, and a bad document refuses only itself.

use std::{net::IpAddr, time::Duration};

use super::{
    converge::Agent,
    harness::{self, FakeKernel, once_each},
};
use crate::{
    calc::reference::AnyKey,
    control::snapshot::Snapshot,
    paths::Paths,
    sources::policy_dir,
    synthetic::{self, Sizes},
};

const SIZES: Sizes = Sizes {
    endpoints: 120,
    namespaces: 6,
    policies: 60,
};
const WAIT: Duration = Duration::from_secs(60);

fn setup() -> (tempfile::TempDir, Paths, FakeKernel) {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    synthetic::write(&paths, SIZES).expect("write the sources");
    let kernel = FakeKernel::new();
    for i in 0..SIZES.endpoints {
        kernel.fake.add_link(
            &synthetic::host_ifname(i),
            1000 + u32::try_from(i).expect("index"),
        );
    }
    (dir, paths, kernel)
}

/// Writes a document through a rename (as operators should).
fn write(paths: &Paths, file: &str, text: &str) {
    let tmp = paths.policy_dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, paths.policy_dir.join(file)).expect("rename");
}

fn pod_doc(namespace: &str, name: &str, labels: &str, ip: Option<&str>) -> String {
    let status = ip.map_or(String::new(), |ip| format!("status: {{podIP: {ip}}}\n"));
    format!(
        "kind: Pod\nmetadata: {{name: {name}, namespace: {namespace}, labels: {{{labels}}}}}\nspec: {{nodeName: other-node, containers: []}}\n{status}"
    )
}

async fn applied_after(agent: &Agent, generation: u64, what: &str, ok: impl Fn(&Snapshot) -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let s = agent.handle.snapshot();
        if s.applied.generation > generation
            && s.applied.generation >= s.summary.generation
            && ok(&s)
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_objects_relabel_endpoints_add_remote_peers_and_a_bad_one_refuses_only_itself() {
    let (_dir, paths, kernel) = setup();
    let links = kernel.fake.interfaces();
    let agent = Agent::start(&paths, &kernel);
    let source = tokio::spawn(policy_dir::run(
        agent.handle.clone(),
        paths.policy_dir.clone(),
        policy_dir::first_read(&paths.policy_dir),
    ));
    agent.ready().await;
    assert!(kernel.state() == harness::expected(&paths, &links));

    // Endpoint c1 (pod p1) takes the labels of its Pod document: endpoint 7's, so it moves to
    // another class; only the keys that change are written.
    let c1 = synthetic::endpoint(SIZES, 1);
    let labels7 = synthetic::labels(7);
    let as_yaml = |l: &std::collections::BTreeMap<String, String>| {
        l.iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let before = harness::expected(&paths, &links);
    let identity_before = agent
        .handle
        .snapshot()
        .endpoint("c1:eth0")
        .and_then(|v| v.identity);
    let mark = kernel.mark();
    let generation = agent.handle.snapshot().summary.generation;
    write(
        &paths,
        "pod-p1.yaml",
        &pod_doc(&c1.namespace, "p1", &as_yaml(&labels7), None),
    );
    applied_after(&agent, generation, "the Pod's labels", |s| {
        s.endpoint("c1:eth0")
            .is_some_and(|v| v.endpoint.labels == labels7)
    })
    .await;
    let after = harness::expected(&paths, &links);
    let must = before.diff(&after);
    assert!(must.len() > 2, "the relabel changes entries: {must:?}");
    assert_eq!(
        once_each(kernel.touched_since(mark)),
        must,
        "exactly the changed keys, once each"
    );
    assert!(kernel.state() == after);
    assert_ne!(
        agent
            .handle
            .snapshot()
            .endpoint("c1:eth0")
            .and_then(|v| v.identity),
        identity_before,
        "a new identity"
    );

    // A pod of another node, with endpoint 2's namespace and labels: its address carries the
    // identity of that label set, and nothing else changes.
    let c2 = synthetic::endpoint(SIZES, 2);
    let identity2 = agent
        .handle
        .snapshot()
        .endpoint("c2:eth0")
        .and_then(|v| v.identity)
        .expect("identity");
    let mark = kernel.mark();
    let generation = agent.handle.snapshot().summary.generation;
    write(
        &paths,
        "remote.yaml",
        &pod_doc(
            &c2.namespace,
            "remote-1",
            &as_yaml(&c2.labels),
            Some("10.250.0.9"),
        ),
    );
    let remote_ip: IpAddr = "10.250.0.9".parse().expect("ip");
    let IpAddr::V4(v4) = remote_ip else {
        unreachable!("v4")
    };
    agent
        .wait_until("the remote pod's address", || {
            kernel.state().ident4.contains_key(&v4.octets())
        })
        .await;
    applied_after(&agent, generation, "the remote pod", |_| true).await;
    let remote = harness::expected(&paths, &links);
    assert_eq!(remote.ident4[&v4.octets()].identity, identity2);
    assert_eq!(
        once_each(kernel.touched_since(mark)),
        std::collections::BTreeSet::from([AnyKey::Ident4(v4.octets())]),
        "only the remote address is written"
    );
    assert!(kernel.state() == remote);

    // A remote pod with new labels that a policy's peer selects adds policy entries (it is a
    // peer by label); removing it withdraws them and its address.
    let generation = agent.handle.snapshot().summary.generation;
    let mark = kernel.mark();
    write(
        &paths,
        "remote.yaml",
        &pod_doc(
            &c2.namespace,
            "remote-1",
            "tier: web, app: new",
            Some("10.250.0.9"),
        ),
    );
    applied_after(&agent, generation, "the remote pod's new labels", |_| true).await;
    agent
        .wait_until("the new identity", || {
            kernel
                .state()
                .ident4
                .get(&v4.octets())
                .is_some_and(|i| i.identity != identity2)
        })
        .await;
    let relabelled = harness::expected(&paths, &links);
    assert_eq!(
        once_each(kernel.touched_since(mark)),
        remote.diff(&relabelled)
    );
    assert!(kernel.state() == relabelled);

    // A bad Pod document refuses only itself: p1 keeps its last good labels, and another
    // document in the same file still applies.
    let generation = agent.handle.snapshot().summary.generation;
    write(
        &paths,
        "pod-p1.yaml",
        &format!(
            "{}status: {{podIP: not-an-ip}}\n---\n{}",
            pod_doc(&c1.namespace, "p1", "app: other", None),
            pod_doc(&c1.namespace, "remote-2", "app: x", Some("10.250.0.10"))
        ),
    );
    applied_after(&agent, generation, "the bad document reported", |s| {
        s.summary
            .policy_errors
            .iter()
            .any(|e| e.contains("pod-p1.yaml:1:") && e.contains("status.podIP"))
    })
    .await;
    assert_eq!(
        agent
            .handle
            .snapshot()
            .endpoint("c1:eth0")
            .map(|v| v.endpoint.labels.clone()),
        Some(labels7),
        "the last good labels stay"
    );
    assert!(
        kernel.state().ident4.contains_key(&[10, 250, 0, 10]),
        "the good document beside it applies"
    );
    source.abort();
    agent.stop();
}
