//! The Service and EndpointSlice watchers against kube's `tower-test` mock, through the source's
//! store and into a node as the loop takes them: the collection paths the watchers ask for, a bad
//! Service named with its field and left out while the good one applies, an endpoint that turns
//! not ready and then terminating, and deletes that remove.

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tower_test::mock;

use super::{
    cluster::{self, Cluster},
    tests::{Handle, answer_at, events, pairs},
    watch::{self, Change, Kind},
};
use crate::{
    calc::{policy::model::PolicySet, services::view::BackendState, testkit},
    control::node::Node,
    paths::Paths,
};

const SERVICES: &str = "/api/v1/services";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";

fn service(name: &str, port: i64, rv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default", "resourceVersion": rv},
           "spec": {"clusterIP": "10.96.0.10",
                    "ports": [{"name": "http", "port": port, "targetPort": "http"}]}})
}

fn slice(ready: bool, terminating: bool, rv: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-1", "namespace": "default", "resourceVersion": rv,
                        "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": [
               {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
               {"addresses": ["10.0.0.2"],
                "conditions": {"ready": ready, "serving": ready || terminating,
                               "terminating": terminating}}]})
}

fn list(kind: &str, api_version: &str, rv: &str, items: &[Value]) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": api_version, "kind": format!("{kind}List"),
                               "metadata": {"resourceVersion": rv}, "items": items}),
    )
    .expect("json")
}

/// Takes the next `n` changes into `cluster`, adding the objects they changed to `touched`.
async fn take(
    rx: &mut mpsc::UnboundedReceiver<Change>,
    cluster: &mut Cluster,
    touched: &mut Vec<(Kind, super::store::Key)>,
    n: usize,
) {
    for _ in 0..n {
        let change = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("a change in time")
            .expect("the watcher runs");
        let kind = change.kind();
        touched.extend(cluster.take(change).into_iter().map(|k| (kind, k)));
    }
}

/// (backend address, state) of the node's first frontend.
fn backends(node: &Node) -> Vec<(String, BackendState)> {
    node.service_views()
        .first()
        .map(|f| {
            f.backends
                .iter()
                .map(|b| (b.address.clone(), b.state))
                .collect()
        })
        .unwrap_or_default()
}

/// The watchers' first list (with the other kinds listed empty) is the node's first whole set;
/// afterwards each event is one delta.
#[tokio::test]
async fn services_and_slices_are_watched_converted_and_follow_their_events() {
    let (mock_service, mut handle): (_, Handle) = mock::pair();
    let client = kube::Client::new(mock_service, "default");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let services = tokio::spawn(watch::forward(
        kube::Api::<Service>::all(client.clone()),
        Kind::Services,
        cluster::service,
        tx.clone(),
    ));
    let mut cluster = Cluster::default();
    let mut touched = Vec::new();
    for kind in [
        Kind::Pods,
        Kind::Namespaces,
        Kind::NetworkPolicies,
        Kind::Nodes,
    ] {
        cluster.take(Change::Init(kind));
        cluster.take(Change::InitDone(kind));
    }
    // The Services' list: a good one and one whose port is out of range.
    let q = answer_at(
        &mut handle,
        SERVICES,
        list(
            "Service",
            "v1",
            "10",
            &[service("web", 80, "8"), service("bad", 70_000, "9")],
        ),
    )
    .await;
    assert_eq!(q, pairs(&[("limit", "500")]));
    take(&mut rx, &mut cluster, &mut touched, 4).await;
    assert!(!cluster.synced(), "the EndpointSlices are not listed yet");
    let slices = tokio::spawn(watch::forward(
        kube::Api::<EndpointSlice>::all(client),
        Kind::EndpointSlices,
        cluster::endpoint_slice,
        tx,
    ));
    // Both watchers now ask: the Services' watch and the slices' list, in either order.
    let mut pending_watch = None;
    loop {
        let (req, send) =
            tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request())
                .await
                .expect("a request in time")
                .expect("a request");
        if req.uri().path() == SLICES {
            send.send_response(
                http::Response::builder()
                    .status(200)
                    .body(kube::client::Body::from(list(
                        "EndpointSlice",
                        "discovery.k8s.io/v1",
                        "10",
                        &[slice(true, false, "7")],
                    )))
                    .expect("response"),
            );
            break;
        }
        assert_eq!(req.uri().path(), SERVICES, "the Services' watch");
        assert!(super::tests::query(&req).contains(&("watch".into(), "true".into())));
        pending_watch = Some(send);
    }
    take(&mut rx, &mut cluster, &mut touched, 3).await;
    assert!(cluster.synced(), "every kind listed: in sync");
    let counts = cluster.counts();
    assert_eq!(
        (counts[&Kind::Services], counts[&Kind::EndpointSlices]),
        (2, 1),
        "the objects={{…}} the in-sync log line counts"
    );

    // The first whole set: the good Service and its slice; the bad one named with its field.
    let (set, errors) = cluster.set();
    assert_eq!(set.services.len(), 1);
    assert_eq!(set.endpoint_slices.len(), 1);
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("Service default/bad") && errors[0].contains("spec.ports[0].port"),
        "{errors:?}"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let paths = Paths {
        state_dir: dir.path().to_owned(),
        ..Paths::default()
    };
    let (dataplane, _maps) = testkit::dataplane();
    let mut node = Node::open(&paths, dataplane, PolicySet::default(), Vec::new()).expect("open");
    node.set_policies(set, cluster.set().1)
        .expect("the first set");
    assert_eq!(
        backends(&node),
        [
            ("10.0.0.1:8080".to_owned(), BackendState::Ready),
            ("10.0.0.2:8080".to_owned(), BackendState::Ready)
        ]
    );
    assert_eq!(node.service_views().len(), 1, "the bad Service is left out");

    // The slices' watch: one endpoint turns not ready, then terminating.
    let q = answer_at(
        &mut handle,
        SLICES,
        events(&[
            json!({"type": "MODIFIED", "object": slice(false, false, "11")}),
            json!({"type": "MODIFIED", "object": slice(false, true, "12")}),
        ]),
    )
    .await;
    assert!(q.contains(&("resourceVersion".to_owned(), "10".to_owned())));
    touched.clear();
    take(&mut rx, &mut cluster, &mut touched, 1).await;
    let delta = |cluster: &Cluster, touched: &[(Kind, super::store::Key)]| {
        touched
            .iter()
            .map(|(k, key)| cluster.delta(*k, key))
            .collect::<Vec<_>>()
    };
    let done = node.apply_deltas(delta(&cluster, &touched));
    assert!(done.services && done.failed.is_empty());
    assert_eq!(
        backends(&node)[1],
        ("10.0.0.2:8080".to_owned(), BackendState::NotReady)
    );
    touched.clear();
    take(&mut rx, &mut cluster, &mut touched, 1).await;
    node.apply_deltas(delta(&cluster, &touched));
    assert_eq!(
        backends(&node)[1],
        ("10.0.0.2:8080".to_owned(), BackendState::Terminating)
    );

    // The Services' watch: the bad one fixed, then the good one deleted.
    let send = pending_watch.expect("the Services' watch request");
    send.send_response(
        http::Response::builder()
            .status(200)
            .body(kube::client::Body::from(events(&[
                json!({"type": "MODIFIED", "object": service("bad", 81, "13")}),
                json!({"type": "DELETED", "object": service("web", 80, "14")}),
            ])))
            .expect("response"),
    );
    touched.clear();
    take(&mut rx, &mut cluster, &mut touched, 2).await;
    let deltas = delta(&cluster, &touched);
    assert_eq!(
        deltas.iter().map(|d| d.object.as_str()).collect::<Vec<_>>(),
        ["Service default/bad", "Service default/web"]
    );
    node.apply_deltas(deltas);
    let views = node.service_views();
    assert_eq!(
        views.iter().map(|s| s.service.as_str()).collect::<Vec<_>>(),
        ["default/bad"],
        "web deleted, bad fixed"
    );
    assert!(
        node.summary().policy_errors.is_empty(),
        "the fixed Service's report goes: {:?}",
        node.summary().policy_errors
    );
    assert!(
        views[0].backends.is_empty(),
        "web's slice does not serve bad"
    );
    services.abort();
    slices.abort();
}
