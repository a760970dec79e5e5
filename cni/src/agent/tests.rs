//! weir-cni's client against the agent's real API router (`agent::testing`: the real IPAM,
//! node and apply loop over the fake kernel), so the two sides of the contract are tested
//! together.

use std::{path::Path, time::Duration};

use agent::testing::{self, TestAgent};

use super::*;

fn client(path: &Path) -> AgentClient {
    AgentClient::new(path, Duration::from_secs(20))
}

fn allocation(handle: &str, container_id: &str, ipv4: u32, ipv6: u32) -> AllocateRequest {
    AllocateRequest {
        handle: handle.into(),
        ipv4,
        ipv6,
        container_id: container_id.into(),
        ..AllocateRequest::default()
    }
}

#[tokio::test]
async fn a_missing_socket_is_try_again_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = client(&dir.path().join("none.sock"))
        .status()
        .await
        .expect_err("no agent");
    assert_eq!(err.code(), Code::TryAgainLater);
    assert!(err.to_string().contains("unreachable"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_errors_round_trip_through_the_real_agent_api() {
    let agent = TestAgent::start().await.expect("test agent");
    let c = client(agent.socket());

    let status = c.status().await.expect("status");
    assert!(status.ready);
    assert_eq!(status.agent_pin_root(), Some(agent.bpf_root().as_path()));
    let names: Vec<&str> = status.pools.iter().map(|p| p.cidr.as_str()).collect();
    assert_eq!(names, testing::POOLS);

    let answer = c
        .allocate(&allocation("n.c1", "c1", 1, 1))
        .await
        .expect("allocate");
    let ips = answer.allocation.ips.clone();
    assert_eq!(ips.len(), 2);
    assert_eq!(answer.agent_pin_root(), Some(agent.bpf_root().as_path()));
    assert_eq!(answer.tc_attach, Some(::attach::Mechanism::Filter));
    let held = c.get_handle("n.c1").await.expect("handle");
    assert_eq!((held.ips.clone(), held.confirmed), (ips.clone(), false));
    assert!(c.get_endpoint("c1", "eth0").await.expect("get").is_none());

    // Registering confirms the allocation and answers once the entries are applied.
    agent.link_created("weirtest00001", 7);
    let request = EndpointRequest {
        container_id: "c1".into(),
        ifname: "eth0".into(),
        host_ifname: "weirtest00001".into(),
        netns: "/var/run/netns/x".into(),
        namespace: String::new(),
        pod: "web-0".into(),
        handle: "n.c1".into(),
        ips: ips.clone(),
        ..EndpointRequest::default()
    };
    let view = c.put_endpoint(&request).await.expect("put");
    assert_eq!(view.endpoint.ips, ips);
    assert_eq!(view.endpoint.namespace, "default", "no namespace: default");
    assert_eq!(view.ifindex, Some(7));
    assert!(view.identity.is_some());
    let got = c
        .get_endpoint("c1", "eth0")
        .await
        .expect("get")
        .expect("registered");
    assert_eq!(got, view);
    assert_eq!(c.list_endpoints().await.expect("list"), vec![view]);
    assert!(c.get_handle("n.c1").await.expect("handle").confirmed);

    // An address not held under the handle is refused as the agent refuses it.
    let err = c
        .put_endpoint(&EndpointRequest {
            container_id: "c2".into(),
            handle: "n.none".into(),
            ..request.clone()
        })
        .await
        .expect_err("not allocated");
    assert_eq!(err.status(), Some(400), "{err}");
    assert_eq!(err.code(), Code::Agent, "{err}");

    // Exhausted pools are an IPAM error; nothing is kept.
    let err = c
        .allocate(&allocation("n.c2", "c2", 16, 0))
        .await
        .expect_err("exhausted");
    assert_eq!(err.code(), Code::Ipam, "{err}");
    assert!(c.get_handle("n.c2").await.expect("handle").ips.is_empty());

    // Delete releases (idempotent), and the handle then holds nothing.
    let deleted = c.delete_endpoint("c1", "eth0").await.expect("delete");
    assert!(deleted.deleted);
    assert_eq!(deleted.released, ips);
    assert_eq!(deleted.agent_pin_root(), Some(agent.bpf_root().as_path()));
    let again = c.delete_endpoint("c1", "eth0").await.expect("delete again");
    assert!(!again.deleted && again.released.is_empty());
    let released = c.release_handle("n.c1").await.expect("release");
    assert!(released.released.is_empty());
    assert!(c.get_handle("n.c1").await.expect("handle").ips.is_empty());
}
