//! Storage faults: a failed commit leaves the last good state, the store reports its path and cause, stays
//! degraded while writes fail, and recovers by itself (no reopen by the caller, nothing stored lost).

use std::{
    sync::{Mutex, RwLock},
    time::{Duration, Instant},
};

use super::{Counters, ENOSPC, EmbeddedStore, Shared, Sharing, StoreHealth, faults::Injector};
use crate::store::{Key, Kind, Op, Store, StoreError};

const EIO: i32 = 5;

fn injected(path: &std::path::Path, injector: &Injector) -> EmbeddedStore {
    EmbeddedStore::open_shared(
        Shared {
            db: RwLock::new(None),
            path: path.to_owned(),
            sharing: Sharing::Exclusive,
            counters: Counters::default(),
            health: Mutex::new(StoreHealth::default()),
            inject: Some(injector.clone()),
        },
        Duration::from_secs(5),
    )
    .expect("open")
}

fn key(i: usize) -> Key {
    Key::new(Kind::Handle, format!("h{i}"))
}

async fn create(store: &EmbeddedStore, i: usize) -> Result<(), StoreError> {
    store
        .txn(vec![Op::Create {
            key: key(i),
            value: format!("v{i}").into_bytes(),
        }])
        .await
}

async fn stored(store: &EmbeddedStore, n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for i in 0..n {
        if store.get(&key(i)).await.expect("read").is_some() {
            out.push(i);
        }
    }
    out
}

fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_commit_naming_path_and_disk_keeps_what_was_stored_and_recovers_by_itself()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ipam.redb");
    let injector = Injector::default();
    let store = injected(&path, &injector);
    for i in 0..10 {
        create(&store, i).await.expect("stored before the fault");
    }
    assert_eq!(
        store.health(),
        StoreHealth::default(),
        "healthy before the fault"
    );
    injector.fail_writes(ENOSPC);
    let err = create(&store, 10).await.expect_err("the disk is full");
    let message = err.to_string();
    assert!(
        matches!(err, StoreError::Unavailable { .. })
            && message.contains(&path.display().to_string())
            && message.contains("the disk is full")
            && message.contains(&dir.path().display().to_string()),
        "{message}"
    );
    let health = store.health();
    let fault = health.fault.expect("degraded");
    assert!(fault.full_disk && fault.path == path, "{fault:?}");
    assert_eq!((health.faults, health.recoveries), (1, 0));
    // Every write fails here, so the reopen does too (opening rewrites the header): a read fails, and says why.
    let err = store
        .get(&key(0))
        .await
        .expect_err("closed while every write fails");
    let message = err.to_string();
    assert!(
        message.contains(&path.display().to_string()) && message.contains("the disk is full"),
        "{message}"
    );
    // Still full: the probes keep failing and the store stays degraded.
    wait_until("a probe while full", || {
        store.health().fault.is_some_and(|f| f.attempts > 1)
    });
    assert!(create(&store, 10).await.is_err(), "still full");
    // Space returns: a probe clears the fault with no request and no reopen by the caller.
    injector.clear();
    wait_until("the probe clears the fault", || {
        store.health().fault.is_none()
    });
    assert_eq!(store.health().recoveries, 1);
    // The failed commit wrote nothing; everything before it is there.
    assert_eq!(stored(&store, 11).await, (0..10).collect::<Vec<_>>());
    create(&store, 10).await.expect("writes again");
    drop(store);
    let reopened = EmbeddedStore::open_with(&path, Duration::from_secs(5), Sharing::Exclusive)
        .expect("reopen");
    assert_eq!(
        stored(&reopened, 12).await,
        (0..11).collect::<Vec<_>>(),
        "nothing lost, nothing half-written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_request_after_space_returns_succeeds_before_any_probe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ipam.redb");
    let injector = Injector::default();
    let store = injected(&path, &injector);
    create(&store, 0).await.expect("first");
    injector.fail_writes(ENOSPC);
    create(&store, 1).await.expect_err("full");
    injector.clear();
    // At once, well inside the first probe interval: the request itself commits.
    create(&store, 1).await.expect("the next request succeeds");
    assert!(store.health().fault.is_none());
    assert_eq!(stored(&store, 2).await, [0, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_fails_reads_too_closes_the_store_and_a_read_reopens_it_once_it_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ipam.redb");
    let injector = Injector::default();
    let store = injected(&path, &injector);
    create(&store, 0).await.expect("first");
    injector.fail_everything(EIO);
    let err = create(&store, 1).await.expect_err("the device fails");
    assert!(err.to_string().contains("the disk failed"), "{err}");
    // The reopen fails too: reads fail, naming the path and the cause, never an empty location.
    let err = store.get(&key(0)).await.expect_err("unreadable");
    let message = err.to_string();
    assert!(
        message.contains(&path.display().to_string()) && message.contains("Input/output error"),
        "{message}"
    );
    assert!(store.health().fault.is_some_and(|f| !f.full_disk));
    injector.clear();
    // The read itself reopens the store: no caller reopens it, no restart.
    assert!(store.get(&key(0)).await.expect("readable again").is_some());
    create(&store, 1).await.expect("writes again");
    assert!(store.health().fault.is_none());
    assert_eq!(stored(&store, 2).await, [0, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_not_a_fault() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = injected(&dir.path().join("ipam.redb"), &Injector::default());
    create(&store, 0).await.expect("first");
    // A conflict is the request's own failure: the store stays healthy.
    assert!(create(&store, 0).await.expect_err("exists").is_conflict());
    assert_eq!(store.health(), StoreHealth::default());
}
