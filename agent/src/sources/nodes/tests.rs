use std::sync::{
    Mutex,
    atomic::{AtomicUsize, Ordering},
};

use ipam::{
    Ipam, IpamError,
    store::{StoreError, memory::MemoryStore},
};
use tokio::sync::mpsc;

use super::*;
use crate::cluster::{
    records::RecordChange,
    store::{NodeStoreError, RecordListing},
};

fn record(name: &str, addr: &str, heartbeat: u64, expiry: u64) -> NodeRecord {
    NodeRecord {
        name: name.into(),
        addresses: vec![addr.parse().expect("ip")],
        labels: BTreeMap::new(),
        heartbeat,
        expiry,
    }
}

/// The loop, as a channel of commands; no local endpoints.
struct Chan(mpsc::UnboundedSender<Command>);

impl Output for Chan {
    fn send(&self, command: Command) -> bool {
        self.0.send(command).is_ok()
    }

    fn local(&self, _: &str) -> Vec<EndpointRecord> {
        Vec::new()
    }

    async fn changed(&mut self) -> bool {
        std::future::pending().await
    }
}

/// Waits (at most `secs`) for a command that `want` accepts; returns it.
async fn expect<T>(
    rx: &mut mpsc::UnboundedReceiver<Command>,
    secs: u64,
    what: &str,
    mut want: impl FnMut(&Command) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let c = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {what} within {secs} s"))
            .expect("the source ended");
        if let Some(t) = want(&c) {
            return t;
        }
    }
}

fn upsert(name: &'static str, alive: bool) -> impl FnMut(&Command) -> Option<()> {
    move |c| {
        matches!(c, Command::Node(NodeDelta::Upsert(n)) if n.name == name && n.alive == alive)
            .then_some(())
    }
}

fn gone(name: &'static str) -> impl FnMut(&Command) -> Option<()> {
    move |c| matches!(c, Command::Node(NodeDelta::Gone(n)) if n == name).then_some(())
}

#[tokio::test]
async fn without_a_watch_the_store_is_listed_again_and_a_deleted_record_goes() {
    let store = Ipam::new(MemoryStore::new());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = record("a", "192.0.2.1", 0, 30);
    let source =
        tokio::spawn(Follower::new(store.clone(), Chan(tx), a, Duration::from_millis(20)).run());
    expect(&mut rx, 5, "a's own record", upsert("a", true)).await;
    expect(&mut rx, 5, "synced", |c| {
        matches!(c, Command::Node(NodeDelta::Synced)).then_some(())
    })
    .await;
    store
        .put_node(&record("b", "192.0.2.2", now(), 30))
        .await
        .expect("put");
    expect(&mut rx, 5, "b's record", upsert("b", true)).await;
    store.delete_node("b").await.expect("delete");
    expect(&mut rx, 5, "b gone", gone("b")).await;
    source.abort();
    assert_eq!(interval(Duration::from_secs(42)), Duration::from_secs(14));
    assert_eq!(interval(Duration::from_secs(3)), Duration::from_secs(1));
}

/// The sending end of a watch the fake opened.
type WatchTx = mpsc::Sender<Result<Vec<RecordChange>, NodeStoreError>>;

/// A store that lists `state` and hands the test every watch it opens.
#[derive(Clone)]
struct Fake {
    state: Arc<Mutex<RecordListing>>,
    lists: Arc<AtomicUsize>,
    watches: mpsc::UnboundedSender<(u64, WatchTx)>,
}

impl NodeStore for Fake {
    async fn heartbeat(&self, _: &NodeRecord) -> Result<(), NodeStoreError> {
        Ok(())
    }

    async fn nodes(&self, now: u64) -> Result<BTreeMap<String, ClusterNode>, NodeStoreError> {
        Ok(self.state.lock().expect("lock").records.cluster(now))
    }

    async fn publish_endpoints(&self, _: &str, _: &[EndpointRecord]) -> Result<(), NodeStoreError> {
        Ok(())
    }

    async fn endpoints(&self) -> Result<Vec<EndpointRecord>, NodeStoreError> {
        Ok(self.state.lock().expect("lock").records.endpoint_records())
    }

    async fn list_records(&self) -> Result<RecordListing, NodeStoreError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        Ok(self.state.lock().expect("lock").clone())
    }

    async fn watch_records(&self, after: u64) -> Result<Option<RecordChanges>, NodeStoreError> {
        let (tx, rx) = mpsc::channel(4);
        self.watches.send((after, tx)).expect("the test is gone");
        Ok(Some(rx))
    }
}

fn put(state: &Mutex<RecordListing>, r: NodeRecord) {
    let mut s = state.lock().expect("lock");
    s.records.apply(RecordChange::Node(r.name.clone(), Some(r)));
    s.revision = s.revision.map(|v| v + 1);
}

fn delete(state: &Mutex<RecordListing>, name: &str) {
    let mut s = state.lock().expect("lock");
    s.records.apply(RecordChange::Node(name.into(), None));
    s.revision = s.revision.map(|v| v + 1);
}

#[tokio::test]
async fn watch_events_arrive_compaction_relists_failures_go_stale_and_expiry_needs_no_event() {
    let (watches, mut opened) = mpsc::unbounded_channel();
    let fake = Fake {
        state: Arc::new(Mutex::new(RecordListing {
            records: Records::default(),
            revision: Some(10),
        })),
        lists: Arc::default(),
        watches,
    };
    put(&fake.state, record("a", "192.0.2.1", now(), 30));
    put(&fake.state, record("b", "192.0.2.2", now(), 30));
    let (tx, mut rx) = mpsc::unbounded_channel();
    // A tick far longer than the test: nothing below may come from a timer but expiry's.
    let source = tokio::spawn(
        Follower::new(
            fake.clone(),
            Chan(tx),
            record("a", "192.0.2.1", 0, 30),
            Duration::from_millis(500),
        )
        .run(),
    );
    expect(&mut rx, 5, "b from the listing", upsert("b", true)).await;
    let (after, w1) = opened.recv().await.expect("a watch");
    assert_eq!(after, 12, "the watch starts at the listing's revision");
    assert_eq!(fake.lists.load(Ordering::SeqCst), 1);

    // An event reaches the loop without a listing.
    let c = record("c", "192.0.2.3", now(), 30);
    put(&fake.state, c.clone());
    w1.send(Ok(vec![RecordChange::Node("c".into(), Some(c))]))
        .await
        .expect("send");
    expect(&mut rx, 2, "c from the watch", upsert("c", true)).await;
    assert_eq!(
        fake.lists.load(Ordering::SeqCst),
        1,
        "no listing for an event"
    );

    // Changes the watch missed, then compaction: a new listing brings them, and a new watch from its revision.
    delete(&fake.state, "b");
    put(&fake.state, record("d", "192.0.2.4", now(), 30));
    let compacted = NodeStoreError::Datastore {
        what: "watch",
        source: IpamError::Store(StoreError::Compacted {
            asked: 13,
            compacted: 20,
        }),
    };
    w1.send(Err(compacted)).await.expect("send");
    expect(&mut rx, 2, "b gone after the relist", gone("b")).await;
    expect(&mut rx, 2, "d from the relist", upsert("d", true)).await;
    let (after, w2) = opened.recv().await.expect("a second watch");
    assert_eq!(after, 15);
    assert_eq!(fake.lists.load(Ordering::SeqCst), 2);

    // A broken watch: stale, then a listing after the backoff, and in sync again.
    w2.send(Err(NodeStoreError::WatchEnded))
        .await
        .expect("send");
    let why = expect(&mut rx, 2, "stale", |c| match c {
        Command::SourceStale(Some(why)) => Some(why.clone()),
        _ => None,
    })
    .await;
    assert!(why.contains("node records"), "{why}");
    expect(&mut rx, 5, "fresh again", |c| {
        matches!(c, Command::SourceStale(None)).then_some(())
    })
    .await;
    assert_eq!(fake.lists.load(Ordering::SeqCst), 3);
    let (_, w3) = opened.recv().await.expect("a third watch");

    // A node whose heartbeat stops expires with no event.
    let e = record("e", "192.0.2.5", now(), 2);
    w3.send(Ok(vec![RecordChange::Node("e".into(), Some(e))]))
        .await
        .expect("send");
    expect(&mut rx, 2, "e alive", upsert("e", true)).await;
    expect(&mut rx, 5, "e silent", upsert("e", false)).await;
    source.abort();
}

#[test]
fn a_silent_node_s_pods_stay_remote_pods_until_its_record_goes() {
    let endpoint = |node: &str, pod: &str, ip: &str| EndpointRecord {
        node: node.into(),
        namespace: "default".into(),
        pod: pod.into(),
        labels: BTreeMap::new(),
        ips: vec![ip.parse().expect("ip")],
    };
    let records = vec![
        endpoint("a", "mine", "10.0.0.1"),
        endpoint("b", "web", "10.0.1.1"),
        endpoint("c", "db", "10.0.2.1"),
        endpoint("gone", "old", "10.0.3.1"),
    ];
    let mut listed = Records::default();
    for r in [
        record("a", "192.0.2.1", 100, 30),
        record("b", "192.0.2.2", 100, 30),
        record("c", "192.0.2.3", 10, 30),
    ] {
        listed.apply(RecordChange::Node(r.name.clone(), Some(r)));
    }
    let nodes = listed.cluster(110);
    assert!(!nodes["c"].alive, "c is silent");
    let pods = remote_pods("a", records, &nodes);
    assert_eq!(
        pods.iter()
            .map(|p| (p.node.as_str(), p.pod.key.as_str()))
            .collect::<Vec<_>>(),
        [("c", "default/db"), ("b", "default/web")],
        "other nodes' pods, the silent node's included; none of this node or of a node with no record"
    );
}
