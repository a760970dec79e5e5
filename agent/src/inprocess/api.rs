//! The API over its real unix socket keeps answering while the loop applies 10,000 endpoints:
//! `weir status` and a CNI ADD's allocation and endpoint registration. Every map write of the
//! fake kernel is slowed down so the apply lasts seconds; the figures belong to
//! `cargo xtask bench policy`, the test asserts only that the answers came during the apply.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use super::{
    converge::Agent,
    harness::{self, FakeKernel},
};
use crate::{
    api::{
        client::{Client, Method},
        server,
        types::{AllocateResponse, EndpointRequest, EndpointView, Status},
    },
    control::applier,
    sources::link_source,
    synthetic::{self, Sizes},
};

const SIZES: Sizes = Sizes {
    endpoints: 10_000,
    namespaces: 50,
    policies: 10,
};
const ANSWER: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_a_cni_add_keep_answering_while_the_loop_applies_10000_endpoints() {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    synthetic::write(&paths, SIZES).expect("sources");
    let kernel = FakeKernel::new();
    for i in 0..SIZES.endpoints {
        kernel.fake.add_link(
            &synthetic::host_ifname(i),
            1000 + u32::try_from(i).expect("i"),
        );
    }
    let total = harness::expected(&paths, &kernel.fake.interfaces()).entries();
    kernel.set_delay(Duration::from_micros(50));

    let node = harness::open_node(&paths, &kernel);
    let (handle, thread) = applier::spawn(node).expect("loop");
    let links = tokio::spawn(link_source::supervise(
        handle.clone(),
        kernel.fake.clone(),
        |_| {},
    ));
    let api = Arc::new(harness::api(dir.path(), &paths, &kernel, handle.clone(), None).await);
    let socket = paths.api_socket.clone();
    let server = tokio::spawn(async move { server::serve(&socket, api).await });
    let socket = paths.api_socket.clone();
    let agent = Agent::from_parts(handle, thread, links);

    // The apply is under way once the first entries arrive.
    agent
        .wait_until("the apply starts", || kernel.map_writes() > 0)
        .await;
    let during = move |before: usize, after: usize| before > 0 && after < total;

    // `weir status`, over and over, until the apply is done.
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (socket, kernel, done) = (socket.clone(), kernel.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut answered_during = 0;
            while !done.load(Ordering::Relaxed) {
                let before = kernel.map_writes();
                let status: Status = tokio::time::timeout(
                    ANSWER,
                    Client::new(&socket, Duration::from_secs(120)).call::<(), Status>(
                        Method::GET,
                        "/v1/status",
                        None,
                        "status",
                    ),
                )
                .await
                .expect("status answers within 30 s")
                .expect("status");
                assert!(status.endpoints >= SIZES.endpoints, "{}", status.endpoints);
                if during(before, kernel.map_writes()) {
                    answered_during += 1;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answered_during
        })
    };

    // A CNI ADD of another pod: allocate, its veth appears, register it.
    let before = kernel.map_writes();
    let alloc: AllocateResponse = tokio::time::timeout(
        ANSWER,
        Client::new(&socket, Duration::from_secs(120)).call(
            Method::POST,
            "/v1/ipam/allocate",
            Some(&serde_json::json!({"handle": "wt-extra", "ipv4": 1})),
            "allocate",
        ),
    )
    .await
    .expect("allocate answers within 30 s")
    .expect("allocate");
    assert!(
        during(before, kernel.map_writes()),
        "the allocation answered while the loop was applying"
    );
    let host = synthetic::host_ifname(0xfff_ffff);
    // The fake kernel's live link watch reports it, as netlink would.
    kernel.fake.add_link(&host, 900_000);
    let request = EndpointRequest {
        container_id: "cx".into(),
        ifname: "eth0".into(),
        host_ifname: host.clone(),
        netns: String::new(),
        namespace: "ns1".into(),
        pod: "px".into(),
        labels: synthetic::labels(1),
        handle: "wt-extra".into(),
        ips: alloc.allocation.ips.clone(),
    };
    let started = Instant::now();
    let view: EndpointView = tokio::time::timeout(
        Duration::from_secs(120),
        Client::new(&socket, Duration::from_secs(120)).call(
            Method::PUT,
            "/v1/endpoints/cx:eth0",
            Some(&request),
            "register",
        ),
    )
    .await
    .expect("the registration answers within 120 s")
    .expect("registered");
    eprintln!("registration answered after {:?}", started.elapsed());
    assert_eq!(view.ifindex, Some(900_000));
    assert!(view.identity.is_some());
    // It answers only once its entry is in the kernel.
    let entry = kernel
        .endpoints
        .unordered()
        .into_iter()
        .find(|(k, _)| *k == 900_000)
        .map(|(_, v)| v);
    assert_eq!(entry.map(|e| e.endpoint_id), Some(view.endpoint.id));

    agent.ready().await;
    done.store(true, Ordering::Relaxed);
    let answered_during = poller.await.expect("poller");
    assert!(
        answered_during >= 3,
        "status answered {answered_during} times during the apply"
    );
    let mut links = kernel.fake.interfaces();
    links.insert(host, 900_000);
    assert!(kernel.state() == harness::expected(&paths, &links));
    server.abort();
    agent.stop();
}
