//! One watcher against kube's `tower-test` mock: the exact request sequence of a list, a watch
//! with bookmarks resumed from the bookmark's resourceVersion, a 410 Gone that relists, and a
//! relist of unchanged objects that changes nothing.

use http::{Request, Response};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tower_test::mock;

use super::{
    cluster::{self, Cluster},
    watch::{self, Change, Kind},
};

pub(super) type Handle = mock::Handle<Request<Body>, Response<Body>>;

fn policy(name: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": rv},
        "spec": {"podSelector": {"matchLabels": {"app": name}}, "ingress": [{}]}
    })
}

fn list(rv: &str, items: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicyList",
        "metadata": {"resourceVersion": rv}, "items": items,
    }))
    .expect("json")
}

pub(super) fn events(lines: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend(serde_json::to_vec(l).expect("json"));
        out.push(b'\n');
    }
    out
}

pub(super) fn query(req: &Request<Body>) -> Vec<(String, String)> {
    let mut q: Vec<(String, String)> = req
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    q.sort();
    q
}

async fn answer(handle: &mut Handle, body: Vec<u8>) -> Vec<(String, String)> {
    answer_at(handle, "/apis/networking.k8s.io/v1/networkpolicies", body).await
}

/// Answers the watcher's next request, which must be a GET of `path`, with `body`; returns its
/// query.
pub(super) async fn answer_at(
    handle: &mut Handle,
    path: &str,
    body: Vec<u8>,
) -> Vec<(String, String)> {
    let (req, send) =
        tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request())
            .await
            .expect("the watcher sends its next request")
            .expect("a request");
    assert_eq!(req.method(), "GET");
    assert_eq!(req.uri().path(), path);
    let q = query(&req);
    send.send_response(
        Response::builder()
            .status(200)
            .body(Body::from(body))
            .expect("response"),
    );
    q
}

pub(super) fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = p
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    v.sort();
    v
}

async fn changes(rx: &mut mpsc::UnboundedReceiver<Change>, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        let c = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("a change in time")
            .expect("the watcher runs");
        out.push(match c {
            Change::Init(_) => "init".to_owned(),
            Change::InitApply(_, k, _) => format!("init-apply {}", k.1),
            Change::InitDone(_) => "init-done".to_owned(),
            Change::Apply(_, k, _) => format!("apply {}", k.1),
            Change::Delete(_, k) => format!("delete {}", k.1),
            Change::Error(_, e) => format!(
                "error {}",
                if e.contains("410") || e.contains("too old") {
                    "410"
                } else {
                    &e
                }
            ),
        });
    }
    out
}

#[tokio::test]
async fn list_watch_bookmark_resume_and_410_relist_in_exact_requests() {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let watcher = tokio::spawn(watch::forward(
        kube::Api::<NetworkPolicy>::all(client),
        Kind::NetworkPolicies,
        cluster::policy,
        tx,
    ));

    // 1. The initial list: paged (limit), no resourceVersion (the newest state).
    let q = answer(&mut handle, list("10", &[policy("a", "9")])).await;
    assert_eq!(q, pairs(&[("limit", "500")]));
    let seen = changes(&mut rx, 3).await;
    assert_eq!(seen, ["init", "init-apply a", "init-done"]);
    // 2. The watch from the list's resourceVersion, with bookmarks; an ADDED, a BOOKMARK, then
    //    the server ends the stream.
    let q = answer(
        &mut handle,
        events(&[
            json!({"type": "ADDED", "object": policy("b", "11")}),
            json!({"type": "BOOKMARK", "object": {"kind": "NetworkPolicy", "apiVersion": "networking.k8s.io/v1", "metadata": {"resourceVersion": "15"}}}),
        ]),
    )
    .await;
    assert_eq!(
        q,
        pairs(&[
            ("watch", "true"),
            ("timeoutSeconds", "290"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", "10"),
        ])
    );
    assert_eq!(changes(&mut rx, 1).await, ["apply b"]);
    // 3. Resumed from the bookmark's resourceVersion, not the last object's; the server says 410.
    let q = answer(
        &mut handle,
        events(&[json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
            "reason": "Expired", "message": "too old resource version: 15 (20)"}})]),
    )
    .await;
    assert!(
        q.contains(&("resourceVersion".to_owned(), "15".to_owned())),
        "{q:?}"
    );
    // The 410 is no failure (no `Error`: the source stays fresh); the relist follows.
    // 4. A relist (after the backoff), then a watch from its resourceVersion.
    let q = answer(
        &mut handle,
        list("20", &[policy("a", "9"), policy("b", "11")]),
    )
    .await;
    assert_eq!(q, pairs(&[("limit", "500")]));
    let seen = changes(&mut rx, 4).await;
    assert_eq!(seen, ["init", "init-apply a", "init-apply b", "init-done"]);
    let (req, _send) = handle
        .next_request()
        .await
        .expect("the watch after the relist");
    assert!(query(&req).contains(&("resourceVersion".to_owned(), "20".to_owned())));
    watcher.abort();
}

#[test]
fn the_store_sends_nothing_new_for_a_relist_of_unchanged_objects() {
    let np = |name: &str| -> NetworkPolicy {
        serde_json::from_value(policy(name, "1")).expect("a NetworkPolicy")
    };
    let key = |name: &str| ("default".to_owned(), name.to_owned());
    let mut cluster = Cluster::default();
    for kind in Kind::ALL {
        assert!(!cluster.synced());
        cluster.take(Change::Init(kind));
        if kind == Kind::NetworkPolicies {
            cluster.take(Change::InitApply(kind, key("a"), cluster::policy(&np("a"))));
        }
        cluster.take(Change::InitDone(kind));
    }
    assert!(cluster.synced(), "every kind listed");
    let (set, errors) = cluster.set();
    assert_eq!(set.policies.len(), 1);
    assert!(errors.is_empty());
    let k = Kind::NetworkPolicies;
    cluster.take(Change::Init(k));
    cluster.take(Change::InitApply(k, key("a"), cluster::policy(&np("a"))));
    assert!(
        cluster.take(Change::InitDone(k)).is_empty(),
        "an unchanged relist is no change"
    );
    assert_eq!(
        cluster.take(Change::Apply(k, key("b"), cluster::policy(&np("b")))),
        [key("b")]
    );
    // A policy the conversion refuses is named and left out; the rest stays.
    let mut bad = np("c");
    bad.spec.as_mut().expect("spec").policy_types = Some(vec!["Sideways".to_owned()]);
    assert_eq!(
        cluster.take(Change::Apply(k, key("c"), cluster::policy(&bad))),
        [key("c")]
    );
    let delta = cluster.delta(k, &key("c"));
    assert_eq!(delta.object, "NetworkPolicy default/c");
    assert_eq!(
        delta.change,
        crate::calc::policy::delta::ObjectChange::Policy(key("c"), None),
        "a refused object is absent"
    );
    assert!(delta.refused.is_some(), "and named with its reason");
    let (set, errors) = cluster.set();
    assert_eq!(set.policies.len(), 2);
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].to_string().starts_with("NetworkPolicy default/c"),
        "{}",
        errors[0]
    );
}
