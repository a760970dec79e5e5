//! With a cluster source, a CNI request waits (bounded) for the source to deliver the Pod it
//! names, and is refused with `pod-unknown` (503: weir-cni answers "try again later") when the Pod
//! never arrives: an address and an identity come only from the Pod object. The positive control:
//! once the source delivers the Pod, the same request succeeds, also while it is already waiting.

use std::{sync::Arc, time::Duration};

use super::harness::{self, FakeKernel};
use crate::{
    api::{
        client::{Client, ClientError, Method},
        server,
        types::AllocateResponse,
    },
    calc::policy::load,
    control::applier::{self, Command},
};

const WAIT: Duration = Duration::from_secs(2);

async fn allocate(
    socket: &std::path::Path,
    handle: &str,
    pod: &str,
) -> Result<AllocateResponse, ClientError> {
    Client::new(socket, Duration::from_secs(30))
        .call(
            Method::POST,
            "/v1/ipam/allocate",
            Some(&serde_json::json!({"handle": handle, "ipv4": 1, "namespace": "ns1", "pod": pod})),
            "allocate",
        )
        .await
}

fn pod_set(pods: &[&str]) -> crate::calc::policy::model::PolicySet {
    let dir = tempfile::tempdir().expect("tmp");
    let mut yaml = "kind: Namespace\nmetadata: {name: ns1}\n".to_owned();
    for pod in pods {
        yaml.push_str(&format!(
            "---\nkind: Pod\nmetadata: {{name: {pod}, namespace: ns1, labels: {{app: web}}}}\nspec: {{nodeName: wt-node, containers: []}}\n"
        ));
    }
    std::fs::write(dir.path().join("objects.yaml"), yaml).expect("write");
    let (set, errors) = load::load_dir(dir.path());
    assert!(errors.is_empty(), "{errors:?}");
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cni_request_waits_for_its_pod_and_is_refused_when_the_source_never_delivers_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    let kernel = FakeKernel::new();
    let node = harness::open_node(&paths, &kernel);
    let (handle, _thread) = applier::spawn(node).expect("loop");
    let api = Arc::new(harness::api(dir.path(), &paths, &kernel, handle.clone(), Some(WAIT)).await);
    let socket = paths.api_socket.clone();
    let server = tokio::spawn(async move { server::serve(&socket, api).await });
    let socket = paths.api_socket.clone();
    let listening = tokio::time::timeout(Duration::from_secs(30), async {
        while !socket.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    listening.await.expect("the API listens within 30 s");
    let send = |pods: &[&str]| {
        handle
            .send(Command::Policies {
                set: pod_set(pods),
                errors: Vec::new(),
            })
            .expect("send");
    };
    send(&["known"]);

    // A pod the source has: answered at once (the control for the refusal below).
    let known = allocate(&socket, "h-known", "known")
        .await
        .expect("a known pod gets its address");
    assert_eq!(known.allocation.ips.len(), 1, "{known:?}");

    // A pod the source never delivers: refused after the wait, naming the pod, nothing held.
    match allocate(&socket, "h-ghost", "ghost").await {
        Err(ClientError::Api {
            status,
            code,
            message,
            ..
        }) => {
            assert_eq!((status, code.as_str()), (503, weir_api::code::POD_UNKNOWN));
            assert!(message.contains("ns1/ghost"), "{message}");
        }
        other => panic!("an unknown pod must be refused with pod-unknown: {other:?}"),
    }

    // A pod that arrives while its request waits: answered once it is there.
    let waiting = tokio::spawn({
        let socket = socket.clone();
        async move { allocate(&socket, "h-late", "late").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the request waits for its pod");
    send(&["known", "late"]);
    let late = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("answered")
        .expect("task")
        .expect("the pod arrived during the wait");
    assert_eq!(late.allocation.ips.len(), 1, "{late:?}");
    server.abort();
}
