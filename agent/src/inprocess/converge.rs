//! 1,000 endpoints in 50 namespaces and 500 policies through the real sources and the loop.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use super::harness::{self, FakeKernel, once_each};
use crate::{
    control::{
        applier::{self, Command, LoopHandle},
        snapshot::Snapshot,
    },
    paths::Paths,
    sources::link_source,
    synthetic::{self, Sizes},
};

const SIZES: Sizes = Sizes {
    endpoints: 1000,
    namespaces: 50,
    policies: 500,
};
const WAIT: Duration = Duration::from_secs(120);

/// An agent's loop and link source over `kernel` (what `weir agent` starts).
pub(crate) struct Agent {
    pub(crate) handle: LoopHandle,
    thread: Option<std::thread::JoinHandle<()>>,
    links: tokio::task::JoinHandle<()>,
}

impl Agent {
    pub(crate) fn start(paths: &Paths, kernel: &FakeKernel) -> Self {
        let node = harness::open_node(paths, kernel);
        let (handle, thread) = applier::spawn(node).expect("the loop starts");
        let links = tokio::spawn(link_source::supervise(
            handle.clone(),
            kernel.fake.clone(),
            |_| {},
        ));
        Self {
            handle,
            thread: Some(thread),
            links,
        }
    }

    /// The agent of a loop and a link source started by the caller.
    pub(crate) fn from_parts(
        handle: LoopHandle,
        thread: std::thread::JoinHandle<()>,
        links: tokio::task::JoinHandle<()>,
    ) -> Self {
        Self {
            handle,
            thread: Some(thread),
            links,
        }
    }

    /// Waits (bounded) until `ok`.
    pub(crate) async fn wait_until(&self, what: &str, ok: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + WAIT;
        while !ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: not within {} s",
                WAIT.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits (bounded) for a snapshot that satisfies `ok`.
    pub(crate) async fn wait(&self, what: &str, ok: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
        let mut rx: watch::Receiver<Arc<Snapshot>> = self.handle.subscribe();
        match tokio::time::timeout(WAIT, rx.wait_for(|s| ok(s))).await {
            Ok(Ok(s)) => Arc::clone(&s),
            _ => panic!(
                "{what}: not within {} s; last snapshot: {:?}",
                WAIT.as_secs(),
                self.handle.snapshot().applied
            ),
        }
    }

    pub(crate) async fn ready(&self) -> Arc<Snapshot> {
        self.wait("ready", |s| s.applied.ready).await
    }

    /// Stops the loop (as SIGTERM does) and waits for its thread.
    pub(crate) fn stop(mut self) {
        self.links.abort();
        self.handle.stop();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the loop thread ends cleanly");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.links.abort();
        self.handle.stop();
    }
}

fn setup(sizes: Sizes) -> (tempfile::TempDir, Paths, FakeKernel) {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    synthetic::write(&paths, sizes).expect("write the sources");
    let kernel = FakeKernel::new();
    for i in 0..sizes.endpoints {
        kernel.fake.add_link(
            &synthetic::host_ifname(i),
            1000 + u32::try_from(i).expect("index"),
        );
    }
    (dir, paths, kernel)
}

/// Replaces the first `from` after policy `name`'s header in the policy file.
fn edit_policy(paths: &Paths, name: &str, from: &str, to: &str) {
    let file = paths.policy_dir.join("synthetic.yaml");
    let text = std::fs::read_to_string(&file).expect("read");
    let at = text
        .find(&format!("name: {name}, namespace"))
        .expect("the policy is there");
    let offset = text[at..].find(from).expect("the text to edit") + at;
    let edited = format!("{}{to}{}", &text[..offset], &text[offset + from.len()..]);
    std::fs::write(&file, edited).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_endpoints_and_500_policies_converge_a_restart_writes_nothing_and_changes_write_only_their_keys()
 {
    let (_dir, paths, kernel) = setup(SIZES);
    let links = kernel.fake.interfaces();

    // From empty: the registry and policy files on disk, the links from the watcher.
    let agent = Agent::start(&paths, &kernel);
    let ready = agent.ready().await;
    let expected = harness::expected(&paths, &links);
    assert_eq!(
        expected.endpoints.len(),
        SIZES.endpoints,
        "every endpoint has a link"
    );
    assert!(
        expected.policy.len() > 10 * SIZES.policies,
        "the policies select something: {} entries",
        expected.policy.len()
    );
    assert!(!expected.ipcache4.is_empty(), "CIDR identities");
    eprintln!(
        "{} policy entries, {} entries in all",
        expected.policy.len(),
        expected.entries()
    );
    let state = kernel.state();
    assert!(
        state == expected,
        "the kernel holds exactly the full compile's entries"
    );
    assert_eq!(
        kernel.map_writes(),
        expected.entries(),
        "from empty, every entry is written once"
    );
    assert_eq!(kernel.fake.attached_links().len(), SIZES.endpoints);
    assert_eq!(
        usize::try_from(kernel.fake.tc_ops()).expect("ops"),
        2 * SIZES.endpoints,
        "two programs per link"
    );
    assert_eq!(ready.summary.endpoints, SIZES.endpoints);
    assert_eq!(ready.endpoints.len(), SIZES.endpoints);
    assert!(
        ready
            .endpoints
            .values()
            .all(|v| v.identity.is_some() && v.ifindex.is_some()),
        "the snapshot shows every endpoint's identity and link"
    );
    agent.stop();

    // A restart over it writes nothing.
    let (writes, ops) = (kernel.map_writes(), kernel.fake.tc_ops());
    let agent = Agent::start(&paths, &kernel);
    agent.ready().await;
    assert_eq!(kernel.map_writes(), writes, "a restart writes no map entry");
    assert_eq!(kernel.fake.tc_ops(), ops, "a restart touches no attachment");
    assert!(kernel.state() == expected);

    // One label of one pod (through the API's command): only the keys that change are written.
    let before = harness::expected(&paths, &links);
    let mark = kernel.mark();
    let mut endpoint = agent
        .handle
        .snapshot()
        .endpoint("c1:eth0")
        .expect("endpoint c1")
        .endpoint
        .clone();
    endpoint.labels.insert("app".into(), "a21".into());
    let pending = agent
        .handle
        .upsert_endpoint(endpoint, WAIT)
        .await
        .expect("accepted");
    pending.applied().await.expect("applied");
    let after = harness::expected(&paths, &links);
    let must = before.diff(&after);
    assert!(
        must.len() > 10,
        "the change unselects the pod from 5 policies: {} keys",
        must.len()
    );
    let written = once_each(kernel.touched_since(mark));
    assert_eq!(
        written, must,
        "exactly the keys that changed are written, once each"
    );
    assert!(kernel.state() == after);

    // One policy edit (through the policy source's command): only its keys.
    let mark = kernel.mark();
    edit_policy(&paths, "pol3", "port: 83}", "port: 93}");
    let edited = harness::expected(&paths, &links);
    let must = after.diff(&edited);
    assert!(!must.is_empty(), "the edit changes entries");
    let (set, errors) = crate::calc::policy::load::load_dir(&paths.policy_dir);
    let generation = agent.handle.snapshot().summary.generation;
    agent
        .handle
        .send(Command::Policies { set, errors })
        .expect("sent");
    agent
        .wait("the policy edit applied", |s| {
            s.applied.generation > generation
        })
        .await;
    assert_eq!(once_each(kernel.touched_since(mark)), must);
    assert!(kernel.state() == edited);
    agent.stop();
}
