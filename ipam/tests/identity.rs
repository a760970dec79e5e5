//! Cluster-wide identities over every datastore with transactions (memory, embedded redb, a real etcd): one
//! number per label set on every node, even when nodes race; stable across a restart; released only after the
//! grace period once no node uses it, and never reused while in use.

use std::{collections::BTreeMap, sync::Arc};

use ipam::{
    identity::{IdentityAllocator, Labels},
    store::{Store, embedded::EmbeddedStore, etcd::EtcdStore, memory::MemoryStore},
    testing::EtcdServer,
};

const RANGE: std::ops::RangeInclusive<u32> = 256..=65_535;
const GRACE: u64 = 600;

fn labels(app: &str, ns: &str) -> Labels {
    BTreeMap::from([
        ("app".to_owned(), app.to_owned()),
        ("weir.dev/namespace".to_owned(), ns.to_owned()),
    ])
}

/// Eight nodes allocate the same twenty label sets at once: every node gets the same number for a label set,
/// distinct label sets get distinct numbers, and the store holds exactly twenty identities.
async fn racing_nodes_agree<S: Store + Clone>(store: S) {
    let sets: Arc<Vec<Labels>> =
        Arc::new((0..20).map(|i| labels(&format!("app{i}"), "x")).collect());
    let mut tasks = Vec::new();
    for n in 0..8 {
        let alloc = IdentityAllocator::new(store.clone(), format!("node-{n}"), RANGE, GRACE);
        let sets = Arc::clone(&sets);
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            // Each node walks the sets in its own order, so the races differ.
            for i in 0..sets.len() {
                let set = &sets[(i * 7 + n * 3) % sets.len()];
                got.push((
                    set.clone(),
                    alloc.allocate(set, 1_000).await.expect("allocate"),
                ));
            }
            got
        }));
    }
    let mut by_set: BTreeMap<Labels, u32> = BTreeMap::new();
    for t in tasks {
        for (set, id) in t.await.expect("task") {
            let seen = *by_set.entry(set.clone()).or_insert(id);
            assert_eq!(seen, id, "two numbers for {set:?}");
        }
    }
    let ids: std::collections::BTreeSet<u32> = by_set.values().copied().collect();
    assert_eq!(
        ids.len(),
        20,
        "distinct label sets share a number: {by_set:?}"
    );
    assert!(ids.iter().all(|id| RANGE.contains(id)));
    let listed = IdentityAllocator::new(store, "reader", RANGE, GRACE)
        .list()
        .await
        .expect("list");
    assert_eq!(listed.len(), 20);
    for identity in listed {
        assert_eq!(by_set.get(&identity.labels), Some(&identity.id));
        assert_eq!(identity.users.len(), 8, "every node is a user");
    }
}

/// Released by every user, an identity is collected only after the grace period; one still renewed by a node
/// is never collected, and its number is not handed to another label set.
async fn collected_after_grace_never_while_used<S: Store + Clone>(store: S) {
    let a = IdentityAllocator::new(store.clone(), "node-a", RANGE, GRACE);
    let b = IdentityAllocator::new(store.clone(), "node-b", RANGE, GRACE);
    let web = labels("web", "x");
    let db = labels("db", "x");
    let web_id = a.allocate(&web, 1_000).await.expect("web");
    let db_id = b.allocate(&db, 1_000).await.expect("db");
    a.release(web_id, 1_100).await.expect("release web");
    assert!(b.renew(&[db_id], 1_100).await.expect("renew").is_empty());
    assert!(
        a.collect_garbage(1_100 + GRACE - 1)
            .await
            .expect("gc")
            .is_empty(),
        "inside the grace period"
    );
    // b keeps renewing db; a node that stopped renewing counts as gone after the grace period.
    assert!(b.renew(&[db_id], 1_650).await.expect("renew").is_empty());
    assert_eq!(
        a.collect_garbage(1_100 + GRACE).await.expect("gc"),
        vec![web_id]
    );
    // A new label set may now take the released number, but never db's.
    let api = labels("api", "y");
    let api_id = a.allocate(&api, 1_800).await.expect("api");
    assert_ne!(api_id, db_id, "a number in use was handed out again");
    assert_eq!(
        api_id, web_id,
        "the lowest free number is reused only once released"
    );
    assert_eq!(b.allocate(&db, 1_800).await.expect("db again"), db_id);
    assert!(
        a.collect_garbage(1_800 + GRACE - 1)
            .await
            .expect("gc")
            .is_empty()
    );
    // b dies: it stops renewing db, while a renews api; after the grace period db goes, api stays.
    assert!(a.renew(&[api_id], 2_300).await.expect("renew").is_empty());
    assert_eq!(
        a.collect_garbage(1_800 + GRACE + 1).await.expect("gc"),
        vec![db_id]
    );
    // renew reports what is gone, so the node allocates its labels again.
    assert_eq!(b.renew(&[db_id], 3_000).await.expect("renew"), vec![db_id]);
}

#[tokio::test]
async fn memory_racing_nodes_agree() {
    racing_nodes_agree(MemoryStore::new()).await;
}

#[tokio::test]
async fn memory_collected_after_grace_never_while_used() {
    collected_after_grace_never_while_used(MemoryStore::new()).await;
}

#[tokio::test]
async fn embedded_identities_are_stable_across_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("ipam.redb");
    let web = labels("web", "x");
    let id = {
        let store = EmbeddedStore::open(&path, std::time::Duration::from_secs(5)).expect("open");
        racing_nodes_agree(store.clone()).await;
        IdentityAllocator::new(store, "node-a", RANGE, GRACE)
            .allocate(&web, 1_000)
            .await
            .expect("web")
    };
    let store = EmbeddedStore::open(&path, std::time::Duration::from_secs(5)).expect("reopen");
    let again = IdentityAllocator::new(store, "node-b", RANGE, GRACE)
        .allocate(&web, 2_000)
        .await
        .expect("web after restart");
    assert_eq!(again, id);
}

#[tokio::test]
async fn etcd_racing_nodes_agree_and_collect() {
    let Some(etcd) = EtcdServer::start_or_skip() else {
        return;
    };
    let store = EtcdStore::connect(&[etcd.url().to_owned()])
        .await
        .expect("connect");
    racing_nodes_agree(store).await;
    // A fresh prefix of keys: the second scenario on its own server state.
    let etcd2 = EtcdServer::start().expect("second etcd");
    let store = EtcdStore::connect(&[etcd2.url().to_owned()])
        .await
        .expect("connect");
    collected_after_grace_never_while_used(store).await;
}
