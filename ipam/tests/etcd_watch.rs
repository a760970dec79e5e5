//! Following kinds on a real etcd (started on loopback): a listing at one revision, the changes after it,
//! and a watch from a compacted revision ending with `StoreError::Compacted`.

use std::time::Duration;

use ipam::{
    store::{
        Key, Kind, Op, Store, StoreError,
        etcd::EtcdStore,
        watch::{Change, WatchStore},
    },
    testing::EtcdServer,
};

async fn next(changes: &mut ipam::store::watch::Changes) -> Result<Vec<Change>, StoreError> {
    tokio::time::timeout(Duration::from_secs(5), changes.recv())
        .await
        .expect("no watch response within 5 s")
        .expect("the watch stream ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_then_its_changes_and_compaction_ends_the_watch() {
    let Some(server) = EtcdServer::start_or_skip() else {
        return;
    };
    let store = EtcdStore::connect(&[server.url().to_owned()])
        .await
        .expect("connect");
    let create = |kind, name: &str, v: &[u8]| Op::Create {
        key: Key::new(kind, name),
        value: v.to_vec(),
    };
    store
        .txn(vec![
            create(Kind::Node, "a", b"1"),
            create(Kind::Endpoint, "a/ns/p", b"2"),
        ])
        .await
        .expect("write");
    let listing = store
        .list_at(vec![Kind::Node, Kind::Endpoint])
        .await
        .expect("list");
    assert_eq!(listing.rows[&Kind::Node].len(), 1);
    assert_eq!(listing.rows[&Kind::Endpoint][0].0, "a/ns/p");
    let at = listing.revision.expect("etcd lists at a revision");

    let mut changes = store
        .watch(vec![Kind::Node, Kind::Endpoint], at)
        .await
        .expect("watch")
        .expect("etcd watches");
    // A kind not followed is not reported; a followed one is, put and delete.
    store
        .txn(vec![create(Kind::Handle, "h", b"x")])
        .await
        .expect("write");
    store
        .txn(vec![create(Kind::Node, "b", b"3")])
        .await
        .expect("write");
    let got = next(&mut changes).await.expect("changes");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].kind, got[0].name.as_str()), (Kind::Node, "b"));
    assert_eq!(got[0].value.as_deref(), Some(&b"3"[..]));
    let b = store
        .get(&Key::new(Kind::Node, "b"))
        .await
        .expect("get")
        .expect("b");
    store
        .txn(vec![Op::Delete {
            key: Key::new(Kind::Node, "b"),
            revision: b.revision,
        }])
        .await
        .expect("delete");
    let got = next(&mut changes).await.expect("changes");
    assert_eq!((got[0].name.as_str(), got[0].value.as_ref()), ("b", None));

    // Compact past the listing's revision: a watch from it ends at once with Compacted.
    let mut client = etcd_client::Client::connect([server.url()], None)
        .await
        .expect("client");
    let now = client
        .get("x", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    client.compact(now, None).await.expect("compact");
    let mut stale = store
        .watch(vec![Kind::Node], at)
        .await
        .expect("watch")
        .expect("etcd watches");
    match next(&mut stale).await {
        Err(StoreError::Compacted { compacted, .. }) => {
            assert!(compacted >= at.0, "compacted at {compacted}");
        }
        other => panic!("not a compaction: {other:?}"),
    }
}
