//! Real crashes: child processes allocate and release in a loop on a shared datastore and are killed with
//! SIGKILL at random moments; after every kill the datastore opens and every invariant holds.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use ipam::{
    AssignArgs, Ipam,
    model::{IpPool, IpUse, ReleaseCheck},
    store::{
        Datastore,
        embedded::{EmbeddedStore, Sharing},
    },
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

const GROUP_CHILD_ENV: &str = "WEIR_IPAM_GROUP_COMMIT_CHILD";

/// Not a test on its own: a process that holds an embedded file exclusively (as the agent does) and allocates
/// from 8 tasks at once (group commit) and in batches of 8 (`ipam::batch`, one commit per batch), printing
/// `handle ip` for every allocation the moment it is returned, until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the group commit crash test as a child process"]
async fn child_group_commit_loop() {
    use std::io::Write as _;
    let Ok(path) = std::env::var(GROUP_CHILD_ENV) else {
        return;
    };
    let store = EmbeddedStore::open_with(
        Path::new(&path),
        Duration::from_secs(10),
        Sharing::Exclusive,
    )
    .expect("open");
    let ipam = Ipam::new(store);
    let print = |handle: &str, ips: &[std::net::IpAddr]| {
        let mut out = std::io::stdout().lock();
        for ip in ips {
            let _ = writeln!(out, "{handle} {ip}");
        }
        let _ = out.flush();
    };
    let mut tasks = Vec::new();
    for t in 0..8 {
        let ipam = ipam.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..u64::MAX {
                let handle = format!("t{t}-{i}");
                if let Ok(r) = ipam
                    .auto_assign(&AssignArgs::new("node0", &handle, 1, 0))
                    .await
                {
                    print(&handle, &r.ips());
                    if i % 2 == 0 {
                        let _ = ipam.release_by_handle(&handle).await;
                    }
                }
            }
        }));
    }
    for round in 0..u64::MAX {
        let jobs: Vec<String> = (0..8).map(|j| format!("b{round}-{j}")).collect();
        let (results, _) = ipam::batch::run(&ipam, &jobs, |ipam, handle: String| async move {
            let r = ipam
                .auto_assign(&AssignArgs::new("node0", &handle, 1, 0))
                .await?;
            Ok::<_, ipam::IpamError>((handle, r.ips()))
        })
        .await;
        for (handle, ips) in results.into_iter().flatten() {
            print(&handle, &ips);
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// kill -9 of a process in the middle of its group commits: every allocation it had returned (and not released)
/// is in the file, nothing is handed out twice, and every invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_group_commits_loses_no_returned_allocation() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ipam.redb");
    {
        let ipam = Ipam::new(EmbeddedStore::open(&path, Duration::from_secs(10)).expect("open"));
        ipam.add_pool(IpPool {
            name: "p".into(),
            cidr: "10.31.0.0/20".parse().expect("cidr"),
            block_size: 26,
            node_selector: String::new(),
            namespace_selector: String::new(),
            allowed_uses: vec![IpUse::Workload],
            disabled: false,
        })
        .await
        .expect("pool");
    }
    let mut seed = 0x2545_f491_u64;
    let mut returned_total = 0usize;
    for round in 0..5 {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "child_group_commit_loop",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(GROUP_CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| {
                    let (h, ip) = l.split_once(' ')?;
                    Some((h.to_owned(), ip.parse::<std::net::IpAddr>().ok()?))
                })
                .collect::<Vec<_>>()
        });
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(400 + seed % 600));
        child.kill().expect("kill -9");
        child.wait().expect("reap");
        let returned = reader.join().expect("reader");
        returned_total += returned.len();
        let ipam = Ipam::new(EmbeddedStore::open(&path, Duration::from_secs(10)).expect("reopen"));
        for (handle, ip) in &returned {
            // The tasks release every other handle of theirs after printing it; those may be gone.
            let may_be_released = handle
                .strip_prefix('t')
                .and_then(|h| h.rsplit_once('-'))
                .and_then(|(_, i)| i.parse::<u64>().ok())
                .is_some_and(|i| i % 2 == 0);
            let held = match ipam.ips_by_handle(handle).await {
                Ok(nets) => nets.iter().any(|n| n.ip() == *ip),
                Err(ipam::IpamError::HandleNotFound { .. }) => false,
                Err(e) => panic!("round {round}: reading handle {handle}: {e}"),
            };
            assert!(
                held || may_be_released,
                "round {round}: {handle} was handed {ip} but the file does not hold it"
            );
        }
        let report = ipam.check().await.expect("check");
        assert!(report.ok(), "round {round}: {:#?}", report.problems);
    }
    assert!(
        returned_total > 0,
        "the children returned allocations before they were killed"
    );
}
