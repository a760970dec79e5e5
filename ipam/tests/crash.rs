//! Real crashes: child processes allocate and release in a loop on a shared datastore and are killed with
//! SIGKILL at random moments; after every kill the datastore opens and every invariant holds.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use ipam::{
    AssignArgs, Ipam,
    model::{IpPool, IpUse, ReleaseCheck},
    store::Datastore,
    testing::EtcdServer,
};

const CHILD_ENV: &str = "WEIR_IPAM_CRASH_CHILD";

/// Not a test on its own: the body the parent tests run in child processes (it loops until killed).
#[tokio::test]
#[ignore = "run by the crash tests as a child process"]
async fn child_allocator_loop() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (ds, host) = spec.split_once('|').expect("spec is DATASTORE|HOST");
    let store = ds
        .parse::<Datastore>()
        .expect("datastore")
        .open(Duration::from_secs(10))
        .await
        .expect("open");
    let ipam = Ipam::new(store);
    let mut held = Vec::new();
    for i in 0..u64::MAX {
        let r = ipam
            .auto_assign(&AssignArgs::new(host, &format!("{host}-{i}"), 1, 0))
            .await;
        if let Ok(r) = r {
            held.extend(r.ips());
        }
        if held.len() > 20 || i % 3 == 0 {
            let ip = held.remove(0);
            let _ = ipam.release_ips(&[(ip, ReleaseCheck::default())]).await;
        }
    }
}

fn spawn_child(datastore: &str, host: &str) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_allocator_loop",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{datastore}|{host}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child")
}

async fn crash_rounds(datastore: &str, rounds: usize) {
    {
        let ipam = Ipam::new(
            datastore
                .parse::<Datastore>()
                .expect("ds")
                .open(Duration::from_secs(10))
                .await
                .expect("open"),
        );
        ipam.add_pool(IpPool {
            name: "p".into(),
            cidr: "10.30.0.0/24".parse().expect("cidr"),
            block_size: 28,
            node_selector: String::new(),
            namespace_selector: String::new(),
            allowed_uses: vec![IpUse::Workload],
            disabled: false,
        })
        .await
        .expect("pool");
    }
    let mut children: Vec<Child> = (0..3)
        .map(|h| spawn_child(datastore, &format!("node{h}")))
        .collect();
    let mut seed = 0x9e37_79b9_u64;
    for round in 0..rounds {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(150 + seed % 350));
        // SIGKILL every child, each one possibly in the middle of a commit: no destructor, no flush. All of
        // them, so the check below reads a datastore nobody is writing.
        for c in &mut children {
            c.kill().expect("kill -9");
            c.wait().expect("reap");
        }
        let store = datastore
            .parse::<Datastore>()
            .expect("ds")
            .open(Duration::from_secs(10))
            .await
            .expect("reopen after kill");
        let ipam = Ipam::new(store);
        let report = ipam.check().await.expect("check");
        assert!(report.ok(), "round {round}: {:#?}", report.problems);
        drop(ipam);
        children = (0..3)
            .map(|h| spawn_child(datastore, &format!("node{h}")))
            .collect();
    }
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let ipam = Ipam::new(
        datastore
            .parse::<Datastore>()
            .expect("ds")
            .open(Duration::from_secs(10))
            .await
            .expect("open"),
    );
    let report = ipam.check().await.expect("check");
    assert!(report.ok(), "{:#?}", report.problems);
    assert!(
        report.allocations > 0,
        "the children allocated something before they were killed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_processes_sharing_an_embedded_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    crash_rounds(
        &format!("embedded:{}", dir.path().join("ipam.redb").display()),
        8,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_processes_using_etcd() {
    let Some(etcd) = EtcdServer::start_or_skip() else {
        return;
    };
    crash_rounds(&format!("etcd:{}", etcd.url()), 5).await;
}
