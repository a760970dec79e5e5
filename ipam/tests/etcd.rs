//! Against a real etcd started on loopback: the store contract and 32 hosts allocating at once.

use std::collections::BTreeSet;

use ipam::{
    AssignArgs, Ipam,
    model::{AffinityState, IpPool, IpUse},
    store::{
        Key, Kind, Op, Store, Write, embedded::EmbeddedStore, etcd::EtcdStore, memory::MemoryStore,
    },
    testing::EtcdServer,
};

async fn contract<S: Store>(s: &S) {
    let k = Key::new(Kind::Handle, "h1");
    s.txn(vec![Op::Create {
        key: k.clone(),
        value: b"1".to_vec(),
    }])
    .await
    .expect("create");
    let e = s
        .txn(vec![Op::Create {
            key: k.clone(),
            value: b"2".to_vec(),
        }])
        .await
        .expect_err("create twice");
    assert!(e.is_conflict(), "{e}");
    let v = s.get(&k).await.expect("get").expect("present");
    assert_eq!(v.value, b"1");
    s.txn(vec![Op::Update {
        key: k.clone(),
        value: b"3".to_vec(),
        revision: v.revision,
    }])
    .await
    .expect("cas");
    let stale = s
        .txn(vec![Op::Update {
            key: k.clone(),
            value: b"4".to_vec(),
            revision: v.revision,
        }])
        .await;
    assert!(stale.expect_err("stale cas").is_conflict());
    // A multi-key transaction is all or nothing.
    let k2 = Key::new(Kind::Handle, "h2");
    let r = s
        .txn(vec![
            Op::Create {
                key: k2.clone(),
                value: b"x".to_vec(),
            },
            Op::Delete {
                key: k.clone(),
                revision: v.revision,
            },
        ])
        .await;
    assert!(r.expect_err("second op stale").is_conflict());
    assert!(
        s.get(&k2).await.expect("get").is_none(),
        "nothing of a failed transaction is applied"
    );
    s.txn(vec![Op::Create {
        key: Key::new(Kind::Handle, "h10"),
        value: b"y".to_vec(),
    }])
    .await
    .expect("create");
    s.txn(vec![Op::Create {
        key: Key::new(Kind::Block, "h1x"),
        value: b"z".to_vec(),
    }])
    .await
    .expect("create");
    let listed: Vec<String> = s
        .list(Kind::Handle, "h1")
        .await
        .expect("list")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        listed,
        vec!["h1".to_owned(), "h10".to_owned()],
        "lists one kind, by prefix, in order"
    );
    let n = s.read_modify_write(vec![k.clone(), k2.clone()], |cur| {
        let n = cur.iter().filter(|c| c.is_some()).count();
        (vec![Write::Delete, Write::Put(b"new".to_vec())], n)
    });
    assert_eq!(n.await.expect("rmw"), 1);
    assert!(s.get(&k).await.expect("get").is_none());
    assert_eq!(s.get(&k2).await.expect("get").expect("put").value, b"new");
}

#[tokio::test]
async fn store_contract_memory() {
    contract(&MemoryStore::new()).await;
}

#[tokio::test]
async fn store_contract_embedded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ipam.redb");
    {
        let s = EmbeddedStore::open(&path, std::time::Duration::from_secs(1)).expect("open");
        contract(&s).await;
    }
    let s = EmbeddedStore::open(&path, std::time::Duration::from_secs(1)).expect("reopen");
    assert!(
        s.get(&Key::new(Kind::Handle, "h2"))
            .await
            .expect("get")
            .is_some(),
        "committed writes survive a reopen"
    );
}

#[tokio::test]
async fn store_contract_etcd() {
    let Some(etcd) = EtcdServer::start_or_skip() else {
        return;
    };
    let s = EtcdStore::connect(&[etcd.url().to_owned()])
        .await
        .expect("connect");
    contract(&s).await;
}

#[tokio::test]
async fn unreachable_etcd_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let e = EtcdStore::connect(&[format!("http://127.0.0.1:{port}")])
        .await
        .expect_err("nobody listens");
    assert!(e.to_string().contains("cannot reach etcd"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_hosts_allocate_fifty_each_on_etcd() {
    let Some(etcd) = EtcdServer::start_or_skip() else {
        return;
    };
    let store = EtcdStore::connect(&[etcd.url().to_owned()])
        .await
        .expect("connect");
    let ipam = Ipam::new(store);
    ipam.add_pool(IpPool {
        name: "p".into(),
        cidr: "10.20.0.0/16".parse().expect("cidr"),
        block_size: 26,
        node_selector: String::new(),
        namespace_selector: String::new(),
        allowed_uses: vec![IpUse::Workload],
        disabled: false,
    })
    .await
    .expect("pool");
    let mut tasks = Vec::new();
    for h in 0..32 {
        let ipam = ipam.clone();
        tasks.push(tokio::spawn(async move {
            let mut ips = Vec::new();
            for i in 0..50 {
                let r = ipam
                    .auto_assign(&AssignArgs::new(
                        &format!("node{h}"),
                        &format!("n{h}-c{i}"),
                        1,
                        0,
                    ))
                    .await
                    .expect("assign");
                assert_eq!(r.ipv4.len(), 1, "{:?}", r.messages);
                ips.push((h, r.ipv4[0]));
            }
            ips
        }));
    }
    let mut all = BTreeSet::new();
    for t in tasks {
        for (h, ip) in t.await.expect("join") {
            assert!(all.insert(ip.ip()), "duplicate address {ip}");
            // Every host allocates from its own block while it has one with room (64 > 50).
            let affs = ipam
                .host_affinities(&format!("node{h}"))
                .await
                .expect("affs");
            assert!(
                affs.iter()
                    .any(|a| a.cidr.contains(ip.ip()) && a.state == AffinityState::Confirmed),
                "{ip} not in node{h}'s block"
            );
        }
    }
    assert_eq!(all.len(), 1600);
    let report = ipam.check().await.expect("check");
    assert!(report.ok(), "{:#?}", report.problems);
    assert_eq!(report.allocations, 1600);
    assert_eq!(report.affinities, 32);
}

/// Config, pools and reservations are served from a watch-fed cache: a process reads its own writes at once,
/// and sees another process's writes (adds and deletes) once their watch events arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_cache_reads_own_writes_and_follows_other_writers() {
    let Some(server) = EtcdServer::start_or_skip() else {
        return;
    };
    let url = vec![server.url().to_owned()];
    let (store_a, store_b) = (
        EtcdStore::connect(&url).await.expect("connect a"),
        EtcdStore::connect(&url).await.expect("connect b"),
    );
    // Both caches synced first (their own signal, not a sleep), so the reads below are cache reads.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !(store_a.settings_cache_live() && store_b.settings_cache_live()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the settings caches did not sync within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (a, b) = (Ipam::new(store_a), Ipam::new(store_b));
    let pool = |name: &str, cidr: &str| ipam::model::IpPool {
        name: name.into(),
        cidr: cidr.parse().expect("cidr"),
        block_size: 26,
        node_selector: String::new(),
        namespace_selector: String::new(),
        allowed_uses: vec![ipam::model::IpUse::Workload],
        disabled: false,
    };
    for i in 0..5 {
        a.add_pool(pool(&format!("p{i}"), &format!("10.{i}.0.0/16")))
            .await
            .expect("add pool");
        let names: Vec<String> = a
            .pools()
            .await
            .expect("pools")
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert!(
            names.contains(&format!("p{i}")),
            "own write not read back: {names:?}"
        );
        let r = a
            .auto_assign(&AssignArgs::new("n1", &format!("h{i}"), 1, 0))
            .await
            .expect("allocate right after adding a pool");
        assert_eq!(r.ipv4.len(), 1, "{r:?}");
    }
    let mut cfg = a.config().await.expect("config");
    cfg.max_blocks_per_host = 7;
    cfg.strict_affinity = true;
    a.set_config(cfg).await.expect("set config");
    assert_eq!(a.config().await.expect("config").max_blocks_per_host, 7);

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let pools = b.pools().await.expect("pools").len();
        let max = b.config().await.expect("config").max_blocks_per_host;
        if pools == 5 && max == 7 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "b never saw a's writes: {pools} pools, max {max}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    b.delete_pool("p4", true).await.expect("delete from b");
    assert!(b.pool("p4").await.is_err(), "b reads its own delete");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while a.pool("p4").await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "a never saw b's delete"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Increments the number stored at `key` (absent: 0) and returns the new value.
async fn increment(s: &EtcdStore, key: &Key) -> u64 {
    s.read_modify_write(vec![key.clone()], |cur| {
        let n: u64 = cur[0]
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        (vec![Write::Put((n + 1).to_string().into_bytes())], n + 1)
    })
    .await
    .expect("increment")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_of_one_process_share_transactions_and_another_processs_writes_are_seen()
{
    let Some(etcd) = EtcdServer::start_or_skip() else {
        return;
    };
    let url = [etcd.url().to_owned()];
    let (a, b) = (
        EtcdStore::connect(&url).await.expect("connect a"),
        EtcdStore::connect(&url).await.expect("connect b"),
    );
    let key = Key::new(Kind::Block, "counter");
    // 64 writers in this process and 16 through another connection (another process, as far as etcd and the
    // committers are concerned), all on one key: no increment may be lost.
    let mut tasks = Vec::new();
    for i in 0..80 {
        let (s, key) = (if i % 5 == 0 { b.clone() } else { a.clone() }, key.clone());
        tasks.push(tokio::spawn(async move { increment(&s, &key).await }));
    }
    let mut seen = BTreeSet::new();
    for t in tasks {
        assert!(
            seen.insert(t.await.expect("task")),
            "two writers saw the same value"
        );
    }
    assert_eq!(seen.len(), 80);
    assert_eq!(*seen.last().expect("values"), 80, "no increment lost");
    let stats = a.stats();
    assert_eq!(stats.jobs, 64);
    assert!(
        stats.rounds < stats.jobs,
        "writers waiting together share rounds: {stats:?}"
    );
    // `a` knows the value it last wrote; a write through `b` makes that stale, and `a` must see it.
    let lost = a.stats().lost;
    let at_a = increment(&a, &key).await;
    let at_b = increment(&b, &key).await;
    assert_eq!(at_b, at_a + 1);
    assert_eq!(increment(&a, &key).await, at_b + 1);
    assert!(
        a.stats().lost > lost,
        "the stale value lost its compare-and-swap"
    );
}

/// A handle key the committer has never seen is assumed absent, not read: a second process (its own
/// committer) that allocates more under a handle the first one created, or releases it, must still see it (the
/// CAS on the assumed absence loses and the round decides again on the real value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_created_by_another_process_is_seen_by_allocation_and_release() {
    let Some(etcd) = EtcdServer::start_or_skip() else {
        return;
    };
    let connect = || async {
        Ipam::new(
            EtcdStore::connect(&[etcd.url().to_owned()])
                .await
                .expect("connect"),
        )
    };
    let a = connect().await;
    a.add_pool(IpPool {
        name: "p".into(),
        cidr: "10.21.0.0/16".parse().expect("cidr"),
        block_size: 26,
        node_selector: String::new(),
        namespace_selector: String::new(),
        allowed_uses: vec![IpUse::Workload],
        disabled: false,
    })
    .await
    .expect("pool");
    // Connected after the pool exists: its settings cache starts from a listing that holds it
    // (a cache started earlier follows the pool through its watch, a moment later).
    let b = connect().await;
    let first = a
        .auto_assign(&AssignArgs::new("node1", "shared", 1, 0))
        .await
        .expect("assign on a");
    assert_eq!(first.ipv4.len(), 1, "{:?}", first.messages);
    let second = b
        .auto_assign(&AssignArgs::new("node1", "shared", 1, 0))
        .await
        .expect("assign on b");
    assert_eq!(second.ipv4.len(), 1, "{:?}", second.messages);
    assert_ne!(first.ipv4[0], second.ipv4[0]);
    let mut held = a.ips_by_handle("shared").await.expect("held");
    held.sort();
    let mut want = vec![first.ipv4[0], second.ipv4[0]];
    want.sort();
    assert_eq!(held, want, "the handle holds both processes' addresses");
    let released = b.release_by_handle("shared").await.expect("release on b");
    assert_eq!(released.len(), 2, "{released:?}");
    assert!(
        a.ips_by_handle("shared")
            .await
            .map_or(true, |held| held.is_empty()),
        "the handle still holds addresses"
    );
    let report = a.check().await.expect("check");
    assert!(report.ok(), "{:#?}", report.problems);
}
