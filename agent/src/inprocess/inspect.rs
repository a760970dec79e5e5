//! The API's kernel reads go through the one seam: over the fake kernel, `weir bpf maps`,
//! `weir bpf counters`, `weir policy rules`, `weir bpf ct list|flush`, `weir monitor` and the
//! kernel half of `weir policy trace` answer what the fake holds, over the real router and socket.

use std::{ops::ControlFlow, sync::Arc, time::Duration};

use maps_schema::{DropEvent, reason};

use super::{
    converge::Agent,
    harness::{self, FakeKernel},
};
use crate::{
    api::{
        client::{Client, ClientError, Method},
        server::{self, Api, MapView},
    },
    dataplane::{
        conntrack::{CtStats, CtView},
        counters::CounterView,
    },
    kernel::MapMeta,
    observe::{
        rule_hits::RuleHitsView,
        trace::{TraceRequest, TraceResult},
    },
    synthetic::{self, Sizes},
};

const SIZES: Sizes = Sizes {
    endpoints: 4,
    namespaces: 2,
    policies: 2,
};
const LAYOUT: u32 = maps_schema::conntrack::LAYOUT;
const WAIT: Duration = Duration::from_secs(20);

struct Served {
    _dir: tempfile::TempDir,
    kernel: FakeKernel,
    client: Client,
    ct: Arc<std::sync::Mutex<CtStats>>,
    agent: Agent,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// A ready agent over a fresh fake kernel, its API served on a socket.
async fn serve() -> Served {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    synthetic::write(&paths, SIZES).expect("sources");
    let kernel = FakeKernel::new();
    for i in 0..SIZES.endpoints {
        kernel.fake.add_link(
            &synthetic::host_ifname(i),
            300 + u32::try_from(i).expect("i"),
        );
    }
    let agent = Agent::start(&paths, &kernel);
    agent.ready().await;
    let ct = Arc::new(std::sync::Mutex::new(CtStats::default()));
    let api = Arc::new(Api {
        ct: Arc::clone(&ct),
        ..harness::api(dir.path(), &paths, &kernel, agent.handle.clone(), None).await
    });
    let socket = paths.api_socket.clone();
    let server = tokio::spawn(async move { server::serve(&socket, api).await });
    let client = Client::new(&paths.api_socket, WAIT);
    let up = tokio::time::timeout(WAIT, async {
        while tokio::net::UnixStream::connect(&paths.api_socket)
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    up.await.expect("the API answers");
    Served {
        _dir: dir,
        kernel,
        client,
        ct,
        agent,
        server,
    }
}

impl Served {
    fn stop(self) {
        self.server.abort();
        self.agent.stop();
    }
}

#[tokio::test]
async fn map_listings_and_counters_are_what_the_fake_kernel_holds() {
    let s = serve().await;
    let names = crate::kernel::real::loader::map_names(LAYOUT);
    for (i, name) in names.iter().enumerate() {
        let n = u32::try_from(i).expect("i");
        s.kernel.fake.map_metas().insert(
            name.clone(),
            MapMeta {
                id: 100 + n,
                map_type: 1,
                key_size: 4 + n,
                value_size: 8,
                max_entries: 1000 + n,
                flags: 0,
            },
        );
    }
    let maps: Vec<MapView> = s.client.get("/v1/bpf/maps", "maps").await.expect("maps");
    assert_eq!(
        maps.iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
        names
    );
    for (i, m) in maps.iter().enumerate() {
        let n = u32::try_from(i).expect("i");
        assert_eq!(
            (m.id, m.key_size, m.max_entries),
            (100 + n, 4 + n, 1000 + n)
        );
    }
    // A pin the kernel cannot open is the caller's error, naming it, not a shorter list.
    s.kernel.fake.map_metas().remove(&names[1]);
    match s.client.get::<Vec<MapView>>("/v1/bpf/maps", "maps").await {
        Err(ClientError::Api {
            status: 500,
            message,
            ..
        }) => assert!(message.contains(&names[1]), "{message}"),
        other => panic!("expected a 500 naming {}: {other:?}", names[1]),
    }

    let slot =
        maps_schema::counters::counter_index(reason::DROP_POLICY_DENIED, reason::DIR_TO_ENDPOINT);
    s.kernel.fake.counters().insert(slot, (7, 420));
    let counters: Vec<CounterView> = s
        .client
        .get("/v1/bpf/counters", "counters")
        .await
        .expect("counters");
    assert_eq!(
        counters
            .iter()
            .map(|c| (c.code, c.direction.as_str(), c.packets, c.bytes))
            .collect::<Vec<_>>(),
        vec![(
            reason::DROP_POLICY_DENIED,
            reason::direction_name(reason::DIR_TO_ENDPOINT),
            7,
            420
        )]
    );

    let rules = Arc::clone(&s.agent.handle.snapshot().rules);
    let (&id, rule) = rules
        .iter()
        .next()
        .expect("the synthetic policies have rules");
    s.kernel.fake.rule_hits().insert(id, (3, 180));
    let hits: Vec<RuleHitsView> = s
        .client
        .get("/v1/policy/rules", "rules")
        .await
        .expect("rules");
    let hit = hits.iter().find(|h| h.rule_id == id).expect("the rule");
    assert_eq!(
        (hit.policy.as_str(), hit.packets, hit.bytes),
        (rule.policy.as_str(), 3, 180)
    );
    assert_eq!(
        hits.iter().filter(|h| h.packets > 0).count(),
        1,
        "only the one slot counted"
    );
    s.stop();
}

#[tokio::test]
async fn conntrack_list_and_flush_go_through_the_seam_and_the_flush_is_not_an_eviction() {
    let s = serve().await;
    let key = maps_schema::conntrack::Ct4Key {
        addr_a: [10, 0, 0, 1],
        addr_b: [10, 0, 0, 2],
        port_a: 40000,
        port_b: 80,
        protocol: 6,
        ..Default::default()
    };
    let entry = maps_schema::CtEntry {
        last_seen_ns: crate::kernel::real::ct::now_ns(),
        ..Default::default()
    };
    s.kernel.fake.ct().create4(key, entry);
    let listed: Vec<CtView> = s.client.get("/v1/bpf/ct", "ct").await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].a.as_str(), listed[0].b.as_str()),
        ("10.0.0.1:40000", "10.0.0.2:80")
    );

    let flushed: serde_json::Value = s
        .client
        .call::<(), _>(Method::DELETE, "/v1/bpf/ct", None, "flush")
        .await
        .expect("flush");
    assert_eq!(flushed["flushed"], 1);
    assert!(s.kernel.fake.ct().ct4.is_empty());
    let stats = *s.ct.lock().expect("stats");
    assert_eq!(
        stats.flushed_since_sweep,
        [1, 0],
        "counted as the agent's removal"
    );
    let listed: Vec<CtView> = s.client.get("/v1/bpf/ct", "ct").await.expect("list");
    assert!(listed.is_empty());
    s.stop();
}

fn record(reason_code: u32, ifindex: u32) -> Vec<u8> {
    let event = DropEvent {
        reason: reason_code,
        direction: reason::DIR_TO_ENDPOINT,
        ifindex,
        packet_len: 60,
        captured: 0,
        _pad: 0,
        head: [0; maps_schema::events::CAPTURE_BYTES],
    };
    bytemuck::bytes_of(&event).to_vec()
}

#[tokio::test]
async fn two_monitors_share_the_one_ring_reader_and_both_see_each_event() {
    let s = serve().await;
    let mut watchers = Vec::new();
    for _ in 0..2 {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let client = s.client.clone();
        watchers.push((
            ready_rx,
            tokio::spawn(async move {
                let mut got = None;
                client
                    .stream_lines::<weir_api::DropEventView>(
                        "/v1/monitor",
                        "monitor",
                        move || {
                            let _closed = ready_tx.send(());
                        },
                        |view| {
                            got = Some(view);
                            ControlFlow::Break(())
                        },
                    )
                    .await
                    .expect("monitor");
                got.expect("an event")
            }),
        ));
    }
    for (ready, _) in &mut watchers {
        tokio::time::timeout(WAIT, ready)
            .await
            .expect("subscribed")
            .expect("ready");
    }
    assert_eq!(s.kernel.fake.drop_readers(), 1, "one reader for both");
    // The stream is subscribed once its headers arrive: push until both saw an event.
    let views = tokio::time::timeout(WAIT, async {
        let mut out = Vec::new();
        for (_, task) in watchers {
            while !task.is_finished() {
                s.kernel
                    .fake
                    .push_drop_event(&record(reason::DROP_SPOOFED_SOURCE, 301));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            out.push(task.await.expect("task"));
        }
        out
    })
    .await
    .expect("both monitors saw an event");
    for v in views {
        assert_eq!((v.code, v.ifindex), (reason::DROP_SPOOFED_SOURCE, 301));
        assert_eq!(v.reason, reason::name(reason::DROP_SPOOFED_SOURCE));
    }
    s.stop();
}

#[tokio::test]
async fn the_kernel_trace_runs_the_programs_through_the_seam_on_the_endpoints_links() {
    let s = serve().await;
    let (e0, e1) = (synthetic::endpoint(SIZES, 0), synthetic::endpoint(SIZES, 1));
    let rule_id = 9;
    {
        let mut t = s.kernel.fake.trace();
        t.answers.insert("from_endpoint", (reason::PASS, 0));
        t.answers
            .insert("to_endpoint", (reason::DROP_POLICY_DENIED, rule_id));
    }
    let req = TraceRequest {
        src: e0.ips[0],
        dst: e1.ips[0],
        protocol: "tcp".into(),
        port: 80,
        src_port: None,
        tcp_flags: None,
        from_endpoint: None,
    };
    let result: TraceResult = s
        .client
        .call(Method::POST, "/v1/policy/trace", Some(&req), "trace")
        .await
        .expect("trace");
    let kernel = result.kernel.expect("the kernel half ran");
    assert_eq!(
        kernel
            .steps
            .iter()
            .map(|s| (s.program.as_str(), s.verdict.as_str(), s.rule_id))
            .collect::<Vec<_>>(),
        vec![
            ("from_endpoint", "allow", 0),
            ("to_endpoint", "deny", rule_id)
        ]
    );
    assert_eq!(kernel.verdict, "deny");
    let nonce = s.kernel.fake.trace().nonce;
    assert_ne!(nonce, 0, "the nonce was created");
    let low = u32::try_from(nonce & 0xffff_ffff).expect("low half");
    assert_eq!(
        s.kernel.fake.trace().runs,
        vec![("from_endpoint", 300, low), ("to_endpoint", 301, low)],
        "each program ran once, on its endpoint's link, with the nonce"
    );

    // A program that does not answer is the trace's error, not a verdict.
    s.kernel.fake.trace().answers.remove("to_endpoint");
    let result: TraceResult = s
        .client
        .call(Method::POST, "/v1/policy/trace", Some(&req), "trace")
        .await
        .expect("trace");
    assert!(result.kernel.is_none());
    assert!(
        result
            .kernel_error
            .as_deref()
            .is_some_and(|e| e.contains("to_endpoint did not answer")),
        "{:?}",
        result.kernel_error
    );
    s.stop();
}
